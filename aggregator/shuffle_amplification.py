"""Central (ε, δ) of n ε0-LDP reports after a uniform shuffle (privacy amplification by shuffling).

The bound is the numerical one of Feldman, McMillan and Talwar, "Hiding Among the Clones: A
Simple and Nearly Optimal Analysis of Privacy Amplification by Shuffling", FOCS 2021
(arXiv:2012.12803):

* Theorem 3.2 reduces the shuffled output of n ε0-DP local randomizers on two neighbouring
  data sets to a pair of distributions on pairs of counts. With p = e^(−ε0),
  C ~ Bin(n − 1, p), A ~ Bin(C, 1/2), Δ ~ Bern(e^ε0 / (e^ε0 + 1)):
  P = (A + Δ, C − A + 1 − Δ) and Q = (A + 1 − Δ, C − A + Δ). The shuffled mechanism is
  (ε, δ)-DP whenever δ ≥ D_{e^ε}(P‖Q) and δ ≥ D_{e^ε}(Q‖P) (hockey-stick divergences).
* Section 5 / Appendix E evaluate that divergence numerically and binary-search the smallest ε
  whose divergence is at most δ (their reference code, github.com/apple/ml-shuffling-
  amplification, functions `deltacomp`, `onestep`, `numericalanalysis`). The second coordinate
  of P and Q is C + 1 minus the first, so C is observed and
  D_{e^ε}(P‖Q) = Σ_c Pr[C = c] · D_{e^ε}(P_c‖Q_c) exactly, where P_c is the first coordinate
  given C = c: α·Bin(c, 1/2) + (1 − α)·(Bin(c, 1/2) + 1), α = e^ε0/(e^ε0 + 1), and Q_c swaps
  α and 1 − α. P_c(x)/Q_c(x) decreases in x, so the set where P_c > e^ε·Q_c is
  {x ≤ β(c + 1)}, β = r/(1 + r), r = (α − e^ε(1 − α)) / (e^ε·α − (1 − α)) (`onestep`).

This module evaluates that sum at every c (the reference code groups c in steps and takes the
worst end point of each group; one c per step is its most accurate setting) over the range of c
that holds all but a tail of Pr[C = c]; the tail's mass is added to δ whole (a divergence is at
most 1), so `hockey_stick_delta(..., upper=True)` is an upper bound and the ε it yields is a valid
(conservative) guarantee. P_c and Q_c are mirror images (x ↦ c + 1 − x), so the two directions
are equal; both are computed and the larger is used.

`binary_rr_epsilon` is the exact central ε of one concrete ε0-LDP randomizer (binary randomized
response) shuffled over n users, a true lower bound on any valid amplification bound for
general ε0-LDP randomizers (the paper compares against it in Section 5); `closed_form_epsilon`
is Theorem 3.1's closed form as the reference code evaluates it (`closedformanalysis`).

numpy and scipy are imported where used: the CLI imports this module for its types.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

# Binary search stops when the bracket [lo, hi] is narrower than this (absolute, in ε).
DEFAULT_TOLERANCE = 1e-6
# Mass of Pr[C = c] left outside the evaluated range on each side, as a fraction of δ: it is
# added to δ whole, so it costs at most this share of the δ budget.
TAIL_FRACTION = 1e-6


@dataclass(frozen=True)
class AmplifiedGuarantee:
    """The central guarantee of a shuffled window: (epsilon, delta) with epsilon ≤ epsilon0.

    `epsilon` is an upper bound within `tolerance` of the smallest ε the numerical bound
    certifies; `bound` names the computation.
    """

    n: int
    epsilon0: float
    epsilon: float
    delta: float
    tolerance: float
    bound: str = "FMT21 Thm 3.2 numerical"


def _check(n: int, epsilon0: float, delta: float) -> None:
    """Reject parameters outside the theorem's domain with a specific error."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ValueError(f"epsilon0 must be a finite positive number, got {epsilon0!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def hockey_stick_delta(n: int, epsilon0: float, epsilon: float, *, tail: float = 0.0) -> float:
    """max(D_{e^ε}(P‖Q), D_{e^ε}(Q‖P)) for Theorem 3.2's P and Q, plus the tail's mass.

    c runs over the range that leaves at most `tail` of Pr[C = c] outside on each side; the mass
    left out is added whole, so the result is an upper bound on the divergence (exact up to
    float rounding when `tail` is 0: every c from 0 to n − 1). 0 ≤ epsilon < epsilon0.
    """
    import numpy as np
    from scipy import stats

    if not (0 <= epsilon < epsilon0):
        raise ValueError(f"epsilon must be in [0, epsilon0), got {epsilon!r}")
    p = math.exp(-epsilon0)
    count = stats.binom(n - 1, p)
    if tail > 0:
        c_lo, c_hi = int(count.ppf(tail)), int(count.isf(tail))
    else:
        c_lo, c_hi = 0, n - 1
    c = np.arange(max(c_lo, 0), min(c_hi, n - 1) + 1)
    left_out = float(count.cdf(c[0] - 1) + count.sf(c[-1]))
    weights = count.pmf(c)
    alpha = math.exp(epsilon0) / (math.exp(epsilon0) + 1)
    e = math.exp(epsilon)
    r = (alpha - e * (1 - alpha)) / (e * alpha - (1 - alpha))
    per_c = []
    for beta in (r / (1 + r), 1 / (1 + r)):
        k = np.floor(beta * (c + 1))
        f_k = stats.binom.cdf(k, c, 0.5)
        f_k1 = stats.binom.cdf(k - 1, c, 0.5)
        p_le = alpha * f_k + (1 - alpha) * f_k1  # P_c(X ≤ k)
        q_le = (1 - alpha) * f_k + alpha * f_k1  # Q_c(X ≤ k)
        if beta <= 0.5:  # P‖Q: the set {x ≤ β(c + 1)}
            per_c.append(p_le - e * q_le)
        else:  # Q‖P: the set {x > (c + 1)/(1 + r)}
            per_c.append((1 - q_le) - e * (1 - p_le))
    divergences = [float(np.dot(weights, np.clip(d, 0.0, 1.0))) for d in per_c]
    return min(1.0, max(divergences) + left_out)


