"""Exact longitudinal loss and charging of the memoized mechanisms (memo.py, memo_loss.py).

The reference here is brute force: for small k and T, every output sequence,
every true value and every permanent response, in exact rationals from the
probabilities the samplers realize. The closed forms of L(T) (T reports of one
UNCHANGED value), the retired rate r* and the calibration are checked against
it; the broken variants (ε1 per report for rappor-grr, an instantaneous step
that flips too little) must fail. Sequences of values that change, and the
sound charge that covers them, are test_memo_sequences.py's.
"""

from __future__ import annotations

import itertools
import math
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np
import pytest
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.memo import Memoized, MemoizedUnary, RapporGRR, RapporOUE, RapporSUE
from fedldp.client.mechanisms.memo_loss import JointLossTooCostlyError

_LN = Context(prec=60)


def _ln(x: Fraction) -> Decimal:
    """ln x to about 60 digits (reference only; the product's bounds are directed)."""
    return _LN.subtract(_LN.ln(Decimal(x.numerator)), _LN.ln(Decimal(x.denominator)))


def _grr_law(mech: RapporGRR, ys: tuple[int, ...], v: int) -> Fraction:
    """P_T(ys | v): sum over the permanent index z, reports i.i.d. given z."""
    p_r = mech.p_r_exact
    q_r = (1 - p_r) / (mech.k - 1)
    total = Fraction(0)
    for z in range(mech.k):
        prob = mech.p_exact if z == v else mech.q_exact
        for y in ys:
            prob *= p_r if y == z else q_r
        total += prob
    return total


def _unary_law(mech: MemoizedUnary, ys: tuple[int, ...], v: int) -> Fraction:
    """P_T(ys | v): sum over every permanent bit vector, every bit of every report."""
    f = mech.flip_exact
    total = Fraction(0)
    for permanent in range(1 << mech.k):
        prob = Fraction(1)
        for i in range(mech.k):
            one = mech.p_exact if i == v else mech.q_exact
            bit = (permanent >> i) & 1
            prob *= one if bit else 1 - one
            for y in ys:
                prob *= 1 - f if (y >> i) & 1 == bit else f
        total += prob
    return total


def _worst_ratio(mech: Memoized, reports: int) -> Fraction:
    """max over output sequences and values v != v' of P_T(y|v)/P_T(y|v'), exactly."""
    if isinstance(mech, RapporGRR):
        outputs, law = range(mech.k), _grr_law
    else:
        assert isinstance(mech, MemoizedUnary)
        outputs, law = range(1 << mech.k), _unary_law  # type: ignore[assignment]
    best = Fraction(1)
    for ys in itertools.product(outputs, repeat=reports):
        probs = [law(mech, ys, v) for v in range(mech.k)]  # type: ignore[arg-type]
        best = max(best, max(probs) / min(probs))
    return best


def _permanent_ratio(mech: Memoized) -> Fraction:
    assert isinstance(mech, (RapporGRR, MemoizedUnary))
    p, q = mech.p_exact, mech.q_exact
    return p / q if isinstance(mech, RapporGRR) else p * (1 - q) / (q * (1 - p))


def check_contract(mech: Memoized, max_reports: int, charge: Decimal) -> None:
    """The memo charging contract, against brute force, for T = 1..max_reports."""
    permanent = _permanent_ratio(mech)
    for reports in range(1, max_reports + 1):
        exact = _worst_ratio(mech, reports)
        loss = _ln(exact)
        bound = mech._loss(reports)
        # The closed form is the exact loss, rounded up by less than 1e-30.
        assert loss <= bound < _LN.add(loss, Decimal("1e-30")), (reports, loss, bound)
        # The charges of those reports cover their loss, which the permanent bounds.
        assert loss <= reports * charge, (reports, loss, charge)
        assert exact <= permanent
        if reports == 1:
            assert loss <= mech.epsilon  # one report leaks at most ε1, exactly
    # The realized permanent response is ε∞ up to its float sampler's rounding.
    assert _ln(permanent) <= mech.epsilon_permanent + Decimal("1e-12")


GRR_CASES = [
    (2, "0.5", "2", 4),
    (3, "0.5", "2", 4),
    (3, "0.25", "3", 4),
    (4, "0.1", "1", 4),
    (4, "0.25", "2", 4),
    (4, "1", "3", 3),
]
UNARY_CASES = [
    ("rappor-oue", 2, "0.5", "2", 3),
    ("rappor-oue", 3, "1", "3", 3),
    ("rappor-sue", 2, "0.5", "2", 3),
    ("rappor-sue", 3, "0.25", "1", 3),
]


