"""Optimized local hashing (OLH) with a portable, exactly pairwise-independent hash family.

Wang, Blocki, Li, Jha, USENIX Security 2017, Section 4.4 (Local Hashing). A
device hashes its value into [0, g) with a hash function drawn from a family,
then reports the hash value by g-ary randomized response, together with the
hash's seed:

    p = e^ε / (e^ε + g - 1)   keep the hash value,
    q = 1 / (e^ε + g - 1)     each of the g - 1 other values,

so the privacy ratio is p/q = e^ε whatever the family: P[(s, y) | v] is
p / |seeds| when y = h_s(v) and q / |seeds| otherwise.

What the sampler realizes (exactly; `p_exact`, `q_exact`, `exact_probability`):
the seed is `randrange(g^(m+1))`, the hash value is kept when a uniform 53-bit
integer is below T = floor(p 2^53) (p from a 60-digit decimal e^ε,
`_common.dyadic_from_exp`), otherwise another value is `randrange(g - 1)`:
p_exact = T / 2^53, q_exact = (1 - p_exact)/(g - 1), and the realized ratio
T (g - 1)/(2^53 - T) <= e^ε exactly (it increases with T, and T <= p 2^53).

A report (s, y) supports v when h_s(v) = y: support_p = p_exact, and, because
the family below has collision probability exactly 1/g,
support_q = p_exact/g + (g-1) q_exact/g = 1/g, so

    Var[f̂_v] = (f_v p(1-p) + (1-f_v)(1/g)(1-1/g)) / (n (p - 1/g)^2),

whose f_v = 0 term is Wang et al.'s eq. (10), minimized near g = e^ε + 1.

Hash family (the contract; a device in any language reproduces it exactly)
--------------------------------------------------------------------------
Parameters: a prime g (policy param "g"; default the prime next to e^ε + 1
with the smaller variance, see `default_g`) and the domain size k. Let m >= 1
be the smallest integer with g^m >= k.

* Seed: the device draws s uniformly from [0, g^(m+1)) with its CSPRNG and
  sends it as HashedPayload.seed (the collector refuses s >= g^(m+1)).
* Write s in base g: s = s_0 + s_1 g + ... + s_m g^m, 0 <= s_j < g, and the
  value v in [0, k) likewise: v = v_0 + v_1 g + ... + v_{m-1} g^(m-1).
* h_s(v) = (s_m + s_0 v_0 + s_1 v_1 + ... + s_{m-1} v_{m-1}) mod g.

For v != v' their digit vectors differ and g is prime, so (h_s(v), h_s(v')) is
uniform on [0, g)^2: the family is exactly 2-independent (Carter and Wegman,
"Universal classes of hash functions", JCSS 1979; the dot-product family over
GF(g)). Integer arithmetic only: no hashing library, no byte order, no strings.

Estimation in O(n + g^(m+1) log g^(m+1) + k g), not O(n k)
-----------------------------------------------------------
The support count C(v) = sum_i [a_i · v ≡ y_i - b_i (mod g)] depends on a report
only through (a_i, c_i = y_i - b_i mod g), a point of Z_g^(m+1). With H the
histogram of those points, C(v) = (1/g) Σ_t Ĥ(t·v, -t), where Ĥ is the
(m+1)-dimensional discrete Fourier transform of H over Z_g. One real FFT of
the histogram (g^(m+1) <= g^2 k cells) serves every v at once; for parameters
where the histogram would be too large (very large g) a chunked direct O(n k)
evaluation is used. Both are exact (counts are rounded integers).

Wire: HashedPayload (seed, value). Batch layout: (seeds int64, values int64).
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
    check_index,
    dyadic_from_exp,
    exp_epsilon,
    f0_variance_scalar,
)
from fedldp.client.mechanisms.base import (
    CountStatistic,
    HashedOutput,
    Output,
    OutputDomainError,
    system_random,
)
from fedldp.client.mechanisms.oracle import FrequencyOracle

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Largest g accepted (the seed space g^(m+1) must fit int64 on the batch paths).
MAX_G = 2**31 - 1
#: Largest FFT histogram (cells) before the direct O(n k) path is used.
FFT_MAX_CELLS = 1 << 24


def is_prime(n: int) -> bool:
    """Deterministic primality by trial division (n < 2^32 here)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    i = 3
    while i * i <= n:
        if n % i == 0:
            return False
        i += 2
    return True


