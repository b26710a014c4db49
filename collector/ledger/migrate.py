"""Apply the Alembic migrations in collector/migrations to a ledger database.

`upgrade(engine)` is what `open_ledger` and `fedldp ledger migrate` call: it is
a no-op when the schema is at head, and safe when several collectors and
migrations open one ledger at once, a new one included. On PostgreSQL a
transaction-scoped advisory lock serializes them. On SQLite the file's writer
lock file (`<database>-ingest.lock`, `flock`: collector/ledger/sqlite_ingest.py)
is taken before the first statement that reads or writes the schema and held
until the migration committed, so of N processes creating one new file, one
creates and migrates it and the others wait, then find it at head. (SQLite's
own locks are not enough on a new file: Python's sqlite3 runs DDL outside a
transaction unless told otherwise, and changing a file to WAL needs it alone.)

Alembic is imported only to migrate: `head_revision` is `HEAD_REVISION` and
`current_revision` reads Alembic's version table itself, so a process opening a
ledger already at head (a collector, a reader, a CLI command) does not load it
(≈ 0.15 CPU-s of imports per process). Adding a migration: set `HEAD_REVISION`
to its revision (tests/deploy/test_ledger_ops.py checks it against the scripts).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from fedldp.collector.ledger.model import LedgerOpenError
from fedldp.collector.ledger.sqlite_ingest import WriterLock, writer_lock_path

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: The newest migration's revision id: the head of MIGRATIONS_DIR/versions.
HEAD_REVISION = "0008_statistic_chunks"
#: Alembic's version table (its default name; env.py does not change it).
VERSION_TABLE = "alembic_version"
#: Arbitrary, fixed key for pg_advisory_xact_lock while migrating.
_PG_MIGRATION_LOCK = 0x6665646C6470  # "fedldp"


def alembic_config() -> Config:
    """An Alembic Config pointing at the ledger's migration scripts."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def scripts() -> ScriptDirectory:
    """The ledger's migration scripts, as Alembic reads them."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest migration's revision id."""
    return HEAD_REVISION


def current_revision(connection: sa.Connection) -> str | None:
    """The revision a database is at (None: empty database), read from the version
    table as Alembic's `MigrationContext.get_current_revision` reads it."""
    if not sa.inspect(connection).has_table(VERSION_TABLE):
        return None
    rows = connection.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}")).all()
    if len(rows) > 1:
        raise LedgerOpenError(f"the ledger's {VERSION_TABLE} table names {len(rows)} revisions")
    return str(rows[0][0]) if rows else None


@contextlib.contextmanager
def schema_lock(engine: sa.Engine) -> Iterator[None]:
    """Hold the SQLite file's writer lock (created beside it if missing) for the
    block; a no-op on PostgreSQL (`upgrade` takes its advisory lock there)."""
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if not database:
        yield
        return
    lock = WriterLock(writer_lock_path(database))
    try:
        with lock:
            yield
    finally:
        lock.close()


def upgrade(engine: sa.Engine, *, locked: bool = False) -> None:
    """Bring the schema at `engine` to head (no-op when it is already there),
    holding `schema_lock` unless the caller holds it already (`locked`)."""
    if locked:
        _upgrade(engine)
        return
    with schema_lock(engine):
        _upgrade(engine)


def _upgrade(engine: sa.Engine) -> None:
    """`upgrade`, the lock held (on SQLite)."""
    head = head_revision()
    with engine.connect() as probe:
        at = current_revision(probe)
    if at == head:
        return
    _refuse_unknown(engine, at)
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        if current_revision(connection) == head:  # another collector got there first
            return
        from alembic import command

        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


def _refuse_unknown(engine: sa.Engine, at: str | None) -> None:
    """LedgerOpenError when the database is at a revision these migrations do not know
    (a newer fedldp migrated it), naming the ledger and the fix; nothing is changed."""
    if at is None or at in {revision.revision for revision in scripts().walk_revisions()}:
        return
    shown = engine.url.render_as_string(hide_password=True)
    raise LedgerOpenError(
        f"ledger {shown} is at migration {at!r}, which this fedldp does not know (its newest "
        f"is {head_revision()!r}): a newer fedldp migrated it; upgrade fedldp, nothing was changed"
    )
