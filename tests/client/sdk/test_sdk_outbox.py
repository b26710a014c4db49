"""The outbox: bounded (refuse new), ordered, exact bytes kept, outcomes applied."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import DeviceStore
from fedldp.client.outbox import Outbox, OutboxFullError


@pytest.fixture
def outbox(tmp_path: Path) -> Iterator[Outbox]:
    store = DeviceStore(tmp_path)
    yield Outbox(store, max_reports=3)
    store.close()


def _add(outbox: Outbox, payload: bytes) -> bytes:
    rid = secrets.token_bytes(16)
    with outbox.store.transaction() as conn:
        outbox.ensure_room(conn)
        Outbox.add(
            conn,
            report_id=rid,
            policy_id="p",
            policy_version=1,
            window_start=0,
            epsilon=Decimal("0.5"),
            report=payload,
            created_at=7,
        )
    return rid


def test_bounds_validated(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="max_reports"):
            Outbox(store, max_reports=bad)  # type: ignore[arg-type]
    store.close()


def test_full_refuses_and_changes_nothing(outbox: Outbox) -> None:
    ids = [_add(outbox, bytes([i]) * 5) for i in range(3)]
    with pytest.raises(OutboxFullError, match="max_reports=3") as info:
        _add(outbox, b"x")
    assert info.value.reason == "OUTBOX_FULL"
    assert [e.report_id for e in outbox.entries()] == ids
    assert outbox.pending() == 3


def test_exact_bytes_and_order(outbox: Outbox) -> None:
    first = _add(outbox, b"\x00\x01first")
    second = _add(outbox, b"second")
    due = outbox.due(now=0, limit=10)
    expected = [(first, b"\x00\x01first"), (second, b"second")]
    assert [(e.report_id, e.report) for e in due] == expected
    assert due[0].epsilon == Decimal("0.5") and due[0].attempts == 0


def test_defer_acknowledge_refuse(outbox: Outbox) -> None:
    a, b, c = (_add(outbox, bytes([i])) for i in range(3))
    entries = {e.report_id: e for e in outbox.entries()}
    outbox.defer([(entries[a], 100.0), (entries[b], 5.0)], now=1000.0, error="UNAVAILABLE: x")
    assert [e.report_id for e in outbox.due(now=1000.0, limit=10)] == [c]
    assert [e.report_id for e in outbox.due(now=1005.0, limit=10)] == [b, c]
    assert outbox.next_due_at() == 0.0
    deferred = {e.report_id: e for e in outbox.entries()}
    assert deferred[a].attempts == 1 and deferred[a].last_error == "UNAVAILABLE: x"

    outbox.acknowledge([c], duplicates=1)
    event = outbox.refuse(deferred[b], outcome="OUTCOME_INVALID", detail="bad", now=9)
    assert event.report_id == b and event.kind == "report_refused"
    assert [e.report_id for e in outbox.entries()] == [a]
    assert outbox.next_due_at() == 1100.0
    counters = outbox.store.counters()
    assert counters["acknowledged"] == 1 and counters["acknowledged_duplicate"] == 1
    assert counters["refused"] == 1 and counters["refused_outcome_invalid"] == 1
    assert outbox.store.events()[0].reason == "OUTCOME_INVALID"


def test_survives_reopen(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    rid = _add(Outbox(store), b"persisted")
    store.close()
    again = DeviceStore(tmp_path)
    assert [(e.report_id, e.report) for e in Outbox(again).entries()] == [(rid, b"persisted")]
    again.close()


def test_acknowledge_can_read_the_schedule_in_its_transaction(outbox: Outbox) -> None:
    a, b = _add(outbox, b"a"), _add(outbox, b"b")
    entries = {e.report_id: e for e in outbox.entries()}
    outbox.defer([(entries[b], 50.0)], now=1000.0, error="UNAVAILABLE: x")
    assert outbox.schedule() == (0.0, 2)
    assert outbox.acknowledge([a]) is None  # not asked for: no extra read
    assert outbox.schedule() == (1050.0, 1)
    assert outbox.acknowledge([b], read_schedule=True) == (None, 0)  # as after the removal
    assert outbox.acknowledge([], read_schedule=True) is None
    assert outbox.schedule() == (None, 0) and outbox.next_due_at() is None
