"""Subset selection (SS), k-subset mechanism.

Ye and Barg, "Optimal Schemes for Discrete Distribution Estimation Under
Locally Differential Privacy", IEEE Trans. Inf. Theory 64(8), 2018, Section
III; also Wang, Wu, Hu et al. 2016 ("k-subset"). The device reports a subset S
of [0, k) of fixed size d:

    P[S | v] = e^ε / Z   if v ∈ S,    1 / Z   otherwise,
    Z = C(k-1, d-1) e^ε + C(k-1, d),

so the ratio is e^ε. Equivalently: with probability
p_in = d e^ε / (d e^ε + k - d) include v and d-1 uniform others, else d uniform
others.

What the sampler realizes (exactly; `p_exact`, `exact_probability`): v is
included when a uniform 53-bit integer is below T = floor(p_in 2^53) (p_in
from a 60-digit decimal e^ε, `_common.dyadic_from_exp`); the others are a
uniform subset of the other k - 1 values (`random.sample`, integer draws).
With p_exact = T / 2^53,

    P[S | v] = p_exact / C(k-1, d-1)   if v ∈ S,   (1 - p_exact) / C(k-1, d)   otherwise,

so the realized ratio is T/(2^53 - T) · (k - d)/d, increasing in T, and
T <= p_in 2^53 makes it <= p_in/(1 - p_in) · (k - d)/d = e^ε exactly.
A report supports v when v ∈ S:

    support_p = p_exact,
    support_q = (p_exact (d-1) + (1 - p_exact) d) / (k - 1),

and `oracle.FrequencyOracle` gives the estimator and exact variance. The
default d minimizes the f = 0 variance among the integers next to
k / (e^ε + 1) (Ye and Barg's optimum, Section III-B); policy param "d"
overrides it.

Wire: BitVectorPayload of exactly k bits with exactly d ones (the collector
refuses any other weight). Batch layout: uint8 (n, ceil(k/8)) packed rows.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import (
    add_bit_counts,
    byte_length,
    check_bit_vector,
    check_index,
    column_counts,
    dyadic_from_exp,
    exp_epsilon,
    f0_variance_scalar,
    int_to_bits,
    packed_rows,
)
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CountStatistic,
    Output,
    OutputDomainError,
    system_random,
)
from fedldp.client.mechanisms.oracle import FrequencyOracle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


#: Largest subset size sampled by Floyd's algorithm on the batch path (d numpy
#: steps per chunk); larger subsets use random keys (one pass over k-1 keys).
FLOYD_MAX_D = 300


def _probabilities(e: float, k: int, d: int) -> tuple[float, float]:
    p_in = d * e / (d * e + k - d)
    q = (p_in * (d - 1) + (1 - p_in) * d) / (k - 1)
    return p_in, q


def default_subset_size(epsilon: Decimal, k: int) -> int:
    """The d near k/(e^ε + 1) with the least f = 0 variance (ties: the smaller d)."""
    e = exp_epsilon(epsilon)
    center = k / (e + 1.0)
    low, high = math.floor(center), math.ceil(center)
    candidates = {min(k - 1, max(1, c)) for c in (low - 1, low, high, high + 1)}

    def cost(d: int) -> tuple[float, int]:
        p, q = _probabilities(e, k, d)
        return (f0_variance_scalar(p, q), d)

    return min(candidates, key=cost)


class SubsetSelection(FrequencyOracle):
    """Report a random d-subset biased toward the true value."""

    wire_id = "ss"

    def __init__(self, epsilon: Decimal, k: int, d: int | None = None) -> None:
        super().__init__(epsilon, k)
        if d is None:
            d = default_subset_size(epsilon, k)
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= k - 1:
            raise ValueError(f"ss subset size d must be an integer in [1, {k - 1}], got {d!r}")
        self.d = d
        # Ye and Barg 2018, Section III: p_in = d e^ε / (d e^ε + k - d), rounded down.
        self.include = dyadic_from_exp(lambda e: d * e / (d * e + k - d), epsilon)
        self.p_exact = self.include.exact
        self.support_p = float(self.p_exact)
        self.support_q = float((self.p_exact * (d - 1) + (1 - self.p_exact) * d) / (k - 1))

    def exact_probability(self, value: int, output: Output) -> Fraction:
        bits = check_bit_vector(output, self.k, name="ss")
        if bits.bit_count() != self.d:
            return Fraction(0)
        if (bits >> value) & 1:
            return self.p_exact / math.comb(self.k - 1, self.d - 1)
        return (1 - self.p_exact) / math.comb(self.k - 1, self.d)

    def outputs(self) -> Iterator[Output]:
        for subset in itertools.combinations(range(self.k), self.d):
            yield int_to_bits(sum(1 << i for i in subset), self.k)

    def perturb(self, value: int, *, rng: random.Random | None = None) -> BitVectorOutput:
        check_index(value, self.k)
        r = rng if rng is not None else system_random()
        include = self.include.draw(r)
        chosen = r.sample(range(self.k - 1), self.d - 1 if include else self.d)
        bits = 1 << value if include else 0
        for j in chosen:
            bits |= 1 << (j + 1 if j >= value else j)
        return int_to_bits(bits, self.k)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.uint8]:
        """Packed rows (n, ceil(k/8)), the same law as `perturb`.

        Uniform subsets of the other k-1 values, from integer draws only: by
        Floyd's algorithm (Bentley and Floyd, CACM 1987) vectorized over rows
        when d <= FLOYD_MAX_D, else by random keys (`_keys_chunk`).
        """
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.k):
            raise ValueError(f"values must be indices in [0, {self.k})")
        n, k = values.shape[0], self.k
        out = np.empty((n, byte_length(k)), dtype=np.uint8)
        # Chunks of about 2 MiB of booleans keep the per-step passes in cache.
        chunk = max(1, (1 << 21) // k)
        sampler = self._floyd_chunk if self.d <= FLOYD_MAX_D else self._keys_chunk
        columns = np.arange(k)[None, :]
        for start in range(0, n, chunk):
            v = values[start : start + chunk]
            rows = v.shape[0]
            include = self.include.draw_batch(rows, rng)
            chosen = sampler(rows, include, rng)  # (rows, k - 1): the other values picked
            # Other j is value j + (j >= v): columns above v take chosen[:, c - 1].
            mask = np.zeros((rows, k), dtype=bool)
            mask[:, : k - 1] = chosen
            above = (columns > v[:, None])[:, 1:]
            mask[:, 1:][above] = chosen[above]
            mask[np.arange(rows), v] = include
            out[start : start + rows] = np.packbits(mask, axis=1, bitorder="little")
        return out

    def _floyd_chunk(
        self, rows: int, include: npt.NDArray[np.bool_], rng: np.random.Generator
    ) -> npt.NDArray[np.bool_]:
        import numpy as np

        others, d = self.k - 1, self.d
        index = np.arange(rows)
        chosen = np.zeros((rows, others), dtype=bool)
        for j in range(others - d + 1, others):  # a uniform (d-1)-subset
            t = rng.integers(0, j + 1, size=rows)
            t = np.where(chosen[index, t], j, t)
            chosen[index, t] = True
        pending = np.flatnonzero(~include)
        while pending.size:  # rows without the truth: one more uniform free element
            t = rng.integers(0, others, size=pending.size)
            free = ~chosen[pending, t]
            chosen[pending[free], t[free]] = True
            pending = pending[~free]
        return chosen

    def _keys_chunk(
        self, rows: int, include: npt.NDArray[np.bool_], rng: np.random.Generator
    ) -> npt.NDArray[np.bool_]:
        """Per row, the d others with the smallest of k-1 uniform 64-bit keys,
        less one uniform member of them where the truth is included.

        The keys are exchangeable, so given that no key outside the d smallest
        equals the d-th smallest (a row where one does is drawn again:
        probability below k 2^-64) the d smallest form a uniform d-subset, and
        removing a uniform member of a uniform d-subset leaves a uniform
        (d-1)-subset.
        """
        import numpy as np

        others, d = self.k - 1, self.d
        order = np.empty((rows, d), dtype=np.intp)
        pending = np.arange(rows)
        while pending.size:
            keys = rng.integers(
                0,
                np.uint64(0xFFFFFFFFFFFFFFFF),
                size=(pending.size, others),
                dtype=np.uint64,
                endpoint=True,
            )
            part = np.argpartition(keys, d - 1, axis=1)  # position d-1: the d-th smallest
            kth = np.take_along_axis(keys, part[:, d - 1 : d], axis=1)
            clean = np.count_nonzero(keys <= kth, axis=1) == d
            order[pending[clean]] = part[clean, :d]
            pending = pending[~clean]
        take = np.ones((rows, d), dtype=bool)
        dropped = rng.integers(0, d, size=rows)
        take[np.flatnonzero(include), dropped[include]] = False
        chosen = np.zeros((rows, others), dtype=bool)
        row_index = np.broadcast_to(np.arange(rows)[:, None], (rows, d))
        chosen[row_index[take], order[take]] = True
        return chosen

    def check_output(self, output: Output) -> None:
        bits = check_bit_vector(output, self.k, name="ss")
        if bits.bit_count() != self.d:
            raise OutputDomainError("OUT_OF_DOMAIN", f"ss expects exactly {self.d} bits set")

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, BitVectorOutput)
        add_bit_counts(statistic, int.from_bytes(output.bits, "little"))

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add packed rows (n, ceil(k/8)) uint8, as from `perturb_batch`."""
        outputs = packed_rows(outputs, self.k, name="ss")
        counts = column_counts(outputs, self.k)
        if int(counts.sum()) != self.d * outputs.shape[0]:
            raise OutputDomainError("OUT_OF_DOMAIN", f"ss expects exactly {self.d} bits set")
        self._add_counts(statistic, counts, outputs.shape[0])


__all__ = ["SubsetSelection", "default_subset_size"]
