"""What loloha and dbitflip guarantee over sequences of changing values, exactly.

Exact enumeration, as in test_memo_sequences.py: for small parameters and T
reports, P[outputs | x] for every value sequence x, from the realized laws
(the seed or the d indices drawn once per memo, a permanent response per
hash value or d-bit vector, an instantaneous step per report), in Fractions.

* The sound charge holds: for every pair of sequences (changed or not) the
  exact joint loss is at most T · report_charge.
* The papers' lifetime figures do not hold for changing values: LOLOHA's
  g·ε∞ (Arcolezi et al., EDBT 2023) and dBitFlipPM's (d + 1)·ε∞ (composition
  over the permanent responses, Ding et al., NeurIPS 2017, Section 4) are
  exceeded by x = (a, a, ...) against x' = (a, b, a, b, ...) at T = 8.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction

import pytest
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.dbitflip import DBitFlip
from fedldp.client.mechanisms.loloha import Loloha
from fedldp.client.mechanisms.olh import hash_value

Law = Callable[[int, int], Fraction]  # (response, input) -> probability


def _exp_bounds(x: Decimal) -> tuple[Fraction, Fraction]:
    ctx = Context(prec=60)
    e = ctx.exp(x)
    return Fraction(e.next_minus(ctx)), Fraction(e.next_plus(ctx))


def _memo_law(size: int, permanent: Law, instant: Law, slots: tuple[int, ...]) -> list[Fraction]:
    """P[y_1..y_T | slot sequence] over y in [size]^T: one permanent response per
    distinct slot (drawn from permanent(b | slot)), y_t ~ instant(y_t | b of slot_t)."""
    distinct = sorted(set(slots))
    where = {u: i for i, u in enumerate(distinct)}
    outputs = list(itertools.product(range(size), repeat=len(slots)))
    probs = [Fraction(0)] * len(outputs)
    for responses in itertools.product(range(size), repeat=len(distinct)):
        weight = Fraction(1)
        for u, b in zip(distinct, responses, strict=True):
            weight *= permanent(b, u)
        for n, y in enumerate(outputs):
            term = weight
            for t, u in enumerate(slots):
                term *= instant(y[t], responses[where[u]])
            probs[n] += term
    return probs


# --- loloha ---


def _loloha_laws(mech: Loloha) -> tuple[Law, Law]:
    p, q, p_r, q_r = mech.p_exact, mech.q_exact, mech.p_r_exact, mech.q_r_exact
    return (lambda b, u: p if b == u else q), (lambda y, b: p_r if y == b else q_r)


def _loloha_joint(mech: Loloha, x: tuple[int, ...]) -> list[Fraction]:
    """P[(s, y_1..y_T) | x] over every seed s and y, the seed shared by the T reports."""
    permanent, instant = _loloha_laws(mech)
    out: list[Fraction] = []
    for s in range(mech.seed_space):
        hashed = tuple(hash_value(s, v, mech.g, mech.base.m) for v in x)
        out += [p / mech.seed_space for p in _memo_law(mech.g, permanent, instant, hashed)]
    return out


def _worst(laws: dict[tuple[int, ...], list[Fraction]]) -> Fraction:
    worst = Fraction(1)
    for x, x2 in itertools.permutations(laws, 2):
        worst = max(worst, max(a / b for a, b in zip(laws[x], laws[x2], strict=True)))
    return worst


@pytest.mark.parametrize(
    ("k", "g", "eps1", "eps_inf", "length"),
    [(3, 2, "1", "2", 3), (3, 3, "0.5", "2", 2), (2, 2, "1", "4", 3)],
)
def test_loloha_charges_cover_every_pair_of_sequences(
    k: int, g: int, eps1: str, eps_inf: str, length: int
) -> None:
    mech = create("loloha", Decimal(eps1), k, {"epsilon_permanent": eps_inf, "g": str(g)})
    assert isinstance(mech, Loloha)
    for t in range(1, length + 1):
        laws = {x: _loloha_joint(mech, x) for x in itertools.product(range(k), repeat=t)}
        bound, _ = _exp_bounds(mech.report_charge * t)
        assert _worst(laws) <= bound, t


def _alternating_ratio(size: int, permanent: Law, instant: Law, length: int) -> Fraction:
    """max over y of P[y | (1, 0, 1, 0, ...)] / P[y | (1, 1, ...)] (slot sequences)."""
    same = _memo_law(size, permanent, instant, (1,) * length)
    changing = _memo_law(size, permanent, instant, tuple(1 - t % 2 for t in range(length)))
    return max(a / b for a, b in zip(changing, same, strict=True))


def test_loloha_lifetime_figure_g_eps_inf_is_exceeded_by_changing_values() -> None:
    """g = 2, ε1 = 1, ε∞ = 2: x' alternates between two values of distinct hash values.

    At any seed s with h_s(a) != h_s(b), P[(s, y) | x'] / P[(s, y) | x] is the ratio
    of the hashed sequences' laws; at T = 8 it passes e^{g ε∞} = e^4 (the paper's
    lifetime bound), while T · report_charge still covers it.
    """
    mech = create("loloha", Decimal(1), 4, {"epsilon_permanent": "2", "g": "2"})
    assert isinstance(mech, Loloha)
    s = next(s for s in range(mech.seed_space) if mech.base.hash(s, 0) != mech.base.hash(s, 1))
    assert mech.base.hash(s, 0) != mech.base.hash(s, 1)
    permanent, instant = _loloha_laws(mech)
    length = 8
    ratio = _alternating_ratio(mech.g, permanent, instant, length)
    _, paper = _exp_bounds(mech.g * mech.epsilon_permanent)
    assert ratio > paper
    sound, _ = _exp_bounds(mech.report_charge * length)
    assert ratio <= sound


# --- dbitflip ---


def _dbitflip_laws(mech: DBitFlip) -> tuple[Law, Law]:
    """Laws on d-bit responses; slot u is the zero vector (0) or unit vector u - 1."""
    d, q_inf, f = mech.d, mech.q_inf_exact, mech.flip_exact

    def flips(a: int, b: int, prob: Fraction) -> Fraction:
        n = bin(a ^ b).count("1")
        return prob**n * (1 - prob) ** (d - n)

    def vector(u: int) -> int:
        return 0 if u == 0 else 1 << (u - 1)

    return (lambda b, u: flips(b, vector(u), q_inf)), (lambda y, b: flips(y, b, f))


def _dbitflip_joint(mech: DBitFlip, x: tuple[int, ...]) -> list[Fraction]:
    """P[(J, y_1..y_T) | buckets x] over every index set J and y."""
    permanent, instant = _dbitflip_laws(mech)
    subsets = list(itertools.combinations(range(mech.k), mech.d))
    out: list[Fraction] = []
    for indices in subsets:
        slots = tuple(next((p + 1 for p, j in enumerate(indices) if j == u), 0) for u in x)
        law = _memo_law(1 << mech.d, permanent, instant, slots)
        out += [p / len(subsets) for p in law]
    return out


@pytest.mark.parametrize(
    ("buckets", "d", "eps1", "eps_inf", "length"),
    [(3, 1, "1", "2", 3), (3, 2, "1", "2", 2), (2, 2, "0.5", "4", 3)],
)
def test_dbitflip_charges_cover_every_pair_of_sequences(
    buckets: int, d: int, eps1: str, eps_inf: str, length: int
) -> None:
    params = {"epsilon_permanent": eps_inf, "buckets": str(buckets), "d": str(d)}
    mech = create("dbitflip", Decimal(eps1), (Decimal(0), Decimal(1)), params)
    assert isinstance(mech, DBitFlip)
    for t in range(1, length + 1):
        laws = {x: _dbitflip_joint(mech, x) for x in itertools.product(range(buckets), repeat=t)}
        bound, _ = _exp_bounds(mech.report_charge * t)
        assert _worst(laws) <= bound, t


@pytest.mark.parametrize(("d", "eps1"), [(1, "1.5"), (2, "1")])
def test_dbitflip_lifetime_figure_d_plus_one_eps_inf_is_exceeded(d: int, eps1: str) -> None:
    """Buckets a = j_1 (vector e_1) and b outside the d indices (the zero vector):
    x' = (a, b, a, b, ...) against x = (a, a, ...) passes e^{(d + 1) ε∞} at T = 8.

    Bits are independent columns given the slot sequence (each has its own
    permanent and instantaneous flips), so the worst ratio is the product of the
    columns' worst ratios, each enumerated exactly over {0, 1}^T.
    """
    params = {"epsilon_permanent": "2", "buckets": "4", "d": str(d)}
    mech = create("dbitflip", Decimal(eps1), (Decimal(0), Decimal(1)), params)
    assert isinstance(mech, DBitFlip)
    q_inf, f = mech.q_inf_exact, mech.flip_exact
    length = 8
    ratio = Fraction(1)
    for position in range(d):
        # Slot 1 (e_1) has bit `position` set only at position 0; slot 0 never.
        def permanent(b: int, u: int, position: int = position) -> Fraction:
            bit = 1 if (u == 1 and position == 0) else 0
            return 1 - q_inf if b == bit else q_inf

        ratio *= _alternating_ratio(2, permanent, lambda y, b: 1 - f if y == b else f, length)
    _, paper = _exp_bounds((d + 1) * mech.epsilon_permanent)
    assert ratio > paper
    sound, _ = _exp_bounds(mech.report_charge * length)
    assert ratio <= sound
