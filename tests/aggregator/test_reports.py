"""Reports over real SQLite ledgers: merging, the release gate, audit, export, the CLI."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fedldp.aggregator.estimation import FrequencyReport, NumericReport
from fedldp.aggregator.reports import (
    DuplicatePartialError,
    ExportMismatchError,
    InsufficientReportsError,
    audit_statistics,
    export_statistics,
    load_export,
    merge_partials,
    partials_from_ledger,
    report_from_ledgers,
)
from fedldp.authoring import write_envelope, write_public_key
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import Ledger

from fedldp.cli_report import report as report_cmd

LedgerFactory = Callable[..., Ledger]
PolicyFactory = Callable[..., VerifiedPolicy]
Submit = Callable[..., None]
WINDOW = 86400  # the policies' window (conftest)


def outputs_for(policy: VerifiedPolicy, n: int, seed: int) -> list[Any]:
    """n randomized reports of a skewed categorical (or uniform numeric) population."""
    rng = random.Random(seed)
    m = policy.mechanism
    if policy.labels is not None:
        k = len(policy.labels)
        weights = [1.0 / (i + 1) for i in range(k)]
        values: list[float] = list(rng.choices(range(k), weights=weights, k=n))
    else:
        assert policy.numeric_range is not None
        lo, hi = (float(x) for x in policy.numeric_range)
        values = [rng.uniform(lo, hi) for _ in range(n)]
    return [m.perturb(v, rng=rng) for v in values]


@pytest.mark.parametrize(
    ("mechanism", "labels"),
    [
        ("grr", ("a", "b", "c", "d")),
        ("olh", tuple(f"v{i}" for i in range(40))),
        ("oue", tuple(f"v{i}" for i in range(12))),
    ],
)
def test_merge_of_collectors_equals_single_store_exactly(
    make_policy: PolicyFactory,
    submit: Submit,
    now: int,
    ledger_factory: LedgerFactory,
    tmp_path: Path,
    mechanism: str,
    labels: tuple[str, ...],
) -> None:
    policy = make_policy(f"m_{mechanism}", labels=labels, mechanism=mechanism)
    outs = outputs_for(policy, 600, seed=1)
    # Region 1: two collector shards writing one ledger file; region 2: its own ledger.
    r1a = ledger_factory("region1", shard="collector-a")
    r1b = ledger_factory("region1", shard="collector-b")
    r2 = ledger_factory("region2", shard="collector-a")  # same shard name, other region
    single = ledger_factory("single")
    submit(r1a, policy, outs[:200])
    submit(r1b, policy, outs[200:350])
    submit(r2, policy, outs[350:])
    submit(single, policy, outs)
    assert len(partials_from_ledger(r1a, policy)) == 2

    merged = report_from_ledgers([("eu", r1a), ("us", r2)], policy)
    alone = report_from_ledgers([("one", single)], policy)
    assert isinstance(merged, FrequencyReport) and isinstance(alone, FrequencyReport)
    assert merged.n == alone.n == 600
    assert merged.estimates == alone.estimates  # exact, float for float

    # Through an exported statistics file (multi-region without sharing a database).
    path = tmp_path / "us.json"
    path.write_text(json.dumps(export_statistics(r2, policy, source="us")))
    via_file = report_from_ledgers([("eu", r1a)], policy, extra_partials=load_export(path, policy))
    assert isinstance(via_file, FrequencyReport)
    assert via_file.estimates == alone.estimates
    assert via_file.context.sources == ("eu", "us")


@pytest.mark.parametrize("mechanism", ["piecewise", "duchi", "hybrid", "sw"])
def test_numeric_merge_in_any_order_equals_single_store_exactly(
    make_policy: PolicyFactory,
    submit: Submit,
    ledger_factory: LedgerFactory,
    mechanism: str,
) -> None:
    # ε = 4: the merge is exact at any ε, and sw's EMS bootstrap converges in ~170 steps
    # there (~800 at ε = 1).
    policy = make_policy(
        f"n_{mechanism}", labels=None, lo="-5", hi="20", mechanism=mechanism, epsilon="4"
    )
    outs = outputs_for(policy, 400, seed=3)
    shard_a = ledger_factory("regional", shard="collector-a")
    shard_b = ledger_factory("regional", shard="collector-b")
    single = ledger_factory("single-numeric")
    submit(shard_a, policy, outs[::2])
    submit(shard_b, policy, outs[1::2][::-1])  # other reports, other order
    submit(single, policy, outs)
    merged = report_from_ledgers([("regional", shard_a)], policy)
    alone = report_from_ledgers([("one", single)], policy)
    assert isinstance(merged, NumericReport) and isinstance(alone, NumericReport)
    assert merged.n == alone.n == 400
    # Exact sums: bit-identical mean, standard error and interval.
    assert (merged.mean, merged.std_error, merged.ci_low, merged.ci_high) == (
        alone.mean,
        alone.std_error,
        alone.ci_low,
        alone.ci_high,
    )
    assert merged.histogram == alone.histogram  # sw: exact counts, seeded bands


def test_the_same_partial_twice_is_refused(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("dup")
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 50, seed=2))
    doc = export_statistics(ledger, policy, source="eu")
    parts = load_export(doc, policy)
    with pytest.raises(DuplicatePartialError, match="given twice"):
        merge_partials(policy.mechanism, parts + parts)


def test_export_for_another_policy_is_refused(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("exp")
    other = make_policy("exp", version=2)
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 20, seed=3))
    doc = export_statistics(ledger, policy, source="eu")
    with pytest.raises(ExportMismatchError, match="another policy"):
        load_export(doc, other)
    with pytest.raises(ExportMismatchError, match="schema"):
        load_export({"schema": "nope"}, policy)


def test_release_gate_refuses_below_the_policy_minimum(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("gate", min_reports=100)
    ledger = ledger_factory()
    window = now - now % WINDOW
    submit(ledger, policy, outputs_for(policy, 99, seed=4))
    with pytest.raises(InsufficientReportsError, match="99 reports") as info:
        report_from_ledgers([("l", ledger)], policy, window_start=window)
    assert info.value.minimum == 100
    with pytest.raises(InsufficientReportsError):  # an empty window too
        report_from_ledgers([("l", ledger)], policy, window_start=window - WINDOW)
    submit(ledger, policy, outputs_for(policy, 1, seed=5))
    rep = report_from_ledgers([("l", ledger)], policy, window_start=window)
    assert rep.n == 100 and rep.context.window_start == window


def test_windows_are_reported_separately(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("win")
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 30, seed=6), now=now)
    submit(ledger, policy, outputs_for(policy, 20, seed=7), now=now + WINDOW)
    window = now - now % WINDOW
    assert report_from_ledgers([("l", ledger)], policy, window_start=window).n == 30
    assert report_from_ledgers([("l", ledger)], policy, window_start=window + WINDOW).n == 20
    assert report_from_ledgers([("l", ledger)], policy).n == 50


def test_incremental_statistics_agree_with_full_recompute(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("audit", labels=tuple(f"v{i}" for i in range(16)), mechanism="olh")
    a = ledger_factory("shared", shard="a")
    b = ledger_factory("shared", shard="b")
    submit(a, policy, outputs_for(policy, 150, seed=8))
    submit(b, policy, outputs_for(policy, 100, seed=9))
    merged = audit_statistics(a, policy)
    assert merged.n == 250 and merged.partials == 2
    full = a.recompute_statistics(policy)
    assert policy.mechanism.statistic_to_json(full) == policy.mechanism.statistic_to_json(
        merged.statistic
    )


def test_numeric_policy_reports_the_mean(
    make_policy: PolicyFactory, submit: Submit, now: int, ledger_factory: LedgerFactory
) -> None:
    policy = make_policy("latency", labels=None, lo="0", hi="10", mechanism="piecewise")
    ledger = ledger_factory()
    submit(ledger, policy, outputs_for(policy, 400, seed=10))
    rep = report_from_ledgers([("l", ledger)], policy)
    assert isinstance(rep, NumericReport)
    assert rep.n == 400 and 0 <= rep.ci_low <= rep.ci_high <= 10
    assert rep.context.epsilon_charged == Decimal(400) * policy.epsilon
    with pytest.raises(ValueError, match="categorical"):
        report_from_ledgers([("l", ledger)], policy, consistency="norm-sub")


# --- the command line ---


def _folders(authority: Any, policy: VerifiedPolicy, base: Path) -> tuple[Path, Path]:
    trust, policies = base / "trust", base / "policies"
    (trust / "pinned").mkdir(parents=True)
    policies.mkdir()
    for i, key in enumerate(authority.root_public_keys):
        write_public_key(key, trust / "pinned" / f"root{i}.pem")
    write_envelope(authority.root_envelope, trust / "1.root")
    write_envelope(policy.envelope, policies / "p.policy")
    return trust, policies


def test_cli_report_formats_and_gate(
    authority: Any,
    make_policy: PolicyFactory,
    submit: Submit,
    now: int,
    ledger_factory: LedgerFactory,
    tmp_path: Path,
) -> None:
    policy = make_policy("cli", min_reports=50)
    ledger = ledger_factory("cli")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    trust, policies = _folders(authority, policy, tmp_path)
    folders = ["--policies", str(policies), "--trust", str(trust), "--at", str(now)]
    base = ["--policy", "cli", "--ledger", url, *folders]
    runner = CliRunner()
    gated = runner.invoke(report_cmd, base)
    assert gated.exit_code != 0 and "minimum for release" in gated.output

    submit(ledger, policy, outputs_for(policy, 80, seed=11))
    table = runner.invoke(report_cmd, [*base, "--consistency", "norm-sub", "--heavy-hitters"])
    assert table.exit_code == 0, table.output
    assert (
        "red" in table.output and "reports 80" in table.output and "heavy hitters" in table.output
    )
    as_json = runner.invoke(report_cmd, [*base, "--format", "json", "--simultaneous"])
    doc = json.loads(as_json.output)
    assert doc["n"] == 80 and doc["simultaneous"] is True and doc["context"]["policy_id"] == "cli"
    as_csv = runner.invoke(report_cmd, [*base, "--format", "csv"])
    assert as_csv.output.splitlines()[0].startswith("label,estimate")
    html = tmp_path / "r.html"
    out = runner.invoke(report_cmd, [*base, "--format", "html", "--out", str(html), "--audit"])
    assert out.exit_code == 0, out.output
    assert html.read_text().startswith("<!DOCTYPE html>")

    # Export, then merge the export with another region's ledger from the CLI.
    export = tmp_path / "export.json"
    done = runner.invoke(report_cmd, [*base, "--export-statistics", str(export), "--source", "eu"])
    assert done.exit_code == 0, done.output
    other = ledger_factory("other")
    submit(other, policy, outputs_for(policy, 20, seed=12))
    url2 = f"sqlite:///{tmp_path / 'other.db'}"
    merged = runner.invoke(
        report_cmd,
        ["--policy", "cli", "--ledger", url2, "--merge", str(export), *folders, "--format", "json"],
    )
    assert merged.exit_code == 0, merged.output
    assert json.loads(merged.output)["n"] == 100
