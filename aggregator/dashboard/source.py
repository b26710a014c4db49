"""Read-only access to a ledger's additive statistics, spend and central tables.

The dashboard never writes, and reads a whole ledger: `ReadOnlyLedger` runs on a
ledger opened for reading the way every CLI reader opens one (`fedldp report`,
`ledger show`: fedldp/cli_report.py `_open_sources`), so a SQLite ledger is read
without writing or creating anything beside it (collector/ledger/engine.py
`_read_only_engine`), a PostgreSQL one in read-only transactions, and a sharded
ledger as every shard of its shard map (one shard's URL alone is refused:
collector/ledger/shards.py). Every query is an aggregate over small tables or a
GROUP BY that returns counts: no subject identifier and no report payload is
ever selected. Counts are summed over shards (a subject's reports and spend
live on one shard); central reservations live on shard 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from fedldp.collector.ledger import Ledger
from fedldp.collector.ledger.schema import central_reservations, spend, statistics
from fedldp.collector.ledger.shards import ShardedLedger
from fedldp.collector.ledger.store import PartialStatistic

#: Idempotency-key prefix of an analyst's own-cap hold (aggregator/service/holds.py).
HOLD_KEY_PREFIX = "analyst-cap:"


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


class ReadOnlyLedger:
    """The queries the dashboard needs, on a whole ledger opened read-only.

    `source`: one ledger or every shard of a sharded one, opened with access
    "read" (module docstring); closed by `close`. Implements
    `fedldp.aggregator.reports.StatisticsSource.statistics`, so the report
    functions of `fedldp.aggregator.reports` run on it unchanged.
    """

    def __init__(self, source: Ledger | ShardedLedger) -> None:
        self.source = source
        self.shards: list[Ledger] = (
            list(source.shards) if isinstance(source, ShardedLedger) else [source]
        )

    def close(self) -> None:
        """Release every connection."""
        self.source.close()

    def _rows(self, query: Any, shards: list[Ledger] | None = None) -> list[Any]:
        """`query`'s rows from each of `shards` (default: every shard), in shard order."""

        def run(conn: sa.Connection) -> list[Any]:
            return list(conn.execute(query).all())

        return [row for s in shards or self.shards for row in s.transaction(run, write=False)]

    def statistics(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> list[PartialStatistic]:
        """Every collector's (and shard's) partial statistic for (policy, version[, window])."""
        return self.source.statistics(policy_id, version, window_start)

    def recompute_statistics(self, policy: Any, window_start: int | None = None) -> Any:
        """Not offered: the dashboard reads the additive statistics only."""
        raise NotImplementedError("the dashboard does not recompute from raw report rows")

    def window_counts(self) -> list[WindowCount]:
        """Reports per (policy, version, window), from the statistics rows of every shard."""
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
        )
        totals: dict[tuple[str, int, int], int] = {}
        for r in self._rows(q):
            key = (str(r[0]), int(r[1]), int(r[2]))
            totals[key] = totals.get(key, 0) + int(r[3])
        ordered = sorted(totals.items(), key=lambda item: (item[0][0], item[0][2], item[0][1]))
        return [WindowCount(pid, version, start, n) for (pid, version, start), n in ordered]

    def spend_groups(self, policy_ids: list[str], windows: list[int]) -> list[SpendGroup]:
        """Subjects per (policy, window, ε spent, cap) for `policy_ids` × `windows`:
        counts only (one scan of each shard's spend table; a subject's spend rows
        live on one shard, so the groups of all shards add up)."""
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
        """Central reservations per (purpose, status, ε, ε spent): counts only (shard 0,
        where central reservations live). An analyst's own-cap hold (the release
        service's second reservation of one release, idempotency key
        "analyst-cap:...": aggregator/service/holds.py) is not counted again."""
        c = central_reservations.c
        q = (
            sa.select(c.purpose, c.status, c.epsilon, c.epsilon_spent, sa.func.count())
            .where(sa.not_(c.idempotency_key.startswith(HOLD_KEY_PREFIX, autoescape=True)))
            .group_by(c.purpose, c.status, c.epsilon, c.epsilon_spent)
        )
        return [
            ReservationGroup(
                str(r[0]),
                str(r[1]),
                Decimal(r[2]),
                None if r[3] is None else Decimal(r[3]),
                int(r[4]),
            )
            for r in self._rows(q, self.shards[:1])
        ]
