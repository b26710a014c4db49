"""One contract suite that every registered mechanism passes (STYLE.md, point 10).

Statistical checks use fixed seeds and tolerances derived from a stated
false-failure rate ALPHA = 1e-6 (chi-square quantiles, normal z), so a
correct mechanism fails with probability below 1e-6 for any seed; each check
is also shown to fail on a deliberately broken mechanism.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from decimal import Context, Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import (
    CountStatistic,
    MomentStatistic,
    OutputDomainError,
    registered_ids,
)
from fedldp.client.mechanisms._common import dyadic_from_exp
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitOutput,
    NumericOutput,
    Output,
)
from fedldp.client.mechanisms.grr import GRR
from fedldp.client.mechanisms.hadamard import HadamardResponse
from fedldp.client.mechanisms.numeric import NumericMechanism, Piecewise, Weights
from fedldp.client.mechanisms.olh import OLH
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.subset import SubsetSelection
from fedldp.client.mechanisms.unary import OUE, SUE, UnaryEncoding
from mech_cases import (  # type: ignore[import-not-found]
    ALL_CASES,
    CATEGORICAL_CASES,
    EXACT_CASES,
    EXACT_EPSILONS,
    LONGITUDINAL_CASES,
    MEMO_CASES,
    MULTI_CASES,
    NUMERIC_CASES,
    OPEN_CASES,
    Case,
    batch_to_outputs,
    exact_laws,
    exact_max_ratio,
    exp_bounds,
    float_law,
    max_log_ratio,
    numeric_max_ratio,
    perturb_one,
    total_mass,
    wire_bytes,
)

stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-6


def test_every_registered_mechanism_has_a_contract_case() -> None:
    cases = ALL_CASES + MULTI_CASES + OPEN_CASES + LONGITUDINAL_CASES
    assert {c.wire_id for c in cases} == set(registered_ids())


@pytest.mark.parametrize("case", OPEN_CASES, ids=str)
def test_open_domain_cases_build_and_report(case: Case) -> None:
    """Each open-domain case builds from policy params and its reports pass its own check."""
    mech = case.build()
    mech.check_output(mech.perturb("ab", rng=random.Random(0)))


# --- privacy: exact and tight ---------------------------------------------------------


def assert_tight(log_ratio: float, epsilon: Decimal) -> None:
    assert math.isclose(log_ratio, float(epsilon), rel_tol=1e-9, abs_tol=1e-12), (
        f"worst-case log ratio {log_ratio} != epsilon {epsilon}"
    )


@pytest.mark.parametrize("case", MEMO_CASES, ids=str)
def test_memoized_privacy_ratio_is_e_to_epsilon(case: Case) -> None:
    mech = case.build()
    for x in range(mech.k):
        assert math.isclose(sum(float_law(mech, x).values()), 1.0, rel_tol=1e-12)
    assert_tight(max_log_ratio(mech), case.epsilon)


def assert_numeric_exact_privacy(mech: NumericMechanism, epsilon: Decimal) -> None:
    """Exact: every level's law sums to 1, and the max ratio over levels and wire
    values is <= e^ε (rational comparison) and within 1e-9 of it (tight)."""
    for j in range(mech.levels + 1):
        assert sum(mech.index_weights(j)) == sum(mech.index_weights(0))
    ratio = numeric_max_ratio(mech)
    lower, _ = exp_bounds(epsilon)
    assert ratio is not None, "a wire value is possible under one input only"
    assert ratio <= lower, f"ratio {float(ratio)} exceeds e^{epsilon}"
    assert math.log(ratio) >= float(epsilon) - 1e-9, "not tight"


@pytest.mark.parametrize("case", NUMERIC_CASES, ids=str)
def test_numeric_privacy_ratio_is_exactly_e_to_epsilon(case: Case) -> None:
    assert_numeric_exact_privacy(case.build(), case.epsilon)


def wide_piecewise() -> Piecewise:
    """Broken: the band weight is e^{1.1 ε} times the other cells' weight."""
    mech = Piecewise(Decimal(1), Decimal(0), Decimal(1), 8, 12)
    mech.grid = type(mech.grid)(8, 12, Weights.for_epsilon(Decimal("1.1"), 24))
    return mech


