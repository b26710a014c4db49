"""Finding 04: `release choice` must do the same random work on neighbouring datasets.

The earlier sampler (kept below as the broken variant) proposed candidates uniformly and
accepted with probability exp(−ε(u_max − u_i)/2): its number of rounds depends on the data.
The report-noisy-max sampler draws its priority order and k noises before looking at the
utilities, so the draws are a function of the generator alone.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

import pytest
from fedldp.aggregator.central.noise import bernoulli_exp
from fedldp.aggregator.central.releases import exponential_choice


class CountingRandom(random.Random):
    """A seeded generator that records every draw (getrandbits is what randrange uses)."""

    def __init__(self, seed: int) -> None:
        self.draws: list[tuple[str, int]] = []
        super().__init__(seed)

    def getrandbits(self, k: int) -> int:
        self.draws.append(("getrandbits", k))
        return super().getrandbits(k)

    def random(self) -> float:
        self.draws.append(("random", 0))
        return super().random()


def _rejection_choice(utilities: list[int], epsilon: Decimal, rng: random.Random) -> int:
    """BROKEN variant (the old sampler): rounds depend on the data."""
    eps, top, k = Fraction(epsilon), max(utilities), len(utilities)
    while True:
        i = rng.randrange(k)
        if bernoulli_exp(eps * (top - utilities[i]) / 2, rng):
            return i


NEIGHBOURS = [
    ([40, 0, 0, 0], [39, 0, 0, 0]),  # concentrated
    ([10, 10, 10, 10], [11, 10, 10, 10]),  # spread
    ([0, 0, 0, 0], [0, 0, 0, 1]),
]


def _transcript(sampler: object, utilities: list[int], seed: int) -> list[tuple[str, int]]:
    rng = CountingRandom(seed)
    sampler(utilities, Decimal(2), rng)  # type: ignore[operator]
    return rng.draws


@pytest.mark.parametrize(("d", "d_prime"), NEIGHBOURS)
def test_the_draws_are_identical_on_neighbouring_datasets(d: list[int], d_prime: list[int]) -> None:
    for seed in range(200):
        assert _transcript(exponential_choice, d, seed) == _transcript(
            exponential_choice, d_prime, seed
        )


def test_the_broken_rejection_sampler_is_caught() -> None:
    d, d_prime = [40, 0, 0, 0], [10, 10, 10, 10]
    assert any(
        len(_transcript(_rejection_choice, d, s)) != len(_transcript(_rejection_choice, d_prime, s))
        for s in range(50)
    )


def _win_probabilities(utilities: list[int], lam: float, terms: int = 4000) -> list[float]:
    """Exact (to float rounding; series truncated far past 1e-15) P[candidate i is chosen]
    for two candidates: Z ~ one-sided geometric P[Z = z] = (1 − q) q^z, q = e^{−λ};
    priority order uniform; ties to the earlier."""
    q = math.exp(-lam)
    pmf = [(1 - q) * q**z for z in range(terms)]
    tail = [0.0] * (terms + 1)  # tail[z] = P[Z >= z]
    for z in range(terms - 1, -1, -1):
        tail[z] = tail[z + 1] + pmf[z]

    def p_ge(t: int) -> float:
        return 1.0 if t <= 0 else (tail[t] if t < terms else 0.0)

    u0, u1 = utilities
    first = sum(pmf[z] * p_ge(u1 + z - u0) for z in range(terms))  # 0 wins ties
    second = sum(pmf[z] * p_ge(u1 + z - u0 + 1) for z in range(terms))  # 1 wins ties
    p0 = (first + second) / 2
    return [p0, 1 - p0]


def _worst_ratio(lam: float) -> float:
    """Largest P_D[o]/P_D'[o] over neighbours whose utilities each move by at most 1
    (each utility pair's law computed once)."""
    laws: dict[tuple[int, int], list[float]] = {}

    def law(u0: int, u1: int) -> list[float]:
        if (u0, u1) not in laws:
            laws[u0, u1] = _win_probabilities([u0, u1], lam)
        return laws[u0, u1]

    worst = 1.0
    for u0 in range(0, 6):
        for u1 in range(0, 6):
            for du0 in (-1, 0, 1):
                for du1 in (-1, 0, 1):
                    a = law(u0, u1)
                    b = law(u0 + du0, u1 + du1)
                    worst = max(worst, *(x / y for x, y in zip(a, b, strict=True)))
    return worst


def test_the_exponential_mechanisms_guarantee_holds_exactly() -> None:
    eps = 0.7
    assert _worst_ratio(eps / 2) <= math.exp(eps) * (1 + 1e-9)  # λ = ε/(2Δ): ε-DP
    # broken variant: the calibration for monotone utilities (λ = ε/Δ) is too weak here
    assert _worst_ratio(eps) > math.exp(eps) * 1.01


def test_the_best_candidate_usually_wins() -> None:
    rng = random.Random(7)
    wins = sum(exponential_choice([30, 5, 5], Decimal(1), rng) == 0 for _ in range(500))
    assert wins > 450
    with pytest.raises(TypeError, match="integers"):
        exponential_choice([1.5, 2], Decimal(1), rng)  # type: ignore[list-item]
