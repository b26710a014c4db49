"""Exact discrete samplers and noise calibration: distributions, golden numbers, boundaries.

Every distribution test is a chi-square goodness-of-fit test against the exact
probability mass function with false-failure rate ALPHA = 1e-6 (fixed seeds
make each run deterministic); each is shown to fail on a deliberately wrong scale.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction

import pytest
from fedldp.aggregator.central.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_sigma,
    calibrate_discrete_gaussian,
    classic_gaussian_sigma,
    discrete_gaussian_delta,
)
from fedldp.aggregator.central.noise import bernoulli_exp, discrete_gaussian, discrete_laplace
from fedldp.aggregator.central.releases import exponential_choice, plan_noise
from scipy import stats

ALPHA = 1e-6
DRAWS = 20_000


def chi_square_fits(samples: list[int], pmf: Callable[[int], float]) -> bool:
    """Chi-square test of `samples` against `pmf` over integers; cells with expected >= 5."""
    counts = Counter(samples)
    n = len(samples)
    support = range(min(counts) - 1, max(counts) + 2)
    lo = min(x for x in support if n * pmf(x) >= 5) if any(n * pmf(x) >= 5 for x in support) else 0
    hi = max(x for x in support if n * pmf(x) >= 5)
    observed = [sum(c for x, c in counts.items() if x < lo)]
    expected = [n * sum(pmf(x) for x in range(lo - 10_000, lo))]
    for x in range(lo, hi + 1):
        observed.append(counts.get(x, 0))
        expected.append(n * pmf(x))
    observed.append(sum(c for x, c in counts.items() if x > hi))
    expected.append(n - sum(expected))
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True) if e > 0)
    return bool(stats.chi2.sf(stat, len(observed) - 1) > ALPHA)


def laplace_pmf(scale: float) -> Callable[[int], float]:
    r = math.exp(-1.0 / scale)
    return lambda x: (1 - r) / (1 + r) * r ** abs(x)


def gaussian_pmf(sigma2: float) -> Callable[[int], float]:
    bound = int(40 * math.sqrt(sigma2)) + 1
    norm = sum(math.exp(-(x * x) / (2 * sigma2)) for x in range(-bound, bound + 1))
    return lambda x: math.exp(-(x * x) / (2 * sigma2)) / norm


@pytest.mark.parametrize("scale", [Fraction(5, 2), Fraction(7)])
def test_discrete_laplace_has_the_exact_distribution(scale: Fraction) -> None:
    rng = random.Random(1)
    samples = [discrete_laplace(scale, rng) for _ in range(DRAWS)]
    assert chi_square_fits(samples, laplace_pmf(float(scale)))
    assert not chi_square_fits(samples, laplace_pmf(float(scale) * 1.15))  # a broken scale fails


#: Draws of the discrete Gaussian tests: against the 1.3x variance, the chi-square's
#: noncentrality is >= 277 for both σ² (critical values <= 101 at ALPHA), power > 1 - 1e-9.
GAUSSIAN_DRAWS = 10_000


@pytest.mark.parametrize("sigma2", [Fraction(2, 3), Fraction(100, 3)])
def test_discrete_gaussian_has_the_exact_distribution(sigma2: Fraction) -> None:
    rng = random.Random(2)
    samples = [discrete_gaussian(sigma2, rng) for _ in range(GAUSSIAN_DRAWS)]
    assert chi_square_fits(samples, gaussian_pmf(float(sigma2)))
    assert not chi_square_fits(samples, gaussian_pmf(float(sigma2) * 1.3))


@pytest.mark.parametrize("gamma", [Fraction(1, 3), Fraction(5, 2)])
def test_bernoulli_exp_is_exact(gamma: Fraction) -> None:
    rng = random.Random(3)
    hits = sum(bernoulli_exp(gamma, rng) for _ in range(DRAWS))
    p = math.exp(-float(gamma))
    assert stats.binomtest(hits, DRAWS, p).pvalue > ALPHA
    assert (
        stats.binomtest(hits, DRAWS, math.exp(-1.1 * float(gamma))).pvalue < ALPHA
    )  # γ off by 10 %


def test_samplers_refuse_bad_parameters() -> None:
    with pytest.raises(ValueError):
        discrete_laplace(Fraction(0))
    with pytest.raises(ValueError):
        discrete_gaussian(Fraction(-1))
    with pytest.raises(ValueError):
        bernoulli_exp(Fraction(-1), random.Random(0))


def test_sum_release_noise_has_the_calibrated_scale() -> None:
    """The noise a sum release adds (ε = 1, bounds [0, 10], granularity 0.5 → Δ = 20
    lattice units) is discrete Laplace of scale Δ/ε = 20 on the 0.5-lattice."""
    plan = plan_noise(
        "laplace",
        epsilon=Decimal(1),
        delta=Decimal(0),
        sensitivity=Decimal(10),
        granularity=Decimal("0.5"),
    )
    assert plan.lattice_sensitivity == 20 and plan.lattice_scale == 20
    rng = random.Random(4)
    true = Decimal("1234.56")
    outputs = [plan.noised(true, rng) for _ in range(DRAWS)]
    assert all(o % Decimal("0.5") == 0 for o in outputs)  # always on the lattice
    centre = 2469  # round_half_up(1234.56 / 0.5)
    lattice_noise = [int(o / Decimal("0.5")) - centre for o in outputs]
    assert chi_square_fits(lattice_noise, laplace_pmf(20.0))
    assert not chi_square_fits(lattice_noise, laplace_pmf(25.0))


# --- calibration ---


def test_analytic_gaussian_golden_and_tight() -> None:
    """Balle and Wang 2018: ε = 1, δ = 1e-5, Δ = 1 gives σ ≈ 3.73 (classic: 4.84)."""
    sigma = analytic_gaussian_sigma(1.0, 1.0, 1e-5)
    assert sigma == pytest.approx(3.7306, abs=1e-3)
    assert classic_gaussian_sigma(1.0, 0.99, 1e-5) == pytest.approx(4.8938, abs=1e-3)
    # Tight: holds at σ, fails just below it.
    assert analytic_gaussian_delta(sigma, 1.0, 1.0) <= 1e-5
    assert analytic_gaussian_delta(sigma * (1 - 1e-6), 1.0, 1.0) > 1e-5


def test_analytic_gaussian_agrees_with_dp_accounting() -> None:
    """Independent check: dp-accounting's Gaussian privacy loss gives the same δ(ε)."""
    from dp_accounting.pld import privacy_loss_mechanism

    for eps, delta in [(0.5, 1e-6), (2.0, 1e-8), (8.0, 1e-5)]:
        sigma = analytic_gaussian_sigma(2.0, eps, delta)
        loss = privacy_loss_mechanism.GaussianPrivacyLoss(sigma, sensitivity=2.0)
        assert loss.get_delta_for_epsilon(eps) == pytest.approx(delta, rel=1e-6)


