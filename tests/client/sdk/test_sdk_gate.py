"""The device-wide send gate: one backoff per collector, stored, bounded, probe-first."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from fedldp.client import send_slot
from fedldp.client.device_store import STATE_FILE_NAME, DeviceStore
from fedldp.client.outbox import GateState, Outbox, SendGate
from fedldp.client.send_slot import SendSlot
from fedldp.client.transport import Backoff, Credentials, Transport, channel_options

BACKOFF = Backoff(base_seconds=1.0, max_seconds=60.0, max_hint_seconds=600.0)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[DeviceStore]:
    s = DeviceStore(tmp_path)
    yield s
    s.close()


def _gate(store: DeviceStore, target: str = "collector:443", now: float = 1000.0) -> SendGate:
    gate = SendGate(target, BACKOFF, random.Random(1))
    with store.transaction() as conn:
        gate.load(conn, now=now)
    return gate


def _add(store: DeviceStore, n: int) -> None:
    with store.transaction() as conn:
        for _ in range(n):
            Outbox.add(
                conn,
                report_id=secrets.token_bytes(16),
                policy_id="p",
                policy_version=1,
                window_start=0,
                epsilon=Decimal("0.5"),
                report=b"r",
                created_at=0,
            )


def test_failure_pauses_and_is_stored_per_collector(store: DeviceStore) -> None:
    gate = _gate(store)
    with store.transaction() as conn:
        delay = gate.failed(conn, now=1000.0, retry_after=None)
    assert 0 <= delay <= BACKOFF.ceiling(1)
    assert (gate.failures, gate.resume_at) == (1, 1000.0 + delay)
    again = _gate(store)  # a restarted app
    assert again.state == gate.state
    assert _gate(store, target="other:443").state == GateState()


def test_hint_is_a_floor_and_capped(store: DeviceStore) -> None:
    gate = _gate(store)
    with store.transaction() as conn:
        assert gate.failed(conn, now=0.0, retry_after=30.0) >= 30.0
        assert gate.state.hint_until == 30.0
        assert gate.failed(conn, now=0.0, retry_after=10_000.0) == 600.0
        assert gate.state.hint_until == 600.0


def test_success_resets_but_keeps_hint(store: DeviceStore) -> None:
    gate = _gate(store)
    with store.transaction() as conn:
        gate.failed(conn, now=0.0, retry_after=5.0)
        gate.succeeded(conn, now=0.0)
    assert gate.state == GateState(hint_until=5.0)


def test_open_now_respects_a_running_hint(store: DeviceStore) -> None:
    gate = _gate(store)
    with store.transaction() as conn:
        gate.failed(conn, now=0.0, retry_after=50.0)
        gate.open_now(conn, now=10.0)
        assert gate.resume_at == 50.0  # the server's hint stands
        DeviceStore.set_meta(  # a longer backoff of our own
            conn, gate.key, json.dumps({"failures": 1, "resume_at": 300.0, "hint_until": 50.0})
        )
        gate.open_now(conn, now=60.0)
        assert gate.resume_at == 60.0  # hint over: now
        assert gate.failures == 1  # the next attempt is still a probe


def test_stored_pause_is_bounded_and_bad_state_ignored(store: DeviceStore) -> None:
    gate = _gate(store)
    with store.transaction() as conn:
        DeviceStore.set_meta(
            conn, gate.key, json.dumps({"failures": 3, "resume_at": 1e12, "hint_until": 1e12})
        )
    loaded = _gate(store, now=1000.0)
    assert loaded.resume_at == 1000.0 + 600.0  # the longest pause the SDK sets
    with store.transaction() as conn:
        DeviceStore.set_meta(conn, gate.key, "{not json")
    assert _gate(store).state == GateState()


def test_call_failed_is_one_transaction_and_retry_now_makes_all_due(store: DeviceStore) -> None:
    outbox = Outbox(store)
    _add(store, 3)
    entries = outbox.entries()
    outbox.defer([(entries[2], 500.0)], now=0.0, error="PROTOCOL: unknown outcome")
    gate = _gate(store)
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    outbox.call_failed(entries[:2], gate=gate, now=0.0, error="UNAVAILABLE: x", retry_after=None)
    store._conn.set_trace_callback(None)
    assert statements.count("BEGIN IMMEDIATE") == 1
    assert [e.attempts for e in outbox.entries()] == [1, 1, 1]
    assert store.counters()["send_failures"] == 1
    assert len(outbox.due(1.0, 10)) == 2  # the deferred one waits for its own time
    outbox.retry_now(gate, now=1.0)
    assert len(outbox.due(1.0, 10)) == 3
    assert gate.resume_at <= 1.0


def test_checkpoint_truncates_the_log_and_close_leaves_one_file(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    _add(store, 50)
    wal = tmp_path / (STATE_FILE_NAME + "-wal")
    assert wal.stat().st_size > 0
    assert store.checkpoint()
    assert wal.stat().st_size == 0
    store.close()
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE_NAME]


def test_channel_options_follow_the_sdk_backoff() -> None:
    options = dict(channel_options(Backoff(base_seconds=0.25, max_seconds=90.0), 7.5))
    assert options == {
        "grpc.initial_reconnect_backoff_ms": 250,
        "grpc.max_reconnect_backoff_ms": 90_000,
        "grpc.min_reconnect_backoff_ms": 7_500,
        "grpc.enable_retries": 0,
    }
    transport = Transport(
        "127.0.0.1:1", Credentials.insecure_bearer("t"), timeout_seconds=7.5, backoff=BACKOFF
    )
    try:
        assert dict(transport.options)["grpc.max_reconnect_backoff_ms"] == 60_000
    finally:
        transport.close()


def test_failed_connection_gets_a_fresh_channel() -> None:
    """No server: each call fails and the next one uses a new channel (one connect each)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens once closed
    transport = Transport(f"127.0.0.1:{port}", Credentials.insecure_bearer("t"), timeout_seconds=5)
    try:
        for expected in (2, 3):
            with pytest.raises(Exception) as info:
                transport.submit_raw([b""])
            assert getattr(info.value, "code", None) == grpc.StatusCode.UNAVAILABLE
            assert transport.channels_opened == expected
    finally:
        transport.close()


