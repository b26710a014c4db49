"""CMS and HCMS (fedldp.client.mechanisms.sketch): the hash contract, exact privacy,
output checks, the additive statistic, and the candidate estimator's variance.

Statistical checks use fixed seeds and bands at a stated false-failure rate
ALPHA = 1e-6; each is also run on a deliberately broken variant, which fails.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
from collections.abc import Callable
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import OpenDomain, OutputDomainError, create
from fedldp.client.mechanisms._common import dyadic_from_exp, half
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    Output,
    SketchBitOutput,
    SketchRowOutput,
)
from fedldp.client.mechanisms.sketch import (
    CMS,
    HASH_TAG,
    HCMS,
    CandidatesRequiredError,
    Sketch,
    SketchStatistic,
    sketch_hash,
    sketch_params,
)
from mech_cases import (  # type: ignore[import-not-found]
    SKETCH_CASES,
    Case,
    exact_max_ratio,
    exp_bounds,
)

stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-6
DOMAIN = OpenDomain(32)
EPSILONS = ("0.5", "1", "2", "4")


def build(wire_id: str, epsilon: str, rows: int, columns: int) -> Any:
    return create(wire_id, Decimal(epsilon), DOMAIN, {"rows": str(rows), "columns": str(columns)})


# --- the hash family of the wire contract ---------------------------------------------

#: (string, row, first 8 digest bytes, h mod 1024, h mod 16384): for ports of the SDK.
HASH_VECTORS = [
    ("hello", 0, "48709d4c6ce8025b", 603, 603),
    ("hello", 1, "bac684c11c96e953", 339, 10579),
    ("hello", 7, "5c50984118befc62", 98, 15458),
    ("emoji 😀", 0, "21b829fed3ee05bd", 445, 1469),
    ("emoji 😀", 1, "55a2824fb49ba5ad", 429, 9645),
    ("emoji 😀", 7, "48f5657bf13976ec", 748, 14060),
    ("a", 0, "8ffc6f89b5c9744c", 76, 13388),
    ("a", 1, "4f0f91f92c193311", 785, 13073),
    ("a", 7, "696ca1a9476b6932", 306, 10546),
]


@pytest.mark.parametrize(("text", "row", "prefix", "h1024", "h16384"), HASH_VECTORS)
def test_hash_test_vectors(text: str, row: int, prefix: str, h1024: int, h16384: int) -> None:
    data = text.encode("utf-8")
    digest = hashlib.sha256(b"fedldp/v1/sketch\x00" + row.to_bytes(4, "big") + data).digest()
    assert HASH_TAG == b"fedldp/v1/sketch\x00"
    assert digest[:8].hex() == prefix
    assert int(prefix, 16) % 1024 == h1024 and int(prefix, 16) % 16384 == h16384
    assert sketch_hash(row, data, 1024) == h1024
    assert sketch_hash(row, data, 16384) == h16384
    mech = build("cms", "1", 8, 1024)
    assert mech.cells(text)[row] == h1024


def test_hash_is_uniform_over_columns() -> None:
    """Chi-square of 40,000 strings' row-0 hashes over 64 columns (alpha 1e-6)."""
    counts = np.bincount(
        [sketch_hash(0, f"word-{i}".encode(), 64) for i in range(40_000)], minlength=64
    )
    assert stats.chisquare(counts).pvalue > ALPHA


# --- exact privacy, from the samplers' own thresholds ---------------------------------


