"""Numeric mechanisms on a bounded range [lo, hi], on a finite grid: Duchi, Piecewise, Hybrid.

Why a grid. A mechanism that emits a double computed from the input leaks the
input through the bits of that double (Mironov, "On Significance of the Least
Significant Bits for Differential Privacy", CCS 2012): the continuous Piecewise
mechanism at ε = 1 emits, for one end of the range, outputs whose last mantissa
bit never occurs for the other end, so its real loss is unbounded. Every
mechanism here therefore emits one value of a finite table fixed by the policy
(ε, range, the grid parameters), independent of the input, and chooses the
table index with exact integer arithmetic, so the probability of every wire
value under every input is an exact rational (`level_law`, `index_weights`,
`table`, `wire_probability`) and its ratio between any two inputs is checked
against e^ε in tests.

Steps of one report (device path, `perturb`):

1. Clip. x is clipped to [lo, hi] (policy.proto, NumericRange: "values outside
   are clipped on the device"); `perturb_with_clip(x)` and `clip(x)` also say
   whether clipping happened. Non-finite values raise ValueError. The clipped
   value is taken as the exact rational of its double.
2. Randomized rounding onto J + 1 input levels t_j = -1 + 2j/J. With
   t = 2(x - lo)/(hi - lo) - 1 and u = (t + 1) J / 2 computed exactly, u is
   first rounded to the nearest multiple of 2^-K (U = round(u 2^K),
   K = `ROUNDING_BITS`: deterministic post-processing of the input), then one
   `getrandbits(K)` is always drawn and the level is floor(U / 2^K) + 1 when
   the draw is below U mod 2^K, else floor(U / 2^K). The CSPRNG use (and the
   integer work, up to CPython) is the same for every input, on a level or
   not: no device-local side channel. E[t_J] = t up to the grid,
   |E[t_J] - t| <= 2^-K / J, and Var[t_J] = (t - t_lo)(t_hi - t) on the grid.
3. Output index. Given the level j, an index i is drawn with integer weights
   W(i | j) that sum to a total independent of j (one `randrange(total)`), and
   the wire value is table[i]: the correctly rounded double of an exact
   rational y_i that depends on i only.

Privacy (exact). For every output i and levels j, j': W(i|j) / W(i|j') <= a / b,
where the integers a > b satisfy a / b <= e^ε: b = 2^P and a = floor(e^ε 2^P)
(P = `WEIGHT_BITS` = 32, fewer only where the total weight would not fit in 63
bits; `exp_floor`). A real input's law is a mixture over at most two levels with
the same per-level laws, and a mixture cannot raise the ratio above the largest
ratio between its components, so every pair of real inputs (including two
doubles one ulp apart) has ratio <= a / b <= e^ε per wire value. Wire values
that coincide as doubles add their probabilities on both sides, which keeps
the bound. Because the table does not depend on the input, the bits of the
wire value carry nothing beyond the index.

Mechanisms (t units; Wang et al., "Collecting and Analyzing Multidimensional
Data with Local Differential Privacy", ICDE 2019):

* duchi — Duchi, Jordan, Wainwright, JASA 2018, as in Wang et al. Section III-A
  (Algorithm 1), with J = 1 level (t_0 = -1, t_1 = 1): output ±B,
  B = (a + b)/(a - b) (≈ (e^ε + 1)/(e^ε - 1)), P[+B | j] = (J b + (a - b) j) / (J (a + b)).
  E[y | j] = t_j, so the rounding law composed with it is exactly
  P[+B | t] = 1/2 + t/(2B) for every t on the 2^-K grid (within 2^-K / (2 J B)
  of it otherwise); Var[y | t] = B^2 - t^2.
* piecewise — the Piecewise Mechanism of Wang et al. Section III-B, discretized:
  N = J + w output cells; for level j the "high" band is cells [j, j + w), each
  of weight a, every other cell weight b, total Z = w a + J b for every j. The
  band fraction w/N ≈ 1/(e^{ε/2} + 1) is the paper's (C - 1)/(2C) with
  C = (e^{ε/2} + 1)/(e^{ε/2} - 1), so w = round(J e^{-ε/2}) by default. Cell
  values y_i = β (i - (N - 1)/2) with β = 2Z / (J (a - b) w): the band sum is
  affine in j, which gives E[y | j] = t_j exactly. With c_i = i - (N - 1)/2:
  E[y^2 | j] = c0 + c2 t_j^2, c2 = β J / 2,
  c0 = β^2 (b N (N^2 - 1) + (a - b) w (w^2 - 1)) / (12 Z).
* hybrid — Wang et al. Section III-C: after the rounding, piecewise with
  probability α, else Duchi on the same level (P[+B | j] above with this J),
  α = floor((1 - e^{-ε/2}) 2^32) / 2^32 when ε > ε* = 0.61, else α = 0 (pure
  Duchi; the grid parameters are then unused and the table is ±B). Both parts
  are unbiased given j, so E[y^2 | j] = α (c0 + c2 t_j^2) + (1 - α) B^2.
* sw — Square Wave (Li et al., SIGMOD 2020, Section 4; square_wave.py): the
  piecewise law above with band W = max(1, round(2 b J)) from the paper's
  closed-form b (`square_wave_band`); its wire values are the cell centres,
  its statistic the counts per cell, for the distribution (EMS).

Grid parameters (policy `mechanism.params`, plain integers): "levels" J
(default `DEFAULT_LEVELS`) and "cells" N = J + w (default J + max(1,
round(J e^{-ε/2})); sw: J + `square_wave_band`), for piecewise, hybrid and sw;
duchi takes none. Authoring writes
the values it derived into the signed params (`grid_params`), so devices,
collectors and aggregators build the same table; a policy signed without them
gets the same derived defaults.

Variance. For all three, E[y^2 | j] = c0 + c2 t_j^2 and E[y | j] = t_j, so

    Var[y | t] = Σ_j P(j|t) Var[y|j] + Var[t_J] = c0 + c2 (t^2 + r(t)) - t^2,

r(t) = (t - t_lo)(t_hi - t) <= 1/J^2 the rounding term (`conditional_variance`).
The variance of the mean estimate from n users is ((hi - lo)/2)^2 Σ_i
Var[y | t_i] / n^2 (`variance`). The table values are doubles rounded from y_i,
so E[report | j] = t_j up to that rounding (relative 2^-53), far below any
sampling error.

Plug-in variance (`estimate`). The unknown m2 = mean_i E[t_{J,i}^2] is estimated
without bias from the mean of y^2, (mean y^2 - c0)/c2, clamped to [0, 1], when
c2 > 0 (piecewise, hybrid with α > 0); the variance reported is
c0 + (c2 - 1) m2 + 1/J^2, i.e. the exact one with the rounding term mean r
replaced by its worst case 1/J^2: an upper bound in expectation that exceeds
the exact value by at most 1/J^2. When c2 = 0 (duchi, hybrid with α = 0) the
outputs carry no information about t^2 and the worst case t = 0, c0 = B^2, is
reported: an upper bound.

The wire value of duchi, piecewise and hybrid (`MeanMechanism`) stays in the
normalized unit (an unbiased randomization of t), so the estimator is
mean(x) = lo + (hi - lo)(mean y + 1)/2; sw's unbiased value u_i is its own
(square_wave.py), with the same estimator and variance (`_mean_estimate`).
The collector accepts a report only when its double is bit-for-bit one of the
table values (`check_output`; NaN and infinities: NON_FINITE, anything else:
OUT_OF_DOMAIN), so one report's weight is at most `bound` = max |y_i|.

laplace is retired (registry.RETIRED_IDS): no grid version of it would beat
piecewise or hybrid, which dominate it at every ε (Wang et al. Section III-D).
"""

