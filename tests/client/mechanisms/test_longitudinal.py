"""loloha and dbitflip: exact one-report laws, the charge, the estimators, the memo.

Exact laws are computed here independently of the mechanisms' own
`exact_probability`: by summing over the permanent response, from the realized
integer thresholds (`p_exact`, `p_r_exact`, `flip_exact` on the 2^-53 grid),
in Fractions. A variant with the instantaneous threshold moved one grid step
the unsafe way must break the one-report bound (the calibration is tight).
Statistical checks use fixed seeds and Bonferroni-split z at α = 1e-6.
"""

from __future__ import annotations

import itertools
import math
import random
from decimal import Context, Decimal
from fractions import Fraction

import numpy as np
import pytest
from fedldp.aggregator.intervals import bonferroni_z
from fedldp.client.mechanisms import IndexBitsOutput, create
from fedldp.client.mechanisms.base import HashedOutput, OutputDomainError
from fedldp.client.mechanisms.dbitflip import SEED_SLOT, DBitFlip
from fedldp.client.mechanisms.loloha import Loloha
from fedldp.client.mechanisms.memo_loss import (
    InfiniteSequenceLossError,
    instantaneous_rate_grr,
    instantaneous_rate_unary,
    sequence_charge,
)
from fedldp.client.mechanisms.olh import OLH, hash_value

GRID = Fraction(1, 1 << 53)


def _exp(x: Decimal) -> tuple[Fraction, Fraction]:
    ctx = Context(prec=60)
    e = ctx.exp(x)
    return Fraction(e.next_minus(ctx)), Fraction(e.next_plus(ctx))


def loloha(eps1: str = "1", eps_inf: str = "2", k: int = 4, g: int | None = 3) -> Loloha:
    params = {"epsilon_permanent": eps_inf, **({"g": str(g)} if g else {})}
    mech = create("loloha", Decimal(eps1), k, params)
    assert isinstance(mech, Loloha)
    return mech


def dbitflip(eps1: str = "1", eps_inf: str = "2", buckets: int = 4, d: int = 2) -> DBitFlip:
    params = {"epsilon_permanent": eps_inf, "buckets": str(buckets), "d": str(d)}
    mech = create("dbitflip", Decimal(eps1), (Decimal(0), Decimal(8)), params)
    assert isinstance(mech, DBitFlip)
    return mech


# --- loloha: one report ---


def _loloha_law(mech: Loloha, p_r: Fraction) -> list[list[Fraction]]:
    """P[(s, y) | v] for every v and output, summing over the permanent hash value z."""
    g, p, q = mech.g, mech.p_exact, mech.q_exact
    q_r = (1 - p_r) / (g - 1)
    laws = []
    for v in range(mech.k):
        row = []
        for s in range(mech.seed_space):
            h = hash_value(s, v, g, mech.base.m)
            for y in range(g):
                total = sum(
                    ((p if z == h else q) * (p_r if y == z else q_r) for z in range(g)),
                    Fraction(0),
                )
                row.append(total / mech.seed_space)
        laws.append(row)
    return laws


def _max_ratio(laws: list[list[Fraction]]) -> Fraction:
    return Fraction(max(max(col) / min(col) for col in zip(*laws, strict=True)))


@pytest.mark.parametrize(("eps1", "eps_inf", "k", "g"), [("1", "2", 4, 3), ("0.5", "4", 5, 2)])
def test_loloha_one_report_law_is_exact_and_within_epsilon(
    eps1: str, eps_inf: str, k: int, g: int
) -> None:
    mech = loloha(eps1, eps_inf, k, g)
    laws = _loloha_law(mech, mech.p_r_exact)
    outputs = list(mech.outputs())
    for v, law in enumerate(laws):
        assert sum(law, Fraction(0)) == 1
        assert law == [mech.exact_probability(v, o) for o in outputs]
    low, _ = _exp(Decimal(eps1))
    assert _max_ratio(laws) <= low
    # One report is OLH's law at (ε1, g) up to the grid: p1 within 2^-50 of OLH's p.
    assert abs(mech.p1_exact - OLH(Decimal(eps1), k, g).p_exact) < 8 * GRID


