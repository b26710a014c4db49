"""Registry, validation, auto, the device path without numpy, OLH's hash, memoization."""

from __future__ import annotations

import math
import random
import subprocess
import sys
import textwrap
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import (
    MemoState,
    RetiredMechanismError,
    UnknownMechanismError,
    choose_frequency_oracle,
    create,
    register,
    registered_ids,
    resolve,
)
from fedldp.client.mechanisms._common import (
    PROB_BITS,
    RESOLVE_WORDS,
    DyadicProbability,
    bernoulli_bits,
    bernoulli_words,
    dyadic_from_exp,
    exp_bounds,
    half,
    words_to_bytes,
)
from fedldp.client.mechanisms.auto import AUTO_CANDIDATES, f0_variance
from fedldp.client.mechanisms.base import BitVectorOutput, CategoryOutput, HashedOutput
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.mechanisms.hadamard import fwht
from fedldp.client.mechanisms.memo import RapporGRR, RapporOUE
from fedldp.client.mechanisms.memo_loss import InfiniteSequenceLossError
from fedldp.client.mechanisms.numeric import Hybrid, NumericMechanism, Piecewise
from fedldp.client.mechanisms.olh import OLH, default_g, hash_value
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.subset import SubsetSelection
from mech_cases import (  # type: ignore[import-not-found]
    ALL_CASES,
    HI,
    LO,
    LONGITUDINAL_CASES,
    MULTI_CASES,
    OPEN_CASES,
)

# --- registry -------------------------------------------------------------------------


def test_unknown_id_raises_with_the_known_ids() -> None:
    with pytest.raises(UnknownMechanismError, match="known: cms, dbitflip, duchi, grr"):
        create("nope", Decimal(1), 4)
    with pytest.raises(UnknownMechanismError, match="resolve"):
        create("auto", Decimal(1), 4)


def test_duplicate_registration_raises_and_changes_nothing() -> None:
    before = registered_ids()
    with pytest.raises(ValueError, match="already registered"):
        register("grr", lambda e, m, p: GRR(e, 2))
    assert registered_ids() == before
    assert isinstance(create("grr", Decimal(1), 3), GRR)


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [Decimal("NaN"), Decimal("Infinity"), Decimal(0), Decimal(-1)])
@pytest.mark.parametrize("wire_id", registered_ids())
def test_bad_epsilon_raises(wire_id: str, epsilon: Decimal) -> None:
    case = next(
        c for c in ALL_CASES + LONGITUDINAL_CASES + MULTI_CASES + OPEN_CASES if c.wire_id == wire_id
    )
    with pytest.raises(ValueError, match="epsilon"):
        create(wire_id, epsilon, case.metric, dict(case.params))


@pytest.mark.parametrize("wire_id", registered_ids())
def test_float_epsilon_and_wrong_metric_kind_raise(wire_id: str) -> None:
    case = next(
        c for c in ALL_CASES + LONGITUDINAL_CASES + MULTI_CASES + OPEN_CASES if c.wire_id == wire_id
    )
    with pytest.raises(TypeError, match="Decimal"):
        create(wire_id, 1.0, case.metric, dict(case.params))  # type: ignore[arg-type]
    other = 4 if isinstance(case.metric, tuple) else (LO, HI)
    with pytest.raises(ValueError, match="metric"):
        create(wire_id, Decimal(1), other, dict(case.params))
    with pytest.raises(ValueError, match="parameter"):
        create(wire_id, Decimal(1), case.metric, {**dict(case.params), "bogus": "1"})


@pytest.mark.parametrize("wire_id", [c.wire_id for c in ALL_CASES if isinstance(c.metric, int)])
def test_categorical_validation(wire_id: str) -> None:
    case = next(c for c in ALL_CASES if c.wire_id == wire_id)
    for k in (1, 0, -3, True, 2.5):
        with pytest.raises(ValueError, match="domain size"):
            create(wire_id, Decimal(1), k, dict(case.params))  # type: ignore[arg-type]
    mech = case.build()
    kwargs: dict[str, Any] = {"memo": mech.new_memo()} if hasattr(mech, "new_memo") else {}
    for value in (-1, mech.k, 987654321, True, 1.0, "1"):
        with pytest.raises(ValueError, match="index") as info:
            mech.perturb(value, **kwargs)
        # The message is a fixed template: a raw value never appears in it.
        assert str(info.value) == f"value must be an integer index in [0, {mech.k})"
    with pytest.raises(ValueError):
        mech.perturb_batch(np.array([0, mech.k]), np.random.default_rng(0))


