"""The numeric mechanisms' guarantees, computed exactly on the bytes that leave the device.

* privacy: the whole law of the wire bytes per input level, as Fractions from the
  very integer weights the sampler draws with, has max ratio <= e^ε (rational
  comparison against a lower bound of e^ε), for every mechanism at ε in
  {0.5, 1, 2, 4} and two grid sizes; also for pairs of real inputs one ulp
  apart, through the exact rounding step. A band weight ratio above e^ε fails.
* the wire: for inputs at and beyond the ends, one ulp apart and in between,
  every double sent (device path with a seeded random.Random and with the OS
  CSPRNG, batch path with numpy) is bit for bit one of the fixed table values,
  which do not depend on the input. Today's floating-point piecewise (the
  legacy fixture) fails that check and shows the bit leak the issue describes.
* unbiasedness (up to the stated 2^-K / J grid rounding) and the variance
  formula, exactly (Fractions over the law).
* no device-local side channel: one report draws the same sequence of random
  calls (and bits) for every input: on a level, inside, subnormal, -0.0, clipped.
"""

from __future__ import annotations

import math
import random
import struct
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import Any, cast

import numpy as np
import pytest
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.numeric import (
    ROUNDING_BITS,
    Hybrid,
    NumericMechanism,
    Piecewise,
    Weights,
    default_band,
    exp_floor,
)
from fedldp.client.mechanisms.square_wave import SquareWave
from legacy_float_numeric import LegacyPiecewise  # type: ignore[import-not-found]
from mech_cases import (  # type: ignore[import-not-found]
    HI,
    LO,
    exp_bounds,
    input_wire_law,
    level_wire_weights,
    max_ratio,
    wire_bytes,
)
from test_mechanism_contract import (  # type: ignore[import-not-found]
    check_unbiased_and_variance,
    population,
)

EPSILONS = ["0.5", "1", "2", "4"]
#: (params) of the two grid sizes checked: the derived default, and a small one.
GRIDS: list[dict[str, str]] = [{}, {"levels": "16"}]


def build(wire_id: str, epsilon: str, params: dict[str, str] | None = None) -> NumericMechanism:
    mech = create(wire_id, Decimal(epsilon), (LO, HI), params or {})
    assert isinstance(mech, NumericMechanism)
    return mech


def max_level_ratio(mech: NumericMechanism) -> Fraction | None:
    """Exact max over levels j, j' and wire values y of P[y|j]/P[y|j'] (None: infinite)."""
    laws = [level_wire_weights(mech, j) for j in range(mech.levels + 1)]
    totals = {sum(law.values()) for law in laws}
    assert len(totals) == 1, "the total weight must not depend on the level"
    worst = Fraction(1)
    for key in set().union(*laws):
        weights = [law.get(key, 0) for law in laws]
        if min(weights) == 0:
            return None
        worst = max(worst, Fraction(max(weights), min(weights)))
    return worst


def assert_ratio_at_most_e_eps(ratio: Fraction | None, epsilon: str) -> None:
    lower, _ = exp_bounds(Decimal(epsilon))
    assert ratio is not None, "a wire value is possible under one input and not another"
    assert ratio <= lower, f"max ratio {float(ratio)!r} exceeds e^{epsilon}"


# --- exact privacy ----------------------------------------------------------------------


@pytest.mark.parametrize("grid", GRIDS, ids=["default-grid", "levels16"])
@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("wire_id", ["duchi", "piecewise", "hybrid", "sw"])
def test_exact_ratio_over_every_level_is_at_most_e_eps(
    wire_id: str, epsilon: str, grid: dict[str, str]
) -> None:
    mech = build(wire_id, epsilon, {} if wire_id == "duchi" else grid)
    ratio = max_level_ratio(mech)
    assert_ratio_at_most_e_eps(ratio, epsilon)
    assert ratio is not None and math.log(ratio) > float(epsilon) - 1e-9  # and tight


def wide_band(epsilon: str, factor: str) -> Piecewise:
    """Broken: band weight ratio floor(e^{factor ε} 2^32)/2^32 instead of e^ε."""
    mech = Piecewise(Decimal(epsilon), LO, HI, 16, 24)
    wide = Weights.for_epsilon(Decimal(epsilon) * Decimal(factor), 48)
    mech.grid = type(mech.grid)(16, 24, wide)
    return mech


