"""The dashboard and `release-service consolidate` read every shard of a sharded
ledger, as `fedldp report` does: their counts equal the sum over the shards, and
a reader given part of the shards (one shard's URL, or a config missing a shard)
refuses. Two real SQLite files, and two real PostgreSQL servers.

Broken variant caught: a reader that opened only the first URL of
``ledger_shards`` (what the dashboard did) counts shard 0's reports only.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from collector_testkit import Deployment, checked_report, write_config
from fedldp.collector.ledger.shards import open_sharded

from fedldp.cli import main

pytest.importorskip("uvicorn", reason="the dashboard extra: pip install 'fedldp[dashboard]'")

SUBJECTS = [f"reader-{i}" for i in range(40)]


@pytest.fixture(params=["sqlite", "postgresql"])
def shard_urls(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """Two shards: two SQLite files, or a database on each of two PostgreSQL servers."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    return (
        str(request.getfixturevalue("postgresql_url")),
        str(request.getfixturevalue("postgresql_url_b")),
    )


@pytest.fixture
def per_shard(deployment: Deployment, shard_urls: tuple[str, str], now: int) -> list[int]:
    """Charge SUBJECTS (1 to 3 reports each) through the shard router; the reports
    stored on each shard (both hold some)."""
    policy = deployment.verified(deployment.envelopes[0])
    with open_sharded(list(shard_urls), shard="c0") as sharded:
        for i, subject in enumerate(SUBJECTS):
            reports = [checked_report(policy, (i + j) % 4) for j in range(1 + i % 3)]
            sharded.for_subject(subject).submit(subject, reports, now=now)
        counts = [s.report_count("color", 1) for s in sharded.shards]
    assert min(counts) > 0
    return counts


def _config(deployment: Deployment, tmp_path: Path, name: str, **settings: Any) -> Path:
    return write_config(deployment, tmp_path, "", name, **settings)


#: Runs `fedldp dashboard ARGV` with a server that, instead of serving until
#: Ctrl-C, reads the index and the budget once and prints them as one JSON line.
_SERVE_ONCE = """
import json, sys
from fedldp.aggregator.dashboard.app import DashboardServer
from fedldp.cli import main

def once(self):
    index = {s.policy.policy_id: s.latest_n for s in self.dashboard.index()}
    budget = {
        pid: [{"reports": w.reports, "subjects": w.subjects} for w in windows]
        for pid, windows in self.dashboard.budget().policies.items()
    }
    print("SEEN " + json.dumps({"index": index, "budget": budget}))
    self.socket.close()

DashboardServer.serve_forever = once
main(sys.argv[1:])
"""


@dataclass(frozen=True)
class Served:
    """What one `fedldp dashboard` process did: its exit code and its output."""

    exit_code: int
    output: str


def _serve_once(args: list[str]) -> tuple[Served, dict[str, Any]]:
    """Run the dashboard command in its own process (uvicorn configures logging on
    the process's streams, which must not be the test runner's captured ones)."""
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_ONCE, "dashboard", *args, "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    seen: dict[str, Any] = {}
    for line in done.stdout.splitlines():
        if line.startswith("SEEN "):
            seen = json.loads(line[len("SEEN ") :])
    return Served(done.returncode, done.stdout + done.stderr), seen


def test_dashboard_counts_every_shard(
    deployment: Deployment,
    shard_urls: tuple[str, str],
    per_shard: list[int],
    tmp_path: Path,
) -> None:
    config = _config(deployment, tmp_path, "whole", ledger_shards=list(shard_urls))
    result, seen = _serve_once(["--config", str(config)])
    assert result.exit_code == 0, result.output
    (window,) = seen["budget"]["color"]
    assert window["reports"] == sum(per_shard)
    assert window["subjects"] == len(SUBJECTS)
    assert seen["index"]["color"] == sum(per_shard)
    report = CliRunner().invoke(
        main, ["report", "--config", str(config), "--policy", "color", "--format", "json"]
    )
    assert report.exit_code == 0, report.output
    assert json.loads(report.output)["n"] == sum(per_shard)


def test_consolidate_counts_every_shard(
    deployment: Deployment,
    shard_urls: tuple[str, str],
    per_shard: list[int],
    tmp_path: Path,
    now: int,
) -> None:
    config = _config(deployment, tmp_path, "whole", ledger_shards=list(shard_urls))
    out = tmp_path / "consolidated.db"
    result = CliRunner().invoke(main, [*_consolidate(tmp_path, now, out), "--config", str(config)])
    assert result.exit_code == 0, result.output
    with sqlite3.connect(out) as conn:
        counts = {n for (n,) in conn.execute("SELECT n FROM ldp_estimates")}
    assert counts == {sum(per_shard)}


def _consolidate(tmp_path: Path, now: int, out: Path) -> list[str]:
    return [
        "release-service", "consolidate",
        "--policies", str(tmp_path / "policies"), "--trust", str(tmp_path / "trust"),
        "--policy", "color", "--out", f"sqlite:///{out}", "--at", str(now),
    ]  # fmt: skip


@pytest.fixture
def partial_readers(
    deployment: Deployment, shard_urls: tuple[str, str], per_shard: list[int], tmp_path: Path
) -> Iterator[list[tuple[list[str], str]]]:
    """(reader options, what its refusal says) for each way of naming part of the
    shards: a config listing shard 0 only, each shard's URL as --ledger."""
    missing = _config(deployment, tmp_path, "part", ledger_shards=[shard_urls[0]])
    yield [
        (["--config", str(missing)], "1 shard URL(s) given, but the ledger's shard map has 2"),
        *(
            (["--ledger", url], f"is shard {i} of 2 of a sharded ledger")
            for i, url in enumerate(shard_urls)
        ),
    ]


def test_dashboard_and_consolidate_refuse_part_of_the_shards(
    shard_urls: tuple[str, str],
    partial_readers: list[tuple[list[str], str]],
    tmp_path: Path,
    now: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The refusals come before any server is built, so the dashboard runs in this
    process; were one to get as far as serving, `serve_forever` records it and
    returns (the test then fails) instead of serving until Ctrl-C."""
    from fedldp.aggregator.dashboard.app import DashboardServer

    served: list[list[str]] = []
    folders = ["--policies", str(tmp_path / "policies"), "--trust", str(tmp_path / "trust")]
    out = tmp_path / "consolidated.db"
    for options, refusal in partial_readers:
        monkeypatch.setattr(
            DashboardServer, "serve_forever", lambda self, o=options: served.append(o)
        )
        shown = CliRunner().invoke(
            main, ["dashboard", *options, *folders, "--listen", "127.0.0.1:0"]
        )
        assert shown.exit_code == 1 and refusal in shown.output, (options, shown.output)
        made = CliRunner().invoke(main, [*_consolidate(tmp_path, now, out), *options])
        assert made.exit_code == 1 and refusal in made.output, (options, made.output)
        assert not out.exists()
    assert served == []