@pytest.mark.parametrize("wire_id", ["duchi", "piecewise", "hybrid", "sw"])
def test_numeric_validation_and_clipping(wire_id: str) -> None:
    for lo, hi in (
        (Decimal(1), Decimal(1)),
        (Decimal(2), Decimal(1)),
        (Decimal("NaN"), Decimal(1)),
    ):
        with pytest.raises(ValueError):
            create(wire_id, Decimal(1), (lo, hi))
    mech = create(wire_id, Decimal(1), (LO, HI))
    assert isinstance(mech, NumericMechanism)
    rng = random.Random(0)
    not_finite: tuple[Any, ...] = (math.nan, math.inf, Decimal("NaN"))  # any real type
    for value in not_finite:
        with pytest.raises(ValueError, match="finite"):
            mech.perturb(value, rng=rng)
    with pytest.raises(ValueError, match="finite"):
        mech.perturb_batch(np.array([0.0, math.nan]), np.random.default_rng(0))
    assert mech.clip(Decimal("-2.5")) == (float(LO), True)
    assert mech.clip(7) == (float(HI), True)
    assert mech.clip(Decimal("1.5")) == (1.5, False)
    _, clipped = mech.perturb_with_clip(100.0, rng=rng)
    assert clipped
    _, clipped = mech.perturb_with_clip(0.0, rng=rng)
    assert not clipped


def test_mechanism_specific_params() -> None:
    olh = create("olh", Decimal(1), 10, {"g": "7"})
    assert isinstance(olh, OLH) and olh.g == 7
    for bad in ("4", "1", "x", "-3", "7.0"):
        with pytest.raises(ValueError, match="g"):
            create("olh", Decimal(1), 10, {"g": bad})
    subset = create("ss", Decimal(1), 10, {"d": "3"})
    assert isinstance(subset, SubsetSelection) and subset.d == 3
    for bad in ("0", "10", "a"):
        with pytest.raises(ValueError, match="d"):
            create("ss", Decimal(1), 10, {"d": bad})
    with pytest.raises(ValueError, match="epsilon_permanent"):
        create("rappor-oue", Decimal(1), 10, {})
    with pytest.raises(ValueError, match="must not exceed"):
        create("rappor-oue", Decimal(2), 10, {"epsilon_permanent": "1"})
    with pytest.raises(ValueError, match="plain decimal"):
        create("rappor-grr", Decimal(1), 10, {"epsilon_permanent": "1e1"})


# --- auto -----------------------------------------------------------------------------


GRID_K = [2, 3, 4, 8, 16, 64, 256, 1024, 4096]
GRID_EPS = ["0.1", "0.5", "1", "2", "4", "6", "8"]


@pytest.mark.parametrize("k", GRID_K)
def test_auto_picks_the_least_variance(k: int) -> None:
    for text in GRID_EPS:
        eps = Decimal(text)
        chosen = choose_frequency_oracle(k, eps)
        variances = {}
        for wire_id in AUTO_CANDIDATES:
            mech = create(wire_id, eps, k)
            assert isinstance(mech, FrequencyOracle)
            # Cross-check with the exact variance at f = 0, n = 1.
            variances[wire_id] = float(mech.variance(1, 0.0))
            assert f0_variance(mech) == pytest.approx(variances[wire_id], rel=1e-12)
        assert variances[chosen] <= min(variances.values()) * (1 + 1e-12)
        assert resolve("auto", eps, k) == chosen


def _oracle(wire_id: str, epsilon: Decimal, k: int) -> FrequencyOracle:
    mechanism = create(wire_id, epsilon, k)
    assert isinstance(mechanism, FrequencyOracle)
    return mechanism


def test_variance_formulas_match_the_papers() -> None:
    for k in (4, 100):
        for eps in (0.5, 1.0, 3.0):
            e = math.exp(eps)
            d = Decimal(str(eps))
            # Wang et al. 2017 eqs. (4), (6); Acharya et al. 2019.
            assert f0_variance(_oracle("grr", d, k)) == pytest.approx((e + k - 2) / (e - 1) ** 2)
            assert f0_variance(_oracle("oue", d, k)) == pytest.approx(4 * e / (e - 1) ** 2)
            h = math.exp(eps / 2)
            assert f0_variance(_oracle("sue", d, k)) == pytest.approx(h / (h - 1) ** 2)
            assert f0_variance(_oracle("hr", d, k)) == pytest.approx((e + 1) ** 2 / (e - 1) ** 2)
            g = default_g(d)
            assert f0_variance(_oracle("olh", d, k)) == pytest.approx(
                (e - 1 + g) ** 2 / ((e - 1) ** 2 * (g - 1))  # Wang et al. eq. (10)
            )


