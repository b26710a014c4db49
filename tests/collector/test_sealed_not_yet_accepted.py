"""A sealed payload (Report.sealed, the shuffle model) over real gRPC: refused, nothing kept.

The collector does not take part in the shuffle model yet (docs/shuffle.md, "Not done yet").
Until it does, a report whose payload is `sealed` must be refused as carrying no payload it can
check (OUTCOME_INVALID, REJECT_REASON_MISSING_PAYLOAD), stored nowhere and charged to no one,
while a plain report in the same request is accepted as before.
"""

from __future__ import annotations

from collector_testkit import Deployment, coarse, make_report
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from fedldp.client.mechanisms.base import CategoryOutput
from fedldp.client.sealed import seal_report
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.server import RunningCollector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc


def test_sealed_report_is_refused_and_charges_nothing(
    deployment: Deployment,
    collector: RunningCollector,
    stub: collector_pb2_grpc.CollectorStub,
    now: int,
) -> None:
    """Sealed: INVALID / MISSING_PAYLOAD, not stored, not charged; the plain one is accepted."""
    policy = deployment.verified(deployment.envelopes[0])  # "color", ε = 0.5
    public = X25519PrivateKey.generate().public_key().public_bytes_raw()
    sealed = make_report(policy, CategoryOutput(2), coarse_time=coarse(now))
    seal_report(sealed, public)
    assert sealed.WhichOneof("payload") == "sealed"
    plain = make_report(policy, CategoryOutput(1), coarse_time=coarse(now))
    response = stub.Submit(
        pb.SubmitRequest(reports=[sealed, plain]),
        metadata=bearer_metadata(deployment.token("carol")),
    )
    got = [(o.outcome, o.reason) for o in response.outcomes]
    assert got == [
        (pb.OUTCOME_INVALID, pb.REJECT_REASON_MISSING_PAYLOAD),
        (pb.OUTCOME_ACCEPTED, pb.REJECT_REASON_UNSPECIFIED),
    ]
    assert collector.ledger.report_count("color", 1) == 1
    spent = [(r.policy_id, str(r.epsilon_spent)) for r in collector.ledger.subject_spend("carol")]
    assert spent == [("color", "0.5")]