def test_loloha_keep_rounded_the_wrong_way_breaks_the_bound() -> None:
    """The broken variant: p_r one grid step up leaks more than ε1 in one report."""
    mech = loloha("1", "2", 4, 3)
    _, high = _exp(Decimal(1))
    assert _max_ratio(_loloha_law(mech, mech.p_r_exact + GRID)) > high


def test_loloha_charge_is_the_instantaneous_grr_over_g() -> None:
    mech = loloha("1", "2", 8, 3)
    assert mech.report_charge == sequence_charge(
        instantaneous_rate_grr(3, mech.p_r_exact), Decimal(1)
    )
    assert mech.report_charge == Decimal("1.493812")
    assert mech.lifetime_epsilon(10) == 10 * mech.report_charge
    # Far below rappor-grr's on the same k: its instantaneous step acts on k values.
    assert (
        mech.report_charge
        < create("rappor-grr", Decimal(1), 8, {"epsilon_permanent": "2"}).report_charge
    )


def test_loloha_default_g_is_olh_s_and_params_are_validated() -> None:
    assert loloha("1", "2", 8, None).g == OLH(Decimal(1), 8).g == 3
    with pytest.raises(ValueError, match="prime"):
        loloha(g=4)
    with pytest.raises(ValueError, match="epsilon_permanent"):
        create("loloha", Decimal(1), 4, {})
    with pytest.raises(InfiniteSequenceLossError):
        create("loloha", Decimal(2), 4, {"epsilon_permanent": "2"})


def test_loloha_memo_keeps_one_seed_and_one_response_per_hash_value() -> None:
    mech = loloha("1", "2", 16, 3)
    memo = mech.new_memo()
    rng = random.Random(5)
    outputs = [mech.perturb(v, rng=rng, memo=memo) for v in list(range(16)) * 3]
    assert len({o.seed for o in outputs}) == 1
    assert set(memo.responses) <= {-1, 0, 1, 2}
    assert mech.memo_slots(0, mech.new_memo()) == (-1,)
    h = hash_value(outputs[0].seed, 7, 3, mech.base.m)
    assert mech.memo_slots(7, memo) == (-1, h)
    for o in outputs:
        mech.check_output(o)
    with pytest.raises(ValueError, match="other parameters"):
        mech.perturb(0, rng=rng, memo=loloha("1", "2", 16, 2).new_memo())
    with pytest.raises(OutputDomainError):
        mech.check_output(HashedOutput(mech.seed_space, 0))


def test_loloha_estimates_cover_the_truth() -> None:
    """Batch path, fixed seed; |f̂ - f| <= z σ with z Bonferroni over k at α = 1e-6."""
    mech = loloha("1", "2", 6, None)
    rng = np.random.default_rng(11)
    truth = np.array([0.4, 0.3, 0.2, 0.1, 0.0, 0.0])
    values = rng.choice(6, size=60_000, p=truth)
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
    est = mech.estimate(stat)
    exact = mech.variance(60_000, truth)
    z = bonferroni_z(1e-6, 6)
    assert np.all(np.abs(est.values - truth) <= z * np.sqrt(exact))
    np.testing.assert_allclose(est.variances, mech.variance(60_000, np.clip(est.values, 0, 1)))


def test_loloha_device_path_matches_the_exact_law() -> None:
    """Fresh memos on the device path (seeded) against the exact law: chi-square, α = 1e-6."""
    from fedldp.aggregator.audit_ldp.stats import chi_square_p_value

    mech = loloha("1", "2", 4, 3)
    rng = random.Random(3)
    outputs = list(mech.outputs())
    position = {o: i for i, o in enumerate(outputs)}
    counts = np.zeros(len(outputs), dtype=np.int64)
    for _ in range(20_000):
        counts[position[mech.perturb(2, rng=rng, memo=mech.new_memo())]] += 1
    probabilities = np.array([float(mech.exact_probability(2, o)) for o in outputs])
    assert chi_square_p_value(counts, probabilities) > 1e-6