def lh_variance_f0(e: float, g: int) -> float:
    """n·Var[f̂_v] at f_v = 0 for local hashing into g values (Wang et al. 2017, eq. (10))."""
    return f0_variance_scalar(e / (e + g - 1), 1.0 / g)


def default_g(epsilon: Decimal) -> int:
    """The prime g around e^ε + 1 with the least variance (ties: the smaller g)."""
    e = exp_epsilon(epsilon)
    target = e + 1.0
    if target > MAX_G:
        raise ValueError("epsilon is too large for olh (g would exceed 2^31 - 1); use grr")
    below = max(2, math.floor(target))
    while below > 2 and not is_prime(below):
        below -= 1
    above = max(2, math.ceil(target))
    while not is_prime(above):
        above += 1
    if above > MAX_G:
        return below
    return min((below, above), key=lambda g: (lh_variance_f0(e, g), g))


def keep_probability(epsilon: Decimal, g: int) -> DyadicProbability:
    """p = e^ε / (e^ε + g - 1) rounded down to a multiple of 2^-53 (Wang et al. 2017,
    Section 4.4): the realized ratio T (g - 1) / (2^53 - T) is then <= e^ε exactly."""
    return dyadic_from_exp(lambda e: e / (e + g - 1), epsilon)


def respond(keep: DyadicProbability, hashed: int, g: int, rng: random.Random) -> int:
    """g-ary randomized response on a hash value: `hashed` with probability `keep`,
    otherwise each of the g - 1 other values in [0, g) with probability (1 - keep)/(g - 1)."""
    if keep.draw(rng):
        return hashed
    other = rng.randrange(g - 1)
    return other + 1 if other >= hashed else other


