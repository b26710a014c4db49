"""TEST FIXTURE ONLY: the floating-point numeric mechanisms as they shipped before issue 14.

These emit a double computed from the input, so the bits of the wire value leak
the input (Mironov, CCS 2012): e.g. piecewise at ε = 1 emits, for an input at one
end of the range, outputs in [1, 2) with an odd last mantissa bit that never
occur for the other end. They are kept, unchanged apart from their names, as the
broken variants that the exact privacy checks (tests/client/mechanisms) and the
black-box auditor (`fedldp verify mechanism`) must reject. Never ship or
register them.
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from fedldp.client.mechanisms.base import (
    Estimate,
    Mechanism,
    MomentStatistic,
    NumericOutput,
    Output,
    OutputDomainError,
    system_random,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Relative slack on output-range checks: a device in another language may
#: compute C or B from its own exp() one ulp apart.
RANGE_SLACK = 1e-9
#: Wang et al. ICDE 2019, Section III-C: below ε* the hybrid is pure Duchi.
HYBRID_EPSILON_STAR = 0.61


class LegacyNumericMechanism(Mechanism[float, MomentStatistic]):
    """Shared frame: range, clipping, normalization, statistic, estimator."""

    _name: ClassVar[str]

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon)
        for name, bound in (("lo", lo), ("hi", hi)):
            if not isinstance(bound, Decimal):
                raise TypeError(f"{name} must be a decimal.Decimal (exact)")
            if not bound.is_finite():
                raise ValueError(f"{name} must be finite, got {bound}")
        if lo >= hi:
            raise ValueError(f"numeric range needs lo < hi, got lo={lo}, hi={hi}")
        self.lo = lo
        self.hi = hi
        self._lo = float(lo)
        self._hi = float(hi)
        self._eps = float(epsilon)
        #: Half the range width: t units to value units.
        self.scale = (self._hi - self._lo) / 2.0

    # --- clipping and normalization ---

    def clip(self, value: float | int | Decimal) -> tuple[float, bool]:
        """(value clipped to [lo, hi] as a float, whether it was clipped)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
            raise TypeError("value must be a real number (int, float or Decimal)")
        finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
        if not finite:
            raise ValueError("value must be finite")
        if value < self.lo:
            return self._lo, True
        if value > self.hi:
            return self._hi, True
        return float(value), False

    def normalize(self, clipped: float) -> float:
        """Map a value in [lo, hi] to t in [-1, 1]."""
        t = 2.0 * (clipped - self._lo) / (self._hi - self._lo) - 1.0
        return min(1.0, max(-1.0, t))

    # --- device ---

    @abstractmethod
    def randomize(self, t: float, rng: random.Random) -> float:
        """t* for one t in [-1, 1]."""

    def perturb(self, value: float, *, rng: random.Random | None = None) -> NumericOutput:
        """Clip, normalize and randomize one value (see `perturb_with_clip`)."""
        return self.perturb_with_clip(value, rng=rng)[0]

    def perturb_with_clip(
        self, value: float | int | Decimal, *, rng: random.Random | None = None
    ) -> tuple[NumericOutput, bool]:
        """(the report, whether the value had to be clipped to [lo, hi])."""
        clipped, was_clipped = self.clip(value)
        r = rng if rng is not None else system_random()
        return NumericOutput(self.randomize(self.normalize(clipped), r)), was_clipped

    @abstractmethod
    def randomize_batch(
        self, t: npt.NDArray[np.float64], rng: np.random.Generator
    ) -> npt.NDArray[np.float64]:
        """t* for an array of t in [-1, 1]."""

    def normalize_batch(self, values: Any) -> npt.NDArray[np.float64]:
        """Clip an array of values to [lo, hi] and map it to t (NaN raises)."""
        import numpy as np

        x = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite")
        x = np.clip(x, self._lo, self._hi)
        return np.clip(2.0 * (x - self._lo) / (self._hi - self._lo) - 1.0, -1.0, 1.0)

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        """float64 t* for an array of values (clipped like `perturb`)."""
        return self.randomize_batch(self.normalize_batch(values), rng)

    # --- collector ---

    @abstractmethod
    def _check_range(self, y: float) -> None:
        """Raise OutputDomainError when finite y is not a possible output."""

    def check_output(self, output: Output) -> None:
        if not isinstance(output, NumericOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", f"{self._name} expects a numeric payload")
        y = output.value
        if not isinstance(y, float) or not math.isfinite(y):
            raise OutputDomainError("NON_FINITE", f"{self._name} output must be a finite double")
        self._check_range(y)

    def new_statistic(self) -> MomentStatistic:
        return MomentStatistic()

    def accumulate(self, statistic: MomentStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, NumericOutput)
        statistic.add(output.value)

    def accumulate_batch(self, statistic: MomentStatistic, outputs: Any) -> None:
        """Add a float64 array of t* (as from `perturb_batch`)."""
        import numpy as np

        y = np.asarray(outputs, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise OutputDomainError("NON_FINITE", f"{self._name} output must be a finite double")
        statistic.add_many(y.tolist())

    # --- aggregator ---

    @abstractmethod
    def conditional_variance(self, t: Any) -> Any:
        """Var[t* | t], exact, in t units (array or scalar)."""

    @abstractmethod
    def _plug_in_variance(self, statistic: MomentStatistic) -> float:
        """Estimated mean of Var[t* | t_i] over users (see the module docstring)."""

    def variance(self, values: Any) -> float:
        """Exact variance of the mean estimate for a population with these values."""
        import numpy as np

        t = self.normalize_batch(values)
        n = t.shape[0]
        if n == 0:
            raise ValueError("cannot compute a variance for zero values")
        return float(self.scale**2 * np.sum(self.conditional_variance(t)) / n**2)

    def estimate(self, statistic: MomentStatistic) -> Estimate:
        import numpy as np

        n = statistic.n
        if n <= 0:
            raise ValueError("cannot estimate from zero reports")
        mean_t = statistic.total / n
        mean = self._lo + self.scale * (mean_t + 1.0)
        var = self.scale**2 * self._plug_in_variance(statistic) / n
        return Estimate(n=n, values=np.array([mean]), variances=np.array([var]))

    # --- tests ---

    @abstractmethod
    def output_probability(self, t: float, y: float) -> float:
        """Probability mass of the atom y (duchi) or density at y (others), given t."""

    @abstractmethod
    def output_cdf(self, t: float, y: float) -> float:
        """P[t* <= y | t]."""


class LegacyDuchi(LegacyNumericMechanism):
    """Duchi et al.'s one-dimensional mechanism: t* = ±B."""

    wire_id = "duchi"
    _name = "duchi"

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon, lo, hi)
        e = math.exp(self._eps)
        self.B = (e + 1.0) / (e - 1.0)

    def prob_plus(self, t: Any) -> Any:
        """P[t* = +B | t] = 1/2 + t (e^ε - 1)/(2 (e^ε + 1)) (Wang et al. ICDE 2019, Alg. 1)."""
        return 0.5 + t / (2.0 * self.B)

    def randomize(self, t: float, rng: random.Random) -> float:
        return self.B if rng.random() < self.prob_plus(t) else -self.B

    def randomize_batch(
        self, t: npt.NDArray[np.float64], rng: np.random.Generator
    ) -> npt.NDArray[np.float64]:
        import numpy as np

        return np.where(rng.random(t.shape[0]) < self.prob_plus(t), self.B, -self.B)

    def _check_range(self, y: float) -> None:
        if abs(abs(y) - self.B) > RANGE_SLACK * self.B:
            raise OutputDomainError("OUT_OF_DOMAIN", "duchi output must be +B or -B")

    def conditional_variance(self, t: Any) -> Any:
        return self.B**2 - t * t

    def _plug_in_variance(self, statistic: MomentStatistic) -> float:
        return self.B**2  # worst case t = 0: an upper bound

    def output_probability(self, t: float, y: float) -> float:
        return float(self.prob_plus(t)) if y > 0 else 1.0 - float(self.prob_plus(t))

    def output_cdf(self, t: float, y: float) -> float:
        if y < -self.B:
            return 0.0
        if y < self.B:
            return 1.0 - float(self.prob_plus(t))
        return 1.0


class LegacyPiecewise(LegacyNumericMechanism):
    """Wang et al.'s Piecewise Mechanism: t* in [-C, C]."""

    wire_id = "piecewise"
    _name = "piecewise"

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon, lo, hi)
        self.e_half = math.exp(self._eps / 2.0)
        self.C = (self.e_half + 1.0) / (self.e_half - 1.0)
        self.p_center = self.e_half / (self.e_half + 1.0)
        #: Density on [l(t), r(t)] (Wang et al. ICDE 2019, Section III-B).
        self.density_high = (math.exp(self._eps) - self.e_half) / (2.0 * self.e_half + 2.0)
        self.density_low = self.density_high / math.exp(self._eps)

    def bounds(self, t: Any) -> tuple[Any, Any]:
        """(l(t), r(t))."""
        left = (self.C + 1.0) / 2.0 * t - (self.C - 1.0) / 2.0
        return left, left + self.C - 1.0

    def randomize(self, t: float, rng: random.Random) -> float:
        left, right = (float(x) for x in self.bounds(t))
        if rng.random() < self.p_center:
            return left + (right - left) * rng.random()
        z = rng.random() * (self.C + 1.0)  # total length outside [l, r]
        below = left + self.C
        return -self.C + z if z < below else right + (z - below)

    def randomize_batch(
        self, t: npt.NDArray[np.float64], rng: np.random.Generator
    ) -> npt.NDArray[np.float64]:
        import numpy as np

        left, right = self.bounds(t)
        center = rng.random(t.shape[0]) < self.p_center
        u = rng.random(t.shape[0])
        inside = left + (right - left) * u
        z = u * (self.C + 1.0)
        below = left + self.C
        outside = np.where(z < below, -self.C + z, right + (z - below))
        return np.where(center, inside, outside)

    def _check_range(self, y: float) -> None:
        if abs(y) > self.C * (1.0 + RANGE_SLACK):
            raise OutputDomainError("OUT_OF_DOMAIN", "piecewise output outside [-C, C]")

    def conditional_variance(self, t: Any) -> Any:
        eh = self.e_half
        return t * t / (eh - 1.0) + (eh + 3.0) / (3.0 * (eh - 1.0) ** 2)

    def _plug_in_variance(self, statistic: MomentStatistic) -> float:
        # E[t*^2 | t] = t^2 e^{ε/2}/(e^{ε/2} - 1) + c, so Σ t^2 is estimable without bias.
        eh = self.e_half
        c = (eh + 3.0) / (3.0 * (eh - 1.0) ** 2)
        mean_sq = (statistic.total_sq / statistic.n - c) * (eh - 1.0) / eh
        return float(self.conditional_variance(math.sqrt(min(1.0, max(0.0, mean_sq)))))

    def output_probability(self, t: float, y: float) -> float:
        if abs(y) > self.C:
            return 0.0
        left, right = (float(x) for x in self.bounds(t))
        return self.density_high if left <= y <= right else self.density_low

    def output_cdf(self, t: float, y: float) -> float:
        left, right = (float(x) for x in self.bounds(t))
        y = min(max(y, -self.C), self.C)
        low_left = (min(y, left) + self.C) * self.density_low
        mid = max(0.0, min(y, right) - left) * self.density_high
        high = max(0.0, y - right) * self.density_low
        return min(1.0, low_left + mid + high)


