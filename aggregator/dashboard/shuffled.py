"""The dashboard's shuffled-batch page: the analyzer's reports, as the analyzer wrote them.

Source (docs/dashboard.md, docs/shuffle.md): a folder of the JSON reports the analyzer writes
with `fedldp report --batch FILE --analyzer-key KEY --format json --out DIR/NAME.json`
(`fedldp dashboard --shuffle-reports DIR`). The dashboard never holds the analyzer's private
key and never opens a batch: it shows each report's estimates beside ε0 (local, per report),
the amplified central (ε, δ) per report over n and the per-device guarantee, exactly as the
report states them. A file that is not such a report (not JSON, no `context.shuffle`, a
policy id and version the dashboard's verified policies do not hold) is listed as skipped
with the reason, never shown as a result. Files are read at every view (a folder of a few
hundred small JSON files).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from fedldp.aggregator.render import shuffle_lines
from fedldp.client.policy import VerifiedPolicy

#: Keys every `context.shuffle` of a report holds (ShuffledRelease.guarantee_dict).
_SHUFFLE_KEYS = (
    "batch",
    "valid_reports",
    "invalid",
    "epsilon0",
    "local_epsilon_per_device",
    "max_reports_per_device",
    "collector_count",
    "collector_count_source",
    "n",
    "delta",
    "central_epsilon",
    "bound",
    "device_epsilon",
    "device_delta",
)
#: Largest report file read (an analyzer's report of a 64k-value domain is far smaller).
MAX_REPORT_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class ShuffledReport:
    """One analyzer report on a shuffled batch: its file name and its JSON."""

    name: str
    data: dict[str, Any]

    @property
    def shuffle(self) -> Mapping[str, Any]:
        """The report's guarantees (`context.shuffle`)."""
        shuffle: Mapping[str, Any] = self.data["context"]["shuffle"]
        return shuffle


def _problem(data: Any, policies: Mapping[str, VerifiedPolicy]) -> str | None:
    """Why `data` is not a report on a shuffled batch of a loaded policy (None: it is)."""
    if not isinstance(data, dict) or not isinstance(data.get("context"), dict):
        return "not a fedldp report (no context)"
    ctx = data["context"]
    shuffle = ctx.get("shuffle")
    if not isinstance(shuffle, dict) or any(k not in shuffle for k in _SHUFFLE_KEYS):
        return "not a report on a shuffled batch (no context.shuffle)"
    policy = policies.get(str(ctx.get("policy_id")))
    if policy is None or policy.version != ctx.get("policy_version"):
        return "its policy id and version are not among the verified policies shown"
    if data.get("kind") not in ("frequency", "numeric"):
        return "neither a frequency nor a numeric report"
    return None


def read_shuffle_reports(
    folder: Path, policies: Mapping[str, VerifiedPolicy]
) -> tuple[list[ShuffledReport], list[tuple[str, str]]]:
    """(reports, skipped as (file name, reason)) of the `*.json` files in `folder`, sorted by
    policy id, window and file name. Reads only; a missing folder gives nothing."""
    reports: list[ShuffledReport] = []
    skipped: list[tuple[str, str]] = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            if path.stat().st_size > MAX_REPORT_BYTES:
                skipped.append((path.name, f"larger than {MAX_REPORT_BYTES} bytes"))
                continue
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # unreadable, not UTF-8, not JSON
            skipped.append((path.name, "not readable as UTF-8 JSON"))
            continue
        problem = _problem(data, policies)
        if problem is not None:
            skipped.append((path.name, problem))
            continue
        reports.append(ShuffledReport(path.name, data))
    reports.sort(
        key=lambda r: (
            str(r.data["context"]["policy_id"]),
            r.data["context"].get("window_start") or 0,
            r.name,
        )
    )
    return reports, skipped


def shuffled_json(reports: list[ShuffledReport], skipped: list[tuple[str, str]]) -> dict[str, Any]:
    """`/api/shuffle`: each report's file name and JSON, and the files skipped with why."""
    return {
        "reports": [{"file": r.name, "report": r.data} for r in reports],
        "skipped": [{"file": name, "reason": why} for name, why in skipped],
    }


def _estimates_table(data: Mapping[str, Any]) -> str:
    """The report's estimates: one row per value (frequency) or the mean (numeric)."""
    level = f"{float(data['confidence']):.0%}"
    if data["kind"] == "numeric":
        return (
            f"<p class='mean'>mean {float(data['mean']):.6g} ± {float(data['std_error']):.3g} "
            f"(s.e.), {level} CI [{float(data['ci_low']):.6g}, {float(data['ci_high']):.6g}]</p>"
        )
    rows = "".join(
        f"<tr><td>{escape(str(e['label']))}</td><td class='num'>{float(e['estimate']):.4f}</td>"
        f"<td class='num'>{float(e['std_error']):.4f}</td>"
        f"<td class='num'>[{float(e['ci_low']):.4f}, {float(e['ci_high']):.4f}]</td></tr>"
        for e in data["estimates"]
    )
    return (
        "<table class='estimates'><thead><tr><th>value</th><th>estimate</th><th>std err</th>"
        f"<th>{level} CI (raw estimate)</th></tr></thead><tbody>{rows}</tbody></table>"
    )


def shuffle_section(report: ShuffledReport) -> str:
    """One report: its policy, batch and window, the guarantees, then the estimates."""
    ctx = report.data["context"]
    window = ctx.get("window_start")
    when = "" if window is None else f", window starting {_iso(int(window))}"
    guarantees = "".join(
        f"<li>{escape(line)}</li>" for line in shuffle_lines(report.shuffle, greek=True)
    )
    return (
        f"<section class='shuffled' data-file='{escape(report.name)}'>"
        f"<h2>{escape(str(ctx['policy_id']))} v{escape(str(ctx['policy_version']))}{when}</h2>"
        f"<p class='note'>from {escape(report.name)}</p>"
        f"<ul class='guarantees'>{guarantees}</ul>{_estimates_table(report.data)}</section>"
    )


def _iso(epoch: int) -> str:
    from fedldp.aggregator.dashboard.model import iso_utc

    return iso_utc(epoch)


def shuffle_body(
    folder: Path | None, reports: list[ShuffledReport], skipped: list[tuple[str, str]]
) -> str:
    """The page's body: where the reports come from, each report, the files skipped."""
    if folder is None:
        return (
            "<p>No folder of shuffled-batch reports was given (fedldp dashboard "
            "--shuffle-reports DIR: the JSON reports of fedldp report --batch).</p>"
        )
    body = [
        "<p class='note'>Reports the analyzer wrote (fedldp report --batch ... --format json) "
        f"in {escape(str(folder))}, shown as written: the dashboard holds no analyzer key. "
        "ε0 holds against everyone; the central (ε, δ) holds against the analyzer and its "
        "readers if the analyzer colludes with neither the collector nor the shuffler.</p>"
    ]
    body += [shuffle_section(r) for r in reports]
    if not reports:
        body.append("<p>No report on a shuffled batch in this folder yet.</p>")
    if skipped:
        items = "".join(f"<li>{escape(n)}: {escape(why)}</li>" for n, why in skipped)
        body.append(f"<h2>Files skipped</h2><ul id='skipped'>{items}</ul>")
    return "".join(body)
