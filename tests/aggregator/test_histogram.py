"""Square Wave's distribution estimate (fedldp.aggregator.histogram) and its report.

Fixed seeds throughout (no α to state): EMS recovers known distributions within a
stated Wasserstein bound and a wrong transition matrix does not; the bootstrap
bands cover the true bucket frequencies at the stated rate where noise dominates
(ε = 4) and a bootstrap that overstates n does not; the bands are deterministic
given the seed; bad requests are refused; the report, the text table, the HTML
page and `fedldp report --format json` carry the histogram beside the mean.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from click.testing import CliRunner
from fedldp.aggregator import histogram as hist_module
from fedldp.aggregator.dashboard.pages import _histogram_section
from fedldp.aggregator.estimation import NumericReport, numeric_report
from fedldp.aggregator.histogram import (
    Histogram,
    ems,
    histogram,
    point_mass_wasserstein,
    smoothing_matrix,
    wasserstein_to_sample,
)
from fedldp.aggregator.render import render_html, render_table
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.client.mechanisms import CountStatistic, create
from fedldp.client.mechanisms.square_wave import SquareWave
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import Ledger

from fedldp.cli_report import report as report_cmd
from tests.aggregator.test_reports import _folders, outputs_for

N = 100_000
BUCKETS = 16


def population(kind: str, seed: int) -> npt.NDArray[np.float64]:
    """N values on [0, 1]: Beta(2, 5), or two normal bumps at 0.3 and 0.7 (sd 0.08)."""
    rng = np.random.default_rng(seed)
    if kind == "beta":
        return np.asarray(rng.beta(2.0, 5.0, size=N), dtype=np.float64)
    left = rng.random(N) < 0.5
    values = np.where(left, rng.normal(0.3, 0.08, N), rng.normal(0.7, 0.08, N))
    return np.asarray(np.clip(values, 0.0, 1.0), dtype=np.float64)


def collect(mech: SquareWave, values: npt.NDArray[np.float64], seed: int) -> CountStatistic:
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(values, np.random.default_rng(seed)))
    return statistic


def sw(epsilon: str, params: dict[str, str] | None = None) -> SquareWave:
    mech = create("sw", Decimal(epsilon), (Decimal(0), Decimal(1)), params or {})
    assert isinstance(mech, SquareWave)
    return mech


def truth_histogram(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    counts = np.histogram(values, bins=BUCKETS, range=(0.0, 1.0))[0]
    return np.asarray(counts / values.shape[0], dtype=np.float64)


# --- EMS recovers a known distribution --------------------------------------------------

#: W1 bounds on [0, 1] at n = 100,000, fixed seeds (measured: 0.003 at ε = 2 on the
#: beta, 0.0035 at ε = 4 on the bimodal); a mean-only summary (a point mass at the
#: true mean) is at 0.13 and 0.2.
RECOVERY = [("beta", "2", 0.008), ("bimodal", "4", 0.008)]


def fitted_w1(mech: SquareWave, statistic: CountStatistic, values: Any, matrix: Any) -> float:
    x, _ = ems(np.asarray(statistic.counts, dtype=np.float64), matrix)
    edges = np.linspace(0.0, 1.0, matrix.shape[1] + 1)
    return wasserstein_to_sample(edges, x, values)


@pytest.mark.parametrize(("kind", "epsilon", "bound"), RECOVERY)
def test_ems_recovers_a_known_distribution(kind: str, epsilon: str, bound: float) -> None:
    values = population(kind, seed=1)
    mech = sw(epsilon)
    statistic = collect(mech, values, seed=2)
    assert fitted_w1(mech, statistic, values, mech.transition_matrix(128)) < bound
    assert point_mass_wasserstein(float(values.mean()), values) > 10 * bound


def test_recovery_check_fails_with_the_wrong_transition_matrix() -> None:
    """Broken: the reports are reconstructed with the law of ε = 4 on the same grid
    (a mechanism mismatch); the same bound is missed."""
    values = population("beta", seed=1)
    mech = sw("1", {"levels": "256", "cells": "400"})
    wrong = sw("4", {"levels": "256", "cells": "400"})
    statistic = collect(mech, values, seed=2)
    assert fitted_w1(mech, statistic, values, mech.transition_matrix(128)) < 0.012
    assert fitted_w1(mech, statistic, values, wrong.transition_matrix(128)) > 0.012


def test_ems_returns_distributions_and_freezes_converged_columns() -> None:
    mech = sw("2", {"levels": "32"})
    matrix = mech.transition_matrix(8)
    statistic = collect(mech, population("beta", seed=3)[:5000], seed=4)
    counts = np.asarray(statistic.counts, dtype=np.float64)
    alone, _ = ems(counts, matrix)
    both, _ = ems(np.column_stack([counts, counts[::-1]]), matrix)
    assert np.all(alone >= 0) and alone.sum() == pytest.approx(1.0)
    assert np.allclose(both[:, 0], alone)
    assert np.allclose(smoothing_matrix(5).sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="cells"):
        ems(counts[:-1], matrix)
    with pytest.raises(ValueError, match="zero reports"):
        ems(np.zeros_like(counts), matrix)
    with pytest.raises(ValueError, match="cells"):
        ems(counts[:-1], mech.transition(8))


@pytest.mark.parametrize(("epsilon", "levels"), [("1", "256"), ("4", "256"), ("2", "64")])
def test_ems_on_the_factored_law_is_ems_on_the_dense_matrix(epsilon: str, levels: str) -> None:
    """What `bootstrap` iterates with (`SquareWave.transition`) gives the dense matrix's
    EMS: the same iterations and the same distributions to 1e-12, one column or many."""
    mech = sw(epsilon, {"levels": levels})
    counts = np.asarray(collect(mech, population("bimodal", seed=3)[:5000], seed=4).counts)
    columns = np.random.default_rng(5).multinomial(5000, counts / counts.sum(), size=3).T
    for c in (counts, columns):
        dense, dense_iterations = ems(c, mech.transition_matrix(256))
        banded, banded_iterations = ems(c, mech.transition(256))
        assert banded_iterations == dense_iterations
        np.testing.assert_allclose(banded, dense, rtol=1e-12, atol=1e-15)


# --- bands: stated coverage on fixed seeds, and the check catches narrow bands --------


#: Nominal 90% pointwise bands; over 16 buckets x 4 runs at ε = 4, n = 100,000 at
#: least 80% of (bucket, run) pairs must be covered (measured: 0.92). The band of the
#: reconstruction's mean must cover the true mean in every run.
CONFIDENCE = 0.9
MIN_COVERAGE = 0.8


def coverage(epsilon: str) -> tuple[float, bool]:
    covered, means = [], True
    for kind in ("beta", "bimodal"):
        values = population(kind, seed=5)
        truth = truth_histogram(values)
        for run in range(2):
            mech = sw(epsilon)
            h = histogram(
                mech,
                collect(mech, values, seed=10 + run),
                buckets=BUCKETS,
                confidence=CONFIDENCE,
                replicates=100,
                seed=run,
            )
            low, high = np.array(h.band_low), np.array(h.band_high)
            covered.extend(((low <= truth) & (truth <= high)).tolist())
            means = means and h.mean_low <= float(values.mean()) <= h.mean_high
    return float(np.mean(covered)), means


def test_bands_cover_the_truth_at_the_stated_rate() -> None:
    rate, means = coverage("4")
    assert rate >= MIN_COVERAGE, rate
    assert means


def test_coverage_check_fails_when_the_bootstrap_overstates_n(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: replicates drawn with 16 n reports and scaled back (bands 4x too narrow)."""
    honest = hist_module.replicate_counts

    def overstated(n: int, p: Any, replicates: int, rng: np.random.Generator) -> Any:
        return honest(16 * n, p, replicates, rng) / 16

    monkeypatch.setattr(hist_module, "replicate_counts", overstated)
    rate, _ = coverage("4")
    assert rate < MIN_COVERAGE, rate