@pytest.mark.parametrize("factor", ["1.001", "2"])
def test_exact_ratio_check_fails_on_a_band_ratio_above_e_eps(factor: str) -> None:
    with pytest.raises(AssertionError, match="exceeds"):
        assert_ratio_at_most_e_eps(max_level_ratio(wide_band("1", factor)), "1")


def test_exact_ratio_check_fails_when_the_output_set_depends_on_the_input() -> None:
    """Broken: a cell that only the top level can produce (its weight moved elsewhere)."""

    class LeakyCell(Piecewise):
        def index_weights(self, level: int) -> tuple[int, ...]:
            weights = list(super().index_weights(level))
            if level != self.levels:
                weights[0] += weights[-1]
                weights[-1] = 0
            return tuple(weights)

    mech = LeakyCell(Decimal(1), LO, HI, 8, 12)
    with pytest.raises(AssertionError, match="one input"):
        assert_ratio_at_most_e_eps(max_level_ratio(mech), "1")


def neighbours(x: float) -> list[float]:
    """x and the doubles one and two ulps either side."""
    down = math.nextafter(x, -math.inf)
    up = math.nextafter(x, math.inf)
    return [math.nextafter(down, -math.inf), down, x, up, math.nextafter(up, math.inf)]


def real_inputs(mech: NumericMechanism) -> list[float]:
    lo, hi = float(mech.lo), float(mech.hi)
    level = lo + (hi - lo) * 3 / mech.levels  # exactly on a level, and its neighbours
    return [*neighbours(lo), *neighbours(hi), *neighbours(1.0), *neighbours(level), 0.1, 1e-300]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("wire_id", ["duchi", "piecewise", "hybrid", "sw"])
def test_real_inputs_one_ulp_apart_through_the_exact_rounding(wire_id: str, epsilon: str) -> None:
    mech = build(wire_id, epsilon, {} if wire_id == "duchi" else {"levels": "16"})
    inputs = real_inputs(mech)
    laws = [input_wire_law(mech, x) for x in inputs]
    assert_ratio_at_most_e_eps(max_ratio(laws), epsilon)
    for x, law in zip(inputs, laws, strict=True):
        assert sum(law.values()) == 1
        # The rounding sees x to 2^-K of a level step: E[t_J] is t within 2^-K / J.
        t = exact_t(mech, x)
        levels = mech.level_law(x)
        mean = sum(p * (Fraction(2 * j, mech.levels) - 1) for j, p in levels)
        assert abs(mean - t) <= rounding_bias_bound(mech)
        # The law is the exact rounding of U = round(u 2^K) with probability U mod 2^K / 2^K.
        u_grid = round((t + 1) * mech.levels / 2 * 2**ROUNDING_BITS)
        low, rest = divmod(u_grid, 2**ROUNDING_BITS)
        expected = [(low, Fraction(1))] if rest == 0 else []
        if rest:
            expected = [(low, 1 - Fraction(rest, 2**ROUNDING_BITS))]
            expected.append((low + 1, Fraction(rest, 2**ROUNDING_BITS)))
        assert levels == expected


def exact_t(mech: NumericMechanism, x: float) -> Fraction:
    """t = 2 (clip(x) - lo)/(hi - lo) - 1, exactly, with the exact (Decimal) bounds."""
    clipped = min(max(Fraction(x), Fraction(mech.lo)), Fraction(mech.hi))
    return 2 * (clipped - Fraction(mech.lo)) / (Fraction(mech.hi) - Fraction(mech.lo)) - 1


def rounding_bias_bound(mech: NumericMechanism) -> Fraction:
    """|E[t_J] - t| <= half of 2^-K level steps of 2/J each (the deterministic grid rounding)."""
    return Fraction(1, mech.levels * 2**ROUNDING_BITS)


def test_inputs_one_ulp_apart_get_different_exact_rounding_laws() -> None:
    mech = build("piecewise", "1", {"levels": "16"})
    x = 1.0 + 2**-40
    assert mech.level_law(x) != mech.level_law(math.nextafter(x, math.inf))


