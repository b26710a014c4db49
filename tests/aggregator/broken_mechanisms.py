"""Deliberately broken mechanisms the ε auditor must catch (issue 14's list).

Each claims what the shipped mechanism claims (its `epsilon`, its declared law)
but randomizes differently, on both the device path (`perturb`) and the batch
path (`perturb_batch`) — or, for the memoized ones, randomizes as shipped and is
charged less than its reports can lose.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    NumericOutput,
    system_random,
)
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.mechanisms.memo import RapporGRR, RapporOUE
from fedldp.client.mechanisms.numeric import Piecewise
from fedldp.client.mechanisms.square_wave import SquareWave
from fedldp.client.mechanisms.unary import OUE

#: Probability with which `StickyOUE` keeps the true bit (OUE's p is 1/2).
STICKY_P = 0.75


class WholeDomainGRR(GRR):
    """Randomized response drawing its false answer from all k values, truth included.

    P[y = x | x] = p + (1 - p)/k and P[y = x | x'] = (1 - p)/k: the ratio is
    1 + k e^ε/(k - 1), above e^ε, and the law is not GRR's.
    """

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        r = rng if rng is not None else system_random()
        if r.random() < self.p:
            return CategoryOutput(value)
        return CategoryOutput(r.randrange(self.k))

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        values = np.asarray(values, dtype=np.int64)
        keep = rng.random(values.shape[0]) < self.p
        out: npt.NDArray[np.int64] = np.where(
            keep, values, rng.integers(0, self.k, size=values.shape[0])
        )
        return out


class StickyOUE(OUE):
    """Unary encoding keeping the true bit with probability 3/4 instead of p = 1/2."""

    def perturb(self, value: int, *, rng: random.Random | None = None) -> BitVectorOutput:
        r = rng if rng is not None else system_random()
        bits = int.from_bytes(super().perturb(value, rng=r).bits, "little") & ~(1 << value)
        if r.random() < STICKY_P:
            bits |= 1 << value
        return BitVectorOutput(bits.to_bytes((self.k + 7) // 8, "little"), self.k)

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.uint8]:
        values = np.asarray(values, dtype=np.int64)
        rows = super().perturb_batch(values, rng)
        index = np.arange(values.shape[0])
        column, shift = values >> 3, (values & 7).astype(np.uint8)
        truth = (rng.random(values.shape[0]) < STICKY_P).astype(np.uint8)
        cleared = rows[index, column] & ~(np.uint8(1) << shift)
        rows[index, column] = cleared | (truth << shift)
        return rows


class DoubledGRR(GRR):
    """GRR built with 2ε that claims (and is charged) ε."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(2 * epsilon, k)
        self._epsilon = epsilon


class HalvedGRR(GRR):
    """GRR randomizing at ε/2 while declaring (p, q and output law) at ε: much
    noisier than claimed, so its estimator is biased."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self._noisier = GRR(epsilon / 2, k)

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        return self._noisier.perturb(value, rng=rng)

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        return self._noisier.perturb_batch(values, rng)


class SequentialChargeRapporGRR(RapporGRR):
    """rappor-grr charged as before issue 14: ε1 per report, as if reports were independent."""

    @property
    def report_charge(self) -> Decimal:
        return self.epsilon


class RetiredChargeRapporOUE(RapporOUE):
    """rappor-oue charged the retired rule r* per report (issue 28): r* bounds T reports
    of one value, not a change of value, whose shared permanent response is a
    fingerprint (k = 64, ε1 = 1, ε∞ = 2: r* = 1, exact loss of (0, 0) against (0, 1)
    27.9)."""

    @property
    def report_charge(self) -> Decimal:
        return self.retired_report_charge


class RetiredChargeRapporGRR(RapporGRR):
    """rappor-grr charged the retired rule r* per report (issue 28; k = 64, ε1 = 1,
    ε∞ = 2: r* = 1, exact loss of (0, 0) against (1, 2) 3.72)."""

    @property
    def report_charge(self) -> Decimal:
        return self.retired_report_charge


class UniformIndexPiecewise(Piecewise):
    """Grid piecewise drawing its output index uniformly, whatever the input level."""

    def _sample_index(self, level: int, rng: random.Random) -> int:
        return rng.randrange(len(self.table))

    def _sample_index_batch(
        self, levels: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        return np.asarray(rng.integers(0, len(self.table), size=levels.shape[0]), dtype=np.int64)


class FloatSquareWave(SquareWave):
    """Li et al.'s continuous Square Wave drawn in floating point (no grid, no table).

    v = (x - lo)/(hi - lo); with probability 2b e^ε / (2b e^ε + 1) the report is
    v - b + 2b U, else uniform on [-b, 1 + b] outside the band, mapped to t units
    (2ṽ - 1). Its doubles are computed from the input, so their low bits carry it
    (Mironov, CCS 2012), and none is a table value.
    """

    def _continuous(self, x: float, draws: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        e = math.exp(float(self.epsilon))
        eps = float(self.epsilon)
        b = (eps * e - e + 1) / (2 * e * (e - 1 - eps))
        v = np.clip((np.asarray(x) - self._lo) / (self._hi - self._lo), 0.0, 1.0)
        u1, u2 = draws
        band = v - b + 2 * b * u2
        outside = -b + u2  # [-b, 1 + b] minus the band has length 1
        outside = np.where(outside >= v - b, outside + 2 * b, outside)
        y = np.where(u1 < 2 * b * e / (2 * b * e + 1), band, outside)
        return np.asarray(2 * y - 1, dtype=np.float64)

    def perturb_with_clip(
        self, value: float | int | Decimal, *, rng: random.Random | None = None
    ) -> tuple[NumericOutput, bool]:
        clipped, was_clipped = self.clip(value)
        r = rng if rng is not None else system_random()
        draws = np.array([[r.random()], [r.random()]])
        return NumericOutput(float(self._continuous(clipped, draws)[0])), was_clipped

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> npt.NDArray[np.float64]:
        x = np.clip(np.asarray(values, dtype=np.float64), self._lo, self._hi)
        return self._continuous(x, rng.random((2, x.shape[0])))  # type: ignore[arg-type]