@pytest.mark.parametrize(("k", "eps", "eps_perm", "reports"), GRR_CASES)
def test_rappor_grr_charge_covers_the_exact_loss(
    k: int, eps: str, eps_perm: str, reports: int
) -> None:
    mech = RapporGRR(Decimal(eps), k, Decimal(eps_perm))
    check_contract(mech, reports, mech.retired_report_charge)
    assert mech.report_charge >= mech.retired_report_charge


@pytest.mark.parametrize(("wire_id", "k", "eps", "eps_perm", "reports"), UNARY_CASES)
def test_rappor_unary_charge_covers_the_exact_loss(
    wire_id: str, k: int, eps: str, eps_perm: str, reports: int
) -> None:
    mech = create(wire_id, Decimal(eps), k, {"epsilon_permanent": eps_perm})
    assert isinstance(mech, MemoizedUnary)
    check_contract(mech, reports, mech.retired_report_charge)
    # L is concave in T for p∞ >= 1/2 >= q∞ (memo_loss.py): r* is ε1 itself.
    assert mech.retired_report_charge == mech.epsilon
    assert mech.report_charge > mech.epsilon  # changing values cost more (k ln (1-f)/f)


def test_broken_todays_charge_of_epsilon_per_report_fails_for_rappor_grr() -> None:
    # k = 4, ε1 = 0.1, ε∞ = 1: two reports of one value leak 0.2072 > 2 ε1.
    mech = RapporGRR(Decimal("0.1"), 4, Decimal(1))
    with pytest.raises(AssertionError):
        check_contract(mech, 2, mech.epsilon)
    assert mech.retired_report_charge == Decimal("0.106349")
    check_contract(mech, 2, mech.retired_report_charge)


def test_broken_instantaneous_step_that_flips_too_little_fails() -> None:
    mech = RapporOUE(Decimal("0.5"), 2, Decimal(2))
    mech.flip_exact /= 2  # keeps more of the permanent response than ε1 allows
    with pytest.raises(AssertionError):
        check_contract(mech, 1, mech.epsilon)
    grr = RapporGRR(Decimal("0.5"), 3, Decimal(2))
    grr.p_r_exact += Fraction(1, 100)
    with pytest.raises(AssertionError):
        check_contract(grr, 1, grr.epsilon)


def test_the_issue_figures() -> None:
    # issue 14, item 3 (exact loss vs today's charge T ε1).
    mech = RapporGRR(Decimal("0.5"), 64, Decimal(2))
    assert mech.value_loss(1) == Decimal("0.500000")
    assert mech.value_loss(2) == Decimal("1.477605")  # charged 1.0 before
    assert mech.value_loss(3) == Decimal("1.919559")  # charged 1.5 before
    assert mech.retired_report_charge == Decimal("0.738803")  # r* = L(2)/2
    assert mech.report_charge == Decimal("2.192184")  # ε_I = ln p_r/q_r (sequences)
    wide = RapporGRR(Decimal("0.1"), 256, Decimal(3))
    assert wide.value_loss(8) == Decimal("2.853862")  # charged 0.8 before
    assert 8 * wide.retired_report_charge >= wide.value_loss(8)
    # issue 28: rappor-oue k = 64, ε1 = 1, ε∞ = 2 is charged ε_I = 64 ln (1-f)/f.
    oue = create("rappor-oue", Decimal(1), 64, {"epsilon_permanent": "2"})
    assert isinstance(oue, Memoized)
    assert oue.report_charge == Decimal("90.086782")
    assert oue.retired_report_charge == Decimal(1)