from __future__ import annotations

import math
import random
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
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

#: Binary digits of the weight ratio a / b = floor(e^ε 2^P) / 2^P (P at most this).
WEIGHT_BITS = 32
#: The total weight of one level's law stays below this (numpy int64 draws).
MAX_TOTAL_WEIGHT = 1 << 62
#: K: the clipped input is rounded to the nearest multiple of 2^-K level steps, then
#: rounded up with probability (its position between levels) exactly, from K random bits.
ROUNDING_BITS = 64
#: Every finite double is an integer multiple of 2^-1074 (the least subnormal).
_DOUBLE_SCALE_BITS = 1074
#: Added to x 2^1074 (|.| < 2^2098) so the integer has one size for every input.
_X_OFFSET = 1 << 2110
#: Input levels J when the policy does not state them.
DEFAULT_LEVELS = 256
#: Bounds on the policy's grid parameters (table size and device memory).
MIN_LEVELS = 2
MAX_LEVELS = 4096
#: Wang et al. ICDE 2019, Section III-C: at or below ε* the hybrid is pure Duchi.
HYBRID_EPSILON_STAR = Decimal("0.61")
#: Significant digits of the decimal e^x behind every derived integer.
_EXP_DIGITS = 60
#: A floor of a 60-digit e^x times an integer is decided only when the product
#: is farther than this from an integer (always, in practice; checked).
_FLOOR_MARGIN = Decimal("1e-40")


def exp_floor(exponent: Decimal, multiplier: int) -> int:
    """floor(e^exponent * multiplier), exactly.

    e^x is computed with `decimal` at 60 significant digits (correctly rounded,
    relative error < 1e-59); the product is floored unless it lies within 1e-40
    of an integer, which would leave the floor undecided (ValueError; e^x is
    transcendental for rational x != 0, so this does not happen in practice).
    """
    with localcontext() as ctx:
        ctx.prec = _EXP_DIGITS
        e = exponent.exp()
        ctx.prec = _EXP_DIGITS + 40
        product = e * multiplier
        floor = int(product)  # product > 0: truncation is the floor
        if product - floor < _FLOOR_MARGIN or floor + 1 - product < _FLOOR_MARGIN:
            raise ValueError("cannot decide floor(e^x * m) at 60 digits")
    return floor


