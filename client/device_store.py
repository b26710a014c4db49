"""The device's durable state: one SQLite file in the SDK's state directory.

Everything the SDK must not forget across crashes and restarts lives here, in one
database, so that one transaction can make several changes atomically:

* ``trust``            the serialized `TrustStore` (pinned root + current verified root);
* ``policies``         the verified policy envelopes, exact bytes, one row per policy id;
* ``highest_versions`` the highest version accepted per policy id (rollback protection,
                       kept even after a policy disappears from the collector);
* ``outbox``           randomized reports waiting for acknowledgement, as the exact
                       serialized ``fedldp.v1.Report`` bytes that go on the wire;
* ``budget``           the device's own privacy ledger: epsilon spent per policy and
                       window, exact decimal strings (never floats);
* ``memo``             permanent responses of memoized (RAPPOR-style) mechanisms, per
                       (metric, mechanism parameters, value), the value as a keyed hash;
* ``events``           a bounded log of what was dropped or refused and why;
* ``counters``         monotone counters (records, acknowledgements, refusals, drops).

Durability: WAL journal with ``synchronous=FULL``, so a transaction that returned
is on disk and survives a power cut or SIGKILL; every write runs in a
``BEGIN IMMEDIATE`` transaction, so two processes sharing a state directory
serialize their writes and cannot overspend the budget together.

Footprint: the write-ahead log is bounded. SQLite checkpoints it into the main
file once it holds `WAL_AUTOCHECKPOINT_PAGES` pages (``PRAGMA
wal_autocheckpoint``) and the next write restarts it from the beginning, so
while a client records the ``-wal`` file stays under those pages plus one
transaction (about 540 KiB). ``PRAGMA journal_size_limit`` cuts a log that one
large transaction grew back to `JOURNAL_SIZE_LIMIT` bytes when it restarts; the
limit sits above the ordinary peak so that the log is reused in place rather
than shrunk at every restart. `DeviceStore.checkpoint`
(the client calls it after sends and at idle) copies the log into the main
file and truncates it to zero bytes; `close` does the same and SQLite then
deletes the ``-wal`` and ``-shm`` files, leaving the one state file (unless
another process has it open).

Privacy: no table stores a raw value. The outbox holds randomizer outputs only;
memo rows are keyed by a keyed hash of the value (see ``memo_key``), so even the
state file does not list the values a user recorded, only their permanent
responses.

Compatibility rules (the file outlives SDK upgrades): ``meta.schema_version`` is
bumped by every change; a migration only adds tables or nullable columns; a column
never changes meaning. An SDK that finds a newer schema than it knows refuses to
open the file rather than guess.

Inspection (`fedldp client ...`) opens the file with ``read_only=True``: it never
creates, chmods, migrates or checkpoints it, and refuses any schema but this
code's.
"""

from __future__ import annotations

import contextlib
import decimal
import hashlib
import hmac
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

#: File name of the state database inside the state directory.
STATE_FILE_NAME = "fedldp-device.sqlite3"
#: Version of the schema below; see the compatibility rules in the module docstring.
SCHEMA_VERSION = 1
#: Most event rows kept; older events are pruned (their counters stay).
MAX_EVENTS = 1000
#: Write-ahead log pages after which a commit checkpoints the log (4 KiB pages). The
#: price: one checkpoint (about 2-3 syncs) per ~20 records; 1,145 fdatasync calls per
#: 1,000 records against 1,022 with SQLite's default of 1,000 pages (strace -c).
WAL_AUTOCHECKPOINT_PAGES = 128
#: Size, bytes, a write-ahead log grown by one large transaction is cut back to when it
#: restarts (above the ordinary peak of `WAL_AUTOCHECKPOINT_PAGES` + one transaction).
JOURNAL_SIZE_LIMIT = 1024 * 1024
#: How long a checkpoint waits for another process's transaction, ms (then it is skipped).
CHECKPOINT_BUSY_MS = 100
#: The connection's ordinary wait for another process's lock, seconds.
BUSY_TIMEOUT_SECONDS = 30.0

