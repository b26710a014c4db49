"""The privacy ledger: the collector's authority on privacy spent.

`Ledger` is composed of one part per job, each in its own module:
engine.py (URLs, access modes, engines, the retrying unit of work),
versions.py (policy lineage and recorded versions: the cap in force),
ingest.py (check-and-charge, the group-commit hot path; sqlite_ingest.py is
its SQLite connection, sql.py its hand-written statements), queries.py (reads
for reports and audits), reconcile.py (recomputing every total) and
central.py (central reservations). Their value types and errors are in
model.py; the tables in schema.py. Every name callers import is importable
from here (and from the package).

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

from fedldp.collector.ledger.central import STALE_REASON, CentralReservations
from fedldp.collector.ledger.charge_audit import ChargeAudit
from fedldp.collector.ledger.engine import (
    create_private_sqlite_file,
    default_shard,
    parse_ledger_url,
)
from fedldp.collector.ledger.ingest import Ingestion
from fedldp.collector.ledger.model import (
    ACCEPTED,
    BUDGET_EXHAUSTED,
    CONFLICT,
    DEFAULT_LEASE_SECONDS,
    DUPLICATE,
    EXACT,
    Access,
    CentralBudgetExhaustedError,
    CentralEvent,
    CentralSpendUnconfirmedError,
    CheckedReport,
    DataOpenedError,
    IdempotencyConflictError,
    LeaseActiveError,
    LedgerError,
    LedgerOpenError,
    LedgerPolicy,
    Mismatch,
    NoCentralCapError,
    NothingToConfirmError,
    OutcomeValue,
    PartialStatistic,
    PolicyLineage,
    PolicyVersion,
    Reservation,
    ReservationNotFoundError,
    ReservationOwnedError,
    ReservationStateError,
    SpendRow,
    SubmitBatch,
)
from fedldp.collector.ledger.queries import ReportQueries
from fedldp.collector.ledger.reconcile import Reconcile
from fedldp.collector.ledger.sql import _in_statement
from fedldp.collector.ledger.versions import lowered_window, smallest_cap

__all__ = [
    "ACCEPTED",
    "BUDGET_EXHAUSTED",
    "CONFLICT",
    "DEFAULT_LEASE_SECONDS",
    "DUPLICATE",
    "EXACT",
    "STALE_REASON",
    "Access",
    "CentralBudgetExhaustedError",
    "CentralEvent",
    "CentralSpendUnconfirmedError",
    "CheckedReport",
    "DataOpenedError",
    "IdempotencyConflictError",
    "LeaseActiveError",
    "Ledger",
    "LedgerError",
    "LedgerOpenError",
    "LedgerPolicy",
    "Mismatch",
    "NoCentralCapError",
    "NothingToConfirmError",
    "OutcomeValue",
    "PartialStatistic",
    "PolicyLineage",
    "PolicyVersion",
    "Reservation",
    "ReservationNotFoundError",
    "ReservationOwnedError",
    "ReservationStateError",
    "SpendRow",
    "SubmitBatch",
    "_in_statement",
    "create_private_sqlite_file",
    "default_shard",
    "lowered_window",
    "open_ledger",
    "parse_ledger_url",
    "smallest_cap",
]


class Ledger(CentralReservations, Reconcile, ChargeAudit, ReportQueries, Ingestion):
    """A privacy ledger on one database (open with `open_ledger`).

    One object composed of the ledger's parts (see the module docstring), all on
    the engines and unit of work of `engine.LedgerCore` (`transaction`: one
    transaction, rerun on a serialization failure).
    """

    def __init__(
        self,
        url: str,
        *,
        shard: str | None = None,
        pool_size: int = 8,
        isolation: str | None = None,
        access: Access = "create",
    ) -> None:
        super().__init__(url, shard=shard, pool_size=pool_size, isolation=isolation, access=access)
        self._init_ingestion()
        self._init_versions()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