def test_numeric_privacy_check_fails_on_broken_mechanism() -> None:
    with pytest.raises(AssertionError, match="exceeds"):
        assert_numeric_exact_privacy(wide_piecewise(), Decimal(1))


# --- privacy of the frequency oracles: exact, from the sampler's own thresholds --------

#: How far below e^ε the realized ratio may fall (thresholds are multiples of
#: 2^-53); a mechanism noisier than its ε falls further and is caught.
TIGHTNESS = Fraction(1, 2**40)


def assert_exact_epsilon(ratio: Fraction | None, epsilon: Decimal) -> None:
    """e^ε (1 - 2^-40) <= ratio <= e^ε, compared exactly (e^ε bracketed to 1e-50)."""
    assert ratio is not None, "an output is possible under one input and impossible under another"
    lo, hi = exp_bounds(epsilon)
    assert ratio <= lo, f"realized ratio exceeds e^{epsilon} by {float(ratio / hi - 1):.3g}"
    assert ratio >= hi * (1 - TIGHTNESS), f"realized ratio is below e^{epsilon}: too much noise"


@pytest.mark.parametrize("case", EXACT_CASES, ids=str)
def test_realized_privacy_ratio_is_at_most_e_to_epsilon_exactly(case: Case) -> None:
    laws = exact_laws(case.build())
    for law in laws:
        assert total_mass(law) == 1
    assert_exact_epsilon(exact_max_ratio(laws), case.epsilon)


def supports(mech: FrequencyOracle, output: Output) -> list[int]:
    """C(v) of a statistic holding `output` alone: which values it supports."""
    statistic = mech.new_statistic()
    mech.accumulate(statistic, output)
    return [int(c) for c in mech.support_counts(statistic)]


@pytest.mark.parametrize(
    "case", [c for c in EXACT_CASES if c.wire_id != "olh" or c.epsilon <= 2], ids=str
)
def test_estimator_uses_the_realized_support_probabilities(case: Case) -> None:
    """support_p, support_q (what debiases) are exactly those of the sampled law."""
    mech = case.build()
    outputs = list(mech.outputs())
    support = [supports(mech, o) for o in outputs]
    laws = [[mech.exact_probability(x, o) for o in outputs] for x in range(mech.k)]
    for v in range(mech.k):
        for x in range(mech.k):
            mass = sum((p for p, c in zip(laws[x], support, strict=True) if c[v]), Fraction(0))
            assert float(mass) == (mech.support_p if x == v else mech.support_q)


class WholeDomainGRR(GRR):
    """Broken: the false answer is uniform over all k values (ratio 1 + k p/(1-p) > e^ε)."""

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        assert rng is not None
        if self.keep.draw(rng):
            return CategoryOutput(value)
        return CategoryOutput(rng.randrange(self.k))

    def exact_probability(self, value: int, output: Output) -> Fraction:
        assert isinstance(output, CategoryOutput)
        lie = (1 - self.p_exact) / self.k
        return lie + (self.p_exact if output.index == value else 0)


class TruthWithQOUE(OUE):
    """Broken: the true bit is kept with probability q instead of p = 1/2 (no signal)."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self._set_probabilities(self.bit_q, self.bit_q)


class LeakyOUE(OUE):
    """Broken: q computed for 2ε, so the realized ratio is e^{2ε}-ish."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self._set_probabilities(self.bit_p, OUE(2 * epsilon, k).bit_q)