def test_weights_are_the_floor_of_e_eps() -> None:
    for epsilon in EPSILONS:
        w = Weights.for_epsilon(Decimal(epsilon), 1024)
        lower, upper = exp_bounds(Decimal(epsilon))
        assert w.low == 1 << 32
        assert w.high <= lower * w.low and w.high + 1 > upper * w.low
    assert default_band(Decimal("4"), 256) == round(256 * math.exp(-2))


def test_exp_floor_refuses_an_undecidable_floor() -> None:
    with pytest.raises(ValueError, match="decide"):
        exp_floor(Decimal(0), 7)


# --- the wire: a fixed table, bit for bit -------------------------------------------------


def extreme_inputs(mech: NumericMechanism) -> list[Any]:
    lo, hi = float(mech.lo), float(mech.hi)
    return [
        *real_inputs(mech),
        lo - 1e300,
        hi + 1e300,
        -1.797e308,
        1.797e308,
        Decimal("1.5"),
        3,
        math.nextafter(lo, -math.inf),
        math.nextafter(hi, math.inf),
    ]


CASES = [
    ("duchi", "1", {}),
    ("piecewise", "0.5", {}),
    ("piecewise", "4", {"levels": "16"}),
    ("hybrid", "1", {}),
    ("hybrid", "4", {"levels": "16"}),
    ("hybrid", "0.5", {}),
    ("sw", "1", {}),
    ("sw", "4", {"levels": "16"}),
    ("sw", "0.5", {"levels": "8", "cells": "15"}),
]


def sent(mech: NumericMechanism, value: Any, n: int, seed: int) -> Iterator[bytes]:
    rng = random.Random(seed)
    for _ in range(n):
        yield wire_bytes(mech.perturb(value, rng=rng).value)


@pytest.mark.parametrize(("wire_id", "epsilon", "params"), CASES)
def test_every_double_sent_is_a_table_value_independent_of_the_input(
    wire_id: str, epsilon: str, params: dict[str, str]
) -> None:
    mech = build(wire_id, epsilon, params)
    table = {wire_bytes(y) for y in mech.table}
    # The table is a function of the policy only: a fresh build gives the same bytes.
    assert [wire_bytes(y) for y in build(wire_id, epsilon, params).table] == [
        wire_bytes(y) for y in mech.table
    ]
    for seed, value in enumerate(extreme_inputs(mech)):
        assert set(sent(mech, value, 300, seed)) <= table
        assert wire_bytes(mech.perturb(value).value) in table  # OS CSPRNG
    batch = mech.perturb_batch(
        np.array([float(v) for v in extreme_inputs(mech)] * 500), np.random.default_rng(5)
    )
    assert {wire_bytes(float(y)) for y in batch} <= table
    assert batch.dtype == np.float64


def test_the_legacy_float_piecewise_fails_the_wire_check_and_leaks_its_bits() -> None:
    """Today's float piecewise (test fixture): its doubles are not a fixed set, and the
    issue's byte event (an output in [1, 2) with an odd last mantissa bit) happens
    under one end of the range and never under the other."""
    legacy = LegacyPiecewise(Decimal(1), Decimal(0), Decimal(1))
    rng = np.random.default_rng(1)
    at_lo = legacy.perturb_batch(np.zeros(200_000), rng)
    at_hi = legacy.perturb_batch(np.ones(200_000), rng)

    def odd_in_one_two(ys: np.ndarray) -> int:
        bits = ys.view(np.uint64)
        return int(np.sum((ys >= 1.0) & (ys < 2.0) & ((bits & np.uint64(1)) == 1)))

    counts = sorted([odd_in_one_two(at_lo), odd_in_one_two(at_hi)])
    assert counts[0] == 0 and counts[1] > 100  # an infinite ratio on the bytes
    table = {wire_bytes(y) for y in build("piecewise", "1").table}
    assert not {wire_bytes(float(y)) for y in at_lo[:1000]} <= table


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_the_same_byte_event_has_bounded_ratio_on_the_grid(epsilon: str) -> None:
    """Exact P[event] under both ends for every (sign, exponent, last bit) event class."""
    mech = build("piecewise", epsilon)
    lower, _ = exp_bounds(Decimal(epsilon))

    def event_law(value: float) -> dict[tuple[int, int], Fraction]:
        law: dict[tuple[int, int], Fraction] = {}
        for key, p in input_wire_law(mech, value).items():
            (bits,) = struct.unpack("<Q", key)
            event = (bits >> 52, bits & 1)
            law[event] = law.get(event, Fraction(0)) + p
        return law

    a, b = event_law(float(mech.lo)), event_law(float(mech.hi))
    assert set(a) == set(b)
    for event in a:
        assert max(a[event], b[event]) <= lower * min(a[event], b[event])


