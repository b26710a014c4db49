"""Longitudinal collection: RAPPOR-style memoization for GRR and the unary encodings.

Erlingsson, Pihur, Korolova, "RAPPOR: Randomized Aggregatable
Privacy-Preserving Ordinal Response", CCS 2014, Sections 2-3. Each device
keeps, per (user, metric, value), a *permanent* randomized response drawn once
with ε∞ (policy param "epsilon_permanent") and sends, per report, an
*instantaneous* randomization of that permanent response. Chaining the two is
calibrated so that one report, marginally over the permanent draw, has the
distribution of the base mechanism at the per-report ε1 (the policy's
epsilon) up to one part in 2^53, on the safe side (one report leaks at most
ε1, exactly): the collector checks and the aggregator estimates with the base
mechanism at ε1 unchanged (one report per user and window).

Privacy (proofs and closed forms in `fedldp.client.mechanisms.memo_loss`).
The neighbouring inputs of a user's reports are two sequences of values of
one length, changed or not (DESIGN.md: a memoized charge must bound any two
sequences):

* The charge. Every report is charged `report_charge` = max(ε1, ε_I), ε_I the
  instantaneous step's own loss on the permanent responses (ln p_r/q_r for
  rappor-grr, k ln (1-f)/f for rappor-oue / rappor-sue), rounded up at
  `memo_loss.CHARGE_PLACES` decimals. For every T and every two sequences of T
  values, the T reports' exact joint loss is at most ε1 + (T - 1) ε_I, so the
  sum of their charges covers it (proof in memo_loss, "Sequences of values").
  The rule is value-blind: the device guard, the collector's ledger, reconcile
  and `lifetime_epsilon` all use it. No lifetime cap holds once values may
  change: the loss of reports of one value against reports of changing values
  grows linearly in T (memo_loss), so the ledger never stops charging.
* What memoization still buys: while the value does not change, T reports of
  it lose at most L(T) <= E∞ (the permanent response's own loss, = ε∞ up to
  its sampler's rounding) however many are sent (`value_loss`; RAPPOR's
  guarantee, Erlingsson et al. 2014 Section 3). That figure is about one
  unchanged value, not about sequences, and is never charged.
* The retired rule. Until this release the ledger charged r* = max over m of
  L(m)/m (`retired_report_charge`), which bounds only sequences in which the
  two inputs keep the same pattern of repeats; the collector's reconcile
  reports every subject whose spend under r* is below the sound figure.
* The charge makes the unary encodings costly at large k: rappor-oue, k = 64,
  ε1 = 1, ε∞ = 2 is charged 90.10 per report (docs/mechanisms.md has the table).

Calibration (closed forms; ε1 <= ε∞ is required). The instantaneous step is
drawn with a probability on the 2^-53 grid that `random()` and the bit-sliced
sampler realize exactly, chosen as the least noise whose exact one-report
loss, from the realized permanent law, is <= ε1 (bisection; `_instant_*`):

* rappor-sue — permanent: SUE at ε∞ (bit i = 1 w.p. p∞ = e^{ε∞/2}/(e^{ε∞/2}+1)
  if i = v, q∞ = 1 - p∞ otherwise; RAPPOR's f = 2 q∞). Instantaneous: each bit
  flipped w.p. f, 1 - 2f = (2 p1 - 1)/(2 p∞ - 1), p1 = e^{ε1/2}/(e^{ε1/2}+1).
  Then P[S_i = 1 | B_i = 1] = p1 and P[S_i = 1 | B_i = 0] = 1 - p1: SUE at ε1
  (RAPPOR's q*, p* of Section 3). This is basic one-hash RAPPOR.
* rappor-oue — permanent: OUE at ε∞ (p∞ = 1/2, q∞ = 1/(e^{ε∞}+1)). Instantaneous:
  symmetric flips with 1 - f = (1 - q∞ - q1)/(1 - 2 q∞), q1 = 1/(e^{ε1}+1).
  Then P[S_i = 1 | B_i = 1] = 1/2 and P[S_i = 1 | B_i = 0] = q1: OUE at ε1.
* rappor-grr — permanent: GRR at ε∞. Instantaneous: GRR(p_r, q_r) on the
  permanent index. Composing two k-ary RRs multiplies λ = p - q, and GRR with
  λ has e^ε = (1 + (k - 1) λ)/(1 - λ), so λ_r = λ(ε1)/λ(ε∞),
  λ(ε) = (e^ε - 1)/(e^ε + k - 1): GRR at ε1.

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

import functools
import json
import math
import random
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import (
    DyadicProbability,
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
from fedldp.client.mechanisms.memo_loss import (
    CHARGE_PLACES,
    GRRChain,
    UnaryChain,
    charge_from_rate,
    exp_lower,
    instantaneous_rate_grr,
    instantaneous_rate_unary,
    joint_rate,
    sequence_charge,
)
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.unary import OUE, SUE, UnaryEncoding

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


#: `random()` and the bit-sliced sampler draw uniforms on this grid: a probability
#: that is a multiple of GRID is realized exactly by `random() < prob`.
GRID = Fraction(1, 1 << 53)


def exact_probabilities(mechanism: GRR | UnaryEncoding) -> tuple[Fraction, Fraction]:
    """(p, q) exactly as `mechanism.perturb` realizes them (the permanent response's law).

    The base mechanisms state their realized law themselves (`p_exact`,
    `q_exact`: GRR keeps the value with p and reports each other value with q;
    a unary encoding's true bit is 1 with p, every other bit with q; grr.py,
    unary.py). This is the one place that reads it.
    """
    return mechanism.p_exact, mechanism.q_exact


def _least_on_grid(holds: Callable[[Fraction], bool], lo: int, hi: int) -> int:
    """Smallest n in [lo, hi] with holds(n GRID); `holds` is monotone and holds(hi GRID).

    Monotone means false up to some n, then true (bisection).
    """
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(mid * GRID):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _instant_keep(k: int, p_inf: Fraction, epsilon: Decimal) -> Fraction:
    """Largest p_r on the grid with one report's exact loss <= ε1 (rappor-grr).

    One report is GRR with λ = λ∞ λ_r (λ = p - q, λ_r = (k p_r - 1)/(k - 1)),
    whose loss ln (1 + (k - 1) λ)/(1 - λ) increases in λ; so the condition is
    (1 + (k - 1) λ)/(1 - λ) <= e^ε1, checked against a rational lower bound of
    e^ε1. p_r = 1/k (λ = 0) never leaks.
    """
    bound = exp_lower(epsilon)
    lam_inf = p_inf - (1 - p_inf) / (k - 1)

    def leaks(p_r: Fraction) -> bool:
        lam = lam_inf * (k * p_r - 1) / (k - 1)
        return 1 + (k - 1) * lam > bound * (1 - lam)

    top = 1 / GRID
    if not leaks(Fraction(1)):
        return Fraction(1)
    first = _least_on_grid(leaks, math.ceil(top / k), int(top))
    return (first - 1) * GRID


def _instant_flip(p_inf: Fraction, q_inf: Fraction, epsilon: Decimal) -> Fraction:
    """Smallest flip f on the grid with one report's exact loss <= ε1 (unary encodings).

    A report bit is 1 w.p. f + π (1 - 2f) (π = p∞ or q∞); its loss
    ln p1'(1 - q1')/(q1'(1 - p1')) decreases as f grows to 1/2 (where it is 0).
    """
    bound = exp_lower(epsilon)

    def quiet(f: Fraction) -> bool:
        p1, q1 = f + p_inf * (1 - 2 * f), f + q_inf * (1 - 2 * f)
        return p1 * (1 - q1) <= bound * q1 * (1 - p1)

    return _least_on_grid(quiet, 0, int(Fraction(1, 2) / GRID)) * GRID


@functools.lru_cache(maxsize=256)
def _grr_rate(k: int, p_inf: Fraction, p_r: Fraction) -> Decimal:
    chain = GRRChain(k, p_inf, p_r)
    return joint_rate(chain.loss, chain.permanent_loss(), lambda: chain.evaluations)


@functools.lru_cache(maxsize=256)
def _unary_rate(p_inf: Fraction, q_inf: Fraction, flip: Fraction) -> Decimal:
    chain = UnaryChain(p_inf, q_inf, flip)
    return joint_rate(chain.loss, chain.permanent_loss(), lambda: chain.evaluations)


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
        """Binds a MemoState to this mechanism and ALL its parameters, ε1 included.

        A rollout that changes only `epsilon` therefore draws new permanent
        responses. (Under the retired r* rule, two ε1 sharing one permanent response
        under-charged: rappor-grr, k=256, ε∞=1, one report at ε1=0.05 and one at
        0.5 lost 0.897 against 0.772. The sound charge covers even a shared one,
        each report's term being within its own ε_I; the key keeps existing memos.)
        """
        return (
            f"{self.wire_id}|k={self.k}|epsilon={self.epsilon}"
            f"|epsilon_permanent={self.epsilon_permanent}"
        )

    def new_memo(self) -> MemoState:
        """An empty memo for one (user, metric)."""
        return MemoState(key=self.memo_key)

    def memo_slots(self, value: Any, memo: MemoState) -> tuple[int, ...]:
        """The slots of `memo.responses` that `perturb(value, memo=memo)` reads or writes.

        The SDK loads them from its store before perturbing, asking again after each
        load until no new slot is named (a mechanism whose slot depends on a stored
        seed, loloha and dbitflip, names the seed first). Here: the value's own slot.
        """
        return (value,)

    @abstractmethod
    def _loss(self, reports: int) -> Decimal:
        """Upper bound on L(reports), from the subclass's exact chain."""

    @abstractmethod
    def _rate(self) -> Decimal:
        """Upper bound on r* = max over m >= 1 of L(m)/m (the retired charge's rate)."""

    @abstractmethod
    def _instantaneous_rate(self) -> Decimal:
        """Upper bound on ε_I, the instantaneous step's own loss on permanent responses."""

    def _finish(self) -> None:
        """Compute the charge once the exact laws are set.

        Raises InfiniteSequenceLossError (a ValueError) when the instantaneous step
        is deterministic: no finite charge covers a change of value then.
        """
        self._report_charge = sequence_charge(self._instantaneous_rate(), self.epsilon)

    @property
    def report_charge(self) -> Decimal:
        """The sound value-blind per-report charge: max(ε1, ε_I), ε_I rounded up.

        For every T and any two sequences of T values (unchanged, changed once,
        changed every time) the sum of T charges is at least the T reports' exact
        joint loss (memo_loss, "Sequences of values").
        """
        return self._report_charge

    @property
    def instantaneous_epsilon(self) -> Decimal:
        """ε_I rounded up at CHARGE_PLACES: what each report can add to a sequence's loss."""
        return self._instantaneous_rate().quantize(
            Decimal(1).scaleb(-CHARGE_PLACES), rounding=ROUND_CEILING
        )

    @functools.cached_property
    def retired_report_charge(self) -> Decimal:
        """The charge of the retired rule, r* = max over m of L(m)/m rounded up (or ε1).

        Kept only to explain past spend (`fedldp ledger reconcile`) and as the broken
        variant of the tests: it bounds only pairs of sequences with one pattern of
        repeats, not a change of value. May raise JointLossTooCostlyError.
        """
        return charge_from_rate(self._rate(), self.epsilon)

    def value_loss(self, reports: int) -> Decimal:
        """L(reports): the exact loss of that many reports of one value that never
        changes, rounded up at CHARGE_PLACES decimals; at most E∞ (the realized
        permanent response's loss) for every number of reports (RAPPOR's guarantee).

        Not a charge: it says what memoization protects, not what a sequence of
        changing values loses (`report_charge`, `lifetime_epsilon`).
        """
        if isinstance(reports, bool) or not isinstance(reports, int) or reports < 0:
            raise ValueError("reports must be an integer >= 0")
        return self._loss(reports).quantize(
            Decimal(1).scaleb(-CHARGE_PLACES), rounding=ROUND_CEILING
        )

    def lifetime_epsilon(self, reports: int | Iterable[int]) -> Decimal:
        """The proven bound on the loss of a subject's reports: T · report_charge.

        `reports` is their number T, or the counts of reports per value (summed:
        the bound is value-blind, so how the reports group into values does not
        change it). It holds for any two sequences of values, changed or not
        (memo_loss, "Sequences of values"); there is no lifetime cap.
        """
        counts = [reports] if isinstance(reports, int) else list(reports)
        for count in counts:
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise ValueError("report counts must be integers >= 0")
        return self.report_charge * sum(counts)

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
        self.p_exact, self.q_exact = exact_probabilities(self.permanent)
        self.flip_exact = _instant_flip(self.p_exact, self.q_exact, epsilon)
        #: Probability that the instantaneous response flips a permanent bit (on the
        #: 2^-53 grid, so `bernoulli_bits` realizes it exactly).
        self.flip = float(self.flip_exact)
        self.flip_draw = DyadicProbability.at_most(self.flip_exact)  # exact: on the grid
        self.support_p = self.base.support_p
        self.support_q = self.base.support_q
        self._finish()

    def _chain(self) -> UnaryChain:
        return UnaryChain(self.p_exact, self.q_exact, self.flip_exact)

    def _loss(self, reports: int) -> Decimal:
        return self._chain().loss(reports)

    def _rate(self) -> Decimal:
        return _unary_rate(self.p_exact, self.q_exact, self.flip_exact)

    def _instantaneous_rate(self) -> Decimal:
        return instantaneous_rate_unary(self.k, self.flip_exact)

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
        return int_to_bits(permanent ^ bernoulli_bits(self.flip_draw, self.k, r), self.k)

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> npt.NDArray[np.uint8]:
        """One report per user, each with a fresh permanent response (packed rows)."""
        import numpy as np

        permanent = self.permanent.perturb_batch(values, rng)
        chunk = max(1, (1 << 18) // ((self.k + 63) // 64))
        for start in range(0, permanent.shape[0], chunk):
            block = permanent[start : start + chunk]
            flips = bernoulli_words(self.flip_draw, block.shape[0], self.k, rng)
            np.bitwise_xor(block, words_to_bytes(flips, self.k), out=block)
        return permanent

    def perturb_batch_longitudinal(
        self, values: npt.NDArray[np.int64], reports: int, rng: np.random.Generator
    ) -> npt.NDArray[np.uint8]:
        """`reports` reports per user sharing one permanent response.

        Shape (n, reports, ceil(k/8)) of packed rows; row i has the law of
        `reports` calls of `perturb(values[i], memo=m)` with one fresh memo m.
        """
        import numpy as np

        permanent = self.permanent.perturb_batch(values, rng)
        out = np.empty((permanent.shape[0], reports, permanent.shape[1]), dtype=np.uint8)
        for t in range(reports):
            flips = bernoulli_words(self.flip_draw, permanent.shape[0], self.k, rng)
            out[:, t, :] = permanent ^ words_to_bytes(flips, self.k)
        return out


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
        self.p_exact, self.q_exact = exact_probabilities(self.permanent)
        self.p_r_exact = _instant_keep(k, self.p_exact, epsilon)
        #: Instantaneous GRR: keep the permanent index w.p. p_r (on the 2^-53 grid,
        #: so `random() < p_r` realizes it exactly), else one of the k - 1 others.
        self.p_r = float(self.p_r_exact)
        self.q_r = float((1 - self.p_r_exact) / (k - 1))
        #: ε_I of the instantaneous GRR (float, for information; the charge is `report_charge`).
        self.epsilon_instantaneous = math.inf if self.q_r == 0.0 else math.log(self.p_r / self.q_r)
        self.support_p = self.base.support_p
        self.support_q = self.base.support_q
        self._finish()

    def _chain(self) -> GRRChain:
        return GRRChain(self.k, self.p_exact, self.p_r_exact)

    def _loss(self, reports: int) -> Decimal:
        return self._chain().loss(reports)

    def _rate(self) -> Decimal:
        return _grr_rate(self.k, self.p_exact, self.p_r_exact)

    def _instantaneous_rate(self) -> Decimal:
        return instantaneous_rate_grr(self.k, self.p_r_exact)

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

    def perturb_batch_longitudinal(
        self, values: npt.NDArray[np.int64], reports: int, rng: np.random.Generator
    ) -> npt.NDArray[np.int64]:
        """`reports` reports per user sharing one permanent response: shape (n, reports).

        Row i has the law of `reports` calls of `perturb(values[i], memo=m)` with
        one fresh memo m.
        """
        import numpy as np

        permanent = self.permanent.perturb_batch(values, rng)[:, None]
        shape = (permanent.shape[0], reports)
        keep = rng.random(shape) < self.p_r
        other = rng.integers(0, self.k - 1, size=shape, dtype=np.int64)
        other += other >= permanent
        return np.where(keep, permanent, other)


__all__ = ["MemoState", "Memoized", "MemoizedUnary", "RapporGRR", "RapporOUE", "RapporSUE"]
