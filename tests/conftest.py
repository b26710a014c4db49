"""Shared fixtures: a real PostgreSQL server for the whole session.

The server is started from the installed initdb/pg_ctl in a temporary folder
(as the `postgres` user when the suite runs as root, which PostgreSQL
requires), on a free loopback port, and stopped at the end
(`collector_testkit.PostgresServer`, tests/support). Tests that need it take
`postgresql_url` (a fresh database each) and are skipped with a clear reason
only when no PostgreSQL binaries are installed. A second server
(`postgresql_url_b`) is started for the ledger-shard tests only.

`plain_demo` is one `fedldp demo` run for the session (`demo_testkit`), shared by the
tests that check different things about the same output.
"""

from __future__ import annotations

import os
import pwd
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from demo_testkit import DemoRun, run_plain_demo

# One BLAS/OpenMP thread per test process, set before anything imports numpy or torch:
# pytest-xdist already runs one worker per core, and a multi-threaded BLAS beside it
# spins for a busy core (the Square Wave EMS of one report took 3.5 s of CPU with
# OpenBLAS's threads against 1.9 s with one, and minutes of wall time under load).
# Child processes (collectors, demos) inherit it.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

# Bytecode caches on, for this process and every process it starts: on a machine that
# sets PYTHONDONTWRITEBYTECODE (the development machine does; CI runs on one like it),
# each collector, demo and CLI process the suite starts would otherwise compile the
# project's modules from source again, and each xdist worker would redo pytest's
# assertion rewriting. Python writes each .pyc through a temporary file and a rename,
# so concurrent processes never read a torn one.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


def start_postgres() -> Iterator[Any]:
    """Start a PostgreSQL server, yield it, stop it (skips when PostgreSQL is not installed)."""
    pytest.importorskip("sqlalchemy", reason="the collector extra is not installed")
    from collector_testkit import PostgresServer, memory_folder, postgres_bindir

    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl found via pg_config, "
            "/usr/local/bin or /usr/lib/postgresql/*/bin); install it to run these tests"
        )
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root but there is no 'postgres' user to run PostgreSQL as")
    # fsync off: every commit still reaches the OS before it returns, so an
    # immediate shutdown (`PostgresServer.kill`, a crash of the server) loses
    # nothing; only an OS crash could, and the data is thrown away at the end.
    # Each fresh database (`create_database`, ~7.5 MB of WAL) costs no disk flush.
    # The data on /dev/shm when it has 4 GiB free: a session's ~180 fresh databases
    # (7.5 MB each) are created in ~0.05 s instead of ~0.2 s, and deleting them at the
    # end takes under a second instead of the 37–41 s an ext4 folder mounted with
    # `discard` took, which every xdist worker paid at its end.
    server = PostgresServer.start(bindir, fsync=False, parent=memory_folder(4 << 30))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[Any]:
    """A PostgreSQL server for the session."""
    yield from start_postgres()


@pytest.fixture(scope="session")
def postgresql_server_b() -> Iterator[Any]:
    """A second PostgreSQL server for the session (ledger shards: tests/collector/test_shards.py),
    started only by the tests that take it."""
    yield from start_postgres()


@pytest.fixture
def postgresql_url_b(postgresql_server_b: Any) -> str:
    """A fresh, empty database on the session's second PostgreSQL server."""
    return str(postgresql_server_b.create_database())


@pytest.fixture
def postgresql_url(postgresql_server: Any) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return str(postgresql_server.create_database())


@pytest.fixture(scope="session")
def plain_demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    """One `fedldp demo` for the session (`demo_testkit.run_plain_demo`: homepage, 200
    devices, a fixed seed, umask 000), for every test that checks its output."""
    return run_plain_demo(tmp_path_factory.mktemp("demo") / "run")
