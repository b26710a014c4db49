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