class RoundedUpGRR(GRR):
    """Broken: the keep threshold rounded UP (ratio above e^ε by about 2^-53 relative)."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self.keep = dyadic_from_exp(lambda e: e / (e + k - 1), epsilon, round_up=True)
        self.p_exact = self.keep.exact
        self.q_exact = (1 - self.p_exact) / (k - 1)


class RoundedDownOUE(OUE):
    """Broken: q rounded DOWN (ratio above e^ε by about 2^-53 relative)."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self._set_probabilities(
            self.bit_p, dyadic_from_exp(lambda e: 1 / (e + 1), epsilon, round_up=False)
        )


BROKEN_ORACLES: dict[str, Callable[[], FrequencyOracle]] = {
    "grr-false-answer-over-whole-domain": lambda: WholeDomainGRR(Decimal(1), 4),
    "oue-true-bit-kept-with-q": lambda: TruthWithQOUE(Decimal(1), 3),
    "oue-q-for-2-epsilon": lambda: LeakyOUE(Decimal(1), 3),
    "grr-epsilon-doubled": lambda: GRR(Decimal(2), 4),
    "olh-epsilon-doubled": lambda: OLH(Decimal(2), 3, 5),
    "hr-epsilon-halved": lambda: HadamardResponse(Decimal("0.5"), 5),
    "sue-epsilon-halved": lambda: SUE(Decimal("0.5"), 3),
    "ss-epsilon-times-1.1": lambda: SubsetSelection(Decimal("1.1"), 5, 2),
    "grr-threshold-rounded-up": lambda: RoundedUpGRR(Decimal(1), 5),
    "oue-q-rounded-down": lambda: RoundedDownOUE(Decimal(1), 3),
}


@pytest.mark.parametrize("name", BROKEN_ORACLES)
def test_exact_privacy_check_fails_on_broken_mechanisms(name: str) -> None:
    broken = BROKEN_ORACLES[name]()
    with pytest.raises(AssertionError):
        assert_exact_epsilon(exact_max_ratio(exact_laws(broken)), Decimal(1))


@pytest.mark.parametrize("name", ["grr-threshold-rounded-up", "oue-q-rounded-down"])
def test_a_threshold_rounded_the_wrong_way_is_caught_at_one_ulp(name: str) -> None:
    ratio = exact_max_ratio(exact_laws(BROKEN_ORACLES[name]()))
    assert ratio is not None
    _, hi = exp_bounds(Decimal(1))
    # Above e^ε by less than 2^-45: a float check to 1e-9 would let it through.
    assert hi < ratio < hi * (1 + Fraction(1, 2**45))
    with pytest.raises(AssertionError, match="exceeds"):
        assert_exact_epsilon(ratio, Decimal(1))


# --- the samplers compare exactly against those thresholds -----------------------------


class ScriptedRandom(random.Random):
    """A `random.Random` whose getrandbits(n) answers from a script per width n.

    randrange and sample go through getrandbits too; random() is refused, so a
    sampler that draws a float fails.
    """

    def __init__(self, script: dict[int, list[int]]) -> None:
        self.script = {width: list(values) for width, values in script.items()}
        super().__init__(0)

    def getrandbits(self, n: int) -> int:
        queue = self.script.get(n)
        assert queue, f"unscripted getrandbits({n})"
        return queue.pop(0)

    def random(self) -> float:
        raise AssertionError("the sampler drew a float")


def decimal_exp(x: Decimal) -> Decimal:
    return Context(prec=100).exp(x)


