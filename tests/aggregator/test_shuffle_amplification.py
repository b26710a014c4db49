"""The amplification-by-shuffling bound (fedldp.aggregator.shuffle_amplification).

Deterministic numerics (no randomness, no α to state):

* published figures: the reference code's README output for n = 10⁵, ε0 = 4, δ = 10⁻⁶ (the
  numerical bound lies in its stated bracket [0.16754, 0.17279]; the closed form equals its
  0.5378040242374512), and brackets of that code run at a finer step (`step=10`, 20 iterations);
* the per-c sum equals a brute-force enumeration of Theorem 3.2's P and Q for small n;
* monotone in n and in ε0; conservative: never below the exact ε of shuffled binary randomized
  response (a true lower bound), never above ε0 or Theorem 3.1's closed form; and the
  lower-bound check rejects a broken variant (a naive ε0/√n "bound");
* edges: n = 1 gives the single report's own (ε, δ) in closed form; bad input is refused.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import pytest
from fedldp.aggregator.shuffle_amplification import (
    AmplifiedGuarantee,
    amplified_epsilon,
    binary_rr_epsilon,
    closed_form_epsilon,
    hockey_stick_delta,
)
from scipy import stats

TOL = 1e-6

# (n, ε0, δ, lower, upper): brackets printed by github.com/apple/ml-shuffling-amplification
# (computeamplification.numericalanalysis, upperbound False / True). The first row is the
# README's published output (10 iterations, step 100); the others were produced by that code
# at step 10 with 20 iterations: `numericalanalysis(n, eps0, delta, 20, 10, ...)`.
REFERENCE_BRACKETS = [
    (10**5, 4.0, 1e-6, 0.1675385583317841, 0.172790550755978),
    (10**5, 4.0, 1e-6, 0.16954549645247463, 0.1751216352840992),
    (10**4, 1.0, 1e-8, 0.06883642425396827, 0.07043126460767718),
    (10**5, 2.0, 1e-8, 0.058752742484051185, 0.06026366692500788),
    (10**6, 8.0, 1e-8, 0.552524217445625, 0.5724070535835939),
    (10**5, 8.0, 1e-8, 3.433746337890625, 7.998054504394531),
    (10**4, 8.0, 1e-8, 8.0, 8.0),  # step 1: too few clones at δ = 1e-8, no amplification
]


@pytest.mark.parametrize(("n", "eps0", "delta", "lower", "upper"), REFERENCE_BRACKETS)
def test_reproduces_reference_brackets(
    n: int, eps0: float, delta: float, lower: float, upper: float
) -> None:
    """The bound lies in the reference code's [lower, upper] bracket for the same inputs."""
    got = amplified_epsilon(n, eps0, delta).epsilon
    assert lower <= got <= upper


def test_closed_form_reproduces_reference_output() -> None:
    """Theorem 3.1's closed form equals the README's printed 0.5378040242374512."""
    assert closed_form_epsilon(10**5, 4.0, 1e-6) == pytest.approx(0.5378040242374512, rel=1e-12)


def _brute_force_delta(n: int, eps0: float, eps: float) -> float:
    """Theorem 3.2's max(D(P‖Q), D(Q‖P)) by enumerating every (c, a, Δ) outcome."""
    alpha = math.exp(eps0) / (math.exp(eps0) + 1)
    p_dist: dict[tuple[int, int], float] = defaultdict(float)
    q_dist: dict[tuple[int, int], float] = defaultdict(float)
    for c in range(n):
        pc = stats.binom.pmf(c, n - 1, math.exp(-eps0))
        for a in range(c + 1):
            pa = pc * stats.binom.pmf(a, c, 0.5)
            for d, pd in ((1, alpha), (0, 1 - alpha)):  # Δ ~ Bern(α)
                p_dist[(a + d, c - a + 1 - d)] += pa * pd
                q_dist[(a + 1 - d, c - a + d)] += pa * pd
    keys = set(p_dist) | set(q_dist)
    e = math.exp(eps)
    forward = sum(max(0.0, p_dist[k] - e * q_dist[k]) for k in keys)
    backward = sum(max(0.0, q_dist[k] - e * p_dist[k]) for k in keys)
    return max(forward, backward)


