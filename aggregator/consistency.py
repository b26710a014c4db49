"""Consistency post-processing of frequency estimates.

Wang, Lopuhaä-Zwakenberg, Li, Skoric, Li, "Locally Differentially Private
Frequency Estimation with Consistency", NDSS 2020 (hereafter WLLSL20).

An unbiased frequency oracle returns estimates that may be negative and need
not sum to 1. Post-processing makes them *consistent* (non-negative, summing
to 1) without touching privacy (post-processing of a DP output), at the price
of a bias. The raw unbiased vector is always kept next to the processed one.

Methods (names and definitions as in WLLSL20, which compares ten such methods):

* ``norm-sub`` (WLLSL20's "Norm-Sub"): set negatives to 0 and subtract the
  same amount δ from every positive estimate so they sum to 1; repeat until no
  estimate is negative. The fixed point is ``f'_v = max(f̂_v - δ, 0)`` over the
  values never zeroed, with δ chosen so that Σ f'_v = 1. It keeps the *gaps*
  between large values intact, so the head of a skewed distribution survives at
  large k (the property WLLSL20's top-value experiments measure).
* ``base-cut`` (WLLSL20's "Base-Cut"): keep an estimate only if it is above
  the Bonferroni noise threshold ``Φ⁻¹(1 − α/k)·σ_v`` (α = 0.05), else set it to 0.
  Does not normalize.
* ``project``: the Euclidean projection onto the probability simplex
  (Duchi, Shalev-Shwartz, Singer, Chandra, ICML 2008, Figure 1, the sort-based
  algorithm). Equal to Norm-Sub whenever the positive estimates sum to at least
  1 (the usual case at large k); otherwise it may lift slightly negative values.

`clip_and_normalize` is the naive step (clip negatives at 0, divide by the
sum) used by multi-freq-ldpy's default; it is here only as the contrast the
tests and the benchmark measure, never offered as a report option: at large k
the sum of clipped noise dwarfs 1 and the division collapses the head.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from fedldp.aggregator.intervals import bonferroni_z

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Significance level of Base-Cut's threshold (0.05, as in WLLSL20).
BASE_CUT_ALPHA = 0.05


class Consistency(str, enum.Enum):
    """Post-processing applied to a frequency vector; NONE keeps the raw estimate."""

    NONE = "none"
    NORM_SUB = "norm-sub"
    BASE_CUT = "base-cut"
    PROJECT = "project"

    @classmethod
    def parse(cls, value: Consistency | str | None) -> Consistency:
        """Accept an enum member, its string value or None (= NONE)."""
        if value is None:
            return cls.NONE
        if isinstance(value, Consistency):
            return value
        try:
            return cls(value)
        except ValueError:
            known = ", ".join(m.value for m in cls)
            raise ValueError(f"unknown consistency method {value!r}; known: {known}") from None


def norm_sub(estimates: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Norm-Sub (WLLSL20): non-negative, sums to 1, gaps kept.

    Runs the paper's iteration to its fixed point exactly: each round zeroes the
    negatives among the still-active values and shifts the active ones by the
    common δ that makes them sum to 1. The active set only shrinks, so at most k
    rounds; in practice two or three.
    """
    import numpy as np

    f = np.asarray(estimates, dtype=np.float64)
    if f.ndim != 1 or f.size == 0:
        raise ValueError("norm-sub needs a non-empty 1-d vector")
    if not np.all(np.isfinite(f)):
        raise ValueError("norm-sub needs finite estimates")
    active = f > 0
    if not np.any(active):
        # Nothing positive: the paper's iteration is undefined; fall back to uniform.
        return np.full(f.size, 1.0 / f.size)
    while True:
        count = int(active.sum())
        delta = (float(f[active].sum()) - 1.0) / count
        shifted = f - delta
        still = active & (shifted > 0)
        if int(still.sum()) == count:
            out = np.where(active, shifted, 0.0)
            return out
        active = still
        if not np.any(active):  # pragma: no cover - cannot happen: the max stays positive
            raise AssertionError("norm-sub emptied the active set")


def project_simplex(estimates: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Euclidean projection onto {f ≥ 0, Σf = 1} (Duchi et al. 2008, Figure 1)."""
    import numpy as np

    f = np.asarray(estimates, dtype=np.float64)
    if f.ndim != 1 or f.size == 0:
        raise ValueError("projection needs a non-empty 1-d vector")
    if not np.all(np.isfinite(f)):
        raise ValueError("projection needs finite estimates")
    u = np.sort(f)[::-1]
    css = np.cumsum(u) - 1.0
    ind = np.arange(1, f.size + 1)
    rho = int(np.nonzero(u - css / ind > 0)[0][-1])
    theta = float(css[rho]) / (rho + 1)
    out: npt.NDArray[np.float64] = np.maximum(f - theta, 0.0)
    return out


def base_cut(
    estimates: npt.NDArray[np.float64],
    std_errors: npt.NDArray[np.float64],
    *,
    alpha: float = BASE_CUT_ALPHA,
) -> npt.NDArray[np.float64]:
    """Base-Cut (WLLSL20): zero every estimate below Φ⁻¹(1 − α/k)·σ_v."""
    import numpy as np

    f = np.asarray(estimates, dtype=np.float64)
    se = np.asarray(std_errors, dtype=np.float64)
    if f.shape != se.shape or f.ndim != 1:
        raise ValueError("estimates and standard errors must be 1-d vectors of one length")
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    threshold = bonferroni_z(alpha, f.size) * se
    return np.where(f > threshold, f, 0.0)


def clip_and_normalize(estimates: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The naive contrast: clip at 0 and divide by the sum (multi-freq-ldpy's default).

    Not offered as a report option: it shrinks every value by the same factor
    (Σ max(f̂_v, 0)), which at large k is dominated by noise and collapses the head.
    """
    import numpy as np

    f = np.clip(np.asarray(estimates, dtype=np.float64), 0.0, None)
    total = float(f.sum())
    if total <= 0:
        return np.full(f.size, 1.0 / f.size)
    return f / total


def apply_consistency(
    method: Consistency | str | None,
    estimates: npt.NDArray[np.float64],
    std_errors: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Apply `method` to a raw frequency vector; NONE returns a copy of it."""
    import numpy as np

    m = Consistency.parse(method)
    if m is Consistency.NONE:
        return np.array(estimates, dtype=np.float64, copy=True)
    if m is Consistency.NORM_SUB:
        return norm_sub(estimates)
    if m is Consistency.PROJECT:
        return project_simplex(estimates)
    return base_cut(estimates, std_errors)