class LegacyHybrid(LegacyNumericMechanism):
    """Wang et al.'s Hybrid Mechanism: piecewise w.p. α, Duchi otherwise."""

    wire_id = "hybrid"
    _name = "hybrid"

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon, lo, hi)
        self.pm = LegacyPiecewise(epsilon, lo, hi)
        self.duchi = LegacyDuchi(epsilon, lo, hi)
        # Wang et al. ICDE 2019, Section III-C, eq. (5).
        self.alpha = 1.0 - math.exp(-self._eps / 2.0) if self._eps > HYBRID_EPSILON_STAR else 0.0

    def randomize(self, t: float, rng: random.Random) -> float:
        if rng.random() < self.alpha:
            return self.pm.randomize(t, rng)
        return self.duchi.randomize(t, rng)

    def randomize_batch(
        self, t: npt.NDArray[np.float64], rng: np.random.Generator
    ) -> npt.NDArray[np.float64]:
        import numpy as np

        use_pm = rng.random(t.shape[0]) < self.alpha
        return np.where(use_pm, self.pm.randomize_batch(t, rng), self.duchi.randomize_batch(t, rng))

    def _check_range(self, y: float) -> None:
        if self.alpha == 0.0:
            self.duchi._check_range(y)
        elif abs(y) > self.pm.C * (1.0 + RANGE_SLACK):
            raise OutputDomainError("OUT_OF_DOMAIN", "hybrid output outside [-C, C]")

    def conditional_variance(self, t: Any) -> Any:
        return self.alpha * self.pm.conditional_variance(t) + (
            1.0 - self.alpha
        ) * self.duchi.conditional_variance(t)

    def _plug_in_variance(self, statistic: MomentStatistic) -> float:
        if self.alpha == 0.0:
            return self.duchi.B**2  # worst case t = 0, as for duchi
        return float(self.conditional_variance(0.0))  # independent of t (Lemma 3)

    def is_atom(self, y: float) -> bool:
        """Whether y is one of Duchi's two outputs (a point mass)."""
        return abs(abs(y) - self.duchi.B) <= RANGE_SLACK * self.duchi.B

    def output_probability(self, t: float, y: float) -> float:
        if self.is_atom(y):
            return (1.0 - self.alpha) * self.duchi.output_probability(t, y)
        return self.alpha * self.pm.output_probability(t, y)

    def output_cdf(self, t: float, y: float) -> float:
        return self.alpha * self.pm.output_cdf(t, y) + (1.0 - self.alpha) * self.duchi.output_cdf(
            t, y
        )


