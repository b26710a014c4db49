"""Read-only queries for reports, budgets and audits (spend, statistics, stored outputs)."""

from __future__ import annotations

from decimal import Decimal
from typing import (
    TYPE_CHECKING,
    Any,
)

import sqlalchemy as sa
from fedldp.collector.ledger.engine import (
    LedgerCore,
)
from fedldp.collector.ledger.model import (
    LedgerPolicy,
    PartialStatistic,
    SpendRow,
    _dec,
)
from fedldp.collector.ledger.schema import (
    conflicts,
    reports,
    spend,
    statistics,
)
from fedldp.collector.ledger.statistic_chunks import read_chunks
from fedldp.collector.wire import output_from_json

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Output


class ReportQueries(LedgerCore):
    """Read-only queries: spend, statistics, stored outputs, conflicts."""

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
            q = statistics_query(policy_id, version, window_start)
            rows = conn.execute(q).all()
            chunks = read_chunks(conn, policy_id, version, window_start)  # same snapshot
            return [partial_from_row(r, chunks.get((int(r.window_start), r.shard))) for r in rows]

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

    def sealed_ciphertexts(self, policy_id: str, window_start: int) -> dict[int, list[bytes]]:
        """Policy version -> the ciphertexts of the sealed reports stored for that version
        in the window starting at `window_start` (the shuffler's pull, docs/shuffle.md).

        Only the ciphertexts: no subject, report id, time or arrival order. Each version's
        list is sorted by the ciphertexts' bytes (HPKE output: independent of who sent
        what, when). Plain reports are left out.
        """
        from fedldp.client.mechanisms.base import SealedOutput

        def tx(conn: sa.Connection) -> dict[int, list[bytes]]:
            q = sa.select(reports.c.policy_version, reports.c.payload).where(
                reports.c.policy_id == policy_id, reports.c.window_start == window_start
            )
            out: dict[int, list[bytes]] = {}
            for version, text in conn.execute(q):
                output = output_from_json(text)
                if type(output) is SealedOutput:
                    out.setdefault(int(version), []).append(output.ciphertext)
            return {v: sorted(cs) for v, cs in sorted(out.items())}

        return self.transaction(tx, write=False)

    def report_windows(self, policy_id: str) -> list[tuple[int, int]]:
        """The (policy version, window start) pairs with stored reports of `policy_id`,
        sorted (`fedldp shuffler serve` finds the windows to pull with it). Counts only:
        no subject, payload or time of any report."""

        def tx(conn: sa.Connection) -> list[tuple[int, int]]:
            q = (
                sa.select(reports.c.policy_version, reports.c.window_start)
                .where(reports.c.policy_id == policy_id)
                .distinct()
            )
            return sorted((int(v), int(w)) for v, w in conn.execute(q))

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


def statistics_query(
    policy_id: str, version: int, window_start: int | None = None
) -> sa.Select[Any]:
    """The non-empty partial statistics of (policy, version[, window]), by window and shard."""
    q = sa.select(statistics).where(
        statistics.c.policy_id == policy_id,
        statistics.c.policy_version == version,
        statistics.c.n > 0,
    )
    if window_start is not None:
        q = q.where(statistics.c.window_start == window_start)
    return q.order_by(statistics.c.window_start, statistics.c.shard)


def partial_from_row(r: sa.Row[Any], chunks: tuple[int, bytes] | None = None) -> PartialStatistic:
    """A `statistics` row, with its chunks (reports in them, their data), as the
    mergeable PartialStatistic."""
    chunk_n, data = chunks if chunks is not None else (0, b"")
    return PartialStatistic(
        r.policy_id,
        int(r.policy_version),
        int(r.window_start),
        r.shard,
        int(r.n),
        r.statistic_json,
        data,
        chunk_n,
    )