def scaled(prob: Decimal) -> Decimal:
    return Context(prec=100).multiply(prob, Decimal(2**53))


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
def test_thresholds_are_the_papers_probabilities_rounded_the_safe_way(eps: str) -> None:
    """Recomputed at 100 digits: "truth" probabilities down, the others up."""
    epsilon = Decimal(eps)
    e, h = decimal_exp(epsilon), decimal_exp(epsilon / 2)
    k = 6
    grr = GRR(epsilon, k)
    assert grr.keep.numerator == math.floor(scaled(e / (e + k - 1)))
    oue, sue = OUE(epsilon, k), SUE(epsilon, k)
    assert oue.bit_p.numerator == 2**52
    assert oue.bit_q.numerator == math.ceil(scaled(1 / (e + 1)))
    assert sue.bit_p.numerator == math.floor(scaled(h / (h + 1)))
    assert sue.bit_q.numerator == math.ceil(scaled(1 / (h + 1)))
    olh = OLH(epsilon, k)
    assert olh.keep.numerator == math.floor(scaled(e / (e + olh.g - 1)))
    hr = HadamardResponse(epsilon, k)
    assert hr.inside.numerator == math.floor(scaled(e / (e + 1)))
    ss = SubsetSelection(epsilon, k, 2)
    assert ss.include.numerator == math.floor(scaled(2 * e / (2 * e + k - 2)))
    for mech, p, q in ((grr, grr.p_exact, grr.q_exact), (oue, oue.p_exact, oue.q_exact)):
        assert (mech.p, mech.q) == (float(p), float(q))


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
def test_grr_keeps_the_truth_exactly_below_its_threshold(eps: str) -> None:
    mech = GRR(Decimal(eps), 5)
    t = mech.keep.numerator
    assert mech.perturb(2, rng=ScriptedRandom({53: [t - 1]})) == CategoryOutput(2)
    # randrange(4) reads 3 bits: slot 2 of the other values (0, 1, 3, 4) is 3.
    rng = ScriptedRandom({53: [t], 3: [2]})
    assert mech.perturb(2, rng=rng) == CategoryOutput(3)
    assert rng.script == {53: [], 3: []}


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
@pytest.mark.parametrize("cls", [OUE, SUE], ids=["oue", "sue"])
def test_unary_bits_flip_exactly_at_their_thresholds(cls: type[UnaryEncoding], eps: str) -> None:
    k, value = 5, 4
    mech = cls(Decimal(eps), k)
    q, p = mech.bit_q.numerator, mech.bit_p.numerator
    # Bit i is 1 iff W_i >= 2^53 - q, W_i's digits (MSB first) bit i of successive words.
    w = [2**53 - q - 1, 2**53 - q, 0, 2**53 - 1, 0]
    words = [sum(((w[i] >> level) & 1) << i for i in range(k)) for level in range(52, -1, -1)]
    for truth_draw, truth in ((p - 1, 1), (p, 0)):
        out = mech.perturb(value, rng=ScriptedRandom({k: words, 53: [truth_draw]}))
        bits = int.from_bytes(out.bits, "little")
        assert [(bits >> i) & 1 for i in range(k)] == [0, 1, 0, 1, truth]


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
def test_olh_keeps_the_hash_exactly_below_its_threshold(eps: str) -> None:
    mech = OLH(Decimal(eps), 5)
    t, seed = mech.keep.numerator, mech.seed_space - 2
    seed_bits, other_bits = mech.seed_space.bit_length(), (mech.g - 1).bit_length()
    assert len({seed_bits, other_bits, 53}) == 3
    hashed = mech.hash(seed, 3)
    kept = mech.perturb(3, rng=ScriptedRandom({seed_bits: [seed], 53: [t - 1]}))
    assert kept == HashedOutput(seed, hashed)
    lied = mech.perturb(3, rng=ScriptedRandom({seed_bits: [seed], 53: [t], other_bits: [0]}))
    assert lied == HashedOutput(seed, 1 if hashed == 0 else 0)


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
def test_hr_side_flips_exactly_at_its_threshold(eps: str) -> None:
    mech = HadamardResponse(Decimal(eps), 5)
    t = mech.inside.numerator
    for y in range(mech.K):  # randrange(8) reads 4 bits
        inside = mech.perturb(3, rng=ScriptedRandom({53: [t - 1], 4: [y]}))
        outside = mech.perturb(3, rng=ScriptedRandom({53: [t], 4: [y]}))
        assert mech.in_set(3, inside.index) and not mech.in_set(3, outside.index)


