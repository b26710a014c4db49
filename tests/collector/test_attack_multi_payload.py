"""Attack: malformed MultiPayloads sent as raw protobufs to a real collector (gRPC on
port 0, a real SQLite ledger). Every one must be refused with its precise reason and
change nothing: no charge, no stored row. Well-formed reports of both modes are
accepted and charged ε exactly once (not once per attribute)."""

from __future__ import annotations

import random
import secrets
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import MultiOutput
from fedldp.client.mechanisms.multi import MultiAttribute
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

LABELS = [f"v{i}" for i in range(4)]
ATTRIBUTES: list[dict[str, Any]] = [
    {"name": "kind", "values": LABELS, "mechanism": "grr"},
    {"name": "bits", "values": LABELS, "mechanism": "oue"},
    {"name": "level", "lo": "-1", "hi": "1", "mechanism": "piecewise"},
]
MODES = ("multi-split", "multi-sample")


@pytest.fixture(scope="module")
def multi(now: int) -> Deployment:
    d = Deployment.create(now=now)
    for mode in MODES:
        d.add_multi(f"atk-{mode}", mechanism=mode, attributes=ATTRIBUTES)
    return d


@pytest.fixture(scope="module")
def running(
    multi: Deployment, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningCollector]:
    path: Path = tmp_path_factory.mktemp("atk-multi") / "ledger.db"
    r = start_collector(multi.config(f"sqlite:///{path}"), registry=multi.registry())
    yield r
    r.stop(1.0)


def _policy(multi: Deployment, mode: str) -> VerifiedPolicy:
    return multi.verified(multi.envelopes[MODES.index(mode)])


def _good(policy: VerifiedPolicy, seed: int = 1) -> MultiOutput:
    out = policy.mechanism.perturb((1, 2, 0.25), rng=random.Random(seed))
    assert isinstance(out, MultiOutput)
    return out


def _submit(
    multi: Deployment, running: RunningCollector, subject: str, report: pb.Report
) -> pb.ReportOutcome:
    with grpc.insecure_channel(running.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.Submit(
            pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(multi.token(subject))
        )
    return response.outcomes[0]


Mutate = Callable[[pb.Report], None]


def _split_parts(report: pb.Report) -> list[pb.AttributePayload]:
    return [pb.AttributePayload.FromString(p.SerializeToString()) for p in report.multi.parts]


def _set_parts(report: pb.Report, parts: list[pb.AttributePayload]) -> None:
    del report.multi.parts[:]
    for p in parts:
        report.multi.parts.add().CopyFrom(p)


def _swap(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, [parts[1], parts[0], parts[2]])


def _duplicate_first(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, [parts[0], parts[0], parts[2]])


def _extra(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, [*parts, parts[0]])


def _missing(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, parts[:-1])


def _empty_part(report: pb.Report) -> None:
    part = report.multi.parts[0]
    part.ClearField(part.WhichOneof("payload") or "category")


def _wrong_type(report: pb.Report) -> None:
    part = report.multi.parts[0]  # grr (category) under split
    part.bits.bits = b"\x01"
    part.bits.length = 4


def _nan(report: pb.Report) -> None:
    report.multi.parts[2].numeric.value = float("nan")


def _huge(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, parts * 20000)


def _no_parts(report: pb.Report) -> None:
    del report.multi.parts[:]


def _category_payload(report: pb.Report) -> None:
    report.category.index = 0  # the oneof: a single-metric payload under a multi policy


SPLIT_CASES: list[tuple[str, Mutate, int]] = [
    ("out-of-order", _swap, pb.REJECT_REASON_OUT_OF_DOMAIN),
    ("duplicate", _duplicate_first, pb.REJECT_REASON_OUT_OF_DOMAIN),
    ("extra", _extra, pb.REJECT_REASON_WRONG_LENGTH),
    ("missing", _missing, pb.REJECT_REASON_WRONG_LENGTH),
    ("part-without-payload", _empty_part, pb.REJECT_REASON_MISSING_PAYLOAD),
    ("wrong-part-type", _wrong_type, pb.REJECT_REASON_WRONG_PAYLOAD_TYPE),
    ("nan", _nan, pb.REJECT_REASON_NON_FINITE),
    ("huge", _huge, pb.REJECT_REASON_WRONG_LENGTH),
    ("no-parts", _no_parts, pb.REJECT_REASON_WRONG_LENGTH),
    ("single-payload", _category_payload, pb.REJECT_REASON_WRONG_PAYLOAD_TYPE),
]


@pytest.mark.parametrize(("name", "mutate", "reason"), SPLIT_CASES, ids=[c[0] for c in SPLIT_CASES])
def test_malformed_split_payloads_are_refused_and_change_nothing(
    multi: Deployment, running: RunningCollector, now: int, name: str, mutate: Mutate, reason: int
) -> None:
    policy = _policy(multi, "multi-split")
    report = make_report(policy, _good(policy), coarse_time=coarse(now))
    mutate(report)
    subject = f"atk-split-{name}"
    outcome = _submit(multi, running, subject, report)
    assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason), outcome
    assert outcome.detail  # a precise reason, in words
    ledger = running.ledger
    assert ledger.spent(subject, policy.policy_id, policy.window_start(now)) == Decimal(0)
    assert not ledger.has_report(report.report_id)


