"""dBitFlipPM: memoized d-bit flipping over the buckets of a numeric range.

Ding, Kulkarni, Yekhanin, "Collecting Telemetry Data Privately", NeurIPS 2017,
Section 3 (dBitFlip, histograms) and Section 4 (memoization, "PM"). The range
[lo, hi] (policy metric) is cut into k equal buckets (policy param
"buckets"); bucket(x) = min(floor((x - lo) k / (hi - lo)), k - 1), computed
exactly in rationals from the double x and the decimal lo, hi (no rounding:
the boundaries lo + i (hi - lo)/k are exact). Each device draws, once per
(user, metric), d distinct bucket indices j_1 < ... < j_d uniformly (param
"d", 1 <= d <= k; `random.sample`, exact) and its d-bit vector is
b_p = 1[bucket(x) = j_p]: the zero vector or one of the d unit vectors, so a
user has at most d + 1 distinct vectors whatever its values.

Laws (`p_inf_exact`, `flip_exact`, `p1_exact` state them):

* permanent (memoized per distinct d-bit vector): each bit flipped w.p.
  q∞ = 1/(e^{ε∞/2} + 1), kept w.p. p∞ = e^{ε∞/2}/(e^{ε∞/2} + 1) — Ding et
  al. Section 3's per-bit response at ε∞ — realized as SUE at ε∞'s per-bit
  thresholds (`unary.SUE`: q∞ rounded up to the 2^-53 grid, p∞ = 1 - q∞).
* instantaneous (every report): each permanent bit flipped independently
  w.p. f on the 2^-53 grid, the least f whose one-report loss is <= ε1
  (`memo._instant_flip`, the rappor-sue calibration: composing two symmetric
  flips multiplies 1 - 2·flip). One report's bit is then 1 w.p.
  p1 = f + p∞ (1 - 2f) if b_p = 1 and q1 = 1 - p1 otherwise, with
  p1/q1 <= e^{ε1/2}: exactly the paper's one-round dBitFlip at ε1 (two
  vectors differ in at most two bits: loss (p1/q1)^2 <= e^ε1; the indices
  are independent of the value and leak nothing).

Estimation (Ding et al. Section 3, the unbiased histogram estimator). A
report supports bucket v when v = j_p for some p and bit p is 1, so it is a
support-count oracle over the k buckets (`oracle.FrequencyOracle`) with
p* = (d/k) p1 and q* = (d/k) q1, and

    f̂_v = (C(v)/n - q*)/(p* - q*),
    Var[f̂_v] = (f_v p*(1 - p*) + (1 - f_v) q*(1 - q*)) / (n (p* - q*)^2),

which is Ding et al.'s estimator ĥ(v) = (k/(n d)) Σ_i (b_{i,v}(e^{ε/2} + 1) - 1)
/(e^{ε/2} - 1) written with the realized p1. `bucket_estimate` returns it.
The policy's estimate (`estimate`) is the mean of the bucket midpoints m_v,
μ̂ = Σ_v m_v f̂_v, unbiased for the bucketized mean (within half a bucket
width of the true mean), with exact variance (derived here: the report's
contribution Z = Σ_p m_{j_p} bit_p, a user in bucket u, π_v = p1 if v = u
else q1, A = Σ_v m_v π_v, M2 = Σ_v m_v^2 π_v, B2 = Σ_v m_v^2 π_v^2;
the d indices are a uniform d-subset, so each ordered pair of distinct
buckets is drawn together w.p. d(d-1)/(k(k-1)) and bits are independent
given the indices):

    E[Z | u]   = (d/k) A,
    E[Z^2 | u] = (d/k) M2 + d(d-1)/(k(k-1)) (A^2 - B2),
    Var[μ̂]     = Σ_u f_u Var[Z | u] / (n (p* - q*)^2),

evaluated at the estimated histogram (clipped to [0, 1], normalized).

Privacy across reports (memo_loss.py, "Sequences of values"): the charge is
`sequence_charge(instantaneous_rate_unary(d, f), ε1)` = max(ε1, ε_I),
ε_I = d ln (1 - f)/f: two permanent d-bit responses may differ in all d
bits. For every T and every two sequences of T values, the T reports lose
at most ε1 + (T - 1) ε_I <= T · charge.

What the paper claims, and what does not hold: with memoization and no
instantaneous step Ding et al.'s reports are deterministic given the
vector, so a change of bucket is revealed with certainty once the new
vector's permanent response differs from the old one: unbounded loss
(this module refuses ε1 = ε∞, InfiniteSequenceLossError). Their stated
guarantee is about the permanent responses: at most d + 1 of them exist
per user, each ε∞-DP, so together (d + 1) ε∞ bounds what they reveal about
the values (and the paper discusses that the change times may leak). With
the instantaneous step added here, reports still reveal which permanent
response they randomize, which depends on the value: x = (a, a, ...)
against x' = (a, b, a, b, ...) gives a loss growing linearly in T past
(d + 1) ε∞ (tests/client/mechanisms/test_longitudinal_claims.py), so no
lifetime cap holds and the ledger never stops charging.

Memo state (`memo.MemoState`): slot SEED_SLOT holds the d indices (4 bytes
little-endian each, increasing); slot s in [0, d] holds the permanent
response of the vector with its 1 at position s - 1 (s = 0: the zero
vector), ceil(d/8) packed bytes. The SDK loads `memo_slots` (the indices,
then the current vector's slot) and persists new slots with the report.

Wire: IndexBitsPayload (indices, bits). Batch layout: (indices (n, d) int64,
bits (n, ceil(d/8)) uint8 packed little-endian).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms._common import (
    DyadicProbability,
    bernoulli_bits,
    byte_length,
    check_index,
)
from fedldp.client.mechanisms.base import (
    CountStatistic,
    Estimate,
    IndexBitsOutput,
    Output,
    OutputDomainError,
    system_random,
)
from fedldp.client.mechanisms.memo import Memoized, MemoState, _instant_flip, _unary_rate
from fedldp.client.mechanisms.memo_loss import UnaryChain, instantaneous_rate_unary
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.unary import SUE

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: The memo slot of the d bucket indices (vectors use slots 0..d).
SEED_SLOT = -1
#: Bytes per stored bucket index.
INDEX_BYTES = 4
#: Most buckets (the statistic has one count per bucket).
MAX_BUCKETS = 4096


class DBitFlip(Memoized):
    """dBitFlipPM over `buckets` equal buckets of [lo, hi], d bits per report."""

    wire_id = "dbitflip"

    def __init__(
        self,
        epsilon: Decimal,
        lo: Decimal,
        hi: Decimal,
        buckets: int,
        epsilon_permanent: Decimal,
        d: int | None = None,
    ) -> None:
        if isinstance(buckets, bool) or not isinstance(buckets, int) or not buckets >= 2:
            raise ValueError(f"dbitflip needs buckets >= 2, got {buckets!r}")
        if buckets > MAX_BUCKETS:
            raise ValueError(f"dbitflip takes at most {MAX_BUCKETS} buckets")
        super().__init__(epsilon, buckets, epsilon_permanent)
        if not (lo.is_finite() and hi.is_finite() and lo < hi):
            raise ValueError("dbitflip needs a finite range lo < hi")
        d = 1 if d is None else d
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= buckets:
            raise ValueError(f"dbitflip needs 1 <= d <= buckets ({buckets}), got {d!r}")
        self.lo, self.hi, self.d = lo, hi, d
        # Ding et al. 2017, Section 3: each bit kept w.p. e^{ε∞/2}/(e^{ε∞/2} + 1) —
        # SUE's per-bit thresholds at ε∞ (unary.py), q∞ rounded up, p∞ = 1 - q∞.
        sue = SUE(epsilon_permanent, 2)
        self.permanent_flip = sue.bit_q
        self.p_inf_exact, self.q_inf_exact = sue.p_exact, sue.q_exact
        self.flip_exact = _instant_flip(self.p_inf_exact, self.q_inf_exact, epsilon)
        self.flip_draw = DyadicProbability.at_most(self.flip_exact)  # exact: on the grid
        self.p1_exact = self.flip_exact + self.p_inf_exact * (1 - 2 * self.flip_exact)
        self.q1_exact = 1 - self.p1_exact
        self.support_p = float(self.p1_exact * d / buckets)
        self.support_q = float(self.q1_exact * d / buckets)
        self._subsets = math.comb(buckets, d)
        width = (Fraction(hi) - Fraction(lo)) / buckets
        #: Bucket midpoints lo + (v + 1/2)(hi - lo)/k, for the mean.
        self.midpoints = [
            float(Fraction(lo) + (v + Fraction(1, 2)) * width) for v in range(buckets)
        ]
        self._finish()

    @property
    def memo_key(self) -> str:
        """Binds a MemoState to every parameter (range, buckets, d, ε1, ε∞)."""
        return f"{super().memo_key}|lo={self.lo}|hi={self.hi}|d={self.d}"

    def bucket(self, value: float | Decimal) -> int:
        """The bucket of a finite value, clipped into [lo, hi] (exact rationals)."""
        x = Fraction(value)
        lo, hi = Fraction(self.lo), Fraction(self.hi)
        x = min(max(x, lo), hi)
        return min(math.floor((x - lo) * self.k / (hi - lo)), self.k - 1)

    # --- the loss bounds of the Memoized frame ---

    def _loss(self, reports: int) -> Decimal:
        # Two buckets' vectors differ in at most two bits (each an independent column
        # of rappor-sue's chain), and the indices are value-independent.
        return UnaryChain(self.p_inf_exact, self.q_inf_exact, self.flip_exact).loss(reports)

    def _rate(self) -> Decimal:
        return _unary_rate(self.p_inf_exact, self.q_inf_exact, self.flip_exact)

    def _instantaneous_rate(self) -> Decimal:
        return instantaneous_rate_unary(self.d, self.flip_exact)

    # --- device ---

    def _indices(self, stored: bytes) -> tuple[int, ...]:
        if len(stored) != INDEX_BYTES * self.d:
            raise ValueError("memo state holds corrupt bucket indices")
        indices = tuple(
            int.from_bytes(stored[i : i + INDEX_BYTES], "little")
            for i in range(0, len(stored), INDEX_BYTES)
        )
        if any(b <= a for a, b in itertools.pairwise(indices)) or indices[-1] >= self.k:
            raise ValueError("memo state holds corrupt bucket indices")
        return indices

    def _vector_slot(self, indices: tuple[int, ...], value: float) -> int:
        """0 for the zero vector, 1 + p when the value's bucket is indices[p]."""
        bucket = self.bucket(value)
        return next((p + 1 for p, j in enumerate(indices) if j == bucket), 0)

    def memo_slots(self, value: Any, memo: MemoState) -> tuple[int, ...]:
        """The indices' slot, then (once they are known) the value's vector's slot."""
        stored = memo.responses.get(SEED_SLOT)
        if stored is None:
            return (SEED_SLOT,)
        return (SEED_SLOT, self._vector_slot(self._indices(stored), value))

    def perturb(
        self, value: float, *, rng: random.Random | None = None, memo: MemoState | None = None
    ) -> IndexBitsOutput:
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
            raise ValueError("dbitflip values must be finite numbers")
        if not math.isfinite(value):
            raise ValueError("dbitflip values must be finite numbers")
        state = self._memo(memo)
        r = rng if rng is not None else system_random()
        stored = state.responses.get(SEED_SLOT)
        if stored is None:
            chosen = sorted(r.sample(range(self.k), self.d))
            stored = b"".join(j.to_bytes(INDEX_BYTES, "little") for j in chosen)
            state.responses[SEED_SLOT] = stored
        indices = self._indices(stored)
        slot = self._vector_slot(indices, value)
        width = byte_length(self.d)
        response = state.responses.get(slot)
        if response is None:
            vector = 0 if slot == 0 else 1 << (slot - 1)
            permanent = vector ^ bernoulli_bits(self.permanent_flip, self.d, r)
            response = permanent.to_bytes(width, "little")
            state.responses[slot] = response
        permanent = int.from_bytes(response, "little")
        if len(response) != width or permanent >> self.d:
            raise ValueError("memo state holds a corrupt permanent response")
        bits = permanent ^ bernoulli_bits(self.flip_draw, self.d, r)
        return IndexBitsOutput(indices, bits.to_bytes(width, "little"))

    # --- batch paths (simulation) ---

    def _buckets_batch(self, values: Any) -> npt.NDArray[np.int64]:
        import numpy as np

        x = np.clip(np.asarray(values, dtype=np.float64), float(self.lo), float(self.hi))
        # The exact (rational) bucket once per distinct value: simulations and audits
        # repeat a few values many times, and `bucket` costs microseconds per call.
        distinct, where = np.unique(x.ravel(), return_inverse=True)
        exact = np.asarray([self.bucket(float(v)) for v in distinct], dtype=np.int64)
        return exact[where].reshape(x.shape)

    def _subsets_batch(self, n: int, rng: np.random.Generator) -> npt.NDArray[np.int64]:
        import numpy as np

        # A uniform random permutation's first d entries: a uniform d-subset.
        keys = rng.random((n, self.k))
        return np.sort(np.argsort(keys, axis=1)[:, : self.d], axis=1).astype(np.int64)

    def _flips(self, prob: DyadicProbability, shape: tuple[int, ...], rng: Any) -> Any:
        size = math.prod(shape)
        return prob.draw_batch(size, rng).reshape(shape)

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> Any:
        """One report per user with a fresh memo: (indices (n, d), packed bits (n, ceil(d/8)))."""
        import numpy as np

        buckets = self._buckets_batch(values)
        indices = self._subsets_batch(buckets.shape[0], rng)
        vector = indices == buckets[:, None]
        shape = vector.shape
        bits = vector ^ self._flips(self.permanent_flip, shape, rng)
        bits ^= self._flips(self.flip_draw, shape, rng)
        return indices, np.packbits(bits, axis=1, bitorder="little")

    def perturb_batch_longitudinal(self, values: Any, rng: np.random.Generator) -> Any:
        """Values (n, T): each user one index draw and one permanent response per distinct
        vector, shared across rounds (T calls of `perturb` with one memo). Returns
        (indices (n, d), packed bits (n, T, ceil(d/8)))."""
        import numpy as np

        buckets = self._buckets_batch(values)
        n, rounds = buckets.shape
        indices = self._subsets_batch(n, rng)
        # Permanent responses of all d + 1 vectors, drawn up front (same law as lazily).
        vectors = np.zeros((self.d + 1, self.d), dtype=bool)
        vectors[1:] = np.eye(self.d, dtype=bool)
        table = vectors[None, :, :] ^ self._flips(self.permanent_flip, (n, self.d + 1, self.d), rng)
        out = np.empty((n, rounds, byte_length(self.d)), dtype=np.uint8)
        for t in range(rounds):
            hit = indices == buckets[:, t : t + 1]
            slot = np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, 0)
            bits = table[np.arange(n), slot] ^ self._flips(self.flip_draw, (n, self.d), rng)
            out[:, t] = np.packbits(bits, axis=1, bitorder="little")
        return indices, out

    # --- collector ---

    def check_output(self, output: Output) -> None:
        if not isinstance(output, IndexBitsOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "dbitflip expects an index-bits payload")
        indices = output.indices
        if len(indices) != self.d:
            raise OutputDomainError("WRONG_LENGTH", f"dbitflip expects exactly {self.d} indices")
        if not all(isinstance(j, int) and 0 <= j < self.k for j in indices):
            raise OutputDomainError("OUT_OF_DOMAIN", f"dbitflip bucket index outside [0, {self.k})")
        if any(b <= a for a, b in itertools.pairwise(indices)):
            raise OutputDomainError(
                "OUT_OF_DOMAIN", "dbitflip bucket indices must be distinct and increasing"
            )
        if not isinstance(output.bits, bytes) or len(output.bits) != byte_length(self.d):
            raise OutputDomainError(
                "WRONG_LENGTH", f"dbitflip expects exactly {byte_length(self.d)} packed bytes"
            )
        if int.from_bytes(output.bits, "little") >> self.d:
            raise OutputDomainError("OUT_OF_DOMAIN", "dbitflip: padding bits must be zero")

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, IndexBitsOutput)
        bits = int.from_bytes(output.bits, "little")
        for p, j in enumerate(output.indices):
            if (bits >> p) & 1:
                statistic.counts[j] += 1
        statistic.n += 1

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add (indices (n, d), packed bits (n, ceil(d/8))), as from `perturb_batch`."""
        import numpy as np

        indices, packed = outputs
        indices = np.asarray(indices, dtype=np.int64)
        if indices.ndim != 2 or indices.shape[1] != self.d:
            raise OutputDomainError("WRONG_LENGTH", f"dbitflip expects {self.d} indices per row")
        if indices.size and (indices.min() < 0 or indices.max() >= self.k):
            raise OutputDomainError("OUT_OF_DOMAIN", "dbitflip bucket index out of range")
        bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=1, bitorder="little")
        bits = bits[:, : self.d].astype(bool)
        counts = np.bincount(indices[bits], minlength=self.k)
        self._add_counts(statistic, counts, indices.shape[0])

    # --- aggregator ---

    def bucket_estimate(self, statistic: CountStatistic) -> Estimate:
        """The histogram over the buckets (Ding et al. Section 3) with its exact variance."""
        return FrequencyOracle.estimate(self, statistic)

    def mean_variance(self, n: int, frequencies: Any) -> float:
        """Exact Var[μ̂] for n reports at the bucket frequencies (module docstring)."""
        k, d = self.k, self.d
        p1, q1 = float(self.p1_exact), float(self.q1_exact)
        mids = self.midpoints
        total_m = sum(mids)
        total_m2 = sum(m * m for m in mids)
        pair = d * (d - 1) / (k * (k - 1))
        gap = (d / k) * (p1 - q1)
        var = 0.0
        for u, f_u in enumerate(frequencies):
            m_u = mids[u]
            a = q1 * total_m + (p1 - q1) * m_u
            m2 = q1 * total_m2 + (p1 - q1) * m_u * m_u
            b2 = q1 * q1 * total_m2 + (p1 * p1 - q1 * q1) * m_u * m_u
            second = (d / k) * m2 + pair * (a * a - b2)
            var += float(f_u) * (second - ((d / k) * a) ** 2)
        return var / (n * gap * gap)

    def estimate(self, statistic: CountStatistic) -> Estimate:
        """The mean of the bucket midpoints, μ̂ = Σ_v m_v f̂_v, with its exact variance."""
        import numpy as np

        hist = self.bucket_estimate(statistic)
        plug = np.clip(hist.values, 0.0, 1.0)
        total = float(plug.sum())
        plug = plug / total if total > 0 else np.full(self.k, 1.0 / self.k)
        mean = float(np.dot(np.asarray(self.midpoints), hist.values))
        variance = self.mean_variance(hist.n, plug)
        return Estimate(n=hist.n, values=np.array([mean]), variances=np.array([variance]))

    # --- tests: the exact law of one report, input = a bucket index ---

    def exact_probability(self, value: int, output: Output) -> Fraction:
        """P[one report = output | bucket `value`] from the realized thresholds."""
        check_index(value, self.k)
        self.check_output(output)
        assert isinstance(output, IndexBitsOutput)
        bits = int.from_bytes(output.bits, "little")
        prob = Fraction(1, self._subsets)
        for p, j in enumerate(output.indices):
            one = self.p1_exact if j == value else self.q1_exact
            prob *= one if (bits >> p) & 1 else 1 - one
        return prob

    def outputs(self) -> Iterator[Output]:
        width = byte_length(self.d)
        for indices in itertools.combinations(range(self.k), self.d):
            for bits in range(1 << self.d):
                yield IndexBitsOutput(indices, bits.to_bytes(width, "little"))


__all__ = ["SEED_SLOT", "DBitFlip"]
