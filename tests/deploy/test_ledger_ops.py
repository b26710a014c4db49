"""`fedldp ledger migrate` (the compose and Kubernetes migration job) on a real
SQLite file and the suite's real PostgreSQL server."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fedldp.collector.ledger.migrate import current_revision, head_revision, scripts

from fedldp.cli import main


def _revision(url: str) -> str | None:
    """`current_revision` at `url`, checked against Alembic's own reading."""
    from alembic.runtime.migration import MigrationContext

    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            at = current_revision(connection)
            assert at == MigrationContext.configure(connection).get_current_revision()
            return at
    finally:
        engine.dispose()


def test_head_revision_is_the_newest_migration_script() -> None:
    """`HEAD_REVISION`, what every opener compares with (without Alembic), is the head
    of the migration scripts: a new migration must update it."""
    assert head_revision() == scripts().get_current_head()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


def test_migrate_brings_an_empty_ledger_to_head_then_is_a_no_op(empty_ledger_url: str) -> None:
    assert _revision(empty_ledger_url) is None
    first = CliRunner().invoke(main, ["ledger", "migrate", "--ledger", empty_ledger_url])
    assert first.exit_code == 0, first.output
    assert first.output == f"ledger schema at {head_revision()} (head); was empty\n"
    assert _revision(empty_ledger_url) == head_revision()
    again = CliRunner().invoke(
        main, ["ledger", "migrate"], env={"FEDLDP_COLLECTOR_LEDGER_URL": empty_ledger_url}
    )
    assert again.exit_code == 0, again.output
    assert f"was {head_revision()}" in again.output


def test_migrate_without_a_database_is_one_line(tmp_path: Path) -> None:
    url = "postgresql+psycopg://nobody@127.0.0.1:9/none?connect_timeout=2"
    result = CliRunner().invoke(main, ["ledger", "migrate", "--ledger", url])
    assert result.exit_code == 1
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith(f"Error: cannot migrate the ledger {url}: ")