@pytest.mark.parametrize("eps", EXACT_EPSILONS)
def test_ss_includes_the_truth_exactly_below_its_threshold(eps: str) -> None:
    mech = SubsetSelection(Decimal(eps), 8, 3)
    t = mech.include.numerator
    for draw, included in ((t - 1, 1), (t, 0)):
        # sample(range(7), .) reads 3 bits per pick.
        out = mech.perturb(5, rng=ScriptedRandom({53: [draw], 3: [0, 0, 0]}))
        bits = int.from_bytes(out.bits, "little")
        assert bits.bit_count() == 3 and (bits >> 5) & 1 == included


@pytest.mark.parametrize(
    "bit_generator", [np.random.PCG64, np.random.MT19937, np.random.Philox, np.random.SFC64]
)
def test_numpy_random_is_an_integer_over_2_to_53(bit_generator: Any) -> None:
    """So `draw_batch`'s `random() < numerator·2^-53` is the integer comparison of `draw`."""
    u = np.random.Generator(bit_generator(7)).random(100_000)
    m = u * 2.0**53
    assert np.array_equal(m, np.floor(m)) and m.min() >= 0 and m.max() < 2**53
    if bit_generator is np.random.PCG64:  # the top 53 bits of the raw 64-bit outputs
        raw = np.random.Generator(bit_generator(7)).bit_generator.random_raw(100_000)
        assert np.array_equal(m.astype(np.uint64), raw >> np.uint64(11))
    t = GRR(Decimal(1), 5).keep
    boundary = np.array([t.numerator - 1, t.numerator], dtype=np.float64) * 2.0**-53
    assert (boundary < float(t)).tolist() == [True, False]


# --- output distributions against the stated probabilities ----------------------------


def chi_square_pvalue(counts: dict[Any, int], law: dict[Any, float], n: int) -> float:
    """Pearson chi-square p-value; cells with expectation < 5 are pooled."""
    observed, expected = [], []
    pool_o, pool_e = 0, 0.0
    for cell, prob in law.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pool_o += counts.get(cell, 0)
            pool_e += prob * n
    impossible = sum(c for cell, c in counts.items() if law.get(cell, 0.0) == 0.0)
    if impossible:
        return 0.0
    if pool_e > 0:
        observed.append(pool_o)
        expected.append(pool_e)
    o, e = np.array(observed, dtype=float), np.array(expected, dtype=float)
    statistic = float(((o - e) ** 2 / e).sum())
    return float(stats.chi2.sf(statistic, df=len(o) - 1))


def sample_counts(
    mech: FrequencyOracle, value: int, n: int, *, batch: bool, seed: int
) -> dict[Any, int]:
    counts: dict[Any, int] = {}
    if batch:
        outputs = batch_to_outputs(
            mech, mech.perturb_batch(np.full(n, value), np.random.default_rng(seed))
        )
    else:
        rng = random.Random(seed)
        outputs = [perturb_one(mech, value, rng) for _ in range(n)]
    for o in outputs:
        counts[o] = counts.get(o, 0) + 1
    return counts


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("case", CATEGORICAL_CASES, ids=str)
def test_categorical_output_law(case: Case, batch: bool) -> None:
    mech = case.build()
    n = 6000
    for value in (0, mech.k - 1):
        counts = sample_counts(mech, value, n, batch=batch, seed=7 + value)
        assert chi_square_pvalue(counts, float_law(mech, value), n) > ALPHA


class BiasedGRR(GRR):
    """Broken sampler: keeps the truth a little too often."""

    def perturb(self, value: int, *, rng: random.Random | None = None) -> CategoryOutput:
        assert rng is not None
        if rng.random() < 0.1:
            return CategoryOutput(value)
        return super().perturb(value, rng=rng)


