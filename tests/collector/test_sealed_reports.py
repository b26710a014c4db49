"""Sealed payloads (Report.sealed, the shuffle model) through a real collector over gRPC.

A shuffle-model policy (a signed `shuffle` section: the analyzer's X25519 key, min_batch) takes
sealed payloads only; every other policy takes plain ones only. The collector cannot read a
sealed payload: it checks its length and key id, charges the ledger exactly as for a plain
report (ε0 per report, the same cap, the same idempotency by report id), stores the ciphertext
and accumulates no statistic. Each refusal has its own reason and stores and charges nothing.
"""

from __future__ import annotations

import secrets

import pytest
from collector_testkit import Deployment, coarse, make_report
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fedldp.client.mechanisms.base import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.client.sealed import seal_report
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

_PRIVATE = X25519PrivateKey.generate()
_PUBLIC = _PRIVATE.public_key().public_bytes_raw()


@pytest.fixture(scope="module")
def deployment(now: int) -> Deployment:
    """ "color" (plain, ε = 0.5, cap 2) and "mood" (shuffle model, ε = 0.5, cap 1)."""
    d = Deployment.create(now=now)
    d.add_categorical("color", labels=("red", "green", "blue", "other"), epsilon="0.5")
    d.add_categorical("mood", epsilon="0.5", epsilon_cap="1", analyzer_key=_PUBLIC, min_batch=5)
    return d


def _sealed(policy: VerifiedPolicy, index: int, now: int, key: bytes = _PUBLIC) -> pb.Report:
    report = make_report(policy, CategoryOutput(index), coarse_time=coarse(now))
    seal_report(report, key)
    return report


def _submit(
    stub: collector_pb2_grpc.CollectorStub,
    deployment: Deployment,
    subject: str,
    *reports: pb.Report,
) -> list[tuple[int, int]]:
    response = stub.Submit(
        pb.SubmitRequest(reports=list(reports)),
        metadata=bearer_metadata(deployment.token(subject)),
    )
    return [(o.outcome, o.reason) for o in response.outcomes]


def test_policy_carries_the_shuffle_section(deployment: Deployment) -> None:
    """The verified shuffle policy names its key; a plain one names none."""
    assert deployment.verified(deployment.envelopes[1]).analyzer_public_key == _PUBLIC
    assert deployment.verified(deployment.envelopes[0]).analyzer_public_key is None


def test_sealed_is_charged_stored_as_ciphertext_and_never_accumulated(
    deployment: Deployment,
    collector: RunningCollector,
    stub: collector_pb2_grpc.CollectorStub,
    now: int,
) -> None:
    """Accepted, ε0 charged per report up to the cap, ciphertext stored, no statistics row;
    a resend of the same report is a DUPLICATE and charges nothing more."""
    mood = deployment.verified(deployment.envelopes[1])
    first, second, third = (_sealed(mood, i, now) for i in (0, 1, 2))
    got = _submit(stub, deployment, "dana", first, second, third)
    assert got == [
        (pb.OUTCOME_ACCEPTED, pb.REJECT_REASON_UNSPECIFIED),
        (pb.OUTCOME_ACCEPTED, pb.REJECT_REASON_UNSPECIFIED),
        (pb.OUTCOME_BUDGET_EXHAUSTED, pb.REJECT_REASON_UNSPECIFIED),  # cap 1 = 2 × 0.5
    ]
    assert _submit(stub, deployment, "dana", first) == [
        (pb.OUTCOME_DUPLICATE, pb.REJECT_REASON_UNSPECIFIED)
    ]
    ledger = collector.ledger
    spent = [(r.policy_id, str(r.epsilon_spent)) for r in ledger.subject_spend("dana")]
    assert spent == [("mood", "1.0")]
    window = mood.window_start(now)
    stored = ledger.sealed_ciphertexts("mood", window)
    assert stored == {1: sorted([first.sealed.ciphertext, second.sealed.ciphertext])}
    assert ledger.statistics("mood", 1, window) == []
    assert ledger.reconcile() == []  # charges and counts agree; no statistic is expected


