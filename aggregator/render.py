"""Render analyst reports: a terminal table and a self-contained HTML page.

The HTML page embeds its bar chart as inline SVG (vector graphics: sharp at any
zoom) and carries no external reference: it can be mailed or archived as one
file. It shows the policy's purpose, the mechanism, ε, the report count, the
window (ISO 8601 UTC), the budget in plain words, the estimates with their
confidence intervals and z scores (explained on the page), and optionally the
truth beside them (simulations and demos only).
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedldp.aggregator.estimation import (
    FrequencyReport,
    LabelEstimate,
    NumericReport,
    truth_vector,
)
from fedldp.aggregator.histogram import Histogram
from fedldp.aggregator.multi_report import MultiReport

#: Rows shown by default; beyond it the largest estimates are listed.
DEFAULT_MAX_ROWS = 40
_BAR_WIDTH = 24

Truth = Mapping[str, float] | Sequence[float]


def printable(label: str) -> str:
    """`label` for a terminal: non-printable characters (e.g. ESC in a string discovered
    from users' reports) written as Python escapes, so no label can drive the terminal."""
    if label.isprintable():
        return label
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in label)


def _rows(report: FrequencyReport, max_rows: int | None) -> tuple[list[LabelEstimate], int]:
    rows = list(report.estimates)
    if max_rows is not None and len(rows) > max_rows:
        return report.top(max_rows), len(rows) - max_rows
    return rows, 0


def _header_lines(report: FrequencyReport | NumericReport) -> list[str]:
    ctx = report.context
    lines = []
    title = ctx.metric or ctx.policy_id or "report"
    if ctx.policy_id is not None:
        title += f"  (policy {ctx.policy_id}"
        title += f" v{ctx.policy_version})" if ctx.policy_version is not None else ")"
    lines.append(title)
    facts = [
        f"mechanism {report.mechanism}",
        f"eps/report {report.epsilon}",
        f"reports {report.n:,}",
    ]
    if ctx.window_start is not None:
        facts.append(f"window {iso_utc(ctx.window_start)}")
    if ctx.epsilon_cap is not None:
        facts.append(f"cap/user {ctx.epsilon_cap}")
    if ctx.epsilon_charged is not None:
        facts.append(f"eps charged {ctx.epsilon_charged}")
    lines.append(", ".join(facts))
    if ctx.shuffle is not None:
        lines.extend(shuffle_lines(ctx.shuffle))
    return lines


def shuffle_lines(shuffle: Mapping[str, object], *, greek: bool = False) -> list[str]:
    """A shuffled batch's guarantees in words (`ShuffledRelease.guarantee_dict`): local ε0
    per report, the amplified central (ε, δ) per report over n, and per device (group
    privacy over its at most m reports); every ε and δ is rounded up. `greek`: ε and δ
    (HTML) instead of eps and delta (the terminal table's ASCII)."""
    eps, delta = ("ε", "δ") if greek else ("eps", "delta")
    m = shuffle["max_reports_per_device"]
    invalid = shuffle["invalid"]
    dropped = ", ".join(f"{k} {v}" for k, v in invalid.items()) if isinstance(invalid, dict) else ""
    lines = [
        f"shuffled batch {shuffle['batch']}: {shuffle['valid_reports']} valid reports; "
        f"invalid dropped: {dropped or 'none'}",
        f"local: {eps}0 = {shuffle['epsilon0']} per report (against everyone, all roles colluding)",
    ]
    if shuffle["central_epsilon"] is None:
        lines.append("central: no valid report, no central guarantee")
        return lines
    count = shuffle["collector_count"]
    source = {"manifest": "the shuffler's manifest"}.get(
        str(shuffle["collector_count_source"]), str(shuffle["collector_count_source"])
    )
    capped = (
        f"; collector count {count} (from {source})"
        if count is not None
        else "; no collector count (n not capped)"
    )
    lines.append(
        f"central (shuffled): ({eps}, {delta}) = ({shuffle['central_epsilon']}, "
        f"{shuffle['delta']}) "
        f"per report over n = {shuffle['n']} [{shuffle['bound']}]{capped}"
    )
    device = shuffle["device_delta"]
    central_device = (
        f"({shuffle['device_epsilon']}, {device})" if device is not None else f"none ({delta} >= 1)"
    )
    lines.append(
        f"per device (at most {m} reports in the batch, group privacy): local "
        f"{eps} = {shuffle['local_epsilon_per_device']}, central {central_device}"
    )
    return lines


