"""The SQLite ledger's ingestion connection and its pipelined durability.

Group commit (committer.py) makes one transaction per group of requests. On
SQLite with ``synchronous=FULL`` every COMMIT also waits for an fsync of the
write-ahead log while holding the database's write lock, so the next group
cannot start until the disk has answered. This module separates the two, the
way database servers pipeline their group commit:

* the ingestion transactions run on one dedicated DBAPI connection with
  ``synchronous=NORMAL``: COMMIT writes the transaction's WAL frames (a
  ``write``, no fsync) and releases the write lock at once;
* `IngestConnection.make_durable` then fsyncs the WAL file. Any fsync that
  starts after a COMMIT returned covers that transaction's frames, so one fsync
  makes every transaction committed before it durable; the collector
  acknowledges a request only after `make_durable` returned for its commit.

Why this keeps synchronous=FULL's guarantee for everything acknowledged
(SQLite's documentation of ``PRAGMA synchronous`` and of the WAL format,
https://sqlite.org/pragma.html#pragma_synchronous and
https://sqlite.org/fileformat2.html#walformat): with NORMAL, SQLite still syncs
the WAL before each checkpoint, the database file after each checkpoint, and
the WAL header when the log is restarted; the only sync it skips is the one at
COMMIT, which `make_durable` performs before any acknowledgement. WAL frames
carry cumulative checksums, so recovery after a power loss keeps a prefix of
the committed transactions: a transaction that was never acknowledged may be
lost (its device resends it), one that was acknowledged never is. A
transaction that read rows of a not-yet-durable one (a DUPLICATE, a spend
total) is acknowledged only after an fsync issued after its own COMMIT, which
covers both. A process crash (kill -9) loses nothing committed: the frames are
in the kernel's page cache.

An fsync error is fatal for durability (after a failed fsync Linux may drop the
dirty pages it could not write): `make_durable` raises `DurabilityError`, and
the collector refuses every later request instead of acknowledging reports
whose storage it cannot vouch for.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from pathlib import Path

#: WAL pages after which a COMMIT checkpoints the log into the database file
#: (SQLite's default is 1000; a larger log writes a page that many groups modify
#: back to the database once instead of once per 1000 pages of log).
WAL_AUTOCHECKPOINT_PAGES = 4000


class DurabilityError(OSError):
    """fsync of the ledger's write-ahead log failed: committed data may not be on disk."""


class IngestConnection:
    """One SQLite connection for ingestion transactions, and the WAL fsync.

    Thread-safe: `lock` serializes transactions on the connection (the group
    committer is the only writer in a collector, tests may call from several
    threads); `make_durable` may run on another thread at the same time.
    """

    def __init__(self, database: str) -> None:
        self.path = Path(database)
        self.wal_path = Path(f"{database}-wal")
        self.lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._committed = 0  # transactions committed on this connection
        self._durable = 0  # of those, how many an fsync has covered
        self._wal_fd: int | None = None
        self._wal_inode: int | None = None

    def connection(self) -> sqlite3.Connection:
        """The open connection (opened on first use). Call with `lock` held."""
        if self._conn is None:
            conn = sqlite3.connect(
                str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0
            )
            conn.execute("PRAGMA journal_mode=WAL")
            # COMMIT writes the frames without an fsync; make_durable syncs them.
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES}")
            # Report ids are random: every insert touches a random leaf of the id index.
            conn.execute("PRAGMA cache_size=-32768")
            self._conn = conn
        return self._conn

    def committed(self) -> int:
        """Count a COMMIT that just returned; its sequence number for `make_durable`.

        Call with `lock` held, right after the COMMIT.
        """
        self._committed += 1
        return self._committed

    def make_durable(self, sequence: int) -> None:
        """Return once the transaction numbered `sequence` (and every earlier one) is
        on disk: one fsync of the WAL, unless a later fsync already covered it.

        Raises DurabilityError when the fsync fails.
        """
        if self._durable >= sequence:
            return
        with self._sync_lock:
            if self._durable >= sequence:
                return
            # Every transaction counted so far had returned from COMMIT, so its frames
            # were written to the WAL before this fsync starts.
            target = self._committed
            try:
                self._fsync_log()
            except OSError as exc:
                raise DurabilityError(
                    exc.errno, f"fsync of the ledger's write-ahead log failed: {exc.strerror}"
                ) from exc
            self._durable = target

    def _fsync_log(self) -> None:
        try:
            inode = os.stat(self.wal_path).st_ino
        except FileNotFoundError:
            # No log (every connection closed and SQLite folded it back): the
            # committed data is in the database file itself.
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        if inode != self._wal_inode:
            # A new log file: its directory entry must be durable too.
            self._close_log()
            self._wal_fd = os.open(self.wal_path, os.O_RDONLY | os.O_CLOEXEC)
            self._wal_inode = os.fstat(self._wal_fd).st_ino
            directory = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        assert self._wal_fd is not None
        os.fsync(self._wal_fd)

    def _close_log(self) -> None:
        if self._wal_fd is not None:
            os.close(self._wal_fd)
            self._wal_fd = self._wal_inode = None

    def close(self) -> None:
        """Close the connection (after making everything committed durable)."""
        with self.lock:
            if self._conn is not None:
                self.make_durable(self._committed)
                self._conn.close()
                self._conn = None
            with self._sync_lock:
                self._close_log()
