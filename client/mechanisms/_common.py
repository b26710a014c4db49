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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, Inexact
from fractions import Fraction
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

#: Every probability a categorical sampler realizes is numerator / 2**PROB_BITS
#: exactly (`DyadicProbability`): 53 bits, the resolution of numpy's
#: `Generator.random()`, so the device path and the batch path compare the
#: same integer against the same threshold.
PROB_BITS = 53
PROB_ONE = 1 << PROB_BITS
#: Decimal digits of e^x used to bound a probability before rounding it (>= 50).
EXP_DIGITS = 60
#: Largest exponent accepted by `exp_epsilon` and `exp_bounds`: beyond it e^ε
#: overflows the double that chooses g, d and `auto` (and every threshold is
#: within 2**-53 of 0 or 1 well before).
MAX_EXPONENT = Decimal(700)


def _check_exponent(x: Decimal) -> None:
    if not x.is_finite() or x > MAX_EXPONENT:
        raise ValueError(f"epsilon must be at most {MAX_EXPONENT} for this mechanism")


def exp_epsilon(epsilon: Decimal) -> float:
    """e^ε in floating point, for parameter choices only (g, d, auto), never for a sampler."""
    _check_exponent(epsilon)
    return math.exp(float(epsilon))


def exp_bounds(x: Decimal, digits: int = EXP_DIGITS) -> tuple[Fraction, Fraction]:
    """Rationals lo < e^x < hi with (hi - lo) / e^x below 3·10^(1 - digits).

    `decimal` computes exp correctly rounded (half-even) to the context's
    precision, so e^x lies within half a unit in the last place of the result;
    one unit either side brackets it. The bracket is exact rational arithmetic.
    """
    _check_exponent(x)
    value = Context(prec=digits, Emax=MAX_EMAX, Emin=MIN_EMIN).exp(x)
    unit = Fraction(10) ** (value.adjusted() - digits + 1)
    return Fraction(value) - unit, Fraction(value) + unit


def half(x: Decimal) -> Decimal:
    """x / 2 exactly (Inexact is trapped; one more digit always suffices)."""
    digits = len(x.as_tuple().digits)
    return Context(prec=digits + 2, traps=[Inexact]).divide(x, 2)


@dataclass(frozen=True, slots=True)
class DyadicProbability:
    """The probability numerator / 2**53, exactly what every sampler here realizes.

    `draw` (device, `random.Random`) and `draw_batch` (numpy) return True
    exactly when a uniform integer U in [0, 2**53) is < numerator;
    `bernoulli_bits` and `bernoulli_words` set a bit exactly when a uniform
    53-bit W is >= 2**53 - numerator. Either way the realized probability is
    this rational, not a float near it. A mechanism builds each threshold with
    `dyadic_from_exp`, rounding in the direction that can only lower its
    privacy ratio (`at_most` for a probability that raises the ratio, e.g.
    keeping the truth; `at_least` for one that lowers it).
    """

    numerator: int

    def __post_init__(self) -> None:
        n = self.numerator
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= PROB_ONE:
            raise ValueError("a dyadic probability's numerator must be an integer in [0, 2**53]")

    @classmethod
    def at_most(cls, prob: Fraction) -> DyadicProbability:
        """The largest multiple of 2**-53 that is <= prob."""
        return cls(math.floor(prob * PROB_ONE))

    @classmethod
    def at_least(cls, prob: Fraction) -> DyadicProbability:
        """The smallest multiple of 2**-53 that is >= prob."""
        return cls(math.ceil(prob * PROB_ONE))

    @property
    def exact(self) -> Fraction:
        """numerator / 2**53 as a Fraction."""
        return Fraction(self.numerator, PROB_ONE)

    def __float__(self) -> float:
        return math.ldexp(self.numerator, -PROB_BITS)  # exact: numerator <= 2**53

    def draw(self, rng: random.Random) -> bool:
        """True with probability exactly numerator / 2**53 (one `getrandbits(53)`)."""
        return rng.getrandbits(PROB_BITS) < self.numerator

    def draw_batch(self, size: int, rng: np.random.Generator) -> npt.NDArray[np.bool_]:
        """`size` independent draws of `draw`, from a numpy generator.

        Every numpy bit generator's `random()` returns m · 2**-53 with m uniform
        in [0, 2**53) (the top 53 bits of a 64-bit word; MT19937: 27 + 26 bits),
        and numerator · 2**-53 is a double exactly, so the float comparison is
        the integer comparison m < numerator: the same law as `draw`.
        """
        return rng.random(size) < float(self)


