"""The exponential-mechanism quantile over a declared interval: scores, sensitivity, error.

Mechanism (Smith 2011, "Privacy-preserving statistical estimation with optimal
convergence rates", STOC, Section 3: the exponential mechanism of McSherry and
Talwar 2007 with a rank-based utility for the median and quantiles; in the
candidate-grid form of OpenDP's `make_quantile_score_candidates` followed by a
report-noisy-max, which avoids the floating-point weights of the continuous
interval version): the candidates are the grid

    c_j = L + j·γ,  γ = (U − L) / STEPS,  j = 0 … STEPS

over the declared bounds [L, U] (data-independent). With the quantile
q = Q/D in lowest terms, n clipped records, lt_j = #{x < c_j} and
gt_j = #{x > c_j}, the utility of c_j is the integer

    u_j = −|(D − Q)·lt_j − Q·gt_j|        (0 exactly at a true q-quantile).

Adding or removing one record moves lt_j or gt_j (not both) by one, so u_j
moves by at most max(Q, D − Q); a unit of at most k records moves it by at
most Δu = k·max(Q, D − Q). `releases.exponential_choice` then picks a
candidate ε-DP (report-noisy-max with one-sided geometric noise of scale
2Δu/ε: permute-and-flip, McKenna and Sheldon 2020). Pure ε, δ = 0.

Rank error. For any candidate v with E = |u(v)|/D:

    #{x < v} ≤ q·n + E   and   #{x > v} ≤ (1 − q)·n + E

(from |(1 − q)·lt − q·gt| ≤ E and lt + gt ≤ n), i.e. v is a q-quantile up to
E records. The released candidate o satisfies u_o + Z_o ≥ u_* + Z_* ≥ u_*
for the best candidate *, so u_* − u_o ≤ max_j Z_j, and P[max_j Z_j ≥ T] ≤
m·exp(−T·ε/(2Δu)) over the m candidates (union bound on P[Z ≥ T] =
exp(−T/scale), noise.geometric). With T = ⌈(2Δu/ε)·ln(m/α)⌉, with
probability at least 1 − α over the mechanism, E(o) ≤ E(*) + (T − 1)/D:
the rank error of the release exceeds that of the best grid candidate by at
most (T − 1)/D records. E(*) is 0 when a true q-quantile lies on the grid and
otherwise at most the number of records strictly between the two grid points
around it (data-dependent, not released).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from decimal import Decimal
from fractions import Fraction

#: Grid intervals between the declared bounds (STEPS + 1 candidates).
STEPS = 1000
#: Most decimal places of a requested quantile (keeps D ≤ 10⁶).
MAX_QUANTILE_PLACES = 6


def quantile_fraction(q: Decimal) -> Fraction:
    """q as a Fraction, when it is a decimal in (0, 1) with at most 6 places (ValueError)."""
    if not isinstance(q, Decimal) or not q.is_finite() or not 0 < q < 1:
        raise ValueError("the quantile must be a decimal strictly between 0 and 1")
    exponent = q.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > MAX_QUANTILE_PLACES:
        raise ValueError(f"the quantile has at most {MAX_QUANTILE_PLACES} decimal places")
    return Fraction(q)


def grid_step(lower: Decimal, upper: Decimal) -> Decimal:
    """γ = (U − L) / STEPS, exact (a decimal divided by a power of ten)."""
    return (upper - lower) / STEPS


def candidates(lower: Decimal, upper: Decimal) -> list[Decimal]:
    """The grid c_j = L + j·γ, j = 0 … STEPS."""
    step = grid_step(lower, upper)
    return [lower + j * step for j in range(STEPS)] + [upper]


def utility_sensitivity(q: Fraction, contribution_bound: int) -> int:
    """Δu = k·max(Q, D − Q) (module docstring)."""
    return contribution_bound * max(q.numerator, q.denominator - q.numerator)


def cells(values: Iterable[Decimal], lower: Decimal, upper: Decimal) -> tuple[list[int], list[int]]:
    """(on, between): records equal to each c_j, and strictly inside (c_j, c_{j+1}),
    of `values` clipped to [L, U] (an engine returns them: aggregator/engines/plan.py)."""
    step = grid_step(lower, upper)
    on = [0] * (STEPS + 1)
    between = [0] * (STEPS + 1)
    for value in values:
        x = min(max(value, lower), upper)
        cell, rest = divmod(x - lower, step)
        (on if rest == 0 else between)[int(cell)] += 1
    return on, between


def scores_from_cells(on: Sequence[int], between: Sequence[int], q: Fraction) -> list[int]:
    """u_j = −|(D − Q)·lt_j − Q·gt_j| from the grid cells' record counts (`cells`)."""
    n = sum(on) + sum(between)
    qn, qd = q.numerator, q.denominator
    out: list[int] = []
    below = 0  # #{x < c_j}
    for j in range(STEPS + 1):
        above = n - below - on[j]
        out.append(-abs((qd - qn) * below - qn * above))
        below += on[j] + between[j]
    return out


def scores(values: Iterable[Decimal], lower: Decimal, upper: Decimal, q: Fraction) -> list[int]:
    """u_j = −|(D − Q)·lt_j − Q·gt_j| for every grid candidate (values clipped to [L, U])."""
    on, between = cells(values, lower, upper)
    return scores_from_cells(on, between, q)


def rank_error(epsilon: Decimal, sensitivity: int, q: Fraction, alpha: float) -> Fraction:
    """(T − 1)/D records: the rank error beyond the best grid candidate's, at 1 − α,
    for utility sensitivity Δu = `sensitivity` (module docstring)."""
    scale = 2 * sensitivity / float(epsilon)
    threshold = math.ceil(scale * math.log((STEPS + 1) / alpha) * (1 + 1e-12))
    return Fraction(max(threshold - 1, 0), q.denominator)
