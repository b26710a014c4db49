"""Privacy accounting for DP-SGD: calibration, step limit, checks and replay.

DP-SGD with Poisson sampling at rate q and noise multiplier σ, run for T steps,
is T compositions of the Poisson-subsampled Gaussian mechanism (Abadi et al.
2016, "Deep Learning with Differential Privacy", §3.1). Its history is the list
of (σ, q, steps) segments Opacus's accountants keep; ε at a given δ comes from

- `prv`: numerical composition of privacy loss random variables (Gopi, Lee,
  Wutschitz 2021, "Numerical Composition of Differential Privacy", Thm. 5.5);
  the value returned is the *upper* end of its error interval, eps_error wide.
- `rdp`: Rényi DP of the sampled Gaussian (Mironov, Talwar, Zhang 2019, §3)
  over Opacus's default orders, converted to (ε, δ) (Opacus's conversion,
  Balle et al. 2020, "Hypothesis Testing Interpretations and Rényi DP", Thm. 21).

Both are upper bounds; ε(T) of the true mechanism is nondecreasing in T
(composition), so a certificate for T steps also covers any prefix of them.

The accountants are Opacus's (opacus.accountants), called with exactly the
parameters the receipt records, so `fedldp verify training` can replay them with
the unmodified PRVAccountant/RDPAccountant. During training the same
computations run with the per-step RDP vector cached (`_prv_epsilon`), which
makes a PRV query several times faster and returns the same value.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

import numpy as np
from numpy.typing import NDArray
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.analysis.prv import (
    Domain,
    PoissonSubsampledGaussianPRV,
    TruncatedPrivacyRandomVariable,
    compose_heterogeneous,
    discretize,
)

# One segment of an accountant's history: (noise multiplier, sample rate, steps).
Segment = tuple[float, float, int]
# Errors a failing accountant raises (numerical domain, FFT, bad parameters).
ACCOUNTANT_ERRORS = (ValueError, RuntimeError, ArithmeticError, IndexError, MemoryError)
# Calibration stops within this ε of the target, from below (as Opacus's search does).
CALIBRATION_TOLERANCE = 0.01
MAX_SIGMA = 1e6
MIN_SIGMA = 1e-3


class AccountantError(RuntimeError):
    """An accountant failed or returned a non-finite ε; the run must not go on with it."""


def prv_delta_error(delta: float) -> float:
    """The δ-accuracy given to the PRV accountant: Opacus's default, δ/1000."""
    return delta / 1000


@functools.lru_cache(maxsize=1024)
def _rdp_one_step(sample_rate: float, noise_multiplier: float) -> NDArray[np.float64]:
    """RDP of one step at Opacus's default orders (Mironov, Talwar, Zhang 2019, §3).

    Opacus's compute_rdp(q, σ, steps, orders) returns this vector times `steps`
    (RDP composes additively, Mironov 2017, Prop. 1); caching it per (q, σ) turns
    every later query for the same schedule into a multiplication. The cached
    array is never mutated.
    """
    vec = rdp_analysis.compute_rdp(
        q=sample_rate,
        noise_multiplier=noise_multiplier,
        steps=1,
        orders=RDPAccountant.DEFAULT_ALPHAS,
    )
    return np.asarray(vec, dtype=np.float64)


def _rdp_epsilon(history: Sequence[Segment], delta: float) -> float:
    # = RDPAccountant.get_privacy_spent: sum of per-segment RDP, then Balle et al. 2020 Thm. 21
    rdp = sum(_rdp_one_step(q, s) * t for s, q, t in history)
    eps, _ = rdp_analysis.get_privacy_spent(
        orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta
    )
    return float(eps)