class LegacyLaplace(LegacyNumericMechanism):
    """Local Laplace on the clipped, normalized value: t* = t + Lap(2/ε)."""

    wire_id = "laplace"
    _name = "laplace"

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon, lo, hi)
        self.b = 2.0 / self._eps

    def randomize(self, t: float, rng: random.Random) -> float:
        # Difference of two Exp(1/b) draws is Laplace(0, b).
        return t + self.b * (rng.expovariate(1.0) - rng.expovariate(1.0))

    def randomize_batch(
        self, t: npt.NDArray[np.float64], rng: np.random.Generator
    ) -> npt.NDArray[np.float64]:
        return t + rng.laplace(0.0, self.b, size=t.shape[0])

    def _check_range(self, y: float) -> None:
        return None  # any finite double

    def conditional_variance(self, t: Any) -> Any:
        return 2.0 * self.b**2 + 0.0 * t

    def _plug_in_variance(self, statistic: MomentStatistic) -> float:
        return 2.0 * self.b**2

    def output_probability(self, t: float, y: float) -> float:
        return math.exp(-abs(y - t) / self.b) / (2.0 * self.b)

    def output_cdf(self, t: float, y: float) -> float:
        z = (y - t) / self.b
        return 0.5 * math.exp(z) if z < 0 else 1.0 - 0.5 * math.exp(-z)


__all__ = [
    "LegacyDuchi",
    "LegacyHybrid",
    "LegacyLaplace",
    "LegacyNumericMechanism",
    "LegacyPiecewise",
]