def test_auto_golden_choices() -> None:
    assert choose_frequency_oracle(2, Decimal(1)) == "grr"
    assert choose_frequency_oracle(4096, Decimal(8)) == "grr"
    assert choose_frequency_oracle(4096, Decimal(1)) == "ss"
    with pytest.raises(ValueError, match="categorical"):
        resolve("auto", Decimal(1), (LO, HI))
    assert resolve("piecewise", Decimal(1), (LO, HI)) == "piecewise"


# --- device path without numpy ----------------------------------------------------------


def test_every_mechanism_perturbs_without_numpy() -> None:
    cases = [
        (c.wire_id, str(c.epsilon), c.metric if isinstance(c.metric, int) else None, dict(c.params))
        for c in ALL_CASES
    ]
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["numpy"] = None  # any import of numpy raises ImportError
        from decimal import Decimal
        import fedldp.client.mechanisms as m
        for wire_id, eps, k, params in {cases!r}:
            metric = k if k is not None else (Decimal("-2"), Decimal("6"))
            mech = m.create(wire_id, Decimal(eps), metric, params)
            value = 1 if k is not None else 2.5
            kwargs = {{"memo": mech.new_memo()}} if hasattr(mech, "new_memo") else {{}}
            for _ in range(3):
                out = mech.perturb(value, **kwargs)  # OS CSPRNG
                mech.check_output(out)
                stat = mech.new_statistic()
                mech.accumulate(stat, out)
        big = m.create("olh", Decimal(1), 4096)
        big.check_output(big.perturb(4095))
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


# --- OLH hash: the cross-language contract ---------------------------------------------


