"""ATTACK (audit atk2): malformed pem and sw payloads through the real collector
(gRPC on port 0, the suite's real ledger).

Each refusal must carry its precise reason, must not echo the payload and must
change nothing (no charge, no stored report). Cases beyond
test_pem_through_collector.py: a huge key, the largest uint32 group and value,
a pem payload under a sw policy and a sw payload under a pem policy, and sw
doubles that are not table values (NaN, ±inf, -0.0, one ulp off a table value).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from decimal import Decimal

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import GroupHashedOutput, NumericOutput, Output
from fedldp.client.mechanisms.pem import PEM
from fedldp.client.mechanisms.square_wave import SquareWave
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

U32 = (1 << 32) - 1


@pytest.fixture(scope="module")
def deployment(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_open("atk-words", max_bytes=4, epsilon="4", epsilon_cap="4")
    d.add_numeric("atk-sw", mechanism="sw", epsilon="1", epsilon_cap="4")
    return d


@pytest.fixture
def running(deployment: Deployment, ledger_url: str) -> Iterator[RunningCollector]:
    r = start_collector(deployment.config(ledger_url), registry=deployment.registry())
    yield r
    r.stop(1.0)


def submit(
    d: Deployment, running: RunningCollector, policy: VerifiedPolicy, output: Output
) -> tuple[pb.ReportOutcome, pb.Report]:
    report = make_report(policy, output, coarse_time=coarse(d.now))
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(d.token("atk-subject"))
        )
    return response.outcomes[0], report


def assert_refused(
    d: Deployment,
    running: RunningCollector,
    policy: VerifiedPolicy,
    output: Output,
    reason: int,
) -> None:
    ledger = running.ledger
    window = policy.window_start(d.now)
    before = ledger.spent("atk-subject", policy.policy_id, window)
    # Every partial statistic as read (n, its JSON part and, for pem, its chunks).
    stats = ledger.statistics(policy.policy_id, policy.version, window)
    outcome, report = submit(d, running, policy, output)
    assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason), outcome
    assert not ledger.has_report(report.report_id)
    assert ledger.spent("atk-subject", policy.policy_id, window) == before == Decimal(0)
    assert stats == ledger.statistics(policy.policy_id, policy.version, window)
    assert len(outcome.detail) < 200


def test_malformed_pem_payloads_are_refused_precisely(
    deployment: Deployment, running: RunningCollector
) -> None:
    d = deployment
    pem = d.verified(d.envelopes[0])
    sw = d.verified(d.envelopes[1])
    mech = pem.mechanism
    assert isinstance(mech, PEM) and isinstance(sw.mechanism, SquareWave)
    good = mech.perturb("word", rng=random.Random(3))
    cases: list[tuple[VerifiedPolicy, Output, int]] = [
        (pem, GroupHashedOutput(0, good.key * 30_000, good.value), pb.REJECT_REASON_WRONG_LENGTH),
        (pem, GroupHashedOutput(U32, good.key, good.value), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (pem, GroupHashedOutput(0, good.key, U32), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (pem, NumericOutput(sw.mechanism.table[0]), pb.REJECT_REASON_WRONG_PAYLOAD_TYPE),
        (sw, good, pb.REJECT_REASON_WRONG_PAYLOAD_TYPE),
    ]
    for policy, output, reason in cases:
        assert_refused(d, running, policy, output, reason)


def test_non_table_doubles_are_refused_precisely(
    deployment: Deployment, running: RunningCollector
) -> None:
    d = deployment
    sw = d.verified(d.envelopes[1])
    mech = sw.mechanism
    assert isinstance(mech, SquareWave)
    inner = mech.table[len(mech.table) // 2]
    cases: list[tuple[float, int]] = [
        (math.nan, pb.REJECT_REASON_NON_FINITE),
        (math.inf, pb.REJECT_REASON_NON_FINITE),
        (-math.inf, pb.REJECT_REASON_NON_FINITE),
        (math.nextafter(inner, math.inf), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (math.nextafter(inner, -math.inf), pb.REJECT_REASON_OUT_OF_DOMAIN),
        (math.nextafter(mech.table[-1], math.inf), pb.REJECT_REASON_OUT_OF_DOMAIN),
    ]
    if 0.0 in mech.table:
        cases.append((-0.0, pb.REJECT_REASON_OUT_OF_DOMAIN))
    for y, reason in cases:
        assert_refused(d, running, sw, NumericOutput(y), reason)
