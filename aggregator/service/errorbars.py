"""Error bars of released values: noise standard deviation and a confidence interval.

Computed from the ledger event of a release (its noise parameters and its
released output) only: post-processing of public values, no privacy cost, no
access to the true aggregate. The interval is for the value before noise
(the true aggregate rounded to the noise lattice γℤ, then widened by γ/2 for
the rounding), with coverage at least `confidence` over the noise:

* discrete Laplace of scale t (lattice units): P[X = x] ∝ exp(−|x|/t), so with
  q = e^{−1/t}: Var X = 2q/(1 − q)² and P[|X| ≥ m] = 2q^m/(1 + q) for m ≥ 1
  (CKS20, Section 5; a two-sided geometric law). The half-width is the
  smallest integer m with P[|X| > m] ≤ α.
* discrete Gaussian of parameter σ (lattice units): Var X ≤ σ² and
  P[|X| ≥ λ] ≤ 2 exp(−λ²/(2σ²)) (CKS20, Section 2.1: N_Z(0, σ²) is
  σ-subgaussian), so λ = σ √(2 ln(2/α)) is a valid (conservative) half-width
  and σ an upper bound on the standard deviation.
* mean = M + noisy S / noisy count, S the sum of values minus their centre M
  (releases.private_mean; M = 0 for a mean recorded as a plain sum): a
  delta-method approximation, with r = S / C, sd ≈ √(sd_S² + r² sd_C²) / C,
  interval M + r ± z sd clipped to the declared bounds (approximate: it
  ignores the count's noise in the denominator's nonlinearity beyond first
  order, and clipping).
* quantile (exponential mechanism over a grid): no additive noise, so the
  error bar is in ranks, not values: with probability ≥ `confidence` the
  released v has #{x < v} ≤ q·n + e and #{x > v} ≤ (1 − q)·n + e, with e the
  best grid candidate's rank error plus `records` = (T − 1)/D
  (fedldp.aggregator.central.quantile, from the event's ε, Δu, q and grid).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from fedldp.aggregator.central.quantile import quantile_fraction, rank_error

CONFIDENCE = Decimal("0.95")


@dataclass(frozen=True)
class ErrorBar:
    """Noise standard deviation and a confidence interval, in value units."""

    noise_stddev: float
    confidence: Decimal
    lower: Decimal
    upper: Decimal


def _laplace_halfwidth(t: Fraction, alpha: float) -> tuple[float, int]:
    """(sd, half-width m) of a discrete Laplace of scale t in lattice units."""
    x = float(1 / t)  # -ln q, exact to float precision even when q rounds to 1.0
    q = math.exp(-x)
    sd = math.sqrt(2.0 * q) / -math.expm1(-x)  # 1 - q without cancellation
    # P[|X| > m] = P[|X| >= m + 1] = 2 q^(m+1) / (1 + q) <= alpha
    m = math.ceil(math.log(alpha * (1.0 + q) / 2.0) / -x) - 1
    return sd, max(m, 0)


def _gaussian_halfwidth(sigma: float, alpha: float) -> tuple[float, int]:
    """(sd bound, half-width) of a discrete Gaussian of parameter σ in lattice units."""
    return sigma, math.ceil(sigma * math.sqrt(2.0 * math.log(2.0 / alpha)))


def additive(event: Mapping[str, object], value: Decimal) -> ErrorBar:
    """The error bar of one additive release (count, sum, a histogram bin)."""
    gamma = Decimal(str(event["granularity"]))
    alpha = float(1 - CONFIDENCE)
    if event.get("kind") == "discrete_laplace":
        sd, m = _laplace_halfwidth(Fraction(str(event["scale"])), alpha)
    else:
        sd, m = _gaussian_halfwidth(float(str(event["sigma"])), alpha)
    half = m * gamma + gamma / 2
    return ErrorBar(sd * float(gamma), CONFIDENCE, value - half, value + half)


@dataclass(frozen=True)
class RankErrorBar:
    """A quantile's rank error beyond the best grid candidate's, at `confidence`."""

    confidence: Decimal
    records: Decimal
    grid_step: Decimal


def quantile(event: Mapping[str, object]) -> RankErrorBar:
    """The rank error bar of a quantile release, from its ledger event (public values)."""
    q = quantile_fraction(Decimal(str(event["quantile"])))
    sensitivity = int(str(event["utility_sensitivity"]))
    records = rank_error(Decimal(str(event["epsilon"])), sensitivity, q, float(1 - CONFIDENCE))
    exact = Decimal(records.numerator) / Decimal(records.denominator)
    return RankErrorBar(CONFIDENCE, exact, Decimal(str(event["grid_step"])))


def mean(
    sum_bar: ErrorBar,
    count_bar: ErrorBar,
    noisy_sum: Decimal,
    noisy_count: Decimal,
    lower: Decimal,
    upper: Decimal,
    offset: Decimal = Decimal(0),
) -> ErrorBar:
    """The delta-method error bar of offset + noisy_sum / noisy_count (module
    docstring; `offset`: the centre M of a centred sum)."""
    if noisy_count < 1:
        spread = float(upper - lower) / math.sqrt(12.0)  # uniform over the bounds
        return ErrorBar(spread, CONFIDENCE, lower, upper)
    m = float(noisy_sum / noisy_count)
    sd = math.sqrt(sum_bar.noise_stddev**2 + (m * count_bar.noise_stddev) ** 2) / float(noisy_count)
    from scipy.stats import norm  # here: only a mean's error bar needs the slow import

    z = float(norm.ppf(1 - float(1 - CONFIDENCE) / 2))
    centre = min(max(offset + noisy_sum / noisy_count, lower), upper)
    half = Decimal(repr(z * sd))
    return ErrorBar(sd, CONFIDENCE, max(centre - half, lower), min(centre + half, upper))