def reference_hash(seed: int, value: int, g: int, k: int) -> int:
    """The docstring's specification, written independently."""
    m = 1
    while g**m < k:
        m += 1
    s = [(seed // g**j) % g for j in range(m + 1)]
    v = [(value // g**j) % g for j in range(m)]
    return int((s[m] + sum(s[j] * v[j] for j in range(m))) % g)


def test_olh_hash_golden_values() -> None:
    # Fixed vectors for implementers in other languages: (seed, value, g, m) -> h.
    assert hash_value(0, 0, 3, 2) == 0
    assert hash_value(26, 8, 3, 2) == 1  # s = (2,2,2), v = (2,2): 2 + 4 + 4 = 10 = 1 mod 3
    assert hash_value(123456, 4095, 53, 3) == 25
    assert hash_value(7890123, 1234, 53, 3) == 33
    assert hash_value(2**62 + 12345, 99999, 5, 27) == 3
    rng = random.Random(5)
    for k, eps in ((10, "1"), (4096, "4"), (4096, "0.5"), (1000, "2")):
        mech = OLH(Decimal(eps), k)
        for _ in range(200):
            seed, value = rng.randrange(mech.seed_space), rng.randrange(k)
            assert mech.hash(seed, value) == reference_hash(seed, value, mech.g, k)


@pytest.mark.parametrize("k,g", [(2, 2), (5, 3), (37, 3), (100, 7), (300, 53), (1000, 11)])
def test_olh_family_is_exactly_pairwise_uniform(k: int, g: int) -> None:
    mech = OLH(Decimal(2), k, g)
    if mech.seed_space > 200_000:
        pytest.skip("seed space too large to enumerate")
    seeds = np.arange(mech.seed_space, dtype=np.int64)
    for a, b in ((0, 1), (0, k - 1), (k // 2, k - 1)):
        if a == b:
            continue
        ha = mech._hash_batch(seeds, np.full_like(seeds, a))
        hb = mech._hash_batch(seeds, np.full_like(seeds, b))
        joint = np.bincount(ha * g + hb, minlength=g * g)
        assert np.all(joint == mech.seed_space // (g * g))


@pytest.mark.parametrize("eps,k", [("0.5", 37), ("1", 100), ("4", 500), ("2", 64), ("1", 2)])
def test_olh_fft_direct_and_single_support_counts_agree(eps: str, k: int) -> None:
    mech = OLH(Decimal(eps), k)
    rng = np.random.default_rng(1)
    values = rng.integers(0, k, 1500)
    seeds, ys = mech.perturb_batch(values, rng)
    fft = mech._support_fft(seeds, ys)
    direct = mech._support_direct(seeds, ys)
    assert np.array_equal(fft, direct)
    single = mech.new_statistic()
    for s, y in zip(seeds[:200], ys[:200], strict=True):
        mech.accumulate(single, HashedOutput(int(s), int(y)))
    assert single.counts == list(mech._support_direct(seeds[:200], ys[:200]))


# --- memoization ----------------------------------------------------------------------


def test_memo_reuses_the_permanent_response_and_round_trips() -> None:
    mech = RapporOUE(Decimal(1), 16, Decimal(4))
    memo = mech.new_memo()
    rng = random.Random(3)
    mech.perturb(5, rng=rng, memo=memo)
    permanent = memo.responses[5]
    for _ in range(50):
        mech.perturb(5, rng=rng, memo=memo)
    assert memo.responses == {5: permanent}
    restored = MemoState.from_json(memo.to_json())
    assert restored == memo
    mech.perturb(7, rng=rng, memo=restored)
    assert set(restored.responses) == {5, 7}
    with pytest.raises(ValueError, match="memo"):
        mech.perturb(5, rng=rng)
    other = RapporOUE(Decimal(1), 16, Decimal(3))
    with pytest.raises(ValueError, match="other parameters"):
        other.perturb(5, rng=rng, memo=memo)
    with pytest.raises(ValueError, match="MemoState"):
        MemoState.from_json("{}")


def test_memo_reports_are_the_instantaneous_law_given_the_permanent() -> None:
    # Given the permanent response, each report flips every bit with probability `flip`.
    mech = RapporOUE(Decimal(1), 8, Decimal(3))
    memo = mech.new_memo()
    rng = random.Random(9)
    n = 4000
    reports = [int.from_bytes(mech.perturb(2, rng=rng, memo=memo).bits, "little") for _ in range(n)]
    permanent = int.from_bytes(memo.responses[2], "little")
    flips = sum(bin(r ^ permanent).count("1") for r in reports)
    expected = n * 8 * mech.flip
    assert abs(flips - expected) < 5.0 * math.sqrt(expected)  # z = 5: rate < 1e-6


def test_memo_grr_and_lifetime_bound() -> None:
    mech = RapporGRR(Decimal(1), 6, Decimal(3))
    assert mech.epsilon_instantaneous > 1.0  # the instantaneous layer is weaker than ε1 alone
    memo = mech.new_memo()
    out = mech.perturb(4, rng=random.Random(1), memo=memo)
    assert isinstance(out, CategoryOutput)
    assert len(memo.responses[4]) == 4
    # The proven bound is value-blind: T reports cost T · max(ε1, ε_I) however they
    # group into values; ten reports of one unchanged value lose at most ε∞.
    charge = mech.report_charge
    assert charge > Decimal(1)
    assert mech.lifetime_epsilon([1, 1]) == mech.lifetime_epsilon(2) == 2 * charge
    assert mech.lifetime_epsilon([10]) == 10 * charge
    assert Decimal(2) < mech.value_loss(10) <= Decimal(3) + Decimal("0.000001")
    # ε1 = ε∞: the report repeats the permanent response, so a change of value is
    # revealed with certainty: no finite charge covers it, and it is refused.
    with pytest.raises(InfiniteSequenceLossError, match="unbounded loss"):
        RapporGRR(Decimal(2), 6, Decimal(2))


# --- samplers and transforms -------------------------------------------------------------


@pytest.mark.parametrize("prob", [0.0, 0.018, 0.2689, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("resolve_words", [RESOLVE_WORDS, 0], ids=["resolve", "compact"])
def test_packed_bernoulli_samplers(
    prob: float, resolve_words: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedldp.client.mechanisms import _common

    monkeypatch.setattr(_common, "RESOLVE_WORDS", resolve_words)
    dyadic = DyadicProbability.at_least(Fraction(prob))
    rows, length = 400, 131
    words = bernoulli_words(dyadic, rows, length, np.random.default_rng(2))
    packed = words_to_bytes(words, length)
    assert packed.shape == (rows, 17)
    bits = np.unpackbits(packed, axis=1, bitorder="little")
    assert not bits[:, length:].any()  # padding zero
    total = rows * length
    ones = int(bits.sum())
    sd = math.sqrt(total * prob * (1 - prob))
    # z = 5.3 for each of the two checks: false-failure rate < 1e-6 together.
    assert abs(ones - total * prob) <= 5.3 * sd + 1e-9
    single = [bernoulli_bits(dyadic, length, random.Random(i)) for i in range(rows)]
    assert all(b >> length == 0 for b in single)
    ones = sum(bin(b).count("1") for b in single)
    assert abs(ones - total * prob) <= 5.3 * sd + 1e-9


class LevelWords(random.Random):
    """getrandbits(64) returns, level by level, digit 52, 51, ... of every W_i (bit i)."""

    def __init__(self, w: list[int]) -> None:
        self.w, self.level = w, 0
        super().__init__(0)

    def word(self) -> int:
        digit = PROB_BITS - 1 - self.level
        self.level += 1
        return sum(((wi >> digit) & 1) << i for i, wi in enumerate(self.w))

    def getrandbits(self, n: int) -> int:
        assert n == len(self.w)
        return self.word()


class LevelGenerator:
    """Duck-typed numpy Generator for `bernoulli_words` on one 64-bit word of W's.

    Full-range uint64 draws are the next digit level; a draw below 2**r is, for
    each still undecided position in order, the last r digits of its W_i.
    """

    def __init__(self, w: list[int], numerator: int) -> None:
        self.levels = LevelWords(w)
        self.w, self.complement = w, 2**PROB_BITS - 1 - numerator

    def integers(self, low: int, high: Any, size: int, dtype: Any, endpoint: bool = False) -> Any:
        if endpoint:
            assert int(high) == 2**64 - 1 and size <= 1
            return np.array([self.levels.word()][:size], dtype=np.uint64)
        rest_bits = int(high).bit_length() - 1
        assert rest_bits == PROB_BITS - self.levels.level
        undecided = [wi for wi in self.w if wi >> rest_bits == self.complement >> rest_bits]
        assert size == len(undecided)
        return np.array([wi % 2**rest_bits for wi in undecided], dtype=np.uint64)


def boundary_ws(numerator: int, rng: random.Random) -> list[int]:
    """64 W's: at the threshold 2^53 - numerator, sharing long prefixes with it, and random."""
    edge = 2**PROB_BITS - numerator
    near = [edge - 1, edge, edge + 1, 0, 2**PROB_BITS - 1]
    for shared in (8, 9, 14, 20, 30, 52):
        low = rng.getrandbits(PROB_BITS - shared)
        near.append(((edge - 1) >> (PROB_BITS - shared) << (PROB_BITS - shared)) | low)
    near = [w for w in near if 0 <= w < 2**PROB_BITS]
    return (near + [rng.getrandbits(PROB_BITS) for _ in range(64)])[:64]


@pytest.mark.parametrize(
    "numerator",
    [
        DyadicProbability.at_least(
            Fraction(1) / (Fraction(2718281828459045, 10**15) + 1)
        ).numerator,
        2**52 + 1,
        3 << 40,
        1,
        2**53 - 1,
        0x1A2B3C4D5E6F7,
    ],
)
@pytest.mark.parametrize("resolve_words", [RESOLVE_WORDS, 0], ids=["resolve", "compact"])
def test_bernoulli_samplers_compare_exactly_at_the_threshold(
    numerator: int, resolve_words: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Device and batch samplers output bit i = [W_i >= 2^53 - numerator] for the same W's.

    So both realize P = numerator / 2^53 exactly, whatever the dense/compact/resolve split.
    """
    from fedldp.client.mechanisms import _common

    monkeypatch.setattr(_common, "RESOLVE_WORDS", resolve_words)
    prob = DyadicProbability(numerator)
    for seed in range(3):
        w = boundary_ws(numerator, random.Random(seed))
        expected = sum(1 << i for i, wi in enumerate(w) if wi >= 2**PROB_BITS - numerator)
        assert bernoulli_bits(prob, 64, LevelWords(w)) == expected
        words = bernoulli_words(prob, 1, 64, LevelGenerator(w, numerator))  # type: ignore[arg-type]
        assert int(words[0, 0]) == expected


def test_exact_probability_helpers() -> None:
    for text in ("0.5", "1", "2", "4", "0.123456789", "37"):
        x = Decimal(text)
        truth = Context(prec=200).exp(x)
        lo, hi = exp_bounds(x)
        assert lo < Fraction(truth) < hi and (hi - lo) / lo < Fraction(1, 10**58)
        formulas: list[tuple[Callable[[Fraction], Fraction], bool]] = [
            (lambda e: e / (e + 6), False),
            (lambda e: 1 / (e + 1), True),
        ]
        for formula, round_up in formulas:
            exact = formula(Fraction(truth)) * 2**PROB_BITS
            expected = math.ceil(exact) if round_up else math.floor(exact)
            assert dyadic_from_exp(formula, x, round_up=round_up).numerator == expected
        assert half(x) * 2 == x
    assert half(Decimal("0.123456789012345678901234567890123456789")) == Decimal(
        "0.0617283945061728394506172839450617283945"
    )
    third = Fraction(1, 3)
    assert DyadicProbability.at_most(third).numerator == 2**PROB_BITS // 3
    assert DyadicProbability.at_least(third).numerator == 2**PROB_BITS // 3 + 1
    assert DyadicProbability.at_most(Fraction(1, 4)) == DyadicProbability.at_least(Fraction(1, 4))
    assert float(DyadicProbability(2**PROB_BITS)) == 1.0
    for bad in (-1, 2**PROB_BITS + 1, True, 0.5):
        with pytest.raises(ValueError, match="numerator"):
            DyadicProbability(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("wire_id", ["grr", "oue", "sue", "olh", "hr", "ss"])
def test_epsilon_beyond_700_is_refused_clearly(wire_id: str) -> None:
    with pytest.raises(ValueError, match="at most 700"):
        create(wire_id, Decimal(1401), 8)  # sue's exponent is ε/2


def test_subset_random_keys_redraw_a_row_whose_keys_tie_at_the_boundary() -> None:
    from fedldp.client.mechanisms.subset import SubsetSelection

    mech = SubsetSelection(Decimal(1), 6, 2)  # the 2 smallest of 5 keys

    class Keys:
        def __init__(self) -> None:
            self.draws = [
                np.array([[5, 1, 5, 9, 7]], dtype=np.uint64),  # 2nd smallest ties: drawn again
                np.array([[4, 1, 5, 9, 7]], dtype=np.uint64),
            ]

        def integers(self, low: int, high: Any, size: Any, dtype: Any = None, **kw: Any) -> Any:
            if kw.get("endpoint"):
                return self.draws.pop(0)
            return np.zeros(size, dtype=np.int64)

    keys = Keys()
    chosen = mech._keys_chunk(1, np.array([False]), keys)  # type: ignore[arg-type]
    assert chosen.tolist() == [[True, True, False, False, False]] and not keys.draws


def test_bit_layout_matches_the_wire_contract() -> None:
    mech = create("oue", Decimal(1), 12)
    out = mech.perturb(3, rng=random.Random(0))
    assert isinstance(out, BitVectorOutput) and len(out.bits) == 2 and out.length == 12
    # Bit i is (bits[i // 8] >> (i % 8)) & 1; batch rows use the same layout.
    batch = mech.perturb_batch(np.array([3, 11]), np.random.default_rng(0))
    for row in batch:
        as_int = int.from_bytes(row.tobytes(), "little")
        assert [(row[i // 8] >> (i % 8)) & 1 for i in range(12)] == [
            (as_int >> i) & 1 for i in range(12)
        ]


def test_fwht_is_the_hadamard_matrix() -> None:
    size = 16
    h = np.array([[(-1) ** bin(i & j).count("1") for j in range(size)] for i in range(size)])
    x = np.random.default_rng(0).integers(0, 9, size).astype(float)
    assert np.allclose(fwht(x), h @ x)


def test_hybrid_switches_to_duchi_below_epsilon_star() -> None:
    below = Hybrid(Decimal("0.61"), LO, HI, 16, 30)
    assert below.alpha == 0.0 and len(below.table) == 2  # only ±B can be sent
    above = Hybrid(Decimal(1), LO, HI, 16, 26)
    assert above.alpha == pytest.approx(1 - math.exp(-0.5), abs=2**-32)
    assert len(above.table) == 26 + 2


def test_numeric_grid_params_are_validated() -> None:
    rng = (LO, HI)
    mech = create("piecewise", Decimal(1), rng, {})
    assert isinstance(mech, Piecewise)
    assert (mech.levels, mech.cells) == (256, 256 + round(256 * math.exp(-0.5)))
    hybrid = create("hybrid", Decimal(1), rng, {"levels": "8", "cells": "12"})
    assert isinstance(hybrid, Hybrid) and hybrid.cells == 12
    piecewise = create("piecewise", Decimal(2), rng, {"levels": "100"})
    assert isinstance(piecewise, Piecewise) and piecewise.cells == 100 + 37
    bad = [
        {"levels": "1"},
        {"levels": "4097"},
        {"levels": "8", "cells": "8"},
        {"levels": "8", "cells": "17"},
        {"levels": "-8"},
        {"levels": "1e3"},
        {"levels": "8.0"},
        {"levels": "٣"},
        {"cells": "9999999"},
        {"band": "3"},
    ]
    for params in bad:
        for wire_id in ("piecewise", "hybrid"):
            with pytest.raises(ValueError, match=r"levels|cells|band"):
                create(wire_id, Decimal(1), rng, params)
    with pytest.raises(ValueError, match="no parameters"):
        create("duchi", Decimal(1), rng, {"levels": "8"})
    with pytest.raises(ValueError, match="too small"):
        create("duchi", Decimal("1e-12"), rng, {})


def test_laplace_is_retired_and_its_id_reserved() -> None:
    with pytest.raises(RetiredMechanismError, match=r"retired.*hybrid") as info:
        create("laplace", Decimal(1), (LO, HI), {})
    assert isinstance(info.value, UnknownMechanismError)
    assert "laplace" not in registered_ids()
    with pytest.raises(ValueError, match="reserved"):
        register("laplace", lambda *_: create("duchi", Decimal(1), (LO, HI), {}))


@pytest.mark.parametrize("eps", ["0.5", "2", "4"])
def test_olh_batch_reports_use_the_contract_hash(eps: str) -> None:
    mech = OLH(Decimal(eps), 4096)
    rng = np.random.default_rng(3)
    values = rng.integers(0, 4096, 5000)
    seeds, ys = mech.perturb_batch(values, rng)
    assert seeds.min() >= 0 and seeds.max() < mech.seed_space
    kept = sum(
        mech.hash(int(s), int(v)) == int(y) for s, v, y in zip(seeds, values, ys, strict=True)
    )
    sd = math.sqrt(5000 * mech.p * (1 - mech.p))
    assert abs(kept - 5000 * mech.p) < 5 * sd  # z = 5: false-failure rate < 1e-6


@pytest.mark.parametrize("length", [1, 7, 8, 131, 4096])
def test_column_counts_match_unpacked_sums(length: int) -> None:
    from fedldp.client.mechanisms._common import byte_length, column_counts

    rng = np.random.default_rng(length)
    bits = rng.random((3000, length)) < 0.3
    packed = np.packbits(bits, axis=1, bitorder="little")
    assert packed.shape[1] == byte_length(length)
    assert np.array_equal(column_counts(packed, length), bits.sum(axis=0))


def test_domain_index_refuses_duplicates_without_naming_them() -> None:
    from fedldp.client.mechanisms import domain_index

    assert domain_index(["a", "b", "c"]) == {"a": 0, "b": 1, "c": 2}
    with pytest.raises(ValueError, match="positions 0 and 2") as info:
        domain_index(["secret", "b", "secret"])
    assert "secret" not in str(info.value)
    with pytest.raises(ValueError, match="at least 2"):
        domain_index(["only"])


@pytest.mark.parametrize("floyd_max_d", [0, 10_000], ids=["random-keys", "floyd"])
def test_subset_batch_samplers_have_the_stated_marginals(
    floyd_max_d: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedldp.client.mechanisms import subset

    monkeypatch.setattr(subset, "FLOYD_MAX_D", floyd_max_d)
    mech = subset.SubsetSelection(Decimal(1), 40, 7)
    n = 20000
    values = np.full(n, 13)
    bits = np.unpackbits(
        mech.perturb_batch(values, np.random.default_rng(4)), axis=1, bitorder="little"
    )[:, :40]
    assert (bits.sum(axis=1) == 7).all()
    # z = 5.3 per count, 40 counts: total false-failure rate < 1e-6.
    for column in range(40):
        p = mech.support_p if column == 13 else mech.support_q
        sd = math.sqrt(n * p * (1 - p))
        assert abs(bits[:, column].sum() - n * p) < 5.3 * sd