# --- dbitflip: one report ---


def _dbitflip_law(mech: DBitFlip, flip: Fraction) -> list[list[Fraction]]:
    """P[(J, y) | bucket u], summing over the permanent d-bit response b'."""
    d, p, q = mech.d, mech.p_inf_exact, mech.q_inf_exact
    subsets = math.comb(mech.k, d)

    def bit_law(y: int, b: int, keep: Fraction) -> Fraction:
        return keep if y == b else 1 - keep

    laws = []
    for u in range(mech.k):
        row = []
        for indices in itertools.combinations(range(mech.k), d):
            vector = [1 if j == u else 0 for j in indices]
            for y in range(1 << d):
                total = Fraction(0)
                for perm in itertools.product((0, 1), repeat=d):
                    w = Fraction(1)
                    for t in range(d):
                        w *= bit_law(perm[t], vector[t], p) * bit_law(
                            (y >> t) & 1, perm[t], 1 - flip
                        )
                    total += w
                row.append(total / subsets)
        laws.append(row)
    assert q == 1 - p
    return laws


@pytest.mark.parametrize(
    ("eps1", "eps_inf", "buckets", "d"), [("1", "2", 4, 2), ("0.5", "3", 3, 1), ("1", "2", 3, 3)]
)
def test_dbitflip_one_report_law_is_exact_and_within_epsilon(
    eps1: str, eps_inf: str, buckets: int, d: int
) -> None:
    mech = dbitflip(eps1, eps_inf, buckets, d)
    laws = _dbitflip_law(mech, mech.flip_exact)
    outputs = list(mech.outputs())
    for u, law in enumerate(laws):
        assert sum(law, Fraction(0)) == 1
        assert law == [mech.exact_probability(u, o) for o in outputs]
    low, _ = _exp(Decimal(eps1))
    assert _max_ratio(laws) <= low


def test_dbitflip_flip_rounded_the_wrong_way_breaks_the_bound() -> None:
    mech = dbitflip("1", "2", 4, 2)
    _, high = _exp(Decimal(1))
    assert _max_ratio(_dbitflip_law(mech, mech.flip_exact - GRID)) > high


def test_dbitflip_buckets_are_exact_and_clipped() -> None:
    mech = dbitflip(buckets=4)  # [0, 8): edges 0, 2, 4, 6, 8
    assert [mech.bucket(x) for x in (-1.0, 0.0, 1.999999, 2.0, 5.5, 8.0, 99.0)] == [
        0,
        0,
        0,
        1,
        2,
        3,
        3,
    ]
    assert mech.midpoints == [1.0, 3.0, 5.0, 7.0]
    odd = create(
        "dbitflip",
        Decimal(1),
        (Decimal("0.1"), Decimal("0.4")),
        {"epsilon_permanent": "2", "buckets": "3"},
    )
    assert isinstance(odd, DBitFlip)
    # Edges 0.1, 0.2, 0.3, 0.4 exactly: the double 0.2 lies just above the edge 0.2.
    assert odd.bucket(0.2) == 1 and odd.bucket(Decimal("0.2")) == 1
    assert odd.bucket(Decimal("0.1999999999999999999")) == 0


