"""Engine and connection setup: ledger URLs, `open_ledger`'s access modes, the
retrying unit of work, and the DBAPI driver the hot path runs statements on.

`LedgerCore` is the base every part of `Ledger` builds on: it opens the
engines (SQLite: WAL, synchronous=FULL, BEGIN IMMEDIATE, and the ingestion
connection of sqlite_ingest.py; PostgreSQL: READ COMMITTED or SERIALIZABLE
writes and REPEATABLE READ read-only snapshots), migrates or checks the schema
revision, loads restore gaps, and runs every transaction with retries.
"""

from __future__ import annotations

import os
import random
import socket
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import (
    Any,
    NoReturn,
    TypeVar,
)

import sqlalchemy as sa
from fedldp.client.device_store import read_only_uri
from fedldp.collector.ledger import migrate, restore
from fedldp.collector.ledger.model import (
    Access,
    LedgerOpenError,
)
from fedldp.collector.ledger.schema import (
    ledger_info,
)
from fedldp.collector.ledger.sql import (
    _in_statement,
    _statements,
)
from fedldp.collector.ledger.sqlite_ingest import BUSY_TIMEOUT_MS, IngestConnection, ensure_wal
from sqlalchemy import event
from sqlalchemy.dialects import sqlite as sqlite_dialect

T = TypeVar("T")

#: PostgreSQL SQLSTATEs after which a transaction is simply rerun.
_PG_RETRYABLE = {"40001", "40P01", "23505"}
_MAX_ATTEMPTS = 64


class _Driver:
    """Statements on the DBAPI cursor of a connection's current transaction.

    The ingestion hot path runs a handful of fixed statements per group commit;
    going to the driver's cursor directly skips SQLAlchemy's per-statement
    result processing. Driver errors are raised as SQLAlchemy's `DBAPIError`
    subclasses (as `Connection.exec_driver_sql` would, parameters hidden), so the
    retry logic and callers see the same exceptions.
    """

    __slots__ = ("_cursor", "_error")

    def __init__(self, dbapi_connection: Any, error: type[Exception]) -> None:
        self._cursor = dbapi_connection.cursor()
        self._error = error

    def _raise(self, sql: str, exc: Exception) -> NoReturn:
        raise sa.exc.DBAPIError.instance(sql, None, exc, self._error, hide_parameters=True) from exc

    def execute(self, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        """Run one statement; its rows."""
        try:
            self._cursor.execute(sql, params)
            rows: list[Any] = self._cursor.fetchall()
            return rows
        except self._error as exc:
            self._raise(sql, exc)

    def run(self, sql: str, params: Sequence[Any]) -> int:
        """Run one statement that returns no rows; the number of rows it changed."""
        try:
            self._cursor.execute(sql, params)
        except self._error as exc:
            self._raise(sql, exc)
        return int(self._cursor.rowcount)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run one statement per row; the number of rows changed."""
        try:
            self._cursor.executemany(sql, rows)
        except self._error as exc:
            self._raise(sql, exc)
        return int(self._cursor.rowcount)

    def copy(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Stream `rows` with a ``COPY … FROM STDIN`` statement (PostgreSQL)."""
        try:
            with self._cursor.copy(sql) as stream:
                for row in rows:
                    stream.write_row(row)
        except self._error as exc:
            self._raise(sql, exc)

    def close(self) -> None:
        self._cursor.close()


def default_shard() -> str:
    """A collector instance id: host name and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


class _SaConn:
    """`_Driver.execute` over a SQLAlchemy connection (reads outside the hot path)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any]) -> Iterable[Any]:
        """Run one statement (driver SQL); its rows."""
        return self._conn.exec_driver_sql(sql, tuple(params)).all()


class _ConcurrentUpdateError(Exception):
    """A compare-and-set update found a row changed since it was read: rerun."""


class _StoredIdError(_ConcurrentUpdateError):
    """A group that did not read its ids first found one stored before (its insert
    failed on the primary key): rerun, reading them."""


