"""Estimates, confidence intervals, consistency and heavy hitters (no ledger)."""

from __future__ import annotations

import json
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fedldp.aggregator.consistency import (
    Consistency,
    base_cut,
    clip_and_normalize,
    norm_sub,
    project_simplex,
)
from fedldp.aggregator.estimation import (
    FREQUENCY_SCHEMA,
    frequency_report,
    frequency_report_from_estimate,
    heavy_hitters,
    numeric_report,
    z_value,
)
from fedldp.aggregator.render import render_html, render_table
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.base import Estimate
from fedldp.client.mechanisms.grr import GRR
from scipy import stats

# False-failure rate of each statistical test in this file: at most ALPHA (fixed
# seeds make them deterministic anyway; ALPHA sets how wide the bands are).
ALPHA = 1e-6


def zipf(k: int, s: float = 1.1) -> npt.NDArray[np.float64]:
    w = np.asarray(1.0 / np.arange(1, k + 1) ** s, dtype=np.float64)
    return np.asarray(w / w.sum(), dtype=np.float64)


def fixed_data(truth: np.ndarray, n: int) -> np.ndarray:
    """A fixed dataset of n users whose frequencies are exactly round(n * truth) / n.

    The mechanisms' exact variance (Wang et al. 2017) is over the randomization
    of a fixed dataset, so coverage is checked against that dataset's frequencies.
    """
    scaled = truth * n
    counts = np.floor(scaled).astype(np.int64)
    # Largest remainders get the leftover users, so every count is within 1 of n·truth.
    counts[np.argsort(counts - scaled)[: n - counts.sum()]] += 1
    return np.repeat(np.arange(truth.size), counts)


def collect(mechanism: Any, values: np.ndarray, rng: np.random.Generator) -> Any:
    """One simulated collection: every user randomizes once; the statistic."""
    stat = mechanism.new_statistic()
    mechanism.accumulate_batch(stat, mechanism.perturb_batch(values, rng))
    return stat


class HalfVarianceGRR(GRR):
    """A deliberately broken estimator: it reports half the true variance."""

    def estimate(self, statistic: Any) -> Estimate:
        e = super().estimate(statistic)
        return Estimate(n=e.n, values=e.values, variances=e.variances / 2)


COVERAGE_TRUTH = np.array([0.4, 0.2, 0.15, 0.1, 0.08, 0.04, 0.02, 0.01])
COVERAGE_N = 2000
COVERAGE_REPS = 600


def coverage(mechanism: Any, *, simultaneous: bool, seed: int) -> np.ndarray:
    """Per repetition and label: whether the 95% CI covered the dataset's frequency."""
    values = fixed_data(COVERAGE_TRUTH, COVERAGE_N)
    truth = np.bincount(values, minlength=COVERAGE_TRUTH.size) / COVERAGE_N
    rng = np.random.default_rng(seed)
    covered = np.zeros((COVERAGE_REPS, truth.size), dtype=bool)
    for r in range(COVERAGE_REPS):
        rep = frequency_report(
            mechanism, collect(mechanism, values, rng), None, simultaneous=simultaneous
        )
        covered[r] = [e.ci_low <= t <= e.ci_high for e, t in zip(rep.estimates, truth, strict=True)]
    return covered


def nominal_coverage_holds(mechanism: Any, seed: int) -> bool:
    """Binomial test per label, Bonferroni over the 8 labels: total false failure <= ALPHA.

    Each label's count of covering intervals over independent collections is
    Binomial(reps, 0.95) if the intervals are right (normal approximation of
    the estimator; at n = 2000 its error is far inside the band).
    """
    covered = coverage(mechanism, simultaneous=False, seed=seed)
    low, high = binomial_band(COVERAGE_REPS, 0.95, ALPHA / covered.shape[1])
    hits = covered.sum(axis=0)
    return bool(np.all((hits >= low) & (hits <= high)))


def binomial_band(trials: int, p: float, alpha: float) -> tuple[int, int]:
    """Acceptance band of Binomial(trials, p), probability outside it <= alpha."""
    return int(stats.binom.ppf(alpha / 2, trials, p)), int(stats.binom.isf(alpha / 2, trials, p))


@pytest.mark.parametrize(
    ("wire_id", "params"),
    [("grr", {}), ("oue", {}), ("sue", {}), ("olh", {}), ("hr", {}), ("ss", {})],
)
def test_confidence_intervals_cover_at_nominal_rate(wire_id: str, params: dict[str, str]) -> None:
    mechanism = create(wire_id, Decimal("1"), COVERAGE_TRUTH.size, params)
    assert nominal_coverage_holds(mechanism, seed=11)


def test_coverage_test_fails_on_a_broken_variance() -> None:
    assert not nominal_coverage_holds(HalfVarianceGRR(Decimal("1"), COVERAGE_TRUTH.size), seed=11)


