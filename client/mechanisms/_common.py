"""Shared building blocks of the mechanisms: validation, bit packing, exact samplers.

Pure Python at import time; numpy is imported lazily inside the batch helpers.

Packed bits follow the wire contract (collector.proto, BitVectorPayload): bit i of a
vector of `length` bits is ``(bits[i // 8] >> (i % 8)) & 1``, exactly
``ceil(length / 8)`` bytes, padding bits zero. A Python int whose bit i is bit i of
the vector converts with ``int.to_bytes(ceil(length / 8), "little")``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    CountStatistic,
    Output,
    OutputDomainError,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Binary digits of a probability used by the exact Bernoulli bit samplers: a
#: probability `prob` is realized as floor(prob * 2**64) / 2**64 (error < 2**-64).
PROB_BITS = 64


def exp_epsilon(epsilon: Decimal) -> float:
    """e^ε in floating point (the probabilities are floats; ε itself stays exact)."""
    return math.exp(float(epsilon))


def check_domain_size(k: object, *, minimum: int = 2) -> int:
    """Validate a categorical domain size; return it."""
    if isinstance(k, bool) or not isinstance(k, int) or k < minimum:
        raise ValueError(f"domain size k must be an integer >= {minimum}, got {k!r}")
    return k


def check_index(value: object, k: int) -> int:
    """Validate a true categorical value (an index in [0, k)); the message omits the value."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < k:
        raise ValueError(f"value must be an integer index in [0, {k})")
    return value


def byte_length(length: int) -> int:
    """Bytes of a packed vector of `length` bits."""
    return (length + 7) // 8


def check_bit_vector(output: Output, length: int, *, name: str) -> int:
    """Check a BitVectorOutput's type, length and padding; return its bits as an int."""
    if not isinstance(output, BitVectorOutput):
        raise OutputDomainError("WRONG_PAYLOAD_TYPE", f"{name} expects a bit-vector payload")
    if output.length != length:
        raise OutputDomainError("WRONG_LENGTH", f"{name} expects exactly {length} bits")
    if not isinstance(output.bits, bytes) or len(output.bits) != byte_length(length):
        raise OutputDomainError(
            "WRONG_LENGTH", f"{name} expects exactly {byte_length(length)} packed bytes"
        )
    value = int.from_bytes(output.bits, "little")
    if value >> length:
        raise OutputDomainError("OUT_OF_DOMAIN", f"{name}: padding bits must be zero")
    return value


def check_category(output: Output, size: int, *, name: str, what: str) -> int:
    """Check a CategoryOutput's type and index in [0, size); return the index.

    `name` (the mechanism) and `what` (the index's meaning) word the errors.
    """
    if not isinstance(output, CategoryOutput):
        raise OutputDomainError("WRONG_PAYLOAD_TYPE", f"{name} expects a category payload")
    if not 0 <= output.index < size:
        raise OutputDomainError("OUT_OF_DOMAIN", f"{what} outside [0, {size})")
    return output.index


def count_category(statistic: CountStatistic, output: Output) -> None:
    """Count one category output already checked by the mechanism's `check_output`."""
    assert isinstance(output, CategoryOutput)
    statistic.counts[output.index] += 1
    statistic.n += 1


def category_counts(outputs: Any, size: int, *, what: str) -> tuple[npt.NDArray[np.int64], int]:
    """(histogram over [0, size), number of reports) of an int array of output indices.

    OUT_OF_DOMAIN (worded with `what`) when an index falls outside [0, size).
    """
    import numpy as np

    indices = np.asarray(outputs, dtype=np.int64)
    counts = np.bincount(indices, minlength=size)
    if counts.shape[0] != size or (indices.size and indices.min() < 0):
        raise OutputDomainError("OUT_OF_DOMAIN", f"{what} outside [0, {size})")
    return counts, indices.shape[0]


def add_bit_counts(statistic: CountStatistic, bits: int) -> None:
    """Count one bit-vector report: counts[i] += 1 for each set bit i of `bits`."""
    counts = statistic.counts
    i = 0
    while bits:
        if bits & 1:
            counts[i] += 1
        bits >>= 1
        i += 1
    statistic.n += 1


def packed_rows(outputs: Any, length: int, *, name: str) -> npt.NDArray[np.uint8]:
    """`outputs` as packed rows (n, ceil(length/8)) of uint8; WRONG_LENGTH otherwise."""
    import numpy as np

    rows = np.asarray(outputs, dtype=np.uint8)
    if rows.ndim != 2 or rows.shape[1] != byte_length(length):
        raise OutputDomainError("WRONG_LENGTH", f"{name} expects {length}-bit rows")
    return rows


def int_to_bits(value: int, length: int) -> BitVectorOutput:
    """Pack an int (bit i = vector bit i) into a BitVectorOutput."""
    return BitVectorOutput(value.to_bytes(byte_length(length), "little"), length)


def _prob_digits(prob: float) -> int:
    if not 0.0 <= prob <= 1.0:
        raise ValueError("probability outside [0, 1]")
    if prob == 1.0:
        return (1 << PROB_BITS) - 1  # 1 - 2**-64: indistinguishable in any test
    return int(math.ldexp(prob, PROB_BITS))