def dyadic_from_exp(
    formula: Callable[[Fraction], Fraction], x: Decimal, *, round_up: bool = False
) -> DyadicProbability:
    """formula(e^x) rounded down (or up) to a multiple of 2**-53, exactly.

    `formula` must be monotone in e^x (every mechanism's probability is a
    monotone rational function of e^ε). It is evaluated, in exact rational
    arithmetic, at both ends of a bracket of e^x from `exp_bounds` (60 digits
    first); when both ends round to the same multiple so does the exact value.
    Otherwise the bracket is narrowed: e^x is transcendental for rational
    x != 0 (Lindemann), so a non-constant rational formula of it is never a
    multiple of 2**-53, and some precision separates it from the nearest one.
    """
    rounding = math.ceil if round_up else math.floor
    digits = EXP_DIGITS
    while True:
        lo, hi = exp_bounds(x, digits)
        ends = {rounding(formula(lo) * PROB_ONE), rounding(formula(hi) * PROB_ONE)}
        if len(ends) == 1:
            return DyadicProbability(ends.pop())
        if digits > 64 * EXP_DIGITS:
            raise ArithmeticError("cannot round the probability: bracket did not narrow")
        digits *= 2


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


def bernoulli_bits(prob: DyadicProbability, length: int, rng: random.Random) -> int:
    """`length` independent Bernoulli(prob) bits as an int, from random words.

    Bit i is 1 exactly when W_i >= 2**53 - prob.numerator, where W_i is the
    uniform 53-bit integer whose binary digits, most significant first, are
    bit i of successive `rng.getrandbits(length)` words: P[bit = 1] is
    prob.numerator / 2**53 exactly. Every position is compared in parallel and
    decided at its first digit that differs from c = 2**53 - 1 - numerator's
    (W_i > c is the same test): there a word bit 1 (where c has 0) means 1, a
    word bit 0 (where c has 1) means 0; a position equal to c in all 53 digits
    is 0. About log2(length) + 2 calls instead of `length` draws; the number of
    calls never depends on a true value.
    """
    numerator = prob.numerator
    if numerator == PROB_ONE:
        return (1 << length) - 1
    result = 0
    undecided = (1 << length) - 1
    for level in range(PROB_BITS - 1, -1, -1):
        if not undecided:
            break
        word = rng.getrandbits(length)
        if (numerator >> level) & 1:  # c's digit is 0: word bit 1 decides 1
            won = undecided & word
            result |= won
            undecided ^= won
        else:  # c's digit is 1: word bit 0 decides 0
            undecided &= word
    return result


#: `bernoulli_read_bytes` sizes one OS read so that a `bernoulli_bits` call needs
#: a second one with probability below 2**-READ_MARGIN_BITS.
READ_MARGIN_BITS = 12


def bernoulli_read_bytes(length: int) -> int:
    """OS CSPRNG bytes to read at once for one `bernoulli_bits(prob, length, r)` call.

    Each level of `bernoulli_bits` draws ceil(length/8) bytes and decides every
    still-undecided position with probability 1/2, so L levels leave some
    position undecided with probability at most length * 2**-L. Reading
    L = bit_length(length) + `READ_MARGIN_BITS` levels (at most 53) makes a
    second read rarer than 2**-12 per call; how many levels a call uses never
    depends on a true value (only on the random words).
    """
    levels = min(PROB_BITS, length.bit_length() + READ_MARGIN_BITS)
    return levels * byte_length(length)


#: `bernoulli_words` compares the first FULL_LEVELS digit levels over every
#: word, then COMPACT_LEVELS at a time over only the words that still hold an
#: undecided bit, and resolves the bits one by one once at most RESOLVE_WORDS
#: such words are left. Speed choices only: the law is the same for any values.
FULL_LEVELS = 8
COMPACT_LEVELS = 3
RESOLVE_WORDS = 256


