"""Noise calibration: from (ε, δ) and a sensitivity to a noise scale.

* Laplace: scale b = Δ/ε gives ε-DP (Dwork, McSherry, Nissim, Smith 2006;
  Dwork and Roth 2014, Theorem 3.6). The same ratio argument holds for the
  discrete Laplace on integers with integer Δ (CKS20, Section 5).
* Classic Gaussian: σ = Δ·√(2 ln(1.25/δ))/ε gives (ε, δ)-DP **only for ε < 1**
  (Dwork and Roth 2014, Theorem A.1). Kept for comparison and for users who
  must match it; it is never tighter than the analytic Gaussian.
* Analytic Gaussian (Balle and Wang, "Improving the Gaussian Mechanism for
  Differential Privacy", ICML 2018, Theorem 8): N(0, σ²) noise is (ε, δ)-DP iff
  Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ) ≤ δ. Valid for every ε > 0; we find
  the smallest such σ by bisection (their Algorithm 1 solves the same equation).
  This is the default.
* Discrete Gaussian (CKS20, Theorem 7): N_Z(0, σ²) with integer sensitivity Δ is
  (ε, δ)-DP for δ = P[Y > εσ²/Δ − Δ/2] − e^ε P[Y > εσ²/Δ + Δ/2], Y ~ N_Z(0, σ²).
  We calibrate σ with the analytic Gaussian, then evaluate this δ exactly
  (numerically, from the normalized probability mass function) and enlarge σ
  by 0.1 % steps until it holds; CKS20 Figure 2 shows the two curves nearly
  coincide, so one or two steps at most in practice.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

#: Above this lattice σ the exact δ evaluation (an array of ~40σ masses) gets too costly;
#: ask for a coarser granularity (for a count, γ = 1: only ε below ~2e-5).
MAX_LATTICE_SIGMA = 200_000.0


class GaussianCalibration(str, enum.Enum):
    """How σ is derived from (ε, δ, Δ)."""

    ANALYTIC = "analytic"
    CLASSIC = "classic"


def classic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """σ = Δ√(2 ln(1.25/δ))/ε, valid for 0 < ε < 1 only (Dwork and Roth 2014, Thm A.1)."""
    _check(sensitivity, epsilon, delta)
    if epsilon >= 1:
        raise ValueError(
            "the classic Gaussian bound holds only for epsilon < 1; use the analytic "
            "Gaussian (Balle and Wang 2018), which holds for every epsilon"
        )
    return sensitivity * math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def _check(sensitivity: float, epsilon: float, delta: float) -> None:
    if sensitivity <= 0 or epsilon <= 0:
        raise ValueError("sensitivity and epsilon must be positive")
    if not 0 < delta < 1:
        raise ValueError("delta must be in (0, 1) for a Gaussian mechanism")


def gaussian_profile_delta(half_mu: float, eps_over_mu: float, epsilon: float) -> float:
    """δ(ε) = Φ(h − r) − e^ε·Φ(−h − r) of Gaussian noise, with h = μ/2 and r = ε/μ for
    μ = Δ/σ: the privacy profile of the Gaussian mechanism (Balle and Wang 2018,
    Theorem 8) and of μ-GDP (Dong, Roth, Su 2019, "Gaussian Differential Privacy",
    Cor. 2.13), the one home of that formula.

    The caller computes h and r (their rounding is part of its results). e^ε·Φ(·) is
    evaluated as exp(ε + log Φ(·)), its exponent capped at 700 (no OverflowError;
    for h, r > 0 the exponent is below 0 anyway, since (h + r)²/2 >= 2hr = ε).
    """
    from scipy.special import log_ndtr, ndtr

    second = math.exp(min(epsilon + float(log_ndtr(-half_mu - eps_over_mu)), 700.0))
    return float(ndtr(half_mu - eps_over_mu)) - second


def analytic_gaussian_delta(sigma: float, sensitivity: float, epsilon: float) -> float:
    """δ of N(0, σ²) noise at ε (Balle and Wang 2018, Theorem 8): `gaussian_profile_delta`
    with h = Δ/(2σ), r = εσ/Δ. A float in (−∞, 1]; <= δ means (ε, δ)-DP."""
    return gaussian_profile_delta(
        sensitivity / (2.0 * sigma), epsilon * sigma / sensitivity, epsilon
    )


def analytic_gaussian_sigma(sensitivity: float, epsilon: float, delta: float) -> float:
    """Smallest σ with analytic_gaussian_delta(σ) ≤ δ (Balle and Wang 2018, Thm 8).

    δ(σ) is decreasing in σ; bisection to a relative width of 1e-12, returning
    the upper end (always a valid σ).
    """
    _check(sensitivity, epsilon, delta)
    lo, hi = sensitivity * 1e-6, sensitivity
    while analytic_gaussian_delta(hi, sensitivity, epsilon) > delta:
        lo, hi = hi, hi * 2.0
    while (hi - lo) > 1e-12 * hi:
        mid = (lo + hi) / 2.0
        if analytic_gaussian_delta(mid, sensitivity, epsilon) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def gaussian_sigma(
    sensitivity: float, epsilon: float, delta: float, calibration: GaussianCalibration | str
) -> float:
    """σ by the chosen calibration (the classic one refuses ε ≥ 1)."""
    method = GaussianCalibration(calibration)
    if method is GaussianCalibration.CLASSIC:
        return classic_gaussian_sigma(sensitivity, epsilon, delta)
    return analytic_gaussian_sigma(sensitivity, epsilon, delta)


def discrete_gaussian_delta(sigma: float, sensitivity: int, epsilon: float) -> float:
    """Exact δ(ε) of the discrete Gaussian N_Z(0, σ²), integer Δ (CKS20, Theorem 7)."""
    import numpy as np

    if sigma > MAX_LATTICE_SIGMA:
        raise ValueError(
            f"noise of {sigma:.3g} lattice units is too fine to verify; use a coarser granularity"
        )
    s2 = sigma * sigma
    centre = epsilon * s2 / sensitivity
    top = math.ceil(centre + sensitivity + 40.0 * sigma) + 1
    x = np.arange(0, top + 1, dtype=np.float64)
    w = np.exp(-(x * x) / (2.0 * s2))
    norm = float(w[0] + 2.0 * w[1:].sum())
    # P[Y > a] for real a: sum of the mass of integers strictly above a (all > 0 here
    # or handled by symmetry below).

    def tail(a: float) -> float:
        first = math.floor(a) + 1
        if first >= 0:
            return float(w[first:].sum()) / norm if first <= top else 0.0
        # P[Y >= first] for negative first = 1 - P[Y <= first - 1] = 1 - P[Y >= 1 - first]
        return 1.0 - float(w[1 - first :].sum()) / norm

    return tail(centre - sensitivity / 2.0) - math.exp(epsilon) * tail(centre + sensitivity / 2.0)


@dataclass(frozen=True)
class DiscreteGaussianCalibration:
    """σ in lattice units for a discrete Gaussian, and the δ it achieves at ε."""

    sigma: float
    delta_achieved: float
    calibration: GaussianCalibration


def calibrate_discrete_gaussian(
    lattice_sensitivity: int,
    epsilon: float,
    delta: float,
    calibration: GaussianCalibration | str = GaussianCalibration.ANALYTIC,
) -> DiscreteGaussianCalibration:
    """σ (lattice units) so that N_Z(0, σ²) is (ε, δ)-DP for integer sensitivity Δ."""
    if lattice_sensitivity < 1:
        raise ValueError("lattice sensitivity must be a positive integer")
    method = GaussianCalibration(calibration)
    sigma = gaussian_sigma(float(lattice_sensitivity), epsilon, delta, method)
    for _ in range(1000):
        achieved = discrete_gaussian_delta(sigma, lattice_sensitivity, epsilon)
        if achieved <= delta:
            return DiscreteGaussianCalibration(sigma, achieved, method)
        sigma *= 1.001
    raise AssertionError("discrete Gaussian calibration did not converge")  # pragma: no cover
