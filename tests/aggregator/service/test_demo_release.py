"""`fedldp demo --release-service`: the service's section of the demo, its receipts and its
DP-SGD job (skipped, saying so, without the train extra)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from demo_testkit import DemoRun

from fedldp.cli import main
from fedldp.demo_release import (
    PEOPLE,
    RECORDS_PER_PERSON,
    TRAIN_SKIPPED,
    DemoResults,
    DemoTraining,
    have_train_extra,
    release_html,
    run_release_demo,
)


@dataclass(frozen=True)
class CliDemo:
    """One `fedldp demo --release-service` run, in-process, and what it produced."""

    out: Path
    stdout: str
    html: str
    results: DemoResults


def _demo(out: Path, *extra: str) -> tuple[str, str]:
    """`fedldp demo` through the CLI (in-process: the collector and the device
    simulators are still their own processes); its stdout and report.html. 100 devices:
    the demo policy's release minimum, so the report above the section is released."""
    args = ["demo", "--devices", "100", "--processes", "1", "--seed", "5", "--out", str(out)]
    result = CliRunner().invoke(main, [*args, *extra])
    assert result.exit_code == 0, (result.output[-3000:], result.exception)
    return result.stdout, (out / "report.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def cli_demo(tmp_path_factory: pytest.TempPathFactory) -> CliDemo:
    """The release demo runs once for the module (it trains a DP-SGD job): the CLI run
    is checked for its wiring, and the DemoResults it computed for their values."""
    import fedldp.demo_release as demo_release

    seen: list[DemoResults] = []
    real = demo_release.run_release_demo

    def recording(out: Path, seed: int | None) -> DemoResults:
        seen.append(real(out, seed))
        return seen[-1]

    out = tmp_path_factory.mktemp("demo") / "with"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(demo_release, "run_release_demo", recording)
        # The collector on one process: its count is not what this module tests.
        patch.setenv("FEDLDP_COLLECTOR_PROCESSES", "1")
        stdout, page = _demo(out, "--release-service")
    (results,) = seen
    return CliDemo(out, stdout, page, results)


def test_release_demo_returns_verified_count_and_mean(cli_demo: CliDemo) -> None:
    demo = cli_demo.results
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


def test_demo_flag_adds_the_section_and_the_default_demo_has_none(
    cli_demo: CliDemo, plain_demo: DemoRun
) -> None:
    assert "receipt verified" in cli_demo.stdout
    with_service = cli_demo.html
    assert "Central releases through the release service" in with_service
    assert (cli_demo.out / "release-service" / "mean.receipt.json").exists()
    assert "A DP-SGD training job through the release service" in with_service
    if have_train_extra():
        assert "<th>receipt verified</th><td>yes</td>" in with_service
        assert "<th>status</th><td>SUCCEEDED</td>" in with_service
    else:
        assert html.escape(TRAIN_SKIPPED) in with_service
    # The session's shared `fedldp demo` (demo_testkit), without the flag.
    assert plain_demo.returncode == 0, plain_demo.stderr[-3000:]
    plain = (plain_demo.out / "report.html").read_text(encoding="utf-8")
    assert "release service" not in plain and not (plain_demo.out / "release-service").exists()
    assert not any(path.startswith("release-service") for path in plain_demo.modes_at_exit)


def test_without_the_train_extra_the_job_is_skipped_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("fedldp.demo_release.have_train_extra", lambda: False)
    demo = run_release_demo(tmp_path, seed=3)
    assert demo.training == TRAIN_SKIPPED and all(r.verified for r in demo.releases)
    assert html.escape(TRAIN_SKIPPED) in release_html(demo)
    assert not (tmp_path / "release-service" / "jobs").exists()
