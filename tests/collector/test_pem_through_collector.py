"""PEM reports through the real collector (gRPC on port 0, a real ledger).

Accepted reports are charged the full ε exactly once each (a user whose cap is
one report's ε is refused a second one); a group outside [0, G), a hash key of
the wrong length and a hash value outside [0, g) are refused with their
precise reasons and change nothing (no charge, no stored report, the same
statistics); the incremental statistic equals a recompute from the raw rows,
and `fedldp report`'s path lists the discovered strings with intervals.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import audit_statistics, report_from_ledgers
from fedldp.client.mechanisms import GroupHashedOutput, Output
from fedldp.client.mechanisms.pem import PEM
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import PartialStatistic
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

WORDS = ["ok"] * 6 + ["hi"] * 3 + ["yo"]


@pytest.fixture(scope="module")
def open_deployment(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_open("new-words", max_bytes=2, epsilon="8", epsilon_cap="8")
    return d


@pytest.fixture
def running(open_deployment: Deployment, ledger_url: str) -> Iterator[RunningCollector]:
    r = start_collector(open_deployment.config(ledger_url), registry=open_deployment.registry())
    yield r
    r.stop(1.0)


def submit(
    d: Deployment, running: RunningCollector, policy: VerifiedPolicy, output: Output, subject: str
) -> tuple[pb.ReportOutcome, pb.Report]:
    report = make_report(policy, output, coarse_time=coarse(d.now))
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(d.token(subject))
        )
    return response.outcomes[0], report


def test_pem_reports_are_checked_charged_once_and_discovered(
    open_deployment: Deployment, running: RunningCollector
) -> None:
    d = open_deployment
    policy = d.verified(d.envelopes[0])
    mech = policy.mechanism
    assert isinstance(mech, PEM)
    assert policy.open_domain is not None and policy.open_domain.max_bytes == 2
    # The signed policy states every derived parameter.
    assert set(policy.message.mechanism.params) == {"step_bits", "start_bits", "groups", "g"}
    ledger = running.ledger
    window = policy.window_start(d.now)
    rng = random.Random(7)
    users = 240
    for i in range(users):
        output = mech.perturb(WORDS[i % len(WORDS)], rng=rng)
        outcome, _ = submit(d, running, policy, output, f"user{i}")
        assert outcome.outcome == pb.OUTCOME_ACCEPTED
        assert ledger.spent(f"user{i}", policy.policy_id, window) == Decimal("8")
    # The cap is one report's ε: a second report of the same user is refused.
    outcome, _ = submit(d, running, policy, mech.perturb("ok", rng=rng), "user0")
    assert outcome.outcome == pb.OUTCOME_BUDGET_EXHAUSTED

    def state() -> tuple[Decimal, list[PartialStatistic]]:
        # Every partial statistic as read: n, its JSON part and its chunk rows.
        parts = ledger.statistics(policy.policy_id, policy.version, window)
        assert all(p.chunks for p in parts)
        return ledger.spent("fresh", policy.policy_id, window), parts

    before = state()
    good = mech.perturb("ok", rng=rng)
    bad = [
        (GroupHashedOutput(mech.groups, good.key, good.value), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (GroupHashedOutput(0, good.key[:-1], good.value), pb.REJECT_REASON_WRONG_LENGTH),
        (GroupHashedOutput(0, good.key + b"\x00", good.value), pb.REJECT_REASON_WRONG_LENGTH),
        (GroupHashedOutput(0, b"", good.value), pb.REJECT_REASON_WRONG_LENGTH),
        (GroupHashedOutput(0, good.key, mech.g), pb.REJECT_REASON_OUT_OF_DOMAIN),
    ]
    for output, reason in bad:
        outcome, report = submit(d, running, policy, output, "fresh")
        assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason)
        assert good.key.hex() not in outcome.detail
        assert not ledger.has_report(report.report_id)
        assert state() == before
    assert ledger.reconcile() == []
    merged = audit_statistics(ledger, policy)
    assert merged.n == users
    result = report_from_ledgers([("local", ledger)], policy)
    assert isinstance(result, FrequencyReport)
    found = {row.label: row for row in result.estimates}
    assert {"ok", "hi"} <= set(found)
    assert found["ok"].ci_low <= 0.6 <= found["ok"].ci_high
    assert result.n == users
