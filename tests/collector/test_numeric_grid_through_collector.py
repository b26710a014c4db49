"""Numeric reports (piecewise, sw) through the real collector: only grid doubles are accepted.

A report of 1.797e308 (which the retired laplace accepted and which then broke
`fedldp report`), a double one ulp from a grid value, an output of the old
floating-point piecewise (a double inside [-C, C]), NaN and infinities are all
refused with the precise reason (OUT_OF_DOMAIN / NON_FINITE) and change
nothing: no charge, no stored report, the same statistics, a clean reconcile.
A signed laplace policy stops a collector from starting, with a message naming
the replacement.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from decimal import Decimal

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.authoring import sign_envelope
from fedldp.client.mechanisms import NumericOutput
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.policy import PolicyError, VerifiedPolicy
from fedldp.client.policy.envelope import POLICY_PAYLOAD_TYPE
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.policies import PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc, policy_pb2


@pytest.fixture(scope="module")
def grid_deployment(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_numeric("latency", mechanism="piecewise", lo="-1", hi="1", epsilon="1")
    d.add_numeric("latency-sw", mechanism="sw", lo="-1", hi="1", epsilon="1")
    return d


@pytest.fixture
def running(grid_deployment: Deployment, ledger_url: str) -> Iterator[RunningCollector]:
    r = start_collector(grid_deployment.config(ledger_url), registry=grid_deployment.registry())
    yield r
    r.stop(1.0)


def submit(
    d: Deployment, running: RunningCollector, policy: VerifiedPolicy, y: float, subject: str
) -> tuple[pb.ReportOutcome, pb.Report]:
    report = make_report(policy, NumericOutput(y), coarse_time=coarse(d.now))
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(d.token(subject))
        )
    return response.outcomes[0], report


@pytest.mark.parametrize("which", [0, 1], ids=["piecewise", "sw"])
def test_only_grid_doubles_are_accepted_and_a_refusal_changes_nothing(
    grid_deployment: Deployment, running: RunningCollector, which: int
) -> None:
    d = grid_deployment
    policy = d.verified(d.envelopes[which])
    mech = policy.mechanism
    assert isinstance(mech, NumericMechanism)
    window = policy.window_start(d.now)
    subject = f"someone-{which}"
    good = mech.perturb(0.25, rng=random.Random(2)).value
    outcome, _ = submit(d, running, policy, good, subject)
    assert outcome.outcome == pb.OUTCOME_ACCEPTED
    ledger = running.ledger

    def state() -> tuple[Decimal, list[str]]:
        parts = ledger.statistics(policy.policy_id, policy.version, window)
        return ledger.spent(subject, policy.policy_id, window), sorted(
            p.statistic_json or "" for p in parts
        )

    before = state()
    top = max(mech.table)
    bad = [
        (1.797e308, pb.REJECT_REASON_OUT_OF_DOMAIN),
        (-1.797e308, pb.REJECT_REASON_OUT_OF_DOMAIN),
        (math.nextafter(top, 0.0), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (math.nextafter(good, math.inf), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (0.8183361224970235, pb.REJECT_REASON_OUT_OF_DOMAIN),  # a float-piecewise output
        ((mech.table[0] + mech.table[1]) / 2, pb.REJECT_REASON_OUT_OF_DOMAIN),  # between cells
        (math.nan, pb.REJECT_REASON_NON_FINITE),
        (math.inf, pb.REJECT_REASON_NON_FINITE),
        (-math.inf, pb.REJECT_REASON_NON_FINITE),
    ]
    for y, reason in bad:
        outcome, report = submit(d, running, policy, y, subject)
        assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason)
        assert repr(y) not in outcome.detail  # the value is never echoed
        assert not ledger.has_report(report.report_id)
        assert state() == before
    assert ledger.reconcile() == []
    # The largest weight one accepted report can carry is the grid's largest value.
    outcome, _ = submit(d, running, policy, top, f"another-{which}")
    assert outcome.outcome == pb.OUTCOME_ACCEPTED


def test_a_signed_laplace_policy_is_refused_by_the_collector(now: int) -> None:
    d = Deployment.create(now=now)
    d.add_numeric("ok", mechanism="hybrid", lo="0", hi="1")
    policy = policy_pb2.Policy.FromString(d.envelopes[0].payload)
    policy.policy_id = "old-laplace"
    policy.mechanism.id = "laplace"
    policy.mechanism.params.clear()
    d.envelopes.append(
        sign_envelope(POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [d.authority.policy_key])
    )
    with pytest.raises(PolicyError, match=r"laplace' is retired.*hybrid"):
        PolicyRegistry.from_envelopes(d.envelopes, d.trust(), now=d.now, audience=d.audience)
