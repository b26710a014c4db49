"""A sketch policy (cms, open domain) on the dashboard: listed, its page and its API
answer with the candidates message instead of crashing (real ledger, real reports)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from fedldp.aggregator.dashboard import pages
from fedldp.aggregator.dashboard.model import Options
from fedldp.aggregator.reports import CandidatesRequiredError
from fedldp.authoring import Authority, write_envelope, write_public_key
from fedldp.collector.ledger import open_ledger

from fedldp.cli_dashboard import load_dashboard
from tests.dashboard.conftest import DAY, NOW, TODAY, _sign, _submit


def test_sketch_policy_is_listed_and_asks_for_candidates(tmp_path: Path) -> None:
    authority = Authority.generate(now=NOW - 40 * DAY)
    words = _sign(
        authority,
        authority.open_policy(
            policy_id="app.words",
            metric="app.new_word",
            max_bytes=16,
            mechanism="cms",
            params={"rows": "4", "columns": "16"},
            epsilon="2",
            epsilon_cap="4",
            min_reports=10,
            window_seconds=DAY,
            now=NOW - 20 * DAY,
            lifetime_seconds=60 * DAY,
        ),
    )
    trust_dir, policy_dir = tmp_path / "trust", tmp_path / "policies"
    (trust_dir / "pinned").mkdir(parents=True)
    policy_dir.mkdir()
    write_public_key(authority.root_public_keys[0], trust_dir / "pinned" / "root0.pem")
    write_envelope(authority.root_envelope, trust_dir / "1.root")
    write_envelope(words.envelope, policy_dir / "words.policy")
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = open_ledger(url)
    try:
        values: list[object] = ["hello", "world", "hello"] * 20
        _submit(ledger, words, values, at=TODAY + 3600, subjects=30, rng=random.Random(1))
    finally:
        ledger.close()
    dashboard = load_dashboard(url, policy_dir, trust_dir, "default")
    (summary,) = dashboard.index()
    assert summary.latest_n == 60
    assert "open domain" in pages.index_page(dashboard.index(), read_at=NOW)
    options = Options()
    (window,) = dashboard.window_reports("app.words", options)
    assert (
        window.report is None and window.withheld is not None and "--candidates" in window.withheld
    )
    page = pages.policy_page(dashboard.policy("app.words"), [window], options, read_at=NOW)
    assert "app.words" in page and "--candidates FILE" in page and "withheld" not in page
    with pytest.raises(CandidatesRequiredError, match="--candidates"):
        dashboard.report("app.words", None, options)