def test_output_law_check_fails_on_broken_sampler() -> None:
    mech = BiasedGRR(Decimal(1), 5)
    counts = sample_counts(mech, 2, 6000, batch=False, seed=7)
    assert chi_square_pvalue(counts, float_law(mech, 2), 6000) < ALPHA


def numeric_index_law(mech: NumericMechanism, value: float) -> dict[int, float]:
    """Exact law of the output index for a real input (rounding mixed over levels)."""
    law: dict[int, Fraction] = {}
    for level, p in mech.level_law(value):
        weights = mech.index_weights(level)
        total = sum(weights)
        for i, w in enumerate(weights):
            if w:
                law[i] = law.get(i, Fraction(0)) + p * Fraction(w, total)
    return {i: float(q) for i, q in law.items()}


def numeric_index_counts(
    mech: NumericMechanism, value: float, n: int, *, batch: bool, seed: int
) -> dict[int, int]:
    """Counts of output indices (recovered bit-exactly from the wire doubles)."""
    if batch:
        ys = [float(y) for y in mech.perturb_batch(np.full(n, value), np.random.default_rng(seed))]
    else:
        rng = random.Random(seed)
        ys = [mech.perturb(value, rng=rng).value for _ in range(n)]
    counts: dict[int, int] = {}
    for y in ys:
        i = mech.index_of(y)
        counts[i] = counts.get(i, 0) + 1
    return counts


def numeric_inputs(case: Case) -> list[float]:
    """Both ends, and an inner value that lies between two levels (rounding mixes)."""
    lo, hi = float(case.metric[0]), float(case.metric[1])
    return [lo, lo + (hi - lo) * 0.3141592653589793, hi]


@pytest.mark.parametrize("batch", [False, True], ids=["single", "batch"])
@pytest.mark.parametrize("case", NUMERIC_CASES, ids=str)
def test_numeric_output_law(case: Case, batch: bool) -> None:
    mech = case.build()
    n = 8000
    for value in numeric_inputs(case):
        counts = numeric_index_counts(mech, value, n, batch=batch, seed=3)
        assert chi_square_pvalue(counts, numeric_index_law(mech, value), n) > ALPHA


class ShiftedBandPiecewise(Piecewise):
    """Broken sampler: the band starts one cell too far right (integer weights unchanged)."""

    def _sample_index(self, level: int, rng: random.Random) -> int:
        return min(self.grid.sample(level, rng) + 1, self.grid.cells - 1)


def test_numeric_law_check_fails_on_broken_sampler() -> None:
    mech = ShiftedBandPiecewise(Decimal(2), Decimal(0), Decimal(1), 8, 11)
    counts = numeric_index_counts(mech, 0.5, 8000, batch=False, seed=3)
    assert chi_square_pvalue(counts, numeric_index_law(mech, 0.5), 8000) < ALPHA


# --- unbiasedness and variance -----------------------------------------------------------