def _prv_epsilon(history: Sequence[Segment], delta: float, eps_error: float) -> float:
    """PRVAccountant.get_epsilon, step for step, with the safe-domain bound's RDP cached.

    Opacus spends ~90% of a PRV query in compute_safe_domain_size (Gopi et al. 2021,
    Remark 5.6), which evaluates the RDP accountant twice; here those RDP values
    come from _rdp_one_step. Everything else is Opacus's code. The result equals
    PRVAccountant's (tests check it; `fedldp verify training` replays with the
    unmodified PRVAccountant).
    """
    delta_error = prv_delta_error(delta)
    prvs = [PoissonSubsampledGaussianPRV(q, s) for s, q, _ in history]
    counts = [t for _, _, t in history]
    total = sum(counts)
    # compute_safe_domain_size, with RDP from the cache
    l_max = _rdp_epsilon(history, delta_error / 4)
    for s, q, _ in history:
        l_max = max(l_max, _rdp_epsilon([(s, q, 1)], delta_error / (8 * total)))
    size = max(l_max, eps_error) + 3
    mesh = eps_error / np.sqrt(total * np.log(12 / delta_error) / 2)
    domain = Domain.create_aligned(-size, size, mesh)
    tprvs = [TruncatedPrivacyRandomVariable(prv, domain.t_min, domain.t_max) for prv in prvs]
    dprvs = [discretize(tprv, domain) for tprv in tprvs]
    dprv = compose_heterogeneous(dprvs=dprvs, num_self_compositions=counts)
    _, _, eps_upper = dprv.compute_epsilon(delta, delta_error, eps_error)
    return float(eps_upper)


def epsilon(
    mechanism: str,
    history: Sequence[Segment],
    delta: float,
    *,
    eps_error: float = 0.01,
    reference: bool = False,
) -> float:
    """ε of `history` at `delta` under `mechanism` ('prv' or 'rdp'); 0 for no steps.

    `reference=True` calls Opacus's PRVAccountant/RDPAccountant objects
    themselves (slower; what `verify` replays with); otherwise the cached path
    above, which computes the same numbers. Raises AccountantError when the
    accountant raises or returns NaN/inf/negative.
    """
    steps = [(float(s), float(q), int(t)) for s, q, t in history if t > 0]
    if not steps:
        return 0.0
    try:
        if mechanism == "prv" and reference:
            prv = PRVAccountant()
            prv.history = steps
            value = prv.get_epsilon(delta, eps_error=eps_error, delta_error=prv_delta_error(delta))
        elif mechanism == "prv":
            value = _prv_epsilon(steps, delta, eps_error)
        elif mechanism == "rdp" and reference:
            rdp = RDPAccountant()
            rdp.history = steps
            value = rdp.get_epsilon(delta)
        elif mechanism == "rdp":
            value = _rdp_epsilon(steps, delta)
        else:
            raise AccountantError(f"unknown accountant {mechanism!r}")
    except ACCOUNTANT_ERRORS as exc:
        raise AccountantError(
            f"{mechanism} accountant failed: {type(exc).__name__}: {exc}"
        ) from exc
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise AccountantError(f"{mechanism} accountant returned a non-finite epsilon ({value})")
    return value


def within(eps: float, budget: Decimal) -> bool:
    """eps ≤ budget, compared exactly (Decimal(float) is exact)."""
    return Decimal(eps) <= budget