# --- unbiasedness and the variance formula, exactly ------------------------------------------


@pytest.mark.parametrize(("wire_id", "epsilon", "params"), CASES)
def test_exact_mean_and_variance_of_the_law(
    wire_id: str, epsilon: str, params: dict[str, str]
) -> None:
    mech = build(wire_id, epsilon, params)
    exact_values = exact_table(mech)
    assert exact_values == list(mech.unbiased)
    by_bytes = dict(zip([wire_bytes(y) for y in mech.table], exact_values, strict=True))
    for x in real_inputs(mech):
        law = input_wire_law(mech, x)
        mean = sum(p * by_bytes[k] for k, p in law.items())
        second = sum(p * by_bytes[k] ** 2 for k, p in law.items())
        t = exact_t(mech, x)
        # Unbiased on the exact table values up to the grid rounding of the input.
        assert abs(mean - t) <= rounding_bias_bound(mech)
        variance = float(second - t * t)
        assert float(mech.conditional_variance(float(t))) == pytest.approx(variance, rel=1e-9)
        if isinstance(mech, SquareWave):
            continue  # its doubles are the cell centres; u_i is computed from the counts
        # The doubles sent are the exact values rounded: the bias is at most their rounding.
        float_mean = sum(p * Fraction(struct.unpack("<d", k)[0]) for k, p in law.items())
        bound = max(abs(v) for v in exact_values) * Fraction(1, 2**52)
        assert abs(float_mean - t) <= bound + rounding_bias_bound(mech)


def exact_table(mech: NumericMechanism) -> list[Fraction]:
    """The exact rationals behind the table doubles (numeric.py's formulas)."""
    if isinstance(mech, Hybrid):
        duchi = [-mech.B_exact, mech.B_exact]
        return [*mech.grid.values(), *duchi] if mech.alpha_weight else duchi
    if isinstance(mech, Piecewise | SquareWave):
        return mech.grid.values()
    return [-mech.B_exact, mech.B_exact]  # type: ignore[attr-defined]


class NoRoundingTerm(Piecewise):
    """Broken variance: leaves out the rounding term c2 (t - t_lo)(t_hi - t)."""

    def conditional_variance(self, t: Any) -> Any:
        return super().conditional_variance(t) - self._c2 * self.rounding_variance(t)


def test_variance_includes_the_rounding_term_and_the_check_catches_its_absence() -> None:
    coarse = Piecewise(Decimal(4), LO, HI, 2, 3)  # J = 2: the rounding term is large
    values = population(coarse, 3000, seed=11)
    check_unbiased_and_variance(coarse, values, reps=300, seed=5)
    broken = NoRoundingTerm(Decimal(4), LO, HI, 2, 3)
    with pytest.raises(AssertionError, match="variance ratio"):
        check_unbiased_and_variance(broken, values, reps=300, seed=5)


# --- the exact-law API the auditor and tests share ------------------------------------------


@pytest.mark.parametrize(("wire_id", "epsilon", "params"), CASES)
def test_wire_probability_is_the_exact_law(
    wire_id: str, epsilon: str, params: dict[str, str]
) -> None:
    mech = build(wire_id, epsilon, params)
    x = float(mech.lo) + 0.3 * float(mech.hi - mech.lo)
    law = input_wire_law(mech, x)
    distinct = {wire_bytes(y): y for y in mech.table}
    assert sum(mech.wire_probability(x, y) for y in distinct.values()) == 1
    for key, y in distinct.items():
        assert mech.wire_probability(x, y) == law[key]
    off_grid = [
        math.nextafter(mech.bound, math.inf),
        0.123456789,
        -0.0 if 0.0 in mech.table else 0.0,
    ]
    assert all(mech.wire_probability(x, y) == 0 for y in off_grid)
    assert mech.bound == max(abs(y) for y in mech.table)