def test_one_send_slot_and_one_stored_pause_across_senders(store: DeviceStore) -> None:
    """Two gates on one state file (two processes): the stored row decides for both."""
    outbox = Outbox(store)
    _add(store, 4)
    a, b = _gate(store), _gate(store)
    assert len(outbox.claim_due(a, 1000.0, 2)) == 2  # a's call is in flight
    assert outbox.claim_due(b, 1000.0, 2) == []  # b waits for it
    assert b.resume_at == 1000.0 + 0.05  # and looks again soon
    with store.transaction() as conn:
        a.failed(conn, now=1001.0, retry_after=30.0)  # a's call refused with a hint
    assert outbox.claim_due(b, 1002.0, 2) == []  # a's stored pause holds b back
    assert b.resume_at >= 1031.0 and b.failures == 1
    assert len(outbox.claim_due(b, 1031.5, 2)) == 2  # the pause is over: b sends the probe
    assert outbox.claim_due(a, 1031.5, 2) == []  # only one probe
    with store.transaction() as conn:
        b.succeeded(conn, now=1032.0)
    assert len(outbox.claim_due(a, 1032.0, 2)) == 2 and a.failures == 0


def test_a_claim_lapses_and_a_sender_ignores_its_own(store: DeviceStore) -> None:
    outbox = Outbox(store)
    _add(store, 2)
    a, b = _gate(store), _gate(store)
    assert outbox.claim_due(a, 1000.0, 1)  # then a's process dies mid-call
    assert outbox.claim_due(a, 1000.0, 1)  # its own stale claim does not block a
    assert outbox.claim_due(b, 1000.0 + a.lease_seconds - 1, 1) == []
    assert outbox.claim_due(b, 1000.0 + a.lease_seconds + 1, 1)  # lapsed


