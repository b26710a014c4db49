"""The budget page shows a release service's central spend kept in its own ledger.

`fedldp demo --release-service --dashboard` runs the release service on its own
ledger; the dashboard read only the collector's and said "No central
reservations". `fedldp dashboard --central-ledger URL` (the demo passes its
release ledger) adds that ledger's reservations per purpose to /budget and
/api/budget. The release ledger here is written the way the release service
writes it: releases through `private_count` on `AnalystCapLedger` (the service's
own-cap holds, which must not be counted twice), one cancelled before its data
was opened. Served by the real dashboard app over HTTP.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

from click.testing import CliRunner
from fedldp.aggregator.central.releases import private_count
from fedldp.aggregator.dashboard.app import DashboardServer
from fedldp.aggregator.service.holds import AnalystCapLedger
from fedldp.aggregator.service.policy import analyst_subject, ledger_subject
from fedldp.collector.ledger import open_ledger

from fedldp.cli import main
from fedldp.cli_dashboard import load_dashboard
from tests.dashboard.conftest import Setup
from tests.dashboard.test_dashboard import get

SERVICE, DATASET, PURPOSE, ANALYST = "release-service", "visits", "q3-report", "alice"


def _release_ledger(path: Path) -> str:
    url = f"sqlite:///{path}"
    led = open_ledger(url)
    try:
        shared, own = ledger_subject(SERVICE, DATASET), analyst_subject(SERVICE, DATASET, ANALYST)
        for subject in (shared, own):
            led.set_central_cap(subject, PURPOSE, epsilon_cap=Decimal(2), delta_cap=Decimal(0))
        view = AnalystCapLedger(led, own, PURPOSE)
        for key in ("a", "b"):
            private_count(
                view,
                epsilon=Decimal("0.25"),
                load=lambda: list(range(50)),
                subject=shared,
                purpose=PURPOSE,
                idempotency_key=f"release-service:5:alice:{key}",
                now=1_000_000,
            )
        res = led.reserve(
            subject=shared, purpose=PURPOSE, epsilon=Decimal("0.5"), delta=Decimal(0),
            idempotency_key="c", now=1_000_001,
        )  # fmt: skip
        led.cancel(res.id, now=1_000_002)
        assert len(led.reservations(own, PURPOSE)) == 2  # the holds exist
    finally:
        led.close()
    return url


def test_budget_page_shows_the_release_service_ledger(rich: Setup, tmp_path: Path) -> None:
    central = _release_ledger(tmp_path / "release-ledger.db")
    dash = load_dashboard(
        rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience, central=[central]
    )
    server = DashboardServer(dash, host="127.0.0.1", port=0, token=None).start()
    try:
        _, _, body = get(f"{server.url}api/budget")
        _, _, page = get(f"{server.url}budget")
    finally:
        server.stop()
    data = json.loads(body)
    (ledger,) = data["central_ledgers"]
    assert ledger["ledger"] == central
    assert ledger["central_reservations"] == [
        {
            "purpose": PURPOSE,
            "open": 0,
            "epsilon_reserved_open": "0",
            "settled": 2,  # not 4: the analyst's own-cap holds are the same releases
            "epsilon_spent_settled": "0.50",
            "cancelled": 1,
        }
    ]
    assert data["central_reservations"][0]["purpose"] == "quarterly-kpis"  # the main ledger's
    assert 'id="reservations-1"' in page and f"Central reservations: {central}" in page
    assert '<td class="num settled-eps">0.50</td>' in page
    assert ANALYST not in page and SERVICE + "/" not in page  # purposes only, never a subject


def test_without_the_central_ledger_its_spend_is_not_shown(rich: Setup, tmp_path: Path) -> None:
    """The broken variant (the dashboard on the collector's ledger alone): the release
    service's spend is missing from the page."""
    _release_ledger(tmp_path / "release-ledger.db")
    dash = load_dashboard(rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience)
    server = DashboardServer(dash, host="127.0.0.1", port=0, token=None).start()
    try:
        _, _, page = get(f"{server.url}budget")
    finally:
        server.stop()
    assert PURPOSE not in page and 'id="reservations-1"' not in page


def test_the_cli_refuses_a_central_ledger_that_does_not_exist(rich: Setup, tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'nope.db'}"
    out = CliRunner().invoke(
        main,
        [
            "dashboard", "--ledger", rich.ledger_url, "--policies", str(rich.policy_dir),
            "--trust", str(rich.trust_dir), "--central-ledger", missing, "--listen",
            "127.0.0.1:0",
        ],
    )  # fmt: skip
    assert out.exit_code == 1, out.output
    assert "nope.db" in out.output and "Traceback" not in out.output
    assert not (tmp_path / "nope.db").exists()
