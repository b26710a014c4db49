"""Longitudinal collection: RAPPOR-style memoization for GRR and the unary encodings.

Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable
Privacy-Preserving Ordinal Response", CCS 2014, Sections 2-3. Each device
keeps, per (user, metric, value), a *permanent* randomized response drawn once
with ε∞ (policy param "epsilon_permanent") and sends, per report, an
*instantaneous* randomization of that permanent response. Chaining the two is
calibrated so that one report, marginally over the permanent draw, has exactly
the distribution of the base mechanism at the per-report ε1 (the policy's
epsilon): the collector checks and the aggregator estimates with the base
mechanism at ε1 unchanged (one report per user and window).

Privacy, as the ledger charges it (policy.proto, MEMO_CHARGING_INSTANTANEOUS):

* per report: ε1 (the mechanism's `epsilon`), exact by construction below;
* lifetime, per (user, metric, value): whatever number of reports is sent for
  an unchanged value, together they reveal at most the permanent response,
  which is ε∞-LDP (RAPPOR, Section 3, "ε∞ = 2h ln((1 - f/2)/(f/2))" with h = 1);
* per user over a window with reports r_1..r_T on D distinct values:
  ε_total <= min(T ε1, D ε∞)  (sequential composition of the per-report
  guarantees, or of the D permanent responses; `lifetime_epsilon`).

Calibration (closed forms; ε1 <= ε∞ is required):

* rappor-sue — permanent: SUE at ε∞ (bit i = 1 w.p. p∞ = e^{ε∞/2}/(e^{ε∞/2}+1)
  if i = v, q∞ = 1 - p∞ otherwise; RAPPOR's f = 2 q∞). Instantaneous: each bit
  kept w.p. r, flipped w.p. 1 - r, with 2r - 1 = (2 p1 - 1)/(2 p∞ - 1),
  p1 = e^{ε1/2}/(e^{ε1/2}+1). Then P[S_i = 1 | B_i = 1] = p1 and
  P[S_i = 1 | B_i = 0] = 1 - p1: SUE at ε1 (RAPPOR's q*, p* of Section 3 with
  p = 1 - q, whose ε1 = ln(q*(1-p*)/(p*(1-q*))) equals ε1 here). This is
  basic one-hash RAPPOR.
* rappor-oue — permanent: OUE at ε∞ (p∞ = 1/2, q∞ = 1/(e^{ε∞}+1)). Instantaneous:
  symmetric flips keeping w.p. r = (1 - q∞ - q1)/(1 - 2 q∞), q1 = 1/(e^{ε1}+1).
  Then P[S_i = 1 | B_i = 1] = 1/2 and P[S_i = 1 | B_i = 0] = q1: OUE at ε1.
* rappor-grr — permanent: GRR at ε∞. Instantaneous: GRR at ε_r on the permanent
  index. Composing two k-ary RRs multiplies λ(ε) = p - q = (e^ε - 1)/(e^ε + k - 1),
  so λ_r = λ(ε1)/λ(ε∞) and e^{ε_r} = (1 + (k - 1) λ_r)/(1 - λ_r): GRR at ε1.

Memo state. `MemoState` is an explicit, serializable object the caller
persists (the SDK keeps one per (user, metric) in its device state): a key
binding it to the mechanism and its parameters, and a map value index ->
permanent response bytes (packed k bits for unary encodings, 4-byte
little-endian index for GRR). `perturb(value, memo=state)` draws and stores
the permanent response the first time a value is seen, so the caller must
persist the memo (atomically with the outbox entry of the report) before the
report leaves the device: losing a permanent response and drawing a new one
spends up to ε∞ again for that value. Reusing a memo under other parameters
raises ValueError.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import (
    bernoulli_bits,
    bernoulli_words,
    check_bit_vector,
    check_index,
    int_to_bits,
    words_to_bytes,
)
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    CountStatistic,
    Estimate,
    Output,
    system_random,
)
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.unary import OUE, SUE, UnaryEncoding

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


@dataclass
class MemoState:
    """Permanent responses of one (user, metric): value index -> response bytes."""

    key: str
    responses: dict[int, bytes] = field(default_factory=dict)

    def to_json(self) -> str:
        """A stable JSON text (hex responses, sorted keys) for the device's store."""
        return json.dumps(
            {
                "key": self.key,
                "responses": {str(v): b.hex() for v, b in sorted(self.responses.items())},
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> MemoState:
        """Parse `to_json` output; raises ValueError on anything else."""
        try:
            data = json.loads(text)
            key = data["key"]
            raw = data["responses"]
            if not isinstance(key, str) or not isinstance(raw, dict):
                raise ValueError("bad memo layout")
            responses = {int(v): bytes.fromhex(h) for v, h in raw.items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError("not a serialized MemoState") from exc
        return cls(key=key, responses=responses)


class Memoized(FrequencyOracle):
    """Common frame: estimation and checks are the base mechanism's at ε1."""

    base: FrequencyOracle

    def __init__(self, epsilon: Decimal, k: int, epsilon_permanent: Decimal) -> None:
        super().__init__(epsilon, k)
        if not isinstance(epsilon_permanent, Decimal):
            raise TypeError("epsilon_permanent must be a decimal.Decimal (exact)")
        if not epsilon_permanent.is_finite() or epsilon_permanent <= 0:
            raise ValueError(
                f"epsilon_permanent must be finite and positive, got {epsilon_permanent}"
            )
        if epsilon > epsilon_permanent:
            raise ValueError(
                f"per-report epsilon ({epsilon}) must not exceed epsilon_permanent "
                f"({epsilon_permanent}): the instantaneous response cannot add information"
            )
        self.epsilon_permanent = epsilon_permanent

    @property
    def memo_key(self) -> str:
        """Binds a MemoState to this mechanism and its parameters."""
        return f"{self.wire_id}|k={self.k}|epsilon_permanent={self.epsilon_permanent}"

    def new_memo(self) -> MemoState:
        """An empty memo for one (user, metric)."""
        return MemoState(key=self.memo_key)

    def lifetime_epsilon(self, reports: int, distinct_values: int) -> Decimal:
        """Upper bound on one user's total ε: min(reports · ε1, distinct_values · ε∞)."""
        if reports < 0 or distinct_values < 0 or distinct_values > reports:
            raise ValueError("need 0 <= distinct_values <= reports")
        return min(reports * self.epsilon, distinct_values * self.epsilon_permanent)

    def _memo(self, memo: MemoState | None) -> MemoState:
        if memo is None:
            raise ValueError(f"{self.wire_id} is memoized: pass memo=MemoState (see new_memo)")
        if memo.key != self.memo_key:
            raise ValueError(
                f"memo state belongs to other parameters; {self.wire_id} needs "
                f"key {self.memo_key!r}"
            )
        return memo

    # The marginal law of one report is the base mechanism's at ε1.
    def check_output(self, output: Output) -> None:
        self.base.check_output(output)

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.base.accumulate(statistic, output)

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        self.base.accumulate_batch(statistic, outputs)

    def estimate(self, statistic: CountStatistic) -> Estimate:
        return self.base.estimate(statistic)

    def outputs(self) -> Iterator[Output]:
        return self.base.outputs()


class MemoizedUnary(Memoized):
    """rappor-sue / rappor-oue: permanent unary encoding at ε∞, symmetric flips per report."""

    base: UnaryEncoding

    def __init__(self, epsilon: Decimal, k: int, epsilon_permanent: Decimal) -> None:
        super().__init__(epsilon, k, epsilon_permanent)
        base_class = OUE if self.wire_id == "rappor-oue" else SUE
        self.base = base_class(epsilon, k)
        self.permanent = base_class(epsilon_permanent, k)
        p1, q1 = self.base.p, self.base.q
        p_inf, q_inf = self.permanent.p, self.permanent.q
        if self.wire_id == "rappor-oue":
            keep = (1.0 - q_inf - q1) / (1.0 - 2.0 * q_inf)
        else:
            keep = (1.0 + (2.0 * p1 - 1.0) / (2.0 * p_inf - 1.0)) / 2.0
        #: Probability that the instantaneous response flips a permanent bit.
        self.flip = min(0.5, max(0.0, 1.0 - keep))
        self.support_p = self.base.support_p
        self.support_q = self.base.support_q

    def output_probability(self, value: int, output: Output) -> float:
        """Marginal P[report | value], summing over the permanent response per bit."""
        bits = check_bit_vector(output, self.k, name=self.wire_id)
        prob = 1.0
        for i in range(self.k):
            perm_one = self.permanent.p if i == value else self.permanent.q
            one = perm_one * (1.0 - self.flip) + (1.0 - perm_one) * self.flip
            prob *= one if (bits >> i) & 1 else 1.0 - one
        return prob

    def perturb(
        self, value: int, *, rng: random.Random | None = None, memo: MemoState | None = None
    ) -> BitVectorOutput:
        check_index(value, self.k)
        state = self._memo(memo)
        r = rng if rng is not None else system_random()
        stored = state.responses.get(value)
        if stored is None:
            stored = self.permanent.perturb(value, rng=r).bits
            state.responses[value] = stored
        permanent = check_bit_vector(BitVectorOutput(stored, self.k), self.k, name=self.wire_id)
        return int_to_bits(permanent ^ bernoulli_bits(self.flip, self.k, r), self.k)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.uint8]:
        """One report per user, each with a fresh permanent response (packed rows)."""
        import numpy as np

        permanent = self.permanent.perturb_batch(values, rng)
        chunk = max(1, (1 << 18) // ((self.k + 63) // 64))
        for start in range(0, permanent.shape[0], chunk):
            block = permanent[start : start + chunk]
            flips = bernoulli_words(self.flip, block.shape[0], self.k, rng)
            np.bitwise_xor(block, words_to_bytes(flips, self.k), out=block)
        return permanent


class RapporOUE(MemoizedUnary):
    """Memoized OUE: permanent OUE at ε∞, per-report OUE at ε1."""

    wire_id = "rappor-oue"


class RapporSUE(MemoizedUnary):
    """Memoized SUE, i.e. basic one-hash RAPPOR."""

    wire_id = "rappor-sue"


class RapporGRR(Memoized):
    """rappor-grr: permanent GRR at ε∞, instantaneous GRR at ε_r (module docstring)."""

    wire_id = "rappor-grr"
    base: GRR

    def __init__(self, epsilon: Decimal, k: int, epsilon_permanent: Decimal) -> None:
        super().__init__(epsilon, k, epsilon_permanent)
        self.base = GRR(epsilon, k)
        self.permanent = GRR(epsilon_permanent, k)
        lam_r = (self.base.p - self.base.q) / (self.permanent.p - self.permanent.q)
        lam_r = min(1.0, lam_r)
        if lam_r >= 1.0:  # ε1 = ε∞: the instantaneous response is the permanent one
            self.p_r, self.q_r = 1.0, 0.0
        else:
            e_r = (1.0 + (k - 1) * lam_r) / (1.0 - lam_r)
            self.p_r = e_r / (e_r + k - 1)
            self.q_r = 1.0 / (e_r + k - 1)
        #: ε_r of the instantaneous GRR (float; the per-report cost is `epsilon`).
        self.epsilon_instantaneous = math.inf if self.q_r == 0.0 else math.log(self.p_r / self.q_r)
        self.support_p = self.base.support_p
        self.support_q = self.base.support_q

    def output_probability(self, value: int, output: Output) -> float:
        """Marginal P[report | value], summing over the permanent index."""
        assert isinstance(output, CategoryOutput)
        total = 0.0
        for z in range(self.k):
            perm = self.permanent.p if z == value else self.permanent.q
            total += perm * (self.p_r if output.index == z else self.q_r)
        return total

    def _instantaneous(self, permanent: int, r: random.Random) -> int:
        if r.random() < self.p_r:
            return permanent
        other = r.randrange(self.k - 1)
        return other + 1 if other >= permanent else other

    def perturb(
        self, value: int, *, rng: random.Random | None = None, memo: MemoState | None = None
    ) -> CategoryOutput:
        check_index(value, self.k)
        state = self._memo(memo)
        r = rng if rng is not None else system_random()
        stored = state.responses.get(value)
        if stored is None:
            stored = self.permanent.perturb(value, rng=r).index.to_bytes(4, "little")
            state.responses[value] = stored
        permanent = int.from_bytes(stored, "little")
        if len(stored) != 4 or not 0 <= permanent < self.k:
            raise ValueError("memo state holds a corrupt permanent response")
        return CategoryOutput(self._instantaneous(permanent, r))

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """One report per user, each with a fresh permanent response."""
        import numpy as np

        permanent = self.permanent.perturb_batch(values, rng)
        keep = rng.random(permanent.shape[0]) < self.p_r
        other = rng.integers(0, self.k - 1, size=permanent.shape[0], dtype=np.int64)
        other += other >= permanent
        return np.where(keep, permanent, other)


__all__ = ["MemoState", "Memoized", "MemoizedUnary", "RapporGRR", "RapporOUE", "RapporSUE"]