def test_classic_gaussian_is_refused_at_epsilon_one_or_more() -> None:
    with pytest.raises(ValueError, match="analytic"):
        classic_gaussian_sigma(1.0, 1.0, 1e-5)
    # Where it applies it is never tighter than the analytic one.
    for eps in (0.1, 0.5, 0.9):
        assert classic_gaussian_sigma(1.0, eps, 1e-6) >= analytic_gaussian_sigma(1.0, eps, 1e-6)


@pytest.mark.parametrize(
    ("sens", "eps", "delta"), [(1, 1.0, 1e-5), (20, 0.3, 1e-7), (3, 4.0, 1e-9)]
)
def test_discrete_gaussian_calibration_meets_delta(sens: int, eps: float, delta: float) -> None:
    cal = calibrate_discrete_gaussian(sens, eps, delta)
    assert cal.delta_achieved <= delta
    assert discrete_gaussian_delta(cal.sigma, sens, eps) <= delta
    # ... and is tight: 1 % less noise breaks the guarantee.
    assert discrete_gaussian_delta(cal.sigma * 0.99, sens, eps) > delta


def _noisy_max_probabilities(utilities: list[int], lam: float, terms: int = 400) -> list[float]:
    """P[i chosen] by report-noisy-max with one-sided geometric noise P[Z ≥ z] = e^{−λz} and a
    uniform priority order breaking ties (every order enumerated; series past 1e-15)."""
    import itertools

    q = math.exp(-lam)
    k = len(utilities)

    def ge(t: int) -> float:  # P[Z >= t]
        return 1.0 if t <= 0 else q**t

    out = [0.0] * k
    orders = list(itertools.permutations(range(k)))
    for order in orders:
        rank = {c: r for r, c in enumerate(order)}
        for i in range(k):
            for z in range(terms):
                w = utilities[i] + z
                p = (1 - q) * q**z
                for j in range(k):
                    if j != i:  # j stays below w, or ties and comes later in the order
                        p *= 1 - ge(w - utilities[j] + (1 if rank[j] > rank[i] else 0))
                out[i] += p / len(orders)
    return out


def test_exponential_mechanism_has_the_exact_distribution() -> None:
    """Report-noisy-max with one-sided geometric noise (λ = ε/2) for ε = 1, u = (0, 2, 5, 5):
    the exact distribution (enumerated) fits; chi-square at ALPHA. 4,000 draws: against
    λ = ε the noncentrality is 1,797 (critical value 30.7, 3 df), power > 1 - 1e-12."""
    draws = 4_000
    utilities = [0, 2, 5, 5]
    probs = _noisy_max_probabilities(utilities, 0.5)
    assert abs(sum(probs) - 1) < 1e-9
    rng = random.Random(5)
    counts = Counter(exponential_choice(utilities, Decimal(1), rng) for _ in range(draws))
    observed = [counts.get(i, 0) for i in range(4)]

    def fits(p: list[float]) -> bool:
        return bool(stats.chisquare(observed, [draws * x for x in p]).pvalue > ALPHA)

    assert fits(probs)
    assert not fits(_noisy_max_probabilities(utilities, 1.0))  # λ = ε, without the factor 1/2