@dataclass(frozen=True)
class Weights:
    """Integers a > b >= 1 with a / b <= e^ε: the largest per-output probability ratio."""

    high: int
    low: int

    @classmethod
    def for_epsilon(cls, epsilon: Decimal, max_multiplier: int) -> Weights:
        """b = 2^P, a = floor(e^ε 2^P), P <= WEIGHT_BITS chosen so a * max_multiplier < 2^62."""
        bits = WEIGHT_BITS
        while True:
            high = exp_floor(epsilon, 1 << bits)
            if high * max_multiplier < MAX_TOTAL_WEIGHT:
                break
            bits -= 1
            if bits < 8:
                raise ValueError(
                    f"epsilon {epsilon} is too large for a grid of this size; use fewer levels"
                )
        low = 1 << bits
        if high <= low:
            raise ValueError(f"epsilon {epsilon} is too small: floor(e^eps 2^{bits}) = 2^{bits}")
        return cls(high, low)

    @property
    def ratio(self) -> Fraction:
        """a / b, exactly."""
        return Fraction(self.high, self.low)


def default_band(epsilon: Decimal, levels: int) -> int:
    """w = max(1, round(J e^{-ε/2})): the paper's band fraction 1/(e^{ε/2} + 1) of N = J + w."""
    with localcontext() as ctx:
        ctx.prec = _EXP_DIGITS
        scaled = (-epsilon / 2).exp() * levels
    return max(1, int(scaled.to_integral_value()))


def square_wave_band(epsilon: Decimal, levels: int) -> int:
    """W = max(1, round(2 b J)): Square Wave's band on a grid of J level steps.

    b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε)) is the half-width Li et al.
    choose in closed form (SIGMOD 2020, Section 4, maximizing their
    mutual-information bound) for inputs in [0, 1] and outputs in [-b, 1 + b];
    on J level steps of width 1/J the band [v - b, v + b] spans 2 b J cells and
    the output domain J + 2 b J cells. b < 1/2 for every ε > 0, so W <= J.
    """
    with localcontext() as ctx:
        ctx.prec = _EXP_DIGITS
        e = epsilon.exp()
        b = (epsilon * e - e + 1) / (2 * e * (e - 1 - epsilon))
        scaled = 2 * b * levels
    return max(1, min(levels, int(scaled.to_integral_value())))


def grid_params(wire_id: str, epsilon: Decimal, params: dict[str, str]) -> dict[str, str]:
    """`params` with the grid parameters this mechanism would derive written in.

    Authoring calls this so the signed policy states its grid; ids without grid
    parameters (duchi, categorical ones) and invalid input come back unchanged
    (validation reports the problem).
    """
    if wire_id not in GRID_MECHANISMS:
        return dict(params)
    try:
        levels, cells = parse_grid(wire_id, epsilon, params)
    except ValueError:
        return dict(params)
    return {**params, "levels": str(levels), "cells": str(cells)}


def parse_grid(wire_id: str, epsilon: Decimal, params: dict[str, str]) -> tuple[int, int]:
    """(levels J, cells N) from the policy's params, defaults derived as documented."""
    levels = _plain_int(wire_id, params, "levels")
    cells = _plain_int(wire_id, params, "cells")
    return grid_size(wire_id, epsilon, levels, cells)


def grid_size(
    wire_id: str, epsilon: Decimal, levels: int | None, cells: int | None
) -> tuple[int, int]:
    """(J, N): the given grid, validated, or the derived default for what is None."""
    if not isinstance(epsilon, Decimal):
        raise TypeError("epsilon must be a decimal.Decimal (exact), not a float")
    if not epsilon.is_finite() or epsilon <= 0:
        raise ValueError(f"epsilon must be finite and positive, got {epsilon}")
    for name, given in (("levels", levels), ("cells", cells)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)):
            raise TypeError(f"{wire_id} {name} must be an int")
    if levels is None:
        levels = DEFAULT_LEVELS
    if not MIN_LEVELS <= levels <= MAX_LEVELS:
        raise ValueError(f"{wire_id} parameter 'levels' must be in [{MIN_LEVELS}, {MAX_LEVELS}]")
    if cells is None:
        band = square_wave_band if wire_id == "sw" else default_band
        cells = levels + band(epsilon, levels)
    if not levels < cells <= 2 * levels:
        raise ValueError(
            f"{wire_id} parameter 'cells' must be in [levels + 1, 2 * levels] = "
            f"[{levels + 1}, {2 * levels}] (band width cells - levels between 1 and levels)"
        )
    return levels, cells


