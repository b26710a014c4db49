"""Small-parameter instances of every registered mechanism, and exact-law helpers.

Shared by the contract tests. Parameters are small so every output can be
enumerated and every law checked exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np
from fedldp.client.mechanisms import create
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
]
NUMERIC_CASES = [
    Case("duchi", Decimal("1"), (LO, HI)),
    Case("piecewise", Decimal("1"), (LO, HI)),
    Case("hybrid", Decimal("2"), (LO, HI)),
    Case("hybrid", Decimal("0.5"), (LO, HI)),
    Case("laplace", Decimal("1"), (LO, HI)),
]
ALL_CASES = CATEGORICAL_CASES + NUMERIC_CASES


def perturb_one(mech: Mechanism, value: Any, rng: Any, memo: Any = None) -> Output:  # type: ignore[type-arg]
    """perturb, with a fresh memo for memoized mechanisms unless one is given."""
    if isinstance(mech, Memoized):
        return mech.perturb(value, rng=rng, memo=memo if memo is not None else mech.new_memo())
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


def exact_law(mech: FrequencyOracle, value: int) -> dict[Output, float]:
    """Every output with its probability, from the mechanism's own contract."""
    return {o: mech.output_probability(value, o) for o in mech.outputs()}


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


def numeric_max_log_ratio(mech: NumericMechanism) -> float:
    """The same over a grid of inputs t and outputs y (densities, or atoms' masses)."""
    ts = np.linspace(-1.0, 1.0, 9)
    ys: list[float] = list(np.linspace(-30.0, 30.0, 601))
    for name in ("C", "B"):
        for holder in (mech, getattr(mech, "pm", None), getattr(mech, "duchi", None)):
            value = getattr(holder, name, None) if holder is not None else None
            if value is not None:
                ys += [value, -value, value * (1 - 1e-12), -value * (1 - 1e-12)]
    worst = 0.0
    for y in ys:
        probs = [mech.output_probability(float(t), float(y)) for t in ts]
        positive = [p for p in probs if p > 0]
        if not positive:
            continue
        if len(positive) < len(probs):
            return math.inf
        worst = max(worst, math.log(max(positive) / min(positive)))
    return worst
