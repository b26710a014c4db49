"""Hadamard response (HR).

Acharya, Sun, Zhang, "Hadamard Response: Estimating Distributions Privately,
Efficiently, and with Little Communication", AISTATS 2019, Section 3 (the
single-block scheme, their choice for ε <= 1). Let K be the smallest power of
two > k and H the K x K Sylvester Hadamard matrix, H[i][j] = (-1)^popcount(i & j).
Value v owns row v + 1 (row 0 is all ones) and the set

    C_v = { y in [0, K) : H[v+1][y] = +1 },   |C_v| = K/2.

The device reports y in [0, K):

    P[y | v] = 2 e^ε / (K (e^ε + 1))   for y in C_v,
               2 / (K (e^ε + 1))       otherwise,

so the ratio is e^ε. Rows are orthogonal, so |C_v ∩ C_x| = K/4 for
v != x: a report supports v when y ∈ C_v, with

    support_p = e^ε / (e^ε + 1),   support_q = 1/2,

and the support-count estimator and variance of `oracle.FrequencyOracle`
apply; at f_v = 0, n·Var = (e^ε + 1)^2 / (e^ε - 1)^2 (ibid., Theorem 2's leading
term), never below OUE's 4 e^ε / (e^ε - 1)^2 but with log2(K) bits per report.

The statistic counts outputs y (K counters); C(v) = (n + W[v+1]) / 2 with W the
fast Walsh–Hadamard transform of those counts, O(K log K).

Sampling is exact and branch-free in the value: the side is "in C_v" when a
uniform 53-bit integer is below T = floor(p_in 2^53), p_in = e^ε/(e^ε + 1)
(from a 60-digit decimal e^ε, `_common.dyadic_from_exp`); draw y uniformly in
[0, K) (`randrange`); if y is on the wrong side, flip bit `lowbit(v + 1)` of y,
which toggles the parity of popcount((v+1) & y) and is a bijection between
C_v and its complement. So the realized law (`p_exact`, `exact_probability`) is
P[y | v] = 2 p_exact / K on C_v and 2 (1 - p_exact) / K off it, p_exact =
T / 2^53, and the realized ratio T / (2^53 - T) <= e^ε exactly (increasing in
T, T <= p_in 2^53); support_p = p_exact, support_q = 1/2 exactly.

Wire: CategoryPayload, index in [0, K). Batch layout: int64 array of y.
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


def _parity(x: int) -> int:
    return bin(x).count("1") & 1


def fwht(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Unnormalized fast Walsh–Hadamard transform (length a power of two)."""
    import numpy as np

    out = np.array(values, dtype=np.float64)
    size = out.shape[0]
    h = 1
    while h < size:
        view = out.reshape(-1, 2, h)
        first = view[:, 0, :].copy()
        view[:, 0, :] += view[:, 1, :]
        view[:, 1, :] = first - view[:, 1, :]
        h *= 2
    return out


class HadamardResponse(FrequencyOracle):
    """Hadamard response over [0, k), outputs in [0, K), K = 2^ceil(log2(k + 1))."""

    wire_id = "hr"

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self.K = 1 << k.bit_length()  # smallest power of two > k
        # Acharya, Sun, Zhang 2019, Section 3: p_in = e^ε / (e^ε + 1), rounded down.
        self.inside = dyadic_from_exp(lambda e: e / (e + 1), epsilon)
        self.p_exact = self.inside.exact
        self.support_p = float(self.p_exact)
        self.support_q = 0.5

    def in_set(self, value: int, y: int) -> bool:
        """y ∈ C_value."""
        return _parity((value + 1) & y) == 0

    def exact_probability(self, value: int, output: Output) -> Fraction:
        assert isinstance(output, CategoryOutput)
        side = self.p_exact if self.in_set(value, output.index) else 1 - self.p_exact
        return 2 * side / self.K

    def outputs(self) -> Iterator[Output]:
        return (CategoryOutput(y) for y in range(self.K))

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        check_index(value, self.k)
        r = rng if rng is not None else system_random()
        want_in = self.inside.draw(r)
        y = r.randrange(self.K)
        row = value + 1
        if self.in_set(value, y) != want_in:
            y ^= row & -row
        return CategoryOutput(y)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """int64 outputs y, the same law as `perturb`."""
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.k):
            raise ValueError(f"values must be indices in [0, {self.k})")
        n = values.shape[0]
        want_in = self.inside.draw_batch(n, rng)
        y = rng.integers(0, self.K, size=n, dtype=np.int64)
        row = values + 1
        folded = row & y
        shift = 32
        while shift:
            folded ^= folded >> shift
            shift //= 2
        is_in = (folded & 1) == 0
        y ^= np.where(is_in != want_in, row & -row, 0)
        return np.asarray(y, dtype=np.int64)

    def check_output(self, output: Output) -> None:
        check_category(output, self.K, name="hr", what="hr output")

    def statistic_size(self) -> int:
        return self.K

    def support_counts(self, statistic: CountStatistic) -> npt.NDArray[np.float64]:
        import numpy as np

        transform = fwht(np.asarray(statistic.counts, dtype=np.float64))
        return np.rint((statistic.n + transform[1 : self.k + 1]) / 2.0)

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.check_output(output)
        count_category(statistic, output)

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add an int array of outputs y (as from `perturb_batch`)."""
        self._add_counts(statistic, *category_counts(outputs, self.K, what="hr output"))


__all__ = ["HadamardResponse", "fwht"]
