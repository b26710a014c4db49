"""One schema: the Alembic head, the Core tables of schema.py and the hand-written
hot-path SQL of sql.py agree, on a fresh SQLite file and a fresh PostgreSQL
database (the suite's server).

* Alembic head vs Core: the tables reflected from a ledger that `open_ledger`
  migrated to head equal those reflected from `schema.metadata.create_all` on the
  same dialect (columns, their types as the dialect spells them, nullability,
  primary keys, unique constraints, indexes, foreign keys), and Alembic's own
  autogenerate comparison finds nothing to change.
* Hand-written SQL vs both: every statement of `sql.all_statements` (and of
  `statistic_chunks.chunk_statements`) compiles
  (EXPLAIN; PostgreSQL's COPY is opened and closed empty in a rolled-back
  transaction) on both databases.

The broken variants (a schema changed in one place, a statement naming a column
that does not exist) are tests too: each must be caught.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from fedldp.collector.ledger import open_ledger, schema
from fedldp.collector.ledger.sql import all_statements
from fedldp.collector.ledger.statistic_chunks import chunk_statements

Description = dict[str, dict[str, Any]]


def describe(engine: sa.Engine) -> Description:
    """Every ledger table as reflected: what a drift would change."""
    out: Description = {}
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        for table in sorted(inspector.get_table_names()):
            if table == "alembic_version":
                continue
            out[table] = {
                "columns": [
                    (c["name"], str(c["type"].compile(dialect=engine.dialect)), c["nullable"])
                    for c in inspector.get_columns(table)
                ],
                "primary_key": inspector.get_pk_constraint(table)["constrained_columns"],
                "unique": sorted(
                    tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)
                ),
                "indexes": sorted(
                    (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                    for i in inspector.get_indexes(table)
                ),
                "foreign_keys": sorted(
                    (tuple(f["constrained_columns"]), f["referred_table"])
                    for f in inspector.get_foreign_keys(table)
                ),
            }
    return out


def autogenerate_diff(engine: sa.Engine, metadata: sa.MetaData) -> list[Any]:
    """What Alembic's autogenerate would change to bring `engine` to `metadata`."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, metadata)
    return [d for d in diff if "alembic_version" not in repr(d)]


def compile_statements(engine: sa.Engine, statements: dict[str, str]) -> dict[str, str]:
    """{name: error} for every statement the database refuses to compile."""
    errors: dict[str, str] = {}
    placeholder = "?" if engine.dialect.name == "sqlite" else "%s"
    for name, sql in statements.items():
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            if sql.startswith("COPY "):
                with cursor.copy(sql):
                    pass  # no rows: the statement is parsed and its columns resolved
            else:
                cursor.execute(f"EXPLAIN {sql}", [None] * sql.count(placeholder))
        except Exception as exc:  # reported by name: which statement drifted, and why
            errors[name] = str(exc).splitlines()[0]
        finally:
            raw.rollback()
            raw.close()
    return errors


def core_copy() -> sa.MetaData:
    """A private copy of schema.metadata that a broken variant may change."""
    copy = sa.MetaData()
    for table in schema.metadata.sorted_tables:
        table.to_metadata(copy)
    return copy


@pytest.fixture(params=["sqlite", "postgresql"])
def databases(
    request: pytest.FixtureRequest, tmp_path: Path
) -> tuple[sa.Engine, Callable[[], sa.Engine]]:
    """(a ledger migrated to Alembic's head, a factory of fresh empty databases)."""
    if request.param == "sqlite":
        names = iter(range(1000))

        def fresh() -> sa.Engine:
            return sa.create_engine(f"sqlite:///{tmp_path}/empty-{next(names)}.db")

        url = f"sqlite:///{tmp_path}/ledger.db"
    else:
        server = request.getfixturevalue("postgresql_server")

        def fresh() -> sa.Engine:
            return sa.create_engine(server.create_database())

        url = server.create_database()
    open_ledger(url, shard="drift").close()
    migrated = sa.create_engine(url)
    request.addfinalizer(migrated.dispose)
    return migrated, fresh


def from_core(fresh: Callable[[], sa.Engine], metadata: sa.MetaData) -> sa.Engine:
    """A fresh database with `metadata`'s tables."""
    engine = fresh()
    metadata.create_all(engine)
    return engine


def test_alembic_head_and_core_schema_define_the_same_tables(
    databases: tuple[sa.Engine, Callable[[], sa.Engine]],
) -> None:
    migrated, fresh = databases
    core = from_core(fresh, schema.metadata)
    try:
        assert describe(migrated) == describe(core)
        assert set(describe(migrated)) == set(schema.metadata.tables)
        assert autogenerate_diff(migrated, schema.metadata) == []
    finally:
        core.dispose()


def test_hand_written_sql_compiles_on_alembic_head_and_core_schema(
    databases: tuple[sa.Engine, Callable[[], sa.Engine]],
) -> None:
    migrated, fresh = databases
    statements = all_statements(migrated.dialect.name)
    statements.update(chunk_statements(migrated.dialect.name))
    core = from_core(fresh, schema.metadata)
    try:
        assert compile_statements(migrated, statements) == {}
        assert compile_statements(core, statements) == {}
    finally:
        core.dispose()


def _nullable_count(m: sa.MetaData) -> None:
    m.tables["spend"].c.report_count.nullable = True


def _blob_charge(m: sa.MetaData) -> None:
    m.tables["reports"].c.charge.type = sa.LargeBinary()


def _extra_column(m: sa.MetaData) -> None:
    m.tables["statistics"].append_column(sa.Column("extra", sa.Text, nullable=True))


def _no_index(m: sa.MetaData) -> None:
    table = m.tables["reports"]
    table.indexes.discard(next(i for i in table.indexes if i.name == "ix_reports_policy_window"))


def _not_unique(m: sa.MetaData) -> None:
    table = m.tables["policy_lineage"]
    table.constraints.discard(
        next(c for c in table.constraints if c.name == "uq_policy_lineage_metric_name")
    )


@pytest.mark.parametrize(
    "change", [_nullable_count, _blob_charge, _extra_column, _no_index, _not_unique]
)
def test_broken_variant_a_core_schema_changed_in_one_place_is_caught(
    databases: tuple[sa.Engine, Callable[[], sa.Engine]], change: Callable[[sa.MetaData], None]
) -> None:
    migrated, fresh = databases
    changed = core_copy()
    change(changed)
    core = from_core(fresh, changed)
    try:
        assert describe(migrated) != describe(core)
        assert autogenerate_diff(migrated, changed) != []
    finally:
        core.dispose()


def test_broken_variant_a_statement_naming_a_missing_column_is_caught(
    databases: tuple[sa.Engine, Callable[[], sa.Engine]],
) -> None:
    migrated, _ = databases
    good = all_statements(migrated.dialect.name)
    broken = {
        "select_spend_typo": good["select_spend[1]"].replace("epsilon_spent", "epsilon_spend"),
        "ensure_statistics_typo": good["ensure_statistics"].replace("shard,", "shards,"),
    }
    if "copy_reports" in good:
        broken["copy_reports_typo"] = good["copy_reports"].replace("payload", "payloads")
    else:
        broken["insert_reports_typo"] = good["insert_reports[1]"].replace("payload", "payloads")
    assert set(compile_statements(migrated, broken)) == set(broken)
