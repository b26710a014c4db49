"""Creating and migrating a new ledger is serialized (issue 34, item 2).

Several `fedldp ledger migrate` and collectors started together on a file that
does not exist yet: before, 2–11 of 10–30 pairs of migrations failed ("table
reports already exists") and a collector beside a migration exited 1 in 5 of 16
("database is locked"). Now the first to take the file's writer lock file
(`<ledger>-ingest.lock`, before the first schema statement) creates and
migrates it; the others wait, then find it at head. All succeed, every time.
Real processes, real files (and a fresh PostgreSQL database, whose advisory
lock does the same). To make them really start together, the test holds the
file's lock itself until every process is queued on it (`/proc/locks`), then
lets them all go at once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment, write_config
from fedldp.collector.ledger import migrate, open_ledger
from fedldp.collector.ledger.sqlite_ingest import WriterLock, writer_lock_path

FEDLDP = str(Path(sys.executable).with_name("fedldp"))


def _environment() -> dict[str, str]:
    """This process's environment without FEDLDP_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FEDLDP_")}


def _migrate(url: str) -> subprocess.Popen[str]:
    """`fedldp ledger migrate --ledger URL`, started (not waited for)."""
    return subprocess.Popen(
        [FEDLDP, "ledger", "migrate", "--ledger", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(),
    )


def _at_head(url: str) -> bool:
    """Whether the database at `url` is a ledger at this code's head revision."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as connection:
            return migrate.current_revision(connection) == migrate.head_revision()
    finally:
        engine.dispose()


def _queued_on(lock_file: Path) -> int:
    """Processes waiting for the `flock` on `lock_file` (Linux's /proc/locks)."""
    tag = f":{lock_file.stat().st_ino} "
    lines = Path("/proc/locks").read_text(encoding="ascii").splitlines()
    return sum(1 for line in lines if "->" in line and "FLOCK" in line and tag in line)


def _release_when_queued(lock: WriterLock, lock_file: Path, waiting: int) -> None:
    """Release `lock` (held) once `waiting` processes queue on it (at most 120 s)."""
    deadline = time.monotonic() + 120
    while Path("/proc/locks").exists() and _queued_on(lock_file) < waiting:
        assert time.monotonic() < deadline, f"{_queued_on(lock_file)} of {waiting} queued"
        time.sleep(0.05)
    lock.__exit__(None, None, None)
    lock.close()


def _held(database: Path) -> WriterLock:
    """The writer lock of the (not yet existing) ledger `database`, taken."""
    lock = WriterLock(writer_lock_path(database))
    lock.__enter__()
    return lock


def _all_succeed(procs: list[subprocess.Popen[str]]) -> None:
    """Every migration exited 0 and said the schema is at head."""
    results = [(p.wait(timeout=120), *p.communicate()) for p in procs]
    failed = [r for r in results if r[0] != 0]
    assert not failed, failed
    head = migrate.head_revision()
    assert all(f"ledger schema at {head} (head)" in out for _, out, _ in results), results


def test_concurrent_migrations_of_a_new_sqlite_file_all_succeed(tmp_path: Path) -> None:
    for round_ in range(1):
        path = tmp_path / f"fresh-{round_}.db"
        url = f"sqlite:///{path}"
        lock = _held(path)
        # Three, released together: one creates and migrates the file; two wait on
        # its lock, the second of them behind the first (which found it at head).
        procs = [_migrate(url) for _ in range(3)]
        _release_when_queued(lock, writer_lock_path(path), 3)
        _all_succeed(procs)
        assert _at_head(url)
        assert path.stat().st_mode & 0o077 == 0  # created 0600
        with open_ledger(url, access="read") as ledger:
            assert ledger.reconcile() == []


def test_migrations_and_collectors_started_together_on_a_new_file(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Two migrations and two collector processes on one file that does not exist,
    released together (the kernel picks who creates it): the migrations exit 0,
    both collectors serve, then drain with status 0."""
    path = tmp_path / "together.db"
    url = f"sqlite:///{path}"
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    lock = _held(path)
    for name in ("a", "b"):
        config = write_config(deployment, tmp_path, url, name, processes=1)
        port_file = tmp_path / f"{name}.port"
        log = (tmp_path / f"{name}.log").open("wb")
        command = [FEDLDP, "collector", "serve", "--config", str(config)]
        command += ["--port-file", str(port_file)]
        procs.append((subprocess.Popen(command, stderr=log, env=_environment()), port_file))
    migrations = [_migrate(url) for _ in range(2)]
    try:
        _release_when_queued(lock, writer_lock_path(path), 4)
        _all_succeed(migrations)
        deadline = time.monotonic() + 120
        for proc, port_file in procs:
            while not port_file.exists():
                assert proc.poll() is None, (tmp_path / "a.log").read_text() + (
                    tmp_path / "b.log"
                ).read_text()
                assert time.monotonic() < deadline, "a collector did not start"
                time.sleep(0.05)
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        statuses = [proc.wait(timeout=60) for proc, _ in procs]
    assert statuses == [0, 0]
    assert _at_head(url)


def test_concurrent_migrations_of_a_new_postgresql_database(postgresql_url: str) -> None:
    _all_succeed([_migrate(postgresql_url) for _ in range(4)])
    assert _at_head(postgresql_url)


@pytest.mark.parametrize("content", [b"this is not a database\n" * 20, b"x"])
def test_a_file_that_is_not_a_database_is_refused_and_nothing_is_made_beside_it(
    tmp_path: Path, content: bytes
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(content)
    result = subprocess.run(
        [FEDLDP, "ledger", "migrate", "--ledger", f"sqlite:///{junk}"],
        capture_output=True,
        text=True,
        env=_environment(),
        timeout=120,
    )
    assert result.returncode == 1, result
    assert "is not a SQLite database" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.db"]
    assert junk.read_bytes() == content
