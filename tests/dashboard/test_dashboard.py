"""The dashboard over real ledgers: the JSON API equals `fedldp report --format json`,
pages never show withheld estimates or subject identifiers, the ledger file is never
changed, and the server refuses unsafe binds and unauthenticated requests."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.error
import urllib.request
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from demo_testkit import one_collector_process_env
from fedldp.aggregator.dashboard.app import (
    SECURITY_HEADERS,
    DashboardConfigError,
    check_bind,
)
from fedldp.aggregator.dashboard.model import Dashboard, Options, WindowReport, iso_utc
from fedldp.aggregator.dashboard.source import ReadOnlyLedger
from fedldp.aggregator.estimation import frequency_report
from fedldp.aggregator.reports import merge_partials
from fedldp.collector.ledger import LedgerOpenError

from fedldp.cli import main
from fedldp.cli_dashboard import load_dashboard
from tests.dashboard.conftest import (
    COLOR_COUNTS,
    COLOR_LABELS,
    NOW,
    SUBJECT_MARKERS,
    Setup,
    serve,
)

TOKEN = "t" * 12 + "0123456789abcdef"


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    """(status, headers, body) of a GET, errors included."""
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode("utf-8")


def cli_report(setup: Setup, policy_id: str, *extra: str) -> dict[str, Any]:
    result = CliRunner().invoke(
        main,
        [
            "report",
            "--policy",
            policy_id,
            "--ledger",
            setup.ledger_url,
            "--policies",
            str(setup.policy_dir),
            "--trust",
            str(setup.trust_dir),
            "--audience",
            setup.audience,
            "--at",
            str(int(time.time())),
            "--format",
            "json",
            *extra,
        ],
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.output)
    return data


def api_report(base: str, policy_id: str, **query: str) -> tuple[int, dict[str, Any]]:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    status, _, body = get(f"{base}api/policies/{policy_id}/report?{qs}")
    return status, json.loads(body)


def windows_of(base: str, policy_id: str) -> list[int]:
    _, _, body = get(f"{base}api/budget")
    return [w["window_start"] for w in json.loads(body)["policies"][policy_id]]


@pytest.mark.parametrize("consistency", ["none", "norm-sub", "base-cut", "project"])
def test_api_equals_report_cli_every_window(
    rich: Setup, rich_server: Any, consistency: str
) -> None:
    base = rich_server.url
    windows = windows_of(base, "app.color")
    assert len(windows) == len(COLOR_COUNTS)
    for index, window in enumerate([None, *windows]):
        query = {"consistency": consistency, "heavy_hitters": "1"}
        extra = ["--consistency", consistency, "--heavy-hitters"]
        if window is not None:
            query["window"] = str(window)
            extra += ["--window", str(window)]
        status, data = api_report(base, "app.color", **query)
        if index == 4:  # COLOR_COUNTS[3]: below the release gate
            assert status == 409 and "fewer than the policy's minimum" in data["error"]
            continue
        assert status == 200
        assert data == cli_report(rich, "app.color", *extra)


def test_api_equals_report_cli_numeric_and_demo(
    rich: Setup, rich_server: Any, demo_run: Setup, demo_server: Any
) -> None:
    for window in windows_of(rich_server.url, "app.latency"):
        status, data = api_report(
            rich_server.url, "app.latency", window=str(window), confidence="0.9"
        )
        assert status == 200
        assert data == cli_report(
            rich, "app.latency", "--window", str(window), "--confidence", "0.9"
        )
        assert data["kind"] == "numeric"
    status, data = api_report(demo_server.url, "demo.browser-homepage", consistency="norm-sub")
    assert status == 200
    assert data == cli_report(demo_run, "demo.browser-homepage", "--consistency", "norm-sub")
    status, data = api_report(rich_server.url, "app.latency", consistency="norm-sub")
    assert status == 400 and "categorical" in data["error"]


def _cells(html: str, css_class: str) -> list[str]:
    return re.findall(rf'<td class="num {css_class}">([^<]*)</td>', html)


def test_policy_page_numbers_equal_the_report(rich_server: Any) -> None:
    base = rich_server.url
    latest = windows_of(base, "app.color")[-1]
    _, data = api_report(base, "app.color", window=str(latest), consistency="norm-sub")
    _, _, page = get(f"{base}policies/app.color?consistency=norm-sub")
    estimates = data["estimates"]
    assert _cells(page, "estimate") == [f"{e['estimate']:.4f}" for e in estimates]
    assert _cells(page, "raw") == [f"{e['raw_estimate']:.4f}" for e in estimates]
    assert _cells(page, "ci-low") == [f"{e['ci_low']:.4f}" for e in estimates]
    assert _cells(page, "ci-high") == [f"{e['ci_high']:.4f}" for e in estimates]
    assert page.count('class="bar"') == len(COLOR_LABELS)
    assert page.count('class="whisker"') == len(COLOR_LABELS)
    assert page.count('class="raw-marker"') == len(COLOR_LABELS)
    assert "95% CI" in page and "norm-sub-processed" in page
    # The trend: 5 series (top values) over 6 windows, one withheld: 5 points each.
    assert page.count('class="trend-line"') == 2 * 5  # the gap splits each line in two
    assert page.count('class="ci-band"') == 2 * 5
    assert page.count('class="trend-point"') == 5 * 5
    assert 'id="withheld-windows"' in page
    _, nd = api_report(base, "app.latency", window=str(latest))
    _, _, numeric = get(f"{base}policies/app.latency")
    assert _cells(numeric, "mean") == [f"{nd['mean']:.4f}"]
    assert _cells(numeric, "ci-low") == [f"{nd['ci_low']:.4f}"]


def withheld_shown(dash: Dashboard, policy_id: str, window: int) -> bool:
    """Whether `dash` computes a report for `window` (it must not: below the gate)."""
    reports = dash.window_reports(policy_id, Options())
    return any(w.window_start == window and w.report is not None for w in reports)


class GatelessDashboard(Dashboard):
    """Broken variant: estimates every window, ignoring the release gate."""

    @staticmethod
    def _window_report(policy: Any, start: int, parts: Any, options: Options) -> WindowReport:
        merged = merge_partials(policy.mechanism, parts)
        result = frequency_report(policy.mechanism, merged.statistic, list(policy.labels))
        return WindowReport(start, merged.n, result, None)


def test_withheld_window_estimates_never_shown(rich: Setup, rich_server: Any) -> None:
    """The window below the release gate appears as withheld, with no estimate anywhere;
    the check catches a dashboard that ignores the gate."""
    withheld = windows_of(rich_server.url, "app.color")[3]
    dash = load_dashboard(rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience)
    broken = GatelessDashboard(dash.ledger, list(dash.policies.values()))
    try:
        assert not withheld_shown(dash, "app.color", withheld)
        assert withheld_shown(broken, "app.color", withheld)
        gated = [
            w for w in dash.window_reports("app.color", Options()) if w.window_start == withheld
        ]
        assert gated[0].n == COLOR_COUNTS[3] and gated[0].withheld is not None
    finally:
        dash.ledger.close()
    _, _, page = get(f"{rich_server.url}policies/app.color")
    day = re.escape(iso_utc(withheld)[:10])
    assert not re.search(rf"window {day}: ", page)  # no trend point titled with that window
    assert iso_utc(withheld) in page  # named as withheld


def test_budget_counts(rich_server: Any) -> None:
    _, _, body = get(f"{rich_server.url}api/budget")
    data = json.loads(body)
    color = data["policies"]["app.color"]
    assert [w["reports"] for w in color] == list(COLOR_COUNTS)
    assert [w["subjects"] for w in color] == [c // 2 for c in COLOR_COUNTS]
    assert [Decimal(w["epsilon_charged"]) for w in color] == [Decimal(c) for c in COLOR_COUNTS]
    assert [w["subjects_at_cap"] for w in color] == [c // 2 for c in COLOR_COUNTS]
    assert all(w["subjects_at_cap"] == 200 for w in data["policies"]["app.latency"])
    (purpose,) = data["central_reservations"]
    assert purpose == {
        "purpose": "quarterly-kpis",
        "open": 1,
        "epsilon_reserved_open": "0.25",
        "settled": 1,
        "epsilon_spent_settled": "1.25",
        "cancelled": 1,
    }
    _, _, page = get(f"{rich_server.url}budget")
    assert '<td class="num at-cap">150</td>' in page and "0.25" in page


def _all_responses(base: str) -> list[tuple[str, int, dict[str, str], str]]:
    paths = [
        "",
        "budget",
        "api/policies",
        "api/budget",
        "static/dashboard.css",
        "policies/app.color",
        "policies/app.color?consistency=project",
        "policies/app.latency",
        "api/policies/app.color/report?heavy_hitters=1",
        "api/policies/app.latency/report",
        "policies/nope",
        "api/policies/nope/report",
        "policies/app.color?confidence=abc",
    ]
    return [(p, *get(base + p)) for p in paths]


def test_no_subject_identifiers_and_security_headers(rich_server: Any) -> None:
    responses = _all_responses(rich_server.url)
    assert {p: s for p, s, _, _ in responses if s != 200} == {
        "policies/nope": 404,
        "api/policies/nope/report": 404,
        "policies/app.color?confidence=abc": 400,
    }
    for path, _, headers, body in responses:
        for marker in SUBJECT_MARKERS:
            assert marker not in body, path
        lower = {k.lower(): v for k, v in headers.items()}
        for name, value in SECURITY_HEADERS.items():
            assert lower.get(name) == value, (path, name)
        assert "script" not in body.lower().replace("script-src", "") or path.startswith("api")
        assert "http://" not in body.replace("http://www.w3.org/2000/svg", "")


def test_ledger_file_unchanged_by_views(rich: Setup, rich_server: Any) -> None:
    def snapshot() -> tuple[str, int, int]:
        data = rich.ledger_path.read_bytes()
        st = rich.ledger_path.stat()
        return hashlib.sha256(data).hexdigest(), st.st_mtime_ns, st.st_size

    before = snapshot()
    for _ in range(3):
        _all_responses(rich_server.url)
    assert snapshot() == before


def test_read_only_source_cannot_write_or_create(rich: Setup, tmp_path: Any) -> None:
    dash = load_dashboard(rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience)
    try:
        with pytest.raises(sa.exc.OperationalError, match=r"readonly|read-only|query_only"):
            dash.ledger.shards[0].transaction(
                lambda conn: conn.execute(sa.text("DELETE FROM statistics"))
            )
    finally:
        dash.ledger.close()
    missing = tmp_path / "absent.db"
    with pytest.raises(LedgerOpenError, match="does not exist"):
        load_dashboard(f"sqlite:///{missing}", rich.policy_dir, rich.trust_dir, rich.audience)
    assert not missing.exists()
    with pytest.raises(LedgerOpenError, match="unsupported"):
        load_dashboard("mysql://x/y", rich.policy_dir, rich.trust_dir, rich.audience)


def test_non_loopback_bind_needs_a_token(rich: Setup) -> None:
    with pytest.raises(DashboardConfigError, match="not loopback"):
        check_bind("0.0.0.0", None)
    with pytest.raises(DashboardConfigError, match="at least"):
        check_bind("0.0.0.0", "short")
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    config = rich.base / "collector.toml"
    config.write_text(
        f'ledger_url = "{rich.ledger_url}"\npolicy_dir = "{rich.policy_dir}"\n'
        f'trust_dir = "{rich.trust_dir}"\naudience = "default"\n',
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        main,
        ["dashboard", "--config", str(config), "--listen", "0.0.0.0:0"],
        env={"FEDLDP_DASHBOARD_TOKEN": ""},
    )
    assert result.exit_code == 1 and "without a bearer token" in result.output


def test_token_required_and_compared(rich: Setup) -> None:
    server = serve(rich, token=TOKEN, host="0.0.0.0")
    try:
        url = f"http://127.0.0.1:{server.port}/api/policies"
        assert get(url)[0] == 401
        assert get(url, {"Authorization": "Bearer " + TOKEN[:-1] + "x"})[0] == 401
        assert get(url, {"Authorization": "Basic " + TOKEN})[0] == 401
        status, headers, _ = get(url, {"Authorization": "Bearer " + TOKEN})
        assert status == 200
        assert headers["content-security-policy"].startswith("default-src 'none'")
    finally:
        server.stop()


def test_loopback_refuses_foreign_host_header(rich_server: Any) -> None:
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 gets nothing."""
    assert get(rich_server.url, {"Host": "evil.example"})[0] == 400
    assert get(rich_server.url, {"Host": f"localhost:{rich_server.port}"})[0] == 200