def _multi_header_lines(report: MultiReport) -> list[str]:
    ctx = report.context
    title = ctx.metric or ctx.policy_id or "report"
    if ctx.policy_id is not None:
        title += f"  (policy {ctx.policy_id} v{ctx.policy_version})"
    facts = [
        f"mechanism {report.mechanism}",
        f"eps/report {report.epsilon} (each attribute at {report.attribute_epsilon})",
        f"reports {report.n:,}",
    ]
    if ctx.epsilon_charged is not None:
        facts.append(f"eps charged {ctx.epsilon_charged}")
    return [title, ", ".join(facts), *(shuffle_lines(ctx.shuffle) if ctx.shuffle else [])]


def render_table(
    report: FrequencyReport | NumericReport | MultiReport,
    *,
    truth: Truth | float | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> str:
    """A plain-text table for a terminal (no colour codes, fixed-width columns).

    A multi-attribute report gets a header, then each attribute's own table
    (`truth`, when given, maps attribute names to that attribute's truth)."""
    if isinstance(report, MultiReport):
        lines = _multi_header_lines(report)
        for a in report.attributes:
            sub = truth.get(a.name) if isinstance(truth, Mapping) else None
            lines.append("")
            lines.append(f"attribute {a.name} ({a.reports:,} reports)")
            lines.append(render_table(a.report, truth=sub, max_rows=max_rows).rstrip("\n"))
        return "\n".join(lines) + "\n"
    if isinstance(report, NumericReport):
        lines = _header_lines(report)
        level = f"{report.confidence:.0%}"
        lines.append(
            f"mean {report.mean:.6g} ± {report.std_error:.3g} (s.e.), "
            f"{level} CI [{report.ci_low:.6g}, {report.ci_high:.6g}]"
            + (f", truth {float(truth):.6g}" if isinstance(truth, int | float) else "")
        )
        if report.histogram is not None:
            lines.extend(_histogram_lines(report.histogram))
        return "\n".join(lines) + "\n"
    lines = _header_lines(report)
    kind = "simultaneous " if report.simultaneous else ""
    lines.append(
        f"{report.confidence:.0%} {kind}confidence intervals; consistency {report.consistency}"
    )
    rows, hidden = _rows(report, max_rows)
    truths: dict[str, float] | None = None
    if truth is not None and not isinstance(truth, int | float):
        tv = truth_vector(report.labels, truth)
        truths = dict(zip(report.labels, tv, strict=True))
    width = max([len("label")] + [len(printable(r.label)) for r in rows])
    width = min(width, 32)
    head = f"{'label':<{width}}  {'estimate':>9}  {'std err':>8}  {'CI low':>8}  {'CI high':>8}"
    if truths is not None:
        head += f"  {'truth':>8}"
    head += f"  {'z':>6}  chart"
    lines.append(head)
    lines.append("-" * len(head) + "-" * (_BAR_WIDTH - len("chart")))
    scale = max([r.ci_high for r in rows] + [r.estimate for r in rows] + [1e-12])
    for r in rows:
        text = printable(r.label)
        label = text if len(text) <= width else text[: width - 1] + "…"
        line = (
            f"{label:<{width}}  {r.estimate:>9.4f}  {r.std_error:>8.4f}  "
            f"{r.ci_low:>8.4f}  {r.ci_high:>8.4f}"
        )
        if truths is not None:
            line += f"  {truths[r.label]:>8.4f}"
        bar = "#" * max(0, round(max(r.estimate, 0.0) / scale * _BAR_WIDTH))
        line += f"  {r.z_score:>6.1f}  {bar}"
        lines.append(line)
    if hidden:
        lines.append(f"... {hidden} more values not shown (largest {len(rows)} listed)")
    return "\n".join(lines) + "\n"


def _histogram_labels(h: Histogram) -> list[str]:
    """ "[a, b)" per bucket (the last one closed), edges at 6 significant digits."""
    labels = [f"[{a:.6g}, {b:.6g})" for a, b in zip(h.edges, h.edges[1:], strict=False)]
    labels[-1] = labels[-1][:-1] + "]"
    return labels


def _histogram_words(h: Histogram) -> str:
    return (
        f"distribution (EMS over {h.buckets} buckets): mean of the reconstruction "
        f"{h.mean:.6g}, {h.confidence:.0%} band [{h.mean_low:.6g}, {h.mean_high:.6g}]; "
        f"bands: parametric bootstrap ({h.replicates} replicates, seed {h.seed}), "
        "pointwise per bucket"
    )


def _histogram_lines(h: Histogram) -> list[str]:
    """The EMS histogram as text rows: bucket, frequency, band, bar."""
    labels = _histogram_labels(h)
    width = max(len("bucket"), *(len(label) for label in labels))
    head = f"{'bucket':<{width}}  {'freq':>7}  {'band low':>8}  {'band high':>9}  chart"
    lines = [_histogram_words(h), head, "-" * (len(head) + _BAR_WIDTH - len("chart"))]
    scale = max([*h.frequencies, 1e-12])
    for label, f, lo, hi in zip(labels, h.frequencies, h.band_low, h.band_high, strict=True):
        bar = "#" * round(f / scale * _BAR_WIDTH)
        lines.append(f"{label:<{width}}  {f:>7.4f}  {lo:>8.4f}  {hi:>9.4f}  {bar}")
    return lines


def _histogram_html(report: NumericReport, h: Histogram) -> str:
    """The EMS histogram: an SVG chart with the bands as whiskers, and its table."""
    labels = _histogram_labels(h)
    rows = [
        LabelEstimate(label, f, f, 0.0, lo, hi, 0.0)
        for label, f, lo, hi in zip(labels, h.frequencies, h.band_low, h.band_high, strict=True)
    ]
    chart = _chart_svg(report, rows, None, whiskers="bootstrap band (pointwise)")
    body = "".join(
        f"<tr><td>{html.escape(r.label)}</td><td>{r.estimate:.4f}</td>"
        f"<td>{r.ci_low:.4f}</td><td>{r.ci_high:.4f}</td></tr>"
        for r in rows
    )
    return (
        f"<h2>Distribution</h2>{chart}"
        "<table><tr><th>bucket</th><th>frequency</th><th>band low</th><th>band high</th></tr>"
        f"{body}</table><p class='note'>{html.escape(_histogram_words(h))}. The histogram is "
        "the EMS reconstruction (Li et al., SIGMOD 2020, Section 5): smoothing can flatten "
        "sharp features, and the bands describe the estimator's spread, not that bias. "
        "The mean above is the mechanism's unbiased estimate with its exact variance.</p>"
    )


def iso_utc(epoch_seconds: int) -> str:
    """A time for people: ISO 8601 in UTC, e.g. "2026-12-01T00:00:00Z"."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_seconds))


def _duration(seconds: int) -> str:
    """ "1 day", "7 days", "6 hours", "90 seconds": the window length in words."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds % size == 0 and seconds >= size:
            count = seconds // size
            return f"{count} {unit}" + ("s" if count != 1 else "")
    return f"{seconds} seconds"


def budget_sentence(report: FrequencyReport | NumericReport) -> str | None:
    """The privacy budget in plain words (None when the report carries no budget)."""
    ctx = report.context
    if ctx.epsilon_cap is None:
        return None
    window = f" per {_duration(ctx.window_seconds)}" if ctx.window_seconds else " per window"
    text = (
        f"Each person's device may spend at most ε = {ctx.epsilon_cap}{window} on this "
        f"policy; each report costs ε = {report.epsilon}."
    )
    if ctx.epsilon_charged is not None:
        text += (
            f" The {report.n:,} reports counted here were charged ε = {ctx.epsilon_charged} "
            "in total, summed over all devices (no single device spent more than its cap)."
        )
    return text


#: What the rows of a pem report are (aggregator/discovery.py).
PEM_NOTE = (
    "Strings found by prefix extension (PEM) with a fixed threshold rule; each estimate "
    "is the fraction of all users holding the string, from the last group's reports; "
    "strings below the threshold are not listed."
)

_SVG_BAR = "#4c78a8"
_SVG_TRUTH = "#e45756"


def _chart_svg(
    report: FrequencyReport | NumericReport,
    rows: list[LabelEstimate],
    truth: dict[str, float] | None,
    *,
    whiskers: str = "CI of the raw estimate",
) -> str:
    """The bar chart as inline SVG (vector: sharp at any zoom): estimates as bars, the
    confidence interval of each raw estimate as an error bar, the truth as diamonds."""
    step, left, top, plot_h, label_h = 28, 56, 24, 220, 110
    width = left + step * len(rows) + 20
    values = [r.ci_high for r in rows] + [r.estimate for r in rows]
    values += [truth[r.label] for r in rows] if truth is not None else []
    y_max = max([1e-9, *values]) * 1.08

    def y(v: float) -> float:
        return top + plot_h * (1 - max(0.0, min(v, y_max)) / y_max)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{top + plot_h + label_h}" role="img" font-family="sans-serif" font-size="11">',
        f"<title>{html.escape(report.mechanism)}, ε = {report.epsilon}, n = {report.n:,}: "
        f"estimates with {report.confidence:.0%} confidence intervals</title>",
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 10}" y2="{top + plot_h}" '
        'stroke="#444"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#444"/>',
    ]
    for i in range(5):  # y ticks
        v = y_max * i / 4
        out.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>'
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{width - 10}" y2="{y(v):.1f}" '
            'stroke="#eee"/>'
        )
    for i, r in enumerate(rows):
        x = left + step * i + 4
        bar_w, mid = step - 8, left + step * i + step / 2
        out.append(
            f'<rect x="{x}" y="{y(r.estimate):.1f}" width="{bar_w}" '
            f'height="{top + plot_h - y(r.estimate):.1f}" fill="{_SVG_BAR}">'
            f"<title>{html.escape(r.label)}: {r.estimate:.4f} "
            f"[{r.ci_low:.4f}, {r.ci_high:.4f}]</title></rect>"
        )
        out.append(
            f'<path d="M{mid} {y(r.ci_low):.1f}V{y(r.ci_high):.1f}'
            f'M{mid - 4} {y(r.ci_low):.1f}h8M{mid - 4} {y(r.ci_high):.1f}h8" '
            'stroke="#222" fill="none"/>'
        )
        if truth is not None:
            ty = y(truth[r.label])
            out.append(f'<path d="M{mid} {ty - 5:.1f}l5 5l-5 5l-5 -5z" fill="{_SVG_TRUTH}"/>')
        out.append(
            f'<text transform="translate({mid + 3},{top + plot_h + 8}) rotate(60)">'
            f"{html.escape(r.label[:18])}</text>"
        )
    legend = f"bars: estimate; whiskers: {report.confidence:.0%} {whiskers}"
    legend += "; diamonds: truth" if truth is not None else ""
    out.append(f'<text x="{left}" y="14">{html.escape(legend)}</text></svg>')
    return "".join(out)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;font-size:14px}