def cms_outputs(mech: CMS) -> list[Output]:
    return [
        SketchRowOutput(j, b.to_bytes((mech.m + 7) // 8, "little"), mech.m)
        for j in range(mech.k)
        for b in range(1 << mech.m)
    ]


def hcms_outputs(mech: HCMS) -> list[Output]:
    return [
        SketchBitOutput(j, col, bit)
        for j in range(mech.k)
        for col in range(mech.m)
        for bit in (False, True)
    ]


def all_laws(mech: Sketch) -> list[list[Fraction]]:
    """The exact law of every output, for every assignment of cells to the k rows
    (every string is one of these: the law depends on a string only through its cells)."""
    outputs = cms_outputs(mech) if isinstance(mech, CMS) else hcms_outputs(mech)  # type: ignore[arg-type]
    laws = []
    for cells in itertools.product(range(mech.m), repeat=mech.k):
        laws.append([mech.exact_probability(cells, o) for o in outputs])  # type: ignore[attr-defined]
    return laws


def assert_exact_epsilon(ratio: Fraction | None, epsilon: Decimal) -> None:
    """e^ε (1 - 2^-40) <= ratio <= e^ε, compared exactly."""
    assert ratio is not None, "an output is possible under one input only"
    lo, hi = exp_bounds(epsilon)
    assert ratio <= lo, f"realized ratio exceeds e^{epsilon} by {float(ratio / hi - 1):.3g}"
    assert ratio >= hi * (1 - Fraction(1, 2**40)), "realized ratio below e^ε: too much noise"


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize(("wire_id", "rows", "columns"), [("cms", 2, 4), ("hcms", 2, 8)])
def test_realized_privacy_ratio_is_at_most_e_to_epsilon_exactly(
    wire_id: str, rows: int, columns: int, eps: str
) -> None:
    laws = all_laws(build(wire_id, eps, rows, columns))
    for law in laws:
        assert sum(law, Fraction(0)) == 1
    assert_exact_epsilon(exact_max_ratio(laws), Decimal(eps))


class FlipRoundedDownCMS(CMS):
    """Broken: the flip probability rounded DOWN (ratio above e^ε by ~2^-52 relative)."""

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        self.flip = dyadic_from_exp(lambda h: 1 / (h + 1), half(epsilon))
        self.q_exact = self.flip.exact
        self.p_exact = 1 - self.q_exact


class FullEpsilonCMS(CMS):
    """Broken: each bit flipped at ε instead of ε/2 (two bits change: ratio e^{2ε})."""

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        self.q_exact = dyadic_from_exp(lambda e: 1 / (e + 1), epsilon, round_up=True).exact
        self.p_exact = 1 - self.q_exact


class KeepRoundedUpHCMS(HCMS):
    """Broken: the keep probability rounded UP."""

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        self.p_exact = dyadic_from_exp(lambda e: e / (e + 1), epsilon, round_up=True).exact


BROKEN: dict[str, Callable[[], Sketch]] = {
    "cms-flip-rounded-down": lambda: FlipRoundedDownCMS(Decimal(1), DOMAIN, 2, 4),
    "cms-full-epsilon-per-bit": lambda: FullEpsilonCMS(Decimal(1), DOMAIN, 2, 4),
    "hcms-keep-rounded-up": lambda: KeepRoundedUpHCMS(Decimal(1), DOMAIN, 2, 8),
}


@pytest.mark.parametrize("name", BROKEN)
def test_exact_privacy_check_fails_on_broken_sketches(name: str) -> None:
    with pytest.raises(AssertionError, match="exceeds"):
        assert_exact_epsilon(exact_max_ratio(all_laws(BROKEN[name]())), Decimal(1))


@pytest.mark.parametrize("name", ["cms-flip-rounded-down", "hcms-keep-rounded-up"])
def test_a_threshold_one_ulp_the_wrong_way_is_caught(name: str) -> None:
    ratio = exact_max_ratio(all_laws(BROKEN[name]()))
    assert ratio is not None
    _, hi = exp_bounds(Decimal(1))
    assert hi < ratio < hi * (1 + Fraction(1, 2**45))  # a float check would miss it


@pytest.mark.parametrize("eps", EPSILONS)
def test_thresholds_are_the_papers_probabilities_rounded_the_safe_way(eps: str) -> None:
    from decimal import Context

    epsilon = Decimal(eps)
    ctx = Context(prec=100)
    e, h = ctx.exp(epsilon), ctx.exp(epsilon / 2)
    scale = Decimal(2**53)
    cms, hcms = build("cms", eps, 4, 16), build("hcms", eps, 4, 16)
    assert cms.flip.numerator == math.ceil(ctx.multiply(1 / (h + 1), scale))
    assert cms.keep.numerator == 2**53 - cms.flip.numerator
    assert hcms.keep.numerator == math.floor(ctx.multiply(e / (e + 1), scale))


# --- the samplers follow the stated law (device and batch paths) ----------------------


def law_of(mech: Sketch, value: str) -> dict[Output, float]:
    cells = mech.cells(value)
    outputs = cms_outputs(mech) if isinstance(mech, CMS) else hcms_outputs(mech)  # type: ignore[arg-type]
    return {o: float(mech.exact_probability(cells, o)) for o in outputs}  # type: ignore[attr-defined]


def batch_outputs(mech: Sketch, values: list[str], seed: int) -> list[Output]:
    batch = mech.perturb_batch(values, np.random.default_rng(seed))
    if isinstance(mech, CMS):
        rows, packed = batch
        return [
            SketchRowOutput(int(j), r.tobytes(), mech.m) for j, r in zip(rows, packed, strict=True)
        ]
    rows, columns, bits = batch
    return [
        SketchBitOutput(int(j), int(c), bool(b))
        for j, c, b in zip(rows, columns, bits, strict=True)
    ]


def chi_square_p(outputs: list[Output], law: dict[Output, float]) -> float:
    observed = dict.fromkeys(law, 0)
    for o in outputs:
        assert o in law, "an output outside the stated law"
        observed[o] += 1
    n = len(outputs)
    keys = [o for o in law if law[o] * n >= 5]
    rest = [o for o in law if law[o] * n < 5]
    obs = [observed[o] for o in keys]
    exp = [law[o] * n for o in keys]
    if rest:
        obs.append(sum(observed[o] for o in rest))
        exp.append(sum(law[o] for o in rest) * n)
    return float(stats.chisquare(obs, exp).pvalue)


@pytest.mark.parametrize("path", ["device", "batch"])
@pytest.mark.parametrize(("wire_id", "columns"), [("cms", 4), ("hcms", 8)])
def test_output_law(wire_id: str, columns: int, path: str) -> None:
    mech = build(wire_id, "1", 2, columns)
    n = 8000
    for value in ("hello", "world"):
        if path == "device":
            rng = random.Random(3)
            outputs: list[Output] = [mech.perturb(value, rng=rng) for _ in range(n)]
        else:
            outputs = batch_outputs(mech, [value] * n, seed=3)
        assert chi_square_p(outputs, law_of(mech, value)) > ALPHA


class TruthfulHCMS(HCMS):
    """Broken sampler: reports the true coefficient one time in ten without noise."""

    def perturb(self, value: str, *, rng: random.Random | None = None) -> SketchBitOutput:
        assert rng is not None
        out = super().perturb(value, rng=rng)
        if rng.getrandbits(4) < 2:
            truth = self.coefficient(self.cell(out.row, value), out.column)
            return SketchBitOutput(out.row, out.column, truth)
        return out


def test_output_law_check_fails_on_broken_sampler() -> None:
    mech = TruthfulHCMS(Decimal(1), DOMAIN, 2, 8)
    rng = random.Random(3)
    outputs: list[Output] = [mech.perturb("hello", rng=rng) for _ in range(8000)]
    assert chi_square_p(outputs, law_of(mech, "hello")) < ALPHA


# --- collector checks and the report's fixed shape -----------------------------------


def test_cms_output_checks_name_the_reason() -> None:
    mech = build("cms", "1", 4, 4)
    good = mech.perturb("hello", rng=random.Random(0))
    mech.check_output(good)
    bad: list[tuple[Output, str]] = [
        (SketchRowOutput(4, good.bits, 4), "OUT_OF_DOMAIN"),
        (SketchRowOutput(0, good.bits, 8), "WRONG_LENGTH"),
        (SketchRowOutput(0, good.bits + b"\x00", 4), "WRONG_LENGTH"),
        (SketchRowOutput(0, b"", 4), "WRONG_LENGTH"),
        (SketchRowOutput(0, b"\x10", 4), "OUT_OF_DOMAIN"),  # a padding bit
        (SketchBitOutput(0, 0, True), "WRONG_PAYLOAD_TYPE"),
        (BitVectorOutput(good.bits, 4), "WRONG_PAYLOAD_TYPE"),
        (CategoryOutput(0), "WRONG_PAYLOAD_TYPE"),
    ]
    for output, reason in bad:
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == reason
        with pytest.raises(OutputDomainError):
            mech.accumulate(mech.new_statistic(), output)


def test_hcms_output_checks_name_the_reason() -> None:
    mech = build("hcms", "1", 4, 16)
    mech.check_output(SketchBitOutput(3, 15, False))
    for output, reason in [
        (SketchBitOutput(4, 0, True), "OUT_OF_DOMAIN"),
        (SketchBitOutput(0, 16, True), "OUT_OF_DOMAIN"),
        (SketchRowOutput(0, b"\x01\x00", 16), "WRONG_PAYLOAD_TYPE"),
        (CategoryOutput(0), "WRONG_PAYLOAD_TYPE"),
    ]:
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == reason


@pytest.mark.parametrize("case", SKETCH_CASES, ids=str)
def test_report_shape_does_not_depend_on_the_value(case: Case) -> None:
    mech = case.build()
    rng = random.Random(1)
    shapes = set()
    for value in ("a", "hello world", "x" * 16, "😀"):
        for _ in range(20):
            out = mech.perturb(value, rng=rng)
            mech.check_output(out)
            shapes.add(
                (
                    type(out),
                    getattr(out, "length", None),
                    len(getattr(out, "bits", b"") if isinstance(out, SketchRowOutput) else b""),
                )
            )
    assert len(shapes) == 1


@pytest.mark.parametrize("case", SKETCH_CASES, ids=str)
def test_bad_values_are_refused_without_echo(case: Case) -> None:
    mech = case.build()
    for value in ("", "secret\x00", "s" * (mech.domain.max_bytes + 1), 5):
        with pytest.raises(ValueError) as info:
            mech.perturb(value, rng=random.Random(0))
        assert "secret" not in str(info.value) and "sss" not in str(info.value)


# --- statistic: single and batch agree, merge, JSON ---------------------------------


@pytest.mark.parametrize("case", SKETCH_CASES, ids=str)
def test_single_and_batch_accumulation_agree_merge_and_round_trip(case: Case) -> None:
    mech = case.build()
    values = [f"w{i % 7}" for i in range(500)]
    batch = mech.perturb_batch(values, np.random.default_rng(9))
    whole = mech.new_statistic()
    mech.accumulate_batch(whole, batch)
    first, second = mech.new_statistic(), mech.new_statistic()
    for i, output in enumerate(batch_outputs_from(mech, batch)):
        mech.check_output(output)
        mech.accumulate(first if i % 2 else second, output)
    mech.merge_statistics(first, second)
    assert (first.counts, first.row_reports, first.n) == (whole.counts, whole.row_reports, 500)
    again = mech.statistic_from_json(mech.statistic_to_json(whole))
    assert again == whole


def batch_outputs_from(mech: Sketch, batch: Any) -> list[Output]:
    if isinstance(mech, CMS):
        rows, packed = batch
        return [
            SketchRowOutput(int(j), r.tobytes(), mech.m) for j, r in zip(rows, packed, strict=True)
        ]
    rows, columns, bits = batch
    return [
        SketchBitOutput(int(j), int(c), bool(b))
        for j, c, b in zip(rows, columns, bits, strict=True)
    ]


def test_statistics_of_other_sizes_do_not_merge() -> None:
    a, b = build("cms", "1", 4, 16), build("cms", "1", 2, 16)
    with pytest.raises(ValueError, match="different sizes"):
        a.new_statistic().merge(b.new_statistic())
    with pytest.raises(ValueError, match="rows and columns"):
        a.estimate_candidates(b.new_statistic(), ["x"])


# --- parameters, registry and the estimate() contract --------------------------------


def test_parameters_defaults_bounds_and_metric() -> None:
    assert sketch_params("cms", {}) == {"rows": "64", "columns": "1024"}
    assert sketch_params("hcms", {"rows": "8"}) == {"rows": "8", "columns": "1024"}
    assert sketch_params("grr", {}) == {}
    for params, match in [
        ({"columns": "100"}, "power of two"),
        ({"columns": "1"}, "power of two"),
        ({"columns": "32768"}, "power of two"),
        ({"rows": "0"}, "rows"),
        ({"rows": "4096", "columns": "1024"}, "cells"),
        ({"width": "8"}, "does not take"),
        ({"rows": "-1"}, "plain integer"),
    ]:
        with pytest.raises(ValueError, match=match):
            create("cms", Decimal(1), DOMAIN, params)
    for metric in (5, (Decimal(0), Decimal(1))):
        with pytest.raises(ValueError, match="open-domain metric"):
            create("hcms", Decimal(1), metric, {})
    with pytest.raises(ValueError, match="categorical metric"):
        create("grr", Decimal(1), DOMAIN, {})


@pytest.mark.parametrize("case", SKETCH_CASES, ids=str)
def test_estimate_points_to_candidates_and_candidates_are_checked(case: Case) -> None:
    mech = case.build()
    statistic = mech.new_statistic()
    mech.accumulate(statistic, mech.perturb("x", rng=random.Random(0)))
    with pytest.raises(CandidatesRequiredError, match="estimate_candidates"):
        mech.estimate(statistic)
    too_long = "s" * (mech.domain.max_bytes + 1)
    with pytest.raises(ValueError, match=r"candidate 2: .*UTF-8 bytes") as info:
        mech.estimate_candidates(statistic, ["ok", too_long])
    assert too_long not in str(info.value)
    with pytest.raises(ValueError, match="candidates 1 and 3 are the same"):
        mech.estimate_candidates(statistic, ["a", "b", "a"])
    with pytest.raises(ValueError, match=r"1\.\.100000"):
        mech.estimate_candidates(statistic, [])
    with pytest.raises(ValueError, match="zero reports"):
        mech.estimate_candidates(mech.new_statistic(), ["a"])


# --- the estimator: unbiased, with a variance that includes the collision term -------

#: A population with heavy strings (their collisions dominate) and a long tail.
COUNTS = np.array([3000, 2000, 1000] + [50] * 40)
#: Candidates: a heavy string, a tail string, and a string no one holds.
CANDIDATES = (0, 5, None)


def simulate(mech: Sketch, reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(estimates (reps, 3), plug-in variances (reps, 3)) of the counts of CANDIDATES.

    Every replicate draws fresh strings, hence fresh hash values: the variance over
    replicates is over the coins, the row draws AND the hash model, like the formula.
    """
    rng = np.random.default_rng(seed)
    n = int(COUNTS.sum())
    estimates, variances = [], []
    for rep in range(reps):
        names = [f"rep{rep}-value{i}" for i in range(COUNTS.shape[0])]
        values = np.repeat(np.array(names, dtype=object), COUNTS)
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
        asked = [names[c] if c is not None else f"rep{rep}-absent" for c in CANDIDATES]
        estimate = mech.estimate_candidates(statistic, asked)
        estimates.append(estimate.values * n)
        variances.append(estimate.variances * n * n)
    return np.array(estimates), np.array(variances)


def exact_count_variances(mech: Sketch) -> np.ndarray:
    n = int(COUNTS.sum())
    pairs = int((COUNTS * (COUNTS - 1)).sum())
    out = []
    for c in CANDIDATES:
        count = 0 if c is None else int(COUNTS[c])
        out.append(mech.count_variance(n, count, pairs - count * (count - 1)))
    return np.array(out, dtype=float)


def check_unbiased_with_stated_variance(mech: Sketch, reps: int = 300, seed: int = 5) -> None:
    """Mean within z·σ/√R of the truth and the sample variance inside the chi-square
    band, Bonferroni over the 3 candidates x 2 checks (total false-failure rate ALPHA)."""
    estimates, _ = simulate(mech, reps, seed)
    truth = np.array([0 if c is None else COUNTS[c] for c in CANDIDATES], dtype=float)
    variance = exact_count_variances(mech)
    tests = 2 * len(CANDIDATES)
    z = float(stats.norm.isf(ALPHA / (2 * tests)))
    lo_q = float(stats.chi2.ppf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    hi_q = float(stats.chi2.isf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= z * np.sqrt(variance / reps)), "biased"
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert np.all((ratio > lo_q) & (ratio < hi_q)), f"variance ratio {ratio}"


@pytest.mark.parametrize(("wire_id", "eps"), [("cms", "4"), ("hcms", "4"), ("cms", "1")])
def test_unbiased_with_the_stated_variance_including_collisions(wire_id: str, eps: str) -> None:
    mech = build(wire_id, eps, 2, 16)
    collision = mech.collision_count_variance(int(COUNTS.sum()), 0, int((COUNTS**2).sum()))
    assert collision > mech.count_variance(int(COUNTS.sum()), 0, 0) / 10  # the term matters here
    check_unbiased_with_stated_variance(mech)


class NoCollisionTermCMS(CMS):
    """Broken variance: leaves out the collision term (what a non-sketch oracle states)."""

    def collision_count_variance(self, n: int, count: Any, other_pairs: Any) -> Any:
        return 0 * count


class NoCorrectionHCMS(HCMS):
    """Broken estimator: no m/(m-1) collision correction (Σ Y_i taken as the count)."""

    def estimate_candidates(self, statistic: SketchStatistic, candidates: Any) -> Any:
        estimate = super().estimate_candidates(statistic, candidates)
        n, m = statistic.n, self.m
        values = (estimate.values * (m - 1) / m) + 1 / m  # Σ Y_i / n
        return type(estimate)(n=n, values=values, variances=estimate.variances)


def test_variance_check_fails_without_the_collision_term() -> None:
    # The understated variance makes both the z band and the chi-square band fail.
    with pytest.raises(AssertionError, match=r"biased|variance ratio"):
        check_unbiased_with_stated_variance(NoCollisionTermCMS(Decimal(4), DOMAIN, 2, 16))


def test_bias_check_fails_without_the_collision_correction() -> None:
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased_with_stated_variance(NoCorrectionHCMS(Decimal(4), DOMAIN, 2, 16))


@pytest.mark.parametrize("wire_id", ["cms", "hcms"])
def test_plug_in_variance_and_pair_count_track_the_exact_ones(wire_id: str) -> None:
    """The plug-in (P̂ from the sketch) averages to the exact variance within 10%."""
    mech = build(wire_id, "4", 2, 16)
    _, variances = simulate(mech, reps=60, seed=8)
    assert np.allclose(variances.mean(axis=0), exact_count_variances(mech), rtol=0.1)