def test_simultaneous_intervals_cover_jointly() -> None:
    """Bonferroni: all 8 intervals cover at once in >= 95% of collections.

    One-sided binomial test at ALPHA against p = 0.95 (Bonferroni is conservative,
    so the true joint rate is >= 0.95). Per-label intervals must fail this.
    """
    mechanism = GRR(Decimal("1"), COVERAGE_TRUTH.size)
    low = int(stats.binom.ppf(ALPHA, COVERAGE_REPS, 0.95))
    joint = coverage(mechanism, simultaneous=True, seed=5).all(axis=1).sum()
    assert joint >= low
    per_label = coverage(mechanism, simultaneous=False, seed=5).all(axis=1).sum()
    assert per_label < low  # 0.95^8 ≈ 0.66 joint coverage without the correction


def test_bonferroni_widens_by_the_right_quantile() -> None:
    assert z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert z_value(0.95, tests=10) == pytest.approx(stats.norm.isf(0.05 / 20), rel=1e-9)
    mechanism = GRR(Decimal("2"), 10)
    stat = collect(mechanism, fixed_data(zipf(10), 1000), np.random.default_rng(0))
    a = frequency_report(mechanism, stat, None)
    b = frequency_report(mechanism, stat, None, simultaneous=True)
    for x, y in zip(a.estimates, b.estimates, strict=True):
        assert x.raw_estimate == y.raw_estimate and x.std_error == y.std_error
        assert (y.ci_high - y.ci_low) >= (x.ci_high - x.ci_low)


# --- consistency ---


def test_norm_sub_keeps_the_head_at_large_k_where_clip_and_normalize_collapses() -> None:
    """k = 4096, Zipf(1.1) (top value ≈ 0.16), GRR at ε = 4, n = 1 000 000, fixed seed.

    multi-freq-ldpy's default (clip negatives, divide by the sum) divides every
    value by Σ max(f̂, 0), which the noise of ~4000 near-zero values inflates to
    several units: the head collapses. Norm-Sub subtracts one common δ instead.
    """
    k, n = 4096, 1_000_000
    truth = zipf(k)
    assert 0.15 < truth[0] < 0.17
    values = fixed_data(truth, n)
    exact = np.bincount(values, minlength=k) / n
    mechanism = GRR(Decimal("4"), k)
    stat = collect(mechanism, values, np.random.default_rng(2026))
    raw = frequency_report(mechanism, stat, None)
    consistent = frequency_report(mechanism, stat, None, consistency="norm-sub")
    naive = clip_and_normalize(np.array([e.raw_estimate for e in raw.estimates]))
    head = consistent.estimates[0]
    # Within 5 standard errors of the raw estimate's noise: Norm-Sub shifts it by δ ≈ 0.001.
    assert abs(head.estimate - exact[0]) < 5 * head.std_error, head
    assert abs(head.estimate - head.raw_estimate) < 0.005
    assert naive[0] < exact[0] / 2, naive[0]
    # Consistent: non-negative, sums to 1; and closer to the truth overall than raw.
    est = np.array([e.estimate for e in consistent.estimates])
    raw_v = np.array([e.raw_estimate for e in raw.estimates])
    assert est.min() >= 0 and est.sum() == pytest.approx(1.0, abs=1e-9)
    assert np.sum((est - exact) ** 2) < np.sum((raw_v - exact) ** 2) / 4
    # The consistent estimate ranks the true top three first.
    assert set(np.argsort(est)[::-1][:3]) == {0, 1, 2}


@pytest.mark.parametrize("method", ["norm-sub", "project", "base-cut"])
def test_consistency_reduces_error_on_skewed_data(method: str) -> None:
    """Mean squared error over 20 collections (fixed seed), k = 64, Zipf(1.1), OUE ε = 1."""
    k, n = 64, 5000
    values = fixed_data(zipf(k), n)
    exact = np.bincount(values, minlength=k) / n
    mechanism = create("oue", Decimal("1"), k)
    rng = np.random.default_rng(7)
    raw_err = post_err = 0.0
    for _ in range(20):
        stat = collect(mechanism, values, rng)
        rep = frequency_report(mechanism, stat, None, consistency=method)
        raw_err += sum((e.raw_estimate - t) ** 2 for e, t in zip(rep.estimates, exact, strict=True))
        post_err += sum((e.estimate - t) ** 2 for e, t in zip(rep.estimates, exact, strict=True))
    assert post_err < 0.8 * raw_err