def _plain_int(wire_id: str, params: dict[str, str], name: str) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    if not isinstance(text, str) or not text.isascii() or not text.isdigit() or len(text) > 6:
        raise ValueError(f"{wire_id} parameter {name!r} must be a plain integer (digits only)")
    return int(text)


def _same_bits(a: float, b: float) -> bool:
    """Whether two doubles have the same 8 bytes (0.0 and -0.0 differ; NaN is no table value)."""
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _grid_constants(lo: Decimal, hi: Decimal, levels: int) -> tuple[int, int, int, int]:
    """(A, C, D, O) with U = round((X A - C) / D) - O for x = (X - _X_OFFSET) 2^-1074.

    u 2^K = J 2^K (x - lo) / (hi - lo). With lo = l_n / l_d, hi = h_n / h_d and
    the range r = (h_n l_d - l_n h_d) / (l_d h_d): u 2^K = (x l_d - l_n) J h_d 2^K /
    (l_d r'), r' = h_n l_d - l_n h_d. O = 2^(K + bits(J) + 2) keeps the dividend
    positive and of one size over the whole clipped range.
    """
    lo_num, lo_den = lo.as_integer_ratio()
    hi_num, hi_den = hi.as_integer_ratio()
    width = hi_num * lo_den - lo_num * hi_den  # > 0
    offset = 1 << (ROUNDING_BITS + levels.bit_length() + 2)
    divisor = width << _DOUBLE_SCALE_BITS
    multiplier = lo_den * levels * hi_den << ROUNDING_BITS
    subtrahend = (
        _X_OFFSET * multiplier
        + (lo_num << _DOUBLE_SCALE_BITS) * levels * hi_den * (1 << ROUNDING_BITS)
        - offset * divisor
    )
    return multiplier, subtrahend, divisor, offset


