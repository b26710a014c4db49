"""Apply the Alembic migrations in collector/migrations to a ledger database.

`upgrade(engine)` is what `open_ledger` calls: it is a no-op when the schema is
at head, and safe when several collectors open one PostgreSQL ledger at once (a
transaction-scoped advisory lock serializes them; SQLite's BEGIN IMMEDIATE does
the same on a file).
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
#: Arbitrary, fixed key for pg_advisory_xact_lock while migrating.
_PG_MIGRATION_LOCK = 0x6665646C6470  # "fedldp"


def alembic_config() -> Config:
    """An Alembic Config pointing at the ledger's migration scripts."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    """The newest migration's revision id."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(connection: sa.Connection) -> str | None:
    """The revision a database is at (None: empty database)."""
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: sa.Engine) -> None:
    """Bring the schema at `engine` to head (no-op when it is already there)."""
    head = head_revision()
    with engine.connect() as probe:
        at = current_revision(probe)
    if at == head:
        return
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_MIGRATION_LOCK})")
        if current_revision(connection) == head:  # another collector got there first
            return
        cfg = alembic_config()
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
