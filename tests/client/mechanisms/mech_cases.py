"""Small-parameter instances of every registered mechanism, and exact-law helpers.

Shared by the contract tests. Parameters are small so every output can be
enumerated and every law checked exactly.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import numpy as np
from fedldp.client.mechanisms import AttributeSpec, MultiMetric, OpenDomain, create
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    Mechanism,
    NumericOutput,
    Output,
)
from fedldp.client.mechanisms.memo import Memoized
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.mechanisms.oracle import FrequencyOracle

LO, HI = Decimal("-2"), Decimal("6")


@dataclass(frozen=True)
class Case:
    wire_id: str
    epsilon: Decimal
    metric: Any
    params: tuple[tuple[str, str], ...] = ()

    def build(self) -> Any:
        return create(self.wire_id, self.epsilon, self.metric, dict(self.params))

    def __str__(self) -> str:
        extra = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.wire_id}-eps{self.epsilon}-{self.metric}{'-' + extra if extra else ''}"


CATEGORICAL_CASES = [
    Case("grr", Decimal("1"), 5),
    Case("grr", Decimal("0.5"), 2),
    Case("oue", Decimal("1"), 4),
    Case("sue", Decimal("1.5"), 4),
    Case("olh", Decimal("1"), 5),
    Case("olh", Decimal("2"), 4, (("g", "5"),)),
    Case("hr", Decimal("1"), 5),
    Case("ss", Decimal("1"), 5),
    Case("ss", Decimal("0.5"), 6, (("d", "2"),)),
    Case("rappor-oue", Decimal("1"), 3, (("epsilon_permanent", "2.5"),)),
    Case("rappor-sue", Decimal("1"), 3, (("epsilon_permanent", "2"),)),
    Case("rappor-grr", Decimal("1"), 4, (("epsilon_permanent", "3"),)),
    Case("loloha", Decimal("1"), 4, (("epsilon_permanent", "2"), ("g", "3"))),
]
#: The memoized ones (their exact laws and charges are memo.py's own contract).
MEMO_CASES = [c for c in CATEGORICAL_CASES if c.wire_id.startswith("rappor-")]
#: Memoized longitudinal mechanisms with their own contract suite (test_longitudinal.py,
#: test_longitudinal_claims.py): dbitflip's input is a number, its estimate the mean.
LONGITUDINAL_CASES = [
    Case("dbitflip", Decimal("1"), (LO, HI), (("epsilon_permanent", "2"), ("buckets", "4"))),
]
NUMERIC_CASES = [
    Case("duchi", Decimal("1"), (LO, HI)),
    Case("piecewise", Decimal("1"), (LO, HI)),
    Case("piecewise", Decimal("4"), (LO, HI), (("levels", "8"), ("cells", "10"))),
    Case("hybrid", Decimal("2"), (LO, HI)),
    Case("hybrid", Decimal("1"), (LO, HI), (("levels", "6"), ("cells", "10"))),
    Case("hybrid", Decimal("0.5"), (LO, HI)),
    Case("sw", Decimal("1"), (LO, HI)),
    Case("sw", Decimal("4"), (LO, HI), (("levels", "8"), ("cells", "11"))),
]
ALL_CASES = CATEGORICAL_CASES + NUMERIC_CASES
#: Sketches over open string domains: their own contract suite is test_sketch.py
#: (string inputs, candidate estimates), run over these cases.
SKETCH_CASES = [
    Case("cms", Decimal("1"), OpenDomain(16), (("rows", "4"), ("columns", "16"))),
    Case("cms", Decimal("4"), OpenDomain(64)),
    Case("hcms", Decimal("2"), OpenDomain(16), (("rows", "8"), ("columns", "8"))),
    Case("hcms", Decimal("0.5"), OpenDomain(64)),
]
#: Multi-attribute mechanisms: their own contract suite (test_multi_attribute.py), which
#: checks the joint law, the part checks and the per-attribute estimates.
MULTI_METRIC = MultiMetric(
    (
        AttributeSpec("kind", ("a", "b", "c"), None, "grr"),
        AttributeSpec("size", None, (LO, HI), "piecewise", (("cells", "6"), ("levels", "4"))),
    )
)
MULTI_CASES = [
    Case("multi-split", Decimal("1"), MULTI_METRIC),
    Case("multi-sample", Decimal("1"), MULTI_METRIC),
]

#: Open-domain (string) mechanisms: their contract suites are their own files
#: (pem: test_pem.py; cms, hcms: test_sketch.py over SKETCH_CASES), since their outputs
#: cannot be enumerated.
OPEN_CASES = [
    Case("pem", Decimal("2"), OpenDomain(2), (("g", "8"),)),
    *SKETCH_CASES,
]

#: The frequency oracles whose samplers state their exact law (`exact_probability`).
EXACT_ORACLES = ("grr", "oue", "sue", "olh", "hr", "ss")
EXACT_EPSILONS = ("0.5", "1", "2", "4")
#: Domain sizes per oracle: every output is enumerated, so small ones.
EXACT_KS = {
    "grr": (2, 5, 64),
    "oue": (2, 3, 5),
    "sue": (2, 3, 5),
    "olh": (2, 5),
    "hr": (2, 5, 8),
    "ss": (3, 5, 8),
}
EXACT_CASES = [
    Case(wire_id, Decimal(eps), k)
    for wire_id in EXACT_ORACLES
    for eps in EXACT_EPSILONS
    for k in EXACT_KS[wire_id]
]


def perturb_one(mech: Mechanism[Any, Any], value: Any, rng: Any, memo: Any = None) -> Output:
    """perturb, with a fresh memo for memoized mechanisms unless one is given."""
    if isinstance(mech, Memoized):
        memoized: Any = mech
        return memoized.perturb(value, rng=rng, memo=memo if memo is not None else mech.new_memo())  # type: ignore[no-any-return]
    return mech.perturb(value, rng=rng)


def batch_to_outputs(mech: Mechanism, batch: Any) -> list[Output]:  # type: ignore[type-arg]
    """Batch layout -> Output objects (the inverse of the documented layouts)."""
    if isinstance(mech, NumericMechanism):
        return [NumericOutput(float(y)) for y in batch]
    if isinstance(batch, tuple):
        seeds, values = batch
        return [HashedOutput(int(s), int(v)) for s, v in zip(seeds, values, strict=True)]
    batch = np.asarray(batch)
    if batch.ndim == 2:
        length = mech.k  # type: ignore[attr-defined]
        return [BitVectorOutput(row.tobytes(), length) for row in batch]
    return [CategoryOutput(int(i)) for i in batch]


def float_law(mech: FrequencyOracle, value: int) -> dict[Output, float]:
    """Every output with its probability as a float (the exact law rounded, where stated)."""
    return {o: mech.output_probability(value, o) for o in mech.outputs()}


def exact_laws(mech: FrequencyOracle) -> list[list[Fraction]]:
    """`exact_law(x)` for every input x, as lists aligned on `mech.outputs()`.

    From `exact_probability`, i.e. from the sampler's own integer thresholds.
    """
    return [list(mech.exact_law(x).values()) for x in range(mech.k)]


def _distinct(values: list[Fraction] | tuple[Fraction, ...]) -> list[Fraction]:
    """The values, one per object (mechanisms reuse a few Fraction objects; cheap)."""
    return list({id(p): p for p in values}.values())


def total_mass(law: list[Fraction]) -> Fraction:
    """The exact sum of a law's probabilities (equal objects grouped)."""
    counts = Counter(map(id, law))
    values = {id(p): p for p in law}
    return sum((values[key] * n for key, n in counts.items()), Fraction(0))