def test_dbitflip_charge_and_parameters() -> None:
    mech = dbitflip("1", "2", 8, 3)
    assert mech.report_charge == sequence_charge(
        instantaneous_rate_unary(3, mech.flip_exact), Decimal(1)
    )
    for bad in ({"buckets": "1"}, {"buckets": "4", "d": "5"}, {"buckets": "4", "d": "0"}):
        with pytest.raises(ValueError):
            create(
                "dbitflip", Decimal(1), (Decimal(0), Decimal(1)), {"epsilon_permanent": "2", **bad}
            )
    with pytest.raises(ValueError, match="buckets"):
        create("dbitflip", Decimal(1), (Decimal(0), Decimal(1)), {"epsilon_permanent": "2"})
    with pytest.raises(InfiniteSequenceLossError):
        create(
            "dbitflip",
            Decimal(2),
            (Decimal(0), Decimal(1)),
            {"epsilon_permanent": "2", "buckets": "4"},
        )


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        (IndexBitsOutput((0,), b"\x00"), "WRONG_LENGTH"),
        (IndexBitsOutput((1, 1), b"\x00"), "OUT_OF_DOMAIN"),
        (IndexBitsOutput((2, 1), b"\x00"), "OUT_OF_DOMAIN"),
        (IndexBitsOutput((0, 4), b"\x00"), "OUT_OF_DOMAIN"),
        (IndexBitsOutput((0, 1), b"\x04"), "OUT_OF_DOMAIN"),
        (IndexBitsOutput((0, 1), b"\x00\x00"), "WRONG_LENGTH"),
        (HashedOutput(0, 0), "WRONG_PAYLOAD_TYPE"),
    ],
)
def test_dbitflip_refuses_outputs_outside_its_domain(output: object, reason: str) -> None:
    with pytest.raises(OutputDomainError) as info:
        dbitflip(buckets=4, d=2).check_output(output)  # type: ignore[arg-type]
    assert info.value.reason == reason


def test_dbitflip_memo_keeps_indices_and_at_most_d_plus_one_responses() -> None:
    mech = dbitflip(buckets=8, d=3)
    memo = mech.new_memo()
    rng = random.Random(2)
    outputs = [mech.perturb(x + 0.5, rng=rng, memo=memo) for x in range(8)] * 2
    assert len({o.indices for o in outputs}) == 1
    assert set(memo.responses) <= {SEED_SLOT, 0, 1, 2, 3}
    assert mech.memo_slots(1.0, mech.new_memo()) == (SEED_SLOT,)


def test_dbitflip_mean_variance_is_exact() -> None:
    """Var[Z | u] of the formula against the exact one-report law (enumeration)."""
    mech = dbitflip("1", "2", 4, 2)
    gap = (mech.d / mech.k) * float(mech.p1_exact - mech.q1_exact)
    outputs = list(mech.outputs())
    for u in range(mech.k):
        first = second = 0.0
        for o in outputs:
            assert isinstance(o, IndexBitsOutput)
            bits = o.bits[0]
            z = sum(mech.midpoints[j] for p, j in enumerate(o.indices) if (bits >> p) & 1)
            prob = float(mech.exact_probability(u, o))
            first += prob * z
            second += prob * z * z
        onehot = [1.0 if v == u else 0.0 for v in range(mech.k)]
        expected = (second - first * first) / (gap * gap)
        assert mech.mean_variance(1, onehot) == pytest.approx(expected, rel=1e-12)


def test_dbitflip_estimates_cover_the_truth() -> None:
    mech = dbitflip("1", "2", 8, 2)
    rng = np.random.default_rng(4)
    truth = np.array([0.3, 0.2, 0.2, 0.1, 0.1, 0.1, 0.0, 0.0])
    buckets = rng.choice(8, size=80_000, p=truth)
    values = buckets * 1.0 + 0.5  # [0, 8) in 8 buckets of width 1
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
    hist = mech.bucket_estimate(stat)
    z = bonferroni_z(1e-6, 9)
    assert np.all(np.abs(hist.values - truth) <= z * np.sqrt(mech.variance(80_000, truth)))
    mean = mech.estimate(stat)
    true_mean = float(np.dot(truth, mech.midpoints))
    assert abs(mean.values[0] - true_mean) <= z * math.sqrt(mech.mean_variance(80_000, truth))


def test_batch_and_device_paths_count_alike() -> None:
    mech = dbitflip("1", "2", 4, 2)
    rng = random.Random(9)
    stat = mech.new_statistic()
    outs = [mech.perturb(1.0, rng=rng, memo=mech.new_memo()) for _ in range(50)]
    for o in outs:
        mech.accumulate(stat, o)
    other = mech.new_statistic()
    indices = np.array([o.indices for o in outs])
    packed = np.frombuffer(b"".join(o.bits for o in outs), dtype=np.uint8).reshape(50, 1)
    mech.accumulate_batch(other, (indices, packed))
    assert stat == other
