"""`shuffler.toml`: the settings of `fedldp shuffler serve` (docs/shuffle.md).

Every setting lives in the ``[shuffler]`` table; an unknown one is an error. `load` checks the
whole file before anything starts and names every problem (one clause each, joined by "; ",
as the collector's config does), so an operator fixes them in one go.
"""

from __future__ import annotations

import importlib
import math
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from fedldp.client.textfiles import read_utf8


class ShufflerConfigError(ValueError):
    """shuffler.toml is unreadable, or a setting is missing or invalid; the message names it."""


@dataclass(frozen=True)
class ShufflerConfig:
    """Every `shuffler serve` setting."""

    ledger_url: str = field(
        metadata={"help": "the collector's ledger URL, opened read-only (never written)"}
    )
    policy_dir: Path = field(metadata={"help": "trusted folder of signed *.policy envelopes"})
    trust_dir: Path = field(metadata={"help": "trust folder that verifies policy_dir"})
    spool: Path = field(metadata={"help": "the shuffler's own spool SQLite file"})
    out_dir: Path = field(metadata={"help": "folder the analyzer reads batch files from"})
    audience: str = field(
        default="default", metadata={"help": "deployment name the policies must list"}
    )
    interval_seconds: float = field(
        default=60.0, metadata={"help": "seconds between two steps (pull, then release)"}
    )
    grace_seconds: int = field(
        default=300,
        metadata={"help": "seconds after a window's end before its batch may be released"},
    )
    min_batch: int = field(
        default=0,
        metadata={"help": "raise every policy's signed min_batch to this (0: the signed one)"},
    )
    metrics_listen: str = field(
        default="", metadata={"help": "HOST:PORT of the Prometheus endpoint (empty: none)"}
    )

    def problems(self) -> list[str]:
        """What is wrong with these settings (empty: nothing); reads the file system only."""
        return [message for _name, message in self.field_problems()]

    def field_problems(self) -> list[tuple[str, str]]:
        """(setting, what is wrong with it) for every problem; reads the file system only."""
        out: list[tuple[str, str]] = []
        if not self.ledger_url.strip():
            out.append(("ledger_url", "ledger_url is required (the collector's ledger, read-only)"))
        for name in ("policy_dir", "trust_dir"):
            if not getattr(self, name).is_dir():
                out.append((name, f"{name} {getattr(self, name)} is not a folder"))
        if not self.spool.parent.is_dir():
            out.append(("spool", f"spool: the folder {self.spool.parent} does not exist"))
        if self.out_dir.exists() and not self.out_dir.is_dir():
            out.append(("out_dir", f"out_dir {self.out_dir} is not a folder"))
        elif not self.out_dir.parent.is_dir():
            out.append(("out_dir", f"out_dir: the folder {self.out_dir.parent} does not exist"))
        if self.spool.resolve().parent == self.out_dir.resolve():
            out.append(("spool", "spool must not lie in out_dir (the analyzer reads out_dir)"))
        if not (0 < self.interval_seconds <= 86400 and math.isfinite(self.interval_seconds)):
            out.append(
                ("interval_seconds", "interval_seconds is a number above 0 and at most 86400")
            )
        if self.grace_seconds < 0:
            out.append(("grace_seconds", "grace_seconds is 0 or more"))
        if self.min_batch < 0:
            out.append(("min_batch", "min_batch is 0 (the policy's signed one) or more"))
        if self.metrics_listen:
            from fedldp.collector.config import address_problem

            problem = address_problem("metrics_listen", self.metrics_listen, required=False)
            if problem is not None:
                out.append(("metrics_listen", problem))
        return out


_KINDS: dict[str, type] = {
    "ledger_url": str,
    "policy_dir": Path,
    "trust_dir": Path,
    "spool": Path,
    "out_dir": Path,
    "audience": str,
    "interval_seconds": float,
    "grace_seconds": int,
    "min_batch": int,
    "metrics_listen": str,
}
_REQUIRED = ("ledger_url", "policy_dir", "trust_dir", "spool", "out_dir")


def _value(name: str, raw: Any, base: Path) -> tuple[Any, str | None]:
    """`raw` as setting `name`'s type (a relative path is taken from the file's folder);
    (value, None) or (None, the problem)."""
    kind = _KINDS[name]
    if kind is float:
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            return None, f"{name} must be a number, not {type(raw).__name__}"
        return float(raw), None
    if kind is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            return None, f"{name} must be a whole number, not {type(raw).__name__}"
        return raw, None
    if not isinstance(raw, str):
        return None, f"{name} must be a string, not {type(raw).__name__}"
    return (base / raw if kind is Path else raw), None


def load(path: str | Path) -> ShufflerConfig:
    """The validated settings of the shuffler.toml at `path`.

    Raises ShufflerConfigError naming the file and every problem: not UTF-8 TOML, no
    [shuffler] table, an unknown or mistyped setting, a required one missing, a value out
    of range, a folder that does not exist.
    """
    path = Path(path)
    text = read_utf8(
        path, "shuffler.toml is a UTF-8 TOML file: check --config", ShufflerConfigError
    )
    try:
        data = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
        doc = data.loads(text)
    except ValueError as exc:  # tomllib.TOMLDecodeError
        raise ShufflerConfigError(f"{path} is not valid TOML: {exc}") from None
    table = doc.get("shuffler")
    if not isinstance(table, dict):
        raise ShufflerConfigError(f"{path} has no [shuffler] table")
    problems: list[str] = []
    values: dict[str, Any] = {}
    for key, raw in table.items():
        if key not in _KINDS:
            known = ", ".join(f.name for f in fields(ShufflerConfig))
            problems.append(f"unknown setting {key!r} (known: {known})")
            continue
        value, problem = _value(key, raw, path.parent)
        if problem is not None:
            problems.append(problem)
        else:
            values[key] = value
    missing = [name for name in _REQUIRED if name not in table]
    problems += [f"{name} is required" for name in missing]
    # the settings that read well are checked too (a placeholder stands in for the others,
    # whose problem is named above), so one run names every problem
    placeholders: dict[str, Any] = {"ledger_url": "-", **dict.fromkeys(_REQUIRED[1:], path)}
    trial = ShufflerConfig(**{**placeholders, **values})
    problems += [m for name, m in trial.field_problems() if name in values]
    if problems:
        raise ShufflerConfigError(f"{path}: " + "; ".join(problems))
    return ShufflerConfig(**values)