def test_demo_dashboard_flag(tmp_path: Any) -> None:
    """`fedldp demo --dashboard` prints the dashboard's URL and serves the demo's ledger."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fedldp.cli",
            "demo",
            "--devices",
            "100",  # the demo policy's release minimum: the report API has a report
            "--processes",
            "1",
            "--seed",
            "3",
            "--dashboard",
            "--out",
            str(tmp_path / "demo"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=one_collector_process_env(),  # the collector's process count is not tested here
    )
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if line.startswith("fedldp dashboard on "):
                url = line.split()[3]
                break
        assert url is not None and url.startswith("http://127.0.0.1:")
        status, _, body = get(url)
        assert status == 200 and "demo.browser-homepage" in body
        status, _, _ = get(f"{url}api/policies/demo.browser-homepage/report")
        assert status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) in (0, 1, -signal.SIGINT, 130)


def test_budget_open_window_refreshed_in_background(rich: Setup) -> None:
    """A stale open window is shown at once with its older read time, then re-read."""
    import threading

    now = [float(NOW)]
    loaded = load_dashboard(rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience)
    dash = Dashboard(
        loaded.ledger, list(loaded.policies.values()), budget_ttl_s=10, clock=lambda: now[0]
    )
    try:
        first = dash.budget()
        assert first.read_at == NOW
        now[0] += 100
        second = dash.budget()
        assert second.read_at == NOW and second.policies == first.policies
        for thread in threading.enumerate():
            if thread.name == "dashboard-spend":
                thread.join(timeout=60)
        third = dash.budget()
        assert third.read_at == NOW + 100 and third.policies == first.policies
    finally:
        dash.ledger.close()


@pytest.mark.postgres
def test_postgresql_ledger_read_only(rich: Setup, postgresql_url: str) -> None:
    """PostgreSQL: the API equals `fedldp report`; the source's transactions refuse writes."""
    import random

    from fedldp.collector.ledger import open_ledger

    from tests.dashboard.conftest import _submit

    loaded = load_dashboard(rich.ledger_url, rich.policy_dir, rich.trust_dir, rich.audience)
    loaded.ledger.close()
    color = loaded.policies["app.color"]
    ledger = open_ledger(postgresql_url, shard="pg-a")
    try:
        rng = random.Random(4)
        _submit(ledger, color, rng.choices(range(6), k=200), at=NOW, subjects=100, rng=rng)
    finally:
        ledger.close()
    source = ReadOnlyLedger(open_ledger(postgresql_url, access="read"))
    try:
        dash = Dashboard(source, list(loaded.policies.values()))
        data = dash.report("app.color", None, Options(consistency="norm-sub"))
        expected = CliRunner().invoke(
            main,
            [
                "report",
                "--policy",
                "app.color",
                "--ledger",
                postgresql_url,
                "--policies",
                str(rich.policy_dir),
                "--trust",
                str(rich.trust_dir),
                "--at",
                str(int(time.time())),
                "--format",
                "json",
                "--consistency",
                "norm-sub",
            ],
        )
        assert expected.exit_code == 0, expected.output
        assert data == json.loads(expected.output)
        assert dash.budget().policies["app.color"][0].subjects == 100
        with pytest.raises(sa.exc.InternalError, match="read-only transaction"):
            source.shards[0].transaction(
                lambda conn: conn.execute(sa.text("DELETE FROM statistics"))
            )
    finally:
        source.close()
