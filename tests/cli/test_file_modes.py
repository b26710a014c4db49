"""Every command that creates a SQLite ledger file creates it 0600, whatever the umask.

`ledger init`, `ledger migrate` (of a new file), `ledger backup`, `ledger restore`
(the four in one process), `collector serve` and `demo` (the session's shared run,
demo_testkit) each run in a subprocess under a permissive umask (0o022, the usual
default, and 0o000); then every file they left beside the ledger, and the -wal/-shm
files SQLite makes while the ledger is open, must be 0600 (owner read/write only).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from collector_testkit import Deployment, spawn, write_config
from demo_testkit import PLAIN_DEMO_UMASK, DemoRun
from fedldp.collector.ledger import open_ledger

# The commands of one test, in order, in one interpreter (one import of the ledger stack,
# not one per command), each through the CLI as `fedldp ARGS` runs it; stops at a failure.
_COMMANDS_CHILD = """
import json, sys
from click.testing import CliRunner
from fedldp.cli import main
for args in json.loads(sys.stdin.read()):
    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        sys.exit(f"fedldp {args}: exit {result.exit_code}: {result.output[-2000:]!r} "
                 f"{result.exception!r}")
"""


def _fedldp(umask: int, *commands: list[str]) -> None:
    """Run each `fedldp ARGS` of `commands`, in order, in one process under `umask`; each
    must succeed."""
    done = subprocess.run(
        ["sh", "-c", f'umask {umask:03o} && exec "$0" "$@"', sys.executable, "-c",
         _COMMANDS_CHILD],
        input=json.dumps(commands), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (commands, done.stderr[-3000:])


def _modes(folder: Path, prefix: str = "") -> dict[str, str]:
    return {
        p.name: oct(stat.S_IMODE(p.stat().st_mode))
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name.startswith(prefix)
    }


def _assert_private(folder: Path, prefix: str = "") -> None:
    modes = _modes(folder, prefix)
    assert modes, f"no files in {folder}"
    assert all(m == "0o600" for m in modes.values()), modes


def _assert_private_while_open(folder: Path, name: str) -> None:
    """Open the ledger `name` for writing: its -wal and -shm files are 0600 too."""
    with open_ledger(f"sqlite:///{folder / name}", access="write") as led:
        led.reconcile()
        assert {f"{name}-wal", f"{name}-shm"} <= set(_modes(folder, name))
        _assert_private(folder, name)


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_ledger_commands_create_0600_files(tmp_path: Path, umask: int) -> None:
    folder = tmp_path / "ledgers"
    folder.mkdir()
    url = f"sqlite:///{folder}"
    _fedldp(
        umask,
        ["ledger", "init", "--ledger", f"{url}/init.db"],
        ["ledger", "migrate", "--ledger", f"{url}/migrated.db"],
        ["ledger", "backup", "--ledger", f"{url}/init.db", str(folder / "backup.db")],
        ["ledger", "restore", "--ledger", f"{url}/restored.db", str(folder / "backup.db")],
    )
    assert {"init.db", "migrated.db", "backup.db", "restored.db"} <= set(_modes(folder))
    _assert_private(folder)
    # A backup is one file (rollback journal): restoring from it created nothing beside it.
    assert _modes(folder, "backup.db") == {"backup.db": "0o600"}
    for name in ("init.db", "migrated.db", "restored.db"):
        _assert_private_while_open(folder, name)


def test_collector_serve_creates_a_0600_ledger(tmp_path: Path) -> None:
    deployment = Deployment.create(now=int(time.time()))
    deployment.add_categorical("demo.color")
    ledgers = tmp_path / "ledgers"
    ledgers.mkdir()
    config = write_config(deployment, tmp_path, f"sqlite:///{ledgers / 'served.db'}", "serve")
    old = os.umask(0o000)  # inherited by the collector process
    try:
        collector = spawn(config, "serve")
    finally:
        os.umask(old)
    try:
        _assert_private(ledgers)  # the ledger, its -wal, -shm and lock files, while it serves
        assert {"served.db", "served.db-wal", "served.db-shm"} <= set(_modes(ledgers))
    finally:
        collector.proc.send_signal(signal.SIGTERM)
        collector.proc.wait(timeout=60)
    _assert_private(ledgers)


def test_demo_creates_a_0600_ledger(plain_demo: DemoRun) -> None:
    """The session's shared `fedldp demo` ran under umask 000 (demo_testkit); the modes
    of the files it left, read as it exited."""
    assert PLAIN_DEMO_UMASK == 0o000
    assert plain_demo.returncode == 0, plain_demo.stderr[-2000:]
    for prefix in ("ledger.db", "keys/"):  # the ledger; the signing keys and token secret
        modes = {p: m for p, m in plain_demo.modes_at_exit.items() if p.startswith(prefix)}
        assert modes, f"no {prefix} files"
        assert all(m == 0o600 for m in modes.values()), {p: oct(m) for p, m in modes.items()}
