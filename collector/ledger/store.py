"""The privacy ledger: the collector's authority on privacy spent.

Invariants (../../DESIGN.md, "Ledger"):

* exact decimal arithmetic: amounts are `decimal.Decimal`, stored as TEXT, added
  in a context that traps any rounding (`EXACT`);
* check-and-charge and the stored report are one transaction: no charge without
  its report, no report without its charge; statistics move in the same one;
* idempotent: the same report id with the same content (and subject) is a
  DUPLICATE and charges nothing; the same id with other content is a CONFLICT,
  refused and recorded;
* the cap comes from the verified policy passed in, never from a request, lowered
  to the smallest cap of the versions of its policy id recorded in this ledger
  (`record_versions`, by any collector) whose validity overlaps the window: the
  cap in force does not depend on which versions the charging collector knows.
  The recorded versions are cached with their generation, which every charge
  transaction reads after locking its spend rows (`_submit_rows`); every
  version of a policy id has one window length (`claim_lineage`), so they share
  spend rows;
* `reconcile` recomputes every running total from the raw rows.

Concurrency. Each call is one named transaction, safe to rerun, retried on
conflicts (janus `run_tx`). SQLite: WAL, synchronous=FULL and BEGIN IMMEDIATE,
so writers are serialized by the file lock and every commit is durable; the
ingestion transactions run on a connection of their own (sqlite_ingest.py).
PostgreSQL (many collectors sharing one ledger): the touched spend rows are
locked FOR UPDATE (their latest committed values are read) and written back by
an atomic conditional update (compare-and-set on the value read; a mismatch
reruns the transaction), so no interleaving can over-spend. The default
isolation is READ COMMITTED, where those row locks are what serializes
charges; SERIALIZABLE is available (`isolation=`) and correct too, but its
predicate locks on the reports index make large concurrent groups abort and
rerun often (measured in bench/collector). Every transaction is retried on
SQLSTATE 40001/40P01 (serialization failure, deadlock) and 23505 (a
concurrent insert of the same report id or idempotency key: the rerun sees it
and answers DUPLICATE/CONFLICT). Reads (reconcile, statistics) run in
REPEATABLE READ, one snapshot.

Group commit: `submit_many` charges several requests (e.g. every request that
arrived while the previous commit was in flight) in one transaction, so the
durable throughput is not one fsync per report.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import chain
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    NamedTuple,
    NoReturn,
    Protocol,
    TypeAlias,
    TypeVar,
)
from urllib.parse import quote

import sqlalchemy as sa
from fedldp.collector.ledger import migrate, restore
from fedldp.collector.ledger.schema import (
    central_caps,
    central_reservation_log,
    central_reservations,
    conflicts,
    ledger_info,
    policy_lineage,
    policy_version_generation,
    policy_versions,
    reports,
    spend,
    statistics,
)
from fedldp.collector.ledger.sqlite_ingest import BUSY_TIMEOUT_MS, IngestConnection, ensure_wal
from fedldp.collector.wire import output_from_json, output_to_json
from fedldp.v1 import collector_pb2
from sqlalchemy import event
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Mechanism, Output

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Decimal context for every sum and comparison: any rounding raises (never silent).
EXACT = decimal.Context(
    prec=200,
    traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow, decimal.DivisionByZero],
)

OutcomeValue: TypeAlias = collector_pb2.Outcome.ValueType
ACCEPTED: OutcomeValue = collector_pb2.OUTCOME_ACCEPTED
DUPLICATE: OutcomeValue = collector_pb2.OUTCOME_DUPLICATE
BUDGET_EXHAUSTED: OutcomeValue = collector_pb2.OUTCOME_BUDGET_EXHAUSTED
CONFLICT: OutcomeValue = collector_pb2.OUTCOME_CONFLICT

#: PostgreSQL SQLSTATEs after which a transaction is simply rerun.
_PG_RETRYABLE = {"40001", "40P01", "23505"}
_MAX_ATTEMPTS = 64
#: Rows per multi-row INSERT/UPDATE statement: 256, then the binary digits of the rest.
#: Python's sqlite3 releases the GIL around every statement step; with executemany
#: that is once per row, and a committer thread that loses the GIL to busy request
#: handlers waits a switch interval to get it back, so rows go in a few statements.
_ROW_CHUNKS = (256, 128, 64, 32, 16, 8, 4, 2, 1)
#: IN-list sizes of the hot-path reads (powers of two; lists are padded to the next
#: power of two so that each statement's text, hence its prepared plan, is reused).
_IN_IDS = 2048
_IN_KEYS = 512  # three parameters per key
#: After a group met a report id stored before, this many groups read their ids
#: before deciding (see `Ledger.submit_many`).
_READ_IDS_AFTER_A_REPEAT = 64
#: The cap of a window a restore gap refuses: every charge exceeds it (ε > 0).
_NOTHING_FITS = Decimal(-1)
#: The `reports` columns that every report of one policy shares, bound once per
#: INSERT statement (their order in a run's `shared` tuple) ...
_REPORT_POLICY_COLUMNS = (
    "policy_id",
    "policy_version",
    "policy_digest",
    "charge",
    "epsilon_cap",
    "shard",
)
#: ... and the columns bound per report (the order of a run's row tuples). Binding
#: 7 parameters per row instead of 13 takes ≈ 0.8 µs per report off the
#: ingestion transaction (bare sqlite3, 256-row statements: 6.2 against 7.0 µs).
_REPORT_OWN_COLUMNS = (
    "report_id",
    "subject",
    "window_start",
    "coarse_time",
    "content_digest",
    "payload",
    "received_at",
)


# --- public types --------------------------------------------------------------------


class LedgerPolicy(Protocol):
    """What the ledger needs of a verified policy (fedldp.client.policy.VerifiedPolicy)."""

    @property
    def policy_id(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def digest(self) -> bytes: ...
    @property
    def charge(self) -> Decimal: ...
    @property
    def epsilon_cap(self) -> Decimal: ...
    @property
    def window_seconds(self) -> int: ...
    @property
    def mechanism(self) -> Mechanism[Any, Any]: ...

    def window_start(self, now: int) -> int: ...


class CheckedReport(tuple[bytes, "LedgerPolicy", "Output", bytes, int]):
    """A report that passed the policy and output-domain checks (immutable).

    `content_digest` is `fedldp.collector.wire.content_digest` of the report
    (everything but its id); it decides DUPLICATE versus CONFLICT. A validated
    tuple rather than a frozen dataclass: one is built per ingested report (the
    service, whose ids and digests have the right lengths by construction, builds
    it with `tuple.__new__`; the ledger's hot path unpacks it by position).
    """

    __slots__ = ()

    def __new__(
        cls,
        report_id: bytes,
        policy: LedgerPolicy,
        output: Output,
        content_digest: bytes,
        coarse_time: int,
    ) -> CheckedReport:
        if len(report_id) != 16:
            raise ValueError("report_id must be exactly 16 bytes")
        if len(content_digest) != 32:
            raise ValueError("content_digest must be a 32-byte SHA-256")
        return tuple.__new__(cls, (report_id, policy, output, content_digest, coarse_time))

    def __getnewargs__(self) -> tuple[bytes, LedgerPolicy, Output, bytes, int]:
        return (self[0], self[1], self[2], self[3], self[4])

    def __repr__(self) -> str:
        return (
            f"CheckedReport(report_id={self[0]!r}, policy={self[1]!r}, output={self[2]!r}, "
            f"content_digest={self[3]!r}, coarse_time={self[4]!r})"
        )

    @property
    def report_id(self) -> bytes:
        return self[0]

    @property
    def policy(self) -> LedgerPolicy:
        return self[1]

    @property
    def output(self) -> Output:
        return self[2]

    @property
    def content_digest(self) -> bytes:
        return self[3]

    @property
    def coarse_time(self) -> int:
        return self[4]


class SubmitBatch(NamedTuple):
    """One request's reports for one authenticated subject, charged at `now` (immutable)."""

    subject: str
    reports: Sequence[CheckedReport]
    now: int


@dataclass(frozen=True)
class PartialStatistic:
    """One collector shard's additive statistic for (policy, version, window)."""

    policy_id: str
    version: int
    window_start: int
    shard: str
    n: int
    statistic_json: str


@dataclass(frozen=True)
class SpendRow:
    """What a subject spent in one window of one policy."""

    subject: str
    policy_id: str
    window_start: int
    epsilon_spent: Decimal
    report_count: int
    epsilon_cap: Decimal  # the cap of the last charge, from the verified policy


@dataclass(frozen=True)
class PolicyLineage:
    """A policy id's metric name and budget window as the ledger recorded them.

    Recorded once, by the first version of the policy id a collector activated
    (`Ledger.claim_lineage`), and never changed: every later version must have
    the same window length (spend rows are keyed by the window start) and the
    same metric name, and no other policy id may claim that metric name.
    """

    policy_id: str
    metric_name: str
    window_seconds: int
    first_version: int
    recorded_at: int

    def refusal(self, policy_id: str, metric_name: str, window_seconds: int) -> str | None:
        """Why a version (policy id, metric name, window) breaks this lineage; None if it fits.

        The answer starts with a stable reason word: ``metric_taken`` (this
        lineage is another policy id's, for the same metric name),
        ``metric_changed`` or ``window_changed``.
        """
        if self.policy_id != policy_id:
            return (
                f"metric_taken: metric {metric_name!r} already has its budget under policy "
                f"{self.policy_id!r} (recorded by v{self.first_version}); one metric has one "
                f"budget: publish a new version of {self.policy_id!r} instead"
            )
        if self.metric_name != metric_name:
            return (
                f"metric_changed: policy {policy_id!r} measures metric {self.metric_name!r} "
                f"(recorded by v{self.first_version}), not {metric_name!r}; a new metric "
                "needs a new policy id"
            )
        if self.window_seconds != window_seconds:
            return (
                f"window_changed: policy {policy_id!r} has a {self.window_seconds} s budget "
                f"window (recorded by v{self.first_version}), this version asks "
                f"{window_seconds} s; versions of one policy id share one budget, so its "
                "window cannot change: keep the window, or use a new policy id for a new "
                "metric name"
            )
        return None


@dataclass(frozen=True)
class PolicyVersion:
    """One policy version as the ledger records it when a collector activates it.

    Its validity is [not_before, expires_at); it is *in force during* a window
    [w, w + window_seconds) when the two intervals overlap. `recorded_at` is the
    recording collector's clock when the version was first recorded (0 on a
    version not recorded yet).
    """

    policy_id: str
    version: int
    epsilon_cap: Decimal
    window_seconds: int
    not_before: int
    expires_at: int
    digest: bytes
    recorded_at: int = 0

    def overlaps(self, window_start: int, window_seconds: int) -> bool:
        """Whether this version is in force during [window_start, window_start + window_seconds)."""
        return self.not_before < window_start + window_seconds and self.expires_at > window_start


def smallest_cap(
    versions: Iterable[PolicyVersion], window_start: int, window_seconds: int
) -> Decimal | None:
    """The smallest cap among `versions` in force during the window; None if none is."""
    caps = [v.epsilon_cap for v in versions if v.overlaps(window_start, window_seconds)]
    return min(caps) if caps else None


def lowered_window(
    candidate: PolicyVersion, recorded: Sequence[PolicyVersion], now: int
) -> int | None:
    """The first window that has begun at `now` in which `candidate` would lower the
    cap in force below every recorded version in force during it; None if none.

    Windows are the candidate's (every version of a policy id has one length,
    `claim_lineage`). A window with no recorded version in force has had no charge
    under this ledger's rule (every version that accepts reports is recorded first),
    so a candidate lowers nothing there. The smallest recorded cap only changes
    where a recorded version's first or last window starts or ends, so those
    windows and the candidate's first are the only ones checked.
    """
    w = candidate.window_seconds
    first = candidate.not_before // w
    last = min(-(-candidate.expires_at // w) - 1, now // w)  # begun: k * w <= now
    points = {first}
    for v in recorded:
        points.update((v.not_before // w, -(-v.expires_at // w)))
    for k in sorted(p for p in points if first <= p <= last):
        cap = smallest_cap(recorded, k * w, w)
        if cap is not None and candidate.epsilon_cap < cap:
            return k * w
    return None


@dataclass(frozen=True)
class _Versions:
    """The recorded versions as last read, by policy id, with their generation."""

    generation: int
    by_policy: Mapping[str, tuple[PolicyVersion, ...]]
    #: (policy id, window start, window length) -> `smallest_cap` (memo, bounded)
    caps: dict[tuple[str, int, int], Decimal | None] = field(default_factory=dict)


@dataclass(frozen=True)
class Mismatch:
    """A disagreement between a running total and the raw rows it summarizes.

    kind: "spend" (ε or count differs), "over_cap" (raw spend above the cap in
    force: the smallest of the caps its reports were charged under and of the
    recorded versions in force during the window), "statistic_count" (statistics
    n differs from stored reports),
    "central" (central running totals differ from the reservations),
    "central_over_cap", "window" (a window start that is not one of its policy id's
    recorded window length: charged under another window, see `claim_lineage`).
    """

    kind: str
    subject: str | None
    scope: str
    recomputed: str
    recorded: str

    def __str__(self) -> str:
        who = f" subject={self.subject}" if self.subject is not None else ""
        return (
            f"{self.kind}:{who} {self.scope}: "
            f"recomputed {self.recomputed}, recorded {self.recorded}"
        )


@dataclass(frozen=True)
class Reservation:
    """A central release's (ε, δ) reservation and its history."""

    id: str
    subject: str
    purpose: str
    epsilon: Decimal
    delta: Decimal
    status: str  # 'reserved' | 'settled' | 'cancelled'
    epsilon_spent: Decimal | None
    delta_spent: Decimal | None
    idempotency_key: str
    created_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    closed_at: int | None = None
    owner: str | None = None  # the run that claimed it (None: made before ownership)
    lease_expires_at: int | None = None
    data_opened_at: int | None = None  # set before the first protected byte is read
    close_reason: str | None = None

    def held_by(self, owner: str) -> bool:
        """True when `owner` is the run that claimed this reservation."""
        return self.owner is not None and secrets.compare_digest(self.owner, owner)

    def stale(self, now: int) -> bool:
        """Open, and its owner's lease has run out (or it never had one)."""
        return self.status == "reserved" and (
            self.lease_expires_at is None or self.lease_expires_at <= now
        )


@dataclass(frozen=True)
class CentralEvent:
    """One event of a settled central release, for RDP/PLD recomposition."""

    reservation_id: str
    subject: str
    purpose: str
    epsilon_spent: Decimal
    delta_spent: Decimal
    settled_at: int
    event: Mapping[str, object]


#: How `open_ledger` may touch the database (see there).
Access: TypeAlias = Literal["create", "write", "read"]


class LedgerError(Exception):
    """Base of the ledger's domain errors."""


class LedgerOpenError(LedgerError, ValueError):
    """The ledger cannot be opened as asked: bad URL, missing file or folder, not a
    fedldp ledger, or not at this code's migration (the message says what to do)."""


class NoCentralCapError(LedgerError):
    """No central cap is set for (subject, purpose); an operator must set one first."""


class CentralBudgetExhaustedError(LedgerError):
    """The reservation would take (subject, purpose) above its central cap."""


class CentralSpendUnconfirmedError(LedgerError):
    """The ledger was restored from a backup and the central spend made after the
    backup is unconfirmed: no central reservation until `confirm_central`."""


class NothingToConfirmError(LedgerError):
    """No restore of this ledger awaits confirmation of its central spend."""


class IdempotencyConflictError(LedgerError):
    """The idempotency key was used before for a different reservation."""


class ReservationNotFoundError(LedgerError, KeyError):
    """No reservation has this id."""


class ReservationStateError(LedgerError, ValueError):
    """The reservation is not in a state that allows this transition."""


class ReservationOwnedError(LedgerError):
    """Another run holds this reservation (its owner token differs): never run twice."""


class DataOpenedError(ReservationStateError):
    """The run declared it opened the protected data: the reservation cannot be cancelled."""


class LeaseActiveError(ReservationStateError):
    """The reservation's owner still holds a live lease: an operator may not settle it yet."""


#: A claim's lease when the caller names none: an owner renews it while it works.
DEFAULT_LEASE_SECONDS = 600


# --- helpers ---------------------------------------------------------------------------


def _dec(text: str) -> Decimal:
    return Decimal(text)


def _s(value: Decimal) -> str:
    return str(value)


def _exact_decimal(name: str, value: object, *, positive: bool) -> Decimal:
    if not isinstance(value, Decimal):
        raise TypeError(f"{name} must be a decimal.Decimal (exact), not {type(value).__name__}")
    if not value.is_finite():
        raise ValueError(f"{name} must be finite")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


def _blob_parameter(dialect: str) -> Callable[[bytes], bytes | bytearray]:
    """How the hot path passes a BLOB parameter to the driver.

    SQLite: as a bytearray. Python's sqlite3 sends every parameter that is not
    exactly an int, float, str or bytearray through its adapter protocol, whose
    failed attribute lookups cost more than copying the value (measured: a bytes
    parameter ≈ 0.45 µs more than a bytearray, copy included); both bind as the
    same BLOB. PostgreSQL: bytes as they are.
    """
    return bytearray if dialect == "sqlite" else bytes


def _row_chunk_sizes(count: int) -> Iterator[int]:
    """Sizes from _ROW_CHUNKS adding up to `count` (256s, then one of each smaller)."""
    for size in _ROW_CHUNKS:
        while count >= size and (size == _ROW_CHUNKS[0] or count & size):
            yield size
            count -= size


def _chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _padded_chunks(items: Sequence[T], size: int) -> Iterator[list[T]]:
    """`items` in chunks of at most `size`, each padded to a power of two by
    repeating its last item (repeats in an IN list change nothing)."""
    for i in range(0, len(items), size):
        chunk = list(items[i : i + size])
        chunk += chunk[-1:] * ((1 << (len(chunk) - 1).bit_length()) - len(chunk))
        yield chunk


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


@dataclass
class _SpendState:
    spent: Decimal
    count: int
    cap: Decimal
    read_text: str  # epsilon_spent as read: the compare-and-set condition of the update
    dirty: bool = False


class _Run(NamedTuple):
    """Consecutive reports of one batch under one policy, as `_plan_group` made them."""

    key: tuple[str, str, int]  # the spend row: (subject, policy id, window start)
    stat_key: tuple[str, int, int]  # the statistics row: (policy id, version, window start)
    epsilon: Decimal  # charged per report
    cap: Decimal  # the cap in force (`Ledger._window_cap`) as of the plan's generation
    policy: LedgerPolicy
    reports: list[CheckedReport]
    #: the policy's `_REPORT_POLICY_COLUMNS` values (one tuple object per policy)
    shared: tuple[Any, ...]
    rows: list[tuple[Any, ...]]  # each report's `_REPORT_OWN_COLUMNS` values
    outputs: list[Output]


@dataclass
class _GroupPlan:
    """A group transaction's inputs that depend on the requests alone, not on the
    ledger's state: made once, before the transaction, and reused by its reruns."""

    ids: set[bytes]
    repeated: bool  # some id occurs twice in the group
    latest_now: int
    generation: int  # of the recorded versions the runs' caps were worked out with
    keys: set[tuple[str, str, int]] = field(default_factory=set)  # every run's spend row
    runs: list[list[_Run]] = field(default_factory=list)  # per batch, in order
    # statistics row -> the first policy seen for it, and every output of the group
    # for it accumulated (with their count)
    policies: dict[tuple[str, int, int], LedgerPolicy] = field(default_factory=dict)
    statistics: dict[tuple[str, int, int], tuple[Any, int]] = field(default_factory=dict)


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


# --- the ledger ------------------------------------------------------------------------


class Ledger:
    """A privacy ledger on one database (open with `open_ledger`)."""

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
            url = _prepare_sqlite_file(parsed, access)
            # LIFO: the committer thread gets back the connection it just used, whose
            # page cache is still valid (SQLite drops a connection's cache when
            # another connection wrote since its last transaction).
            self._write_engine = sa.create_engine(
                url, pool_size=pool_size, max_overflow=0, pool_use_lifo=True
            )
            self._read_engine = sa.create_engine(url, pool_size=pool_size, max_overflow=4)
            _configure_sqlite(self._write_engine, begin="BEGIN IMMEDIATE")
            _configure_sqlite(self._read_engine, begin="BEGIN")
            if access == "read":  # no ingestion connection: it opens the file read-write
                self._ingest = None
            else:
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
        #: The recorded policy versions (`record_versions`) as last read, and the
        #: smallest cap per (policy id, window start, window length) worked out from
        #: them; both replaced together when a transaction reads a newer generation.
        self._versions = _Versions(-1, {})
        # Reports go in with multi-row INSERTs on SQLite (32766 bound variables at
        # most since 3.32), one policy's reports per statement, its shared columns
        # bound once; with COPY on PostgreSQL. SQLite has no row locks (BEGIN
        # IMMEDIATE already excludes other writers): no FOR UPDATE.
        columns = (*_REPORT_POLICY_COLUMNS, *_REPORT_OWN_COLUMNS)
        if sorted(columns) != sorted(c.name for c in reports.columns):
            raise RuntimeError("reports columns and _REPORT_*_COLUMNS disagree")
        shared_marks = ", ".join(["?"] * len(_REPORT_POLICY_COLUMNS))
        own = ", ".join(f"column{i + 1}" for i in range(len(_REPORT_OWN_COLUMNS)))
        row_marks = f"({', '.join(['?'] * len(_REPORT_OWN_COLUMNS))})"
        self._insert_reports_sql = {
            size: f"INSERT INTO reports ({', '.join(columns)}) "
            f"SELECT {shared_marks}, {own} FROM (VALUES {', '.join([row_marks] * size)})"
            for size in _ROW_CHUNKS
        }
        self._copy_reports_sql = f"COPY reports ({', '.join(columns)}) FROM STDIN"
        self._dbapi_error: type[Exception] = self._write_engine.dialect.loaded_dbapi.Error
        self._sql = _statements(self.dialect)
        self._in_sql_cache: dict[tuple[str, int], str] = {}
        # (policy id, version, window) -> (n, statistic_json) of this shard's row as
        # last committed by this Ledger (see `_merge_statistics`).
        self._stats_cache: dict[tuple[str, int, int], tuple[int, str]] = {}
        self._stats_lock = threading.Lock()
        self.retries = 0  # serialization failures retried so far (observability)
        #: groups rerun because a report id had been stored before (observability)
        self.stored_id_reruns = 0
        self._read_ids_groups = 0  # groups still to read their ids first
        self.transaction(lambda conn: self._load_versions(_SaConn(conn)), write=False)

    def _in_sql(self, name: str, size: int) -> str:
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

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def _insert_ignore(self, table: sa.Table) -> Any:
        if self.dialect == "postgresql":
            return pg_dialect.insert(table).on_conflict_do_nothing()
        return sqlite_dialect.insert(table).on_conflict_do_nothing()

    # -- LDP ingestion --

    def _cap_in_force(
        self, policy: LedgerPolicy, window_start: int, versions: _Versions | None = None
    ) -> Decimal:
        """The policy's cap, lowered to the smallest cap of the recorded versions of
        its policy id in force during the window (`versions`: the cached ones)."""
        vs = self._versions if versions is None else versions
        key = (policy.policy_id, window_start, policy.window_seconds)
        try:
            recorded = vs.caps[key]
        except KeyError:
            recorded = smallest_cap(
                vs.by_policy.get(policy.policy_id, ()), window_start, policy.window_seconds
            )
            if len(vs.caps) >= 4096:
                vs.caps.clear()
            vs.caps[key] = recorded
        cap = policy.epsilon_cap
        return cap if recorded is None or cap <= recorded else recorded

    def _window_cap(
        self, policy: LedgerPolicy, window_start: int, versions: _Versions | None = None
    ) -> Decimal:
        """The cap charges in this window are checked against: the cap in force
        (`_cap_in_force`), or below zero (nothing fits: BUDGET_EXHAUSTED) when the
        window overlaps the gap of a restore from a backup (restore.py states the
        rule)."""
        gaps = self.restore_gaps
        if gaps and restore.refused_by(gaps, window_start, policy.window_seconds):
            return _NOTHING_FITS
        return self._cap_in_force(policy, window_start, versions)

    def submit(
        self, subject: str, reports_in: Sequence[CheckedReport], *, now: int
    ) -> list[OutcomeValue]:
        """Charge and store `reports_in` for `subject` in one transaction.

        Returns one Outcome per report, in order: ACCEPTED (stored and charged
        now), DUPLICATE (same id and content as a stored report: nothing charged),
        BUDGET_EXHAUSTED (charging it would exceed the policy's cap for the
        window, or the window overlaps a restore gap, restore.py: nothing stored)
        or CONFLICT (id used before with other content or
        by another subject: nothing stored; the attempt is recorded). Acknowledge
        only after this returns: it returns after the commit.
        """
        return self.submit_many([SubmitBatch(subject, reports_in, now)])[0]

    def submit_many(self, batches: Sequence[SubmitBatch]) -> list[list[OutcomeValue]]:
        """`submit` for several requests in one transaction (group commit)."""
        if not any(b.reports for b in batches):
            return [[] for _ in batches]
        for b in batches:
            if not b.subject:
                raise ValueError("subject must be non-empty")
        # What depends on the requests alone is worked out before the transaction:
        # with several collector processes on one SQLite file, while another
        # process holds the writer lock (sqlite_ingest.py), not inside it.
        plan = self._plan_group(batches)
        cached: dict[tuple[str, int, int], tuple[int, str]] = {}
        # Reading a group's ids before deciding (to answer DUPLICATE or CONFLICT)
        # costs ≈ 1.5 µs per report inside the transaction, and most groups have
        # none stored before. So unless the group repeats an id itself or a recent
        # group met a stored one, its reports are decided as new; the primary key
        # still refuses a stored id at the insert, and then the transaction rolls
        # back and reruns reading the ids (`_StoredIdError`): the same outcomes.
        read_ids = [plan.repeated or self._read_ids_groups > 0]
        self._read_ids_groups = max(0, self._read_ids_groups - 1)

        def tx(db: _Driver) -> list[list[OutcomeValue]]:
            cached.clear()  # a rerun starts from what this attempt reads
            reading, read_ids[0] = read_ids[0], True  # every rerun reads them
            return self._submit_rows(db, batches, plan, cached, read_ids=reading)

        try:
            if self._ingest is not None:
                outcomes = self._ingest_transaction(tx)
            else:
                outcomes = self.transaction(lambda conn: self._with_driver(conn.connection, tx))
        except BaseException:
            self._forget_statistics(cached)
            raise
        # Committed: what this transaction wrote is the latest state of its rows.
        with self._stats_lock:
            if len(self._stats_cache) > 4096:  # one row per (policy, version, window)
                self._stats_cache.clear()
            self._stats_cache.update(cached)
        return outcomes

    def _with_driver(self, dbapi_connection: Any, fn: Callable[[_Driver], T]) -> T:
        """`fn` on a `_Driver` over `dbapi_connection` (closed afterwards)."""
        db = _Driver(dbapi_connection, self._dbapi_error)
        try:
            return fn(db)
        finally:
            db.close()

    def _ingest_transaction(self, fn: Callable[[_Driver], T]) -> T:
        """`transaction` on SQLite's ingestion connection (sqlite_ingest.py):
        BEGIN IMMEDIATE, `fn`, COMMIT (durable: synchronous=FULL); reruns `fn`
        like `transaction` does."""
        ingest = self._ingest
        assert ingest is not None

        def attempt() -> T:
            with ingest.lock:
                conn = ingest.connection()

                def in_transaction(db: _Driver) -> T:
                    db.run("BEGIN IMMEDIATE", ())
                    try:
                        result = fn(db)
                        db.run("COMMIT", ())
                    except BaseException:
                        conn.rollback()
                        raise
                    return result

                return self._with_driver(conn, in_transaction)

        return self._retrying(attempt)

    def _plan_group(self, batches: Sequence[SubmitBatch]) -> _GroupPlan:
        """The part of a group's transaction that depends on the requests alone (no
        ledger state): each batch's runs of one policy with their rows as they will
        be inserted, and every output accumulated per statistics row."""
        # A CheckedReport is the tuple (report_id, policy, output, content_digest,
        # coarse_time): the loop indexes and unpacks it rather than call its
        # properties (a Python call each).
        ids = {r[0] for b in batches for r in b.reports}
        versions = self._versions  # one snapshot of the cache for the whole plan
        plan = _GroupPlan(
            ids=ids,
            repeated=len(ids) != sum(len(b.reports) for b in batches),
            latest_now=max(b.now for b in batches),
            generation=versions.generation,
        )
        blob = _blob_parameter(self.dialect)
        shard = self.shard
        # (id(policy), window) -> its `_REPORT_POLICY_COLUMNS` values (the cap is the
        # one in force in the window); policies are compared by identity
        # (VerifiedPolicy instances are immutable and alive during the call).
        shared_values: dict[tuple[int, int], tuple[Any, ...]] = {}
        # id(output) -> its stored form: the service passes one object for equal
        # category outputs (outputs are alive, hence ids distinct, during the call).
        payloads: dict[int, str] = {}
        for b in batches:
            subject, now = b.subject, b.now
            runs: list[_Run] = []
            current: LedgerPolicy | None = None
            rows: list[tuple[Any, ...]] = []
            outputs: list[Output] = []
            run_reports: list[CheckedReport] = []
            for report in b.reports:
                rid, pol, output, digest, ct = report
                if pol is not current:  # a new run: what its reports share
                    current = pol
                    pid, version, window = pol.policy_id, pol.version, pol.window_start(now)
                    shared = shared_values.get((id(pol), window))
                    if shared is None:
                        shared = shared_values[(id(pol), window)] = (
                            pid,
                            version,
                            blob(pol.digest),
                            _s(pol.charge),
                            _s(self._cap_in_force(pol, window, versions)),
                            shard,
                        )
                    stat_key = (pid, version, window)
                    plan.policies.setdefault(stat_key, pol)
                    rows, outputs, run_reports = [], [], []
                    runs.append(
                        _Run(
                            (subject, pid, window),
                            stat_key,
                            pol.charge,
                            self._window_cap(pol, window, versions),
                            pol,
                            run_reports,
                            shared,
                            rows,
                            outputs,
                        )
                    )
                    plan.keys.add((subject, pid, window))
                payload = payloads.get(id(output))
                if payload is None:
                    payload = payloads[id(output)] = output_to_json(output)
                run_reports.append(report)
                outputs.append(output)
                rows.append((blob(rid), subject, window, ct, blob(digest), payload, now))
            plan.runs.append(runs)
        # Every output accumulated per statistics row, as if all were accepted (the
        # common case; `_merge_statistics` accumulates again when some were not).
        by_key: dict[tuple[str, int, int], list[Output]] = defaultdict(list)
        for runs in plan.runs:
            for run in runs:
                by_key[run.stat_key].extend(run.outputs)
        for key, outputs in by_key.items():
            mech = plan.policies[key].mechanism
            stat = mech.new_statistic()
            accumulate = mech.accumulate
            for o in outputs:
                accumulate(stat, o)
            plan.statistics[key] = (stat, len(outputs))
        return plan

    def _submit_rows(
        self,
        db: _Driver,
        batches: Sequence[SubmitBatch],
        plan: _GroupPlan,
        written: dict[tuple[str, int, int], tuple[int, str]],
        *,
        read_ids: bool,
    ) -> list[list[OutcomeValue]]:
        """The state-dependent part of a group's transaction (the writer lock is held):
        decide each report's outcome from the stored ids and spend rows, and write.
        Everything that depends on the requests alone is in `plan`, made before."""
        known = self._stored_ids(db, plan.ids) if read_ids else {}
        if known:
            self._read_ids_groups = _READ_IDS_AFTER_A_REPEAT
        # No id stored before and none in two of the group's requests (the common
        # case): no report can be a DUPLICATE or a CONFLICT, none needs a lookup.
        unique = not known and not plan.repeated
        if unique:
            keys = plan.keys
        else:
            keys = {
                run.key
                for runs in plan.runs
                for run in runs
                if any(r[0] not in known for r in run.reports)
            }
        state = self._lock_spend(db, sorted(keys), plan.latest_now)
        # The recorded versions' generation, read AFTER the spend rows are locked: a
        # transaction recording a version (`record_versions`) holds the spend table
        # locked on PostgreSQL and the writer lock on SQLite, so either it committed
        # before this read (and this read sees its generation) or it waits for this
        # transaction to end. Caps worked out with an older generation are redone.
        generation = self._read_generation(db, charging=True)
        if generation != plan.generation:
            if generation != self._versions.generation:
                self._load_versions(db)
            self._recap(plan)

        outcomes: list[list[OutcomeValue]] = []
        # id(policy's shared values) -> (those values, the accepted reports' rows)
        new_reports: dict[int, tuple[tuple[Any, ...], list[tuple[Any, ...]]]] = {}
        new_conflicts: list[tuple[bytes, str, bytes, int]] = []
        # (policy id, version, window) -> the outputs accepted now, for statistics
        accepted: dict[tuple[str, int, int], list[Output]] = {}
        # Ids of reports refused for the cap without reading the stored ids: they are
        # not inserted, so the primary key cannot tell whether one is a DUPLICATE.
        refused: list[bytes] = []
        # Every sum and comparison below runs in EXACT: any rounding raises.
        with decimal.localcontext(EXACT):
            for b, runs in zip(batches, plan.runs, strict=True):
                out: list[OutcomeValue] = []
                subject, now = b.subject, b.now
                for run in runs:
                    outputs = accepted.get(run.stat_key)
                    if outputs is None:
                        outputs = accepted[run.stat_key] = []
                    slot = new_reports.get(id(run.shared))
                    if slot is None:
                        slot = new_reports[id(run.shared)] = (run.shared, [])
                    rows = slot[1]
                    eps, cap = run.epsilon, run.cap
                    if unique:
                        st = state[run.key]
                        # The whole run fits under the cap (the common case): the
                        # same outcome as charging its reports one by one, in order.
                        total = st.spent + eps * len(run.rows)
                        if total <= cap:
                            st.spent, st.count, st.cap, st.dirty = (
                                total,
                                st.count + len(run.rows),
                                cap,
                                True,
                            )
                            rows.extend(run.rows)
                            outputs.extend(run.outputs)
                            out.extend([ACCEPTED] * len(run.rows))
                            continue
                    for report, row, output in zip(run.reports, run.rows, run.outputs, strict=True):
                        rid, digest = report[0], report[3]
                        if not unique:
                            prior = known.get(rid)
                            if prior is not None:
                                if prior == (subject, digest):
                                    out.append(DUPLICATE)
                                else:
                                    out.append(CONFLICT)
                                    new_conflicts.append((rid, subject, digest, now))
                                continue
                        st = state[run.key]
                        total = st.spent + eps
                        if total > cap:
                            out.append(BUDGET_EXHAUSTED)
                            if not read_ids:
                                refused.append(rid)
                            continue
                        st.spent, st.count, st.cap, st.dirty = total, st.count + 1, cap, True
                        if not unique:
                            known[rid] = (subject, digest)
                        rows.append(row)
                        outputs.append(output)
                        out.append(ACCEPTED)
                outcomes.append(out)

        if refused and self._stored_ids(db, set(refused)):
            self._stored_id_met()
        try:
            self._insert_reports(db, new_reports)
        except sa.exc.IntegrityError as exc:  # an id is stored (or was just inserted)
            if read_ids:
                raise
            self._stored_id_met(exc)
        if new_conflicts:
            db.executemany(self._sql["insert_conflicts"], new_conflicts)
        dirty = [
            (_s(st.spent), st.count, _s(st.cap), plan.latest_now, k[0], k[1], k[2], st.read_text)
            for k, st in state.items()
            if st.dirty
        ]
        if dirty:
            # An atomic conditional update (compare-and-set on the value read under
            # FOR UPDATE): if anything changed the row meanwhile, nothing is
            # written and the whole transaction reruns.
            if self.dialect == "sqlite":
                changed = 0
                for spend_rows in _chunks(dirty, _ROW_CHUNKS[0]):
                    changed += db.run(
                        self._in_sql("update_spend_values", len(spend_rows)),
                        list(chain.from_iterable(spend_rows)),
                    )
            else:
                changed = db.executemany(self._sql["update_spend"], dirty)
            if changed != len(dirty):
                raise _ConcurrentUpdateError(f"{len(dirty) - changed} spend row(s) moved")
        # (A run may have accepted nothing: its statistics row stays as it is.)
        accepted = {key: outputs for key, outputs in accepted.items() if outputs}
        if accepted:
            self._merge_statistics(db, plan, accepted, plan.latest_now, written)
        return outcomes

    def _read_generation(self, db: _Driver | _SaConn, *, charging: bool = False) -> int:
        """The recorded versions' generation (one primary-key read). A charge
        (`charging`) under PostgreSQL's SERIALIZABLE reads it FOR SHARE: a
        transaction whose snapshot predates a version's recording then fails with
        a serialization error and reruns with a fresh snapshot."""
        sql = self._sql["select_generation"]
        if charging and self.isolation == "SERIALIZABLE" and self.dialect == "postgresql":
            sql += " FOR SHARE"
        ((generation,),) = db.execute(sql, ())
        return int(generation)

    def _load_versions(self, db: _Driver | _SaConn) -> None:
        """Read every recorded version and its generation (one transaction) into the cache."""
        generation = self._read_generation(db)
        by_policy: dict[str, list[PolicyVersion]] = defaultdict(list)
        for row in db.execute(self._sql["select_versions"], ()):
            v = _policy_version(row)
            by_policy[v.policy_id].append(v)
        self._versions = _Versions(generation, {k: tuple(v) for k, v in by_policy.items()})

    def _recap(self, plan: _GroupPlan) -> None:
        """Work out the runs' caps again with the cached versions (a newer generation)."""
        versions = self._versions
        shared_now: dict[int, tuple[Any, ...]] = {}
        for runs in plan.runs:
            for i, run in enumerate(runs):
                window = run.key[2]
                shared = shared_now.get(id(run.shared))
                if shared is None:
                    cap_text = _s(self._cap_in_force(run.policy, window, versions))
                    shared = shared_now[id(run.shared)] = (*run.shared[:4], cap_text, run.shared[5])
                cap = self._window_cap(run.policy, window, versions)
                runs[i] = run._replace(cap=cap, shared=shared)
        plan.generation = versions.generation

    def _stored_id_met(self, cause: BaseException | None = None) -> NoReturn:
        """A group decided without reading its ids met a stored one: rerun it reading
        them, and so the next `_READ_IDS_AFTER_A_REPEAT` groups too."""
        self._read_ids_groups = _READ_IDS_AFTER_A_REPEAT
        self.stored_id_reruns += 1
        raise _StoredIdError("a report id was stored before") from cause

    def _insert_reports(
        self, db: _Driver, new_reports: Mapping[int, tuple[tuple[Any, ...], list[tuple[Any, ...]]]]
    ) -> None:
        """Insert the accepted reports: per policy, its shared values and the rows."""
        for shared, rows in new_reports.values():
            if not rows:
                continue
            if self.dialect == "sqlite":
                # Multi-row INSERTs of a few fixed sizes: one statement step (hence
                # one release of the GIL, see _ROW_CHUNKS) per up to 256 rows.
                done = 0
                for size in _row_chunk_sizes(len(rows)):
                    chunk = rows[done : done + size]
                    done += size
                    db.run(self._insert_reports_sql[size], [*shared, *chain.from_iterable(chunk)])
            else:
                # COPY: one stream, ≈ 4× less time per row than a pipelined
                # executemany (bench in docs/collector.md). A concurrent insert of the
                # same id fails it with 23505 (an IntegrityError), and the
                # transaction reruns.
                db.copy(self._copy_reports_sql, [shared + row for row in rows])

    def _stored_ids(self, db: _Driver, ids: set[bytes]) -> dict[bytes, tuple[str, bytes]]:
        """(subject, content digest) of every stored report among `ids`."""
        known: dict[bytes, tuple[str, bytes]] = {}
        blob = _blob_parameter(self.dialect)
        for chunk in _padded_chunks(list(ids), _IN_IDS):
            params = list(map(blob, chunk))
            for rid, subj, digest in db.execute(self._in_sql("select_ids", len(chunk)), params):
                known[bytes(rid)] = (subj, bytes(digest))
        return known

    def _lock_spend(
        self, db: _Driver, keys: Sequence[tuple[str, str, int]], now: int
    ) -> dict[tuple[str, str, int], _SpendState]:
        """Lock the spend rows of `keys` (FOR UPDATE), creating missing ones; their state.

        Rows are read first and only the missing ones inserted (ON CONFLICT DO
        NOTHING, then read again): a subject's row exists after its first report,
        so the common transaction has no insert here.
        """
        state: dict[tuple[str, str, int], _SpendState] = {}
        if not keys:
            return state
        self._read_spend(db, keys, state)
        missing = [k for k in keys if k not in state]
        if missing:
            db.executemany(
                self._sql["ensure_spend"], [(subj, pid, win, now) for subj, pid, win in missing]
            )
            self._read_spend(db, missing, state)
            lost = [k for k in missing if k not in state]
            if lost:  # cannot happen: the rows were just ensured inside this transaction
                raise RuntimeError(f"spend rows vanished inside a transaction: {len(lost)}")
        return state

    def _read_spend(
        self,
        db: _Driver,
        keys: Sequence[tuple[str, str, int]],
        state: dict[tuple[str, str, int], _SpendState],
    ) -> None:
        for chunk in _padded_chunks(keys, _IN_KEYS):
            rows = db.execute(
                self._in_sql("select_spend", len(chunk)), [v for key in chunk for v in key]
            )
            for subj, pid, win, spent_text, count, cap in rows:
                state[(subj, pid, int(win))] = _SpendState(
                    _dec(spent_text), int(count), _dec(cap), spent_text
                )

    def _merge_statistics(
        self,
        db: _Driver,
        plan: _GroupPlan,
        accepted: Mapping[tuple[str, int, int], list[Output]],
        now: int,
        written: dict[tuple[str, int, int], tuple[int, str]],
    ) -> None:
        """Add the accepted outputs to this shard's statistics rows.

        new = stored ⊕ (this group's accepted outputs accumulated into an empty
        statistic: `plan`'s when every output of the row was accepted), as JSON
        (`mechanism.statistic_to_json`). A row's (n, statistic_json) as of the last
        commit of this Ledger is kept in memory: for such a row the read is skipped
        and the UPDATE is conditional on the row still holding exactly that n and
        text (if anything else wrote it, the cache entry is dropped and the
        transaction reruns, reading the row). Other rows are created if missing and
        read under the transaction's lock. `plan`'s statistics are never modified
        (a rerun uses them again).
        """
        keys = sorted(accepted)
        with self._stats_lock:
            base = {k: self._stats_cache[k] for k in keys if k in self._stats_cache}
        fresh = [k for k in keys if k not in base]
        stored: dict[tuple[str, int, int], tuple[int, str | None]] = dict(base)
        if fresh:
            db.executemany(
                self._sql["ensure_statistics"],
                [(pid, ver, win, self.shard, now) for pid, ver, win in fresh],
            )
            for chunk in _padded_chunks(fresh, _IN_KEYS):
                rows = db.execute(
                    self._in_sql("select_statistics", len(chunk)),
                    [*(v for key in chunk for v in key), self.shard],
                )
                for pid, ver, win, n, text in rows:
                    stored[(pid, int(ver), int(win))] = (int(n), text)
        plain: list[tuple[Any, ...]] = []
        checked: list[tuple[Any, ...]] = []
        for key in keys:
            outputs = accepted[key]
            mech = plan.policies[key].mechanism
            stat, count = plan.statistics[key]
            if len(outputs) != count:  # some were not accepted: these outputs only
                stat = mech.new_statistic()
                accumulate = mech.accumulate
                for o in outputs:
                    accumulate(stat, o)
            n0, text0 = stored[key]
            if text0 is not None:
                merged = mech.statistic_from_json(text0)
                mech.merge_statistics(merged, stat)
                stat = merged
            n1, text1 = n0 + len(outputs), mech.statistic_to_json(stat)
            written[key] = (n1, text1)
            row = (n1, text1, now, key[0], key[1], key[2], self.shard)
            if key in base:
                checked.append((*row, n0, text0))
            else:
                plain.append(row)
        if plain:
            db.executemany(self._sql["update_statistics"], plain)
        if checked:
            done = db.executemany(self._sql["update_statistics_if"], checked)
            if done != len(checked):
                self._forget_statistics(base)
                raise _ConcurrentUpdateError("a statistics row moved since it was cached")

    def _forget_statistics(self, keys: Iterable[tuple[str, int, int]]) -> None:
        with self._stats_lock:
            for key in list(keys):
                self._stats_cache.pop(key, None)

    # -- reads --

    def spent(self, subject: str, policy_id: str, window_start: int) -> Decimal:
        """ε charged to `subject` under `policy_id` in the window starting at `window_start`."""

        def tx(conn: sa.Connection) -> Decimal:
            text = conn.execute(
                sa.select(spend.c.epsilon_spent).where(
                    spend.c.subject == subject,
                    spend.c.policy_id == policy_id,
                    spend.c.window_start == window_start,
                )
            ).scalar_one_or_none()
            return Decimal(0) if text is None else _dec(text)

        return self.transaction(tx, write=False)

    def subject_spend(self, subject: str) -> list[SpendRow]:
        """Every window `subject` was charged in, newest first."""

        def tx(conn: sa.Connection) -> list[SpendRow]:
            rows = conn.execute(
                sa.select(spend)
                .where(spend.c.subject == subject, spend.c.report_count > 0)
                .order_by(spend.c.window_start.desc(), spend.c.policy_id)
            )
            return [
                SpendRow(
                    r.subject,
                    r.policy_id,
                    int(r.window_start),
                    _dec(r.epsilon_spent),
                    int(r.report_count),
                    _dec(r.epsilon_cap),
                )
                for r in rows
            ]

        return self.transaction(tx, write=False)

    def statistics(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> list[PartialStatistic]:
        """Every shard's partial statistic for (policy, version[, window]); merge them."""

        def tx(conn: sa.Connection) -> list[PartialStatistic]:
            q = sa.select(statistics).where(
                statistics.c.policy_id == policy_id,
                statistics.c.policy_version == version,
                statistics.c.n > 0,
            )
            if window_start is not None:
                q = q.where(statistics.c.window_start == window_start)
            q = q.order_by(statistics.c.window_start, statistics.c.shard)
            return [
                PartialStatistic(
                    r.policy_id,
                    int(r.policy_version),
                    int(r.window_start),
                    r.shard,
                    int(r.n),
                    r.statistic_json,
                )
                for r in conn.execute(q)
            ]

        return self.transaction(tx, write=False)

    def report_count(self, policy_id: str, version: int, window_start: int | None = None) -> int:
        """Number of stored (accepted) reports for (policy, version[, window])."""

        def tx(conn: sa.Connection) -> int:
            q = (
                sa.select(sa.func.count())
                .select_from(reports)
                .where(reports.c.policy_id == policy_id, reports.c.policy_version == version)
            )
            if window_start is not None:
                q = q.where(reports.c.window_start == window_start)
            return int(conn.execute(q).scalar_one())

        return self.transaction(tx, write=False)

    def iter_outputs(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> list[Output]:
        """Every stored output for (policy, version[, window]), in no particular order."""

        def tx(conn: sa.Connection) -> list[Output]:
            q = sa.select(reports.c.payload).where(
                reports.c.policy_id == policy_id, reports.c.policy_version == version
            )
            if window_start is not None:
                q = q.where(reports.c.window_start == window_start)
            return [output_from_json(text) for (text,) in conn.execute(q)]

        return self.transaction(tx, write=False)

    def recompute_statistics(self, policy: LedgerPolicy, window_start: int | None = None) -> Any:
        """The statistic recomputed from the raw report rows (audit of `statistics`)."""
        mech = policy.mechanism
        stat = mech.new_statistic()
        for output in self.iter_outputs(policy.policy_id, policy.version, window_start):
            mech.accumulate(stat, output)
        return stat

    def conflict_count(self, subject: str | None = None) -> int:
        """How many conflicting report-id reuses were recorded (for `subject`, or all)."""

        def tx(conn: sa.Connection) -> int:
            q = sa.select(sa.func.count()).select_from(conflicts)
            if subject is not None:
                q = q.where(conflicts.c.subject == subject)
            return int(conn.execute(q).scalar_one())

        return self.transaction(tx, write=False)

    def has_report(self, report_id: bytes) -> bool:
        """Whether a report with this id is stored."""

        def tx(conn: sa.Connection) -> bool:
            return (
                conn.execute(
                    sa.select(reports.c.report_id).where(reports.c.report_id == report_id)
                ).first()
                is not None
            )

        return self.transaction(tx, write=False)

    # -- policy lineage --

    def claim_lineage(
        self, policy_id: str, metric_name: str, window_seconds: int, version: int, *, now: int
    ) -> PolicyLineage:
        """Record (policy id, metric name, window) unless recorded; the lineage that decides.

        Returns `policy_id`'s recorded lineage (just recorded by this call, or
        earlier), or, when `policy_id` has none and another policy id holds
        `metric_name`, that policy id's lineage: `PolicyLineage.refusal` says
        whether this version fits. Concurrent claims (collectors sharing one
        PostgreSQL ledger, or processes on one SQLite file) agree: the primary key
        and the unique metric name let exactly one insert win, and every other
        claim reads the winner's row (SQLite: BEGIN IMMEDIATE serializes them;
        PostgreSQL READ COMMITTED: ON CONFLICT DO NOTHING waits for the winner's
        commit and the next statement sees it; SERIALIZABLE: the loser's
        transaction is rerun).
        """
        if not policy_id or not metric_name:
            raise ValueError("policy_id and metric_name must be non-empty")
        if window_seconds <= 0:
            raise ValueError("window_seconds must be positive")

        def tx(conn: sa.Connection) -> PolicyLineage:
            conn.execute(
                self._insert_ignore(policy_lineage),
                [
                    {
                        "policy_id": policy_id,
                        "metric_name": metric_name,
                        "window_seconds": window_seconds,
                        "first_version": version,
                        "recorded_at": now,
                    }
                ],
            )
            for column, value in (
                (policy_lineage.c.policy_id, policy_id),
                (policy_lineage.c.metric_name, metric_name),
            ):
                row = conn.execute(sa.select(policy_lineage).where(column == value)).first()
                if row is not None:
                    return _lineage(row)
            raise RuntimeError(f"policy lineage of {policy_id!r} neither recorded nor found")

        return self.transaction(tx)

    def lineages(self) -> list[PolicyLineage]:
        """Every recorded policy lineage, by policy id."""

        def tx(conn: sa.Connection) -> list[PolicyLineage]:
            q = sa.select(policy_lineage).order_by(policy_lineage.c.policy_id)
            return [_lineage(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    # -- policy versions --

    def record_versions(
        self, versions: Sequence[PolicyVersion], *, clock: Callable[[], int]
    ) -> dict[tuple[str, int], str]:
        """Record each version not recorded yet, in one transaction; the refused ones.

        Returns {(policy id, version): why} for the versions that must not be
        activated; every other one is recorded (or was already, with the same
        digest). Refused, with a stable reason word first:

        * ``version_conflict``: the ledger holds other bytes (digest) for this
          (policy id, version), recorded by another collector;
        * ``cap_lowered``: the version is new to this ledger and its cap is below
          the cap in force (the smallest recorded cap) of a window of its validity
          that has already begun (`lowered_window`): spend made in that window
          before it was recorded could exceed it. Sign it with a `not_before` in a
          window that has not begun yet.

        Versions recorded together count as recorded at once (no charge can fall
        between them). The rule is decided at `clock()` read after every charge in
        progress has ended and before any other starts: on PostgreSQL the
        transaction first locks the spend table (EXCLUSIVE mode: charges lock
        their spend rows, so they wait, and the generation they read after that
        lock is this one's); on SQLite the writer lock does the same. A
        recorded version bumps the generation, so every collector's next charge
        transaction re-reads the versions.
        """

        def tx(conn: sa.Connection) -> dict[tuple[str, int], str]:
            if self.dialect == "postgresql":
                conn.exec_driver_sql("LOCK TABLE spend IN EXCLUSIVE MODE")
            now = clock()
            recorded: dict[str, list[PolicyVersion]] = defaultdict(list)
            for row in _SaConn(conn).execute(self._sql["select_versions"], ()):
                v = _policy_version(row)
                recorded[v.policy_id].append(v)
            known = {(v.policy_id, v.version): v for vs in recorded.values() for v in vs}
            refused: dict[tuple[str, int], str] = {}
            new: list[PolicyVersion] = []
            for v in sorted(versions, key=lambda x: (x.policy_id, x.version)):
                key = (v.policy_id, v.version)
                prior = known.get(key)
                if prior is not None:
                    if prior.digest != v.digest:
                        refused[key] = (
                            f"version_conflict: policy {v.policy_id!r} v{v.version} is recorded "
                            "in the ledger with other contents (another signed envelope for "
                            "the same version); publish one envelope per version"
                        )
                    continue
                lowered = lowered_window(v, recorded.get(v.policy_id, ()), now)
                if lowered is not None:
                    refused[key] = (
                        f"cap_lowered: policy {v.policy_id!r} v{v.version} (cap {v.epsilon_cap}) "
                        f"would lower the cap in force of the window starting at {lowered}, "
                        "which began before the version was recorded: spend already made "
                        "in it may exceed the new cap; sign it with not_before in a window "
                        "that has not begun (a lower cap takes effect from a window start)"
                    )
                    continue
                new.append(dataclasses.replace(v, recorded_at=now))
            if new:
                conn.execute(
                    sa.insert(policy_versions),
                    [
                        {
                            "policy_id": v.policy_id,
                            "version": v.version,
                            "epsilon_cap": _s(v.epsilon_cap),
                            "window_seconds": v.window_seconds,
                            "not_before": v.not_before,
                            "expires_at": v.expires_at,
                            "digest": v.digest,
                            "recorded_at": v.recorded_at,
                        }
                        for v in new
                    ],
                )
                conn.execute(
                    sa.update(policy_version_generation)
                    .where(policy_version_generation.c.id == 1)
                    .values(generation=policy_version_generation.c.generation + 1)
                )
            return refused

        return self.transaction(tx)

    def policy_versions(self) -> list[PolicyVersion]:
        """Every recorded policy version, by (policy id, version)."""

        def tx(conn: sa.Connection) -> list[PolicyVersion]:
            return [
                _policy_version(r) for r in _SaConn(conn).execute(self._sql["select_versions"], ())
            ]

        return self.transaction(tx, write=False)

    def cap_in_force(self, policy: LedgerPolicy, window_start: int) -> Decimal:
        """The cap a charge of `policy` in this window is checked against now: its cap
        lowered to the smallest cap of the recorded versions in force during the
        window (re-read when their generation changed). A restore gap is not
        applied here (GetBudget shows it separately)."""

        def tx(conn: sa.Connection) -> None:
            db = _SaConn(conn)
            if self._read_generation(db) != self._versions.generation:
                self._load_versions(db)

        self.transaction(tx, write=False)
        return self._cap_in_force(policy, window_start)

    # -- reconcile --

    def reconcile(self) -> list[Mismatch]:
        """Recompute every running total from the raw rows; every disagreement.

        Independent of the running totals: sums each subject's `reports.charge`
        per (policy, window) exactly and compares with `spend`; checks the raw sum
        against the cap in force, the smallest of the caps its reports were
        charged under and of the recorded versions in force during the window;
        checks each window start against its policy id's recorded window length;
        compares each statistics n with the stored report count; recomputes
        central commitments from the reservations. An empty list means the ledger is consistent.
        """
        return self.transaction(self._reconcile_tx, write=False)

    def _reconcile_tx(self, conn: sa.Connection) -> list[Mismatch]:
        out: list[Mismatch] = []
        raw: dict[tuple[str, str, int], list[Any]] = defaultdict(lambda: [Decimal(0), 0, None])
        count_by_policy: dict[tuple[str, int, int], int] = defaultdict(int)
        rows = conn.execution_options(stream_results=True, yield_per=5000).execute(
            sa.select(
                reports.c.subject,
                reports.c.policy_id,
                reports.c.policy_version,
                reports.c.window_start,
                reports.c.charge,
                reports.c.epsilon_cap,
            )
        )
        for subj, pid, ver, win, charge, cap in rows:
            acc = raw[(subj, pid, int(win))]
            acc[0] = EXACT.add(acc[0], _dec(charge))
            acc[1] += 1
            capd = _dec(cap)
            acc[2] = capd if acc[2] is None else min(acc[2], capd)
            count_by_policy[(pid, int(ver), int(win))] += 1
        windows = {
            pid: int(w)
            for pid, w in conn.execute(
                sa.select(policy_lineage.c.policy_id, policy_lineage.c.window_seconds)
            )
        }
        versions: dict[str, list[PolicyVersion]] = defaultdict(list)
        for row in _SaConn(conn).execute(self._sql["select_versions"], ()):
            v = _policy_version(row)
            versions[v.policy_id].append(v)
        recorded = {
            (r.subject, r.policy_id, int(r.window_start)): (
                _dec(r.epsilon_spent),
                int(r.report_count),
            )
            for r in conn.execute(sa.select(spend))
        }
        for key in sorted(set(raw) | set(recorded)):
            spent_raw, n_raw, cap = raw[key] if key in raw else (Decimal(0), 0, None)
            spent_rec, n_rec = recorded.get(key, (Decimal(0), 0))
            scope = f"policy={key[1]} window={key[2]}"
            if spent_raw != spent_rec or n_raw != n_rec:
                out.append(
                    Mismatch(
                        "spend",
                        key[0],
                        scope,
                        f"{spent_raw} ({n_raw} reports)",
                        f"{spent_rec} ({n_rec} reports)",
                    )
                )
            window = windows.get(key[1])
            if cap is not None and window is not None:
                # The cap in force: also every recorded version in force during the window.
                recorded_cap = smallest_cap(versions.get(key[1], ()), key[2], window)
                if recorded_cap is not None and recorded_cap < cap:
                    cap = recorded_cap
            if cap is not None and spent_raw > cap:
                out.append(Mismatch("over_cap", key[0], scope, str(spent_raw), f"cap {cap}"))
            if window is not None and key[2] % window != 0:
                out.append(
                    Mismatch("window", key[0], scope, f"{spent_raw} charged", f"window {window} s")
                )
        stat_n: dict[tuple[str, int, int], int] = defaultdict(int)
        for pid, ver, win, n in conn.execute(
            sa.select(
                statistics.c.policy_id,
                statistics.c.policy_version,
                statistics.c.window_start,
                statistics.c.n,
            )
        ):
            stat_n[(pid, int(ver), int(win))] += int(n)
        for key in sorted(set(stat_n) | set(count_by_policy)):
            if stat_n.get(key, 0) != count_by_policy.get(key, 0):
                out.append(
                    Mismatch(
                        "statistic_count",
                        None,
                        f"policy={key[0]} version={key[1]} window={key[2]}",
                        str(count_by_policy.get(key, 0)),
                        str(stat_n.get(key, 0)),
                    )
                )
        committed: dict[tuple[str, str], list[Decimal]] = defaultdict(
            lambda: [Decimal(0), Decimal(0)]
        )
        for r in conn.execute(sa.select(central_reservations)):
            acc2 = committed[(r.subject, r.purpose)]
            if r.status == "reserved":
                eps, delta = _dec(r.epsilon), _dec(r.delta)
            elif r.status == "settled":
                eps, delta = _dec(r.epsilon_spent), _dec(r.delta_spent)
            else:
                continue
            acc2[0] = EXACT.add(acc2[0], eps)
            acc2[1] = EXACT.add(acc2[1], delta)
        caps = {(r.subject, r.purpose): r for r in conn.execute(sa.select(central_caps))}
        for ckey in sorted(set(committed) | set(caps)):
            eps_raw, delta_raw = committed[ckey] if ckey in committed else (Decimal(0), Decimal(0))
            scope = f"purpose={ckey[1]}"
            cap_row = caps.get(ckey)
            if cap_row is None:
                out.append(
                    Mismatch(
                        "central", ckey[0], scope, f"eps={eps_raw} delta={delta_raw}", "no cap row"
                    )
                )
                continue
            eps_rec, delta_rec = _dec(cap_row.epsilon_committed), _dec(cap_row.delta_committed)
            if eps_raw != eps_rec or delta_raw != delta_rec:
                out.append(
                    Mismatch(
                        "central",
                        ckey[0],
                        scope,
                        f"eps={eps_raw} delta={delta_raw}",
                        f"eps={eps_rec} delta={delta_rec}",
                    )
                )
            if eps_raw > _dec(cap_row.epsilon_cap) or delta_raw > _dec(cap_row.delta_cap):
                out.append(
                    Mismatch(
                        "central_over_cap",
                        ckey[0],
                        scope,
                        f"eps={eps_raw} delta={delta_raw}",
                        f"cap eps={cap_row.epsilon_cap} delta={cap_row.delta_cap}",
                    )
                )
        return out

    # -- central releases --

    def set_central_cap(
        self,
        subject: str,
        purpose: str,
        *,
        epsilon_cap: Decimal,
        delta_cap: Decimal,
        now: int | None = None,
    ) -> None:
        """Set (or change) the central (ε, δ) cap of (subject, purpose): an operator action.

        Lowering a cap below what is already committed is allowed (no new
        reservation will fit) but never releases anything.
        """
        _exact_decimal("epsilon_cap", epsilon_cap, positive=False)
        _exact_decimal("delta_cap", delta_cap, positive=False)
        if delta_cap >= 1:
            raise ValueError("delta_cap must be below 1")
        if not subject or not purpose:
            raise ValueError("subject and purpose must be non-empty")
        stamp = int(time.time()) if now is None else now

        def tx(conn: sa.Connection) -> None:
            conn.execute(
                self._insert_ignore(central_caps),
                [
                    {
                        "subject": subject,
                        "purpose": purpose,
                        "epsilon_cap": _s(epsilon_cap),
                        "delta_cap": _s(delta_cap),
                        "epsilon_committed": "0",
                        "delta_committed": "0",
                        "updated_at": stamp,
                    }
                ],
            )
            conn.execute(
                sa.update(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .values(epsilon_cap=_s(epsilon_cap), delta_cap=_s(delta_cap), updated_at=stamp)
            )

        self.transaction(tx)

    def central_cap(self, subject: str, purpose: str) -> tuple[Decimal, Decimal] | None:
        """The (ε, δ) cap of (subject, purpose), or None when none is set."""

        def tx(conn: sa.Connection) -> tuple[Decimal, Decimal] | None:
            row = conn.execute(
                sa.select(central_caps.c.epsilon_cap, central_caps.c.delta_cap).where(
                    central_caps.c.subject == subject, central_caps.c.purpose == purpose
                )
            ).first()
            return None if row is None else (_dec(row[0]), _dec(row[1]))

        return self.transaction(tx, write=False)

    def reserve(
        self,
        *,
        subject: str,
        purpose: str,
        epsilon: Decimal,
        delta: Decimal,
        idempotency_key: str,
        now: int,
        metadata: Mapping[str, str] | None = None,
        owner: str | None = None,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> Reservation:
        """Claim (ε, δ) for one central run before any protected data is read.

        The cap is read from the ledger (`set_central_cap`), never from the caller.
        Raises NoCentralCapError when none is set, CentralBudgetExhaustedError when
        reserved + settled + this would exceed the cap (basic composition),
        CentralSpendUnconfirmedError while a restore's central spend is unconfirmed
        (restore.py; read in this transaction), and IdempotencyConflictError when
        `idempotency_key` was used for a different (subject, purpose, ε, δ).

        Ownership: the new row is claimed by `owner` (a fresh random token when
        None) with a lease until now + `lease_seconds`, in the same transaction
        that checks the key (unique: a concurrent insert of the key reruns and
        finds it), so exactly one caller ever claims a key. The same key again
        returns the existing reservation with *its* owner and reserves nothing:
        a caller holds the reservation only when ``result.held_by(owner)``.
        """
        _exact_decimal("epsilon", epsilon, positive=True)
        _exact_decimal("delta", delta, positive=False)
        if not idempotency_key:
            raise ValueError("idempotency_key must be non-empty")
        if lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        meta = dict(metadata or {})
        claimant = owner or secrets.token_hex(16)

        def tx(conn: sa.Connection) -> Reservation:
            prior = conn.execute(
                sa.select(central_reservations).where(
                    central_reservations.c.idempotency_key == idempotency_key
                )
            ).first()
            if prior is not None:
                res = _reservation(prior)
                if (res.subject, res.purpose, res.epsilon, res.delta) != (
                    subject,
                    purpose,
                    epsilon,
                    delta,
                ):
                    raise IdempotencyConflictError(
                        "this idempotency key was used for a different reservation; "
                        "use a new key for a new release"
                    )
                return res
            _refuse_if_unconfirmed(conn)
            cap = conn.execute(
                sa.select(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .with_for_update()
            ).first()
            if cap is None:
                raise NoCentralCapError(
                    f"no central cap for subject {subject!r}, purpose {purpose!r}; "
                    "an operator sets one with `fedldp ledger set-cap`"
                )
            eps_total = EXACT.add(_dec(cap.epsilon_committed), epsilon)
            delta_total = EXACT.add(_dec(cap.delta_committed), delta)
            if eps_total > _dec(cap.epsilon_cap) or delta_total > _dec(cap.delta_cap):
                raise CentralBudgetExhaustedError(
                    f"reserving eps={epsilon} delta={delta} would exceed the cap "
                    f"(eps={cap.epsilon_cap}, delta={cap.delta_cap}); committed "
                    f"eps={cap.epsilon_committed}, delta={cap.delta_committed}"
                )
            rid = secrets.token_hex(16)
            conn.execute(
                sa.insert(central_reservations).values(
                    id=rid,
                    subject=subject,
                    purpose=purpose,
                    epsilon=_s(epsilon),
                    delta=_s(delta),
                    status="reserved",
                    epsilon_spent=None,
                    delta_spent=None,
                    idempotency_key=idempotency_key,
                    metadata_json=json.dumps(meta, sort_keys=True),
                    events_json=None,
                    created_at=now,
                    closed_at=None,
                    owner=claimant,
                    lease_expires_at=now + lease_seconds,
                    data_opened_at=None,
                    close_reason=None,
                )
            )
            conn.execute(
                sa.update(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .values(
                    epsilon_committed=_s(eps_total), delta_committed=_s(delta_total), updated_at=now
                )
            )
            _log(conn, rid, now, "reserved", epsilon=str(epsilon), delta=str(delta))
            return Reservation(
                rid,
                subject,
                purpose,
                epsilon,
                delta,
                "reserved",
                None,
                None,
                idempotency_key,
                now,
                meta,
                None,
                claimant,
                now + lease_seconds,
            )

        return self.transaction(tx)

    def confirm_central(
        self,
        spent: Sequence[tuple[str, str, Decimal, Decimal]],
        *,
        now: int,
        note: str = "",
    ) -> int:
        """Lift a restore's block on central reservations (restore.py), re-entering
        the central spend made after the backup; returns the epochs confirmed.

        Each (subject, purpose, ε, δ) in `spent` becomes one settled release,
        added to the cap's committed total even above the cap (it was spent; this
        never refunds); an empty `spent` confirms that none was made. All of it,
        and the confirmation, commit in one transaction. Raises
        NothingToConfirmError when no restored epoch awaits confirmation, and
        NoCentralCapError when a (subject, purpose) has no cap (set it first).
        """
        entries = [_reentry(*entry) for entry in spent]

        def tx(conn: sa.Connection) -> int:
            for subject, purpose, eps, delta in entries:
                self._reenter(conn, subject, purpose, eps, delta, now=now, note=note)
            confirmed = restore.confirm_central(conn, now=now)
            if confirmed == 0:
                raise NothingToConfirmError(
                    "no restore of this ledger awaits confirmation of its central spend"
                    + _unrestored_hint(conn)
                )
            return confirmed

        return self.transaction(tx)

    def _reenter(
        self,
        conn: sa.Connection,
        subject: str,
        purpose: str,
        eps: Decimal,
        delta: Decimal,
        *,
        now: int,
        note: str,
    ) -> None:
        """Record (ε, δ) spent by (subject, purpose) after a backup as a settled release."""
        cap = conn.execute(
            sa.select(central_caps)
            .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
            .with_for_update()
        ).first()
        if cap is None:
            raise NoCentralCapError(
                f"no central cap for subject {subject!r}, purpose {purpose!r}: set it with "
                "`fedldp ledger set-cap` before re-entering its spend"
            )
        rid = secrets.token_hex(16)
        conn.execute(
            sa.insert(central_reservations).values(
                id=rid,
                subject=subject,
                purpose=purpose,
                epsilon=_s(eps),
                delta=_s(delta),
                status="settled",
                epsilon_spent=_s(eps),
                delta_spent=_s(delta),
                idempotency_key=f"restore-reentry:{rid}",
                metadata_json=json.dumps({"reentered_after_restore": note}, sort_keys=True),
                events_json=None,
                created_at=now,
                closed_at=now,
                owner=None,
                lease_expires_at=None,
                data_opened_at=None,
                close_reason="re-entered after a restore from backup",
            )
        )
        conn.execute(
            sa.update(central_caps)
            .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
            .values(
                epsilon_committed=_s(EXACT.add(_dec(cap.epsilon_committed), eps)),
                delta_committed=_s(EXACT.add(_dec(cap.delta_committed), delta)),
                updated_at=now,
            )
        )
        _log(conn, rid, now, "reentered", epsilon=str(eps), delta=str(delta), note=note)

    def open_data(
        self,
        reservation_id: str,
        *,
        owner: str,
        now: int,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> Reservation:
        """Record, durably, that `owner` is about to read the protected data.

        Call it BEFORE the first read: once committed, the reservation can no
        longer be cancelled (`cancel` raises DataOpenedError), only settled as
        spent, whatever happens to the run (error, interrupt, crash). Renews the
        lease. Idempotent for the owner; another owner gets ReservationOwnedError,
        a closed reservation ReservationStateError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            opened = res.data_opened_at if res.data_opened_at is not None else now
            conn.execute(
                sa.update(central_reservations)
                .where(central_reservations.c.id == reservation_id)
                .values(data_opened_at=opened, lease_expires_at=now + lease_seconds)
            )
            if res.data_opened_at is None:
                _log(conn, reservation_id, now, "data_opened")
            return dataclasses.replace(
                res, data_opened_at=opened, lease_expires_at=now + lease_seconds
            )

        return self.transaction(tx)

    def renew_lease(
        self, reservation_id: str, *, owner: str, now: int, lease_seconds: int
    ) -> Reservation:
        """Extend the owner's lease to now + `lease_seconds` (a heartbeat of a long run)."""

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            conn.execute(
                sa.update(central_reservations)
                .where(central_reservations.c.id == reservation_id)
                .values(lease_expires_at=now + lease_seconds)
            )
            return dataclasses.replace(res, lease_expires_at=now + lease_seconds)

        return self.transaction(tx)

    def settle(
        self,
        reservation_id: str,
        *,
        epsilon_spent: Decimal,
        delta_spent: Decimal,
        events: Sequence[Mapping[str, object]] = (),
        now: int,
        owner: str | None = None,
        reason: str = "released",
    ) -> Reservation:
        """Record what a run really spent (≤ reserved); the rest is released.

        `events` (JSON-serializable mappings, e.g. {"kind":
        "poisson_subsampled_gaussian", "noise_multiplier": ..., "sample_rate":
        ..., "steps": ...}) are kept for replay by an RDP/PLD accountant;
        `reason` says why it closed. `owner` must be the claiming run's token
        (ReservationOwnedError otherwise); None is the administrative path (no
        ownership check). Settling again by the same owner with the same
        amounts AND the same events returns the settled reservation; a
        reservation an operator settled as stale (`settle_stale`) is never
        "already settled" for its run: that raises ReservationStateError, so a
        run whose reservation was taken from it publishes nothing (its events
        would not be recorded). Any other transition raises
        ReservationStateError. Spent above reserved raises ValueError.
        """
        _exact_decimal("epsilon_spent", epsilon_spent, positive=False)
        _exact_decimal("delta_spent", delta_spent, positive=False)
        events_json = json.dumps([dict(e) for e in events], sort_keys=True, default=str)

        def tx(conn: sa.Connection) -> Reservation:
            row = self._locked_reservation(conn, reservation_id)
            res = _reservation(row)
            _check_owner(res, owner)
            if res.status == "settled" and (res.close_reason or "").startswith(STALE_REASON):
                raise ReservationStateError(
                    f"reservation {reservation_id} was settled as stale by an operator "
                    "(its lease had expired); its budget is spent and this run must publish "
                    "nothing"
                )
            if (
                res.status == "settled"
                and (res.epsilon_spent, res.delta_spent) == (epsilon_spent, delta_spent)
                and _same_events(row.events_json, events_json)
            ):
                return res
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if epsilon_spent > res.epsilon or delta_spent > res.delta:
                raise ValueError(
                    f"spent (eps={epsilon_spent}, delta={delta_spent}) exceeds reserved "
                    f"(eps={res.epsilon}, delta={res.delta})"
                )
            self._close(conn, res, "settled", epsilon_spent, delta_spent, events_json, reason, now)
            _log(
                conn,
                reservation_id,
                now,
                "settled",
                epsilon_spent=str(epsilon_spent),
                delta_spent=str(delta_spent),
                reason=reason,
            )
            return dataclasses.replace(
                res,
                status="settled",
                epsilon_spent=epsilon_spent,
                delta_spent=delta_spent,
                closed_at=now,
                close_reason=reason,
            )

        return self.transaction(tx)

    def cancel(self, reservation_id: str, *, now: int, owner: str | None = None) -> Reservation:
        """Release a whole reservation of a run that read no protected byte.

        Refused with DataOpenedError once `open_data` was recorded: from then on
        the reservation is settled as spent, never refunded. Cancelling a
        cancelled reservation returns it; a settled one raises
        ReservationStateError; another owner's, ReservationOwnedError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status == "cancelled":
                return res
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if res.data_opened_at is not None:
                raise DataOpenedError(
                    f"reservation {reservation_id} opened the protected data at "
                    f"{res.data_opened_at}; it can only be settled as spent"
                )
            reason = "cancelled before the data was opened"
            self._close(conn, res, "cancelled", None, None, None, reason, now)
            _log(conn, reservation_id, now, "cancelled", reason=reason)
            return dataclasses.replace(res, status="cancelled", closed_at=now, close_reason=reason)

        return self.transaction(tx)

    def settle_stale(self, reservation_id: str, *, now: int, note: str = "") -> Reservation:
        """Operator action: settle an open reservation whose lease ran out, AS SPENT.

        The full reserved (ε, δ) is charged (nothing is ever refunded this way,
        whether or not the run opened its data) and the action is logged as a
        ``settled_stale`` event with `note`. A live lease raises LeaseActiveError;
        a closed reservation, ReservationStateError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if not res.stale(now):
                raise LeaseActiveError(
                    f"reservation {reservation_id} is held by a live run until "
                    f"{res.lease_expires_at}; settle it after its lease expires"
                )
            reason = STALE_REASON + (f" ({note})" if note else "")
            self._close(conn, res, "settled", res.epsilon, res.delta, "[]", reason, now)
            _log(
                conn,
                reservation_id,
                now,
                "settled_stale",
                epsilon_spent=str(res.epsilon),
                delta_spent=str(res.delta),
                data_opened=res.data_opened_at is not None,
                note=note,
            )
            return dataclasses.replace(
                res,
                status="settled",
                epsilon_spent=res.epsilon,
                delta_spent=res.delta,
                closed_at=now,
                close_reason=reason,
            )

        return self.transaction(tx)

    def _close(
        self,
        conn: sa.Connection,
        res: Reservation,
        status: str,
        eps_spent: Decimal | None,
        delta_spent: Decimal | None,
        events_json: str | None,
        reason: str,
        now: int,
    ) -> None:
        """Move `res` to `status`, releasing from the cap what was reserved but not spent."""
        self._release(
            conn,
            res,
            EXACT.subtract(res.epsilon, eps_spent or Decimal(0)),
            EXACT.subtract(res.delta, delta_spent or Decimal(0)),
            now,
        )
        conn.execute(
            sa.update(central_reservations)
            .where(central_reservations.c.id == res.id)
            .values(
                status=status,
                epsilon_spent=None if eps_spent is None else _s(eps_spent),
                delta_spent=None if delta_spent is None else _s(delta_spent),
                events_json=events_json,
                closed_at=now,
                close_reason=reason,
            )
        )

    def _locked_reservation(self, conn: sa.Connection, reservation_id: str) -> Any:
        row = conn.execute(
            sa.select(central_reservations)
            .where(central_reservations.c.id == reservation_id)
            .with_for_update()
        ).first()
        if row is None:
            raise ReservationNotFoundError(f"no reservation {reservation_id!r}")
        return row

    def _release(
        self, conn: sa.Connection, res: Reservation, eps: Decimal, delta: Decimal, now: int
    ) -> None:
        cap = conn.execute(
            sa.select(central_caps)
            .where(central_caps.c.subject == res.subject, central_caps.c.purpose == res.purpose)
            .with_for_update()
        ).one()
        conn.execute(
            sa.update(central_caps)
            .where(central_caps.c.subject == res.subject, central_caps.c.purpose == res.purpose)
            .values(
                epsilon_committed=_s(EXACT.subtract(_dec(cap.epsilon_committed), eps)),
                delta_committed=_s(EXACT.subtract(_dec(cap.delta_committed), delta)),
                updated_at=now,
            )
        )

    def reservation(self, reservation_id: str) -> Reservation:
        """One reservation by id (ReservationNotFoundError when there is none)."""

        def tx(conn: sa.Connection) -> Reservation:
            row = conn.execute(
                sa.select(central_reservations).where(central_reservations.c.id == reservation_id)
            ).first()
            if row is None:
                raise ReservationNotFoundError(f"no reservation {reservation_id!r}")
            return _reservation(row)

        return self.transaction(tx, write=False)

    def all_reservations(self) -> list[Reservation]:
        """Every central reservation of every subject, oldest first."""

        def tx(conn: sa.Connection) -> list[Reservation]:
            q = sa.select(central_reservations).order_by(
                central_reservations.c.created_at, central_reservations.c.id
            )
            return [_reservation(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    def reservation_log(self, reservation_id: str) -> list[dict[str, object]]:
        """The transitions of one reservation, oldest first: {"at", "action", **detail}."""

        def tx(conn: sa.Connection) -> list[dict[str, object]]:
            q = (
                sa.select(central_reservation_log)
                .where(central_reservation_log.c.reservation_id == reservation_id)
                .order_by(central_reservation_log.c.id)
            )
            return [
                {"at": int(r.at), "action": r.action, **json.loads(r.detail_json)}
                for r in conn.execute(q)
            ]

        return self.transaction(tx, write=False)

    def ledger_id(self) -> str:
        """This ledger's identity (a UUID drawn when its schema was created)."""

        def tx(conn: sa.Connection) -> str:
            value = conn.execute(
                sa.select(ledger_info.c.value).where(ledger_info.c.key == "ledger_id")
            ).scalar_one()
            return str(value)

        return self.transaction(tx, write=False)

    def central_spend(self, subject: str, purpose: str) -> tuple[Decimal, Decimal]:
        """(ε, δ) reserved + settled for (subject, purpose), by basic composition."""

        def tx(conn: sa.Connection) -> tuple[Decimal, Decimal]:
            row = conn.execute(
                sa.select(central_caps.c.epsilon_committed, central_caps.c.delta_committed).where(
                    central_caps.c.subject == subject, central_caps.c.purpose == purpose
                )
            ).first()
            return (Decimal(0), Decimal(0)) if row is None else (_dec(row[0]), _dec(row[1]))

        return self.transaction(tx, write=False)

    def reservations(self, subject: str, purpose: str | None = None) -> list[Reservation]:
        """Every reservation of `subject` (for `purpose`), oldest first."""

        def tx(conn: sa.Connection) -> list[Reservation]:
            q = sa.select(central_reservations).where(central_reservations.c.subject == subject)
            if purpose is not None:
                q = q.where(central_reservations.c.purpose == purpose)
            q = q.order_by(central_reservations.c.created_at, central_reservations.c.id)
            return [_reservation(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    def central_events(self, subject: str, purpose: str) -> list[CentralEvent]:
        """Every event of every settled release of (subject, purpose), oldest first."""
        out: list[CentralEvent] = []
        for res in self.reservations(subject, purpose):
            if res.status != "settled":
                continue
            assert res.epsilon_spent is not None and res.delta_spent is not None
            out.extend(
                CentralEvent(
                    res.id,
                    res.subject,
                    res.purpose,
                    res.epsilon_spent,
                    res.delta_spent,
                    res.closed_at or res.created_at,
                    ev,
                )
                for ev in self._events_of(res.id)
            )
        return out

    def _events_of(self, reservation_id: str) -> list[dict[str, object]]:
        def tx(conn: sa.Connection) -> list[dict[str, object]]:
            text = conn.execute(
                sa.select(central_reservations.c.events_json).where(
                    central_reservations.c.id == reservation_id
                )
            ).scalar_one()
            return list(json.loads(text)) if text else []

        return self.transaction(tx, write=False)


def _policy_version(row: Sequence[Any]) -> PolicyVersion:
    """A `select_versions` row as a PolicyVersion."""
    pid, version, cap, window, not_before, expires_at, digest, recorded_at = row
    return PolicyVersion(
        pid,
        int(version),
        _dec(cap),
        int(window),
        int(not_before),
        int(expires_at),
        bytes(digest),
        int(recorded_at),
    )


def _lineage(row: Any) -> PolicyLineage:
    return PolicyLineage(
        row.policy_id,
        row.metric_name,
        int(row.window_seconds),
        int(row.first_version),
        int(row.recorded_at),
    )


def _reentry(
    subject: str, purpose: str, eps: Decimal, delta: Decimal
) -> tuple[str, str, Decimal, Decimal]:
    """One validated (subject, purpose, ε > 0, 0 ≤ δ < 1) re-entry for `confirm_central`."""
    if not subject or not purpose:
        raise ValueError("subject and purpose must be non-empty")
    _exact_decimal("epsilon", eps, positive=True)
    _exact_decimal("delta", delta, positive=False)
    if delta >= 1:
        raise ValueError("delta must be below 1")
    return subject, purpose, eps, delta


def _refuse_if_unconfirmed(conn: sa.Connection) -> None:
    """CentralSpendUnconfirmedError while a restore's central spend is unconfirmed."""
    gap = restore.unconfirmed_central(conn)
    if gap is None:
        return
    if gap.restore_time is None:
        raise CentralSpendUnconfirmedError(
            f"this ledger is a backup copy (taken at {gap.backup_time}) that was never "
            "restored: restore it with `fedldp ledger restore`, then confirm its central "
            "spend with `fedldp ledger confirm-central`"
        )
    raise CentralSpendUnconfirmedError(
        f"central reservations are blocked: this ledger was restored from a backup taken at "
        f"{gap.backup_time} (restored at {gap.restore_time}) and the central spend made after "
        "the backup is unconfirmed; re-enter it with `fedldp ledger confirm-central --spent "
        "SUBJECT PURPOSE EPSILON DELTA` (once per release) or confirm none was made with "
        "`fedldp ledger confirm-central --none`"
    )


def _unrestored_hint(conn: sa.Connection) -> str:
    gap = restore.unconfirmed_central(conn)
    if gap is not None and gap.restore_time is None:
        return " (this is a backup copy never restored: run `fedldp ledger restore` first)"
    return ""


def _check_owner(res: Reservation, owner: str | None) -> None:
    """ReservationOwnedError when `owner` is given and is not the reservation's owner."""
    if owner is not None and res.owner is not None and not res.held_by(owner):
        raise ReservationOwnedError(
            f"reservation {res.id} belongs to another run; this run may not change it"
        )


def _log(conn: sa.Connection, reservation_id: str, now: int, action: str, **detail: object) -> None:
    conn.execute(
        sa.insert(central_reservation_log).values(
            reservation_id=reservation_id,
            at=now,
            action=action,
            detail_json=json.dumps(detail, sort_keys=True),
        )
    )


#: close_reason prefix of a reservation an operator settled with `settle_stale`.
STALE_REASON = "operator: stale lease settled as spent"


def _same_events(stored: str | None, new: str) -> bool:
    """Whether a settled reservation's stored events equal `new` (both JSON lists)."""
    return stored is not None and json.loads(stored) == json.loads(new)


def _reservation(row: Any) -> Reservation:
    return Reservation(
        id=row.id,
        subject=row.subject,
        purpose=row.purpose,
        epsilon=_dec(row.epsilon),
        delta=_dec(row.delta),
        status=row.status,
        epsilon_spent=None if row.epsilon_spent is None else _dec(row.epsilon_spent),
        delta_spent=None if row.delta_spent is None else _dec(row.delta_spent),
        idempotency_key=row.idempotency_key,
        created_at=int(row.created_at),
        metadata=json.loads(row.metadata_json),
        closed_at=None if row.closed_at is None else int(row.closed_at),
        owner=row.owner,
        lease_expires_at=None if row.lease_expires_at is None else int(row.lease_expires_at),
        data_opened_at=None if row.data_opened_at is None else int(row.data_opened_at),
        close_reason=row.close_reason,
    )


def _statements(dialect: str) -> dict[str, str]:
    """The fixed statements of the ingestion hot path, in the driver's paramstyle."""
    ph = "?" if dialect == "sqlite" else "%s"
    return {
        "select_generation": "SELECT generation FROM policy_version_generation WHERE id = 1",
        "select_versions": "SELECT policy_id, version, epsilon_cap, window_seconds, not_before,"
        " expires_at, digest, recorded_at FROM policy_versions ORDER BY policy_id, version",
        "insert_conflicts": "INSERT INTO conflicts (report_id, subject, content_digest, seen_at)"
        f" VALUES ({ph}, {ph}, {ph}, {ph})",
        "ensure_spend": "INSERT INTO spend (subject, policy_id, window_start, epsilon_spent,"
        f" report_count, epsilon_cap, updated_at) VALUES ({ph}, {ph}, {ph}, '0', 0, '0', {ph})"
        " ON CONFLICT DO NOTHING",
        "update_spend": f"UPDATE spend SET epsilon_spent = {ph}, report_count = {ph},"
        f" epsilon_cap = {ph}, updated_at = {ph} WHERE subject = {ph} AND policy_id = {ph}"
        f" AND window_start = {ph} AND epsilon_spent = {ph}",
        "ensure_statistics": "INSERT INTO statistics (policy_id, policy_version, window_start,"
        f" shard, n, statistic_json, updated_at) VALUES ({ph}, {ph}, {ph}, {ph}, 0, NULL, {ph})"
        " ON CONFLICT DO NOTHING",
        "update_statistics": f"UPDATE statistics SET n = {ph}, statistic_json = {ph},"
        f" updated_at = {ph} WHERE policy_id = {ph} AND policy_version = {ph}"
        f" AND window_start = {ph} AND shard = {ph}",
        "update_statistics_if": f"UPDATE statistics SET n = {ph}, statistic_json = {ph},"
        f" updated_at = {ph} WHERE policy_id = {ph} AND policy_version = {ph}"
        f" AND window_start = {ph} AND shard = {ph} AND n = {ph} AND statistic_json = {ph}",
    }


def _in_statement(dialect: str, name: str, size: int) -> str:
    """A hot-path read with an IN list of `size` ids or keys.

    On SQLite a list of keys is a VALUES table joined to the primary key (one
    index lookup per key; a row-value IN list would scan the whole table). On
    PostgreSQL the spend and statistics rows are locked FOR UPDATE, in key order.
    """
    if dialect == "sqlite":
        ids = ", ".join(["?"] * size)
        keys = ", ".join(["(?, ?, ?)"] * size)
        return {
            "select_ids": "SELECT report_id, subject, content_digest FROM reports"
            f" WHERE report_id IN ({ids})",
            "select_spend": f"WITH k(s, p, w) AS (VALUES {keys}) SELECT spend.subject,"
            " spend.policy_id, spend.window_start, spend.epsilon_spent, spend.report_count,"
            " spend.epsilon_cap FROM k CROSS JOIN spend ON spend.subject = k.s"
            " AND spend.policy_id = k.p AND spend.window_start = k.w",
            "update_spend_values": "UPDATE spend SET epsilon_spent = v.column1,"
            " report_count = v.column2, epsilon_cap = v.column3, updated_at = v.column4"
            f" FROM (VALUES {', '.join(['(?, ?, ?, ?, ?, ?, ?, ?)'] * size)}) AS v"
            " WHERE spend.subject = v.column5 AND spend.policy_id = v.column6"
            " AND spend.window_start = v.column7 AND spend.epsilon_spent = v.column8",
            "select_statistics": f"WITH k(p, v, w) AS (VALUES {keys}) SELECT st.policy_id,"
            " st.policy_version, st.window_start, st.n, st.statistic_json FROM k"
            " CROSS JOIN statistics AS st ON st.policy_id = k.p AND st.policy_version = k.v"
            " AND st.window_start = k.w AND st.shard = ?",
        }[name]
    ids = ", ".join(["%s"] * size)
    keys = ", ".join(["(%s, %s, %s)"] * size)
    return {
        "select_ids": f"SELECT report_id, subject, content_digest FROM reports"
        f" WHERE report_id IN ({ids})",
        "select_spend": "SELECT subject, policy_id, window_start, epsilon_spent, report_count,"
        f" epsilon_cap FROM spend WHERE (subject, policy_id, window_start) IN ({keys})"
        " ORDER BY subject, policy_id, window_start FOR UPDATE",
        "select_statistics": "SELECT policy_id, policy_version, window_start, n, statistic_json"
        f" FROM statistics WHERE (policy_id, policy_version, window_start) IN ({keys})"
        " AND shard = %s ORDER BY policy_id, policy_version, window_start FOR UPDATE",
    }[name]


def _configure_sqlite(engine: sa.Engine, *, begin: str) -> None:
    """A busy timeout (first: any later statement may wait on another process's
    lock), synchronous=FULL, and our own BEGIN statement. The journal mode is the
    database file's, set once (`sqlite_ingest.ensure_wal`), not per connection."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS:d}")
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


def _prepare_sqlite_file(parsed: sa.URL, access: Access) -> str:
    """The engine URL for the SQLite ledger file of `parsed`, checked for `access`.

    "create": the folder must exist; a new file is created empty with mode 0600
    before SQLite opens it (SQLite gives its -wal and -shm files the database
    file's mode), so a ledger is never readable by other users. "write" and
    "read": the file must exist; "read" opens it with SQLite's ``mode=ro`` URI, so
    reading can never create, migrate or change it.
    """
    path = Path(parsed.database or "")
    if path.is_dir():
        raise LedgerOpenError(f"{path} is a folder; the ledger URL must name a file")
    if access == "create":
        create_private_sqlite_file(path)
        return parsed.render_as_string(hide_password=False)
    if not path.is_file():
        raise LedgerOpenError(
            f"no ledger at {path} (the file does not exist): check the URL; a new ledger "
            "is created by `fedldp ledger init` or the collector"
        )
    if access == "write":
        return parsed.render_as_string(hide_password=False)
    return f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro&uri=true"


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


def open_ledger(
    url: str,
    *,
    shard: str | None = None,
    pool_size: int = 8,
    isolation: str | None = None,
    access: Access = "create",
) -> Ledger:
    """Open the ledger at `url`; `access` says whether it may be created or written.

    `access`: "create" (the collector, `ledger init`/`migrate`, tests) creates the
    database and migrates its schema to head; "write" (central releases, caps)
    needs an existing ledger at head and never migrates it; "read" (`ledger show`,
    `reconcile`, reports) also opens it read-only (SQLite ``mode=ro``; PostgreSQL
    read-only transactions), so reading never creates or changes anything. Both
    raise LedgerOpenError when the ledger is missing or at another migration.

    `url` is a SQLAlchemy URL: ``sqlite:////abs/path/ledger.db`` or
    ``postgresql+psycopg://user@host:port/db``. `shard` names this collector
    instance in the statistics table (default: host:pid). `isolation` (PostgreSQL
    only): "READ COMMITTED" (default: spend rows locked FOR UPDATE and written by
    compare-and-set) or "SERIALIZABLE" (the same, under serializable snapshot
    isolation; more aborts under load); both retry on conflicts and never
    over-spend.
    """
    return Ledger(url, shard=shard, pool_size=pool_size, isolation=isolation, access=access)