def exact_max_ratio(laws: list[list[Fraction]]) -> Fraction | None:
    """max over outputs o and inputs x, x' of P[o|x] / P[o|x'], in exact rationals.

    None when some output is possible under one input and impossible under another.
    """
    worst = Fraction(1)
    for column in zip(*laws, strict=True):
        distinct = _distinct(column)
        if len(distinct) == 1:
            continue
        high, low = max(distinct), min(distinct)
        if high == low:
            continue
        if low == 0:
            return None
        # high / low > worst, without building the fraction (no gcd) unless it is.
        if high.numerator * low.denominator * worst.denominator > (
            worst.numerator * low.numerator * high.denominator
        ):
            worst = high / low
    return worst


def max_log_ratio(mech: FrequencyOracle) -> float:
    """max over x, x', o of log P[o|x]/P[o|x'] (inf when some P[o|x'] = 0 < P[o|x])."""
    worst = 0.0
    outputs = list(mech.outputs())
    laws = [[mech.output_probability(x, o) for o in outputs] for x in range(mech.k)]
    for px in laws:
        for py in laws:
            for a, b in zip(px, py, strict=True):
                if a == 0.0:
                    continue
                if b == 0.0:
                    return math.inf
                worst = max(worst, math.log(a / b))
    return worst


def wire_bytes(y: float) -> bytes:
    """The 8 bytes of a NumericPayload value as they leave the device."""
    return struct.pack("<d", y)