def respond_batch(
    keep: DyadicProbability, hashed: npt.NDArray[np.int64], g: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """`respond` for an int64 array of hash values (the same law, numpy randomness)."""
    import numpy as np

    n = hashed.shape[0]
    kept = keep.draw_batch(n, rng)
    other = rng.integers(0, g - 1, size=n, dtype=np.int64)
    other += other >= hashed
    return np.where(kept, hashed, other)


def hash_value(seed: int, value: int, g: int, m: int) -> int:
    """h_seed(value) as specified in the module docstring (pure integer arithmetic)."""
    acc = 0
    for _ in range(m):
        seed, a = divmod(seed, g)
        value, v = divmod(value, g)
        acc += a * v
    return (acc + seed) % g  # seed is now s_m


class OLH(FrequencyOracle):
    """Local hashing with g (prime) hash values; `default_g` gives the optimized OLH."""

    wire_id = "olh"

    def __init__(self, epsilon: Decimal, k: int, g: int | None = None) -> None:
        super().__init__(epsilon, k)
        if g is None:
            g = default_g(epsilon)
        if isinstance(g, bool) or not isinstance(g, int) or not 2 <= g <= MAX_G or not is_prime(g):
            raise ValueError(f"olh hash range g must be a prime in [2, {MAX_G}], got {g!r}")
        self.g = g
        m = 1
        while g**m < k:
            m += 1
        self.m = m
        self.seed_space: int = g ** (m + 1)
        if self.seed_space > 2**63:
            raise ValueError("olh seed space g^(m+1) exceeds 2^63; lower g or k")
        # Wang et al. 2017, Section 4.4: p = e^ε / (e^ε + g - 1), rounded down.
        self.keep = keep_probability(epsilon, g)
        self.p_exact = self.keep.exact
        self.q_exact = (1 - self.p_exact) / (g - 1)
        self.p = float(self.p_exact)
        self.q = float(self.q_exact)
        #: P[(s, y) | v] when y = h_s(v), and otherwise (seeds are uniform).
        self._report_mass: tuple[Fraction, Fraction] = (
            self.p_exact / self.seed_space,
            self.q_exact / self.seed_space,
        )
        self.support_p = self.p
        self.support_q = 1.0 / g

    # --- device ---

    def hash(self, seed: int, value: int) -> int:
        """h_seed(value), the contract's hash."""
        return hash_value(seed, value, self.g, self.m)

    def perturb(self, value: int, *, rng: random.Random | None = None) -> HashedOutput:
        check_index(value, self.k)
        r = rng if rng is not None else system_random()
        seed = r.randrange(self.seed_space)
        return HashedOutput(
            seed, respond(self.keep, hash_value(seed, value, self.g, self.m), self.g, r)
        )

    def _digits(self, numbers: npt.NDArray[np.int64], count: int) -> list[npt.NDArray[np.int64]]:
        import numpy as np

        rest = numbers.copy()
        out = []
        for _ in range(count):
            rest, digit = np.divmod(rest, self.g)
            out.append(digit)
        out.append(rest)
        return out

    def _hash_batch(
        self, seeds: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        seed_digits = self._digits(seeds, self.m)
        value_digits = self._digits(values, self.m)
        acc = np.zeros(seeds.shape[0], dtype=np.int64)
        reduce_each = self.m * (self.g - 1) ** 2 >= 2**62
        for j in range(self.m):
            acc += seed_digits[j] * value_digits[j]
            if reduce_each:
                acc %= self.g
        acc += seed_digits[self.m]
        acc %= self.g
        return acc

    def perturb_batch(
        self, values: npt.NDArray[np.int64], rng: np.random.Generator
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """(seeds, values) int64 arrays, the same law as `perturb`."""
        import numpy as np

        values = np.asarray(values, dtype=np.int64)
        if values.size and (values.min() < 0 or values.max() >= self.k):
            raise ValueError(f"values must be indices in [0, {self.k})")
        n = values.shape[0]
        g, m = self.g, self.m
        # Uniform seeds are i.i.d. uniform base-g digits: draw the digits, hash with a
        # table of the values' digits, and compose the seed. Chunks stay in cache.
        table = np.stack(self._digits(np.arange(self.k, dtype=np.int64), m)[:m], axis=1)
        powers = g ** np.arange(m + 1, dtype=np.int64)
        seeds = np.empty(n, dtype=np.int64)
        hashed = np.empty(n, dtype=np.int64)
        chunk = 1 << 16
        for start in range(0, n, chunk):
            v = values[start : start + chunk]
            digits = rng.integers(0, g, size=(v.shape[0], m + 1), dtype=np.int64)
            h = np.einsum("ij,ij->i", digits[:, :m], table[v])
            h += digits[:, m]
            hashed[start : start + chunk] = h % g
            seeds[start : start + chunk] = digits @ powers
        return seeds, respond_batch(self.keep, hashed, g, rng)

    # --- collector ---

    def check_output(self, output: Output) -> None:
        if not isinstance(output, HashedOutput):
            raise OutputDomainError("WRONG_PAYLOAD_TYPE", "olh expects a hashed payload")
        if not 0 <= output.seed < self.seed_space:
            raise OutputDomainError("OUT_OF_DOMAIN", f"olh seed outside [0, {self.seed_space})")
        if not 0 <= output.value < self.g:
            raise OutputDomainError("OUT_OF_DOMAIN", f"olh hash value outside [0, {self.g})")

    def supported(self, seed: int, hashed: int) -> Iterator[int]:
        """Every v in [0, k) with h_seed(v) = hashed, in about k/g steps.

        Solves the linear equation for the first digit with a nonzero
        coefficient and enumerates the other digits.
        """
        g, m = self.g, self.m
        coeffs = []
        rest = seed
        for _ in range(m):
            rest, a = divmod(rest, g)
            coeffs.append(a)
        b = rest
        target = (hashed - b) % g
        pivot = next((j for j, a in enumerate(coeffs) if a), None)
        if pivot is None:  # h is the constant b
            if target == 0:
                yield from range(self.k)
            return
        inverse = pow(coeffs[pivot], -1, g)
        others = [j for j in range(m) if j != pivot]
        for digits in itertools.product(range(g), repeat=len(others)):
            partial = 0
            value = 0
            for j, d in zip(others, digits, strict=True):
                partial += coeffs[j] * d
                value += d * g**j
            d_pivot = (target - partial) * inverse % g
            value += d_pivot * g**pivot
            if value < self.k:
                yield value

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, HashedOutput)
        counts = statistic.counts
        for v in self.supported(output.seed, output.value):
            counts[v] += 1
        statistic.n += 1

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Add (seeds, values) arrays, as from `perturb_batch`."""
        import numpy as np

        seeds, values = (np.asarray(x, dtype=np.int64) for x in outputs)
        if seeds.shape != values.shape:
            raise ValueError("seeds and values must have the same shape")
        if seeds.size and (
            seeds.min() < 0
            or seeds.max() >= self.seed_space
            or values.min() < 0
            or values.max() >= self.g
        ):
            raise OutputDomainError("OUT_OF_DOMAIN", "olh report outside its output domain")
        self._add_counts(statistic, self.support_counts_batch(seeds, values), seeds.shape[0])

    def support_counts_batch(
        self, seeds: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        """C(v) for every v from raw reports (FFT path, or direct when g is huge)."""
        if self.seed_space <= FFT_MAX_CELLS:
            return self._support_fft(seeds, values)
        return self._support_direct(seeds, values)

    def _support_fft(
        self, seeds: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        g, m = self.g, self.m
        g_m = g**m
        b, a_index = np.divmod(seeds, g_m)  # a_index = Σ_j s_j g^j (j < m), b = s_m
        c = (values - b) % g
        hist = np.bincount(a_index * g + c, minlength=g_m * g).astype(np.float64)
        # Axis order: (s_{m-1}, ..., s_0, c) — a_index's most significant digit first.
        spectrum = np.fft.rfftn(hist.reshape((g,) * (m + 1)))
        # spectrum[u, t] = Σ_{a,c} H[a, c] exp(-2πi (u·a + t c) / g); with u = -t·v (mod g)
        # it is Σ H exp(2πi t (a·v - c)/g), and C(v) = (1/g) Σ_{t=0}^{g-1} of that.
        v = np.arange(self.k, dtype=np.int64)
        v_digits = self._digits(v, m)[:m]
        flat = spectrum.reshape(-1)
        half = g // 2 + 1
        total = np.zeros(self.k, dtype=np.float64)
        for t in range(half):
            index = np.zeros(self.k, dtype=np.int64)
            for j in range(m):  # axis of s_j is m - 1 - j
                index = index * g + (-t * v_digits[m - 1 - j]) % g
            term = flat[index * half + t]
            if t == 0 or 2 * t == g:
                total += term.real
            else:  # the t and g - t terms are complex conjugates
                total += 2.0 * term.real
        return np.rint(total / g).astype(np.int64)

    def _support_direct(
        self, seeds: npt.NDArray[np.int64], values: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.int64]:
        import numpy as np

        counts = np.zeros(self.k, dtype=np.int64)
        v = np.arange(self.k, dtype=np.int64)
        chunk = max(1, (1 << 22) // self.k)
        for start in range(0, seeds.shape[0], chunk):
            s = seeds[start : start + chunk]
            y = values[start : start + chunk]
            hashed = self._hash_batch(np.repeat(s, self.k), np.tile(v, s.shape[0]))
            counts += (hashed.reshape(s.shape[0], self.k) == y[:, None]).sum(axis=0)
        return counts

    # --- tests ---

    def exact_probability(self, value: int, output: Output) -> Fraction:
        assert isinstance(output, HashedOutput)
        hashed = hash_value(output.seed, value, self.g, self.m)
        return self._report_mass[0 if output.value == hashed else 1]

    def outputs(self) -> Iterator[Output]:
        return (HashedOutput(s, y) for s in range(self.seed_space) for y in range(self.g))


__all__ = [
    "OLH",
    "default_g",
    "hash_value",
    "is_prime",
    "keep_probability",
    "respond",
    "respond_batch",
]
