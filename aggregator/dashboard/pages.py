"""The dashboard's HTML pages (server-rendered, no script, one same-origin stylesheet).

Every number on a page states its confidence level and whether it is
consistency-processed; windows below the release gate are named but their
estimates are not shown; times are ISO 8601 UTC. Only policy metadata, report
counts, estimates and exact ε figures appear: the model never reads a subject
identifier or a report payload.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from urllib.parse import quote, urlencode

from fedldp.aggregator.consistency import Consistency
from fedldp.aggregator.dashboard.model import (
    BudgetView,
    Options,
    PolicySummary,
    PurposeReservations,
    WindowReport,
    iso_utc,
)
from fedldp.aggregator.dashboard.svg import Bar, Point, Series, bar_chart, trend_chart
from fedldp.aggregator.estimation import FrequencyReport, NumericReport, heavy_hitters
from fedldp.client.mechanisms.sketch import Sketch
from fedldp.client.policy import VerifiedPolicy

#: The one-line explanation of ε shown on every page.
EPSILON_LINE = (
    "ε per report: whatever a single report contains, it changes the odds of any guess "
    "about that device's true value by at most a factor of e^ε (local differential privacy); "
    "smaller is more private."
)

STYLESHEET = """
body { font-family: sans-serif; margin: 1.5em 2em; color: #222; max-width: 1100px; }
nav a { margin-right: 1.2em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.note { color: #555; font-size: 0.9em; }
.withheld { color: #8a4b00; }
.released { color: #1b6e20; }
.chart { display: block; margin: 0.5em 0 1em 0; }
footer { margin-top: 2em; border-top: 1px solid #ddd; padding-top: 0.5em; }
"""


#: Values drawn and tabulated per window; a larger domain shows its largest estimates.
MAX_VALUES_SHOWN = 40


def _num(x: float, digits: int = 4) -> str:
    return f"{x:.{digits}f}"


def page(title: str, body: str, *, read_at: int) -> str:
    """A whole page: navigation, `body`, the ε line and the time the ledger was read."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · fedldp dashboard</title>"
        '<link rel="stylesheet" href="/static/dashboard.css"></head><body>'
        '<nav><a href="/">Policies</a><a href="/budget">Budget</a>'
        '<a href="/shuffle">Shuffled batches</a>'
        '<a href="/api/policies">JSON API</a></nav>'
        f"<h1>{escape(title)}</h1>{body}"
        f'<footer><p class="note" id="epsilon-line">{escape(EPSILON_LINE)}</p>'
        f'<p class="note">Ledger read at <time id="read-at">{iso_utc(read_at)}</time> '
        "(ISO 8601, UTC). Read-only view of the collector's additive statistics.</p>"
        "</footer></body></html>\n"
    )


def _policy_link(policy_id: str, **params: str) -> str:
    query = f"?{urlencode(params)}" if params else ""
    return f"/policies/{quote(policy_id, safe='')}{query}"


def index_page(rows: Sequence[PolicySummary], *, read_at: int) -> str:
    """The policy list: mechanism, ε per report, latest window's reports and gate state."""
    body = [
        '<table id="policies"><thead><tr><th>policy</th><th>metric</th><th>kind</th>'
        "<th>mechanism</th><th>ε per report</th><th>ε cap per window</th>"
        "<th>latest window (UTC)</th><th>reports in latest window</th>"
        "<th>release gate</th></tr></thead><tbody>"
    ]
    for row in rows:
        p = row.policy
        gate = (
            f'<span class="released">released (≥ {p.min_reports_for_release})</span>'
            if row.released
            else f'<span class="withheld">withheld (&lt; {p.min_reports_for_release})</span>'
        )
        if p.analyzer_public_key is not None:  # sealed reports: the ledger holds no estimate
            gate = '<a class="shuffled" href="/shuffle">shuffle model: see Shuffled batches</a>'
        window = "—" if row.latest_window is None else iso_utc(row.latest_window)
        body.append(
            f'<tr data-policy="{escape(p.policy_id)}">'
            f'<td><a href="{escape(_policy_link(p.policy_id))}">{escape(p.policy_id)}</a> '
            f"v{p.version}</td><td>{escape(p.metric_name)}</td>"
            f"<td>{policy_kind(p)}</td>"
            f"<td>{escape(p.mechanism.wire_id)}</td>"
            f'<td class="num eps">{escape(str(p.charge))}</td>'
            f'<td class="num">{escape(str(p.epsilon_cap))}</td>'
            f'<td>{window}</td><td class="num latest-n">{row.latest_n}</td><td>{gate}</td></tr>'
        )
    body.append("</tbody></table>")
    if not rows:
        body.append("<p>No verified policies were found in the policy folder.</p>")
    return page("Policies", "".join(body), read_at=read_at)


def policy_kind(policy: VerifiedPolicy) -> str:
    """categorical, numeric, multi-attribute or open domain (strings: pem discovers
    them, a sketch's reports need candidates) (the policies page and API)."""
    if policy.attributes is not None:
        return "multi-attribute"
    if policy.open_domain is not None:
        return "open domain"
    return "categorical" if policy.labels is not None else "numeric"


def _options_form(policy: VerifiedPolicy, options: Options) -> str:
    if policy.labels is None:
        return ""
    choices = "".join(
        f'<option value="{c.value}"{" selected" if c.value == options.consistency else ""}>'
        f"{c.value}</option>"
        for c in Consistency
    )
    return (
        f'<form method="get" action="{escape(_policy_link(policy.policy_id))}">'
        '<label>consistency post-processing <select name="consistency" id="consistency">'
        f"{choices}</select></label> "
        f'<label>confidence <input name="confidence" id="confidence" size="5" '
        f'value="{options.confidence}"></label> <button type="submit">show</button></form>'
    )


def _ci_words(options: Options) -> str:
    return f"{options.confidence:.0%} CI" + (" (simultaneous)" if options.simultaneous else "")


def policy_page(
    policy: VerifiedPolicy, windows: Sequence[WindowReport], options: Options, *, read_at: int
) -> str:
    """Latest window's estimates (bars, whiskers, raw estimate), trend, heavy hitters."""
    body = [
        f"<p>{escape(policy.metric_name)} · mechanism {escape(policy.mechanism.wire_id)} · "
        f"ε per report {escape(str(policy.charge))} · cap {escape(str(policy.epsilon_cap))} "
        f"per window of {policy.window_seconds} s · released from "
        f"{policy.min_reports_for_release} reports per window</p>",
        _options_form(policy, options),
    ]
    if isinstance(policy.mechanism, Sketch):
        body.append(
            '<p id="latest" class="note">A sketch over an open domain of strings: there is no '
            "list of values to show; estimate the strings you ask about with "
            "<code>fedldp report --candidates FILE</code>.</p>"
        )
        return page(f"Policy {policy.policy_id}", "".join(body), read_at=read_at)
    shown = [w for w in windows if w.report is not None]
    latest = windows[-1] if windows else None
    if latest is None:
        body.append('<p id="latest" class="withheld">No reports stored for this policy yet.</p>')
    elif policy.attributes is not None:  # one report per attribute: the JSON report has them
        names = ", ".join(a.name for a in policy.attributes)
        body.append(
            f'<p id="latest">A multi-attribute report ({escape(names)}): each attribute\'s '
            "estimates are in the policy's JSON report (the report API) and in "
            "<code>fedldp report</code>.</p>"
        )
        return page(f"Policy {policy.policy_id}", "".join(body), read_at=read_at)
    elif latest.report is None:
        body.append(
            f'<p id="latest" class="withheld">Latest window {iso_utc(latest.window_start)}: '
            f"withheld, {latest.n} reports, fewer than the release minimum "
            f"({policy.min_reports_for_release}).</p>"
        )
    elif isinstance(latest.report, FrequencyReport):
        body.append(_frequency_section(latest.window_start, latest.report, options))
    else:
        body.append(_numeric_section(latest.window_start, latest.report, options))
    body.append(_trend_section(policy, windows, shown, options))
    return page(f"Policy {policy.policy_id}", "".join(body), read_at=read_at)


def _frequency_section(start: int, report: FrequencyReport, options: Options) -> str:
    processed = report.consistency != Consistency.NONE.value
    kind = f"{escape(report.consistency)}-processed" if processed else "raw"
    what = (
        f"{report.consistency}-processed estimate (bar and value)"
        if processed
        else "raw unbiased estimate, not consistency-processed (bar and value)"
    )
    caption = (
        f"Window {iso_utc(start)}: {what}; whiskers: {_ci_words(options)} of the raw estimate; "
        "red circle: raw estimate"
    )
    shown = list(report.estimates)
    subset = ""
    if len(shown) > MAX_VALUES_SHOWN:
        shown = report.top(MAX_VALUES_SHOWN)
        subset = (
            f'<p class="note" id="values-shown">The {MAX_VALUES_SHOWN} largest estimates of '
            f"{len(report.estimates)} values; the JSON API has every value.</p>"
        )
    bars = [
        Bar(
            label=e.label,
            value=e.estimate,
            low=e.ci_low,
            high=e.ci_high,
            raw=e.raw_estimate,
            title=f"{e.label}: {_num(e.estimate)} ({what}); raw {_num(e.raw_estimate)}, "
            f"{_ci_words(options)} [{_num(e.ci_low)}, {_num(e.ci_high)}]",
        )
        for e in shown
    ]
    rows = "".join(
        f'<tr data-label="{escape(e.label)}"><td>{escape(e.label)}</td>'
        f'<td class="num estimate">{_num(e.estimate)}</td>'
        f'<td class="num raw">{_num(e.raw_estimate)}</td>'
        f'<td class="num ci-low">{_num(e.ci_low)}</td>'
        f'<td class="num ci-high">{_num(e.ci_high)}</td>'
        f'<td class="num se">{_num(e.std_error)}</td></tr>'
        for e in shown
    )
    hh = heavy_hitters(report)
    hh_text = ", ".join(f"{escape(h.label)} (z = {h.z_score:.1f})" for h in hh) or "none"
    return (
        f'<h2>Latest window: <time id="latest-window">{iso_utc(start)}</time></h2>'
        f'<p id="latest" class="note">{report.n} reports · consistency: '
        f'<span id="consistency-used">{escape(report.consistency)}</span> · '
        f"{_ci_words(options)} of the raw estimate (exact variance of the mechanism)</p>"
        + subset
        + bar_chart(bars, caption=caption)
        + f'<p class="note">{escape(caption)}.</p>'
        '<table id="estimates"><thead><tr><th>value</th>'
        f"<th>estimate ({kind})"
        "</th><th>raw estimate</th>"
        f"<th>{_ci_words(options)} low (raw)</th><th>{_ci_words(options)} high (raw)</th>"
        "<th>std. error</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        f'<p id="heavy-hitters">Heavy hitters (raw estimate above the Bonferroni noise floor, '
        f"α = 0.05): {hh_text}</p>"
    )


def _numeric_section(start: int, report: NumericReport, options: Options) -> str:
    caption = (
        f"Window {iso_utc(start)}: mean (unbiased, no consistency processing); whisker: "
        f"{_ci_words(options)}"
    )
    bar = Bar(
        label="mean",
        value=report.mean,
        low=report.ci_low,
        high=report.ci_high,
        raw=None,
        title=f"mean {_num(report.mean)}, {_ci_words(options)} "
        f"[{_num(report.ci_low)}, {_num(report.ci_high)}]",
    )
    rng = "" if report.lo is None else f" over the range [{report.lo}, {report.hi}]"
    return (
        f'<h2>Latest window: <time id="latest-window">{iso_utc(start)}</time></h2>'
        f'<p id="latest" class="note">{report.n} reports · mean{escape(rng)} · '
        f"{_ci_words(options)} · not consistency-processed (numeric)</p>"
        + bar_chart([bar], caption=caption)
        + '<table id="numeric"><thead><tr><th>mean</th>'
        f"<th>{_ci_words(options)} low</th><th>{_ci_words(options)} high</th>"
        "<th>std. error</th></tr></thead><tbody><tr>"
        f'<td class="num mean">{_num(report.mean)}</td>'
        f'<td class="num ci-low">{_num(report.ci_low)}</td>'
        f'<td class="num ci-high">{_num(report.ci_high)}</td>'
        f'<td class="num se">{_num(report.std_error)}</td></tr></tbody></table>'
        + _histogram_section(report)
    )


def _histogram_section(report: NumericReport) -> str:
    """Square Wave metrics: the EMS histogram with its bootstrap bands as whiskers."""
    h = report.histogram
    if h is None:
        return ""
    level = f"{h.confidence:.0%}"
    bars = [
        Bar(
            label=f"[{a:.6g}, {b:.6g})",
            value=f,
            low=lo,
            high=hi,
            raw=None,
            title=f"[{a:.6g}, {b:.6g}): {_num(f)}, {level} band [{_num(lo)}, {_num(hi)}]",
        )
        for a, b, f, lo, hi in zip(
            h.edges, h.edges[1:], h.frequencies, h.band_low, h.band_high, strict=False
        )
    ]
    caption = (
        f"Distribution (EMS over {h.buckets} buckets; Li et al., SIGMOD 2020): frequency per "
        f"bucket; whisker: {level} parametric-bootstrap band, pointwise ({h.replicates} "
        f"replicates, seed {h.seed}); reconstruction mean {_num(h.mean)} "
        f"[{_num(h.mean_low)}, {_num(h.mean_high)}]"
    )
    return (
        '<h3 id="distribution">Distribution</h3>'
        + bar_chart(bars, caption=caption)
        + f'<p class="note">{escape(caption)}. Smoothing can flatten sharp features; the '
        "bands describe the estimator's spread, not that bias.</p>"
    )


def _trend_section(
    policy: VerifiedPolicy,
    windows: Sequence[WindowReport],
    shown: Sequence[WindowReport],
    options: Options,
) -> str:
    if not windows:
        return ""
    names = [
        iso_utc(w.window_start)[:10] if policy.window_seconds >= 86400 else iso_utc(w.window_start)
        for w in windows
    ]
    series = _trend_series(policy, windows, names)
    caption = (
        f"Trend over the last {len(windows)} windows: raw unbiased estimates (not "
        f"consistency-processed), shaded bands: {_ci_words(options)}; withheld windows "
        "(below the release gate) are gaps"
    )
    withheld = [iso_utc(w.window_start) for w in windows if w.report is None]
    note = (
        f'<p class="note withheld" id="withheld-windows">Withheld (below the release gate): '
        f"{', '.join(withheld)}</p>"
        if withheld
        else ""
    )
    return (
        "<h2>Trend</h2>"
        + trend_chart(series, caption=caption)
        + f'<p class="note">{escape(caption)}. {len(shown)} of {len(windows)} windows '
        "released.</p>" + note
    )


def _trend_series(
    policy: VerifiedPolicy, windows: Sequence[WindowReport], names: Sequence[str]
) -> list[Series]:
    reports = [w.report for w in windows]
    if policy.labels is None:
        points = tuple(
            Point(name, r.mean, r.ci_low, r.ci_high)
            if isinstance(r, NumericReport)
            else Point(name, None, None, None)
            for name, r in zip(names, reports, strict=True)
        )
        return [Series("mean", points)]
    latest = next((r for r in reversed(reports) if isinstance(r, FrequencyReport)), None)
    if latest is None:
        return []
    top = sorted(latest.estimates, key=lambda e: e.raw_estimate, reverse=True)[:5]
    series = []
    for label in (e.label for e in top):
        pts = []
        for name, r in zip(names, reports, strict=True):
            if isinstance(r, FrequencyReport):
                e = r.by_label(label)
                pts.append(Point(name, e.raw_estimate, e.ci_low, e.ci_high))
            else:
                pts.append(Point(name, None, None, None))
        series.append(Series(label, tuple(pts)))
    return series


def budget_page(view: BudgetView, policies: dict[str, VerifiedPolicy]) -> str:
    """ε charged per policy and window, subjects at their cap, central reservations."""
    body = [
        '<p class="note">Counts only: no subject is named. "At cap" counts subjects whose '
        "ε spent in the window leaves no room for one more report at the policy's ε per "
        "report (their devices' reports are refused until the next window).</p>"
    ]
    for pid, rows in view.policies.items():
        p = policies[pid]
        body.append(
            f'<h2>{escape(pid)} v{p.version}</h2><table class="budget" data-policy="{escape(pid)}">'
            "<thead><tr><th>window (UTC)</th><th>reports</th><th>subjects</th>"
            "<th>ε charged (sum over subjects, exact)</th><th>subjects at cap "
            f"({escape(str(p.epsilon_cap))})</th></tr></thead><tbody>"
        )
        for r in rows:
            body.append(
                f'<tr data-window="{r.window_start}"><td>{iso_utc(r.window_start)}</td>'
                f'<td class="num reports">{r.reports}</td>'
                f'<td class="num subjects">{r.subjects}</td>'
                f'<td class="num charged">{r.epsilon_charged}</td>'
                f'<td class="num at-cap">{r.at_cap}</td></tr>'
            )
        body.append("</tbody></table>")
    body.append(_reservations_table("Central reservations", "reservations", view.reservations))
    for i, central in enumerate(view.central, start=1):
        title = f"Central reservations: {central.label}"
        body.append(_reservations_table(title, f"reservations-{i}", central.reservations))
    if not view.reservations and not any(c.reservations for c in view.central):
        body.append('<p class="note">No central reservations in this ledger.</p>')
    return page("Budget", "".join(body), read_at=view.read_at)


def _reservations_table(title: str, table_id: str, rows: list[PurposeReservations]) -> str:
    """One ledger's central reservations per purpose (counts and exact ε sums)."""
    body = [
        f'<h2>{escape(title)}</h2><table id="{table_id}" class="reservations"><thead><tr>'
        "<th>purpose</th><th>open</th><th>ε reserved (open)</th><th>settled</th>"
        "<th>ε spent (settled)</th><th>cancelled</th></tr></thead><tbody>"
    ]
    for c in rows:
        body.append(
            f'<tr data-purpose="{escape(c.purpose)}"><td>{escape(c.purpose)}</td>'
            f'<td class="num open">{c.open_count}</td>'
            f'<td class="num open-eps">{c.open_epsilon}</td>'
            f'<td class="num settled">{c.settled_count}</td>'
            f'<td class="num settled-eps">{c.settled_epsilon}</td>'
            f'<td class="num cancelled">{c.cancelled_count}</td></tr>'
        )
    body.append("</tbody></table>")
    return "".join(body)


def error_page(status: int, message: str, *, read_at: int) -> str:
    """A plain error page (the message never contains a raw value)."""
    return page(f"Error {status}", f"<p>{escape(message)}</p>", read_at=read_at)