@pytest.mark.parametrize(
    ("wire_id", "k", "eps", "eps_perm"),
    [
        ("rappor-grr", 64, "0.5", "2"),
        ("rappor-grr", 256, "0.1", "3"),
        ("rappor-grr", 3, "0.25", "4"),
        ("rappor-grr", 16, "1", "4"),
        ("rappor-oue", 16, "0.5", "4"),
        ("rappor-sue", 16, "0.5", "2"),
    ],
)
def test_rate_is_the_max_over_every_number_of_reports(
    wire_id: str, k: int, eps: str, eps_perm: str
) -> None:
    mech = create(wire_id, Decimal(eps), k, {"epsilon_permanent": eps_perm})
    assert isinstance(mech, Memoized)
    rate = mech._rate()
    horizon = 3 * math.ceil(Decimal(eps_perm) / Decimal(eps)) + 5
    losses = [mech._loss(m) for m in range(1, horizon + 1)]
    best = max(_LN.divide(loss, m) for m, loss in enumerate(losses, start=1))
    assert best <= rate < _LN.add(best, Decimal("1e-40"))
    # Per value the loss never exceeds the permanent response's (ε∞ up to rounding).
    assert max(losses) <= mech.epsilon_permanent + Decimal("1e-12")
    assert mech.retired_report_charge >= rate and mech.report_charge >= mech.epsilon
    assert mech.report_charge >= mech.retired_report_charge
    exponent = mech.report_charge.as_tuple().exponent
    assert isinstance(exponent, int) and exponent >= -6  # an exact decimal string


def test_lifetime_epsilon_is_the_value_blind_sum_of_charges() -> None:
    mech = RapporGRR(Decimal("0.5"), 64, Decimal(2))
    counts = [1, 2, 3, 40]
    total = mech.lifetime_epsilon(counts)
    assert total == sum(counts) * mech.report_charge == mech.lifetime_epsilon(46)
    # One unchanged value saturates at ε∞ (rounded up): RAPPOR's guarantee, not a charge.
    assert mech.value_loss(40) <= Decimal("2.000001")
    assert mech.lifetime_epsilon([]) == 0
    with pytest.raises(ValueError, match="reports"):
        mech.value_loss(-1)
    with pytest.raises(ValueError, match="integers"):
        mech.lifetime_epsilon([-1])


def test_the_retired_rate_is_refused_when_too_costly_but_the_charge_is_not() -> None:
    mech = RapporGRR(Decimal("0.001"), 3, Decimal(8))
    assert mech.report_charge > mech.epsilon  # ε_I: a closed form, never too costly
    with pytest.raises(JointLossTooCostlyError, match="epsilon_permanent"):
        _ = mech.retired_report_charge


def test_one_report_is_the_base_mechanism_up_to_the_grid() -> None:
    # The calibration keeps the marginal law of one report the base law at ε1
    # (what the aggregator estimates with), one report within ε1 exactly.
    for mech in (
        RapporGRR(Decimal("0.5"), 64, Decimal(2)),
        RapporOUE(Decimal("0.5"), 16, Decimal(2)),
        RapporSUE(Decimal(1), 16, Decimal(3)),
    ):
        for output in itertools.islice(mech.outputs(), 4):
            marginal = mech.output_probability(0, output)
            assert marginal == pytest.approx(mech.base.output_probability(0, output), rel=1e-12)


def _joint_same(outputs: np.ndarray, value: int) -> float:
    return float(np.mean((outputs[:, 0] == value) & (outputs[:, 1] == value)))


def test_grr_longitudinal_batch_shares_the_permanent_response() -> None:
    mech = RapporGRR(Decimal("0.5"), 3, Decimal(2))
    n = 200_000
    values = np.zeros(n, dtype=np.int64)
    outputs = mech.perturb_batch_longitudinal(values, 2, np.random.default_rng(7))
    assert outputs.shape == (n, 2) and outputs.dtype == np.int64
    expected = float(_grr_law(mech, (0, 0), 0))  # 0.2156: both reports equal the value
    sd = math.sqrt(expected * (1 - expected) / n)
    assert abs(_joint_same(outputs, 0) - expected) < 5.3 * sd  # fixed seed; alpha ~ 1e-7
    # Broken variant: a fresh permanent response per report (two ordinary calls)
    # gives p1^2 = 0.2042, about 12 sd away.
    independent = np.stack(
        [mech.perturb_batch(values, np.random.default_rng(s)) for s in (8, 9)], axis=1
    )
    assert abs(_joint_same(independent, 0) - expected) > 5.3 * sd