def bernoulli_bits(prob: float, length: int, rng: random.Random) -> int:
    """`length` independent Bernoulli(prob) bits as an int, from random words.

    Exact bit-sliced comparison U < prob for a uniform U = 0.R1 R2 R3... whose
    binary digits come from `rng.getrandbits(length)` (one word per digit level,
    every bit position in parallel), most significant digit first. A position is
    decided at the first level where its random digit differs from prob's digit.
    Costs about log2(length) + 2 calls of getrandbits instead of `length` calls
    of random(); the number of calls does not depend on any true value.
    """
    digits = _prob_digits(prob)
    result = 0
    undecided = (1 << length) - 1
    for level in range(PROB_BITS - 1, -1, -1):
        if not undecided:
            break
        word = rng.getrandbits(length)
        if (digits >> level) & 1:
            result |= undecided & ~word
            undecided &= word
        else:
            undecided &= ~word
    return result


#: Relative cost of one sparse position (geometric gap, scatter) against one
#: 64-bit word of one dense level; calibrated on numpy 2.x, it only steers speed.
_SPARSE_COST = 16.0
_MAX_DENSE_LEVELS = 16


def _dense_sparse_plan(prob: float) -> tuple[int, float]:
    """(J, s): J dense digit levels, then independent Bernoulli(s) bits OR-ed in.

    With q_J = prob truncated to J binary digits, a bit is 1 with probability
    q_J + (1 - q_J) s = prob when s = (prob - q_J) / (1 - q_J).
    """
    digits = _prob_digits(prob)
    best: tuple[float, int, float] | None = None
    for levels in range(_MAX_DENSE_LEVELS + 1):
        q_levels = (digits >> (PROB_BITS - levels)) / 2.0**levels if levels else 0.0
        sparse = (prob - q_levels) / (1.0 - q_levels) if q_levels < 1.0 else 0.0
        cost = levels / 64.0 + _SPARSE_COST * sparse
        if best is None or cost < best[0]:
            best = (cost, levels, max(0.0, sparse))
    assert best is not None
    return best[1], best[2]


