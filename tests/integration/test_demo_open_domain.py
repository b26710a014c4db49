"""`fedldp demo --scenario open-domain`: devices record new words through the real SDK
(`client.record("browser.new_word", word)`) under a signed PEM policy, a real collector
process charges and stores them, and the HTML report lists the discovered words with
estimates and intervals. Fixed seed (the simulation only)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from demo_testkit import one_collector_process_env


def test_open_domain_demo_discovers_words_into_the_html_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedldp.cli",
            "demo",
            "--scenario",
            "open-domain",
            "--devices",
            "1000",
            "--processes",
            "1",
            "--seed",
            "7",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=one_collector_process_env(),  # the collector's process count is not tested here
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PEM, strings of up to 8 bytes, ε=8 per report" in result.stdout
    assert "reports accepted:                    1000" in result.stdout
    assert "refused by the collector for budget: 20" in result.stdout
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "Discovered strings" in html and "<svg" in html
    assert "<td>selfie</td>" in html  # the most frequent new word, with its row of figures
    assert "browser.new_word" in html