def _configure_sqlite(engine: sa.Engine, *, begin: str, read_only: bool = False) -> None:
    """A busy timeout (first: any later statement may wait on another process's
    lock), synchronous=FULL, and our own BEGIN statement; `read_only` adds
    ``PRAGMA query_only`` (belt and braces over the read-only file handle). The
    journal mode is the database file's, set once (`sqlite_ingest.ensure_wal`),
    not per connection."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS:d}")
        if read_only:
            cur.execute("PRAGMA query_only=ON")
        cur.execute("PRAGMA synchronous=FULL")
        # 32 MiB page cache per connection (default 2 MiB): report ids are random, so
        # every insert touches a random leaf of the id index.
        cur.execute("PRAGMA cache_size=-32768")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql(begin)


def parse_ledger_url(url: str) -> sa.URL:
    """The SQLAlchemy URL `url`, or LedgerOpenError saying what a ledger URL looks like."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise LedgerOpenError(
            f"cannot parse the ledger URL {url!r}: expected sqlite:////ABSOLUTE/PATH/ledger.db "
            "or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise LedgerOpenError(
            f"unsupported ledger database {parsed.get_backend_name()!r} in "
            f"{parsed.render_as_string(hide_password=True)}: use sqlite or postgresql"
        )
    return parsed


def create_private_sqlite_file(path: Path) -> bool:
    """Create `path` empty with mode 0600 unless it exists; whether it was created.

    Every command that makes a SQLite ledger file (the collector, `ledger init`,
    `migrate`, `backup`, `restore`, the demo) creates it here first, whatever the
    umask: SQLite then gives the ``-wal``, ``-shm`` and ``-journal`` files it
    makes beside it the database file's mode, so none is readable by other users.
    An existing file keeps its mode. LedgerOpenError when `path` is a folder or
    its folder does not exist.
    """
    if path.is_dir():
        raise LedgerOpenError(f"{path} is a folder; the ledger URL must name a file")
    if not path.parent.is_dir():
        raise LedgerOpenError(
            f"folder {path.parent} does not exist: create it first (ledger {path})"
        )
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        return False
    return True


#: The first 16 bytes of every SQLite database file.
SQLITE_HEADER = b"SQLite format 3\x00"


