"""The dashboard on a multi-attribute policy: the pages and the API answer (no crash), the
API's report equals `fedldp report --format json`, and each attribute is reported."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.dashboard.app import DashboardServer
from fedldp.authoring import Authority, write_envelope, write_public_key
from fedldp.collector.ledger import open_ledger

from tests.dashboard.conftest import DAY, NOW, TODAY, Setup, _sign, _submit, serve
from tests.dashboard.test_dashboard import api_report, cli_report, get


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    base = tmp_path_factory.mktemp("multi")
    authority = Authority.generate(now=NOW - 40 * DAY)
    policy = _sign(
        authority,
        authority.multi_policy(
            policy_id="app.profile",
            metric="app.profile",
            attributes=[
                {"name": "os", "values": ["android", "ios", "other"], "mechanism": "grr"},
                {"name": "age", "lo": "0", "hi": "100", "mechanism": "piecewise"},
            ],
            mechanism="multi-sample",
            epsilon="1",
            epsilon_cap="1",
            window_seconds=DAY,
            now=NOW - 20 * DAY,
            lifetime_seconds=60 * DAY,
            min_reports=20,
        ),
    )
    trust_dir, policy_dir = base / "trust", base / "policies"
    (trust_dir / "pinned").mkdir(parents=True)
    policy_dir.mkdir()
    write_public_key(authority.root_public_keys[0], trust_dir / "pinned" / "root0.pem")
    write_envelope(authority.root_envelope, trust_dir / "1.root")
    write_envelope(policy.envelope, policy_dir / "profile.policy")
    ledger_path = base / "ledger.db"
    ledger = open_ledger(f"sqlite:///{ledger_path}", shard="collector-a")
    rng = random.Random(3)
    try:
        for back in (1, 0):
            values: list[object] = [(rng.randrange(3), rng.uniform(0, 100)) for _ in range(300)]
            _submit(ledger, policy, values, at=TODAY - back * DAY + 3600, subjects=300, rng=rng)
    finally:
        ledger.close()
    return Setup(base, ledger_path, policy_dir, trust_dir, "default", ("app.profile",))


@pytest.fixture(scope="module")
def server(multi: Setup) -> Iterator[DashboardServer]:
    running = serve(multi)
    yield running
    running.stop()


def test_pages_and_api_report_every_attribute(multi: Setup, server: Any) -> None:
    base = server.url
    status, _, index = get(base)
    assert status == 200 and "multi-attribute" in index
    status, _, page = get(f"{base}policies/app.profile")
    assert status == 200 and "multi-attribute report" in page
    status, data = api_report(base, "app.profile")
    assert status == 200 and data["kind"] == "multi"
    assert [a["name"] for a in data["attributes"]] == ["os", "age"]
    assert data == cli_report(multi, "app.profile")
    status, _, listing = get(f"{base}api/policies")
    assert status == 200 and '"multi"' in listing


def test_report_files_are_written(multi: Setup, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from fedldp.cli import main

    out = tmp_path / "profile.html"
    result = CliRunner().invoke(
        main,
        [
            "report",
            "--policy",
            "app.profile",
            "--policies",
            str(multi.policy_dir),
            "--trust",
            str(multi.trust_dir),
            "--ledger",
            multi.ledger_url,
            "--format",
            "html",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert "Attribute os" in text and "Attribute age" in text