def test_consistency_methods_on_known_vectors() -> None:
    f = np.array([0.5, 0.3, -0.1, 0.4, -0.05])
    ns = norm_sub(f)
    # positives 0.5, 0.3, 0.4 sum to 1.2: subtract 0.2/3 from each.
    assert ns == pytest.approx([0.5 - 0.2 / 3, 0.3 - 0.2 / 3, 0, 0.4 - 0.2 / 3, 0])
    assert project_simplex(f) == pytest.approx(ns)  # equal when Σ positives >= 1
    low = np.array([0.3, 0.2, -0.01])  # positives sum to 0.5 < 1
    assert norm_sub(low) == pytest.approx([0.55, 0.45, 0.0])
    proj = project_simplex(low)
    assert proj.sum() == pytest.approx(1.0) and proj[2] > 0  # projection may lift negatives
    se = np.array([0.1, 0.1, 0.1, 0.1, 0.1])
    cut = base_cut(f, se)  # threshold Φ⁻¹(1 − 0.05/5)·0.1 ≈ 0.233
    assert cut == pytest.approx([0.5, 0.3, 0, 0.4, 0])
    assert clip_and_normalize(f) == pytest.approx([0.5 / 1.2, 0.3 / 1.2, 0, 0.4 / 1.2, 0])
    with pytest.raises(ValueError, match="unknown consistency"):
        Consistency.parse("clip")
    with pytest.raises(ValueError, match="finite"):
        norm_sub(np.array([0.1, np.nan]))


def test_raw_estimate_is_always_kept() -> None:
    mechanism = GRR(Decimal("1"), 16)
    stat = collect(mechanism, fixed_data(zipf(16), 800), np.random.default_rng(3))
    raw = frequency_report(mechanism, stat, None)
    for method in ("norm-sub", "base-cut", "project"):
        rep = frequency_report(mechanism, stat, None, consistency=method)
        assert [e.raw_estimate for e in rep.estimates] == [e.estimate for e in raw.estimates]
        assert [e.std_error for e in rep.estimates] == [e.std_error for e in raw.estimates]
        assert rep.consistency == method


# --- heavy hitters ---


def test_heavy_hitters_are_the_true_head_with_evidence() -> None:
    k, n = 1024, 50_000
    truth = zipf(k, 1.5)
    mechanism = create("olh", Decimal("2"), k)
    stat = collect(mechanism, fixed_data(truth, n), np.random.default_rng(9))
    rep = frequency_report(mechanism, stat, None)
    hh = heavy_hitters(rep, alpha=0.05)
    labels = [int(h.label) for h in hh]
    assert labels[:3] == [0, 1, 2]
    for h in hh:
        assert h.lower_bound > 0 and h.z_score > stats.norm.isf(0.05 / k) and h.p_value < 0.05
    # No false positives among values with true frequency far below the noise floor.
    floor = stats.norm.isf(0.05 / k) * rep.estimates[-1].std_error
    assert all(truth[i] > floor / 4 for i in labels)


def test_heavy_hitters_on_pure_noise_finds_nothing() -> None:
    mechanism = GRR(Decimal("1"), 64)
    values = np.arange(64).repeat(50)  # uniform: every value 1/64, far below the floor
    stat = collect(mechanism, values, np.random.default_rng(4))
    assert heavy_hitters(frequency_report(mechanism, stat, None), alpha=0.01) == []


# --- numeric ---


@pytest.mark.parametrize("wire_id", ["duchi", "piecewise", "hybrid", "sw"])
def test_numeric_mean_ci_covers(wire_id: str) -> None:
    """Per mechanism: 200 collections of a fixed dataset; binomial test at ALPHA."""
    lo, hi = Decimal("-5"), Decimal("15")
    mechanism = create(wire_id, Decimal("1"), (lo, hi))
    rng = np.random.default_rng(21)
    data = rng.uniform(-5, 15, size=3000) ** 1  # fixed dataset
    truth = float(data.mean())
    reps, hits = 200, 0
    for _ in range(reps):
        stat = mechanism.new_statistic()
        mechanism.accumulate_batch(stat, mechanism.perturb_batch(data, rng))
        rep = numeric_report(mechanism, stat, value_range=(lo, hi), histogram_options=None)
        hits += rep.ci_low <= truth <= rep.ci_high
        assert lo <= rep.ci_low <= rep.ci_high <= hi
    low, high = binomial_band(reps, 0.95, ALPHA)
    assert low <= hits <= high


# --- plain data, JSON schema, rendering ---


def _small_report() -> Any:
    mechanism = GRR(Decimal("2"), 4)
    stat = collect(
        mechanism, fixed_data(np.array([0.5, 0.3, 0.15, 0.05]), 2000), np.random.default_rng(1)
    )
    return frequency_report(
        mechanism, stat, ["red", "green", "blue", "other"], consistency="norm-sub"
    )


