"""The demo test kit: `fedldp demo` as a subprocess, and what it left behind.

Internal to this repository's tests (imported as `demo_testkit`, pyproject's pytest
``pythonpath``). `run_plain_demo` runs the default homepage demo once; the session
fixture `plain_demo` (tests/conftest.py) shares that one run between the tests that
check different things about the same output: its printed tally and HTML report
(tests/integration/test_pipeline.py), the modes of the files it created
(tests/cli/test_file_modes.py), the absence of the release-service section
(tests/aggregator/service/test_demo_release.py) and the dashboards over its ledger
(tests/dashboard).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: The installed `fedldp` command, beside this interpreter.
FEDLDP = str(Path(sys.executable).with_name("fedldp"))
#: The shared demo's simulated devices: at least the demo policy's release minimum (100
#: reports), so its report is released; one device in GUARD_DEMO_EVERY (10) tries a second
#: report, and round(2% of them) reinstall and are refused by the collector's ledger.
PLAIN_DEMO_DEVICES = 200
PLAIN_DEMO_SEED = 7
#: The umask the shared demo runs under: the most permissive, for the file-mode checks.
PLAIN_DEMO_UMASK = 0o000


def one_collector_process_env() -> dict[str, str]:
    """This environment with the collector the demo starts on one process
    (FEDLDP_COLLECTOR_PROCESSES=1), as on a one-core machine: the supervisor and its N
    processes are tested in tests/collector and by the shared demo (`run_plain_demo`);
    elsewhere they only add interpreters."""
    return {**os.environ, "FEDLDP_COLLECTOR_PROCESSES": "1"}


def port_is_closed(port: int) -> bool:
    """Whether nothing accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


@dataclass(frozen=True)
class DemoRun:
    """One finished `fedldp demo`: its output folder, exit status, printed text, whether
    its collector's port was closed the moment it exited, and the permission bits of
    every file it left under `out` (path relative to `out` -> mode), read then too."""

    out: Path
    returncode: int
    stdout: str
    stderr: str
    port_closed_at_exit: bool
    modes_at_exit: dict[str, int]


def run_plain_demo(out: Path) -> DemoRun:
    """`fedldp demo` (homepage; PLAIN_DEMO_DEVICES devices, seed PLAIN_DEMO_SEED, one
    simulator process) into `out`, under umask PLAIN_DEMO_UMASK. Its collector keeps its
    default processes (a supervisor and one per core on a multi-core machine, with the
    supervisor's lock file beside the ledger), as a user's demo runs."""
    done = subprocess.run(
        ["sh", "-c", f'umask {PLAIN_DEMO_UMASK:03o} && exec "$0" "$@"', FEDLDP, "demo",
         "--devices", str(PLAIN_DEMO_DEVICES), "--processes", "1",
         "--seed", str(PLAIN_DEMO_SEED), "--out", str(out)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    # Read at once: a port closed now is the collector's doing, not a later test's.
    port_file = out / "collector.port"
    closed = port_file.exists() and port_is_closed(int(port_file.read_text(encoding="ascii")))
    modes = {
        str(path.relative_to(out)): stat.S_IMODE(path.stat().st_mode)
        for path in sorted(out.rglob("*"))
        if path.is_file()
    }
    return DemoRun(out, done.returncode, done.stdout, done.stderr, closed, modes)
