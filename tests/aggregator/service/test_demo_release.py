"""`fedldp demo --release-service`: the service's section of the demo, its receipts and its
DP-SGD job (skipped, saying so, without the train extra)."""

from __future__ import annotations

import html
import subprocess
import sys
from pathlib import Path

import pytest

from fedldp.demo_release import (
    PEOPLE,
    RECORDS_PER_PERSON,
    TRAIN_SKIPPED,
    DemoTraining,
    have_train_extra,
    release_html,
    run_release_demo,
)


def test_release_demo_returns_verified_count_and_mean(tmp_path: Path) -> None:
    demo = run_release_demo(tmp_path, seed=3)
    results = demo.releases
    assert [r.kind for r in results] == ["count", "mean"]
    assert all(r.verified and r.receipt.exists() for r in results)
    count, mean = results
    assert abs(float(count.value) - PEOPLE * RECORDS_PER_PERSON) < 200  # sd ≈ 11
    assert 0 <= float(mean.value) <= 100 and float(mean.lower) <= float(mean.upper)
    section = release_html(demo)
    assert "release service" in section and "verified" in section and "FAILED" not in section
    if not have_train_extra():
        assert demo.training == TRAIN_SKIPPED and html.escape(TRAIN_SKIPPED) in section
        return
    job = demo.training
    assert isinstance(job, DemoTraining) and job.state == "SUCCEEDED" and job.verified
    assert job.steps == 20 and job.noise_multiplier and job.model_sha256
    assert 0 < float(job.epsilon_spent) <= 1 and job.accuracy is not None
    assert job.receipt is not None and (job.receipt.parent / "model.pt").exists()
    assert "DP-SGD training job" in section and job.model_sha256 in section


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
    assert "A DP-SGD training job through the release service" in with_service
    if have_train_extra():
        assert "<th>receipt verified</th><td>yes</td>" in with_service
        assert "<th>status</th><td>SUCCEEDED</td>" in with_service
    else:
        assert html.escape(TRAIN_SKIPPED) in with_service
    plain = demo(tmp_path / "plain")
    assert "release service" not in plain and not (tmp_path / "plain" / "release-service").exists()


def test_without_the_train_extra_the_job_is_skipped_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fedldp.demo_release.have_train_extra", lambda: False)
    demo = run_release_demo(tmp_path, seed=3)
    assert demo.training == TRAIN_SKIPPED and all(r.verified for r in demo.releases)
    assert html.escape(TRAIN_SKIPPED) in release_html(demo)
    assert not (tmp_path / "release-service" / "jobs").exists()