def test_a_claim_is_not_fsynced_and_durability_is_restored(store: DeviceStore) -> None:
    statements: list[str] = []
    _add(store, 1)
    gate = _gate(store)
    store._conn.set_trace_callback(statements.append)
    assert Outbox(store).claim_due(gate, 1000.0, 1)
    store._conn.set_trace_callback(None)
    assert statements[0] == "PRAGMA synchronous=NORMAL"
    assert statements[-1] == "PRAGMA synchronous=FULL"
    assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


# --- the OS lock (flock on the state folder): the send slot where the platform has one ---


def _locked_gate(store: DeviceStore, now: float = 1000.0) -> SendGate:
    gate = SendGate("collector:443", BACKOFF, random.Random(1), slot=SendSlot(store.path.parent))
    with store.transaction() as conn:
        gate.load(conn, now=now)
    return gate


@pytest.mark.skipif(not send_slot.available(), reason="flock not available")
def test_os_lock_one_call_in_flight_and_the_outcome_before_the_next(store: DeviceStore) -> None:
    """Two Clients' gates on one folder (separate descriptors): the lock decides."""
    outbox = Outbox(store)
    _add(store, 4)
    a, b = _locked_gate(store), _locked_gate(store)
    try:
        assert len(outbox.claim_due(a, 1000.0, 2)) == 2 and a.slot is not None and a.slot.held
        assert outbox.claim_due(b, 1000.0, 2) == [] and b.busy
        assert b.resume_at == 1000.0 + 0.05  # looks again soon
        with store.transaction() as conn:
            a.failed(conn, now=1001.0, retry_after=30.0)
        a.release()  # after the outcome's commit
        assert outbox.claim_due(b, 1002.0, 2) == []  # the stored pause holds b back
        assert not b.busy and b.resume_at >= 1031.0 and b.slot is not None and not b.slot.held
        assert len(outbox.claim_due(b, 1031.5, 2)) == 2  # the probe
        assert outbox.claim_due(a, 1031.5, 2) == []  # only one
        with store.transaction() as conn:
            b.succeeded(conn, now=1032.0)
        b.release()
        assert len(outbox.claim_due(a, 1032.0, 2)) == 2 and a.failures == 0
    finally:
        for gate in (a, b):
            assert gate.slot is not None
            gate.slot.close()


@pytest.mark.skipif(not send_slot.available(), reason="flock not available")
def test_os_lock_claim_reads_only_and_a_clean_success_writes_nothing(
    store: DeviceStore,
) -> None:
    statements: list[str] = []
    _add(store, 1)
    gate = _locked_gate(store)
    try:
        store._conn.set_trace_callback(statements.append)
        assert Outbox(store).claim_due(gate, 1000.0, 1)
        with store.transaction() as conn:
            gate.succeeded(conn, now=1000.5)
        store._conn.set_trace_callback(None)
        assert statements[0] == "BEGIN" and "BEGIN IMMEDIATE" in statements  # the success's
        assert not [s for s in statements if "meta" in s and not s.startswith("SELECT")]
        assert (
            store._conn.execute("SELECT COUNT(*) FROM meta WHERE key LIKE 'send_gate%'").fetchone()[
                0
            ]
            == 0
        )
    finally:
        assert gate.slot is not None
        gate.slot.close()


@pytest.mark.skipif(not send_slot.available(), reason="flock not available")
def test_os_lock_is_released_when_its_descriptor_closes(tmp_path: Path) -> None:
    a, b = SendSlot(tmp_path), SendSlot(tmp_path)
    assert a.try_acquire() and a.try_acquire()  # again while held: still ours
    assert not b.try_acquire()
    a.close()  # as the kernel does when the holder dies
    assert b.try_acquire()
    b.release()
    b.release()  # idempotent
    b.close()
    with pytest.raises(OSError, match="closed"):
        b.try_acquire()
