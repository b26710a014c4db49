"""`fedldp demo --release-service`: the service's section of the demo and its receipts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fedldp.demo_release import PEOPLE, RECORDS_PER_PERSON, release_html, run_release_demo


def test_release_demo_returns_verified_count_and_mean(tmp_path: Path) -> None:
    results = run_release_demo(tmp_path, seed=3)
    assert [r.kind for r in results] == ["count", "mean"]
    assert all(r.verified and r.receipt.exists() for r in results)
    count, mean = results
    assert abs(float(count.value) - PEOPLE * RECORDS_PER_PERSON) < 200  # sd ≈ 11
    assert 0 <= float(mean.value) <= 100 and float(mean.lower) <= float(mean.upper)
    section = release_html(results)
    assert "release service" in section and "verified" in section and "FAILED" not in section


def test_demo_flag_adds_the_section_and_the_default_demo_has_none(tmp_path: Path) -> None:
    def demo(out: Path, *extra: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "fedldp.cli",
                "demo",
                "--devices",
                "200",
                "--processes",
                "1",
                "--seed",
                "5",
                "--out",
                str(out),
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert "receipt verified" in result.stdout or not extra
        return (out / "report.html").read_text(encoding="utf-8")

    with_service = demo(tmp_path / "with", "--release-service")
    assert "Central releases through the release service" in with_service
    assert (tmp_path / "with" / "release-service" / "mean.receipt.json").exists()
    plain = demo(tmp_path / "plain")
    assert "release service" not in plain and not (tmp_path / "plain" / "release-service").exists()
