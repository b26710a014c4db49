"""Shared benchmark helpers: repeated timing, machine description, JSON output, tables.

Every benchmark reports medians over repeated runs with min and max, and writes
its figures with the parameters, git commit, machine and date (`write_json`).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Timing:
    """Median, min and max of repeated measurements (seconds unless stated)."""

    median: float
    min: float
    max: float
    runs: int

    def scaled(self, factor: float) -> Timing:
        """The same timing multiplied by `factor` (e.g. to microseconds)."""
        return Timing(self.median * factor, self.min * factor, self.max * factor, self.runs)

    def rate(self, items: float) -> Timing:
        """items per second from seconds (min and max swap)."""
        return Timing(items / self.median, items / self.max, items / self.min, self.runs)


def summarize(samples: Sequence[float]) -> Timing:
    """Median, min and max of `samples`."""
    if not samples:
        raise ValueError("no samples")
    return Timing(statistics.median(samples), min(samples), max(samples), len(samples))


def time_runs(fn: Callable[[], Any], runs: int) -> tuple[Timing, list[Any]]:
    """Call `fn` `runs` times; the wall time of each call, and each result."""
    samples: list[float] = []
    results: list[Any] = []
    for _ in range(runs):
        start = time.perf_counter()
        results.append(fn())
        samples.append(time.perf_counter() - start)
    return summarize(samples), results


def git_commit() -> str:
    """The current commit (with "+dirty" if the tree has changes), or "unknown"."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine(packages: Iterable[str] = ()) -> dict[str, Any]:
    """Cores, CPU, OS, Python and the versions of `packages` (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "load_average": list(load),
        "packages": versions,
    }


def write_json(
    path: Path,
    *,
    benchmark: str,
    params: dict[str, Any],
    figures: Any,
    packages: Iterable[str] = (),
) -> None:
    """Write figures with params, git commit, machine and UTC date to `path`."""
    document = {
        "benchmark": benchmark,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine(packages),
        "params": params,
        "figures": figures,
    }
    path.write_text(json.dumps(document, indent=2, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Timing):
        return asdict(value)
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (also readable in a terminal)."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)
    ]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in cells
    ]
    return "\n".join([line, rule, *body])


def fmt_rate(value: float | None) -> str:
    """Human-readable rate: 12.3M, 456k, 789."""
    if value is None:
        return "-"
    if value >= 1e6:
        return f"{value / 1e6:.1f}M"
    if value >= 1e3:
        return f"{value / 1e3:.0f}k"
    return f"{value:.0f}"


def fmt_float(value: float | None, digits: int = 3) -> str:
    """A float with `digits` significant digits, or "-"."""
    return "-" if value is None else f"{value:.{digits}g}"
