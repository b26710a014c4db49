"""The analyst's HTML report says what it shows: ISO dates, plain-words budget, purpose, SVG."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import numpy as np
from fedldp.aggregator.estimation import FrequencyReport, ReportContext, frequency_report
from fedldp.aggregator.render import budget_sentence, render_html, render_table
from fedldp.client.mechanisms.grr import GRR


def _report() -> FrequencyReport:
    mechanism = GRR(Decimal(2), 4)
    statistic = mechanism.new_statistic()
    values = np.repeat(np.arange(4), [900, 500, 400, 200])
    mechanism.accumulate_batch(statistic, mechanism.perturb_batch(values, np.random.default_rng(7)))
    context = ReportContext(
        policy_id="demo.color",
        policy_version=3,
        metric="app.color",
        window_start=1_796_083_200,  # 2026-12-01T00:00:00Z
        window_seconds=86400,
        epsilon_cap=Decimal(2),
        epsilon_charged=Decimal(4000),
        purpose="Which theme colour people pick, to choose the default.",
    )
    return frequency_report(
        mechanism, statistic, ["red", "green", "blue", "other"], context=context
    )


def test_html_report_is_readable(tmp_path: Path) -> None:
    report = _report()
    text = render_html(report, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "2026-12-01T00:00:00Z to 2026-12-02T00:00:00Z" in text
    assert "1796083200" not in text  # no epoch numbers for people
    assert "Which theme colour people pick" in text
    assert "at most ε = 2 per 1 day" in text and "charged ε = 4000 in total" in text
    assert "<svg" in text and "</svg>" in text and "<img" not in text
    assert "z = raw estimate ÷ standard error" in text
    assert "window 2026-12-01T00:00:00Z" in render_table(report)
    assert budget_sentence(report) is not None
