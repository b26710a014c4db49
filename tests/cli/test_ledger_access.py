"""Reading never writes: `open_ledger(access=...)` and the commands built on it.

"read" opens an existing ledger read-only (SQLite ``mode=ro``; PostgreSQL
read-only transactions) and refuses one that is missing or not at this code's
migration; only "create" (the collector, `ledger init`/`migrate`) creates or
migrates. New SQLite ledgers are created with mode 0600.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat
from decimal import Decimal
from pathlib import Path

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from fedldp.collector.ledger import LedgerOpenError, open_ledger

from fedldp.cli import main


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_sqlite_ledger_is_0600_even_under_a_permissive_umask(tmp_path: Path) -> None:
    old = os.umask(0o000)
    try:
        open_ledger(f"sqlite:///{tmp_path / 'l.db'}").close()
    finally:
        os.umask(old)
    for name in os.listdir(tmp_path):
        mode = stat.S_IMODE((tmp_path / name).stat().st_mode)
        assert mode == 0o600, (name, oct(mode))


def test_read_access_changes_nothing_and_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    url = f"sqlite:///{path}"
    with open_ledger(url) as led:
        led.set_central_cap("s", "p", epsilon_cap=Decimal("1"), delta_cap=Decimal("0"))
    before = _digest(path)
    with open_ledger(url, access="read") as led:
        assert led.central_cap("s", "p") == (Decimal("1"), Decimal("0"))
        assert led.reconcile() == []
        with pytest.raises(sa.exc.OperationalError, match="readonly"):
            led.set_central_cap("s", "p", epsilon_cap=Decimal("2"), delta_cap=Decimal("0"))
    assert _digest(path) == before


def test_read_and_write_access_refuse_a_missing_file_and_create_nothing(tmp_path: Path) -> None:
    with pytest.raises(LedgerOpenError, match="does not exist"):
        open_ledger(f"sqlite:///{tmp_path / 'typo.db'}", access="read")
    with pytest.raises(LedgerOpenError, match="does not exist"):
        open_ledger(f"sqlite:///{tmp_path / 'typo.db'}", access="write")
    result = CliRunner().invoke(
        main, ["ledger", "show", "x", "--ledger", f"sqlite:///{tmp_path / 'typo.db'}"]
    )
    assert result.exit_code == 1 and "does not exist" in result.output
    assert os.listdir(tmp_path) == []


def test_a_ledger_at_another_migration_is_refused_until_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    open_ledger(url).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0001'")
    with pytest.raises(LedgerOpenError, match="fedldp ledger migrate"):
        open_ledger(url, access="read")
    runner = CliRunner()
    shown = runner.invoke(main, ["ledger", "show", "x", "--ledger", url])
    assert shown.exit_code == 1 and "migration '0001'" in shown.output


def test_a_sqlite_file_that_is_not_a_ledger_is_refused_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
    before = _digest(path)
    with pytest.raises(LedgerOpenError, match="not a fedldp ledger"):
        open_ledger(f"sqlite:///{path}", access="read")
    assert _digest(path) == before


def test_init_creates_a_0600_ledger_that_readers_then_accept(tmp_path: Path) -> None:
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'new.db'}"
    missing = runner.invoke(main, ["ledger", "show", "x", "--ledger", url])
    assert missing.exit_code == 1 and "ledger init" in missing.output
    assert not (tmp_path / "new.db").exists()
    made = runner.invoke(main, ["ledger", "init", "--ledger", url])
    assert made.exit_code == 0, made.output
    assert stat.S_IMODE((tmp_path / "new.db").stat().st_mode) == 0o600
    again = runner.invoke(main, ["ledger", "migrate", "--ledger", url])
    assert again.exit_code == 0, again.output
    shown = runner.invoke(main, ["ledger", "show", "x", "--ledger", url])
    assert shown.exit_code == 0 and "nothing charged" in shown.output


def test_postgresql_read_access(postgresql_url: str) -> None:
    with pytest.raises(LedgerOpenError, match="not a fedldp ledger"):
        open_ledger(postgresql_url, access="read")  # an empty database stays empty
    engine = sa.create_engine(postgresql_url)
    with engine.connect() as conn:
        assert not sa.inspect(conn).get_table_names()
    engine.dispose()
    with open_ledger(postgresql_url) as led:
        led.set_central_cap("s", "p", epsilon_cap=Decimal("1"), delta_cap=Decimal("0"))
    with open_ledger(postgresql_url, access="read") as led:
        assert led.central_cap("s", "p") == (Decimal("1"), Decimal("0"))
        with pytest.raises(sa.exc.InternalError, match="read-only"):
            led.set_central_cap("s", "p", epsilon_cap=Decimal("2"), delta_cap=Decimal("0"))