def bernoulli_words(
    prob: DyadicProbability, rows: int, length: int, rng: np.random.Generator
) -> npt.NDArray[np.uint64]:
    """`rows` x `length` Bernoulli(prob) bits packed in little-endian uint64 words.

    The numpy counterpart of `bernoulli_bits`, with the same law and the same
    comparison: bit i is 1 exactly when W_i >= 2**53 - prob.numerator for a
    uniform 53-bit W_i whose digits, most significant first, are bit i of one
    random 64-bit word per level. Shape (rows, ceil(length / 64)), bit j of
    word w of a row is vector bit 64 w + j, padding bits zero.

    Levels are compared word-parallel, first over every word, then only over
    the words that still hold an undecided bit (a decided bit ignores its later
    digits). Once few such words are left after J levels, each undecided bit
    draws its remaining 53 - J digits as one uniform integer V_i < 2**(53 - J)
    (`Generator.integers`) and is 1 exactly when V_i >= 2**(53 - J) - r, r the
    numerator's last 53 - J digits: together, the comparison above.
    """
    import numpy as np

    words = (length + 63) // 64
    total = rows * words
    numerator = prob.numerator
    undecided = np.full(total, np.uint64(0xFFFFFFFFFFFFFFFF), dtype=np.uint64)
    tail = length % 64
    if tail and rows:
        undecided.reshape(rows, words)[:, -1] = np.uint64((1 << tail) - 1)
    if numerator == PROB_ONE:
        return undecided.reshape(rows, words)
    result = np.zeros(total, dtype=np.uint64)
    if numerator == 0:
        return result.reshape(rows, words)
    # Below the numerator's lowest set digit c's digits are all 1: an undecided bit is 0.
    levels = PROB_BITS - ((numerator & -numerator).bit_length() - 1)
    done = min(levels, FULL_LEVELS)
    _compare_levels(result, undecided, numerator, PROB_BITS - 1, done, rng)
    if done == levels:
        return result.reshape(rows, words)
    index = np.flatnonzero(undecided)
    while done < levels and index.size > RESOLVE_WORDS:
        step = min(COMPACT_LEVELS, levels - done)
        sub_result = np.zeros(index.size, dtype=np.uint64)
        sub_undecided = undecided[index]
        _compare_levels(sub_result, sub_undecided, numerator, PROB_BITS - 1 - done, step, rng)
        result[index] |= sub_result
        undecided[index] = sub_undecided
        index = index[np.flatnonzero(sub_undecided)]
        done += step
    rest_bits = PROB_BITS - done
    rest = numerator & ((1 << rest_bits) - 1)
    if rest and index.size:
        _resolve_undecided(result, undecided, index, (1 << rest_bits) - rest, rest_bits, rng)
    return result.reshape(rows, words)


def _compare_levels(
    result: npt.NDArray[np.uint64],
    undecided: npt.NDArray[np.uint64],
    numerator: int,
    first: int,
    count: int,
    rng: np.random.Generator,
) -> None:
    """Digit levels first, first - 1, ... (`count` of them), as in `bernoulli_bits`."""
    import numpy as np

    draw = _raw_words(rng)
    won = np.empty(result.shape[0], dtype=np.uint64)
    for level in range(first, first - count, -1):
        word = draw(result.shape[0])
        if (numerator >> level) & 1:
            np.bitwise_and(undecided, word, out=won)
            np.bitwise_or(result, won, out=result)
            np.bitwise_xor(undecided, won, out=undecided)
        else:
            np.bitwise_and(undecided, word, out=undecided)


def _resolve_undecided(
    result: npt.NDArray[np.uint64],
    undecided: npt.NDArray[np.uint64],
    index: npt.NDArray[np.intp],
    threshold: int,
    rest_bits: int,
    rng: np.random.Generator,
) -> None:
    """Set each undecided bit (words `index`) iff a uniform V < 2**rest_bits is >= threshold."""
    import numpy as np

    as_bytes = undecided[index].astype("<u8").view(np.uint8).reshape(-1, 8)
    word_of, bit_of = np.nonzero(np.unpackbits(as_bytes, axis=1, bitorder="little"))
    draws = rng.integers(0, 1 << rest_bits, size=word_of.size, dtype=np.uint64)
    hit = draws >= np.uint64(threshold)
    masks = np.left_shift(np.uint64(1), bit_of[hit].astype(np.uint64))
    np.bitwise_or.at(result, index[word_of[hit]], masks)


def _raw_words(rng: np.random.Generator) -> Any:
    """A function drawing `size` uniform uint64 words (every bit a fair coin).

    `integers` over the full uint64 range returns the generator's raw 64-bit
    outputs without rejection; it is faster than `bit_generator.random_raw`.
    """
    import numpy as np

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
    """n·Var[f̂_v] at f_v = 0 for a support-count oracle: q(1-q)/(p-q)^2 (pure Python).

    `support_variance` at f_v = 0, times n (Wang et al., USENIX Security 2017,
    Section 3, eq. (2); for local hashing with p = e^ε/(e^ε + g - 1), q = 1/g it
    is that paper's eq. (10)). The one home of this formula: the auto choice of
    oracle, OLH's choice of g and subset selection's choice of d all use it.
    Infinite when p and q coincide in floating point (an ε below about 1e-16).
    """
    gap = (p - q) ** 2
    return q * (1.0 - q) / gap if gap > 0.0 else math.inf


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