def test_wrong_payload_kind_each_refused_with_its_reason(
    deployment: Deployment,
    collector: RunningCollector,
    stub: collector_pb2_grpc.CollectorStub,
    now: int,
) -> None:
    """Plain for the shuffle policy: SEALED_REQUIRED; sealed for the plain one:
    SEALED_NOT_EXPECTED; another key, or a length no HPKE output has: MALFORMED_SEALED.
    Nothing of them is stored or charged; a good report in the same request is accepted."""
    color = deployment.verified(deployment.envelopes[0])
    mood = deployment.verified(deployment.envelopes[1])
    plain_mood = make_report(mood, CategoryOutput(1), coarse_time=coarse(now))
    sealed_color = _sealed(color, 2, now)
    other_key = _sealed(mood, 1, now, X25519PrivateKey.generate().public_key().public_bytes_raw())
    short = _sealed(mood, 1, now)
    short.sealed.ciphertext = secrets.token_bytes(48)
    good = _sealed(mood, 3, now)
    got = _submit(stub, deployment, "erin", plain_mood, sealed_color, other_key, short, good)
    assert got == [
        (pb.OUTCOME_INVALID, pb.REJECT_REASON_SEALED_REQUIRED),
        (pb.OUTCOME_INVALID, pb.REJECT_REASON_SEALED_NOT_EXPECTED),
        (pb.OUTCOME_INVALID, pb.REJECT_REASON_MALFORMED_SEALED),
        (pb.OUTCOME_INVALID, pb.REJECT_REASON_MALFORMED_SEALED),
        (pb.OUTCOME_ACCEPTED, pb.REJECT_REASON_UNSPECIFIED),
    ]
    ledger = collector.ledger
    spent = [(r.policy_id, str(r.epsilon_spent)) for r in ledger.subject_spend("erin")]
    assert spent == [("mood", "0.5")]
    assert ledger.report_count("color", 1) == 0
    assert ledger.sealed_ciphertexts("mood", mood.window_start(now)) == {
        1: [good.sealed.ciphertext]
    }


def test_ledger_report_refuses_a_shuffle_policy(
    deployment: Deployment, collector: RunningCollector
) -> None:
    """`fedldp report`'s path has no statistic to read for a shuffle policy: a clear refusal."""
    from fedldp.aggregator.reports import ShuffleModelError, report_from_ledgers

    mood = deployment.verified(deployment.envelopes[1])
    with pytest.raises(ShuffleModelError, match="fedldp shuffler"):
        report_from_ledgers([("here", collector.ledger)], mood)


def test_same_id_other_ciphertext_is_a_conflict(
    deployment: Deployment,
    collector: RunningCollector,
    stub: collector_pb2_grpc.CollectorStub,
    now: int,
) -> None:
    """The report id is the idempotency key as for plain reports: the same id resealed (another
    ciphertext, even of the same output) is a CONFLICT, charged once, stored once."""
    mood = deployment.verified(deployment.envelopes[1])
    first = _sealed(mood, 2, now)
    again = make_report(mood, CategoryOutput(2), coarse_time=coarse(now), report_id=first.report_id)
    seal_report(again, _PUBLIC)
    assert again.sealed.ciphertext != first.sealed.ciphertext  # a fresh HPKE encapsulation
    assert _submit(stub, deployment, "fay", first) == [
        (pb.OUTCOME_ACCEPTED, pb.REJECT_REASON_UNSPECIFIED)
    ]
    assert _submit(stub, deployment, "fay", again) == [
        (pb.OUTCOME_CONFLICT, pb.REJECT_REASON_UNSPECIFIED)
    ]
    spent = [(r.policy_id, str(r.epsilon_spent)) for r in collector.ledger.subject_spend("fay")]
    assert spent == [("mood", "0.5")]
    assert collector.ledger.conflict_count("fay") == 1