def test_unary_longitudinal_batch_shares_the_permanent_response() -> None:
    mech = RapporOUE(Decimal("0.5"), 3, Decimal(2))
    n = 100_000
    values = np.zeros(n, dtype=np.int64)
    outputs = mech.perturb_batch_longitudinal(values, 2, np.random.default_rng(3))
    assert outputs.shape == (n, 2, 1) and outputs.dtype == np.uint8
    bit = outputs[:, :, 0] & 1  # bit 0 = the true value's bit
    f = float(mech.flip_exact)
    p = float(mech.p_exact)
    expected = p * (1 - f) ** 2 + (1 - p) * f**2  # 0.2759; independent reports: 0.25
    sd = math.sqrt(expected * (1 - expected) / n)
    both = float(np.mean(bit[:, 0] & bit[:, 1]))
    assert abs(both - expected) < 5.3 * sd
    assert abs(0.25 - expected) > 10 * sd


def _grr_unpruned(mech: RapporGRR, m: int) -> Fraction:
    """Every (a, b), the n others spread evenly (no pruning), in exact rationals."""
    p, q = mech.p_exact, mech.q_exact
    rho = mech.p_r_exact * (mech.k - 1) / (1 - mech.p_r_exact)
    others = mech.k - 2
    best = Fraction(1)
    for a in range(m + 1):
        for b in range(m - a + 1):
            n = m - a - b
            if others == 0 and n:
                continue
            u, w = divmod(n, others) if others else (0, 0)
            rest = w * rho ** (u + 1) + (others - w) * rho**u
            ratio = (q * (rho**b + rest) + p * rho**a) / (q * (rho**a + rest) + p * rho**b)
            best = max(best, ratio)
    return best


@pytest.mark.parametrize(
    ("k", "eps", "eps_perm"), [(3, "0.3", "3"), (6, "0.5", "2"), (20, "1", "4")]
)
def test_grr_pruning_loses_nothing(k: int, eps: str, eps_perm: str) -> None:
    mech = RapporGRR(Decimal(eps), k, Decimal(eps_perm))
    for m in range(1, 13):
        loss = _ln(_grr_unpruned(mech, m))
        assert loss <= mech._loss(m) < _LN.add(loss, Decimal("1e-30"))


# --- reports of one value at two ε1 never share a permanent response ----------------


def _mixed_grr_ratio(k: int, p: Fraction, keeps: list[Fraction]) -> Fraction:
    """Exact max over output sequences and v != v' of P(y|v)/P(y|v') for rappor-grr
    reports of one value sharing ONE permanent response (permanent keep `p`) with
    instantaneous keeps `keeps` (one per report, possibly different ε1).

    Labels beyond T + 2 are symmetric, so outputs are enumerated over min(k, T + 2).
    """
    q = (1 - p) / (k - 1)
    others = [(1 - keep) / (k - 1) for keep in keeps]
    labels = min(k, len(keeps) + 2)
    none = math.prod(others)
    best = Fraction(1)
    for outputs in itertools.product(range(labels), repeat=len(keeps)):
        g = [
            math.prod(
                keep if y == z else other
                for y, keep, other in zip(outputs, keeps, others, strict=True)
            )
            for z in range(labels)
        ]
        total = sum(g) + (k - labels) * none
        probs = [q * total + (p - q) * gz for gz in g]
        best = max(best, max(probs) / min(probs))
    return best


def test_a_change_of_epsilon1_draws_new_permanent_responses() -> None:
    """Two versions differing only in ε1 would under-charge if they shared a memo.

    Broken variant (kept): one permanent response shared by one report at ε1 = 0.05
    and one at ε1 = 0.5 (k = 256, ε∞ = 1) loses more than the two charges. The
    shipped memo key includes ε1, so the SDK (which keys memo rows by it) never
    shares the permanent response between them.
    """
    low = create("rappor-grr", Decimal("0.05"), 256, {"epsilon_permanent": "1"})
    high = create("rappor-grr", Decimal("0.5"), 256, {"epsilon_permanent": "1"})
    assert isinstance(low, RapporGRR) and isinstance(high, RapporGRR)
    shared = _mixed_grr_ratio(256, low.p_exact, [low.p_r_exact, high.p_r_exact])
    retired = low.retired_report_charge + high.retired_report_charge
    assert math.log(shared) > float(retired)  # sharing under-charged the retired rule
    # The sound charge covers it even when shared (each term is within its own ε_I).
    assert math.log(shared) <= float(low.report_charge + high.report_charge)
    assert low.memo_key != high.memo_key
    with pytest.raises(ValueError, match="other parameters"):
        high.perturb(3, memo=low.new_memo())
