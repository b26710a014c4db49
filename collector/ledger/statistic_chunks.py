"""Append-only statistic chunks: statistics whose size grows with the reports (pem).

A mechanism with `chunked_statistic` (pem: its statistic is every report) is not
kept as one `statistics.statistic_json` rewritten on each commit, which made a
commit's cost grow with its window (issue #33). Instead each commit, in the same
transaction as the charges of the reports it accepted:

1. adds their count to this shard's `statistics` row (created with n = count and
   statistic_json NULL if missing), one upsert whose RETURNING gives the new n:
   on PostgreSQL the upsert locks the row until commit, on SQLite the
   transaction holds the writer lock, so no other commit of this shard reads
   the same n;
2. inserts one `statistic_chunks` row (schema.py) with `n_before` = that n less
   the count, the count, and `Mechanism.statistic_chunk` of exactly those
   reports (for pem 30 bytes per report at 8-byte strings).

So a commit writes two short rows whatever the window holds; a report is in a
chunk exactly when its charge and its `reports` row committed (a retry is a
DUPLICATE, never accepted again; a rolled-back or rerun transaction leaves no
chunk). The rows of one statistics row hold disjoint ranges [n_before,
n_before + n) (the primary key refuses a second chunk at the same n_before).

Reading (`read_chunks`): every chunk of the rows read, in n_before order and
concatenated; the aggregator decodes them in bulk (`Mechanism.
statistic_from_chunks`) and merges them with the row's statistic_json, which is
NULL for rows made after migration 0008 and the old JSON for windows begun
before it (aggregator/reports.py checks that the two together count n).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from fedldp.collector.ledger.model import Mismatch
from fedldp.collector.ledger.schema import statistic_chunks, statistics
from fedldp.collector.ledger.sql import _blob_parameter

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Mechanism, Output
    from fedldp.collector.ledger.engine import _Driver
    from fedldp.collector.ledger.model import LedgerPolicy

#: (policy id, version, window start): a statistics row of this shard.
StatKey = tuple[str, int, int]


def chunk_statements(dialect: str) -> dict[str, str]:
    """The two statements of a chunked commit, in the driver's paramstyle (compiled
    by tests/collector/test_schema_drift.py with the hot path's, `sql.all_statements`)."""
    ph = "?" if dialect == "sqlite" else "%s"
    return {
        "add_statistics_n": "INSERT INTO statistics (policy_id, policy_version, window_start,"
        f" shard, n, statistic_json, updated_at) VALUES ({ph}, {ph}, {ph}, {ph}, {ph}, NULL,"
        f" {ph}) ON CONFLICT (policy_id, policy_version, window_start, shard) DO UPDATE SET"
        " n = statistics.n + excluded.n, updated_at = excluded.updated_at RETURNING n",
        "insert_chunk": "INSERT INTO statistic_chunks (policy_id, policy_version,"
        f" window_start, shard, n_before, n, data) VALUES ({ph}, {ph}, {ph}, {ph}, {ph},"
        f" {ph}, {ph})",
    }


def append_chunks(
    db: _Driver,
    dialect: str,
    shard: str,
    now: int,
    plan: tuple[Mapping[StatKey, LedgerPolicy], Mapping[StatKey, tuple[Any, int]]],
    accepted: Mapping[StatKey, Sequence[Output]],
) -> list[StatKey]:
    """Write the chunked statistics of a commit; the other keys of `accepted`, sorted,
    for the JSON path.

    `plan` is the group plan's (policy, planned statistic with its count) per key
    and `accepted` the outputs accepted now per key. For each key whose mechanism
    keeps chunks, in key order (the lock order): add the count to this shard's
    statistics row and insert the chunk of exactly the accepted outputs at the
    row's n before them (module docstring)."""
    policies, planned = plan
    keys = sorted(accepted)
    chunked = [key for key in keys if policies[key].mechanism.chunked_statistic]
    if not chunked:  # the common case: no pem policy in this commit
        return keys
    sql = chunk_statements(dialect)
    blob = _blob_parameter(dialect)
    for key in chunked:
        mech = policies[key].mechanism
        outputs = accepted[key]
        stat = accepted_statistic(mech, planned[key], outputs)
        pid, ver, win = key
        count = len(outputs)
        rows = list(db.execute(sql["add_statistics_n"], (pid, ver, win, shard, count, now)))
        n_after = int(rows[0][0])
        data = blob(mech.statistic_chunk(stat))
        db.run(sql["insert_chunk"], (pid, ver, win, shard, n_after - count, count, data))
    return [key for key in keys if not policies[key].mechanism.chunked_statistic]


