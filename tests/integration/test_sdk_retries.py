"""Retries against a real collector behind real faults: same bytes, same id, charged once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import Event
from fedldp.client.outbox import Outbox
from fedldp.client.transport import Backoff, submit_request_bytes
from fedldp.collector.server import RunningCollector
from fedldp.v1 import collector_pb2
from sdk_testkit import LABELS, Deployment, FaultProxy, Relay, ledger_rows, running_deployment

FAST = Backoff(base_seconds=0.01, max_seconds=0.05)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _spent(collector: RunningCollector, subject: str = "device-1") -> Decimal:
    window = int(time.time()) - int(time.time()) % 86400
    return collector.ledger.spent(subject, "homepage", window)


def test_unavailable_first_attempts_then_same_bytes_accepted(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical()
    collector = deployment.start()
    proxy = FaultProxy(collector.address, fail_first=3, retry_after_ms=80)
    try:
        with deployment.client(proxy.address, tmp_path / "d", backoff=FAST) as c:
            c.record("browser.homepage", LABELS[2])
            (entry,) = Outbox(c._store).entries()
            started = time.monotonic()
            result = c.flush(timeout=20)
            elapsed = time.monotonic() - started
            assert (result.acknowledged, result.failed_attempts, result.pending) == (1, 3, 0)
            assert result.last_error is not None and "UNAVAILABLE" in result.last_error
            assert c.counters()["send_failures"] == 3
    finally:
        proxy.close()
    # Every attempt carried exactly the stored bytes, with the same report id.
    assert proxy.submits == [submit_request_bytes([entry.report])] * 4
    assert proxy.outcomes == ["fail", "fail", "fail", "ok"]
    # The retry hint (80 ms) was honoured: three waits of at least 80 ms each.
    assert elapsed >= 3 * 0.08
    assert [r for r, _, _ in ledger_rows(collector)] == [entry.report_id]
    assert _spent(collector) == Decimal(1)


def test_lost_acknowledgement_resends_and_is_charged_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical()
    collector = deployment.start()
    proxy = FaultProxy(collector.address, lose_first=2, retry_after_ms=None)
    try:
        with deployment.client(proxy.address, tmp_path / "d", backoff=FAST) as c:
            c.record("browser.homepage", LABELS[0])
            c.record("browser.homepage", LABELS[1])
            result = c.flush(timeout=20)
            assert (result.acknowledged, result.duplicates, result.pending) == (2, 2, 0)
            assert c.counters()["acknowledged_duplicate"] == 2
    finally:
        proxy.close()
    assert len(set(proxy.submits)) == 1 and len(proxy.submits) == 3
    assert len(ledger_rows(collector)) == 2
    assert _spent(collector) == Decimal(2)  # committed once, acknowledged on the third try


def test_cut_connections_are_retried(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d") as setup:
        setup.record("browser.homepage", LABELS[3])
        (entry,) = Outbox(setup._store).entries()
    # The same device, now reaching the collector through a relay that cuts the first
    # two connections once the device has sent its Submit call on them (the report's
    # id is in the bytes). Cutting earlier, on the connection preface, races gRPC:
    # a connection lost before the call was dispatched on it is replaced by gRPC
    # itself and the call goes out on the next one, so whether the SDK saw a failed
    # attempt depended on thread timing (the test was flaky under CPU load).
    relay = Relay(("127.0.0.1", collector.port), cut_first=2, cut_on=entry.report_id)
    try:
        with deployment.client(
            relay.address, tmp_path / "d", backoff=FAST, fetch_policies=False
        ) as c:
            result = c.flush(timeout=20)
            assert (result.acknowledged, result.pending) == (1, 0)
            assert result.failed_attempts >= 1
    finally:
        relay.close()
    assert relay.connections >= 3
    # Only the connection that was not cut passed the report on.
    assert sum(entry.report in bytes(sent) for sent in relay.sent) == 1
    assert [r for r, _, _ in ledger_rows(collector)] == [entry.report_id]


def test_permanent_refusal_is_not_retried(deployment: Deployment, tmp_path: Path) -> None:
    envelope = deployment.categorical()
    first = deployment.start([envelope], name="first")
    with deployment.client(first.address, tmp_path / "d") as c:
        c.record("browser.homepage", LABELS[0])
    # A collector that does not serve the policy: UNKNOWN_POLICY is permanent.
    other = deployment.start([], name="other")
    proxy = FaultProxy(other.address)
    events: list[Event] = []
    try:
        with deployment.client(
            proxy.address,
            tmp_path / "d",
            backoff=FAST,
            fetch_policies=False,
            on_event=events.append,
        ) as c:
            result = c.flush(timeout=5)
            assert (result.refused, result.pending, result.failed_attempts) == (1, 0, 0)
            assert c.flush(timeout=1).refused == 0
            assert c.counters()["refused_outcome_unknown_policy"] == 1
            # The budget stays charged: the randomized output did reach a collector.
            assert c._store.budget_rows()[0].spent == Decimal(1)
    finally:
        proxy.close()
    assert len(proxy.submits) == 1
    (event,) = events
    assert (event.kind, event.reason, event.policy_id) == (
        "report_refused",
        collector_pb2.Outcome.Name(collector_pb2.OUTCOME_UNKNOWN_POLICY),
        "homepage",
    )
    assert ledger_rows(other) == []