#: ε = 2, where the smoothing matters (a 64-level grid keeps the test short): over 16
#: buckets x 2 shapes x 2 runs the shipped band (the union of the basic and
#: percentile intervals) covers at least LOW_EPS_COVERAGE of (bucket, run) pairs
#: (measured: 0.91); the basic interval alone (the band before issue 33, kept here as
#: the broken variant) covers 0.75 from the same replicates. Fixed seeds.
LOW_EPS_COVERAGE = 0.85


def _basic_band(fitted: Any, boot: Any, confidence: float) -> tuple[Any, Any]:
    alpha = 1.0 - confidence
    q_low, q_high = np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=1)
    return 2 * fitted - q_high, 2 * fitted - q_low


@pytest.mark.slow  # four bootstraps of 24 EMS refits at n = 100,000 (about 0.6 CPU-s)
def test_at_low_epsilon_the_band_covers_where_the_basic_band_does_not() -> None:
    shipped: list[bool] = []
    basic: list[bool] = []
    for run in (10, 11):
        for kind in ("beta", "bimodal"):
            values = population(kind, seed=5)
            truth = truth_histogram(values)
            mech = sw("2", {"levels": "64"})
            fit = hist_module.bootstrap(
                mech, collect(mech, values, seed=run), buckets=BUCKETS, replicates=24, seed=0
            )
            for band, out in ((hist_module.bootstrap_band, shipped), (_basic_band, basic)):
                low, high = band(fit.fitted, fit.replicates, CONFIDENCE)
                out.extend(((low <= truth) & (truth <= high)).tolist())
    assert float(np.mean(shipped)) >= LOW_EPS_COVERAGE, np.mean(shipped)
    assert float(np.mean(basic)) < LOW_EPS_COVERAGE, np.mean(basic)


