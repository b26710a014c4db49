"""LOLOHA: longitudinal local hashing, memoized per hashed value.

Arcolezi, Pinzón, Palamidessi, Gambs, "Frequency Estimation of Evolving Data
Under Local Differential Privacy", EDBT 2023, Section 4 (LOLOHA). A device
draws ONE hash function per (user, metric), hashes its value into [0, g),
memoizes one permanent response per *hash value* (GRR over [g] at ε∞) and
sends, per report, an instantaneous GRR over [g] of that permanent response
together with the hash seed. A user's memo holds at most g permanent
responses however many values the user goes through; RAPPOR-style rappor-grr
keeps one per value.

Laws (all on [g]; `p_exact`, `q_exact`, `p_r_exact`, `p1_exact` state them):

* hash: OLH's contract family, exactly (`olh.hash_value`; Wang, Blocki, Li,
  Jha, USENIX Security 2017, Section 4.4; Carter and Wegman 1979): g prime,
  seed s uniform on [0, g^(m+1)) from the device's CSPRNG, drawn once per memo
  and sent with every report (HashedPayload.seed). The seed is independent of
  the values, so it leaks nothing; a port reproduces h_s(v) from olh.py.
* permanent: GRR over [g] at ε∞ (`grr.GRR(ε∞, g)`: keep w.p. p∞ =
  e^ε∞/(e^ε∞ + g - 1) rounded down to the 2^-53 grid, else each other hash
  value w.p. q∞ = (1 - p∞)/(g - 1); Wang et al. 2017, Section 4.1).
* instantaneous: GRR over [g] keeping the permanent hash value w.p. p_r (on
  the 2^-53 grid: `memo._instant_keep`, the largest p_r whose one-report loss
  from the realized p∞ is <= ε1, so rounded the safe way), else each other
  w.p. q_r = (1 - p_r)/(g - 1). Composing two g-ary RRs multiplies
  λ = p - q (Arcolezi et al. 2023, Section 4; memo.py, rappor-grr), so one
  report is GRR over [g] with

      p1 = p∞ p_r + (g - 1) q∞ q_r,   q1 = (1 - p1)/(g - 1),   p1/q1 <= e^ε1.

  Hence one report (s, y) has OLH's law at (ε1, g) with keep probability p1:
  P[(s, y) | v] = p1/|S| if y = h_s(v), else q1/|S|. The collector checks
  outputs with OLH's check (`olh.OLH.check_output`: seed in [0, g^(m+1)),
  y in [0, g)) and the aggregator counts support with OLH's support counts;
  only the keep probability differs (p1, the realized composite, instead of
  OLH's own p), so the estimate uses support_p = p1, support_q = 1/g and
  Var[f̂_v] = (f_v p1(1 - p1) + (1 - f_v)(1/g)(1 - 1/g)) / (n (p1 - 1/g)^2)
  (Wang et al. 2017, eq. (10) with its f_v term; `oracle.FrequencyOracle`).

g (policy param "g", a prime): default `olh.default_g(ε1)`, the prime near
e^ε1 + 1 minimizing the one-report variance at f_v = 0,
(e^ε1 - 1 + g)^2 / ((e^ε1 - 1)^2 (g - 1)) (Wang et al. 2017, eq. (10)): one
report's law is OLH's at ε1, so its optimal g is OLH's. A smaller g lowers
the charge below (g = 2 is the paper's BiLOLOHA) at some variance.

Privacy across reports (memo_loss.py, "Sequences of values"): the charge
per report is `sequence_charge(instantaneous_rate_grr(g, p_r), ε1)` =
max(ε1, ε_I), ε_I = ln p_r/q_r, the instantaneous GRR's own loss over [g];
for every T and every two sequences of T values (changed or not), the T
reports' exact joint loss is at most ε1 + (T - 1) ε_I <= T · charge. ε_I is
small because the instantaneous step acts on g values, not on k.

What the paper's lifetime figure means, and what it does not: Arcolezi et
al. state that a user's lifetime loss is at most g·ε∞ (composition over
the at most g permanent responses). That bounds what the permanent responses
reveal about the values, but each report also reveals *which* permanent
response it randomizes (the one of the current hash value), and that choice
depends on the value. Against changing values no lifetime cap holds:
g = 2, x = (a, a, a, ...) against x' = (a, b, a, b, ...) with h(a) != h(b)
and alternating outputs gives a likelihood ratio >= p∞^2 (p_r/q_r)^(T/2),
unbounded in T (ε1 = 1, ε∞ = 2: above g·ε∞ = 4 by T = 8;
tests/client/mechanisms/test_longitudinal_claims.py enumerates it). The
ledger therefore never stops charging.

Memo state (`memo.MemoState`): slot SEED_SLOT holds the seed (8 bytes,
little-endian); slot h in [0, g) holds the permanent response of hash value h
(4 bytes, little-endian). The SDK loads the slots `memo_slots` names (the
seed, then the current hash value's) and persists new ones in the report's
transaction; the memo key binds every parameter (k, ε1, ε∞, g).

Wire: HashedPayload (seed, value), OLH's. Batch layout: (seeds, values) int64.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import DyadicProbability, check_index
from fedldp.client.mechanisms.base import (
    CountStatistic,
    Estimate,
    HashedOutput,
    Output,
    system_random,
)
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.mechanisms.memo import (
    Memoized,
    MemoState,
    _grr_rate,
    _instant_keep,
    exact_probabilities,
)
from fedldp.client.mechanisms.memo_loss import GRRChain, instantaneous_rate_grr
from fedldp.client.mechanisms.olh import OLH, default_g, hash_value, respond, respond_batch
from fedldp.client.mechanisms.oracle import FrequencyOracle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: The memo slot of the hash seed (hash values use slots 0..g-1).
SEED_SLOT = -1
#: Bytes of a stored seed (g^(m+1) <= 2^63) and of a stored permanent hash value.
SEED_BYTES = 8
RESPONSE_BYTES = 4


class Loloha(Memoized):
    """LOLOHA over k values with g hash values (module docstring)."""

    wire_id = "loloha"
    base: OLH

    def __init__(
        self, epsilon: Decimal, k: int, epsilon_permanent: Decimal, g: int | None = None
    ) -> None:
        super().__init__(epsilon, k, epsilon_permanent)
        #: OLH at (ε1, g): the contract hash family, seed space, output check and support.
        self.base = OLH(epsilon, k, default_g(epsilon) if g is None else g)
        self.g = g = self.base.g
        self.seed_space = self.base.seed_space
        #: Digits of a value in base g (OLH's hash contract; the auditor reads it too).
        self.m = self.base.m
        # Arcolezi et al. 2023, Section 4: permanent GRR over [g] at ε∞ (Wang et al. 4.1).
        self.permanent = GRR(epsilon_permanent, g)
        self.p_exact, self.q_exact = exact_probabilities(self.permanent)
        # Instantaneous GRR over [g], calibrated so one report is GRR over [g] at ε1.
        self.p_r_exact = _instant_keep(g, self.p_exact, epsilon)
        self.q_r_exact = (1 - self.p_r_exact) / (g - 1)
        self.keep_r = DyadicProbability.at_most(self.p_r_exact)  # exact: on the grid
        #: One report's keep probability over [g] (composite of the two GRRs).
        self.p1_exact = self.p_exact * self.p_r_exact + (g - 1) * self.q_exact * self.q_r_exact
        self.q1_exact = (1 - self.p1_exact) / (g - 1)
        self.support_p = float(self.p1_exact)
        self.support_q = 1.0 / g
        self._finish()

    @property
    def memo_key(self) -> str:
        """Binds a MemoState to every parameter (k, ε1, ε∞ and g)."""
        return f"{super().memo_key}|g={self.g}"

    # --- the loss bounds of the Memoized frame ---

    def _chain(self) -> GRRChain:
        return GRRChain(self.g, self.p_exact, self.p_r_exact)

    def _loss(self, reports: int) -> Decimal:
        # Two values either collide under the (value-independent) hash, ratio 1, or
        # map to distinct hash values: rappor-grr's chain over [g].
        return self._chain().loss(reports)

    def _rate(self) -> Decimal:
        return _grr_rate(self.g, self.p_exact, self.p_r_exact)

    def _instantaneous_rate(self) -> Decimal:
        return instantaneous_rate_grr(self.g, self.p_r_exact)

    # --- device ---

    def memo_slots(self, value: Any, memo: MemoState) -> tuple[int, ...]:
        """The seed's slot, then (once the seed is known) the value's hash value's slot."""
        seed = memo.responses.get(SEED_SLOT)
        if seed is None:
            return (SEED_SLOT,)
        return (SEED_SLOT, self._hash(self._seed(seed), check_index(value, self.k)))

    def _seed(self, stored: bytes) -> int:
        seed = int.from_bytes(stored, "little")
        if len(stored) != SEED_BYTES or not 0 <= seed < self.seed_space:
            raise ValueError("memo state holds a corrupt hash seed")
        return seed

    def _hash(self, seed: int, value: int) -> int:
        return hash_value(seed, value, self.g, self.base.m)

    def perturb(
        self, value: int, *, rng: random.Random | None = None, memo: MemoState | None = None
    ) -> HashedOutput:
        check_index(value, self.k)
        state = self._memo(memo)
        r = rng if rng is not None else system_random()
        stored_seed = state.responses.get(SEED_SLOT)
        if stored_seed is None:
            stored_seed = r.randrange(self.seed_space).to_bytes(SEED_BYTES, "little")
            state.responses[SEED_SLOT] = stored_seed
        seed = self._seed(stored_seed)
        hashed = self._hash(seed, value)
        stored = state.responses.get(hashed)
        if stored is None:
            stored = self.permanent.perturb(hashed, rng=r).index.to_bytes(RESPONSE_BYTES, "little")
            state.responses[hashed] = stored
        permanent = int.from_bytes(stored, "little")
        if len(stored) != RESPONSE_BYTES or not 0 <= permanent < self.g:
            raise ValueError("memo state holds a corrupt permanent response")
        return HashedOutput(seed, respond(self.keep_r, permanent, self.g, r))

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """One report per user, each with a fresh memo: (seeds, values) int64 arrays."""
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.k):
            raise ValueError(f"values must be indices in [0, {self.k})")
        seeds: npt.NDArray[np.int64] = np.asarray(
            rng.integers(0, self.seed_space, size=values.shape[0]), dtype=np.int64
        )
        permanent = self.permanent.perturb_batch(self.base._hash_batch(seeds, values), rng)
        return seeds, respond_batch(self.keep_r, permanent, self.g, rng)

    def perturb_batch_longitudinal(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Reports of n users over T rounds, values (n, T): each user one seed and one
        permanent response per hash value, shared across rounds (the law of T calls of
        `perturb` with one memo). Returns (seeds (n,), reported hash values (n, T))."""
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        n, rounds = values.shape
        seeds: npt.NDArray[np.int64] = np.asarray(
            rng.integers(0, self.seed_space, size=n), dtype=np.int64
        )
        # Permanent responses for every hash value of every user, drawn up front
        # (the same law as drawing them lazily: memo_loss, "Sequences of values").
        table = self.permanent.perturb_batch(np.tile(np.arange(self.g), n), rng).reshape(n, self.g)
        out = np.empty((n, rounds), dtype=np.int64)
        for t in range(rounds):
            hashed = self.base._hash_batch(seeds, values[:, t])
            out[:, t] = respond_batch(self.keep_r, table[np.arange(n), hashed], self.g, rng)
        return seeds, out

    # --- collector and aggregator: OLH's check and support counts, composite p1 ---

    def estimate(self, statistic: CountStatistic) -> Estimate:
        """f̂ and its exact variance from support_p = p1 (the realized composite)."""
        return FrequencyOracle.estimate(self, statistic)

    def exact_probability(self, value: int, output: Output) -> Fraction:
        """P[(s, y) | v] of one report: p1/|S| if y = h_s(v), else q1/|S|."""
        assert isinstance(output, HashedOutput)
        return self._report_mass[0 if output.value == self._hash(output.seed, value) else 1]

    @functools.cached_property
    def _report_mass(self) -> tuple[Fraction, Fraction]:
        return self.p1_exact / self.seed_space, self.q1_exact / self.seed_space

    def outputs(self) -> Iterator[Output]:
        return self.base.outputs()


__all__ = ["SEED_SLOT", "Loloha"]