def test_report_json_follows_the_documented_schema() -> None:
    rep = _small_report()
    doc = json.loads(rep.to_json())
    assert doc["schema"] == FREQUENCY_SCHEMA and doc["kind"] == "frequency"
    assert set(doc) == {
        "schema",
        "kind",
        "mechanism",
        "epsilon",
        "n",
        "confidence",
        "simultaneous",
        "consistency",
        "context",
        "estimates",
    }
    assert doc["epsilon"] == "2" and doc["n"] == 2000 and doc["mechanism"] == "grr"
    assert set(doc["estimates"][0]) == {
        "label",
        "estimate",
        "raw_estimate",
        "std_error",
        "ci_low",
        "ci_high",
        "z_score",
    }
    assert rep.by_label("red").label == "red"
    rows = rep.to_csv().splitlines()
    assert rows[0].startswith("label,estimate") and len(rows) == 5


def test_to_dataframe_needs_pandas_or_works() -> None:
    rep = _small_report()
    try:
        import pandas  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(ModuleNotFoundError, match="pip install pandas"):
            rep.to_dataframe()
    else:
        assert list(rep.to_dataframe().index) == rep.labels


def test_table_and_html_render(tmp_path: Path) -> None:
    rep = _small_report()
    table = render_table(rep, truth={"red": 0.5, "green": 0.3, "blue": 0.15, "other": 0.05})
    assert "grr" in table and "2,000" in table and "truth" in table and "green" in table
    path = render_html(rep, tmp_path / "r.html", truth=[0.5, 0.3, 0.15, 0.05])
    text = path.read_text()
    assert "<svg" in text and "<img" not in text and "<script" not in text
    assert "src='http" not in text and "href=" not in text  # self-contained
    assert "norm-sub" in text
    assert "z = raw estimate ÷ standard error" in text  # the z column is explained


def test_bad_input_is_refused() -> None:
    e = Estimate(n=10, values=np.array([0.5, 0.5]), variances=np.array([0.1, -0.1]))
    with pytest.raises(ValueError, match="negative variance"):
        frequency_report_from_estimate(e, None, mechanism_id="grr", epsilon=Decimal(1))
    ok = replace(e, variances=np.array([0.1, 0.1]))
    with pytest.raises(ValueError, match="labels"):
        frequency_report_from_estimate(ok, ["a"], mechanism_id="grr", epsilon=Decimal(1))
    with pytest.raises(ValueError, match="confidence"):
        frequency_report_from_estimate(
            ok, None, mechanism_id="grr", epsilon=Decimal(1), confidence=1.5
        )
    with pytest.raises(ValueError, match="zero reports"):
        frequency_report_from_estimate(
            replace(ok, n=0), None, mechanism_id="grr", epsilon=Decimal(1)
        )


def test_numeric_distribution_via_bucketized_frequency_oracle() -> None:
    """Values on [0, 100) bucketized into 10 buckets, reported through OUE (fixed seed)."""
    from fedldp.aggregator.estimation import bucket_index, bucket_labels, distribution_report

    lo, hi, buckets = Decimal(0), Decimal(100), 10
    assert bucket_labels(lo, hi, 4) == ["[0, 25)", "[25, 50)", "[50, 75)", "[75, 100]"]
    assert [bucket_index(v, lo, hi, 4) for v in (-5, 0, 24.99, 25, 99.9, 100, 1e9)] == [
        0,
        0,
        0,
        1,
        3,
        3,
        3,
    ]
    rng = np.random.default_rng(8)
    data = 100 * rng.beta(2, 5, size=20_000)
    idx = np.array([bucket_index(float(v), lo, hi, buckets) for v in data])
    mechanism = create("oue", Decimal("2"), buckets)
    rep = distribution_report(mechanism, collect(mechanism, idx, rng), lo, hi)
    truth = np.bincount(idx, minlength=buckets) / idx.size
    est = np.array([e.estimate for e in rep.frequencies.estimates])
    assert est.sum() == pytest.approx(1.0) and est.min() >= 0  # Norm-Sub by default
    assert np.max(np.abs(est - truth)) < 0.03
    assert abs(rep.mean - float(data.mean())) < 100 / (2 * buckets) + 2.0


def test_numeric_report_renders_and_serializes(tmp_path: Path) -> None:
    mechanism = create("piecewise", Decimal("1"), (Decimal(0), Decimal(10)))
    rng = np.random.default_rng(3)
    stat = mechanism.new_statistic()
    mechanism.accumulate_batch(stat, mechanism.perturb_batch(rng.uniform(0, 10, 5000), rng))
    rep = numeric_report(mechanism, stat, value_range=(Decimal(0), Decimal(10)))
    doc = json.loads(rep.to_json())
    assert doc["schema"] == "fedldp.report.numeric/v1" and doc["range"] == [0.0, 10.0]
    assert "mean" in render_table(rep, truth=5.0) and "truth 5" in render_table(rep, truth=5.0)
    assert "Mean" in render_html(rep, tmp_path / "n.html").read_text()
    assert rep.to_csv().splitlines()[0] == "mean,std_error,ci_low,ci_high,n"
