"""The dashboard in a real headless Chromium (Selenium with the system chromedriver).

Each page is loaded against ledgers fed by simulated devices; the rendered
numbers are checked against the JSON report, the chart elements and their
error bars must exist, a screenshot of each page is saved under the test's tmp
folder (and copied to $FEDLDP_DASHBOARD_SCREENSHOTS when set, e.g. docs/img),
and Chromium's network log must show no request leaving the loopback.

Skipped, saying how to install Chromium, when /usr/bin/chromium or
/usr/bin/chromedriver is missing (.ci/run installs them).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.dashboard.conftest import COLOR_LABELS, Setup
from tests.dashboard.test_dashboard import api_report, get, windows_of

CHROMIUM = Path(os.environ.get("FEDLDP_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FEDLDP_CHROMEDRIVER", "/usr/bin/chromedriver"))
INSTALL_HINT = (
    "browser tests need Chromium and its driver: sudo apt-get install -y chromium "
    "chromium-driver (or set FEDLDP_CHROMIUM / FEDLDP_CHROMEDRIVER)"
)
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--window-size=1200,1100",
)

#: URL schemes served inside the browser (its own UI, inline data): no network involved.
BROWSER_INTERNAL = ("chrome", "chrome-search", "about", "data", "blob", "devtools")

pytestmark = pytest.mark.skipif(
    not (CHROMIUM.exists() and CHROMEDRIVER.exists()), reason=INSTALL_HINT
)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def requested_urls(driver: Any) -> list[str]:
    """URLs of every request the page made since the last call (CDP network events)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def visit(driver: Any, url: str, shot: Path) -> None:
    """Load `url`, screenshot it, and require every request to stay on loopback."""
    requested_urls(driver)  # drop earlier entries
    driver.get(url)
    full = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["contentSize"]
    driver.set_window_size(1200, min(int(full["height"]) + 140, 4000))
    driver.save_screenshot(str(shot))
    target = os.environ.get("FEDLDP_DASHBOARD_SCREENSHOTS")
    if target and shot.name.startswith("dashboard-"):
        shutil.copy(shot, Path(target) / shot.name)
    urls = requested_urls(driver)
    network = [u for u in urls if urlsplit(u).scheme not in BROWSER_INTERNAL]
    assert any(u.startswith(url.split("?")[0]) for u in network), "no page request logged"
    for u in network:
        parts = urlsplit(u)
        assert parts.scheme == "http" and parts.hostname == "127.0.0.1", (
            f"request left the loopback: {u}"
        )


def cells(driver: Any, css: str) -> list[str]:
    from selenium.webdriver.common.by import By

    return [e.text for e in driver.find_elements(By.CSS_SELECTOR, css)]


def count(driver: Any, css: str) -> int:
    from selenium.webdriver.common.by import By

    return len(driver.find_elements(By.CSS_SELECTOR, css))


def test_index_page(browser: Any, rich_server: Any, tmp_path: Path) -> None:
    visit(browser, rich_server.url, tmp_path / "dashboard-index.png")
    _, _, body = get(f"{rich_server.url}api/policies")
    listed = json.loads(body)
    assert cells(browser, "#policies td.latest-n") == [
        str(p["latest_window_reports"]) for p in listed
    ]
    assert cells(browser, "#policies td.eps") == [p["epsilon_per_report"] for p in listed]
    assert "ε per report" in cells(browser, "#epsilon-line")[0]
    assert cells(browser, "#read-at")[0].endswith("Z")


