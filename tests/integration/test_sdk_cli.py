"""`fedldp client ...` shows the device state written by a real SDK run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fedldp.client.sdk import BudgetGuardError
from sdk_testkit import LABELS, Deployment, running_deployment

from fedldp.cli_client import client as main


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_client_cli_shows_policies_outbox_budget_events(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical(epsilon="0.5", epsilon_cap="1")
    collector = deployment.start()
    state = tmp_path / "d"
    with deployment.client(collector.address, state) as c:
        first = c.record("browser.homepage", LABELS[0])
        c.record("browser.homepage", LABELS[1])
        with pytest.raises(BudgetGuardError):
            c.record("browser.homepage", LABELS[2])
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(main, [*args, "--state-dir", str(state)])
        assert result.exit_code == 0, result.output
        return result.output

    (policy,) = json.loads(run("policies", "--json"))
    assert (policy["policy_id"], policy["version"], policy["cap_per_window"]) == (
        "homepage",
        1,
        "1",
    )
    outbox = json.loads(run("outbox", "--json"))
    assert outbox[0]["report_id"] == first.report_id.hex()
    (budget,) = json.loads(run("budget", "--json"))
    assert (budget["epsilon_spent"], budget["epsilon_left"], budget["reports"]) == ("1.0", "0", 2)
    (event,) = json.loads(run("events", "--json"))
    assert event["reason"] == "BUDGET_EXHAUSTED"
    status = json.loads(run("status", "--json"))
    assert status["pending_reports"] == 2 and status["counters"]["recorded"] == 2
    text = run("outbox")
    assert "homepage v1" in text
    assert all(label not in text + run("events") + run("status") for label in LABELS)

    missing = runner.invoke(main, ["status", "--state-dir", str(tmp_path / "none")])
    assert missing.exit_code != 0 and "no fedldp device state" in missing.output


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file in `folder`: (bytes, mode, mtime in ns)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


def test_inspection_never_writes_the_state(deployment: Deployment, tmp_path: Path) -> None:
    """Every `fedldp client` command leaves the state file's bytes, mode and mtime as
    they were, creates nothing beside it and migrates nothing, with the SDK closed
    (one file) and with an SDK holding the state open (its -wal and -shm files)."""
    deployment.categorical(epsilon="0.5", epsilon_cap="1")
    collector = deployment.start()
    state = tmp_path / "d"
    with deployment.client(collector.address, state) as c:
        c.record("browser.homepage", LABELS[0])
    state_file = next(state.iterdir())
    state_file.chmod(0o644)  # as a backup tool might have left it: inspection keeps it
    commands = [[name, *json_flag] for name in _COMMANDS for json_flag in ([], ["--json"])]
    runner = CliRunner()

    def inspect_all() -> None:
        for args in commands:
            result = runner.invoke(main, [*args, "--state-dir", str(state)])
            assert result.exit_code == 0, (args, result.output)

    before = _snapshot(state)
    directory_mtime = state.stat().st_mtime_ns
    inspect_all()
    assert _snapshot(state) == before
    assert state.stat().st_mtime_ns == directory_mtime
    with deployment.client(collector.address, state, fetch_policies=False) as live:
        live.record("browser.homepage", LABELS[1])
        live_before = _snapshot(state)
        assert len(live_before) == 3  # the state file, its -wal and -shm
        result = runner.invoke(main, ["status", "--json", "--state-dir", str(state)])
        assert json.loads(result.output)["counters"]["recorded"] == 2  # reads through the -wal
        inspect_all()
        after = _snapshot(state)
        # The -shm file is SQLite's shared-memory index, where every reader (the
        # SDK's own too) takes read marks: only the state file and -wal are data.
        assert after.keys() == live_before.keys()
        assert after[state_file.name] == live_before[state_file.name]
        wal = state_file.name + "-wal"
        assert after[wal] == live_before[wal]


_COMMANDS = ("status", "policies", "outbox", "budget", "events")
