"""Render analyst reports: a terminal table and a self-contained HTML page.

The HTML page embeds its bar chart (matplotlib, Agg backend, no display
needed) as a base64 PNG and carries no external reference: it can be mailed or
archived as one file. It shows the mechanism, ε, the report count and the
budget charged, the estimates with their confidence intervals, and optionally
the truth beside them (simulations and demos only).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedldp.aggregator.estimation import (
    FrequencyReport,
    LabelEstimate,
    NumericReport,
    truth_vector,
)

#: Rows shown by default; beyond it the largest estimates are listed.
DEFAULT_MAX_ROWS = 40
_BAR_WIDTH = 24

Truth = Mapping[str, float] | Sequence[float]


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
        facts.append(f"window {ctx.window_start}")
    if ctx.epsilon_cap is not None:
        facts.append(f"cap/user {ctx.epsilon_cap}")
    if ctx.epsilon_charged is not None:
        facts.append(f"eps charged {ctx.epsilon_charged}")
    lines.append(", ".join(facts))
    return lines


def render_table(
    report: FrequencyReport | NumericReport,
    *,
    truth: Truth | float | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> str:
    """A plain-text table for a terminal (no colour codes, fixed-width columns)."""
    if isinstance(report, NumericReport):
        lines = _header_lines(report)
        level = f"{report.confidence:.0%}"
        lines.append(
            f"mean {report.mean:.6g} ± {report.std_error:.3g} (s.e.), "
            f"{level} CI [{report.ci_low:.6g}, {report.ci_high:.6g}]"
            + (f", truth {float(truth):.6g}" if isinstance(truth, int | float) else "")
        )
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
    width = max([len("label")] + [len(r.label) for r in rows])
    width = min(width, 32)
    head = f"{'label':<{width}}  {'estimate':>9}  {'std err':>8}  {'CI low':>8}  {'CI high':>8}"
    if truths is not None:
        head += f"  {'truth':>8}"
    head += f"  {'z':>6}  chart"
    lines.append(head)
    lines.append("-" * len(head) + "-" * (_BAR_WIDTH - len("chart")))
    scale = max([r.ci_high for r in rows] + [r.estimate for r in rows] + [1e-12])
    for r in rows:
        label = r.label if len(r.label) <= width else r.label[: width - 1] + "…"
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


def _chart_png(
    report: FrequencyReport, rows: list[LabelEstimate], truth: dict[str, float] | None
) -> bytes:
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(6.0, 0.35 * len(rows) + 2.0), 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    xs = list(range(len(rows)))
    ax.bar(xs, [r.estimate for r in rows], color="#4c78a8", label="estimate")
    # The interval is drawn from its own bounds: a post-processed estimate may sit outside it.
    mids = [(r.ci_low + r.ci_high) / 2 for r in rows]
    half = [(r.ci_high - r.ci_low) / 2 for r in rows]
    ax.errorbar(
        xs,
        mids,
        yerr=half,
        fmt="none",
        ecolor="#222222",
        capsize=3,
        linewidth=1,
        label=f"{report.confidence:.0%} CI (raw estimate)",
    )
    if truth is not None:
        ax.scatter(
            xs,
            [truth[r.label] for r in rows],
            color="#e45756",
            marker="D",
            s=18,
            zorder=3,
            label="truth",
        )
    ax.set_xticks(xs)
    ax.set_xticklabels([r.label[:18] for r in rows], rotation=60, ha="right", fontsize=8)
    ax.set_ylabel("frequency")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title(f"{report.mechanism}, ε = {report.epsilon}, n = {report.n:,}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


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
    if ctx.window_start is not None:
        facts.append(("window start", str(ctx.window_start)))
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
    report: FrequencyReport | NumericReport,
    path: str | Path,
    *,
    truth: Truth | float | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
) -> Path:
    """Write a self-contained HTML report to `path` and return the path."""
    out = Path(path)
    title = html.escape(report.context.metric or report.context.policy_id or "fedldp report")
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{title}</title><style>{_CSS}</style></head><body>",
        f"<h1>{title}</h1>",
        _facts_html(report),
    ]
    if isinstance(report, NumericReport):
        parts.append(
            f"<h2>Mean</h2><p>{report.mean:.6g} ± {report.std_error:.3g} (standard error); "
            f"{report.confidence:.0%} CI [{report.ci_low:.6g}, {report.ci_high:.6g}]"
            + (f"; truth {float(truth):.6g}" if isinstance(truth, int | float) else "")
            + "</p>"
        )
    else:
        rows, hidden = _rows(report, max_rows)
        truths: dict[str, float] | None = None
        if truth is not None and not isinstance(truth, int | float):
            truths = dict(zip(report.labels, truth_vector(report.labels, truth), strict=True))
        png = base64.b64encode(_chart_png(report, rows, truths)).decode("ascii")
        parts.append(
            f"<h2>Estimates</h2><img alt='bar chart with error bars' "
            f"src='data:image/png;base64,{png}'>"
        )
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
    parts.append("</body></html>")
    out.write_text("\n".join(parts), encoding="utf-8")
    return out