def test_policy_page_with_consistency(browser: Any, rich_server: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    visit(browser, f"{rich_server.url}policies/app.color", tmp_path / "x.png")
    # Choose norm-sub in the form and submit it (no script: a plain GET form).
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    Select(browser.find_element(By.ID, "consistency")).select_by_value("norm-sub")
    old_page = browser.find_element(By.TAG_NAME, "html")
    browser.find_element(By.CSS_SELECTOR, "form button").click()
    # The form's GET replaces the page: wait for the old document to go (an event,
    # not a retry), then read the new one.
    WebDriverWait(browser, 60).until(expected_conditions.staleness_of(old_page))
    WebDriverWait(browser, 60).until(
        expected_conditions.presence_of_element_located((By.ID, "consistency-used"))
    )
    assert cells(browser, "#consistency-used") == ["norm-sub"]
    visit(browser, browser.current_url, tmp_path / "dashboard-policy.png")
    latest = windows_of(rich_server.url, "app.color")[-1]
    _, data = api_report(rich_server.url, "app.color", window=str(latest), consistency="norm-sub")
    est = data["estimates"]
    assert cells(browser, "#estimates td.estimate") == [f"{e['estimate']:.4f}" for e in est]
    assert cells(browser, "#estimates td.raw") == [f"{e['raw_estimate']:.4f}" for e in est]
    assert cells(browser, "#estimates td.ci-low") == [f"{e['ci_low']:.4f}" for e in est]
    assert cells(browser, "#estimates td.ci-high") == [f"{e['ci_high']:.4f}" for e in est]
    k = len(COLOR_LABELS)
    assert count(browser, "svg.bar-chart rect.bar") == k
    assert count(browser, "svg.bar-chart g.whisker line") == 3 * k  # bar and two caps
    assert count(browser, "svg.bar-chart circle.raw-marker") == k
    assert count(browser, "svg.trend-chart polygon.ci-band") >= 5
    assert count(browser, "svg.trend-chart polyline.trend-line") >= 5
    # Every whisker spans its CI: its drawn width is positive.
    for whisker in browser.find_elements(By.CSS_SELECTOR, "svg.bar-chart g.whisker"):
        assert whisker.rect["width"] > 0
    assert "95% CI" in browser.page_source


def test_numeric_policy_page(browser: Any, rich_server: Any, tmp_path: Path) -> None:
    visit(browser, f"{rich_server.url}policies/app.latency", tmp_path / "dashboard-numeric.png")
    latest = windows_of(rich_server.url, "app.latency")[-1]
    _, data = api_report(rich_server.url, "app.latency", window=str(latest))
    assert cells(browser, "#numeric td.mean") == [f"{data['mean']:.4f}"]
    assert cells(browser, "#numeric td.ci-high") == [f"{data['ci_high']:.4f}"]
    assert count(browser, "svg.bar-chart g.whisker") == 1
    assert count(browser, "svg.trend-chart polygon.ci-band") == 1


def test_budget_page(browser: Any, rich_server: Any, tmp_path: Path) -> None:
    visit(browser, f"{rich_server.url}budget", tmp_path / "dashboard-budget.png")
    _, _, body = get(f"{rich_server.url}api/budget")
    data = json.loads(body)
    color = data["policies"]["app.color"]
    assert cells(browser, 'table[data-policy="app.color"] td.charged') == [
        w["epsilon_charged"] for w in color
    ]
    assert cells(browser, 'table[data-policy="app.color"] td.at-cap') == [
        str(w["subjects_at_cap"]) for w in color
    ]
    assert cells(browser, "#reservations td.open") == ["1"]
    assert cells(browser, "#reservations td.settled-eps") == ["1.25"]


def test_demo_ledger_in_the_browser(
    browser: Any, demo_run: Setup, demo_server: Any, tmp_path: Path
) -> None:
    """The demo's ledger (real collector, real SDK devices): page numbers = report."""
    visit(browser, f"{demo_server.url}policies/demo.browser-homepage", tmp_path / "demo.png")
    _, data = api_report(demo_server.url, "demo.browser-homepage")
    assert cells(browser, "#estimates td.estimate") == [
        f"{e['estimate']:.4f}" for e in data["estimates"]
    ]
    assert count(browser, "svg.bar-chart g.whisker") == len(data["estimates"])