def test_direct_construction_uses_the_derived_grid_and_validates_it() -> None:
    assert Piecewise(Decimal(1), LO, HI).table == build("piecewise", "1").table
    assert Hybrid(Decimal(2), LO, HI, 16).table == build("hybrid", "2", {"levels": "16"}).table
    with pytest.raises(ValueError, match="cells"):
        Piecewise(Decimal(1), LO, HI, 8, 8)
    with pytest.raises(TypeError, match="int"):
        Hybrid(Decimal(1), LO, HI, 8.0)  # type: ignore[arg-type]


# --- the randomness one report uses does not depend on the input -----------------------------


class CountingRandom(random.Random):
    """A seeded generator that records every call into it: (method, size)."""

    def __init__(self, seed: int) -> None:
        self.calls: list[tuple[str, int]] = []
        super().__init__(seed)

    def getrandbits(self, k: int) -> int:
        self.calls.append(("getrandbits", k))
        return super().getrandbits(k)

    def random(self) -> float:
        self.calls.append(("random", 53))
        return super().random()

    def _randbelow(self, n: int) -> int:
        self.calls.append(("randbelow", n.bit_length()))
        return int(super()._randbelow(n))  # type: ignore[misc]  # private: not in typeshed


def side_channel_inputs(mech: NumericMechanism) -> dict[str, float | int | Decimal]:
    lo, hi = float(mech.lo), float(mech.hi)
    return {
        "on a level": lo + (hi - lo) * 3 / mech.levels,
        "lo": lo,
        "hi": hi,
        "0.3 of the range": lo + 0.3 * (hi - lo),
        "0.5": 0.5,
        "subnormal": 5e-324,
        "1e-300": 1e-300,
        "-0.0": -0.0,
        "below the range": lo - 1e6,
        "above the range": 1e300,
        "int": 1,
        "Decimal": Decimal("0.1234567890123456789"),
    }


def random_calls(mech: NumericMechanism, value: float | int | Decimal, reports: int) -> list[Any]:
    rng = CountingRandom(seed=2024)
    for _ in range(reports):
        # Decimal on purpose: the mechanism takes any real number as `value`.
        mech.perturb(cast(float, value), rng=rng)
    return rng.calls


def check_input_independent_randomness(mech: NumericMechanism) -> None:
    calls = {name: random_calls(mech, x, 50) for name, x in side_channel_inputs(mech).items()}
    reference = calls["on a level"]
    for name, sequence in calls.items():
        assert sequence == reference, f"random calls differ for the input {name!r}"
    bits = sum(k for method, k in reference if method == "getrandbits")
    assert bits >= 50 * ROUNDING_BITS


@pytest.mark.parametrize("wire_id", ["duchi", "piecewise", "hybrid", "sw"])
@pytest.mark.parametrize("epsilon", ["0.5", "4"])
def test_every_input_draws_the_same_random_calls(wire_id: str, epsilon: str) -> None:
    check_input_independent_randomness(build(wire_id, epsilon))


class ExactFractionRounding(Piecewise):
    """Broken variant (the earlier sampler): randrange(den) on the input's own fraction."""

    def _level(self, clipped: float, rng: random.Random) -> int:
        position = Fraction(self.levels) * (Fraction(clipped) - Fraction(self.lo))
        position /= Fraction(self.hi) - Fraction(self.lo)
        low, rest = divmod(position.numerator, position.denominator)
        if rest and rng.randrange(position.denominator) < rest:
            return low + 1
        return low


def test_the_randomness_check_catches_input_dependent_rounding() -> None:
    broken = ExactFractionRounding(Decimal(1), LO, HI)
    with pytest.raises(AssertionError, match="random calls differ"):
        check_input_independent_randomness(broken)


def test_clipping_a_double_is_exact_against_bounds_that_are_no_double() -> None:
    lo, hi = Decimal("0.1"), Decimal("0.7")  # neither is a double
    mech = Piecewise(Decimal(1), lo, hi, 16)
    for x in [*neighbours(0.1), *neighbours(0.7), 0.4, -0.0, 5e-324]:
        outside = Fraction(x) < Fraction(lo) or Fraction(x) > Fraction(hi)
        assert mech.clip(x)[1] is outside