def _sample_index(d: int) -> Mutate:
    def mutate(report: pb.Report) -> None:
        report.multi.parts[0].attribute = d

    return mutate


def _sample_two(report: pb.Report) -> None:
    parts = _split_parts(report)
    _set_parts(report, parts * 2)


SAMPLE_CASES: list[tuple[str, Mutate, int]] = [
    ("index-d", _sample_index(3), pb.REJECT_REASON_OUT_OF_DOMAIN),
    ("index-max", _sample_index(2**32 - 1), pb.REJECT_REASON_OUT_OF_DOMAIN),
    ("two-parts", _sample_two, pb.REJECT_REASON_WRONG_LENGTH),
    ("no-parts", _no_parts, pb.REJECT_REASON_WRONG_LENGTH),
    ("huge", _huge, pb.REJECT_REASON_WRONG_LENGTH),
]


@pytest.mark.parametrize(
    ("name", "mutate", "reason"), SAMPLE_CASES, ids=[c[0] for c in SAMPLE_CASES]
)
def test_malformed_sample_payloads_are_refused_and_change_nothing(
    multi: Deployment, running: RunningCollector, now: int, name: str, mutate: Mutate, reason: int
) -> None:
    policy = _policy(multi, "multi-sample")
    report = make_report(policy, _good(policy), coarse_time=coarse(now))
    mutate(report)
    subject = f"atk-sample-{name}"
    outcome = _submit(multi, running, subject, report)
    assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, reason), outcome
    ledger = running.ledger
    assert ledger.spent(subject, policy.policy_id, policy.window_start(now)) == Decimal(0)
    assert not ledger.has_report(report.report_id)


@pytest.mark.parametrize("mode", MODES)
def test_a_well_formed_report_is_charged_epsilon_once(
    multi: Deployment, running: RunningCollector, now: int, mode: str
) -> None:
    policy = _policy(multi, mode)
    subject = f"atk-good-{mode}-{secrets.token_hex(4)}"
    report = make_report(policy, _good(policy, 5), coarse_time=coarse(now))
    outcome = _submit(multi, running, subject, report)
    assert outcome.outcome == pb.OUTCOME_ACCEPTED
    spent = running.ledger.spent(subject, policy.policy_id, policy.window_start(now))
    assert spent == policy.charge == Decimal(1)


@pytest.mark.parametrize("mode", MODES)
def test_a_huge_part_list_is_refused_by_its_count_before_its_parts_are_read(
    multi: Deployment, running: RunningCollector, now: int, mode: str
) -> None:
    policy = _policy(multi, mode)
    report = make_report(policy, _good(policy), coarse_time=coarse(now))
    parts = _split_parts(report)
    _set_parts(report, parts * 30000)
    report.multi.parts.add().attribute = 0  # the very last part carries no payload
    subject = f"atk-count-first-{mode}"
    outcome = _submit(multi, running, subject, report)
    assert (outcome.outcome, outcome.reason) == (pb.OUTCOME_INVALID, pb.REJECT_REASON_WRONG_LENGTH)
    assert running.ledger.spent(subject, policy.policy_id, policy.window_start(now)) == Decimal(0)


@pytest.mark.parametrize("mode", MODES)
def test_a_resent_multi_report_is_a_duplicate_and_an_altered_one_is_refused(
    multi: Deployment, running: RunningCollector, now: int, mode: str
) -> None:
    """The content digest covers every part: the same id and content is a duplicate
    (charged once); the same id with one part changed is refused, charging nothing."""
    policy = _policy(multi, mode)
    subject = f"atk-resend-{mode}"
    report = make_report(policy, _good(policy, 9), coarse_time=coarse(now))
    assert _submit(multi, running, subject, report).outcome == pb.OUTCOME_ACCEPTED
    assert _submit(multi, running, subject, report).outcome == pb.OUTCOME_DUPLICATE
    altered = pb.Report()
    altered.CopyFrom(report)
    last = altered.multi.parts[-1]
    if last.WhichOneof("payload") == "numeric":
        mechanism = policy.mechanism
        assert isinstance(mechanism, MultiAttribute)
        numeric: Any = mechanism.mechanisms[last.attribute]
        table = sorted(set(numeric.table))
        last.numeric.value = next(y for y in table if y != last.numeric.value)
    elif last.WhichOneof("payload") == "category":
        last.category.index = (last.category.index + 1) % len(LABELS)
    else:
        last.bits.bits = bytes([last.bits.bits[0] ^ 1])
    outcome = _submit(multi, running, subject, altered)
    assert outcome.outcome not in (pb.OUTCOME_ACCEPTED, pb.OUTCOME_DUPLICATE), outcome
    window = policy.window_start(now)
    assert running.ledger.spent(subject, policy.policy_id, window) == policy.charge