def _search(delta_of: Callable[[float], float], delta: float, hi: float, tol: float) -> float:
    """Smallest ε in [0, hi] (to within `tol`, rounded up) with delta_of(ε) ≤ delta.

    delta_of must be non-increasing (hockey-stick divergences are); delta_of(hi) ≤ delta is
    assumed, not evaluated (at hi = ε0 the divergence is 0).
    """
    if delta_of(0.0) <= delta:
        return 0.0
    lo = 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if delta_of(mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def amplified_epsilon(
    n: int, epsilon0: float, delta: float, *, tolerance: float = DEFAULT_TOLERANCE
) -> AmplifiedGuarantee:
    """The central (ε, δ) of n ε0-LDP reports after a uniform shuffle (FMT21 Theorem 3.2).

    ε is the upper end of a binary-search bracket narrower than `tolerance`, so the returned
    (ε, δ) is certified by the bound; ε ≤ ε0 always (at ε0 the divergence is 0). Raises
    ValueError for n < 1, ε0 ≤ 0 or non-finite, δ outside (0, 1).
    """
    _check(n, epsilon0, delta)
    if not (0 < tolerance < epsilon0):
        raise ValueError(f"tolerance must be in (0, epsilon0), got {tolerance!r}")

    def delta_of(eps: float) -> float:
        return hockey_stick_delta(n, epsilon0, eps, tail=TAIL_FRACTION * delta)

    eps = _search(delta_of, delta, epsilon0, tolerance)
    return AmplifiedGuarantee(n, epsilon0, eps, delta, tolerance)


def binary_rr_delta(n: int, epsilon0: float, epsilon: float) -> float:
    """Exact δ(ε) of binary randomized response at ε0 shuffled over n users.

    Neighbours: user 1 holds 0 or 1, the other n − 1 hold 0; the analyst sees the count of
    reported ones (all a shuffle leaves of binary reports). Randomized response reports its
    bit with probability e^ε0/(e^ε0 + 1) (Warner 1965), an ε0-LDP randomizer.
    """
    import numpy as np
    from scipy import stats

    q = 1 / (math.exp(epsilon0) + 1)
    k = np.arange(n + 1)
    others = stats.binom.pmf(k, n - 1, q)
    others_shift = stats.binom.pmf(k - 1, n - 1, q)
    zero = (1 - q) * others + q * others_shift  # user 1 holds 0
    one = q * others + (1 - q) * others_shift  # user 1 holds 1
    e = math.exp(epsilon)
    forward = float(np.sum(np.maximum(one - e * zero, 0.0)))
    backward = float(np.sum(np.maximum(zero - e * one, 0.0)))
    return max(forward, backward)


def binary_rr_epsilon(
    n: int, epsilon0: float, delta: float, *, tolerance: float = DEFAULT_TOLERANCE
) -> float:
    """Exact central ε (lower end of a `tolerance` bracket) of shuffled binary RR at ε0.

    A lower bound on the amplified ε of every valid bound for general ε0-LDP randomizers.
    """
    _check(n, epsilon0, delta)
    if binary_rr_delta(n, epsilon0, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, epsilon0
    while hi - lo > tolerance:
        mid = (lo + hi) / 2
        if binary_rr_delta(n, epsilon0, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return lo


def closed_form_epsilon(n: int, epsilon0: float, delta: float) -> float:
    """Theorem 3.1's closed form (as the reference code's `closedformanalysis` evaluates it).

    Valid when ε0 ≤ log(n / (16 log(4/δ))); outside that regime it returns ε0 (no
    amplification claimed).
    """
    _check(n, epsilon0, delta)
    if epsilon0 > math.log(n / (16 * math.log(4 / delta))):
        return epsilon0
    a = 8 * math.sqrt(math.exp(epsilon0) * math.log(4 / delta)) / math.sqrt(n)
    c = 8 * math.exp(epsilon0) / n
    e = math.log(1 + a + c)
    b = 1 - math.exp(-epsilon0)
    d = 1 + math.exp(-epsilon0 - e)
    return min(epsilon0, math.log(1 + (b / d) * (a + c)))
