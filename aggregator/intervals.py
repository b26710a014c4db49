"""Confidence bounds and critical values: the one home of each formula the aggregator uses.

- **Clopper–Pearson** (exact binomial; Clopper and Pearson, "The use of confidence
  or fiducial limits illustrated in the case of the binomial", Biometrika 1934):
  for k successes in n trials the one-sided lower bound at tail `level` is the
  `level` quantile of Beta(k, n − k + 1) (0 when k = 0), the upper bound the
  1 − `level` quantile of Beta(k + 1, n − k) (1 when k = n); the quantile is
  `scipy.special.betaincinv`, the inverse regularized incomplete beta function
  (the function `scipy.stats.beta.ppf` evaluates, without its per-call overhead). The two-sided
  interval at confidence c puts (1 − c)/2 in each tail. Used by the mechanism
  auditor (aggregator/audit_ldp/stats.py) and the membership audit
  (aggregator/training/audit.py).
- **Bonferroni normal critical value** z = Φ⁻¹(1 − α/m): the one-sided normal
  quantile that keeps the family-wise error of m tests at α (Bonferroni
  inequality; e.g. Casella and Berger 2002, §11.2.5). Used by `z_value`
  (aggregator/estimation.py), heavy-hitter detection and Base-Cut
  (aggregator/consistency.py).

The module imports nothing heavy at import time (numpy and scipy are imported by
the Clopper–Pearson functions when called), so the light report path
(aggregator/estimation.py) can use it.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]


def cp_lower(successes: IntArray | int, n: int, level: float) -> FloatArray:
    """One-sided Clopper–Pearson lower bound: P[p < bound] <= `level`.

    Element-wise over `successes` (an int or an int array, each in [0, n]); a float
    array of the same shape, exactly 0.0 where there are 0 successes.
    """
    import numpy as np
    from scipy import special

    x = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bound = special.betaincinv(x, n - x + 1.0, level)
    return np.asarray(np.where(x > 0, bound, 0.0), dtype=np.float64)


def cp_upper(successes: IntArray | int, n: int, level: float) -> FloatArray:
    """One-sided Clopper–Pearson upper bound: P[p > bound] <= `level`.

    Element-wise as `cp_lower`; exactly 1.0 where all n trials succeeded.
    """
    import numpy as np
    from scipy import special

    x = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        bound = special.betaincinv(x + 1.0, n - x, 1.0 - level)
    return np.asarray(np.where(x < n, bound, 1.0), dtype=np.float64)


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval (lo, hi) of the proportion k/n at confidence `level`.

    Each tail holds (1 − level)/2: lo = cp_lower(k, n, (1 − level)/2) (0 when k = 0),
    hi = cp_upper(k, n, (1 − level)/2) (1 when k = n); 0 <= lo <= k/n <= hi <= 1.
    """
    tail = (1 - level) / 2
    return float(cp_lower(k, n, tail)), float(cp_upper(k, n, tail))


def bonferroni_z(alpha: float, tests: int = 1) -> float:
    """Φ⁻¹(1 − α/tests): the one-sided standard-normal critical value of one of `tests`
    simultaneous tests at family-wise level α (stdlib `NormalDist`, no scipy).

    The caller checks 0 < α < 1 and tests >= 1; StatisticsError otherwise.
    """
    return NormalDist().inv_cdf(1.0 - alpha / tests)
