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

Central caps have no window, so no gap can cover a central reservation lost
with the backup. Every epoch therefore starts with its central spend
*unconfirmed* (`central_confirmed_at` NULL), and while any epoch is unconfirmed
the ledger refuses every central reservation (`Ledger.reserve` reads it in the
reservation's own transaction). `Ledger.confirm_central` (`fedldp ledger
confirm-central`) re-enters the central spend made after the backup as settled
releases and confirms the restored epochs in one transaction; it never refunds.

The restore refuses a restore time R earlier than the backup's mark, pg_dump's
archive time or the latest timestamp stored in the data (`RestoreClockError`):
such an R means a slow clock, and its gap would miss the window the lost
charges were made in.

A PostgreSQL restore becomes visible when pg_restore commits, before its gap is
recorded. `begin_restore` therefore creates the `restore_pending` table in the
empty database first (it is in no backup), `record_restore`'s transaction drops
it, and `Ledger` refuses to open a database that holds it
(`RestoreIncompleteError`): no collector serves a restored ledger without its gap.
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
    restore_epochs.c.central_confirmed_at,
)

#: Present only while `fedldp ledger restore` fills a PostgreSQL database: a ledger
#: holding it is incomplete (no gap recorded yet) and is never opened. Not part of
#: the ledger's schema (schema.py): no backup ever contains it.
_pending_metadata = sa.MetaData()
restore_pending = sa.Table(
    "restore_pending",
    _pending_metadata,
    sa.Column("source", sa.Text, nullable=False),
    sa.Column("started_at", sa.BigInteger, nullable=False),
)


class RestoreClockError(ValueError):
    """The restore time is earlier than a time the backup or its data records."""


class RestoreIncompleteError(RuntimeError):
    """The database holds a restore that never recorded its gap: it must not serve."""


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
    newest = max(candidates, default=restore_time)
    if restore_time < newest:
        raise RestoreClockError(
            f"this host's clock reads {restore_time}, before {newest} recorded by the backup "
            "or its data: fix the clock (NTP) and restore again"
        )
    backup_time = min(candidates, default=restore_time)
    connection.execute(restore_epochs.delete().where(restore_epochs.c.restore_time.is_(None)))
    connection.execute(
        restore_epochs.insert().values(
            backup_time=backup_time,
            restore_time=restore_time,
            source=source,
            recorded_at=restore_time,
            central_confirmed_at=None,
        )
    )
    restore_pending.drop(connection, checkfirst=True)
    return RestoreGap(backup_time, restore_time)


def begin_restore(connection: sa.Connection, *, source: str, started_at: int) -> None:
    """Mark the (empty) database behind `connection` as being restored into: until
    `record_restore` commits, `check_complete` refuses it."""
    restore_pending.create(connection)
    connection.execute(restore_pending.insert().values(source=source, started_at=started_at))


def check_complete(connection: sa.Connection) -> None:
    """RestoreIncompleteError when a restore into this database never recorded its gap."""
    if sa.inspect(connection).has_table(restore_pending.name):
        raise RestoreIncompleteError(
            "this database holds a restore that never recorded its restore epoch: it must "
            "not serve; drop it and run `fedldp ledger restore` again"
        )


def unconfirmed_central(connection: sa.Connection) -> RestoreGap | None:
    """The oldest epoch whose central spend is still unconfirmed (None: none is).
    While one is, every central reservation is refused."""
    row = connection.execute(
        sa.select(restore_epochs.c.backup_time, restore_epochs.c.restore_time)
        .where(restore_epochs.c.central_confirmed_at.is_(None))
        .order_by(restore_epochs.c.id)
        .limit(1)
    ).first()
    if row is None:
        return None
    return RestoreGap(int(row[0]), None if row[1] is None else int(row[1]))


def confirm_central(connection: sa.Connection, *, now: int) -> int:
    """Confirm the central spend of every restored, unconfirmed epoch; the count.
    Unrestored backup marks stay unconfirmed (restore the copy first)."""
    result = connection.execute(
        sa.update(restore_epochs)
        .where(
            restore_epochs.c.central_confirmed_at.is_(None),
            restore_epochs.c.restore_time.is_not(None),
        )
        .values(central_confirmed_at=now)
    )
    return int(result.rowcount)
