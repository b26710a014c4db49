"""The device state file: durability settings, schema guard, exact budget ledger, memo rules."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client import device_store
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
def store(tmp_path: Path) -> Iterator[DeviceStore]:
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


# --- creating and opening the state file ---


def _schema(path: Path) -> set[tuple[str, str, str]]:
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    finally:
        conn.close()
    return {(str(t), str(n), str(s)) for t, n, s in rows}


def test_a_new_file_is_complete_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path / "s")
    with store.transaction() as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert DeviceStore.read_meta(conn, "schema_version") == str(SCHEMA_VERSION)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store.close()
    names = {p.name for p in (tmp_path / "s").iterdir()}
    assert names <= {STATE_FILE_NAME, STATE_FILE_NAME + "-wal", STATE_FILE_NAME + "-shm"}


def test_template_and_statement_by_statement_schemas_are_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    DeviceStore(tmp_path / "template").close()
    # Without Connection.serialize (Python 3.10) the file is made statement by statement.
    monkeypatch.setattr(device_store, "_template", [None])
    DeviceStore(tmp_path / "statements").close()
    assert _schema(tmp_path / "template" / STATE_FILE_NAME) == _schema(
        tmp_path / "statements" / STATE_FILE_NAME
    )


def test_an_existing_file_is_never_replaced_by_the_template(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    with store.transaction() as conn:
        DeviceStore.bump(conn, "recorded", 7)
    store.close()
    before = (tmp_path / STATE_FILE_NAME).read_bytes()
    # Another process created the file between our existence check and our link.
    device_store._create_from_template(tmp_path / STATE_FILE_NAME)
    assert (tmp_path / STATE_FILE_NAME).read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".new")] == []
    reopened = DeviceStore(tmp_path)
    assert reopened.counters() == {"recorded": 7}
    reopened.close()


def test_a_file_from_before_user_version_is_upgraded_in_place(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    with store.transaction() as conn:
        DeviceStore.bump(conn, "recorded", 3)
        secret = store.memo_secret(conn)
        conn.execute("PRAGMA user_version=0")  # as written by the first SDK release
    store.close()
    store = DeviceStore(tmp_path)
    with store.transaction() as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert store.memo_secret(conn) == secret
    assert store.counters() == {"recorded": 3}
    store.close()


def test_a_newer_user_version_is_refused_and_left_untouched(tmp_path: Path) -> None:
    DeviceStore(tmp_path).close()
    conn = sqlite3.connect(tmp_path / STATE_FILE_NAME)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    before = (tmp_path / STATE_FILE_NAME).read_bytes()
    with pytest.raises(StateError, match="newer than this SDK"):
        DeviceStore(tmp_path)
    assert (tmp_path / STATE_FILE_NAME).read_bytes() == before


def test_the_memo_secret_is_made_once_and_kept(tmp_path: Path) -> None:
    store = DeviceStore(tmp_path)
    with store.transaction() as conn:
        assert DeviceStore.read_meta(conn, "memo_secret") is None  # nothing device-specific yet
        secret = store.memo_secret(conn)
        assert len(secret) == 32 and store.memo_secret(conn) == secret
    store.close()
    store = DeviceStore(tmp_path)
    with store.transaction() as conn:
        assert store.memo_secret(conn) == secret
    store.close()
