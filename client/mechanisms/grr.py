"""Generalized (k-ary) randomized response, GRR / direct encoding.

Wang, Blocki, Li, Jha, "Locally Differentially Private Protocols for Frequency
Estimation", USENIX Security 2017, Section 4.1 (Direct Encoding):

    p = e^ε / (e^ε + k - 1)     probability of reporting the true value
    q = 1 / (e^ε + k - 1)       probability of reporting any one other value

so p / q = e^ε exactly, and the false answer is uniform over the *other* k-1
values (never the full domain, which would lower the ratio below e^ε).

With n reports and C(v) of them equal to v, the unbiased estimate of v's
frequency f_v is (C(v)/n - q) / (p - q). Its exact variance (ibid., eq. (3)
before the f_v = 0 approximation) is

    Var[f̂_v] = q(1 - q) / (n (p - q)^2)  +  f_v (1 - p - q) / (n (p - q)).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

from fedldp.client.mechanisms.base import (
    CategoryOutput,
    Estimate,
    Mechanism,
    Output,
    OutputDomainError,
    system_random,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass
class CountStatistic:
    """Additive counts per output index, and the number of reports."""

    counts: list[int]
    n: int = 0

    def merge(self, other: CountStatistic) -> None:
        """Add another partial statistic (e.g. another collector's) in place."""
        if len(other.counts) != len(self.counts):
            raise ValueError("cannot merge statistics of different domain sizes")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.n += other.n


@dataclass(frozen=True)
class GRRProbabilities:
    """The probability contract of GRR, computed once."""

    p: float
    q: float = field()


class GRR(Mechanism[int, CountStatistic]):
    """k-ary randomized response over indices 0..k-1."""

    wire_id = "grr"

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon)
        if isinstance(k, bool) or not isinstance(k, int) or k < 2:
            raise ValueError(f"domain size k must be an integer >= 2, got {k!r}")
        self.k = k
        e = math.exp(float(epsilon))
        # Wang et al. 2017, Section 4.1.
        self.p = e / (e + k - 1)
        self.q = 1.0 / (e + k - 1)

    def output_probability(self, true_index: int, output_index: int) -> float:
        """P[output = output_index | value = true_index], the contract tests check."""
        return self.p if output_index == true_index else self.q

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.k:
            raise ValueError(f"value must be an index in [0, {self.k})")
        r = rng if rng is not None else system_random()
        if r.random() < self.p:
            return CategoryOutput(value)
        # Uniform over the other k-1 values: draw from k-1 slots and skip the truth.
        other = r.randrange(self.k - 1)
        return CategoryOutput(other + 1 if other >= value else other)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """Vectorized `perturb` for simulation; same distribution, numpy generator."""
        import numpy as np

        keep = rng.random(values.shape[0]) < self.p
        other = rng.integers(0, self.k - 1, size=values.shape[0])
        other = other + (other >= values)
        return np.where(keep, values, other).astype(np.int64)

    def check_output(self, output: Output) -> None:
        if not isinstance(output, CategoryOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "grr expects a category payload")
        if not 0 <= output.index < self.k:
            raise OutputDomainError("OUT_OF_DOMAIN", f"category index outside [0, {self.k})")

    def new_statistic(self) -> CountStatistic:
        return CountStatistic(counts=[0] * self.k)

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        assert isinstance(output, CategoryOutput)
        statistic.counts[output.index] += 1
        statistic.n += 1

    def variance(self, n: int, frequency: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """Exact Var[f̂_v] at true frequency f_v (Wang et al. 2017, Section 4.1)."""
        p, q = self.p, self.q
        return q * (1 - q) / (n * (p - q) ** 2) + frequency * (1 - p - q) / (n * (p - q))

    def estimate(self, statistic: CountStatistic) -> Estimate:
        import numpy as np

        n = statistic.n
        if n <= 0:
            raise ValueError("cannot estimate from zero reports")
        counts = np.asarray(statistic.counts, dtype=np.float64)
        values = (counts / n - self.q) / (self.p - self.q)
        # Plug-in variance at the estimate, clipped to [0, 1] for the f-dependent term.
        variances = self.variance(n, np.clip(values, 0.0, 1.0))
        return Estimate(n=n, values=values, variances=variances)
