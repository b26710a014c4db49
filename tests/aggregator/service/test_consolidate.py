"""Collected -> consolidated: per-window debiased estimates written as an SQL table."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.aggregator.service.consolidate import estimate_rows, write_table

from tests.aggregator.conftest import WINDOW
from tests.aggregator.test_reports import outputs_for


def test_each_window_becomes_rows_equal_to_the_report(
    make_policy: Callable[..., Any],
    submit: Callable[..., None],
    now: int,
    ledger_factory: Callable[..., Any],
    tmp_path: Path,
) -> None:
    policy = make_policy("consol", min_reports=25)
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 30, seed=1), now=now)
    submit(ledger, policy, outputs_for(policy, 20, seed=2), now=now + WINDOW)  # below the gate
    rows = estimate_rows(ledger, policy)
    window = now - now % WINDOW
    assert {r.window_start for r in rows} == {window}  # the gated window is not consolidated
    report = report_from_ledgers([("l", ledger)], policy, window_start=window)
    assert isinstance(report, FrequencyReport)
    assert [(r.label, r.estimate, r.std_error) for r in rows] == [
        (e.label, e.raw_estimate, e.std_error) for e in report.estimates
    ]
    assert all(r.variance == r.std_error**2 and r.n == 30 for r in rows)
    url = f"sqlite:///{tmp_path / 'consolidated.db'}"
    assert write_table(url, "ldp_estimates", rows) == len(rows)
    assert write_table(url, "ldp_estimates", rows) == len(rows)  # rerun replaces, no duplicate
    with sqlite3.connect(tmp_path / "consolidated.db") as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM ldp_estimates").fetchone()
    assert count == len(policy.labels)


def test_numeric_policy_gives_one_mean_row(
    make_policy: Callable[..., Any],
    submit: Callable[..., None],
    ledger_factory: Callable[..., Any],
) -> None:
    policy = make_policy("consolnum", labels=None, lo="0", hi="10", mechanism="piecewise")
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 200, seed=3))
    (row,) = estimate_rows(ledger, policy)
    assert row.label == "mean" and row.n == 200 and row.ci_low <= row.estimate <= row.ci_high


def test_cli_consolidate_writes_the_table(
    authority: Any,
    make_policy: Callable[..., Any],
    submit: Callable[..., None],
    now: int,
    ledger_factory: Callable[..., Any],
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from fedldp.cli import main
    from tests.aggregator.test_reports import _folders

    policy = make_policy("consolcli")
    ledger = ledger_factory("collected")
    submit(ledger, policy, outputs_for(policy, 40, seed=4))
    trust, policies = _folders(authority, policy, tmp_path)
    out = tmp_path / "consolidated.db"
    result = CliRunner().invoke(
        main,
        [
            "release-service", "consolidate",
            "--ledger", f"sqlite:///{tmp_path / 'collected.db'}",
            "--policies", str(policies), "--trust", str(trust), "--policy", "consolcli",
            "--out", f"sqlite:///{out}", "--at", str(now),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "no budget spent" in result.output
    with sqlite3.connect(out) as conn:
        labels = [r[0] for r in conn.execute("SELECT label FROM ldp_estimates")]
    assert sorted(labels) == sorted(policy.labels)
