"""Generalized (k-ary) randomized response, GRR / direct encoding.

Wang, Blocki, Li, Jha, "Locally Differentially Private Protocols for Frequency
Estimation", USENIX Security 2017, Section 4.1 (Direct Encoding):

    p = e^ε / (e^ε + k - 1)     probability of reporting the true value
    q = 1 / (e^ε + k - 1)       probability of reporting any one other value

so p / q = e^ε, and the false answer is uniform over the *other* k-1 values
(never the full domain, which would add (1 - p)/k to the truth's mass and
raise the ratio to 1 + k p/(1 - p) > e^ε).

What the sampler realizes (exactly; `p_exact`, `q_exact`, `exact_probability`):
the truth is kept when a uniform 53-bit integer is below T = floor(p · 2^53)
(p bracketed from a 60-digit decimal e^ε, `_common.dyadic_from_exp`), so

    p_exact = T / 2^53,   q_exact = (1 - p_exact) / (k - 1),

and the other value is `randrange(k - 1)` (exact). The realized ratio
p_exact / q_exact = T (k - 1) / (2^53 - T) is increasing in T and T <= p 2^53,
so it is <= e^ε exactly, and within about 2^-53 / (p (1 - p)) of it.

With n reports and C(v) of them equal to v, the unbiased estimate of v's
frequency f_v is (C(v)/n - q)/(p - q). Its exact variance (ibid., eq. (3)
before the f_v = 0 approximation) is

    Var[f̂_v] = q(1 - q) / (n (p - q)^2)  +  f_v (1 - p - q) / (n (p - q)),

which equals the support-count form of `oracle.FrequencyOracle`; the
estimator uses the realized p_exact, q_exact, so it is unbiased for the law
actually sampled.

Wire: CategoryPayload, index in [0, k). Batch layout: int64 array of indices.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import (
    category_counts,
    check_category,
    check_index,
    count_category,
    dyadic_from_exp,
)
from fedldp.client.mechanisms.base import (
    CategoryOutput,
    CountStatistic,
    Output,
    system_random,
)
from fedldp.client.mechanisms.oracle import FrequencyOracle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["GRR", "CountStatistic"]


class GRR(FrequencyOracle):
    """k-ary randomized response over indices 0..k-1."""

    wire_id = "grr"

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        # Wang et al. 2017, Section 4.1: p = e^ε / (e^ε + k - 1), rounded down.
        self.keep = dyadic_from_exp(lambda e: e / (e + k - 1), epsilon)
        self.p_exact = self.keep.exact
        self.q_exact = (1 - self.p_exact) / (k - 1)
        self.p = float(self.p_exact)
        self.q = float(self.q_exact)
        self.support_p = self.p
        self.support_q = self.q

    def exact_probability(self, value: int, output: Output) -> Fraction:
        assert isinstance(output, CategoryOutput)
        return self.p_exact if output.index == value else self.q_exact

    def outputs(self) -> Iterator[Output]:
        return (CategoryOutput(i) for i in range(self.k))

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        check_index(value, self.k)
        r = rng if rng is not None else system_random()
        if self.keep.draw(r):
            return CategoryOutput(value)
        # Uniform over the other k-1 values: draw from k-1 slots and skip the truth.
        other = r.randrange(self.k - 1)
        return CategoryOutput(other + 1 if other >= value else other)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """Vectorized `perturb` for simulation; the same law, numpy generator."""
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.k):
            raise ValueError(f"values must be indices in [0, {self.k})")
        keep = self.keep.draw_batch(values.shape[0], rng)
        other = rng.integers(0, self.k - 1, size=values.shape[0], dtype=np.int64)
        other += other >= values
        return np.where(keep, values, other)

    def check_output(self, output: Output) -> None:
        check_category(output, self.k, name="grr", what="category index")

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.check_output(output)
        count_category(statistic, output)

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add an int array of output indices (as from `perturb_batch`)."""
        self._add_counts(statistic, *category_counts(outputs, self.k, what="category index"))
