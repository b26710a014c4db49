"""The Collector over real gRPC: every kind of bad input gets a precise status or
outcome, and changes nothing in the ledger."""

from __future__ import annotations

import math
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import (
    BitVectorOutput,
    CategoryOutput,
    NumericOutput,
)
from fedldp.collector.auth import TokenAuthority, bearer_metadata
from fedldp.collector.ledger import open_ledger
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

SUBMIT = "/fedldp.v1.Collector/Submit"


def _nothing_stored(collector: RunningCollector, policy_id: str = "color") -> None:
    assert collector.ledger.report_count(policy_id, 1) == 0
    assert collector.ledger.subject_spend("alice") == []
    assert collector.ledger.reconcile() == []


def test_submit_then_budget(
    deployment: Deployment,
    collector: RunningCollector,
    stub: collector_pb2_grpc.CollectorStub,
    now: int,
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    reports = [
        make_report(policy, CategoryOutput(i % 4), coarse_time=coarse(now)) for i in range(5)
    ]
    auth = bearer_metadata(deployment.token("alice"))
    response = stub.Submit(pb.SubmitRequest(reports=reports), metadata=auth)
    assert [o.outcome for o in response.outcomes] == [pb.OUTCOME_ACCEPTED] * 4 + [
        pb.OUTCOME_BUDGET_EXHAUSTED
    ]
    assert [o.report_id for o in response.outcomes] == [r.report_id for r in reports]
    # The retry of an acknowledged report is a duplicate, charging nothing.
    again = stub.Submit(pb.SubmitRequest(reports=reports[:1]), metadata=auth)
    assert again.outcomes[0].outcome == pb.OUTCOME_DUPLICATE
    budget = stub.GetBudget(pb.GetBudgetRequest(), metadata=auth).budgets
    assert [(b.policy_id, b.epsilon_cap, b.epsilon_spent, b.epsilon_remaining) for b in budget] == [
        ("color", "2", "2.0", "0.0")
    ]
    assert budget[0].window_end - budget[0].window_start == 86400
    other = stub.GetBudget(
        pb.GetBudgetRequest(policy_id="color"), metadata=bearer_metadata(deployment.token("bob"))
    ).budgets
    assert other[0].epsilon_spent == "0"
    text = collector.metrics.text().decode()
    assert 'fedldp_collector_reports_total{outcome="accepted",reason="unspecified"} 4.0' in text
    assert "fedldp_collector_budget_exhaustions_total 1.0" in text
    assert "alice" not in text


def test_every_bad_report_gets_its_own_outcome(
    deployment: Deployment, tmp_path: Path, now: int
) -> None:
    d = deployment
    expired = d.add_categorical("old", not_before=now - 10 * 86400, lifetime_seconds=86400)
    future = d.add_categorical("soon", not_before=now + 86400)
    registry = d.registry()
    d.envelopes.remove(expired)
    d.envelopes.remove(future)
    running = start_collector(d.config(f"sqlite:///{tmp_path / 'l.db'}"), registry=registry)
    try:
        good_policy = d.verified(d.envelopes[0])
        ct = coarse(now)
        good = make_report(good_policy, CategoryOutput(1), coarse_time=ct)
        dup = make_report(good_policy, CategoryOutput(2), coarse_time=ct)
        cases: list[tuple[pb.Report, int, int]] = [
            (good, pb.OUTCOME_ACCEPTED, 0),
            (
                make_report(good_policy, CategoryOutput(1), report_id=b"short", coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_MALFORMED_REPORT_ID,
            ),
            (
                make_report(good_policy, CategoryOutput(1), report_id=b"", coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_MALFORMED_REPORT_ID,
            ),
            (dup, pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
            (dup, pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
            (
                make_report(good_policy, CategoryOutput(1), coarse_time=ct, digest=b"\x00" * 32),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_DIGEST_MISMATCH,
            ),
            (
                make_report(
                    d.verified(expired, now=now - 10 * 86400 + 100),
                    CategoryOutput(0),
                    coarse_time=ct,
                ),
                pb.OUTCOME_EXPIRED_POLICY,
                0,
            ),
            (
                make_report(
                    d.verified(future, now=now + 2 * 86400), CategoryOutput(0), coarse_time=ct
                ),
                pb.OUTCOME_EXPIRED_POLICY,
                0,
            ),
            (
                make_report(good_policy, CategoryOutput(4), coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_OUT_OF_DOMAIN,
            ),
            (
                make_report(good_policy, BitVectorOutput(b"\x01", 4), coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_WRONG_PAYLOAD_TYPE,
            ),
            (
                make_report(good_policy, NumericOutput(math.nan), coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_NON_FINITE,
            ),
            (
                make_report(good_policy, NumericOutput(-math.inf), coarse_time=ct),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_NON_FINITE,
            ),
            (
                make_report(good_policy, CategoryOutput(0), coarse_time=ct + 1),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_BAD_COARSE_TIME,
            ),
            (
                make_report(good_policy, CategoryOutput(0), coarse_time=ct + 7200),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_BAD_COARSE_TIME,
            ),
            (
                make_report(good_policy, CategoryOutput(0), coarse_time=ct - 400 * 86400),
                pb.OUTCOME_INVALID,
                pb.REJECT_REASON_BAD_COARSE_TIME,
            ),
        ]
        missing = make_report(good_policy, CategoryOutput(0), coarse_time=ct)
        missing.ClearField("category")
        cases.append((missing, pb.OUTCOME_INVALID, pb.REJECT_REASON_MISSING_PAYLOAD))
        unknown = make_report(good_policy, CategoryOutput(0), coarse_time=ct)
        unknown.policy_id = "no-such-policy"
        cases.append((unknown, pb.OUTCOME_UNKNOWN_POLICY, 0))
        wrong_version = make_report(good_policy, CategoryOutput(0), coarse_time=ct)
        wrong_version.policy_version = 7
        cases.append((wrong_version, pb.OUTCOME_UNKNOWN_POLICY, 0))

        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            response = stub.Submit(
                pb.SubmitRequest(reports=[c[0] for c in cases]),
                metadata=bearer_metadata(d.token("alice")),
            )
        got = [(o.outcome, o.reason) for o in response.outcomes]
        assert got == [(c[1], c[2]) for c in cases]
        for outcome in response.outcomes:
            if outcome.outcome != pb.OUTCOME_ACCEPTED:
                assert outcome.detail  # explained, and never echoing a payload
        # Only the one good report is stored and charged.
        assert running.ledger.report_count("color", 1) == 1
        assert [(r.policy_id, r.epsilon_spent) for r in running.ledger.subject_spend("alice")] == [
            ("color", Decimal("0.5"))
        ]
        assert running.ledger.reconcile() == []
    finally:
        running.stop(1.0)


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        (("authorization", "Bearer not-a-token"),),
        (("authorization", "Basic dXNlcjpwYXNz"),),
        "forged",
        "expired",
        "tampered-subject",
    ],
)
def test_unauthenticated_calls_touch_nothing(
    deployment: Deployment, collector: RunningCollector, now: int, metadata: object
) -> None:
    if metadata == "forged":
        token = TokenAuthority(b"k" * 32).mint("alice", expires_at=now + 60)
        metadata = bearer_metadata(token)
    elif metadata == "expired":
        token = TokenAuthority(deployment.secret).mint("alice", expires_at=now - 1)
        metadata = bearer_metadata(token)
    elif metadata == "tampered-subject":
        token = deployment.token("bob")
        parts = token.split(".")
        parts[1] = deployment.token("alice").split(".")[1]
        metadata = bearer_metadata(".".join(parts))
    policy = deployment.verified(deployment.envelopes[0])
    request = pb.SubmitRequest(
        reports=[make_report(policy, CategoryOutput(0), coarse_time=coarse(now))]
    )
    with grpc.insecure_channel(collector.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        calls: list[tuple[Any, Any]] = [
            (stub.Submit, request),
            (stub.GetBudget, pb.GetBudgetRequest()),
            (stub.GetPolicies, pb.GetPoliciesRequest()),
        ]
        for call, req in calls:
            with pytest.raises(grpc.RpcError) as err:
                call(req, metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "alice" not in (err.value.details() or "")
    _nothing_stored(collector)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x0a\xff\x01",  # field 1, length 255, truncated
        b"\x0a\x05\x0a\x10abc",  # nested report with a truncated report_id
        b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # not protobuf at all
        b"\x0b",  # start group without end
    ],
)
def test_garbage_protobuf_is_invalid_argument(
    deployment: Deployment, collector: RunningCollector, raw: bytes
) -> None:
    with grpc.insecure_channel(collector.address) as channel:
        call = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
        with pytest.raises(grpc.RpcError) as err:
            call(raw, metadata=bearer_metadata(deployment.token("alice")))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "fedldp.v1.SubmitRequest" in (err.value.details() or "")
    _nothing_stored(collector)


def test_oversize_batch_and_message(deployment: Deployment, tmp_path: Path, now: int) -> None:
    config = deployment.config(
        f"sqlite:///{tmp_path / 'l.db'}", max_reports_per_request=10, max_message_bytes=4096
    )
    running = start_collector(config, registry=deployment.registry())
    try:
        policy = deployment.verified(deployment.envelopes[0])
        auth = bearer_metadata(deployment.token("alice"))
        eleven = [
            make_report(policy, CategoryOutput(0), coarse_time=coarse(now)) for _ in range(11)
        ]
        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit.with_call(pb.SubmitRequest(reports=eleven), metadata=auth)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            trailing: dict[str, Any] = {m.key: m.value for m in err.value.trailing_metadata()}
            assert trailing["max-reports-per-request"] == "10"
            big = pb.SubmitRequest(reports=eleven[:1])
            big.reports[0].policy_id = "x" * 5000
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(big, metadata=auth)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            ok = stub.Submit(pb.SubmitRequest(reports=eleven[:10]), metadata=auth)
            assert len(ok.outcomes) == 10
        assert running.ledger.report_count("color", 1) == 4
    finally:
        running.stop(1.0)


def test_rate_limit_gives_a_retry_hint(deployment: Deployment, tmp_path: Path) -> None:
    config = deployment.config(
        f"sqlite:///{tmp_path / 'l.db'}", rate_limit_per_second=0.5, rate_limit_burst=2
    )
    running = start_collector(config, registry=deployment.registry())
    try:
        auth = bearer_metadata(deployment.token("alice"))
        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            stub.GetBudget(pb.GetBudgetRequest(), metadata=auth)
            stub.GetBudget(pb.GetBudgetRequest(), metadata=auth)
            with pytest.raises(grpc.RpcError) as err:
                stub.GetBudget(pb.GetBudgetRequest(), metadata=auth)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            hint = {m.key: m.value for m in err.value.trailing_metadata()}["retry-after-ms"]
            assert 0 < int(hint) <= 2000
            # Another subject has its own bucket.
            stub.GetBudget(pb.GetBudgetRequest(), metadata=bearer_metadata(deployment.token("bob")))
    finally:
        running.stop(1.0)


def test_get_policies_and_health(deployment: Deployment, collector: RunningCollector) -> None:
    auth = bearer_metadata(deployment.token("alice"))
    with grpc.insecure_channel(collector.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        full = stub.GetPolicies(pb.GetPoliciesRequest(), metadata=auth)
        assert [e.payload for e in full.policies] == [deployment.envelopes[0].payload]
        assert len(full.roots) == 1
        assert (
            stub.GetPolicies(pb.GetPoliciesRequest(known_root_version=1), metadata=auth).roots == []
        )
        assert stub.GetPolicies(pb.GetPoliciesRequest(metric="nope"), metadata=auth).policies == []
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "fedldp.v1.Collector"):
            status = health.Check(health_pb2.HealthCheckRequest(service=service)).status
            assert status == health_pb2.HealthCheckResponse.SERVING


def test_stop_drains_and_keeps_acknowledged_reports(
    deployment: Deployment, sqlite_url: str, now: int
) -> None:
    """Requests in flight when stop() begins complete, and what they acknowledged is stored."""
    import threading

    running = start_collector(deployment.config(sqlite_url), registry=deployment.registry())
    policy = deployment.verified(deployment.envelopes[0])
    acked: list[bytes] = []
    lock = threading.Lock()
    go = threading.Event()

    def device(i: int) -> None:
        auth = bearer_metadata(deployment.token(f"dev{i}"))
        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            go.wait()
            for _ in range(50):
                report = make_report(policy, CategoryOutput(i % 4), coarse_time=coarse(now))
                try:
                    out = stub.Submit(pb.SubmitRequest(reports=[report]), metadata=auth)
                except grpc.RpcError:
                    return
                if out.outcomes[0].outcome == pb.OUTCOME_ACCEPTED:
                    with lock:
                        acked.append(report.report_id)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    go.set()
    time.sleep(0.2)
    running.stop(5.0)
    for t in threads:
        t.join()
    with open_ledger(sqlite_url) as led:
        assert all(led.has_report(rid) for rid in acked)
        assert led.report_count("color", 1) >= len(acked)
        assert led.reconcile() == []


def test_policy_folders_and_reload(deployment: Deployment, tmp_path: Path, now: int) -> None:
    """A collector started from the trust and policy folders picks up a new policy on reload."""
    d = Deployment.create(now=now)
    d.add_categorical("first")
    trust_dir, policy_dir = d.write_folders(tmp_path)
    config = d.config(
        f"sqlite:///{tmp_path / 'l.db'}", trust_dir=str(trust_dir), policy_dir=str(policy_dir)
    )
    running = start_collector(config)
    try:
        auth = bearer_metadata(d.token("alice"))
        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            assert len(stub.GetPolicies(pb.GetPoliciesRequest(), metadata=auth).policies) == 1
            d.add_categorical("second")
            d.write_folders(tmp_path)
            running.reload_policies()
            assert len(stub.GetPolicies(pb.GetPoliciesRequest(), metadata=auth).policies) == 2
            second = d.verified(d.envelopes[1])
            out = stub.Submit(
                pb.SubmitRequest(
                    reports=[make_report(second, CategoryOutput(0), coarse_time=coarse(now))]
                ),
                metadata=auth,
            )
            assert out.outcomes[0].outcome == pb.OUTCOME_ACCEPTED
    finally:
        running.stop(1.0)


def test_logs_carry_no_subject_token_or_payload(
    deployment: Deployment, collector: RunningCollector, now: int, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from fedldp.collector.daemon import JsonFormatter

    subject = "subject-that-must-not-be-logged"
    token = deployment.token(subject)
    policy = deployment.verified(deployment.envelopes[0])
    report = make_report(policy, CategoryOutput(3), coarse_time=coarse(now))
    with (
        caplog.at_level(logging.DEBUG, logger="fedldp"),
        grpc.insecure_channel(collector.address) as channel,
    ):
        stub = collector_pb2_grpc.CollectorStub(channel)
        stub.Submit(pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(token))
        with pytest.raises(grpc.RpcError):
            stub.Submit(
                pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(token[:-2] + "xx")
            )
        with pytest.raises(grpc.RpcError):
            stub.Submit(pb.SubmitRequest(reports=[report] * 2000), metadata=bearer_metadata(token))
    formatted = "\n".join(JsonFormatter().format(r) for r in caplog.records)
    assert "request refused" in formatted
    for secret in (subject, token, report.report_id.hex()):
        assert secret not in formatted


def test_a_second_id_field_counts_through_both_servers(
    deployment: Deployment, collector: RunningCollector, now: int
) -> None:
    """Hand-encoded bytes whose report content names an id after the content: the id
    that counts is that last one (protobuf's rule), on the sync and asyncio servers
    alike, though the request's other reports share that content and begin with ids
    of their own (the collector reads ids from the bytes: collector/service.py)."""
    policy = deployment.verified(deployment.envelopes[0])
    ids = [bytes([i]) * 16 for i in range(1, 5)]
    content = make_report(policy, CategoryOutput(1), report_id=ids[0], coarse_time=coarse(now))
    tail = content.SerializeToString()[18:]  # everything after the id field
    plain = [b"\x0a\x10" + rid + tail for rid in ids[2:]]  # two reports, own ids
    named = [b"\x0a\x10" + rid + tail + b"\x0a\x10" + ids[0] for rid in ids[:2]]  # both ids[0]
    body = b"".join(b"\x0a" + bytes([len(r)]) + r for r in plain + named)
    with grpc.insecure_channel(collector.address) as channel:
        call = channel.unary_unary(SUBMIT, request_serializer=None, response_deserializer=None)
        raw = call(body, metadata=bearer_metadata(deployment.token("frank")))
    response = pb.SubmitResponse.FromString(raw)
    assert [(o.report_id, o.outcome, o.reason) for o in response.outcomes] == [
        (ids[2], pb.OUTCOME_ACCEPTED, 0),
        (ids[3], pb.OUTCOME_ACCEPTED, 0),
        (ids[0], pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
        (ids[0], pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
    ]
