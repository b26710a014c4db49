"""Read-only access to a ledger's additive statistics, spend and central tables.

The dashboard never writes: a SQLite ledger is opened with SQLite's ``mode=ro``
URI (the file must exist; nothing can create, migrate or change it, and no
journal-mode pragma is issued), a PostgreSQL ledger in read-only transactions
(``SET TRANSACTION READ ONLY``: any write fails). Every query is an aggregate
over small tables or a GROUP BY that returns counts: no subject identifier and
no report payload is ever selected.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from fedldp.collector.ledger.queries import partial_from_row, statistics_query
from fedldp.collector.ledger.schema import central_reservations, spend, statistics
from fedldp.collector.ledger.store import PartialStatistic
from sqlalchemy import event


class SourceError(Exception):
    """The ledger cannot be opened read-only (the message says what to check)."""


@dataclass(frozen=True)
class WindowCount:
    """Reports stored for one (policy, version, window), summed over shards."""

    policy_id: str
    version: int
    window_start: int
    n: int


@dataclass(frozen=True)
class SpendGroup:
    """How many subjects spent exactly `epsilon_spent` under `epsilon_cap` in a window."""

    policy_id: str
    window_start: int
    epsilon_spent: Decimal
    epsilon_cap: Decimal
    subjects: int


@dataclass(frozen=True)
class ReservationGroup:
    """Central reservations of one purpose and status with one (ε, ε spent) pair."""

    purpose: str
    status: str
    epsilon: Decimal
    epsilon_spent: Decimal | None
    count: int


def read_only_url(url: str) -> str:
    """The engine URL that opens the ledger at `url` read-only.

    SQLite: ``sqlite:///file:/abs/path?mode=ro&uri=true`` (SourceError if the
    file does not exist); PostgreSQL URLs are returned unchanged (read-only is
    set per transaction, see `ReadOnlyLedger`).
    """
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        raise SourceError(
            f"cannot parse the ledger URL {url!r}: expected sqlite:////ABSOLUTE/PATH/ledger.db "
            "or postgresql+psycopg://USER@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        return url
    if backend != "sqlite":
        raise SourceError(f"unsupported ledger database {backend!r}: use sqlite or postgresql")
    path = Path(parsed.database or "")
    if not path.is_file():
        raise SourceError(f"no ledger file at {path}: check the ledger URL")
    return f"sqlite:///file:{quote(str(path.resolve()))}?mode=ro&uri=true"


class ReadOnlyLedger:
    """The queries the dashboard needs, on a ledger opened read-only.

    Implements `fedldp.aggregator.reports.StatisticsSource.statistics`, so the
    report functions of `fedldp.aggregator.reports` run on it unchanged.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        engine_url = read_only_url(url)
        self.dialect = sa.make_url(engine_url).get_backend_name()
        if self.dialect == "sqlite":
            self._engine = sa.create_engine(engine_url, pool_size=4, max_overflow=4)
            event.listen(self._engine, "connect", _sqlite_read_only)
        else:
            self._engine = sa.create_engine(
                engine_url, pool_size=4, max_overflow=4, pool_pre_ping=True
            ).execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        try:
            with self._engine.connect() as conn:
                conn.execute(sa.select(sa.func.count()).select_from(statistics)).scalar_one()
        except sa.exc.DBAPIError as exc:
            self._engine.dispose()
            detail = str(getattr(exc, "orig", exc)).splitlines()[0]
            raise SourceError(f"cannot read the ledger's statistics: {detail}") from None

    def close(self) -> None:
        """Release every connection."""
        self._engine.dispose()

    def _rows(self, query: Any) -> Iterator[Any]:
        with self._engine.connect() as conn:
            yield from conn.execute(query).all()

    def statistics(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> list[PartialStatistic]:
        """Every shard's partial statistic for (policy, version[, window])."""
        q = statistics_query(policy_id, version, window_start)
        return [partial_from_row(r) for r in self._rows(q)]

    def recompute_statistics(self, policy: Any, window_start: int | None = None) -> Any:
        """Not offered: the dashboard reads the additive statistics only."""
        raise NotImplementedError("the dashboard does not recompute from raw report rows")

    def window_counts(self) -> list[WindowCount]:
        """Reports per (policy, version, window), from the statistics rows."""
        q = (
            sa.select(
                statistics.c.policy_id,
                statistics.c.policy_version,
                statistics.c.window_start,
                sa.func.sum(statistics.c.n),
            )
            .where(statistics.c.n > 0)
            .group_by(
                statistics.c.policy_id, statistics.c.policy_version, statistics.c.window_start
            )
            .order_by(statistics.c.policy_id, statistics.c.window_start)
        )
        return [WindowCount(r[0], int(r[1]), int(r[2]), int(r[3])) for r in self._rows(q)]

    def spend_groups(self, policy_ids: list[str], windows: list[int]) -> list[SpendGroup]:
        """Subjects per (policy, window, ε spent, cap) for `policy_ids` × `windows`:
        counts only (one scan of the spend table)."""
        if not policy_ids or not windows:
            return []
        q = (
            sa.select(
                spend.c.policy_id,
                spend.c.window_start,
                spend.c.epsilon_spent,
                spend.c.epsilon_cap,
                sa.func.count(),
            )
            .where(spend.c.policy_id.in_(policy_ids), spend.c.window_start.in_(windows))
            .group_by(
                spend.c.policy_id, spend.c.window_start, spend.c.epsilon_spent, spend.c.epsilon_cap
            )
        )
        return [
            SpendGroup(str(r[0]), int(r[1]), Decimal(r[2]), Decimal(r[3]), int(r[4]))
            for r in self._rows(q)
        ]

    def reservation_groups(self) -> list[ReservationGroup]:
        """Central reservations per (purpose, status, ε, ε spent): counts only."""
        c = central_reservations.c
        q = sa.select(c.purpose, c.status, c.epsilon, c.epsilon_spent, sa.func.count()).group_by(
            c.purpose, c.status, c.epsilon, c.epsilon_spent
        )
        return [
            ReservationGroup(
                str(r[0]),
                str(r[1]),
                Decimal(r[2]),
                None if r[3] is None else Decimal(r[3]),
                int(r[4]),
            )
            for r in self._rows(q)
        ]


def _sqlite_read_only(dbapi_conn: Any, _record: Any) -> None:
    """Belt and braces over ``mode=ro``: the connection refuses writes too."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA query_only=ON")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.close()