def test_bands_are_deterministic_given_the_seed() -> None:
    mech = sw("2", {"levels": "64"})
    statistic = collect(mech, population("beta", seed=6)[:20000], seed=7)
    first = histogram(mech, statistic, buckets=8, replicates=20, seed=3)
    again = histogram(mech, statistic, buckets=8, replicates=20, seed=3)
    other = histogram(mech, statistic, buckets=8, replicates=20, seed=4)
    assert first == again
    assert other.frequencies == first.frequencies and other.band_low != first.band_low
    assert sum(first.frequencies) == pytest.approx(1.0)
    bands = zip(first.band_low, first.band_high, strict=True)
    assert all(0.0 <= lo <= hi <= 1.0 for lo, hi in bands)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"buckets": 0}, "buckets"),
        ({"buckets": 5000}, "buckets"),
        ({"replicates": 0}, "replicates"),
        ({"confidence": 1.0}, "confidence"),
        ({"seed": -1}, "seed"),
    ],
)
def test_bad_requests_are_refused(kwargs: dict[str, Any], message: str) -> None:
    mech = sw("1", {"levels": "16"})
    statistic = collect(mech, population("beta", seed=8)[:100], seed=9)
    with pytest.raises(ValueError, match=message):
        histogram(mech, statistic, **kwargs)


def test_a_foreign_statistic_is_refused() -> None:
    mech = sw("1", {"levels": "16"})
    with pytest.raises(ValueError, match="counts"):
        histogram(mech, CountStatistic([1, 2, 3], n=6))
    with pytest.raises(ValueError, match="zero reports"):
        histogram(mech, mech.new_statistic())


# --- the report carries the histogram beside the mean ------------------------------------


def small_report() -> NumericReport:
    mech = create("sw", Decimal(2), (Decimal(10), Decimal(50)), {"levels": "32"})
    values = 10 + 40 * population("bimodal", seed=11)[:5000]
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(values, np.random.default_rng(12)))
    return numeric_report(mech, statistic, value_range=(Decimal(10), Decimal(50)))


def test_numeric_report_has_the_histogram_beside_the_unbiased_mean(tmp_path: Path) -> None:
    report = small_report()
    h = report.histogram
    assert isinstance(h, Histogram) and h.buckets == 32 and h.edges[0] == 10 and h.edges[-1] == 50
    assert 10 <= report.ci_low <= report.mean <= report.ci_high <= 50
    doc = json.loads(report.to_json())
    assert doc["histogram"]["method"] == "ems" and len(doc["histogram"]["frequencies"]) == 32
    assert doc["histogram"]["band_method"] == "parametric-bootstrap-basic-percentile-union"
    text = render_table(report)
    assert "distribution (EMS over 32 buckets)" in text and "[10, 11.25)" in text
    page = render_html(report, tmp_path / "r.html").read_text()
    assert "<h2>Distribution</h2>" in page and "bootstrap band" in page
    mean_only = numeric_report(
        create("piecewise", Decimal(2), (Decimal(0), Decimal(1))),
        collect_moments(),
    )
    assert mean_only.histogram is None and mean_only.to_dict()["histogram"] is None
    assert "distribution" not in render_table(mean_only)


def collect_moments() -> Any:
    mech = create("piecewise", Decimal(2), (Decimal(0), Decimal(1)))
    statistic = mech.new_statistic()
    values = population("beta", seed=13)[:1000]
    mech.accumulate_batch(statistic, mech.perturb_batch(values, np.random.default_rng(14)))
    return statistic


def test_cli_report_prints_the_histogram_for_an_sw_policy(
    authority: Any,
    make_policy: Callable[..., VerifiedPolicy],
    submit: Callable[..., None],
    now: int,
    ledger_factory: Callable[..., Ledger],
    tmp_path: Path,
) -> None:
    # ε = 4: EMS converges in fewer steps than at 2; the grid is the same default J = 256.
    policy = make_policy("dist", labels=None, lo="0", hi="100", mechanism="sw", epsilon="4")
    assert policy.message.mechanism.params["levels"] == "256"  # written at authoring
    ledger = ledger_factory("dist")
    submit(ledger, policy, outputs_for(policy, 600, seed=15))
    direct = report_from_ledgers([("l", ledger)], policy)
    assert isinstance(direct, NumericReport) and direct.histogram is not None
    url = f"sqlite:///{tmp_path / 'dist.db'}"
    trust, policies = _folders(authority, policy, tmp_path)
    base = ["--policy", "dist", "--ledger", url, "--policies", str(policies)]
    base += ["--trust", str(trust), "--at", str(now)]
    runner = CliRunner()
    table = runner.invoke(report_cmd, base)
    assert table.exit_code == 0, table.output
    assert "mean " in table.output and "distribution (EMS over 32 buckets)" in table.output
    doc = json.loads(runner.invoke(report_cmd, [*base, "--format", "json"]).output)
    assert doc["histogram"]["frequencies"] == list(direct.histogram.frequencies)


def test_dashboard_numeric_section_shows_the_histogram_with_bands() -> None:
    report = small_report()
    assert report.histogram is not None
    section = _histogram_section(report)
    assert section.startswith('<h3 id="distribution">Distribution</h3>')
    assert section.count('<rect class="bar"') == 32
    assert "parametric-bootstrap band, pointwise (100 replicates, seed 0)" in section
    mean_only = numeric_report(
        create("piecewise", Decimal(2), (Decimal(0), Decimal(1))), collect_moments()
    )
    assert _histogram_section(mean_only) == ""