#: Decimal arithmetic for the budget ledger: any rounding raises instead of
#: silently changing a sum (policy epsilons are short decimal strings, so exact
#: sums fit easily in this precision).
EXACT = decimal.Context(
    prec=200,
    rounding=decimal.ROUND_HALF_EVEN,
    traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow],
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trust (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    store        BLOB    NOT NULL,
    root_version INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS policies (
    policy_id  TEXT    PRIMARY KEY,
    version    INTEGER NOT NULL,
    metric     TEXT    NOT NULL,
    envelope   BLOB    NOT NULL,
    digest     BLOB    NOT NULL,
    epsilon    TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    fetched_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS highest_versions (
    policy_id TEXT    PRIMARY KEY,
    version   INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    report_id       BLOB    NOT NULL UNIQUE CHECK (length(report_id) = 16),
    policy_id       TEXT    NOT NULL,
    policy_version  INTEGER NOT NULL,
    window_start    INTEGER NOT NULL,
    epsilon         TEXT    NOT NULL,
    report          BLOB    NOT NULL,
    created_at      INTEGER NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL    NOT NULL DEFAULT 0,
    last_error      TEXT
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (next_attempt_at, seq);
CREATE TABLE IF NOT EXISTS budget (
    policy_id      TEXT    NOT NULL,
    window_start   INTEGER NOT NULL,
    window_seconds INTEGER NOT NULL,
    spent          TEXT    NOT NULL,
    reports        INTEGER NOT NULL,
    PRIMARY KEY (policy_id, window_start)
);
CREATE TABLE IF NOT EXISTS memo (
    metric     TEXT    NOT NULL,
    scope      TEXT    NOT NULL,
    value_key  BLOB    NOT NULL,
    state      BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (metric, scope, value_key)
);
CREATE TABLE IF NOT EXISTS events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    at        INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    policy_id TEXT,
    report_id BLOB,
    detail    TEXT    NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name  TEXT    PRIMARY KEY,
    value INTEGER NOT NULL
);
"""


#: Offsets of the SQLite header's file format write and read versions: 2 and 2 mark
#: a WAL database (sqlite.org/fileformat.html, section 1.3.3).
_HEADER_WAL_VERSIONS = slice(18, 20)
_WAL_VERSIONS = b"\x02\x02"

_template_lock = threading.Lock()
_template: list[bytes | None] = []  # [image] once built; [None] when unavailable


def _template_image() -> bytes | None:
    """The bytes of an empty state file at `SCHEMA_VERSION`, built once per process.

    The schema and the ``meta``/``user_version`` rows a migration writes, and
    nothing device-specific (the memo secret is made on first use). None where
    this Python's sqlite3 cannot serialize a database (Python 3.10): new files
    are then created by `DeviceStore._migrate` statement by statement.
    """
    with _template_lock:
        if not _template:
            image: bytes | None = None
            conn = sqlite3.connect(":memory:", isolation_level=None)
            try:
                conn.executescript(_SCHEMA)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(SCHEMA_VERSION),),
                )
                conn.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")
                # Connection.serialize exists from Python 3.11 on.
                serialize: Callable[[], bytes] | None = getattr(conn, "serialize", None)
                if serialize is not None:
                    serialized = serialize()
                    image = (
                        serialized[: _HEADER_WAL_VERSIONS.start]
                        + _WAL_VERSIONS
                        + serialized[_HEADER_WAL_VERSIONS.stop :]
                    )
            except sqlite3.Error:
                image = None
            finally:
                conn.close()
            _template.append(image)
        return _template[0]


def _create_from_template(path: Path) -> None:
    """Create a new state file at `path` from `_template_image` (fresh installs).

    Same result as creating the schema statement by statement, for a fraction of
    the CPU (a fleet simulation creates thousands of state files). The image is
    written to a private temporary name, fsynced, then linked to `path`: the link
    appears atomically, complete, and never replaces a file (when another process
    created `path` first, its file is used). The directory is fsynced so the new
    name survives a power cut. Any other failure (a file system without hard
    links) leaves creation to SQLite and `DeviceStore._migrate`.
    """
    image = _template_image()
    if image is None:
        return
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.new")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(image)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError:
        return
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)


def read_only_uri(path: Path) -> str:
    """The SQLite URI that opens the WAL database `path` without writing it or
    creating anything beside it (the device state here; the collector's ledger
    readers too, collector/ledger/engine.py).

    SQLite's ``mode=ro`` alone is not enough for a WAL database: a reader
    creates the ``-wal`` and ``-shm`` files when they are missing and leaves
    them behind (sqlite.org/wal.html, "Read-Only Databases"). So: when the
    ``-wal`` file exists (a writer has the file open, or crashed), ``mode=ro``
    reads through it and creates nothing; when it does not, no connection has
    the file open and everything is in the main file, which is read with
    ``immutable=1`` (no locks, no sibling files). A writer that starts during
    the few milliseconds of a read writes to its new ``-wal``, not to the main
    file, until its first checkpoint. Decide per connection: the answer holds
    only while no writer starts or stops.
    """
    real = path.resolve()
    live = real.with_name(real.name + "-wal").exists()
    return f"{real.as_uri()}?mode=ro" + ("" if live else "&immutable=1")


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that can neither write `path` nor create anything beside it
    (`read_only_uri`, plus ``PRAGMA query_only``). StateError when there is no file."""
    if not path.is_file():
        raise StateError(
            f"no fedldp device state in {path.parent} (expected {STATE_FILE_NAME}); "
            "pass the directory given to Client(state_dir=...)"
        )
    conn = sqlite3.connect(
        read_only_uri(path),
        uri=True,
        timeout=BUSY_TIMEOUT_SECONDS,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.execute("PRAGMA query_only=ON")
    return conn


class StateError(Exception):
    """The device state file cannot be used (newer schema, corrupt, wrong kind of file)."""


@dataclass(frozen=True)
class StoredPolicy:
    """A cached policy envelope as stored (re-verified on load, never trusted blindly)."""

    policy_id: str
    version: int
    metric: str
    envelope: bytes
    digest: bytes
    epsilon: Decimal
    expires_at: int
    fetched_at: int


@dataclass(frozen=True)
class Event:
    """Something the SDK dropped or refused, and why. Never carries a raw value.

    `kind` is one of "record_refused", "report_refused", "policy_rejected",
    "root_rejected", "transport_error", "protocol_error"; `reason` a stable
    upper-case code (e.g. "OUTBOX_FULL", "BUDGET_EXHAUSTED", "OUTCOME_INVALID").
    """

    at: int
    kind: str
    reason: str
    detail: str
    policy_id: str | None = None
    report_id: bytes | None = None


@dataclass(frozen=True)
class BudgetRow:
    """The device ledger's spend for one policy and window (exact decimal)."""

    policy_id: str
    window_start: int
    window_seconds: int
    spent: Decimal
    reports: int


class DeviceStore:
    """The SQLite state file; thread-safe (one connection behind a re-entrant lock).

    Reads and writes go through `transaction()`, which holds the lock and a
    ``BEGIN IMMEDIATE`` transaction, so a sequence of checks and writes inside it
    is atomic against other threads and other processes.
    """

    def __init__(self, state_dir: str | os.PathLike[str], *, read_only: bool = False) -> None:
        """Open the state file in `state_dir`.

        The SDK (the writer) creates the directory and the file when missing, makes
        the file 0600 and migrates an older schema. `read_only=True` (`fedldp
        client` inspection) changes nothing: see `_connect_read_only`; a missing
        file, a file that is not a state file and a schema other than this code's
        `SCHEMA_VERSION` (older or newer) are refused with `StateError`.
        """
        directory = Path(state_dir)
        self.path = directory / STATE_FILE_NAME
        self.read_only = read_only
        self._lock = threading.RLock()
        self._closed = False
        #: `total_changes` at the last checkpoint: equal means nothing of ours to copy.
        self._checkpointed_changes = 0
        if read_only:
            self._conn = _connect_read_only(self.path)
            self._open_checked(self._check_schema)
            return
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not self.path.exists():
            _create_from_template(self.path)
        self._conn = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False
        )
        self._open_checked(self._prepare_for_writing)

    def _open_checked(self, prepare: Callable[[], None]) -> None:
        """Run `prepare` on the new connection; close it and raise StateError on failure."""
        try:
            prepare()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise StateError(
                f"{self.path} is not a usable fedldp device state file: {exc}"
            ) from exc
        except StateError:
            self._conn.close()
            raise

    def _prepare_for_writing(self) -> None:
        """The writer's setup: mode 0600, WAL, durability pragmas, then `_migrate`."""
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute(f"PRAGMA wal_autocheckpoint={WAL_AUTOCHECKPOINT_PAGES:d}")
        self._conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT:d}")
        self._migrate()

    def _check_schema(self) -> None:
        """A read-only store's check: the file is a state file at exactly `SCHEMA_VERSION`.

        Inspection never migrates, so an older file is refused as clearly as a
        newer one (the SDK migrates it the next time the app opens it).
        """
        found = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
        ).fetchone()
        if found == 0 and has_meta is None:
            raise StateError(
                f"{self.path} is not a fedldp device state file (no schema); pass the "
                "directory given to Client(state_dir=...)"
            )
        if found > SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema version {found}, newer than this fedldp's "
                f"{SCHEMA_VERSION}; inspect it with a newer fedldp (the file is left untouched)"
            )
        if found < SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema version {found}, older than this fedldp's "
                f"{SCHEMA_VERSION}; inspection never migrates it: the app's SDK migrates the "
                "file when it next opens it, or inspect it with the fedldp that wrote it "
                "(the file is left untouched)"
            )
        self._refuse_newer(self._conn)

    # --- lifecycle ---

    def _migrate(self) -> None:
        """Create or upgrade the schema; refuse a file made by a newer SDK.

        ``PRAGMA user_version`` mirrors ``meta.schema_version`` (both are written in
        the migration's one transaction): a file already at `SCHEMA_VERSION` costs
        two reads here, no transaction and no DDL.
        """
        found = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
        if found == SCHEMA_VERSION:
            self._refuse_newer(self._conn)
            return
        if found > SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema version {found}, newer than this SDK's "
                f"{SCHEMA_VERSION}; upgrade the SDK (the file is left untouched)"
            )
        with self.transaction() as conn:
            row = conn.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name='meta'"
            ).fetchone()
            if row is not None:
                self._refuse_newer(conn)
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION:d}")

    def _refuse_newer(self, conn: sqlite3.Connection) -> None:
        found = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if found is not None and int(found[0]) > SCHEMA_VERSION:
            raise StateError(
                f"{self.path} has schema version {found[0]}, newer than this SDK's "
                f"{SCHEMA_VERSION}; upgrade the SDK (the file is left untouched)"
            )

    def close(self) -> None:
        """Checkpoint and close the database (idempotent).

        The checkpoint is skipped when this connection changed nothing since its
        last complete one (a `flush()` just before `close()` made it). The last
        connection to close checkpoints what is left and deletes the ``-wal`` and
        ``-shm`` files (SQLite does this itself), so a closed store is one file.
        """
        with self._lock:
            if not self._closed:
                if not self.read_only:
                    with contextlib.suppress(sqlite3.Error):
                        self.checkpoint()
                self._closed = True
                self._conn.close()

    def checkpoint(self, *, force: bool = False) -> bool:
        """Copy the write-ahead log into the state file and truncate it to zero bytes.

        ``PRAGMA wal_checkpoint(TRUNCATE)``; unless `force`, a no-op when this
        connection changed no row since the last one. Waits at most `CHECKPOINT_BUSY_MS` for another
        process's transaction, then leaves the log for the next checkpoint (it
        stays bounded by the automatic checkpoints meanwhile). Returns whether the
        log was fully checkpointed.
        """
        with self._lock:
            if self._closed:
                raise StateError("the device store is closed")
            if self.read_only:  # nothing of ours to copy, and no right to
                return False
            changes = self._conn.total_changes
            if changes == self._checkpointed_changes and not force:
                return True
            self._conn.execute(f"PRAGMA busy_timeout={CHECKPOINT_BUSY_MS:d}")
            try:
                busy, _, _ = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            finally:
                self._conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_SECONDS * 1000):d}")
            if busy:
                return False
            self._checkpointed_changes = changes
            return True

    @contextlib.contextmanager
    def transaction(
        self, *, durable: bool = True, write: bool = True
    ) -> Iterator[sqlite3.Connection]:
        """An exclusive write transaction (``BEGIN IMMEDIATE``), committed on success.

        Any exception rolls everything back: a failed operation changes nothing.
        On a read-only store, or with `write=False`: a read transaction
        (``BEGIN``; one snapshot, no write lock taken until a write, which a
        read-only store refuses).
        `durable=False` commits without an fsync (``synchronous=NORMAL`` for this
        transaction: atomic and consistent, and on disk with the next durable
        commit or checkpoint); only for state whose loss in a power cut is
        harmless (the send slot's claim).
        """
        with self._lock:
            if self._closed:
                raise StateError("the device store is closed")
            if not durable:
                self._conn.execute("PRAGMA synchronous=NORMAL")
            try:
                self._conn.execute("BEGIN" if self.read_only or not write else "BEGIN IMMEDIATE")
                try:
                    yield self._conn
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                else:
                    self._conn.execute("COMMIT")
            finally:
                if not durable:
                    self._conn.execute("PRAGMA synchronous=FULL")

    # --- meta, counters, events ---

    def memo_secret(self, conn: sqlite3.Connection) -> bytes:
        """The device-local key of `memo_key` (random, made once per state file).

        Made on first use, inside the caller's write transaction (so it is stored
        with the first memo row that needs it, or not at all), and never changed.
        """
        row = conn.execute("SELECT value FROM meta WHERE key='memo_secret'").fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('memo_secret', ?)",
                (secrets.token_hex(32),),
            )
            row = conn.execute("SELECT value FROM meta WHERE key='memo_secret'").fetchone()
        return bytes.fromhex(row[0])

    def get_meta(self, key: str) -> str | None:
        """A free-form meta value (e.g. the time of the last policy fetch)."""
        with self.transaction() as conn:
            return DeviceStore.read_meta(conn, key)

    @staticmethod
    def read_meta(conn: sqlite3.Connection, key: str) -> str | None:
        """`get_meta` inside the caller's transaction."""
        row = conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def set_meta(conn: sqlite3.Connection, key: str, value: str) -> None:
        """Set a meta value inside a transaction."""
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (key, value),
        )

    @staticmethod
    def bump(conn: sqlite3.Connection, name: str, by: int = 1) -> None:
        """Add `by` to counter `name` inside a transaction."""
        conn.execute(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT(name) DO UPDATE SET value=value+excluded.value",
            (name, by),
        )

    def counters(self) -> dict[str, int]:
        """Every counter, by name."""
        with self.transaction() as conn:
            rows = conn.execute("SELECT name, value FROM counters ORDER BY name").fetchall()
        return {str(name): int(value) for name, value in rows}

    @staticmethod
    def add_event(conn: sqlite3.Connection, event: Event) -> None:
        """Append `event` inside a transaction, and prune the log to `MAX_EVENTS` rows."""
        conn.execute(
            "INSERT INTO events (at, kind, reason, policy_id, report_id, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (event.at, event.kind, event.reason, event.policy_id, event.report_id, event.detail),
        )
        conn.execute(
            "DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (MAX_EVENTS,)
        )

    def events(self, limit: int = 100) -> list[Event]:
        """The most recent events, newest first."""
        with self.transaction() as conn:
            rows = conn.execute(
                "SELECT at, kind, reason, detail, policy_id, report_id FROM events "
                "ORDER BY seq DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [
            Event(
                at=int(at),
                kind=str(kind),
                reason=str(reason),
                detail=str(detail),
                policy_id=None if pid is None else str(pid),
                report_id=None if rid is None else bytes(rid),
            )
            for at, kind, reason, detail, pid, rid in rows
        ]

    # --- trust store and policies ---

    @staticmethod
    def read_trust(conn: sqlite3.Connection) -> bytes | None:
        """The stored serialized `TrustStore` (read in the caller's transaction), or None
        before the first run."""
        row = conn.execute("SELECT store FROM trust WHERE id=1").fetchone()
        return None if row is None else bytes(row[0])

    @staticmethod
    def save_trust(conn: sqlite3.Connection, data: bytes, root_version: int) -> None:
        """Replace the stored trust store inside a transaction."""
        conn.execute(
            "INSERT INTO trust (id, store, root_version, updated_at) VALUES (1, ?, ?, ?) "
            "ON CONFLICT(id) DO UPDATE SET store=excluded.store, "
            "root_version=excluded.root_version, updated_at=excluded.updated_at",
            (data, root_version, int(time.time())),
        )

    def highest_versions(self) -> dict[str, int]:
        """The highest accepted version per policy id (for rollback checks)."""
        with self.transaction() as conn:
            return DeviceStore.read_highest_versions(conn)

    @staticmethod
    def read_highest_versions(conn: sqlite3.Connection) -> dict[str, int]:
        """`highest_versions` inside the caller's transaction."""
        rows = conn.execute("SELECT policy_id, version FROM highest_versions").fetchall()
        return {str(pid): int(version) for pid, version in rows}

    @staticmethod
    def save_policy(conn: sqlite3.Connection, policy: StoredPolicy) -> None:
        """Cache a verified policy and raise its highest accepted version.

        The highest version only ever grows (``MAX``), so a later stale write
        cannot lower the rollback floor.
        """
        DeviceStore.save_policies(conn, [policy])

    @staticmethod
    def save_policies(conn: sqlite3.Connection, policies: Sequence[StoredPolicy]) -> None:
        """`save_policy` for each of `policies` (two statements in all)."""
        conn.executemany(
            "INSERT INTO policies (policy_id, version, metric, envelope, digest, epsilon, "
            "expires_at, fetched_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(policy_id) DO UPDATE SET version=excluded.version, "
            "metric=excluded.metric, envelope=excluded.envelope, digest=excluded.digest, "
            "epsilon=excluded.epsilon, expires_at=excluded.expires_at, "
            "fetched_at=excluded.fetched_at WHERE excluded.version >= policies.version",
            [
                (
                    policy.policy_id,
                    policy.version,
                    policy.metric,
                    policy.envelope,
                    policy.digest,
                    str(policy.epsilon),
                    policy.expires_at,
                    policy.fetched_at,
                )
                for policy in policies
            ],
        )
        conn.executemany(
            "INSERT INTO highest_versions (policy_id, version) VALUES (?, ?) "
            "ON CONFLICT(policy_id) DO UPDATE SET version=MAX(version, excluded.version)",
            [(policy.policy_id, policy.version) for policy in policies],
        )

    @staticmethod
    def delete_policy(conn: sqlite3.Connection, policy_id: str) -> None:
        """Forget a cached policy (its highest version is kept)."""
        conn.execute("DELETE FROM policies WHERE policy_id=?", (policy_id,))

    def policies(self) -> list[StoredPolicy]:
        """Every cached policy, by policy id."""
        with self.transaction() as conn:
            return DeviceStore.read_policies(conn)

    @staticmethod
    def read_policies(conn: sqlite3.Connection) -> list[StoredPolicy]:
        """`policies` inside the caller's transaction."""
        rows = conn.execute(
            "SELECT policy_id, version, metric, envelope, digest, epsilon, expires_at, "
            "fetched_at FROM policies ORDER BY policy_id"
        ).fetchall()
        return [
            StoredPolicy(
                policy_id=str(r[0]),
                version=int(r[1]),
                metric=str(r[2]),
                envelope=bytes(r[3]),
                digest=bytes(r[4]),
                epsilon=Decimal(r[5]),
                expires_at=int(r[6]),
                fetched_at=int(r[7]),
            )
            for r in rows
        ]

    # --- memo state (memoized mechanisms) ---

    def memo_key(self, conn: sqlite3.Connection, metric: str, value_bytes: bytes) -> bytes:
        """HMAC-SHA256 of a value under the device-local memo secret.

        The memo table never holds the value itself, only this keyed digest, so a
        copy of the state file does not enumerate what was recorded by hashing
        candidate values (the secret never leaves the file's own meta row).
        """
        message = metric.encode("utf-8") + b"\x00" + value_bytes
        return hmac.new(self.memo_secret(conn), message, hashlib.sha256).digest()

    @staticmethod
    def load_memo(
        conn: sqlite3.Connection, metric: str, scope: str, value_key: bytes
    ) -> bytes | None:
        """The stored permanent response for (metric, parameters, value), or None."""
        row = conn.execute(
            "SELECT state FROM memo WHERE metric=? AND scope=? AND value_key=?",
            (metric, scope, value_key),
        ).fetchone()
        return None if row is None else bytes(row[0])

    @staticmethod
    def save_memo(
        conn: sqlite3.Connection, metric: str, scope: str, value_key: bytes, state: bytes
    ) -> None:
        """Store a permanent response; an existing one is never replaced."""
        conn.execute(
            "INSERT OR IGNORE INTO memo (metric, scope, value_key, state, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (metric, scope, value_key, state, int(time.time())),
        )

    def memo_count(self) -> int:
        """How many permanent responses are stored."""
        with self.transaction() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM memo").fetchone()[0])

    # --- budget ledger ---

    @staticmethod
    def spent(conn: sqlite3.Connection, policy_id: str, window_start: int) -> Decimal:
        """Epsilon charged on this device for a policy and window (exact)."""
        row = conn.execute(
            "SELECT spent FROM budget WHERE policy_id=? AND window_start=?",
            (policy_id, window_start),
        ).fetchone()
        return Decimal(0) if row is None else Decimal(row[0])

    @staticmethod
    def spent_windows(conn: sqlite3.Connection) -> dict[str, list[int]]:
        """The window lengths (seconds) this device has charged each policy id under,
        ascending (one read for every policy id)."""
        rows = conn.execute(
            "SELECT DISTINCT policy_id, window_seconds FROM budget ORDER BY 1, 2"
        ).fetchall()
        windows: dict[str, list[int]] = {}
        for policy_id, seconds in rows:
            windows.setdefault(str(policy_id), []).append(int(seconds))
        return windows

    @staticmethod
    def charge(
        conn: sqlite3.Connection,
        policy_id: str,
        window_start: int,
        window_seconds: int,
        epsilon: Decimal,
        *,
        spent: Decimal | None = None,
    ) -> Decimal:
        """Add `epsilon` to the window's spend inside a transaction; returns the new total.

        `spent` is the window's spend as the caller read it in this same
        transaction (saves reading it again); None reads it here.
        """
        if spent is None:
            spent = DeviceStore.spent(conn, policy_id, window_start)
        total = EXACT.add(spent, epsilon)
        conn.execute(
            "INSERT INTO budget (policy_id, window_start, window_seconds, spent, reports) "
            "VALUES (?, ?, ?, ?, 1) ON CONFLICT(policy_id, window_start) DO UPDATE SET "
            "spent=excluded.spent, reports=reports+1",
            (policy_id, window_start, window_seconds, str(total)),
        )
        return total

    def budget_rows(self) -> list[BudgetRow]:
        """Every budget row, newest window first."""
        with self.transaction() as conn:
            rows = conn.execute(
                "SELECT policy_id, window_start, window_seconds, spent, reports FROM budget "
                "ORDER BY window_start DESC, policy_id"
            ).fetchall()
        return [
            BudgetRow(str(p), int(w), int(s), Decimal(spent), int(n)) for p, w, s, spent, n in rows
        ]