@pytest.mark.parametrize(("n", "eps0", "eps"), [(1, 1.0, 0.3), (7, 1.0, 0.2), (25, 2.0, 0.5)])
def test_per_c_sum_equals_brute_force(n: int, eps0: float, eps: float) -> None:
    """The vectorised per-c divergence equals enumeration of P and Q outcome by outcome."""
    assert hockey_stick_delta(n, eps0, eps) == pytest.approx(
        _brute_force_delta(n, eps0, eps), abs=1e-12
    )


def test_tail_truncation_only_adds() -> None:
    """Leaving out a tail of C adds its mass: the truncated value bounds the full sum above."""
    full = hockey_stick_delta(2000, 1.0, 0.15)
    truncated = hockey_stick_delta(2000, 1.0, 0.15, tail=1e-9)
    assert full <= truncated <= full + 2e-9


def test_monotone_in_n() -> None:
    """More reports hide each one better: ε strictly decreases in n at fixed ε0, δ."""
    eps = [amplified_epsilon(n, 2.0, 1e-8).epsilon for n in (100, 1000, 10**4, 10**5)]
    assert all(a > b for a, b in itertools.pairwise(eps))


def test_monotone_in_eps0() -> None:
    """A weaker local guarantee gives a weaker central one: ε increases in ε0."""
    eps = [amplified_epsilon(10**4, e0, 1e-8).epsilon for e0 in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a < b for a, b in itertools.pairwise(eps))


CONSERVATIVE_CASES = [(100, 1.0), (1000, 2.0), (10**4, 1.0), (10**4, 4.0), (10**4, 8.0)]


def _is_conservative(n: int, eps0: float, delta: float, eps: float) -> bool:
    """ε is at least the exact ε of shuffled binary randomized response (a true lower bound)."""
    return eps >= binary_rr_epsilon(n, eps0, delta)


@pytest.mark.parametrize(("n", "eps0"), CONSERVATIVE_CASES)
def test_conservative_and_below_eps0_and_closed_form(n: int, eps0: float) -> None:
    """binary-RR exact ε ≤ bound ≤ min(ε0, closed form), and the bound is not vacuous."""
    delta = 1e-8
    eps = amplified_epsilon(n, eps0, delta).epsilon
    assert _is_conservative(n, eps0, delta, eps)
    assert eps <= eps0
    assert eps <= closed_form_epsilon(n, eps0, delta) + TOL


def test_lower_bound_check_rejects_a_broken_bound() -> None:
    """Broken variant: the naive ε0/√n "bound" is below the binary-RR lower bound."""
    n, eps0, delta = 10**4, 1.0, 1e-8
    assert not _is_conservative(n, eps0, delta, eps0 / math.sqrt(n))


@pytest.mark.parametrize(("eps0", "delta"), [(1.0, 1e-6), (4.0, 1e-8), (0.1, 1e-3)])
def test_single_report_gets_its_own_guarantee(eps0: float, delta: float) -> None:
    """n = 1: no crowd; ε = log(e^ε0 − δ(e^ε0 + 1)), the (ε, δ) of one ε0-DP binary report."""
    exact = math.log(math.exp(eps0) - delta * (math.exp(eps0) + 1))
    got = amplified_epsilon(1, eps0, delta)
    assert exact <= got.epsilon <= exact + TOL
    assert got == AmplifiedGuarantee(1, eps0, got.epsilon, delta, TOL)


def test_small_crowd_amplifies_little() -> None:
    """A handful of reports at high ε0 rarely look alike: ε stays within 1 % of ε0."""
    assert amplified_epsilon(5, 8.0, 1e-8).epsilon >= 0.99 * 8.0


@pytest.mark.parametrize(
    ("n", "eps0", "delta"),
    [(0, 1.0, 1e-6), (10, 0.0, 1e-6), (10, math.inf, 1e-6), (10, 1.0, 0.0), (10, 1.0, 1.0)],
)
def test_bad_parameters_are_refused(n: int, eps0: float, delta: float) -> None:
    """n < 1, ε0 not finite and positive, δ outside (0, 1): ValueError naming the parameter."""
    with pytest.raises(ValueError, match="must be"):
        amplified_epsilon(n, eps0, delta)