def refuse_if_not_sqlite(path: Path) -> None:
    """LedgerOpenError when `path` holds bytes that are not a SQLite database (an
    empty file is a new one). Checked before anything is created beside it (the
    writer lock file, SQLite's -wal and -shm), so a mistyped path to some other
    file leaves nothing behind."""
    try:
        with path.open("rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LedgerOpenError(f"cannot read the ledger file {path}: {exc.strerror}") from None
    if head and head != SQLITE_HEADER:
        raise LedgerOpenError(
            f"{path} is not a SQLite database (it does not start with SQLite's header): "
            "check the ledger URL"
        )


def _prepare_sqlite_file(parsed: sa.URL, access: Access) -> Path:
    """The SQLite ledger file of `parsed`, checked for `access`.

    "create": the folder must exist; a new file is created empty with mode 0600
    before SQLite opens it (SQLite gives its -wal and -shm files the database
    file's mode), so a ledger is never readable by other users. "write" and
    "read": the file must exist ("read" opens it with `_read_only_engine`).
    """
    path = Path(parsed.database or "")
    if path.is_dir():
        raise LedgerOpenError(f"{path} is a folder; the ledger URL must name a file")
    refuse_if_not_sqlite(path)
    if access == "create":
        create_private_sqlite_file(path)
    elif not path.is_file():
        raise LedgerOpenError(
            f"no ledger at {path} (the file does not exist): check the URL; a new ledger "
            "is created by `fedldp ledger init` or the collector"
        )
    return path


def _read_only_engine(path: Path) -> sa.Engine:
    """An engine that reads the SQLite ledger `path` and can never write it or
    create anything beside it: every connection is opened afresh (no pool) with
    `device_store.read_only_uri`, decided at that moment (``mode=ro`` through the
    live ``-wal`` of a running collector; ``immutable=1`` when no ``-wal`` exists,
    so SQLite creates no ``-wal``/``-shm`` files), then ``PRAGMA query_only``.
    A fresh connection per transaction keeps a long-lived reader (the dashboard)
    from holding an ``immutable`` connection after a collector starts."""

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(
            read_only_uri(path),
            uri=True,
            timeout=BUSY_TIMEOUT_MS / 1000,
            check_same_thread=False,
        )

    engine = sa.create_engine("sqlite://", creator=connect, poolclass=sa.pool.NullPool)
    _configure_sqlite(engine, begin="BEGIN", read_only=True)
    return engine


def _check_revision(engine: sa.Engine, parsed: sa.URL) -> None:
    """LedgerOpenError unless the database at `engine` is a ledger at this code's head."""
    shown = parsed.render_as_string(hide_password=True)
    try:
        with engine.connect() as probe:
            at = migrate.current_revision(probe)
    except sa.exc.DatabaseError as exc:
        detail = str(getattr(exc, "orig", exc)).splitlines()[0]
        raise LedgerOpenError(f"cannot read the ledger {shown}: {detail}") from None
    head = migrate.head_revision()
    if at is None:
        raise LedgerOpenError(
            f"{shown} is not a fedldp ledger (no schema): check the URL, or create one "
            "with `fedldp ledger init`"
        )
    if at != head:
        raise LedgerOpenError(
            f"ledger {shown} is at migration {at!r}, this fedldp expects {head!r}: "
            "run `fedldp ledger migrate` (or upgrade fedldp if the ledger is newer)"
        )


class LedgerCore:
    """A ledger's engines, schema check and unit of work (the base of `Ledger`)."""

    def __init__(
        self,
        url: str,
        *,
        shard: str | None = None,
        pool_size: int = 8,
        isolation: str | None = None,
        access: Access = "create",
    ) -> None:
        self.url = url
        self.shard = shard or default_shard()
        self.access = access
        parsed = parse_ledger_url(url)
        self.dialect = parsed.get_backend_name()
        self._ingest: IngestConnection | None
        if self.dialect == "sqlite":
            database = parsed.database or ""
            if isolation is not None:
                raise LedgerOpenError("isolation applies to PostgreSQL; SQLite serializes writers")
            self.isolation = "SERIALIZABLE"  # one writer at a time (BEGIN IMMEDIATE)
            if database in ("", ":memory:") or database.startswith("file::memory:"):
                raise LedgerOpenError(
                    "the ledger needs a durable SQLite file, not an in-memory database: "
                    "use sqlite:////ABSOLUTE/PATH/ledger.db"
                )
            path = _prepare_sqlite_file(parsed, access)
            if access == "read":  # one engine; no ingestion connection (it opens read-write)
                self._write_engine = self._read_engine = _read_only_engine(path)
                self._ingest = None
            else:
                url = parsed.render_as_string(hide_password=False)
                # LIFO: the committer thread gets back the connection it just used, whose
                # page cache is still valid (SQLite drops a connection's cache when
                # another connection wrote since its last transaction).
                self._write_engine = sa.create_engine(
                    url, pool_size=pool_size, max_overflow=0, pool_use_lifo=True
                )
                self._read_engine = sa.create_engine(url, pool_size=pool_size, max_overflow=4)
                _configure_sqlite(self._write_engine, begin="BEGIN IMMEDIATE")
                _configure_sqlite(self._read_engine, begin="BEGIN")
                self._ingest = IngestConnection(database)
                ensure_wal(self._ingest)  # before any engine connects (the migrations)
        elif self.dialect == "postgresql":
            self._ingest = None
            isolation = isolation or "READ COMMITTED"
            if isolation not in ("READ COMMITTED", "SERIALIZABLE"):
                raise LedgerOpenError("isolation is 'READ COMMITTED' (locking) or 'SERIALIZABLE'")
            self.isolation = isolation
            self._write_engine = sa.create_engine(
                url,
                isolation_level=isolation,
                pool_size=pool_size,
                max_overflow=4,
                pool_pre_ping=True,
            )
            if access == "read":  # every transaction read-only: a write fails
                self._write_engine = self._write_engine.execution_options(postgresql_readonly=True)
            # Reads (reconcile, statistics, show) see one snapshot.
            self._read_engine = self._write_engine.execution_options(
                isolation_level="REPEATABLE READ", postgresql_readonly=True
            )
        else:
            raise LedgerOpenError(
                f"unsupported ledger database {self.dialect!r}: use sqlite or postgresql"
            )
        if access == "create":
            migrate.upgrade(self._write_engine)
        else:
            _check_revision(self._read_engine, parsed)
        #: Gaps of restores from backups (restore.py): charges in a window that
        #: overlaps one are refused. Read once: a restore happens with the
        #: collectors stopped, and a database whose restore has not recorded its
        #: gap yet is never opened (RestoreIncompleteError, restore.py).
        with self._read_engine.connect() as connection:
            restore.check_complete(connection)
            self.restore_gaps = restore.load_gaps(connection)
        self._dbapi_error: type[Exception] = self._write_engine.dialect.loaded_dbapi.Error
        self._sql = _statements(self.dialect)
        self._in_sql_cache: dict[tuple[str, int], str] = {}
        self.retries = 0  # serialization failures retried so far (observability)

    def _in_sql(self, name: str, size: int) -> str:
        """The hot-path read `name` with an IN list of `size` (`sql.in_statement`), cached."""
        sql = self._in_sql_cache.get((name, size))
        if sql is None:
            sql = self._in_sql_cache[(name, size)] = _in_statement(self.dialect, name, size)
        return sql

    # -- lifecycle --

    def close(self) -> None:
        """Release every connection."""
        if self._ingest is not None:
            self._ingest.close()
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()

    # -- the unit of work --

    def _retryable(self, exc: sa.exc.DBAPIError) -> bool:
        if self.dialect == "postgresql":
            return getattr(exc.orig, "sqlstate", None) in _PG_RETRYABLE
        return isinstance(exc, sa.exc.OperationalError) and "locked" in str(exc.orig)

    def transaction(self, fn: Callable[[sa.Connection], T], *, write: bool = True) -> T:
        """Run `fn` in one transaction, rerunning it on a serialization failure.

        `fn` must be safe to rerun: it reads what it needs inside the transaction
        and has no effect outside it.
        """
        engine = self._write_engine if write else self._read_engine

        def attempt() -> T:
            with engine.begin() as conn:
                return fn(conn)

        return self._retrying(attempt)

    def _retrying(self, attempt: Callable[[], T]) -> T:
        """`attempt()`, rerun (with jittered backoff) after a retryable failure."""
        failures = 0
        while True:
            try:
                return attempt()
            except _StoredIdError:
                continue  # at once: the rerun reads the ids first, so this cannot repeat
            except (sa.exc.DBAPIError, _ConcurrentUpdateError) as exc:
                failures += 1
                retryable = isinstance(exc, _ConcurrentUpdateError) or self._retryable(exc)
                if not retryable or failures >= _MAX_ATTEMPTS:
                    raise
                self.retries += 1
                # Jittered exponential backoff (capped at ~50 ms).
                time.sleep(random.uniform(0, min(0.05, 0.0005 * 2 ** min(failures, 10))))

    def ledger_id(self) -> str:
        """This ledger's identity (a UUID drawn when its schema was created). Read once
        per open ledger: the schema writes it once (migration 0003) and nothing
        changes it, so every receipt need not read it again."""
        found: str | None = getattr(self, "_ledger_id", None)
        if found is not None:
            return found

        def tx(conn: sa.Connection) -> str:
            value = conn.execute(
                sa.select(ledger_info.c.value).where(ledger_info.c.key == "ledger_id")
            ).scalar_one()
            return str(value)

        self._ledger_id: str | None = self.transaction(tx, write=False)
        return self._ledger_id

    def _insert_ignore(self, table: sa.Table) -> Any:
        if self.dialect == "postgresql":
            # Imported here: a process on a SQLite ledger never loads the PostgreSQL
            # dialects (≈ 0.06 CPU-s); a PostgreSQL engine has loaded them already.
            from sqlalchemy.dialects import postgresql as pg_dialect

            return pg_dialect.insert(table).on_conflict_do_nothing()
        return sqlite_dialect.insert(table).on_conflict_do_nothing()
