"""Independent attack on the sound charge of memoized mechanisms (exact enumeration).

For every pair of input sequences of length T the exact joint loss
max_y ln P[y | x] / P[y | x'] is computed in rationals from the laws the
mechanism states it realizes (permanent thresholds, instantaneous thresholds on
the 2^-53 grid) and compared with T · report_charge. loloha is enumerated over
every pair of hash-value sequences in [g]^T and dbitflip over every pair of slot
sequences in {0..d}^T (supersets of what values can produce given the
value-independent seed or indices), so the bound is checked for every value pair.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from fedldp.client.mechanisms import create

Law = Callable[[int, int], Fraction]  # (value or slot, response) -> probability


def _integer_law(law: Law, rows: int, columns: int) -> tuple[list[list[int]], int]:
    """law(r, c) for r < rows, c < columns as integers over one common denominator D."""
    denominator = math.lcm(*(law(r, c).denominator for r in range(rows) for c in range(columns)))
    table = [[int(law(r, c) * denominator) for c in range(columns)] for r in range(rows)]
    return table, denominator


def _joint(
    seq: Sequence[int],
    ys: Sequence[Sequence[int]],
    responses: int,
    perm: list[list[int]],
    perm_d: int,
    inst: list[list[int]],
) -> list[int]:
    """P[y | seq] for each y, times D_perm^T D_inst^T (an integer): one permanent response
    per distinct input (c of them, each a factor over D_perm, the product then scaled
    by D_perm^(T - c)), the T reports given them (each a factor over D_inst)."""
    distinct = sorted(set(seq))
    scale = perm_d ** (len(seq) - len(distinct))
    totals = [0] * len(ys)
    for bs in itertools.product(range(responses), repeat=len(distinct)):
        b = dict(zip(distinct, bs, strict=True))
        weight = scale
        for u in distinct:
            weight *= perm[u][b[u]]
        if weight == 0:
            continue
        answers = [b[x] for x in seq]
        for n, y in enumerate(ys):
            term = weight
            for t, response in enumerate(answers):
                term *= inst[response][y[t]]
            totals[n] += term
    return totals


def _worst_loss(
    inputs: int, responses: int, outputs: int, reports: int, perm: Law, inst: Law
) -> float:
    """max over sequence pairs and outputs of ln P[y|x]/P[y|x'] (float of an exact ratio).

    Exact in integers: every P[y | x] is its numerator over the one denominator
    D_perm^T D_inst^T, so a ratio of two is the ratio of their numerators."""
    perm_table, perm_d = _integer_law(perm, inputs, responses)
    inst_table, _ = _integer_law(inst, responses, outputs)
    seqs = list(itertools.product(range(inputs), repeat=reports))
    ys = list(itertools.product(range(outputs), repeat=reports))
    table = {s: _joint(s, ys, responses, perm_table, perm_d, inst_table) for s in seqs}
    worst_num, worst_den = 1, 1
    for a, b in itertools.product(seqs, repeat=2):
        for pa, pb in zip(table[a], table[b], strict=True):
            if pa * worst_den > worst_num * pb:
                worst_num, worst_den = pa, pb
    return math.log(Fraction(worst_num, worst_den))


def _grr_laws(g: int, p_inf: Fraction, p_r: Fraction) -> tuple[Law, Law]:
    """Permanent GRR(p∞) and instantaneous GRR(p_r) over [g]."""
    q_inf, q_r = (1 - p_inf) / (g - 1), (1 - p_r) / (g - 1)
    return (
        lambda u, b: p_inf if u == b else q_inf,
        lambda b, y: p_r if b == y else q_r,
    )


GRR_CASES = [
    ("rappor-grr", "1", 2, {"epsilon_permanent": "2"}, 4),
    ("rappor-grr", "0.01", 2, {"epsilon_permanent": "5"}, 4),
    ("rappor-grr", "1.9", 3, {"epsilon_permanent": "2"}, 3),
    ("rappor-grr", "1", 3, {"epsilon_permanent": "20"}, 3),
    ("loloha", "1", 6, {"epsilon_permanent": "2", "g": "2"}, 4),
    ("loloha", "1", 6, {"epsilon_permanent": "2", "g": "3"}, 3),
    ("loloha", "0.05", 6, {"epsilon_permanent": "8", "g": "3"}, 3),
    ("loloha", "2.9", 30, {"epsilon_permanent": "3", "g": "5"}, 2),
]


@pytest.mark.parametrize(("wid", "eps", "k", "params", "max_t"), GRR_CASES)
def test_grr_family_t_charges_cover_every_pair_of_sequences(
    wid: str, eps: str, k: int, params: dict[str, str], max_t: int
) -> None:
    """rappor-grr over [k], loloha over [g]: loss(T) <= T · report_charge, T <= max_t."""
    mech: Any = create(wid, Decimal(eps), k, params)
    g = getattr(mech, "g", k)
    perm, inst = _grr_laws(g, mech.p_exact, mech.p_r_exact)
    charge = float(mech.report_charge)
    for reports in range(1, max_t + 1):
        loss = _worst_loss(g, g, g, reports, perm, inst)
        assert loss <= reports * charge + 1e-12, (wid, eps, params, reports, loss, charge)
        if reports == 1:
            assert loss <= float(Decimal(eps)) + 1e-12


def _dbitflip_laws(d: int, q_inf: Fraction, f: Fraction) -> tuple[Law, Law]:
    """Slot s -> vector e_s (0: zero vector); permanent flips q∞ per bit, reports f per bit."""

    def vec(s: int) -> int:
        return 0 if s == 0 else 1 << (s - 1)

    def bits(a: int, b: int, flip: Fraction) -> Fraction:
        diff = bin(a ^ b).count("1")
        return flip**diff * (1 - flip) ** (d - diff)

    return (lambda s, b: bits(vec(s), b, q_inf), lambda b, y: bits(b, y, f))


@pytest.mark.parametrize(
    ("eps", "eps_inf", "d", "max_t"),
    [("1", "2", 1, 3), ("1.5", "2", 1, 3), ("1", "2", 2, 3), ("0.1", "6", 2, 2), ("1", "2", 3, 1)],
)
def test_dbitflip_t_charges_cover_every_pair_of_slot_sequences(
    eps: str, eps_inf: str, d: int, max_t: int
) -> None:
    """dbitflip, buckets = 4: loss(T) over all slot-sequence pairs <= T · report_charge."""
    mech: Any = create(
        "dbitflip",
        Decimal(eps),
        (Decimal(0), Decimal(1)),
        {"epsilon_permanent": eps_inf, "buckets": "4", "d": str(d)},
    )
    perm, inst = _dbitflip_laws(d, mech.q_inf_exact, mech.flip_exact)
    assert mech.p_inf_exact + mech.q_inf_exact == 1
    charge = float(mech.report_charge)
    for reports in range(1, max_t + 1):
        loss = _worst_loss(d + 1, 1 << d, 1 << d, reports, perm, inst)
        assert loss <= reports * charge + 1e-12, (eps, eps_inf, d, reports, loss, charge)


class _ScriptedRandom(random.Random):
    """random() returns a chosen grid point m·2^-53; randrange is the base class's."""

    def __init__(self, m: int) -> None:
        super().__init__(0)
        self.m = m

    def random(self) -> float:
        """The scripted uniform."""
        return self.m * 2.0**-53


@pytest.mark.parametrize(
    ("eps", "eps_inf", "k"), [("1", "2", 2), ("0.5", "2", 64), ("1.9", "2", 3)]
)
def test_rappor_grr_sampler_threshold_is_the_declared_p_r(eps: str, eps_inf: str, k: int) -> None:
    """Reading the instantaneous sampler: it keeps exactly when m < p_r·2^53."""
    mech: Any = create("rappor-grr", Decimal(eps), k, {"epsilon_permanent": eps_inf})
    t = int(mech.p_r_exact * 2**53)
    assert Fraction(t, 2**53) == mech.p_r_exact
    memo = mech.new_memo()
    memo.responses[0] = (0).to_bytes(4, "little")  # permanent response 0
    keep = [mech.perturb(0, memo=memo, rng=_ScriptedRandom(m)).index == 0 for m in (t - 1, t)]
    assert keep == [True, False]


def test_loloha_instantaneous_keep_rate_matches_the_declared_law() -> None:
    """loloha g = 3: with a fixed memo, 40,000 reports keep at p_r (|z| < 5, α < 1e-6)."""
    mech: Any = create("loloha", Decimal(1), 6, {"epsilon_permanent": "2", "g": "3"})
    memo = mech.new_memo()
    rng = random.Random(1234)
    first = mech.perturb(0, memo=memo, rng=rng)
    permanent = int.from_bytes(memo.responses[mech._hash(first.seed, 0)], "little")
    n = 40_000
    kept = sum(mech.perturb(0, memo=memo, rng=rng).value == permanent for _ in range(n))
    p = float(mech.p_r_exact)
    z = (kept - n * p) / math.sqrt(n * p * (1 - p))
    assert abs(z) < 5, (kept, n * p)


@pytest.mark.parametrize("wid", ["rappor-oue", "rappor-sue"])
def test_tiny_epsilon_builds_or_names_the_parameter(wid: str) -> None:
    """ε1 = 1e-20, ε∞ = 1, k = 3.

    rappor-grr and loloha build (charge 0.000001). rappor-oue / rappor-sue raise
    ValueError("need k >= 1 and 0 <= flip < 1/2"): the calibrated flip is exactly
    1/2 (pure noise, ε_I = 0 would be sound) and instantaneous_rate_unary refuses
    it; the message names no policy parameter (docs: "raises ValueError with a
    specific message"). Severity: low (denial, not a privacy loss).
    """
    try:
        mech: Any = create(wid, Decimal("1e-20"), 3, {"epsilon_permanent": "1"})
    except ValueError as exc:
        assert "epsilon" in str(exc)
    else:
        assert mech.report_charge >= Decimal("1e-20")


def test_shared_memo_across_two_epsilons_is_covered() -> None:
    """One permanent response shared by reports at ε1 = 0.05 and 0.5 (rappor-grr k = 3, ε∞ = 1).

    Each report's factor is a mixture of its own instantaneous law, so the pair's
    exact loss is at most the sum of the two charges.
    """
    a: Any = create("rappor-grr", Decimal("0.05"), 3, {"epsilon_permanent": "1"})
    b: Any = create("rappor-grr", Decimal("0.5"), 3, {"epsilon_permanent": "1"})
    perm, inst_a = _grr_laws(3, a.p_exact, a.p_r_exact)
    _, inst_b = _grr_laws(3, b.p_exact, b.p_r_exact)
    worst = 0.0
    for x, xp in itertools.product(itertools.product(range(3), repeat=2), repeat=2):
        for y in itertools.product(range(3), repeat=2):

            def joint(seq: tuple[int, ...], y: tuple[int, ...] = y) -> Fraction:
                total = Fraction(0)
                for bs in itertools.product(range(3), repeat=3):
                    term = Fraction(1)
                    for u in set(seq):
                        term *= perm(u, bs[u])
                    total += term * inst_a(bs[seq[0]], y[0]) * inst_b(bs[seq[1]], y[1])
                return Fraction(total / 3 ** (3 - len(set(seq))))

            worst = max(worst, math.log(joint(x) / joint(xp)))
    assert worst <= float(a.report_charge + b.report_charge) + 1e-12
