"""Exact samplers for discrete Laplace and discrete Gaussian noise.

Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy",
NeurIPS 2020 (hereafter CKS20), Section 5, Algorithms 1-3.

Why: textbook Laplace noise computed in floating point leaks. Mironov
("On Significance of the Least Significant Bits for Differential Privacy",
CCS 2012) showed that the set of doubles a float Laplace sampler can output
depends on the true value, so an observer can often recover it exactly. The
defence here:

1. every random choice is an exact integer draw (`rng.randrange`) from the OS
   CSPRNG (`secrets.SystemRandom`) unless a seeded generator is passed for tests;
2. all probabilities are exact rationals (`fractions.Fraction`); no float is
   ever compared against a uniform variate;
3. the noise is an integer on a lattice; the caller rounds the true aggregate
   to the same lattice (granularity γ) *before* adding noise, so every output is
   an exact multiple of γ whatever the true value (releases.py), and the
   lattice sensitivity is ⌈Δ/γ⌉, which the noise is calibrated to.

The samplers are exact: their output distributions are exactly
P[x] ∝ exp(−|x|/t) (discrete Laplace, scale t) and P[x] ∝ exp(−x²/(2σ²))
(discrete Gaussian) over the integers. Their running time depends on the
randomness only, never on the data (the true value is added afterwards).
"""

from __future__ import annotations

import math
import random
from fractions import Fraction

from fedldp.client.mechanisms.base import system_random


def _bernoulli(p: Fraction, rng: random.Random) -> bool:
    """Exact Bernoulli(p) for rational p in [0, 1]."""
    if not 0 <= p <= 1:
        raise ValueError("probability outside [0, 1]")
    return rng.randrange(p.denominator) < p.numerator


def bernoulli_exp(gamma: Fraction, rng: random.Random) -> bool:
    """Exact Bernoulli(exp(−γ)) for rational γ ≥ 0 (CKS20, Algorithm 1)."""
    if gamma < 0:
        raise ValueError("gamma must be non-negative")
    if gamma <= 1:
        k = 1
        while _bernoulli(gamma / k, rng):
            k += 1
        return k % 2 == 1
    for _ in range(math.floor(gamma)):
        if not bernoulli_exp(Fraction(1), rng):
            return False
    return bernoulli_exp(gamma - math.floor(gamma), rng)


def geometric(scale: Fraction, rng: random.Random | None = None) -> int:
    """Exact one-sided geometric: P[Y ≥ y] = exp(−y/scale) for integers y ≥ 0.

    CKS20, Algorithm 2 without its sign: U uniform on [0, t) accepted with
    probability exp(−U/t), V ~ Geometric(1 − e^{−1}), X = U + tV, Y = ⌊X/s⌋ for
    scale = t/s. The draws it makes depend on the generator only (never on data).
    """
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError("scale must be positive")
    r = rng if rng is not None else system_random()
    t, s = scale.numerator, scale.denominator  # scale = t / s
    while True:
        u = r.randrange(t)
        if bernoulli_exp(Fraction(u, t), r):
            break
    v = 0
    while bernoulli_exp(Fraction(1), r):
        v += 1
    return (u + t * v) // s


def discrete_laplace(scale: Fraction, rng: random.Random | None = None) -> int:
    """Exact sample with P[x] ∝ exp(−|x|/scale) over the integers (CKS20, Algorithm 2).

    With integer sensitivity Δ, adding it gives ε-DP for scale = Δ/ε (CKS20,
    Section 5 and the standard ratio argument: P[x]/P[x+Δ] ≤ e^{Δ/scale}).
    """
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError("scale must be positive")
    r = rng if rng is not None else system_random()
    while True:
        y = geometric(scale, r)
        negative = r.randrange(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_gaussian(sigma2: Fraction, rng: random.Random | None = None) -> int:
    """Exact sample with P[x] ∝ exp(−x²/(2σ²)) over the integers (CKS20, Algorithm 3)."""
    sigma2 = Fraction(sigma2)
    if sigma2 <= 0:
        raise ValueError("variance must be positive")
    r = rng if rng is not None else system_random()
    t = math.isqrt(sigma2.numerator // sigma2.denominator) + 1  # floor(σ) + 1
    while True:
        y = discrete_laplace(Fraction(t), r)
        gamma = (abs(y) - sigma2 / t) ** 2 / (2 * sigma2)
        if bernoulli_exp(gamma, r):
            return y
