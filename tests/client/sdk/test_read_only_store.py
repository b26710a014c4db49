"""`DeviceStore(read_only=True)`: what `fedldp client` inspection opens the state with.

Reading never writes: a read-only store creates, chmods, migrates and checkpoints
nothing, refuses a missing file and any schema but this code's (older or newer)
with a one-line StateError, and cannot write. The SDK's own (writer) store still
creates and migrates.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from fedldp.client.device_store import SCHEMA_VERSION, STATE_FILE_NAME, DeviceStore, StateError

from fedldp.cli import main


def _fingerprint(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        p.name: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


def _state(tmp_path: Path, *, user_version: int | None = None, meta: int | None = None) -> Path:
    """A closed state file in tmp_path/state, its schema markers optionally rewritten."""
    folder = tmp_path / "state"
    store = DeviceStore(folder)
    with store.transaction() as conn:
        DeviceStore.bump(conn, "recorded", 2)
        if meta is not None:
            DeviceStore.set_meta(conn, "schema_version", str(meta))
    store.close()
    if user_version is not None:
        conn = sqlite3.connect(folder / STATE_FILE_NAME)
        conn.execute(f"PRAGMA user_version={user_version:d}")
        conn.close()
    (folder / STATE_FILE_NAME).chmod(0o644)
    return folder


def test_read_only_reads_and_changes_nothing(tmp_path: Path) -> None:
    folder = _state(tmp_path)
    before = _fingerprint(folder)
    store = DeviceStore(folder, read_only=True)
    assert store.counters() == {"recorded": 2}
    assert store.checkpoint() is False
    with (
        pytest.raises(sqlite3.OperationalError, match=r"readonly|read-only|query_only"),
        store.transaction() as conn,
    ):
        DeviceStore.bump(conn, "recorded")
    store.close()
    assert _fingerprint(folder) == before  # mode 0644 kept, no -wal/-shm left behind


def test_a_missing_state_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="no fedldp device state"):
        DeviceStore(tmp_path / "typo", read_only=True)
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(StateError, match="no fedldp device state"):
        DeviceStore(tmp_path / "empty", read_only=True)
    assert list((tmp_path / "empty").iterdir()) == []


@pytest.mark.parametrize(
    ("user_version", "meta", "message"),
    [
        (0, None, "older than this fedldp"),
        (SCHEMA_VERSION + 1, None, "newer than this fedldp"),
        (None, SCHEMA_VERSION + 1, "newer than this SDK"),
    ],
)
def test_another_schema_is_refused_untouched(
    tmp_path: Path, user_version: int | None, meta: int | None, message: str
) -> None:
    folder = _state(tmp_path, user_version=user_version, meta=meta)
    before = _fingerprint(folder)
    with pytest.raises(StateError, match=message):
        DeviceStore(folder, read_only=True)
    result = CliRunner().invoke(main, ["client", "budget", "--state-dir", str(folder)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and message in result.output
    assert len(result.output.splitlines()) == 1
    assert _fingerprint(folder) == before


def test_the_writer_still_migrates_an_older_file(tmp_path: Path) -> None:
    folder = _state(tmp_path, user_version=0)
    DeviceStore(folder).close()
    conn = sqlite3.connect(folder / STATE_FILE_NAME)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    assert (folder / STATE_FILE_NAME).stat().st_mode & 0o777 == 0o600
    reader = DeviceStore(folder, read_only=True)
    assert reader.counters() == {"recorded": 2}
    reader.close()


@pytest.mark.parametrize("kind", ["not-sqlite", "other-sqlite"])
def test_a_file_that_is_not_a_state_file_is_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / STATE_FILE_NAME
    if kind == "not-sqlite":
        path.write_bytes(b"this is not sqlite" * 100)
    else:
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE t (x)")
        conn.close()
    before = _fingerprint(tmp_path)
    with pytest.raises(StateError, match=r"not a (usable )?fedldp device state file"):
        DeviceStore(tmp_path, read_only=True)
    assert _fingerprint(tmp_path) == before
