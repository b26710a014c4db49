"""The device state file: durability settings, schema guard, exact budget ledger, memo rules."""

from __future__ import annotations

import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import (
    MAX_EVENTS,
    SCHEMA_VERSION,
    STATE_FILE_NAME,
    DeviceStore,
    Event,
    StateError,
    StoredPolicy,
)


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "state")
    yield s
    s.close()


def test_wal_and_full_sync(store: DeviceStore) -> None:
    with store.transaction() as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert store.path.name == STATE_FILE_NAME
    assert (store.path.stat().st_mode & 0o777) == 0o600
    assert (store.path.parent.stat().st_mode & 0o777) == 0o700


def test_newer_schema_is_refused_and_left_untouched(tmp_path: Path) -> None:
    s = DeviceStore(tmp_path)
    with s.transaction() as conn:
        DeviceStore.set_meta(conn, "schema_version", str(SCHEMA_VERSION + 1))
    s.close()
    before = (tmp_path / STATE_FILE_NAME).read_bytes()
    with pytest.raises(StateError, match="newer than this SDK"):
        DeviceStore(tmp_path)
    assert (tmp_path / STATE_FILE_NAME).read_bytes() == before


def test_not_a_database(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE_NAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StateError, match="not a usable"):
        DeviceStore(tmp_path)


def test_budget_is_exact_decimal_text(store: DeviceStore) -> None:
    with store.transaction() as conn:
        for _ in range(3):
            DeviceStore.charge(conn, "p", 0, 86400, Decimal("0.1"))
    with store.transaction() as conn:
        assert DeviceStore.spent(conn, "p", 0) == Decimal("0.3")  # 0.1+0.1+0.1 exactly
        assert conn.execute("SELECT typeof(spent) FROM budget").fetchone()[0] == "text"
        assert DeviceStore.spent(conn, "p", 86400) == 0
    (row,) = store.budget_rows()
    assert (row.spent, row.reports, row.window_seconds) == (Decimal("0.3"), 3, 86400)


def test_budget_sums_never_round(store: DeviceStore) -> None:
    tiny = Decimal("0.0000000000000000000000000000001")  # 1e-31: lost at 28 digits
    with store.transaction() as conn:
        DeviceStore.charge(conn, "p", 0, 60, Decimal(1))
        total = DeviceStore.charge(conn, "p", 0, 60, tiny)
    assert str(total) == "1.0000000000000000000000000000001"
    assert Decimal(1) + tiny == Decimal(1)  # what the default 28-digit context would store
    assert store.budget_rows()[0].spent == total


def test_failed_transaction_changes_nothing(store: DeviceStore) -> None:
    with pytest.raises(RuntimeError), store.transaction() as conn:
        DeviceStore.charge(conn, "p", 0, 60, Decimal(1))
        raise RuntimeError("boom")
    assert store.budget_rows() == []


def _policy(version: int, digest: bytes = b"d" * 32) -> StoredPolicy:
    return StoredPolicy("p", version, "m", b"env", digest, Decimal("0.5"), 10, 1)


def test_highest_version_only_grows(store: DeviceStore) -> None:
    with store.transaction() as conn:
        DeviceStore.save_policy(conn, _policy(3))
        DeviceStore.save_policy(conn, _policy(2))  # stale write: ignored for both tables
    assert store.highest_versions() == {"p": 3}
    assert [p.version for p in store.policies()] == [3]
    with store.transaction() as conn:
        DeviceStore.delete_policy(conn, "p")
    assert store.policies() == []
    assert store.highest_versions() == {"p": 3}  # rollback floor survives deletion


def test_memo_is_permanent_and_keyed_by_hmac(store: DeviceStore, tmp_path: Path) -> None:
    with store.transaction() as conn:
        key = store.memo_key(conn, "p", b"3")
        assert key != store.memo_key(conn, "p", b"4")
        assert key != store.memo_key(conn, "q", b"3")
        DeviceStore.save_memo(conn, "p", "scope", key, b"first")
        DeviceStore.save_memo(conn, "p", "scope", key, b"second")
        assert DeviceStore.load_memo(conn, "p", "scope", key) == b"first"
        assert DeviceStore.load_memo(conn, "p", "other", key) is None
    # A second state file has its own secret: keys differ for the same value.
    other = DeviceStore(tmp_path / "other")
    with other.transaction() as conn:
        assert other.memo_key(conn, "p", b"3") != key
    other.close()


def test_events_are_bounded_and_counters_kept(store: DeviceStore) -> None:
    with store.transaction() as conn:
        for i in range(MAX_EVENTS + 5):
            DeviceStore.add_event(conn, Event(i, "record_refused", "OUTBOX_FULL", f"n{i}"))
            DeviceStore.bump(conn, "dropped_outbox_full")
    events = store.events(limit=MAX_EVENTS + 100)
    assert len(events) == MAX_EVENTS
    assert events[0].detail == f"n{MAX_EVENTS + 4}"
    assert store.counters() == {"dropped_outbox_full": MAX_EVENTS + 5}


def test_closed_store_refuses(store: DeviceStore) -> None:
    store.close()
    store.close()
    with pytest.raises(StateError, match="closed"):
        store.counters()


def test_two_connections_serialize_writes(tmp_path: Path) -> None:
    a, b = DeviceStore(tmp_path), DeviceStore(tmp_path)
    with a.transaction() as conn:
        DeviceStore.charge(conn, "p", 0, 60, Decimal("0.25"))
        # b cannot start a write transaction while a holds one.
        raw = sqlite3.connect(tmp_path / STATE_FILE_NAME, timeout=0.05, isolation_level=None)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            raw.execute("BEGIN IMMEDIATE")
        raw.close()
    with b.transaction() as conn:
        assert DeviceStore.spent(conn, "p", 0) == Decimal("0.25")
    a.close()
    b.close()