def calibrate_noise(
    mechanism: str,
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    eps_error: float = 0.01,
    tolerance: float = CALIBRATION_TOLERANCE,
    max_queries: int = 60,
) -> tuple[float, float]:
    """The noise multiplier σ for `steps` steps at ε within [target − tolerance, target].

    Returns (σ, ε(σ)). Same contract as Opacus's get_noise_multiplier (ε ≤ target,
    within `tolerance` of it) with fewer accountant queries: a geometric bracket
    from σ = 1, then the Illinois variant of regula falsi on log ε(log σ), which
    is smooth and decreasing (Dowell & Jarratt 1971). Every returned σ has had its
    ε computed directly, so the bound never rests on the interpolation.
    """

    def eps_of(sigma: float) -> float:
        return epsilon(mechanism, [(sigma, sample_rate, steps)], delta, eps_error=eps_error)

    queries = 0
    lo, hi = 1.0, 1.0  # eps(lo) > target >= eps(hi) once bracketed
    e = eps_of(1.0)
    queries += 1
    if target_epsilon - tolerance <= e <= target_epsilon:
        return 1.0, e
    if e > target_epsilon:
        e_lo = e
        hi, e_hi = 2.0, eps_of(2.0)
        queries += 1
        while e_hi > target_epsilon:
            lo, e_lo = hi, e_hi
            hi *= 2
            if hi > MAX_SIGMA:
                raise AccountantError("the privacy budget is too low for any noise multiplier")
            e_hi = eps_of(hi)
            queries += 1
    else:
        e_hi = e
        lo, e_lo = 0.5, eps_of(0.5)
        queries += 1
        while e_lo <= target_epsilon:
            if target_epsilon - tolerance <= e_lo:
                return lo, e_lo
            hi, e_hi = lo, e_lo
            lo /= 2
            if lo < MIN_SIGMA:
                raise AccountantError("no noise multiplier reaches the target epsilon")
            e_lo = eps_of(lo)
            queries += 1
    if target_epsilon - tolerance <= e_hi:
        return hi, e_hi
    # f(x) = log eps(e^x) - log target: f(log lo) > 0 >= f(log hi).
    log_t = math.log(target_epsilon)
    x_lo, f_lo = math.log(lo), math.log(e_lo) - log_t
    x_hi, f_hi = math.log(hi), (math.log(e_hi) - log_t) if e_hi > 0 else -math.inf
    side = 0
    while queries < max_queries:
        if math.isfinite(f_hi) and f_lo != f_hi:
            x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
            if not x_lo < x < x_hi:
                x = (x_lo + x_hi) / 2
        else:
            x = (x_lo + x_hi) / 2
        sigma = math.exp(x)
        e = eps_of(sigma)
        queries += 1
        if e <= target_epsilon:
            if target_epsilon - tolerance <= e:
                return sigma, e
            x_hi, f_hi, hi, e_hi = x, math.log(e) - log_t if e > 0 else -math.inf, sigma, e
            if side == -1:
                f_lo /= 2  # Illinois step: halve the stale end's value
            side = -1
        else:
            x_lo, f_lo = x, math.log(e) - log_t
            if side == 1 and math.isfinite(f_hi):
                f_hi /= 2
            side = 1
    return hi, e_hi  # within budget though not within tolerance: valid, slightly noisier


@dataclass
class BudgetAccountant:
    """The accountant that bounds one run: ε(σ, q, T) with a cache, the step limit.

    `mechanism` is the accountant in force ('prv' or 'rdp'). Queries are cached by
    T because the schedule is homogeneous (one σ, one q).
    """

    mechanism: str
    delta: float
    budget: Decimal
    sample_rate: float
    noise_multiplier: float
    eps_error: float = 0.01
    queries: int = 0
    _cache: dict[int, float] = field(default_factory=dict)

    def remember(self, steps: int, value: float) -> None:
        """Cache an ε already computed for this schedule (e.g. by calibration)."""
        self._cache[steps] = value

    def known(self, steps: int) -> bool:
        """Whether ε after `steps` steps is cached."""
        return steps in self._cache

    def compute(self, steps: int) -> float:
        """ε after `steps` steps, computed now and not cached (safe on a worker thread)."""
        self.queries += 1
        return epsilon(
            self.mechanism,
            [(self.noise_multiplier, self.sample_rate, steps)],
            self.delta,
            eps_error=self.eps_error,
        )

    def epsilon_at(self, steps: int) -> float:
        """ε after `steps` steps of this run's schedule (cached)."""
        if steps not in self._cache:
            self._cache[steps] = self.compute(steps)
        return self._cache[steps]

    def step_limit(self, planned: int) -> int:
        """The largest T ≤ planned with ε(T) within the budget (binary search).

        The returned T is always checked directly, so a numerically non-monotone
        accountant can shorten the run but never let it exceed the budget.
        """
        if planned <= 0 or within(self.epsilon_at(planned), self.budget):
            return max(planned, 0)
        lo, hi = 0, planned  # ε(lo) within (0 steps cost nothing), ε(hi) not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if within(self.epsilon_at(mid), self.budget):
                lo = mid
            else:
                hi = mid
        return lo
