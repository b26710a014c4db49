"""Restore epochs: what a ledger restored from a backup must refuse.

A backup holds the charges committed up to its snapshot; everything charged after
it is lost on restore, and a subject could spend that budget again. The rule:

    A ledger restored from a backup taken at time B, restored at time R, refuses
    every charge in a budget window [w, w + window_seconds) that overlaps [B, R],
    i.e. w <= R and w + window_seconds > B, until that window ends.

Every charge lost with the backup was made after B and before R (the old ledger
stopped serving before the restore), so it lies in such a window: none of the
lost budget can be spent twice. Windows that start after R are untouched: no
charge of theirs can have been lost. In practice the rule refuses each policy's
window in progress at the restore until it ends.

B is taken conservatively (never later than the snapshot): the earliest of the
backup's own mark (`mark_backup`: the time just before the SQLite backup API
copied the file, or pg_dump's archive creation time, which precedes its
snapshot) and the latest timestamp written in the restored data. A backup copy
that was not restored with `fedldp ledger restore` still carries its mark with no
restore time: its gap is open-ended and it charges nothing until restored.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from fedldp.collector.ledger.schema import (
    central_caps,
    central_reservations,
    conflicts,
    policy_lineage,
    policy_versions,
    reports,
    restore_epochs,
    spend,
    statistics,
)

#: Every stored timestamp (Unix seconds) a ledger writes: the latest of them is a
#: time at or before which the data was last written.
_WRITE_TIMES: tuple[sa.ColumnElement[int], ...] = (
    reports.c.received_at,
    spend.c.updated_at,
    conflicts.c.seen_at,
    statistics.c.updated_at,
    central_caps.c.updated_at,
    central_reservations.c.created_at,
    central_reservations.c.closed_at,
    policy_lineage.c.recorded_at,
    policy_versions.c.recorded_at,
    restore_epochs.c.recorded_at,
)


@dataclass(frozen=True)
class RestoreGap:
    """[backup_time, restore_time] in Unix seconds; restore_time None: not restored
    yet (an unrestored backup copy), the gap has no end."""

    backup_time: int
    restore_time: int | None

    def refuses(self, window_start: int, window_seconds: int) -> bool:
        """True when the window [window_start, window_start + window_seconds)
        overlaps this gap: no charge may be taken in it."""
        if window_start + window_seconds <= self.backup_time:
            return False
        return self.restore_time is None or window_start <= self.restore_time


def refused_by(gaps: tuple[RestoreGap, ...], window_start: int, window_seconds: int) -> bool:
    """Whether any gap in `gaps` refuses charges in that window."""
    return any(g.refuses(window_start, window_seconds) for g in gaps)


def load_gaps(connection: sa.Connection) -> tuple[RestoreGap, ...]:
    """Every recorded gap, oldest first."""
    rows = connection.execute(
        sa.select(restore_epochs.c.backup_time, restore_epochs.c.restore_time).order_by(
            restore_epochs.c.id
        )
    )
    return tuple(RestoreGap(int(b), None if r is None else int(r)) for b, r in rows)


def latest_write(connection: sa.Connection) -> int | None:
    """The latest timestamp stored anywhere in the ledger (None: nothing stored)."""
    latest: int | None = None
    for column in _WRITE_TIMES:
        value = connection.execute(sa.select(sa.func.max(column))).scalar()
        if value is not None and (latest is None or int(value) > latest):
            latest = int(value)
    return latest


def mark_backup(connection: sa.Connection, *, backup_time: int, source: str) -> None:
    """Mark the database behind `connection` (a fresh backup copy, never the live
    ledger) as a backup taken at `backup_time`: open-ended until restored."""
    connection.execute(
        restore_epochs.insert().values(
            backup_time=backup_time, restore_time=None, source=source, recorded_at=backup_time
        )
    )


def record_restore(
    connection: sa.Connection, *, restore_time: int, source: str, archive_time: int | None
) -> RestoreGap:
    """Close this restored ledger's open backup marks into one gap [B, restore_time]
    (B: the earliest of the marks, `archive_time` and the latest write; see the
    module docstring) and return it. Gaps of earlier restores stay."""
    open_marks = [
        int(t)
        for (t,) in connection.execute(
            sa.select(restore_epochs.c.backup_time).where(restore_epochs.c.restore_time.is_(None))
        )
    ]
    written = latest_write(connection)
    candidates = [*open_marks, *(t for t in (archive_time, written) if t is not None)]
    backup_time = min(candidates) if candidates else restore_time
    connection.execute(restore_epochs.delete().where(restore_epochs.c.restore_time.is_(None)))
    connection.execute(
        restore_epochs.insert().values(
            backup_time=backup_time,
            restore_time=restore_time,
            source=source,
            recorded_at=restore_time,
        )
    )
    return RestoreGap(backup_time, restore_time)