def bernoulli_words(
    prob: float, rows: int, length: int, rng: np.random.Generator
) -> npt.NDArray[np.uint64]:
    """`rows` x `length` Bernoulli(prob) bits packed in little-endian uint64 words.

    The numpy counterpart of `bernoulli_bits`: shape (rows, ceil(length / 64)),
    bit j of word w of a row is vector bit 64 w + j; padding bits are zero.
    Dense part: the first J binary digits of prob by the same bit-sliced
    comparison (one random word per 64 bits per digit), giving Bernoulli(q_J).
    Sparse part: the remaining probability as independent Bernoulli(s) bits,
    s = (prob - q_J)/(1 - q_J), placed by geometric gaps over the row-major bit
    stream and OR-ed in, so each bit is 1 with probability exactly
    q_J + (1 - q_J) s = prob (up to the double rounding of s). J minimizes the
    work: about J/64 + 16 s operations per bit instead of one draw per bit.
    """
    import numpy as np

    words = (length + 63) // 64
    total = rows * words
    digits = _prob_digits(prob)
    levels, sparse = _dense_sparse_plan(prob)
    result = np.zeros(total, dtype=np.uint64)
    undecided = np.full(total, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    tail = length % 64
    if tail and rows:
        undecided.reshape(rows, words)[:, -1] = np.uint64((1 << tail) - 1)
    draw = _raw_words(rng)
    scratch = np.empty(total, dtype=np.uint64)
    for level in range(PROB_BITS - 1, PROB_BITS - 1 - levels, -1):
        word = draw(total)
        if (digits >> level) & 1:
            np.bitwise_not(word, out=scratch)
            np.bitwise_and(scratch, undecided, out=scratch)
            np.bitwise_or(result, scratch, out=result)
            np.bitwise_and(undecided, word, out=undecided)
        else:
            np.bitwise_not(word, out=word)
            np.bitwise_and(undecided, word, out=undecided)
    bits = rows * length
    if sparse > 0.0 and bits:
        chunks = []
        last = -1  # index of the last placed bit in the row-major stream
        while last < bits - 1:
            remaining = (bits - 1 - last) * sparse
            gaps = rng.geometric(sparse, size=int(remaining + 6.0 * math.sqrt(remaining) + 64))
            positions = np.cumsum(gaps) + last
            chunks.append(positions)
            last = int(positions[-1])
        positions = np.concatenate(chunks)
        positions = positions[: np.searchsorted(positions, bits)]
        if positions.size:
            row, col = np.divmod(positions, length)
            word_index = row * words + (col >> 6)
            masks = np.left_shift(np.uint64(1), (col & 63).astype(np.uint64))
            starts = np.concatenate(([0], np.flatnonzero(np.diff(word_index)) + 1))
            result[word_index[starts]] |= np.bitwise_or.reduceat(masks, starts)
    return result.reshape(rows, words)


def _raw_words(rng: np.random.Generator) -> Any:
    """A function drawing `size` uniform uint64 words (raw output of 64-bit generators)."""
    import numpy as np

    bit_generator = rng.bit_generator
    sixty_four = (np.random.PCG64, np.random.PCG64DXSM, np.random.SFC64, np.random.Philox)
    if isinstance(bit_generator, sixty_four):
        return lambda size: bit_generator.random_raw(size)
    top = np.uint64(0xFFFFFFFFFFFFFFFF)
    return lambda size: rng.integers(0, top, size=size, dtype=np.uint64, endpoint=True)


def words_to_bytes(words: npt.NDArray[np.uint64], length: int) -> npt.NDArray[np.uint8]:
    """Packed uint64 rows -> packed little-endian byte rows of ceil(length / 8) bytes."""
    import numpy as np

    little = words.astype("<u8", copy=False)
    as_bytes = little.view(np.uint8).reshape(words.shape[0], -1)
    return np.ascontiguousarray(as_bytes[:, : byte_length(length)])


def column_counts(packed: npt.NDArray[np.uint8], length: int) -> npt.NDArray[np.int64]:
    """Number of rows with bit i set, for each i < length (packed little-endian rows).

    One histogram of (byte column, byte value) pairs, then a (256 x 8) table of
    each byte value's bits: no row is unpacked to one byte per bit.
    """
    import numpy as np

    rows, width = packed.shape
    bits_of = np.unpackbits(
        np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"
    ).astype(np.int64)
    offsets = (np.arange(width, dtype=np.int32) * 256)[None, :]
    histogram = np.zeros(width * 256, dtype=np.int64)
    chunk = max(1, (1 << 20) // max(1, width))
    for start in range(0, rows, chunk):
        cells = packed[start : start + chunk].astype(np.int32) + offsets
        histogram += np.bincount(cells.ravel(), minlength=width * 256)
    counts = histogram.reshape(width, 256) @ bits_of
    return np.asarray(counts.reshape(-1)[:length], dtype=np.int64)


def support_variance(n: int, frequency: Any, p: float, q: float) -> npt.NDArray[np.float64]:
    """Exact variance of a support-count frequency estimate.

    A report "supports" v with probability p when the true value is v and q
    otherwise, independently across users. With f̂_v = (C(v)/n - q)/(p - q),
    summing the Bernoulli variances of the n reports gives

        Var[f̂_v] = (f_v p (1 - p) + (1 - f_v) q (1 - q)) / (n (p - q)^2)

    (Wang et al., USENIX Security 2017, Section 3, eq. (2), kept with its
    frequency-dependent term).
    """
    import numpy as np

    if n <= 0:
        raise ValueError("n must be positive")
    f = np.asarray(frequency, dtype=np.float64)
    return np.asarray(
        (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (n * (p - q) ** 2), dtype=np.float64
    )


def f0_variance_scalar(p: float, q: float) -> float:
    """n·Var[f̂_v] at f_v = 0 for a support-count oracle: q(1-q)/(p-q)^2 (pure Python)."""
    return q * (1.0 - q) / (p - q) ** 2


def no_params(wire_id: str, params: Mapping[str, str]) -> None:
    """Refuse any parameter for a mechanism that takes none."""
    if params:
        raise ValueError(f"{wire_id} takes no parameters, got {sorted(params)}")


def only_params(wire_id: str, params: Mapping[str, str], allowed: set[str]) -> None:
    """Refuse parameters outside `allowed`."""
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(
            f"{wire_id} does not take parameter(s) {unknown}; allowed: {sorted(allowed)}"
        )


def int_param(wire_id: str, params: Mapping[str, str], name: str) -> int | None:
    """An optional non-negative integer parameter in plain decimal digits."""
    text = params.get(name)
    if text is None:
        return None
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 19:
        raise ValueError(f"{wire_id} parameter {name!r} must be a plain integer, got {text!r}")
    return int(text)


def decimal_param(wire_id: str, params: Mapping[str, str], name: str) -> Decimal | None:
    """An optional positive decimal parameter in plain notation ("2", "0.5")."""
    text = params.get(name)
    if text is None:
        return None
    ok = isinstance(text, str) and 0 < len(text) <= 40 and text.isascii()
    ok = ok and all(c.isdigit() or c == "." for c in text) and text.count(".") <= 1
    ok = ok and not text.startswith(".") and not text.endswith(".")
    if not ok:
        raise ValueError(f"{wire_id} parameter {name!r} must be a plain decimal, got {text!r}")
    return Decimal(text)


def categorical_metric(wire_id: str, metric: object) -> int:
    """The domain size of a categorical metric, or a clear error."""
    if isinstance(metric, bool) or not isinstance(metric, int):
        raise ValueError(f"{wire_id} needs a categorical metric (a domain size k)")
    return metric


def numeric_metric(wire_id: str, metric: object) -> tuple[Decimal, Decimal]:
    """The (lo, hi) of a numeric metric, or a clear error."""
    if (
        not isinstance(metric, tuple)
        or len(metric) != 2
        or not all(isinstance(x, Decimal) for x in metric)
    ):
        raise ValueError(f"{wire_id} needs a numeric metric (lo, hi) as Decimals")
    return metric[0], metric[1]
