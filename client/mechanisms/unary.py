"""Unary encodings: optimized unary encoding (OUE) and symmetric unary encoding (SUE).

Wang, Blocki, Li, Jha, USENIX Security 2017, Section 4.2 (Unary Encoding). The
value v is one-hot encoded in k bits and every bit is reported independently:

    P[bit i = 1] = p   if i = v,     q   otherwise.

The laws of two inputs differ in exactly two bits, so the largest privacy
ratio is p(1 - q) / ((1 - p) q), which both variants set to e^ε:

* SUE (basic one-hash RAPPOR, Erlingsson et al. CCS 2014, without memoization):
  p = e^{ε/2} / (e^{ε/2} + 1), q = 1 / (e^{ε/2} + 1)   (Wang et al. 2017, 4.2).
* OUE: p = 1/2, q = 1 / (e^ε + 1), minimizing the f = 0 variance
  4 e^ε / (n (e^ε - 1)^2)  (Wang et al. 2017, Section 4.2, eq. (6)).

What the samplers realize (exactly; `p_exact`, `q_exact`): every bit is a
comparison of a uniform 53-bit integer with a threshold (`_common.bernoulli_bits`,
`DyadicProbability.draw`), p rounded DOWN and q rounded UP to multiples of
2^-53 (`_common.dyadic_from_exp`, from a 60-digit decimal e^ε; OUE's p = 1/2 is
exact). The ratio above increases with p and decreases with q, so the realized
ratio is <= e^ε exactly, and below it by a relative 2^-53 (1/(p(1-p)) +
1/(q(1-q))) at most. (SUE stays symmetric: floor(p 2^53) + ceil((1 - p) 2^53)
= 2^53.)

Bit v supports v: support_p = p_exact, support_q = q_exact
(`oracle.FrequencyOracle`).

Wire: BitVectorPayload of exactly k bits (ceil(k/8) bytes, padding zero) — the
size never depends on the value. Batch layout: uint8 array (n, ceil(k/8)) of
packed little-endian rows, produced by the bit-sliced sampler
`_common.bernoulli_words` (the same comparison as the device path, word-parallel),
then the true bit redrawn with probability p (`DyadicProbability.draw_batch`).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from fedldp.client.mechanisms._common import (
    DyadicProbability,
    add_bit_counts,
    bernoulli_bits,
    bernoulli_read_bytes,
    bernoulli_words,
    byte_length,
    check_bit_vector,
    check_index,
    column_counts,
    dyadic_from_exp,
    half,
    int_to_bits,
    packed_rows,
    words_to_bytes,
)
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CountStatistic,
    Output,
    system_random,
)
from fedldp.client.mechanisms.oracle import FrequencyOracle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


#: Words of packed bits sampled per chunk by `unary_bits_batch` (speed only).
CHUNK_WORDS = 1 << 16


def unary_bits_batch(
    values: npt.NDArray[np.int64],
    k: int,
    p: DyadicProbability,
    q: DyadicProbability,
    rng: np.random.Generator,
) -> npt.NDArray[np.uint8]:
    """Packed rows: bit i ~ Bernoulli(q) for i != value, Bernoulli(p) for i = value, exactly."""
    import numpy as np

    values = np.asarray(values, dtype=np.int64)
    if values.size and (values.min() < 0 or values.max() >= k):
        raise ValueError(f"values must be indices in [0, {k})")
    n = values.shape[0]
    out = np.empty((n, byte_length(k)), dtype=np.uint8)
    # Chunks of CHUNK_WORDS words keep the sampler's passes in cache.
    chunk = max(1, CHUNK_WORDS // ((k + 63) // 64))
    for start in range(0, n, chunk):
        v = values[start : start + chunk]
        rows = v.shape[0]
        words = bernoulli_words(q, rows, k, rng)
        index = np.arange(rows)
        word_index = v >> 6
        bit = (v & 63).astype(np.uint64)
        truth = np.asarray(p.draw_batch(rows, rng), dtype=np.uint64)
        current = words[index, word_index]
        current &= ~(np.uint64(1) << bit)
        current |= truth << bit
        words[index, word_index] = current
        out[start : start + rows] = words_to_bytes(words, k)
    return out


class UnaryEncoding(FrequencyOracle):
    """Shared body of OUE and SUE; a subclass sets the bit thresholds from ε."""

    _name: ClassVar[str]

    #: P[bit v = 1 | value v] and P[bit i = 1 | value v], i != v, as sampled.
    bit_p: DyadicProbability
    bit_q: DyadicProbability
    p_exact: Fraction
    q_exact: Fraction
    p: float
    q: float

    def _set_probabilities(self, p: DyadicProbability, q: DyadicProbability) -> None:
        self.bit_p, self.bit_q = p, q
        self.p_exact, self.q_exact = p.exact, q.exact
        self.p, self.q = float(p), float(q)
        self.support_p = self.p
        self.support_q = self.q

    def exact_probability(self, value: int, output: Output) -> Fraction:
        bits = check_bit_vector(output, self.k, name=self._name)
        prob = Fraction(1)
        for i in range(self.k):
            bit_p = self.p_exact if i == value else self.q_exact
            prob *= bit_p if (bits >> i) & 1 else 1 - bit_p
        return prob

    def outputs(self) -> Iterator[Output]:
        return (int_to_bits(b, self.k) for b in range(1 << self.k))

    def perturb(self, value: int, *, rng: random.Random | None = None) -> BitVectorOutput:
        check_index(value, self.k)
        # Without rng: one OS read per report (the flips, then 7 bytes for the draw).
        r = rng if rng is not None else system_random(bernoulli_read_bytes(self.k) + 7)
        bits = bernoulli_bits(self.bit_q, self.k, r)
        bits &= ~(1 << value)
        if self.bit_p.draw(r):
            bits |= 1 << value
        return int_to_bits(bits, self.k)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.uint8]:
        """Packed rows (n, ceil(k/8)) of uint8, the same law as `perturb`."""
        return unary_bits_batch(values, self.k, self.bit_p, self.bit_q, rng)

    def check_output(self, output: Output) -> None:
        check_bit_vector(output, self.k, name=self._name)

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        add_bit_counts(statistic, check_bit_vector(output, self.k, name=self._name))

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add packed rows (n, ceil(k/8)) uint8, as from `perturb_batch`."""
        rows = packed_rows(outputs, self.k, name=self._name)
        self._add_counts(statistic, column_counts(rows, self.k), rows.shape[0])


class OUE(UnaryEncoding):
    """Optimized unary encoding: p = 1/2 (exact), q = 1/(e^ε + 1) rounded up."""

    wire_id = "oue"
    _name = "oue"

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        # Wang et al. 2017, Section 4.2 (OUE).
        self._set_probabilities(
            DyadicProbability.at_most(Fraction(1, 2)),
            dyadic_from_exp(lambda e: 1 / (e + 1), epsilon, round_up=True),
        )


class SUE(UnaryEncoding):
    """Symmetric unary encoding (basic RAPPOR): p = e^{ε/2}/(e^{ε/2}+1) down, q = 1 - p."""

    wire_id = "sue"
    _name = "sue"

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        # Wang et al. 2017, Section 4.2 (SUE); Erlingsson et al. 2014, Section 3.
        half_epsilon = half(epsilon)
        self._set_probabilities(
            dyadic_from_exp(lambda h: h / (h + 1), half_epsilon),
            dyadic_from_exp(lambda h: 1 / (h + 1), half_epsilon, round_up=True),
        )


__all__ = ["OUE", "SUE", "UnaryEncoding", "unary_bits_batch"]