def accepted_statistic(
    mechanism: Mechanism[Any, Any], planned: tuple[Any, int], outputs: Sequence[Output]
) -> Any:
    """The statistic of the accepted `outputs`: the planned one (every output of the
    row accumulated before the transaction, with their count) when all were
    accepted, else a new one of `outputs`. The planned one is never modified."""
    stat, count = planned
    if len(outputs) == count:
        return stat
    stat = mechanism.new_statistic()
    accumulate = mechanism.accumulate
    for output in outputs:
        accumulate(stat, output)
    return stat


def read_chunks(
    conn: sa.Connection, policy_id: str, version: int, window_start: int | None
) -> dict[tuple[int, str], tuple[int, bytes]]:
    """(window start, shard) -> (reports in its chunks, the chunks' data concatenated in
    n_before order), for (policy, version[, window]); in the caller's transaction, so
    consistent with the statistics rows it reads. ValueError when two chunks of one
    row overlap (`overlaps`)."""
    q = sa.select(
        statistic_chunks.c.window_start,
        statistic_chunks.c.shard,
        statistic_chunks.c.n_before,
        statistic_chunks.c.n,
        statistic_chunks.c.data,
    ).where(
        statistic_chunks.c.policy_id == policy_id,
        statistic_chunks.c.policy_version == version,
    )
    if window_start is not None:
        q = q.where(statistic_chunks.c.window_start == window_start)
    q = q.order_by(
        statistic_chunks.c.window_start, statistic_chunks.c.shard, statistic_chunks.c.n_before
    )
    parts: dict[tuple[int, str], list[tuple[int, int, bytes]]] = defaultdict(list)
    for win, shard, n_before, n, data in conn.execute(q):
        parts[(int(win), shard)].append((int(n_before), int(n), bytes(data)))
    out = {}
    for key, chunks in parts.items():
        if overlaps(chunks):
            raise ValueError(
                f"statistic chunks of window {key[0]}, shard {key[1]!r} overlap: run "
                "`fedldp ledger reconcile` and investigate before any release"
            )
        out[key] = (sum(n for _, n, _ in chunks), b"".join(d for _, _, d in chunks))
    return out


def overlaps(chunks: Sequence[tuple[Any, ...]]) -> bool:
    """Whether any two of (n_before, n, ...) (sorted by n_before) share a report index."""
    end = 0
    for n_before, n, *_ in chunks:
        if n_before < end:
            return True
        end = n_before + n
    return False


def chunk_mismatches(conn: sa.Connection) -> list[Mismatch]:
    """Reconcile's check of the chunks against their statistics rows: every chunk has
    a statistics row (on its shard), no two chunks of a row overlap, they count at
    most the row's n, and exactly n when the row has no JSON part (rows made after
    migration 0008); and every chunk of one policy version holds the same whole
    number of bytes per report (one mechanism: one record size), so data cut or
    padded against its n is found without decoding it."""
    rows = {
        (r.policy_id, int(r.policy_version), int(r.window_start), r.shard): (
            int(r.n),
            bool(r.only_chunks),
        )
        for r in conn.execute(
            sa.select(
                statistics.c.policy_id,
                statistics.c.policy_version,
                statistics.c.window_start,
                statistics.c.shard,
                statistics.c.n,
                statistics.c.statistic_json.is_(None).label("only_chunks"),
            )
        )
    }
    chunks: dict[tuple[str, int, int, str], list[tuple[int, int]]] = defaultdict(list)
    # (policy id, version) -> the bytes per report of its chunks (a set: one if sound)
    widths: dict[tuple[str, int], set[Fraction]] = defaultdict(set)
    q = sa.select(
        statistic_chunks.c.policy_id,
        statistic_chunks.c.policy_version,
        statistic_chunks.c.window_start,
        statistic_chunks.c.shard,
        statistic_chunks.c.n_before,
        statistic_chunks.c.n,
        sa.func.length(statistic_chunks.c.data),
    ).order_by(*statistic_chunks.primary_key.columns)
    for pid, ver, win, shard, n_before, n, size in conn.execute(q):
        chunks[(pid, int(ver), int(win), shard)].append((int(n_before), int(n)))
        widths[(pid, int(ver))].add(Fraction(int(size), max(1, int(n))))
    out = []
    for key, ranges in sorted(chunks.items()):
        n_row, only_chunks = rows.get(key, (None, True))
        total = sum(n for _, n in ranges)
        width = widths[key[:2]]
        bad = (
            n_row is None
            or overlaps(ranges)
            or total > n_row
            or (only_chunks and total != n_row)
            or any(b + n > n_row for b, n in ranges)
            or len(width) != 1
            or any(n <= 0 for _, n in ranges)
            or next(iter(width)).denominator != 1
        )
        if bad:
            out.append(
                Mismatch(
                    "statistic_chunks",
                    None,
                    f"policy={key[0]} version={key[1]} window={key[2]} shard={key[3]}",
                    f"{total} reports in {len(ranges)} chunks",
                    "no statistics row" if n_row is None else f"row n = {n_row}",
                )
            )
    return out