def population(mech: Any, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if isinstance(mech, NumericMechanism):
        return rng.uniform(float(mech.lo) - 1, float(mech.hi) + 1, size=n)  # some clipped
    weights = 1.0 / np.arange(1, mech.k + 1) ** 1.1
    return rng.choice(mech.k, size=n, p=weights / weights.sum())


def repeated_estimates(mech: Any, values: np.ndarray, reps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
        out.append(mech.estimate(statistic).values)
    return np.array(out)


def check_unbiased_and_variance(mech: Any, values: np.ndarray, reps: int, seed: int) -> None:
    """Mean within z·σ/√R of the truth, sample variance inside the chi-square band.

    Bonferroni over coordinates and over the two checks keeps the total
    false-failure rate of one call below ALPHA.
    """
    estimates = repeated_estimates(mech, values, reps, seed)
    n = values.shape[0]
    if isinstance(mech, NumericMechanism):
        clipped = np.clip(values, float(mech.lo), float(mech.hi))
        truth = np.array([clipped.mean()])
        variance = np.array([mech.variance(values)])
    else:
        truth = np.bincount(values, minlength=mech.k) / n
        variance = mech.variance(n, truth)
    tests = 2 * truth.shape[0]
    z = float(stats.norm.isf(ALPHA / (2 * tests)))
    lo_q = float(stats.chi2.ppf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    hi_q = float(stats.chi2.isf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    mean = estimates.mean(axis=0)
    assert np.all(np.abs(mean - truth) <= z * np.sqrt(variance / reps)), "biased"
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert np.all((ratio > lo_q) & (ratio < hi_q)), f"variance ratio {ratio}"


@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_unbiased_with_the_stated_variance(case: Case) -> None:
    mech = case.build()
    values = population(mech, 3000, seed=11)
    check_unbiased_and_variance(mech, values, reps=300, seed=5)


class WrongQGRR(GRR):
    """Broken estimator: debiases with q at 1.2 ε."""

    def __init__(self, epsilon: Decimal, k: int) -> None:
        super().__init__(epsilon, k)
        self.support_q = GRR(epsilon * Decimal("1.2"), k).q


def test_unbiasedness_check_fails_on_broken_estimator() -> None:
    mech = WrongQGRR(Decimal(1), 5)
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased_and_variance(mech, population(mech, 3000, 11), reps=300, seed=5)


class OptimisticPiecewise(Piecewise):
    """Broken variance: claims half the true variance."""

    def conditional_variance(self, t: Any) -> Any:
        return super().conditional_variance(t) / 2


def test_variance_check_fails_on_broken_variance() -> None:
    mech = OptimisticPiecewise(Decimal(1), Decimal(0), Decimal(1), 16, 28)
    with pytest.raises(AssertionError, match="variance ratio"):
        check_unbiased_and_variance(mech, population(mech, 3000, 11), reps=300, seed=5)


@pytest.mark.parametrize("case", CATEGORICAL_CASES, ids=str)
def test_plug_in_variance_tracks_the_exact_variance(case: Case) -> None:
    mech = case.build()
    values = population(mech, 20000, seed=2)
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(values, np.random.default_rng(1)))
    estimate = mech.estimate(statistic)
    exact = mech.variance(values.shape[0], np.bincount(values, minlength=mech.k) / values.shape[0])
    assert np.allclose(estimate.variances, exact, rtol=0.2)


@pytest.mark.parametrize("case", NUMERIC_CASES, ids=str)
def test_numeric_plug_in_variance_is_exact_or_an_upper_bound(case: Case) -> None:
    """Within 5% of the exact variance from below; from above, the rounding term's
    worst case 1/J^2 (numeric.py) may add at most scale^2 / (J^2 n)."""
    mech = case.build()
    values = population(mech, 20000, seed=2)
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(values, np.random.default_rng(1)))
    plug_in = float(mech.estimate(statistic).variances[0])
    exact = mech.variance(values)
    assert plug_in >= exact * 0.95
    if mech.c2 > 0:  # piecewise, hybrid above ε*: estimated, not a worst case
        slack = mech.scale**2 / (mech.levels**2 * values.shape[0])
        assert exact * 0.95 <= plug_in <= exact * 1.05 + slack


# --- single and batch paths agree; statistics merge ----------------------------------


@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_single_and_batch_accumulation_agree_and_merge(case: Case) -> None:
    mech = case.build()
    values = population(mech, 400, seed=4)
    batch = mech.perturb_batch(values, np.random.default_rng(9))
    whole = mech.new_statistic()
    mech.accumulate_batch(whole, batch)
    first, second = mech.new_statistic(), mech.new_statistic()
    outputs = batch_to_outputs(mech, batch)
    for i, output in enumerate(outputs):
        mech.check_output(output)
        mech.accumulate(first if i % 2 else second, output)
    first.merge(second)
    if isinstance(whole, CountStatistic):
        assert first.counts == whole.counts and first.n == whole.n
    else:
        assert isinstance(whole, MomentStatistic)
        # Exact sums: a merge in another order is bit-identical.
        assert (first.n, first.sum_scaled, first.sum_sq_scaled) == (
            whole.n,
            whole.sum_scaled,
            whole.sum_sq_scaled,
        )


# --- output-domain checks and fixed report shape ---------------------------------------


def foreign_outputs(mech: Any) -> list[Output]:
    candidates: list[Output] = [
        CategoryOutput(0),
        BitVectorOutput(b"\x01", 3),
        HashedOutput(0, 0),
        NumericOutput(0.0),
        IndexBitOutput(0, True),
    ]
    own = type(perturb_one(mech, population(mech, 1, 0)[0].item(), random.Random(0)))
    return [c for c in candidates if not isinstance(c, own)]


@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_output_domain_check(case: Case) -> None:
    mech = case.build()
    for output in foreign_outputs(mech):
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == "WRONG_PAYLOAD_TYPE"
    sample = perturb_one(mech, population(mech, 1, 0)[0].item(), random.Random(0))
    bad: list[tuple[Output, str]] = []
    if isinstance(sample, CategoryOutput):
        size = getattr(mech, "K", getattr(mech, "k", 0))
        bad = [(CategoryOutput(size), "OUT_OF_DOMAIN"), (CategoryOutput(-1), "OUT_OF_DOMAIN")]
    elif isinstance(sample, BitVectorOutput):
        k = sample.length
        bad = [
            (BitVectorOutput(sample.bits, k + 1), "WRONG_LENGTH"),
            (BitVectorOutput(sample.bits + b"\x00", k), "WRONG_LENGTH"),
        ]
        if k % 8:
            padded = bytearray(sample.bits)
            padded[-1] |= 0x80
            bad.append((BitVectorOutput(bytes(padded), k), "OUT_OF_DOMAIN"))
        if case.wire_id == "ss":
            bad.append((BitVectorOutput(b"\x00" * len(sample.bits), k), "OUT_OF_DOMAIN"))
    elif isinstance(sample, HashedOutput):
        bad = [
            (HashedOutput(mech.seed_space, 0), "OUT_OF_DOMAIN"),
            (HashedOutput(0, mech.g), "OUT_OF_DOMAIN"),
        ]
    elif isinstance(sample, NumericOutput):
        bad = [
            (NumericOutput(math.nan), "NON_FINITE"),
            (NumericOutput(math.inf), "NON_FINITE"),
            (NumericOutput(-math.inf), "NON_FINITE"),
            (NumericOutput(1e6), "OUT_OF_DOMAIN"),
            (NumericOutput(1.797e308), "OUT_OF_DOMAIN"),
            (NumericOutput(0.0 if 0.0 not in mech.table else -0.0), "OUT_OF_DOMAIN"),
        ]
        grid = {wire_bytes(v) for v in mech.table}
        for y in mech.table:  # every grid value, bit for bit, and nothing one ulp away
            mech.check_output(NumericOutput(y))
            for near in (math.nextafter(y, math.inf), math.nextafter(y, -math.inf)):
                if wire_bytes(near) not in grid:
                    bad.append((NumericOutput(near), "OUT_OF_DOMAIN"))
    for output, reason in bad:
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == reason


@pytest.mark.parametrize("case", ALL_CASES, ids=str)
def test_report_shape_does_not_depend_on_the_value(case: Case) -> None:
    mech = case.build()
    rng = random.Random(1)
    values = (
        [float(case.metric[0]), 0.0, float(case.metric[1]), 100.0]
        if isinstance(mech, NumericMechanism)
        else list(range(mech.k))
    )
    shapes = set()
    for value in values:
        for _ in range(20):
            output = perturb_one(mech, value, rng)
            mech.check_output(output)
            shape: tuple[Any, ...] = (type(output),)
            if isinstance(output, BitVectorOutput):
                shape += (output.length, len(output.bits))
            shapes.add(shape)
    assert len(shapes) == 1
