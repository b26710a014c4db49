"""The supervisor checks every input before it starts a process (issue 29, item 2),
and a process whose supervisor died while it started never binds (issue 34, item 4).

With `processes` = 2 (the default on a 2-core machine), a bad ledger, an
unreachable PostgreSQL, an unreadable token secret, a policy folder that does
not load, or a port above 65535 used to make every process raise it in turn
(65–285 lines, 2–4 tracebacks): now the supervisor finds it first, writes one
line, exits 1 and starts nothing (no generation lock made beside the ledger).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from collector_testkit import Deployment, write_config

FEDLDP = str(Path(sys.executable).with_name("fedldp"))


def _environment() -> dict[str, str]:
    """This process's environment without FEDLDP_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FEDLDP_")}


@pytest.mark.parametrize(
    ("case", "settings", "message"),
    [
        ("junk ledger", {}, "is not a SQLite database"),
        (
            "closed postgresql port",
            {"ledger_url": "postgresql+psycopg://fedldp@127.0.0.1:1/fedldp"},
            "Connection refused",
        ),
        ("no token secret", {"token_secret_file": "/nonexistent/token.secret"}, "token_secret"),
        ("no trust folder", {"trust_dir": "/nonexistent/trust"}, "policy folder does not load"),
        ("port above 65535", {"listen": "127.0.0.1:70000"}, "above 65535"),
        ("negative rate limit", {"rate_limit_per_second": -1.0}, "rate_limit_per_second"),
        ("unknown log level", {"log_level": "LOUD"}, "log_level"),
    ],
)
def test_a_bad_input_with_two_processes_is_one_line_and_no_process(
    deployment: Deployment, tmp_path: Path, case: str, settings: dict[str, object], message: str
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database\n" * 20)
    values: dict[str, object] = {"ledger_url": f"sqlite:///{junk}", "processes": 2}
    if case != "junk ledger":
        values["ledger_url"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    values.update(settings)
    ledger_url = str(values.pop("ledger_url"))
    config = write_config(deployment, tmp_path, ledger_url, "bad", **values)
    result = subprocess.run(
        [FEDLDP, "collector", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        env=_environment(),
        timeout=120,
    )
    lines = result.stderr.splitlines()
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert len(lines) == 1 and message in lines[0], lines
    assert "collector serving" not in result.stderr
    assert not list(tmp_path.glob("*-serve.lock")) and not list(tmp_path.glob("junk.db-*"))


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("gone", ["another parent", "liveness pipe closed"])
def test_a_process_whose_supervisor_is_gone_does_not_bind(
    deployment: Deployment, tmp_path: Path, gone: str
) -> None:
    """A collector process started with its supervisor's pid and liveness pipe, the
    supervisor already gone (its pid not the parent's; or the pipe's write end
    closed): it exits 0 without binding, writing its port file or logging
    `collector serving`."""
    config = write_config(
        deployment, tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}", "child", log_level="INFO"
    )
    port_file = tmp_path / "child.port"
    env = _environment()
    read_end, write_end = os.pipe()
    os.set_inheritable(read_end, True)
    env["FEDLDP_SUPERVISOR_LIVENESS_FD"] = str(read_end)
    env["FEDLDP_SUPERVISOR_PID"] = str(_dead_pid() if gone == "another parent" else os.getpid())
    os.close(write_end)  # nobody holds it: end of file at once
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedldp.collector",
                "serve",
                "--config",
                str(config),
                *("--port-file", str(port_file)),
            ],
            capture_output=True,
            text=True,
            env=env,
            pass_fds=(read_end,),
            timeout=120,
        )
    finally:
        os.close(read_end)
    assert result.returncode == 0, result.stderr
    assert "collector serving" not in result.stderr
    assert "the supervisor is gone; not serving" in result.stderr
    assert not port_file.exists()


def test_a_port_another_program_holds_is_one_line_with_two_processes(
    deployment: Deployment, tmp_path: Path
) -> None:
    import socket

    with socket.socket() as holder:  # no SO_REUSEPORT: nobody may share it
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        config = write_config(
            deployment,
            tmp_path,
            f"sqlite:///{tmp_path / 'ledger.db'}",
            "busy",
            processes=2,
            listen=f"127.0.0.1:{port}",
        )
        result = subprocess.run(
            [FEDLDP, "collector", "serve", "--config", str(config)],
            capture_output=True,
            text=True,
            env=_environment(),
            timeout=120,
        )
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and len(lines) == 1, lines
    assert "cannot listen on" in lines[0] and "Traceback" not in result.stderr
