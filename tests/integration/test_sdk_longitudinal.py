"""loloha and dbitflip end to end: `record()` on devices, the real collector (gRPC,
SQLite ledger), and the analyst's report with confidence intervals, through the
library and `fedldp report`.

Devices randomize with the OS CSPRNG (what ships). Each device is one user; its
memo (seed and permanent responses) survives a restart of the app. The one
statistical check per mechanism, |estimate - truth| <= z σ with z for a two-sided
1e-6 level (Bonferroni over the coordinates), has a false-failure rate below 1e-6.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from statistics import NormalDist

import pytest
from click.testing import CliRunner
from fedldp.aggregator.estimation import FrequencyReport, NumericReport
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.client.outbox import Outbox
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.v1 import collector_pb2, policy_pb2
from sdk_testkit import AUDIENCE, LABELS, Deployment, running_deployment

from fedldp.cli import main

DEVICES = 40


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _verified(deployment: Deployment, envelope: policy_pb2.SignedEnvelope) -> VerifiedPolicy:
    return verify_policy(
        envelope,
        deployment.authority.trust_store(now=deployment.now),
        now=deployment.now,
        audience=AUDIENCE,
    )


def _sign(deployment: Deployment, policy: policy_pb2.Policy) -> policy_pb2.SignedEnvelope:
    envelope = deployment.authority.sign(policy)
    deployment.envelopes.append(envelope)
    return envelope


def _cli_report(
    deployment: Deployment, url: str, envelope: policy_pb2.SignedEnvelope, tmp: Path
) -> dict[str, object]:
    from fedldp.authoring import write_envelope

    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    policy = policy_pb2.Policy.FromString(envelope.payload)
    write_envelope(envelope, policies / f"{policy.policy_id}.policy")
    args = ["report", "--policy", policy.policy_id, "--ledger", url, "--policies", str(policies)]
    args += ["--trust", str(deployment.trust_dir()), "--format", "json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.output)
    return data


def test_loloha_end_to_end(deployment: Deployment, tmp_path: Path) -> None:
    policy = deployment.authority.categorical_policy(
        policy_id="homepage-longitudinal",
        metric="browser.homepage",
        labels=list(LABELS),
        mechanism="loloha",
        params={"epsilon_permanent": "2"},
        epsilon="1",
        epsilon_cap="100",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=1,
        audience=(AUDIENCE,),
    )
    assert policy.mechanism.memo_charging == policy_pb2.MEMO_CHARGING_JOINT
    envelope = _sign(deployment, policy)
    verified = _verified(deployment, envelope)
    collector = deployment.start()
    # One device over three app runs: one seed, at most g permanent responses.
    state = tmp_path / "one"
    seeds: set[int] = set()
    for run in range(3):
        with deployment.client(collector.address, state) as c:
            c.record("browser.homepage", LABELS[run % len(LABELS)])
            seeds |= {
                collector_pb2.Report.FromString(e.report).hashed.seed
                for e in Outbox(c._store).entries()
            }
            assert c.flush(timeout=10).acknowledged == 1
            assert c.budget()[0].epsilon_spent == verified.charge * (run + 1)
    assert len(seeds) == 1
    # DEVICES users, each one report: value 0 for half, 1 for a quarter, 2 for a quarter.
    truth = [0.5, 0.25, 0.25, 0.0]
    for i in range(DEVICES):
        label = LABELS[0] if i % 2 == 0 else LABELS[1 + (i // 2) % 2]
        with deployment.client(collector.address, tmp_path / f"d{i}", subject=f"u{i}") as c:
            c.record("browser.homepage", label)
            assert c.flush(timeout=10).acknowledged == 1
    window = verified.window_start(deployment.now)
    assert collector.ledger.spent("u0", verified.policy_id, window) == verified.charge
    report = report_from_ledgers([("ledger", collector.ledger)], verified)
    assert isinstance(report, FrequencyReport) and report.n == DEVICES + 3
    z = NormalDist().inv_cdf(1 - 1e-6 / (2 * len(LABELS)))
    for e, f in zip(report.estimates, truth, strict=True):
        assert 0.0 <= e.ci_low <= e.ci_high <= 1.0
        # The three reports of device "one" add at most 3/n to any frequency.
        assert abs(e.raw_estimate - f) <= z * e.std_error + 3 / report.n, e
    data = _cli_report(deployment, collector.ledger.url, envelope, tmp_path)
    assert data["estimates"] == report.to_dict()["estimates"]


def test_dbitflip_end_to_end(deployment: Deployment, tmp_path: Path) -> None:
    policy = deployment.authority.numeric_policy(
        policy_id="minutes-longitudinal",
        metric="session.minutes",
        lo="0",
        hi="80",
        mechanism="dbitflip",
        params={"epsilon_permanent": "2", "buckets": "8", "d": "4"},
        epsilon="1",
        epsilon_cap="100",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=1,
        audience=(AUDIENCE,),
    )
    envelope = _sign(deployment, policy)
    verified = _verified(deployment, envelope)
    collector = deployment.start()
    state = tmp_path / "one"
    indices: set[tuple[int, ...]] = set()
    for run, minutes in enumerate((5, 15, 5)):
        with deployment.client(collector.address, state) as c:
            c.record("session.minutes", minutes)
            for e in Outbox(c._store).entries():
                report = collector_pb2.Report.FromString(e.report)
                assert report.WhichOneof("payload") == "index_bits"
                indices.add(tuple(report.index_bits.indices))
            assert c.flush(timeout=10).acknowledged == 1
            assert c.budget()[0].epsilon_spent == verified.charge * (run + 1)
    assert len(indices) == 1 and len(next(iter(indices))) == 4
    for i in range(DEVICES):
        with deployment.client(collector.address, tmp_path / f"d{i}", subject=f"u{i}") as c:
            c.record("session.minutes", Decimal(25) if i % 2 else Decimal(55))
            assert c.flush(timeout=10).acknowledged == 1
    numeric = report_from_ledgers([("ledger", collector.ledger)], verified)
    assert isinstance(numeric, NumericReport) and numeric.n == DEVICES + 3
    assert (
        0 <= numeric.ci_low <= numeric.mean <= numeric.ci_high <= 80
        or numeric.ci_low <= numeric.ci_high
    )
    true_mean = (DEVICES / 2 * 25 + DEVICES / 2 * 55 + 5 + 15 + 5) / numeric.n
    z = NormalDist().inv_cdf(1 - 1e-6 / 2)
    assert abs(numeric.mean - true_mean) <= z * numeric.std_error
    data = _cli_report(deployment, collector.ledger.url, envelope, tmp_path)
    assert data["mean"] == numeric.to_dict()["mean"]