def level_wire_law(mech: NumericMechanism, level: int) -> dict[bytes, Fraction]:
    """Exact law of the wire bytes given an input level, from the sampler's integer weights.

    Indices whose table doubles coincide add up (the wire cannot tell them apart).
    """
    weights = mech.index_weights(level)
    total = sum(weights)
    law: dict[bytes, Fraction] = {}
    for y, w in zip(mech.table, weights, strict=True):
        if w:
            key = wire_bytes(y)
            law[key] = law.get(key, Fraction(0)) + Fraction(w, total)
    return law


def input_wire_law(mech: NumericMechanism, value: Any) -> dict[bytes, Fraction]:
    """Exact law of the wire bytes for a real input: the rounding law mixed over levels."""
    law: dict[bytes, Fraction] = {}
    for level, p in mech.level_law(value):
        for key, q in level_wire_law(mech, level).items():
            law[key] = law.get(key, Fraction(0)) + p * q
    return law


def max_ratio(laws: list[dict[bytes, Fraction]]) -> Fraction | None:
    """max over two laws and a wire value of P[y|x]/P[y|x'] (None: some P[y|x'] = 0 < P[y|x])."""
    keys = set().union(*laws)
    worst = Fraction(1)
    for key in keys:
        probs = [law.get(key, Fraction(0)) for law in laws]
        if min(probs) == 0:
            return None
        worst = max(worst, max(probs) / min(probs))
    return worst


def level_wire_weights(mech: NumericMechanism, level: int) -> dict[bytes, int]:
    """`level_wire_law` before the division by the level's total weight (integers)."""
    weights: dict[bytes, int] = {}
    for y, w in zip(mech.table, mech.index_weights(level), strict=True):
        if w:
            key = wire_bytes(y)
            weights[key] = weights.get(key, 0) + w
    return weights


def numeric_max_ratio(mech: NumericMechanism) -> Fraction | None:
    """`max_ratio` over every input level (real inputs mix these; see numeric.py).

    When every level's weights have one total T (the shipped grids), P[y|j] = W_j(y)/T
    and the ratio of two levels is W_j(y)/W_j'(y): compared in integers, the same value."""
    levels = range(mech.levels + 1)
    if len({sum(mech.index_weights(j)) for j in levels}) != 1:
        return max_ratio([level_wire_law(mech, j) for j in levels])
    laws = [level_wire_weights(mech, j) for j in levels]
    worst_num, worst_den = 1, 1
    for key in set().union(*laws):
        weights = [law.get(key, 0) for law in laws]
        high, low = max(weights), min(weights)
        if low == 0:
            return None
        if high * worst_den > worst_num * low:
            worst_num, worst_den = high, low
    return Fraction(worst_num, worst_den)


def exp_bounds(epsilon: Decimal) -> tuple[Fraction, Fraction]:
    """Rationals L < e^ε < U (decimal exp at 60 digits, widened by 1e-50 relative)."""
    with localcontext() as ctx:
        ctx.prec = 60
        e = epsilon.exp()
        margin = e * Decimal("1e-50")
        return Fraction(e - margin), Fraction(e + margin)