class NumericMechanism(Mechanism[float, Any]):
    """Shared frame: range, clipping, exact rounding onto levels, table, output check.

    Also the mean estimator's law: every subclass has an unbiased value u_i per
    output index (E[u | j] = t_j, E[u^2 | j] = c0 + c2 t_j^2), which is the wire
    value itself for the mean mechanisms (`MeanMechanism`) and a rescaled cell
    position for Square Wave (square_wave.py). The statistic is the subclass's.
    """

    _name: ClassVar[str]

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal, levels: int) -> None:
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
        #: The least double >= lo and the greatest double <= hi: for a double x,
        #: x < lo exactly iff x < _lo_double, and x > hi iff x > _hi_double.
        self._lo_double = self._lo
        if Decimal(self._lo) < lo:
            self._lo_double = math.nextafter(self._lo, math.inf)
        self._hi_double = self._hi
        if Decimal(self._hi) > hi:
            self._hi_double = math.nextafter(self._hi, -math.inf)
        #: Half the range width: t units to value units.
        self.scale = (self._hi - self._lo) / 2.0
        #: J: input levels t_j = -1 + 2j/J, j = 0..J.
        self.levels = levels
        self._u_mul, self._u_sub, self._u_div, self._u_offset = _grid_constants(lo, hi, levels)
        #: Wire values by output index (set by subclasses through `_set_table`).
        self.table: tuple[float, ...] = ()
        self._index: dict[float, int] = {}
        #: The exact unbiased value u_i of every output index (E[u | j] = t_j).
        self.unbiased: tuple[Fraction, ...] = ()
        #: E[y^2 | j] = c0 + c2 t_j^2, exact (see the module docstring).
        self.c0 = Fraction(0)
        self.c2 = Fraction(0)

    def _set_table(
        self,
        values: Sequence[Fraction],
        c0: Fraction,
        c2: Fraction,
        unbiased: Sequence[Fraction] | None = None,
    ) -> None:
        """Wire values y_i (doubles of `values`), the moments of u, and u_i (default y_i)."""
        self.table = tuple(float(v) for v in values)
        self.unbiased = tuple(values if unbiased is None else unbiased)
        self._index = {}
        for i, y in enumerate(self.table):
            self._index.setdefault(y, i)
        self.c0, self.c2 = c0, c2
        self._c0, self._c2 = float(c0), float(c2)
        #: The largest |wire value|: the most one accepted report can move the sum.
        self.bound = max(abs(y) for y in self.table)

    # --- clipping and normalization ---

    def clip(self, value: float | int | Decimal) -> tuple[float, bool]:
        """(value clipped to [lo, hi] as a float, whether it was clipped)."""
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
            raise TypeError("value must be a real number (int, float or Decimal)")
        finite = value.is_finite() if isinstance(value, Decimal) else math.isfinite(value)
        if not finite:
            raise ValueError("value must be finite")
        # A double is compared with the doubles next to the bounds, never with a
        # Decimal: float-Decimal comparison is exact but its cost grows with the
        # double's decimal expansion (a subnormal has ~750 digits).
        below = value < self._lo_double if isinstance(value, float) else value < self.lo
        above = value > self._hi_double if isinstance(value, float) else value > self.hi
        if below:
            return self._lo, True
        if above:
            return self._hi, True
        return float(value), False

    def normalize(self, clipped: float) -> float:
        """Map a value in [lo, hi] to t in [-1, 1] (floating point; for estimates and tests)."""
        t = 2.0 * (clipped - self._lo) / (self._hi - self._lo) - 1.0
        return min(1.0, max(-1.0, t))

    def _grid_position(self, clipped: float) -> int:
        """U = u 2^K rounded to the nearest integer (ties up), clamped to [0, J 2^K].

        u = J (x - lo)/(hi - lo) is the exact position of the clipped double x
        in level steps; K = `ROUNDING_BITS`. Every finite double is an integer
        multiple of 2^-1074, x = X 2^-1074, so U = round((X A - C) / D) with
        integers A, C, D fixed by the policy (`_grid_constants`). The operands
        carry fixed offsets (`_X_OFFSET`, `self._u_offset`) so their sizes do
        not follow the input's binary fraction (a subnormal and 0.5 take the
        same integer work, up to CPython's digit arithmetic).
        """
        x_num, x_den = clipped.as_integer_ratio()
        shifted = (x_num << (_DOUBLE_SCALE_BITS - x_den.bit_length() + 1)) + _X_OFFSET
        scaled = 2 * (shifted * self._u_mul - self._u_sub) + self._u_div
        position = scaled // (2 * self._u_div) - self._u_offset
        return min(max(position, 0), self.levels << ROUNDING_BITS)

    def level_law(self, value: float | int | Decimal) -> list[tuple[int, Fraction]]:
        """The exact law of the input level of `value` (clipped first): [(j, P(j))]."""
        low, rest = divmod(self._grid_position(self.clip(value)[0]), 1 << ROUNDING_BITS)
        if rest == 0:
            return [(low, Fraction(1))]
        up = Fraction(rest, 1 << ROUNDING_BITS)
        return [(low, 1 - up), (low + 1, up)]

    def wire_probability(self, value: float | int | Decimal, y: float) -> Fraction:
        """P[the report is the double y, bit for bit | value], exactly (0 off the table)."""
        total = Fraction(0)
        for level, p in self.level_law(value):
            weights = self.index_weights(level)
            mass = sum(w for t, w in zip(self.table, weights, strict=True) if _same_bits(t, y))
            total += p * Fraction(mass, sum(weights))
        return total

    def _level(self, clipped: float, rng: random.Random) -> int:
        """Level floor(u) + 1 with probability (U mod 2^K) / 2^K, else floor(u).

        Always exactly one `getrandbits(K)` call, whatever the input (on a
        level, inside, clipped, subnormal): the CSPRNG use does not depend on it.
        """
        low, rest = divmod(self._grid_position(clipped), 1 << ROUNDING_BITS)
        draw = rng.getrandbits(ROUNDING_BITS)
        return low + (draw < rest)

    # --- the law of the output index given a level ---

    @abstractmethod
    def index_weights(self, level: int) -> tuple[int, ...]:
        """Exact integer weights W(i | j) of every output index i (same total for every j)."""

    @abstractmethod
    def _sample_index(self, level: int, rng: random.Random) -> int:
        """One index drawn with weights `index_weights(level)`."""

    @abstractmethod
    def _sample_index_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """Indices drawn with the same integer weights, one per level."""

    # --- device ---

    def perturb(self, value: float, *, rng: random.Random | None = None) -> NumericOutput:
        """Clip, round onto a level and draw one table value (see `perturb_with_clip`)."""
        return self.perturb_with_clip(value, rng=rng)[0]

    def perturb_with_clip(
        self, value: float | int | Decimal, *, rng: random.Random | None = None
    ) -> tuple[NumericOutput, bool]:
        """(the report, whether the value had to be clipped to [lo, hi])."""
        clipped, was_clipped = self.clip(value)
        r = rng if rng is not None else system_random()
        index = self._sample_index(self._level(clipped, r), r)
        return NumericOutput(self.table[index]), was_clipped

    def normalize_batch(self, values: Any) -> npt.NDArray[np.float64]:
        """Clip an array of values to [lo, hi] and map it to t (NaN raises)."""
        import numpy as np

        x = np.asarray(values, dtype=np.float64)
        if not np.all(np.isfinite(x)):
            raise ValueError("values must be finite")
        x = np.clip(x, self._lo, self._hi)
        return np.clip(2.0 * (x - self._lo) / (self._hi - self._lo) - 1.0, -1.0, 1.0)

    def levels_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        """Input levels of an array of values (randomized rounding in float64).

        The rounding probability u - floor(u) is computed in float64 here (the
        device path computes it exactly on the 2^-K grid); given the level, the
        batch and device paths use the same integer weights.
        """
        import numpy as np

        t = self.normalize_batch(values)
        u = np.clip((t + 1.0) * (self.levels / 2.0), 0.0, float(self.levels))
        low = np.minimum(np.floor(u), self.levels - 1).astype(np.int64)
        return low + (rng.random(t.shape[0]) < u - low)

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        """float64 table values for an array of values (clipped like `perturb`)."""
        import numpy as np

        indices = self._sample_index_batch(self.levels_batch(values, rng), rng)
        return np.asarray(self._table_array()[indices], dtype=np.float64)

    def _table_array(self) -> npt.NDArray[np.float64]:
        import numpy as np

        return np.array(self.table, dtype=np.float64)

    # --- collector ---

    def index_of(self, y: float) -> int:
        """The output index whose table value has exactly the bits of y (OutputDomainError)."""
        i = self._index.get(y)
        if i is None or not _same_bits(y, self.table[i]):
            raise OutputDomainError(
                "OUT_OF_DOMAIN",
                f"{self._name} output is not one of the policy's {len(self._index)} grid values",
            )
        return i

    def check_output(self, output: Output) -> None:
        """Accept exactly the table values, bit for bit; the message never shows the value."""
        if not isinstance(output, NumericOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", f"{self._name} expects a numeric payload")
        y = output.value
        if not isinstance(y, float) or not math.isfinite(y):
            raise OutputDomainError("NON_FINITE", f"{self._name} output must be a finite double")
        self.index_of(y)

    # --- aggregator ---

    def rounding_variance(self, t: Any) -> Any:
        """Var[t_J | t] = (t - t_lo)(t_hi - t) of the randomized rounding (array or scalar)."""
        import numpy as np

        u = (np.asarray(t, dtype=np.float64) + 1.0) * (self.levels / 2.0)
        frac = u - np.floor(u)
        return frac * (1.0 - frac) * (2.0 / self.levels) ** 2

    def conditional_variance(self, t: Any) -> Any:
        """Var[y | t] = c0 + c2 (t^2 + r(t)) - t^2, exact (module docstring), in t units."""
        import numpy as np

        t = np.asarray(t, dtype=np.float64)
        return self._c0 + self._c2 * (t * t + self.rounding_variance(t)) - t * t

    def _plug_in_variance(self, n: int, total_sq: float) -> float:
        """Estimated mean of Var[u | t_i] over users from Σ u^2 (see the module docstring)."""
        if self.c2 == 0:
            return self._c0  # worst case t = 0: an upper bound
        m2 = (total_sq / n - self._c0) / self._c2
        m2 = min(1.0, max(0.0, m2))
        return self._c0 + (self._c2 - 1.0) * m2 + 1.0 / self.levels**2

    def variance(self, values: Any) -> float:
        """Exact variance of the mean estimate for a population with these values."""
        import numpy as np

        t = self.normalize_batch(values)
        n = t.shape[0]
        if n == 0:
            raise ValueError("cannot compute a variance for zero values")
        return float(self.scale**2 * np.sum(self.conditional_variance(t)) / n**2)

    def _mean_estimate(self, n: int, total: float, total_sq: float) -> Estimate:
        """The mean lo + (hi - lo)(Σu / n + 1)/2 and its plug-in variance, from Σu and Σu^2."""
        import numpy as np

        if n <= 0:
            raise ValueError("cannot estimate from zero reports")
        mean = self._lo + self.scale * (total / n + 1.0)
        var = self.scale**2 * self._plug_in_variance(n, total_sq) / n
        return Estimate(n=n, values=np.array([mean]), variances=np.array([var]))


class MeanMechanism(NumericMechanism):
    """A numeric mechanism whose wire value is the unbiased value: Duchi, Piecewise, Hybrid.

    Its statistic is the exact `MomentStatistic` of the wire values; `estimate`
    is the mean with its plug-in variance (module docstring).
    """

    def new_statistic(self) -> MomentStatistic:
        return MomentStatistic()

    def accumulate(self, statistic: MomentStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, NumericOutput)
        statistic.add(output.value)

    def accumulate_batch(self, statistic: MomentStatistic, outputs: Any) -> None:
        """Add a float64 array of table values (as from `perturb_batch`), checked bit for bit."""
        import numpy as np

        y = np.ascontiguousarray(outputs, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise OutputDomainError("NON_FINITE", f"{self._name} output must be a finite double")
        if not np.all(np.isin(y.view(np.uint64), self._table_array().view(np.uint64))):
            raise OutputDomainError(
                "OUT_OF_DOMAIN", f"{self._name} outputs must be the policy's grid values"
            )
        # Table values repeat: each distinct bit pattern is scaled once, times its count.
        bits, counts = np.unique(y.view(np.uint64), return_counts=True)
        statistic.add_counted(bits.view(np.float64).tolist(), counts.tolist())

    def estimate(self, statistic: MomentStatistic) -> Estimate:
        return self._mean_estimate(statistic.n, statistic.total, statistic.total_sq)


def _duchi_weights(weights: Weights, levels: int, level: int) -> tuple[int, int]:
    """(W(-B | j), W(+B | j)) = (J a - (a - b) j, J b + (a - b) j); total J (a + b)."""
    a, b = weights.high, weights.low
    plus = levels * b + (a - b) * level
    return levels * (a + b) - plus, plus


def _duchi_value(weights: Weights) -> Fraction:
    """B = (a + b)/(a - b): makes E[y | j] = t_j for the weights above."""
    return Fraction(weights.high + weights.low, weights.high - weights.low)


class Duchi(MeanMechanism):
    """Duchi et al.'s one-dimensional mechanism on two exact outputs ±B (J = 1 level step)."""

    wire_id = "duchi"
    _name = "duchi"

    def __init__(self, epsilon: Decimal, lo: Decimal, hi: Decimal) -> None:
        super().__init__(epsilon, lo, hi, levels=1)
        self.weights = Weights.for_epsilon(epsilon, 2)
        self.B_exact = _duchi_value(self.weights)
        self._set_table((-self.B_exact, self.B_exact), self.B_exact**2, Fraction(0))
        self.B = self.table[1]

    def index_weights(self, level: int) -> tuple[int, ...]:
        return _duchi_weights(self.weights, 1, level)

    def _sample_index(self, level: int, rng: random.Random) -> int:
        minus, plus = _duchi_weights(self.weights, 1, level)
        return int(rng.randrange(minus + plus) < plus)

    def _sample_index_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        a, b = self.weights.high, self.weights.low
        draw = rng.integers(0, a + b, size=levels.shape[0], dtype=np.int64)
        return (draw < np.where(levels == 1, a, b)).astype(np.int64)


@dataclass(frozen=True)
class _PiecewiseGrid:
    """The discrete piecewise law: J levels, N = J + w cells, band weight a, other b."""

    levels: int
    cells: int
    weights: Weights

    @property
    def band(self) -> int:
        return self.cells - self.levels

    @property
    def total(self) -> int:
        """Z = w a + J b, the same for every level."""
        return self.band * self.weights.high + self.levels * self.weights.low

    def step(self) -> Fraction:
        """β = 2Z / (J (a - b) w): makes E[y | j] = t_j."""
        a, b = self.weights.high, self.weights.low
        return Fraction(2 * self.total, self.levels * (a - b) * self.band)

    def values(self) -> list[Fraction]:
        """y_i = β (i - (N - 1)/2)."""
        beta = self.step()
        return [beta * Fraction(2 * i - (self.cells - 1), 2) for i in range(self.cells)]

    def moments(self) -> tuple[Fraction, Fraction]:
        """(c0, c2) with E[y^2 | j] = c0 + c2 t_j^2."""
        a, b = self.weights.high, self.weights.low
        n, w, beta = self.cells, self.band, self.step()
        c0 = beta**2 * (b * n * (n * n - 1) + (a - b) * w * (w * w - 1)) / (12 * self.total)
        return c0, beta * self.levels / 2

    def weights_at(self, level: int) -> tuple[int, ...]:
        a, b, w = self.weights.high, self.weights.low, self.band
        return tuple(a if level <= i < level + w else b for i in range(self.cells))

    def sample(self, level: int, rng: random.Random) -> int:
        a, b, w = self.weights.high, self.weights.low, self.band
        r = rng.randrange(self.total)
        if r < w * a:
            return level + r // a
        rest = (r - w * a) // b
        return rest if rest < level else rest + w

    def sample_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        a, b, w = self.weights.high, self.weights.low, self.band
        r = rng.integers(0, self.total, size=levels.shape[0], dtype=np.int64)
        in_band = r < w * a
        rest = (r - w * a) // b
        outside = np.where(rest < levels, rest, rest + w)
        chosen: npt.NDArray[np.int64] = np.where(in_band, levels + r // a, outside)
        return chosen.astype(np.int64)


class OnPiecewiseGrid:
    """The output law of a mechanism that is exactly its `_PiecewiseGrid`'s banded law
    (piecewise, sw): the grid's cells, weights and samplers, written once."""

    grid: _PiecewiseGrid

    @property
    def cells(self) -> int:
        """Cells of the output grid (the signed "cells" parameter)."""
        return self.grid.cells

    def index_weights(self, level: int) -> tuple[int, ...]:
        """W(i | j): a on the level's band, b elsewhere (the grid's law)."""
        return self.grid.weights_at(level)

    def _sample_index(self, level: int, rng: random.Random) -> int:
        return self.grid.sample(level, rng)

    def _sample_index_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        return self.grid.sample_batch(levels, rng)


class Piecewise(OnPiecewiseGrid, MeanMechanism):
    """Wang et al.'s Piecewise Mechanism on N = J + w exact cell values.

    `levels` and `cells` default to the derived grid (`grid_size`).
    """

    wire_id = "piecewise"
    _name = "piecewise"

    def __init__(
        self,
        epsilon: Decimal,
        lo: Decimal,
        hi: Decimal,
        levels: int | None = None,
        cells: int | None = None,
    ) -> None:
        levels, cells = grid_size(self.wire_id, epsilon, levels, cells)
        super().__init__(epsilon, lo, hi, levels)
        self.grid = _PiecewiseGrid(levels, cells, Weights.for_epsilon(epsilon, 2 * cells))
        c0, c2 = self.grid.moments()
        self._set_table(self.grid.values(), c0, c2)


class Hybrid(MeanMechanism):
    """Wang et al.'s Hybrid Mechanism: piecewise w.p. α, Duchi otherwise, on the same level.

    Output indices: the N piecewise cells, then N for -B and N + 1 for +B (only
    0 for -B and 1 for +B when α = 0). `levels` and `cells` default to the
    derived grid (`grid_size`).
    """

    wire_id = "hybrid"
    _name = "hybrid"

    def __init__(
        self,
        epsilon: Decimal,
        lo: Decimal,
        hi: Decimal,
        levels: int | None = None,
        cells: int | None = None,
    ) -> None:
        levels, cells = grid_size(self.wire_id, epsilon, levels, cells)
        super().__init__(epsilon, lo, hi, levels)
        self.grid = _PiecewiseGrid(levels, cells, Weights.for_epsilon(epsilon, 2 * cells))
        self.duchi_weights = Weights.for_epsilon(epsilon, 2 * levels)
        self.B_exact = _duchi_value(self.duchi_weights)
        #: α = floor((1 - e^{-ε/2}) 2^32) / 2^32 above ε* (Wang et al. ICDE 2019, eq. (5)).
        self.alpha_weight = (
            (1 << WEIGHT_BITS) - 1 - exp_floor(-epsilon / 2, 1 << WEIGHT_BITS)
            if epsilon > HYBRID_EPSILON_STAR
            else 0
        )
        self.alpha_exact = Fraction(self.alpha_weight, 1 << WEIGHT_BITS)
        self.alpha = float(self.alpha_exact)
        c0_pm, c2_pm = self.grid.moments()
        a = self.alpha_exact
        c0 = a * c0_pm + (1 - a) * self.B_exact**2
        if self.alpha_weight:
            self._set_table([*self.grid.values(), -self.B_exact, self.B_exact], c0, a * c2_pm)
        else:
            self._set_table([-self.B_exact, self.B_exact], c0, Fraction(0))
        self.B = float(self.B_exact)

    @property
    def cells(self) -> int:
        """Cells of the output grid (the signed "cells" parameter)."""
        return self.grid.cells

    def index_weights(self, level: int) -> tuple[int, ...]:
        """α_w Z_D W_PM(i|j) for cells, (2^32 - α_w) Z_PM W_D(±|j) for ±B."""
        duchi = _duchi_weights(self.duchi_weights, self.levels, level)
        if not self.alpha_weight:
            return duchi
        z_duchi = self.levels * (self.duchi_weights.high + self.duchi_weights.low)
        rest = (1 << WEIGHT_BITS) - self.alpha_weight
        cells = tuple(self.alpha_weight * z_duchi * w for w in self.grid.weights_at(level))
        return cells + tuple(rest * self.grid.total * w for w in duchi)

    def _duchi_offset(self) -> int:
        return self.grid.cells if self.alpha_weight else 0

    def _sample_index(self, level: int, rng: random.Random) -> int:
        if rng.randrange(1 << WEIGHT_BITS) < self.alpha_weight:
            return self.grid.sample(level, rng)
        minus, plus = _duchi_weights(self.duchi_weights, self.levels, level)
        return self._duchi_offset() + int(rng.randrange(minus + plus) < plus)

    def _sample_index_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        n = levels.shape[0]
        a, b = self.duchi_weights.high, self.duchi_weights.low
        draw = rng.integers(0, self.levels * (a + b), size=n, dtype=np.int64)
        duchi = self._duchi_offset() + (draw < self.levels * b + (a - b) * levels)
        if not self.alpha_weight:
            return duchi.astype(np.int64)
        use_pm = rng.integers(0, 1 << WEIGHT_BITS, size=n, dtype=np.int64) < self.alpha_weight
        return np.where(use_pm, self.grid.sample_batch(levels, rng), duchi).astype(np.int64)


#: Mechanisms that take the grid parameters "levels" and "cells".
GRID_MECHANISMS = ("piecewise", "hybrid", "sw")

__all__ = [
    "DEFAULT_LEVELS",
    "GRID_MECHANISMS",
    "Duchi",
    "Hybrid",
    "MeanMechanism",
    "NumericMechanism",
    "Piecewise",
    "exp_floor",
    "grid_params",
    "grid_size",
    "parse_grid",
    "square_wave_band",
]
