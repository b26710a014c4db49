"""Server-side SVG charts: bars with confidence whiskers, trend lines with CI bands.

Pure string building: the page embeds the SVG inline, so it needs no script,
font or external resource. Every chart element carries a class (`bar`,
`whisker`, `raw-marker`, `trend-line`, `ci-band`, `trend-point`) and a
`<title>` stating its numbers, its CI level and whether it is
consistency-processed; the browser tests look for those.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

#: Series colours (Okabe-Ito, distinguishable with colour-blindness).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#d55e00", "#56b4e9", "#f0e442")


@dataclass(frozen=True)
class Bar:
    """One row of a bar chart: `value` drawn as the bar, [low, high] as the whisker."""

    label: str
    value: float
    low: float
    high: float
    raw: float | None
    title: str


@dataclass(frozen=True)
class Point:
    """One window of a trend series; None where the window is withheld (release gate)."""

    x_label: str
    value: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class Series:
    """A named trend line."""

    name: str
    points: tuple[Point, ...]


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def _axis_range(lows: Sequence[float], highs: Sequence[float]) -> tuple[float, float]:
    """[min(0, lows), max(highs)] padded so that a zero-width range still draws."""
    lo = min([0.0, *lows])
    hi = max([0.0, *highs])
    if hi - lo <= 0:
        hi = lo + 1.0
    return lo, hi


def bar_chart(bars: Sequence[Bar], *, caption: str, number_format: str = "{:.4f}") -> str:
    """Horizontal bars (value) with whiskers (CI) and a raw-estimate marker.

    `caption` is shown as the chart's accessible title and must say the CI level
    and whether the bars are consistency-processed.
    """
    label_w, plot_w, row_h, top = 180.0, 460.0, 26.0, 24.0
    width = label_w + plot_w + 90.0
    height = top + row_h * len(bars) + 28.0
    lo, hi = _axis_range([b.low for b in bars], [b.high for b in bars])

    def x(v: float) -> float:
        return label_w + (v - lo) / (hi - lo) * plot_w

    parts = [
        f'<svg class="chart bar-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'width="{_fmt(width)}" height="{_fmt(height)}" '
        f'viewBox="0 0 {_fmt(width)} {_fmt(height)}">',
        f"<title>{escape(caption)}</title>",
        f'<line class="axis" x1="{_fmt(x(0))}" y1="{_fmt(top - 6)}" x2="{_fmt(x(0))}" '
        f'y2="{_fmt(top + row_h * len(bars))}" stroke="#444" stroke-width="1"/>',
    ]
    for i, b in enumerate(bars):
        y = top + i * row_h
        mid = y + row_h / 2
        x0, x1 = sorted((x(0), x(b.value)))
        label = escape(b.label)
        parts.append(
            f'<text x="{_fmt(label_w - 6)}" y="{_fmt(mid + 4)}" text-anchor="end" '
            f'font-size="12" fill="#222">{label}</text>'
        )
        parts.append(
            f'<rect class="bar" data-label="{label}" x="{_fmt(x0)}" y="{_fmt(y + 5)}" '
            f'width="{_fmt(max(x1 - x0, 0.5))}" height="{_fmt(row_h - 10)}" fill="#8fb8de">'
            f"<title>{escape(b.title)}</title></rect>"
        )
        wl, wh = x(b.low), x(b.high)
        parts.append(
            f'<g class="whisker" data-label="{label}" stroke="#222" stroke-width="1.5">'
            f"<title>{escape(b.title)}</title>"
            f'<line x1="{_fmt(wl)}" y1="{_fmt(mid)}" x2="{_fmt(wh)}" y2="{_fmt(mid)}"/>'
            f'<line x1="{_fmt(wl)}" y1="{_fmt(mid - 6)}" x2="{_fmt(wl)}" y2="{_fmt(mid + 6)}"/>'
            f'<line x1="{_fmt(wh)}" y1="{_fmt(mid - 6)}" x2="{_fmt(wh)}" y2="{_fmt(mid + 6)}"/>'
            "</g>"
        )
        if b.raw is not None:
            parts.append(
                f'<circle class="raw-marker" data-label="{label}" cx="{_fmt(x(b.raw))}" '
                f'cy="{_fmt(mid)}" r="3.5" fill="#fff" stroke="#c00" stroke-width="1.5">'
                f"<title>raw (unbiased) estimate {escape(number_format.format(b.raw))}</title>"
                "</circle>"
            )
        parts.append(
            f'<text x="{_fmt(label_w + plot_w + 8)}" y="{_fmt(mid + 4)}" font-size="11" '
            f'fill="#222">{escape(number_format.format(b.value))}</text>'
        )
    base = top + row_h * len(bars) + 16
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<text x="{_fmt(x(v))}" y="{_fmt(base)}" text-anchor="middle" font-size="10" '
            f'fill="#555">{escape(number_format.format(v))}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def trend_chart(series: Sequence[Series], *, caption: str) -> str:
    """One line per series over windows, with its CI as a shaded band.

    Withheld windows (None) break the line and the band; the x axis names every
    window (ISO 8601 UTC dates).
    """
    if not series or not series[0].points:
        return ""
    left, plot_w, top, plot_h = 56.0, 560.0, 16.0, 220.0
    width, height = left + plot_w + 190.0, top + plot_h + 60.0
    windows = [p.x_label for p in series[0].points]
    lows = [p.low for s in series for p in s.points if p.low is not None]
    highs = [p.high for s in series for p in s.points if p.high is not None]
    lo, hi = _axis_range(lows, highs)
    step = plot_w / max(len(windows) - 1, 1)

    def x(i: int) -> float:
        return left + (i * step if len(windows) > 1 else plot_w / 2)

    def y(v: float) -> float:
        return top + plot_h - (v - lo) / (hi - lo) * plot_h

    parts = [
        f'<svg class="chart trend-chart" xmlns="http://www.w3.org/2000/svg" role="img" '
        f'width="{_fmt(width)}" height="{_fmt(height)}" '
        f'viewBox="0 0 {_fmt(width)} {_fmt(height)}">',
        f"<title>{escape(caption)}</title>",
        f'<line class="axis" x1="{_fmt(left)}" y1="{_fmt(y(0))}" x2="{_fmt(left + plot_w)}" '
        f'y2="{_fmt(y(0))}" stroke="#444" stroke-width="1"/>',
    ]
    for v in (lo, (lo + hi) / 2, hi):
        parts.append(
            f'<text x="{_fmt(left - 6)}" y="{_fmt(y(v) + 4)}" text-anchor="end" font-size="10" '
            f'fill="#555">{v:.3f}</text>'
        )
    for i, name in enumerate(windows):
        parts.append(
            f'<text x="{_fmt(x(i))}" y="{_fmt(top + plot_h + 16)}" text-anchor="middle" '
            f'font-size="9" fill="#555">{escape(name)}</text>'
        )
    for k, s in enumerate(series):
        colour = PALETTE[k % len(PALETTE)]
        parts.extend(_series_svg(s, colour, x, y))
        ly = top + 12 + k * 18
        parts.append(
            f'<rect x="{_fmt(left + plot_w + 16)}" y="{_fmt(ly - 9)}" width="12" height="12" '
            f'fill="{colour}"/><text x="{_fmt(left + plot_w + 34)}" y="{_fmt(ly + 1)}" '
            f'font-size="11" fill="#222">{escape(s.name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


#: One shown window of a series: (index, value, low, high).
Shown = tuple[int, float, float, float]


def _segments(points: Sequence[Point]) -> list[list[Shown]]:
    """Runs of consecutive shown points (a withheld window ends a run)."""
    runs: list[list[Shown]] = [[]]
    for i, p in enumerate(points):
        if p.value is None or p.low is None or p.high is None:
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append((i, p.value, p.low, p.high))
    return [r for r in runs if r]


def _series_svg(
    s: Series, colour: str, fx: Callable[[int], float], fy: Callable[[float], float]
) -> list[str]:
    """The band, line and points of one series (one of each per run of shown windows)."""
    name = escape(s.name)
    out: list[str] = []
    for run in _segments(s.points):
        upper = [f"{_fmt(fx(i))},{_fmt(fy(hi))}" for i, _, _, hi in run]
        lower = [f"{_fmt(fx(i))},{_fmt(fy(lo))}" for i, _, lo, _ in reversed(run)]
        out.append(
            f'<polygon class="ci-band" data-series="{name}" points="{" ".join(upper + lower)}" '
            f'fill="{colour}" fill-opacity="0.18" stroke="none"/>'
        )
        line = " ".join(f"{_fmt(fx(i))},{_fmt(fy(v))}" for i, v, _, _ in run)
        out.append(
            f'<polyline class="trend-line" data-series="{name}" points="{line}" fill="none" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        for i, v, lo, hi in run:
            label = escape(s.points[i].x_label)
            out.append(
                f'<circle class="trend-point" data-series="{name}" cx="{_fmt(fx(i))}" '
                f'cy="{_fmt(fy(v))}" r="3" fill="{colour}"><title>{name}, window '
                f"{label}: {v:.4f} [{lo:.4f}, {hi:.4f}]</title></circle>"
            )
    return out