th,td{padding:4px 10px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
.facts td{text-align:left}
.note{color:#666;font-size:13px}
"""


def _facts_html(report: FrequencyReport | NumericReport) -> str:
    ctx = report.context
    facts: list[tuple[str, str]] = [
        ("mechanism", report.mechanism),
        ("ε per report", str(report.epsilon)),
        ("reports", f"{report.n:,}"),
    ]
    if ctx.policy_id is not None:
        facts.insert(0, ("policy", f"{ctx.policy_id} v{ctx.policy_version}"))
    if ctx.purpose:
        facts.append(("purpose", ctx.purpose))
    if ctx.window_start is not None:
        end = f" to {iso_utc(ctx.window_start + ctx.window_seconds)}" if ctx.window_seconds else ""
        facts.append(("window (UTC)", f"{iso_utc(ctx.window_start)}{end}"))
    if ctx.epsilon_cap is not None:
        facts.append(("ε cap per user per window", str(ctx.epsilon_cap)))
    if ctx.epsilon_charged is not None:
        facts.append(("budget spent (Σ ε charged)", str(ctx.epsilon_charged)))
    if ctx.shards is not None:
        facts.append(("partial statistics merged", str(ctx.shards)))
    if isinstance(report, FrequencyReport):
        facts.append(("consistency", report.consistency))
        facts.append(
            (
                "intervals",
                f"{report.confidence:.0%}"
                + (" simultaneous (Bonferroni)" if report.simultaneous else ""),
            )
        )
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{body}</table>'


def render_html(
    report: FrequencyReport | NumericReport | MultiReport,
    path: str | Path,
    *,
    truth: Truth | float | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> Path:
    """Write a self-contained HTML report to `path` and return the path.

    A multi-attribute report gets one section per attribute (`truth`, when
    given, maps attribute names to that attribute's truth)."""
    out = Path(path)
    title = html.escape(report.context.metric or report.context.policy_id or "fedldp report")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{title}</title><style>{_CSS}</style></head><body>",
        f"<h1>{title}</h1>",
    ]
    if isinstance(report, MultiReport):
        parts.append(_multi_facts_html(report))
        if report.context.shuffle is not None:
            parts.append(_shuffle_html(report.context.shuffle))
        for a in report.attributes:
            sub = truth.get(a.name) if isinstance(truth, Mapping) else None
            parts.append(
                f"<h2>Attribute {html.escape(a.name)}</h2>"
                f"<p class='note'>{a.reports:,} reports carry this attribute.</p>"
            )
            parts.append(_facts_html(a.report))
            parts.extend(_estimates_html(a.report, sub, max_rows))
    else:
        parts.append(_facts_html(report))
        if report.context.shuffle is not None:
            parts.append(_shuffle_html(report.context.shuffle))
        sentence = budget_sentence(report)
        if sentence is not None:
            parts.append(f"<h2>Privacy budget</h2><p>{html.escape(sentence)}</p>")
        parts.extend(_estimates_html(report, truth, max_rows))
    parts.append("</body></html>")
    out.write_text("\n".join(parts), encoding="utf-8")
    return out


def _shuffle_html(shuffle: Mapping[str, object]) -> str:
    """The shuffle model's guarantees beside the estimates: ε0 and the central (ε, δ)."""
    items = "".join(f"<li>{html.escape(line)}</li>" for line in shuffle_lines(shuffle, greek=True))
    return (
        "<h2>Shuffle model: local and central guarantee</h2>"
        f"<ul class='shuffle'>{items}</ul><p class='note'>The central (ε, δ) holds against "
        "the analyzer and whoever sees only its outputs, provided the analyzer colludes "
        "with neither the collector nor the shuffler (Feldman, McMillan and Talwar, FOCS "
        "2021, Theorem 3.2; docs/shuffle.md). ε0 holds against everyone.</p>"
    )


def _multi_facts_html(report: MultiReport) -> str:
    ctx = report.context
    facts: list[tuple[str, str]] = [
        ("mechanism", report.mechanism),
        ("ε per report (charged once)", str(report.epsilon)),
        ("ε per attribute", str(report.attribute_epsilon)),
        ("reports", f"{report.n:,}"),
    ]
    if ctx.policy_id is not None:
        facts.insert(0, ("policy", f"{ctx.policy_id} v{ctx.policy_version}"))
    if ctx.epsilon_charged is not None:
        facts.append(("budget spent (Σ ε charged)", str(ctx.epsilon_charged)))
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    return f'<table class="facts">{body}</table>'


def _estimates_html(
    report: FrequencyReport | NumericReport,
    truth: Truth | float | None,
    max_rows: int | None,
) -> list[str]:
    """The estimates section of one report (a mean, or a chart and a table)."""
    parts: list[str] = []
    if isinstance(report, NumericReport):
        parts.append(
            f"<h2>Mean</h2><p>{report.mean:.6g} ± {report.std_error:.3g} (standard error); "
            f"{report.confidence:.0%} CI [{report.ci_low:.6g}, {report.ci_high:.6g}]"
            + (f"; truth {float(truth):.6g}" if isinstance(truth, int | float) else "")
            + "</p>"
        )
        if report.histogram is not None:
            parts.append(_histogram_html(report, report.histogram))
    else:
        rows, hidden = _rows(report, max_rows)
        truths: dict[str, float] | None = None
        if truth is not None and not isinstance(truth, int | float):
            truths = dict(zip(report.labels, truth_vector(report.labels, truth), strict=True))
        if report.mechanism == "pem":
            parts.append(f"<h2>Discovered strings</h2><p class='note'>{html.escape(PEM_NOTE)}</p>")
        parts.append(f"<h2>Estimates</h2>{_chart_svg(report, rows, truths)}")
        head = "<tr><th>label</th><th>estimate</th><th>raw</th><th>std err</th>"
        head += "<th>CI low</th><th>CI high</th>"
        head += "<th>truth</th>" if truths is not None else ""
        head += "<th>z</th></tr>"
        body = []
        for r in rows:
            cells = [
                html.escape(r.label),
                f"{r.estimate:.4f}",
                f"{r.raw_estimate:.4f}",
                f"{r.std_error:.4f}",
                f"{r.ci_low:.4f}",
                f"{r.ci_high:.4f}",
            ]
            if truths is not None:
                cells.append(f"{truths[r.label]:.4f}")
            cells.append(f"{r.z_score:.1f}")
            body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append(f"<table>{head}{''.join(body)}</table>")
        if hidden:
            parts.append(
                f"<p class='note'>{hidden} more values not shown; "
                f"the largest {len(rows)} estimates are listed.</p>"
            )
        parts.append(
            "<p class='note'>Standard errors and intervals describe the raw unbiased "
            "estimate (exact mechanism variance); the bar is the reported estimate after "
            "consistency post-processing. Intervals are clipped to [0, 1].</p>"
        )
        parts.append(
            "<p class='note'>z = raw estimate ÷ standard error: how many standard errors "
            "the estimate lies above zero. |z| below about 2 means the value cannot be told "
            "apart from the mechanism's noise (it may be absent); a large z means the "
            "value is clearly present.</p>"
        )
    return parts
