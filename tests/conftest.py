"""Shared fixtures: a real PostgreSQL server for the whole session.

The server is started from the installed initdb/pg_ctl in a temporary folder
(as the `postgres` user when the suite runs as root, which PostgreSQL
requires), on a free loopback port, and stopped at the end. Tests that need it
take `postgresql_url` (a fresh database each) and are skipped with a clear
reason only when no PostgreSQL binaries are installed.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest


def _pg_bindir() -> Path | None:
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidates.append(out.stdout.strip())
    candidates.append("/usr/local/bin")
    candidates.extend(sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True))
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    """A running PostgreSQL server (superuser `postgres`, trust auth on loopback)."""

    host: str
    port: int
    _counter: itertools.count[int]

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@{self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = f"t{next(self._counter)}"
        with psycopg.connect(
            host=self.host, port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[PostgresServer]:
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL is not installed (no initdb/pg_ctl found via pg_config, "
            "/usr/local/bin or /usr/lib/postgresql/*/bin); install it to run these tests"
        )
    as_root = os.geteuid() == 0
    runner: list[str] = []
    base = Path(tempfile.mkdtemp(prefix="fedldp-pg-"))
    if as_root:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root but there is no 'postgres' user to run the server as")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        runner = ["runuser", "-u", "postgres", "--"]
    data = base / "data"
    port = _free_port()
    subprocess.run(
        [
            *runner,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    opts = (
        f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c max_connections=200 "
        "-c shared_buffers=64MB"
    )
    subprocess.run(
        [
            *runner,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-o",
            opts,
            "-l",
            str(base / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield PostgresServer("127.0.0.1", port, itertools.count(1))
    finally:
        subprocess.run(
            [*runner, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def postgresql_url(postgresql_server: PostgresServer) -> str:
    """A fresh, empty database on the session's PostgreSQL server."""
    return postgresql_server.create_database()
