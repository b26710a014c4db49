"""The SQLite ledger's ingestion connection: one DBAPI connection for group commits.

The group committer (collector/committer.py) runs one transaction per group of
requests, back to back. Taking a pooled SQLAlchemy connection for each one
(checkout, the ``begin`` event, reset on return) costs more CPU than a small
group's statements, so ingestion keeps one sqlite3 connection of its own, with
the ledger's settings — WAL, ``synchronous=FULL`` (every COMMIT waits for the
fsync of the log: acknowledged means on disk), ``BEGIN IMMEDIATE`` — a page
cache that stays warm between groups, and a larger log between checkpoints.
Everything else (reads, operator writes) goes through the SQLAlchemy engines.

Several collector processes may ingest into one file (`processes` > 1): their
ingestion transactions queue on an advisory lock file beside the database
(``<database>-ingest.lock``, `flock`), taken before BEGIN IMMEDIATE, so a waiting
process wakes the moment the other commits instead of polling SQLite's busy
handler (which sleeps in steps of up to 100 ms). SQLite's own locking still
decides correctness; the lock only orders the writers that take it.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
from pathlib import Path

#: Page cache of the ingestion connection, KiB (SQLite's default is 2 MiB): report
#: ids are random, so every insert touches a random leaf of the id index.
CACHE_KIB = 32768
#: Log pages after which a COMMIT checkpoints the log into the database file
#: (SQLite's default is 1,000 pages = 4 MiB, i.e. after almost every group of a
#: few thousand reports). With 10,000 (≈ 40 MiB) a page that several groups
#: dirty is copied to the database once: ≈ 6% less collector CPU per report at
#: 100 reports per call in alternating A/B runs (bench.collector's load).
WAL_AUTOCHECKPOINT_PAGES = 10_000
#: How long a statement waits for another connection's (or process's) lock before
#: failing with "database is locked". Set first on every connection.
BUSY_TIMEOUT_MS = 30_000


def writer_lock_path(database: str | Path) -> Path:
    """The writer lock file of the SQLite database `database` (beside it)."""
    return Path(str(database) + "-ingest.lock")


class IngestConnection:
    """One SQLite connection for ingestion transactions, opened on first use.

    Thread-safe: `lock` serializes transactions on the connection (the group
    committer is the only writer in a collector; tests may call from several
    threads) and with the ingestion of other processes on the same file.
    """

    def __init__(self, database: str) -> None:
        self.path = Path(database)
        self.lock = WriterLock(writer_lock_path(self.path))
        self._conn: sqlite3.Connection | None = None

    def connection(self) -> sqlite3.Connection:
        """The open connection (opened on first use). Call with `lock` held."""
        if self._conn is None:
            conn = _connect(self.path)
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES:d}")
            self._conn = conn
        return self._conn

    def close(self) -> None:
        """Close the connection (every transaction on it has committed or rolled back)."""
        with self.lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        self.lock.close()


class WriterLock:
    """A lock held by one thread of one process at a time: a thread lock, then an
    exclusive `flock` on `path` (created if missing; never deleted, so every
    process locks the same inode). The kernel drops the `flock` if the process
    dies, so a killed collector never leaves the others waiting."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread_lock = threading.Lock()
        self._fd: int | None = None

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # releases the GIL while it waits
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self._fd is not None:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()

    def close(self) -> None:
        """Close the lock file (reopened on the next use)."""
        with self._thread_lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _connect(path: Path) -> sqlite3.Connection:
    """A connection whose first statement set the busy timeout (autocommit mode)."""
    conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=0)
    conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS:d}")
    return conn


def ensure_wal(ingest: IngestConnection) -> None:
    """Put the database file in WAL mode, once, when the ledger is opened.

    WAL is a property of the file (it persists), so it is set when the mode is not
    WAL yet — a new ledger — and never by every connection: changing the journal
    mode needs the database to itself, and SQLite answers "database is locked" at
    once, without its busy handler, when another process's connection holds the
    file meanwhile (two collector processes opening a new ledger together). The
    change is made holding the writer lock, which every process opening or
    ingesting into the file takes, so two openers never race on it.
    """
    with ingest.lock:
        conn = _connect(ingest.path)
        try:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if str(mode).lower() != "wal":
                mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"{ingest.path}: cannot use WAL (mode {mode})")
        finally:
            conn.close()
