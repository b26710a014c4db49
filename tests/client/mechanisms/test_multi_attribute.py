"""Contract of the multi-attribute mechanisms (multi-split, multi-sample; multi.py).

Exact privacy over the joint output, the part checks with their reasons,
exact statistics, per-attribute estimates unbiased within the stated exact
variance (fixed seeds, tolerances from ALPHA = 1e-6), the plug-in variance,
the split ε arithmetic and `auto`'s choice against the written formulas. Each
check is also run on a deliberately broken variant and shown to fail.
"""

from __future__ import annotations

import itertools
import math
import random
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import (
    AttributeSpec,
    BitVectorOutput,
    CategoryOutput,
    MultiMetric,
    MultiOutput,
    NumericOutput,
    OutputDomainError,
    create,
    resolve,
)
from fedldp.client.mechanisms._common import exp_bounds
from fedldp.client.mechanisms.multi import (
    MultiAttribute,
    MultiSample,
    MultiSplit,
    _mechanism_variance,
    build_attribute,
    mode_scores,
    split_epsilon,
)
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.mechanisms.oracle import FrequencyOracle

stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-6
LO, HI = Decimal("0"), Decimal("10")


def cat(name: str, k: int, wire_id: str = "grr", **params: str) -> AttributeSpec:
    return AttributeSpec(
        name, tuple(f"{name}{i}" for i in range(k)), None, wire_id, tuple(params.items())
    )


def num(name: str, wire_id: str = "piecewise", **params: str) -> AttributeSpec:
    return AttributeSpec(name, None, (LO, HI), wire_id, tuple(sorted(params.items())))


SMALL = MultiMetric((cat("os", 3), num("age", "piecewise", levels="4", cells="6")))
MIXED = MultiMetric((cat("os", 4, "grr"), cat("lang", 6, "oue"), num("age", "hybrid")))


# --- privacy: the joint law, exactly ---------------------------------------------------


def joint_outputs(mech: MultiAttribute) -> list[MultiOutput]:
    per_attribute: list[list[Any]] = []
    for m in mech.mechanisms:
        if isinstance(m, NumericMechanism):
            per_attribute.append([NumericOutput(y) for y in sorted(set(m.table))])
        else:
            assert isinstance(m, FrequencyOracle)
            per_attribute.append(list(m.outputs()))
    if isinstance(mech, MultiSplit):
        return [MultiOutput(tuple(enumerate(combo))) for combo in itertools.product(*per_attribute)]
    return [MultiOutput(((j, o),)) for j, outs in enumerate(per_attribute) for o in outs]


INPUTS = [(c, x) for c in range(3) for x in (0.0, 1.3, 5.0, 10.0, 99.0)]


def worst_ratio(mech: MultiAttribute) -> Fraction:
    """max over outputs and input pairs of P[o | x] / P[o | x'], exactly; and each law sums to 1."""
    worst = Fraction(0)
    outputs = joint_outputs(mech)
    laws = [[mech.exact_probability(x, o) for o in outputs] for x in INPUTS]
    for law in laws:
        assert sum(law) == 1
    for i in range(len(outputs)):
        column = [law[i] for law in laws]
        if min(column) == 0:
            assert max(column) == 0, "an output possible for one input only"
            continue
        worst = max(worst, max(column) / min(column))
    return worst


@pytest.mark.parametrize("wire_id", ["multi-split", "multi-sample"])
@pytest.mark.parametrize("eps", ["0.5", "1", "3"])
def test_joint_privacy_ratio_is_at_most_e_to_epsilon_exactly(wire_id: str, eps: str) -> None:
    mech = create(wire_id, Decimal(eps), SMALL)
    assert isinstance(mech, MultiAttribute)
    lower, _ = exp_bounds(Decimal(eps))
    ratio = worst_ratio(mech)
    assert ratio <= lower  # <= e^ε exactly (e^ε > lower)
    assert mech.report_charge == Decimal(eps)  # one report, charged ε once


class FullEpsilonSplit(MultiSplit):
    """Broken: every attribute at the full ε (the budget is not split)."""

    def __init__(self, epsilon: Decimal, metric: MultiMetric) -> None:
        super().__init__(epsilon, metric)
        self.attribute_epsilon = epsilon
        self.mechanisms = tuple(build_attribute(a, epsilon) for a in metric.attributes)


class BiasedChoiceSample(MultiSample):
    """Broken: the attribute choice law depends on nothing but is not uniform (and the
    stated law says so), and attribute 0 is reported at 2 ε."""

    def __init__(self, epsilon: Decimal, metric: MultiMetric) -> None:
        super().__init__(epsilon, metric)
        self.mechanisms = (build_attribute(metric.attributes[0], 2 * epsilon), *self.mechanisms[1:])


@pytest.mark.parametrize("broken", [FullEpsilonSplit, BiasedChoiceSample])
def test_privacy_check_fails_on_broken_variants(broken: type[MultiAttribute]) -> None:
    mech = broken(Decimal(1), SMALL)
    lower, _ = exp_bounds(Decimal(1))
    assert worst_ratio(mech) > lower


def test_split_epsilon_is_rounded_down_and_sums_to_at_most_epsilon() -> None:
    assert split_epsilon(Decimal(1), 3) == Decimal("0.33333333333333333333")
    assert split_epsilon(Decimal(2), 4) == Decimal("0.5")
    for eps, d in itertools.product(["0.1", "1", "2.5", "7", "0.003"], range(2, 17)):
        share = split_epsilon(Decimal(eps), d)
        assert 0 < share * d <= Decimal(eps)  # exact Decimal product (prec 28 suffices)
        assert Decimal(eps) - share * d < Decimal(eps) * Decimal("1e-18")
    mech = create("multi-split", Decimal(1), MIXED)
    assert all(m.epsilon == Decimal("0.33333333333333333333") for m in mech.mechanisms)  # type: ignore[attr-defined]


def test_sample_draws_the_attribute_uniformly_on_the_device_path() -> None:
    mech = create("multi-sample", Decimal(1), MIXED)
    rng = random.Random(4)
    counts = [0, 0, 0]
    for _ in range(3000):
        output = mech.perturb((1, 2, 5.0), rng=rng)
        mech.check_output(output)
        assert isinstance(output, MultiOutput)
        counts[output.parts[0][0]] += 1
    assert stats.chisquare(counts).pvalue > ALPHA


# --- the collector's checks -----------------------------------------------------------


def test_check_output_reasons() -> None:
    split = create("multi-split", Decimal(1), SMALL)
    sample = create("multi-sample", Decimal(1), SMALL)
    good = split.perturb((1, 3.0), rng=random.Random(1))
    split.check_output(good)
    assert isinstance(good, MultiOutput)
    cases: list[tuple[Any, Any, str]] = [
        (split, CategoryOutput(0), "WRONG_PAYLOAD_TYPE"),
        (split, MultiOutput(()), "WRONG_LENGTH"),
        (split, MultiOutput(good.parts[:1]), "WRONG_LENGTH"),
        (split, MultiOutput(good.parts * 2), "WRONG_LENGTH"),
        (split, MultiOutput((good.parts[1], good.parts[0])), "OUT_OF_DOMAIN"),
        (split, MultiOutput(((0, CategoryOutput(3)), good.parts[1])), "OUT_OF_DOMAIN"),
        (split, MultiOutput(((0, NumericOutput(1.0)), good.parts[1])), "WRONG_PAYLOAD_TYPE"),
        (split, MultiOutput((good.parts[0], (1, NumericOutput(math.nan)))), "NON_FINITE"),
        (split, MultiOutput((good.parts[0], (1, NumericOutput(1e9)))), "OUT_OF_DOMAIN"),
        (sample, good, "WRONG_LENGTH"),
        (sample, MultiOutput(()), "WRONG_LENGTH"),
        (sample, MultiOutput(((2, CategoryOutput(0)),)), "OUT_OF_DOMAIN"),
        (sample, MultiOutput(((1, CategoryOutput(0)),)), "WRONG_PAYLOAD_TYPE"),
        (sample, MultiOutput(((0, BitVectorOutput(b"\x01", 3)),)), "WRONG_PAYLOAD_TYPE"),
    ]
    for mech, output, reason in cases:
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == reason, (mech.wire_id, output)
        statistic = mech.new_statistic()
        with pytest.raises(OutputDomainError):
            mech.accumulate(statistic, output)
        assert statistic.n == 0 and mech.statistic_to_json(statistic) == mech.statistic_to_json(
            mech.new_statistic()
        )


def test_attribute_mechanisms_are_refused_when_unsafe() -> None:
    memo = AttributeSpec("x", ("a", "b"), None, "rappor-grr", (("epsilon_permanent", "4"),))
    for spec, match in [
        (memo, "memoized"),
        (AttributeSpec("x", ("a", "b"), None, "auto"), "auto"),
        (AttributeSpec("x", ("a", "b"), None, "multi-split"), "nested"),
        (AttributeSpec("x", None, (LO, HI), "grr"), "categorical"),
        (AttributeSpec("x", ("a", "b"), None, "piecewise"), "numeric"),
    ]:
        with pytest.raises(ValueError, match=match):
            create("multi-split", Decimal(1), MultiMetric((spec, cat("y", 2))))
    with pytest.raises(ValueError, match=r"2\.\.16"):
        create("multi-sample", Decimal(1), MultiMetric((cat("y", 2),)))
    with pytest.raises(ValueError, match="multi-attribute metric"):
        create("multi-split", Decimal(1), 4)
    with pytest.raises(ValueError, match="no parameters"):
        create("multi-split", Decimal(1), SMALL, {"x": "1"})


# --- statistics -----------------------------------------------------------------------


def population(n: int, seed: int, metric: MultiMetric = MIXED) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for spec in metric.attributes:
        if spec.labels is not None:
            k = len(spec.labels)
            w = 1.0 / np.arange(1, k + 1) ** 1.2
            out.append(rng.choice(k, size=n, p=w / w.sum()))
        else:
            out.append(rng.uniform(-2.0, 12.0, size=n))  # some clipped
    return out


@pytest.mark.parametrize("wire_id", ["multi-split", "multi-sample"])
def test_single_and_batch_paths_agree_and_json_round_trips(wire_id: str) -> None:
    mech = create(wire_id, Decimal(2), MIXED)
    assert isinstance(mech, MultiAttribute)
    values = population(300, 3)
    rng = random.Random(8)
    single, first, second = mech.new_statistic(), mech.new_statistic(), mech.new_statistic()
    for i in range(300):
        output = mech.perturb(tuple(v[i].item() for v in values), rng=rng)
        mech.accumulate(single, output)
        mech.accumulate(first if i % 2 else second, output)
    mech.merge_statistics(first, second)
    assert mech.statistic_to_json(first) == mech.statistic_to_json(single)
    text = mech.statistic_to_json(single)
    assert mech.statistic_to_json(mech.statistic_from_json(text)) == text
    batch = mech.new_statistic()
    mech.accumulate_batch(batch, mech.perturb_batch(values, np.random.default_rng(2)))
    assert batch.n == 300
    assert sum(p.n for p in batch.parts) == (300 * 3 if wire_id == "multi-split" else 300)


# --- estimates: unbiased within the stated exact variance -------------------------------


def run(
    mech: MultiAttribute, values: list[np.ndarray], reps: int, seed: int
) -> tuple[Any, Any, Any]:
    """(estimates, exact variances, plug-in variances), each reps x coordinates."""
    rng = np.random.default_rng(seed)
    estimates, exact, plug_in = [], [], []
    for _ in range(reps):
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
        est = mech.estimate(statistic)
        estimates.append(est.values)
        plug_in.append(est.variances)
        exact.append(np.concatenate(mech.exact_variances(values, [p.n for p in statistic.parts])))
    return np.array(estimates), np.array(exact), np.array(plug_in)


def truth_of(mech: MultiAttribute, values: list[np.ndarray]) -> np.ndarray:
    parts = []
    for m, v in zip(mech.mechanisms, values, strict=True):
        if isinstance(m, NumericMechanism):
            parts.append(np.array([np.clip(v, float(m.lo), float(m.hi)).mean()]))
        else:
            parts.append(np.bincount(v, minlength=m.k) / v.shape[0])  # type: ignore[attr-defined]
    return np.concatenate(parts)


def check_unbiased_and_variance(
    mech: MultiAttribute, values: list[np.ndarray], reps: int, seed: int
) -> Any:
    """Mean within z·σ/√R of the truth; the sample variance inside the chi-square band of
    the mean stated exact variance (Bonferroni over coordinates and the two checks)."""
    estimates, exact, plug_in = run(mech, values, reps, seed)
    truth = truth_of(mech, values)
    variance = exact.mean(axis=0)
    tests = 2 * truth.shape[0]
    z = float(stats.norm.isf(ALPHA / (2 * tests)))
    lo_q = float(stats.chi2.ppf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    hi_q = float(stats.chi2.isf(ALPHA / (2 * tests), reps - 1)) / (reps - 1)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= z * np.sqrt(variance / reps)), "biased"
    ratio = ((estimates - truth) ** 2).mean(axis=0) / variance
    assert np.all((ratio > lo_q) & (ratio < hi_q)), f"variance ratio {ratio}"
    return exact, plug_in


@pytest.mark.parametrize("wire_id", ["multi-split", "multi-sample"])
@pytest.mark.parametrize("eps", ["1", "6"])
def test_attribute_estimates_are_unbiased_with_the_stated_variance(wire_id: str, eps: str) -> None:
    mech = create(wire_id, Decimal(eps), MIXED)
    assert isinstance(mech, MultiAttribute)
    values = population(3000, seed=11)
    exact, plug_in = check_unbiased_and_variance(mech, values, reps=300, seed=5)
    # The plug-in variance tracks the exact one (numeric: at most the 1/J^2 worst case above).
    assert np.all(plug_in.mean(axis=0) >= 0.9 * exact.mean(axis=0))
    assert np.all(plug_in.mean(axis=0) <= 1.1 * exact.mean(axis=0) + 1e-3)


class NoSubsampleTermSample(MultiSample):
    """Broken: states only the mechanism's variance at n_j, forgetting that the n_j
    reports are a random subset of the population."""

    def exact_variances(self, values: Any, reports: Any = None) -> list[Any]:
        return [
            _mechanism_variance(m, v, n_j)
            for m, v, n_j in zip(self.mechanisms, values, reports, strict=True)
        ]


def test_variance_check_fails_without_the_subsample_term() -> None:
    mech = NoSubsampleTermSample(Decimal(8), MultiMetric((cat("os", 3), cat("lang", 4))))
    values = population(3000, seed=11, metric=MultiMetric((cat("os", 3), cat("lang", 4))))
    # Too small a variance: the mean's band and the variance band both fail.
    with pytest.raises(AssertionError, match=r"biased|variance ratio"):
        check_unbiased_and_variance(mech, values, reps=300, seed=5)


class SplitAtFullEpsilonEstimator(MultiSplit):
    """Broken: debiases with the attribute mechanisms at the full ε."""

    def __init__(self, epsilon: Decimal, metric: MultiMetric) -> None:
        super().__init__(epsilon, metric)
        self._full = tuple(build_attribute(a, epsilon) for a in metric.attributes)

    def estimate(self, statistic: Any) -> Any:
        from fedldp.client.mechanisms.base import Estimate

        parts = [m.estimate(s) for m, s in zip(self._full, statistic.parts, strict=True)]
        return Estimate(
            statistic.n,
            np.concatenate([p.values for p in parts]),
            np.concatenate([p.variances for p in parts]),
        )


def test_unbiasedness_check_fails_on_a_broken_estimator() -> None:
    metric = MultiMetric((cat("os", 3), cat("lang", 4)))
    mech = SplitAtFullEpsilonEstimator(Decimal(1), metric)
    with pytest.raises(AssertionError, match="biased"):
        check_unbiased_and_variance(mech, population(3000, 11, metric), reps=300, seed=5)


def test_an_attribute_without_reports_has_no_estimate() -> None:
    mech = create("multi-sample", Decimal(1), SMALL)
    statistic = mech.new_statistic()
    mech.accumulate(statistic, MultiOutput(((0, CategoryOutput(1)),)))
    with pytest.raises(ValueError, match="'age' has no reports yet"):
        mech.estimate(statistic)


# --- auto: the lower total variance, as written in multi.py ------------------------------


def written_unit(m: Any) -> tuple[float, float]:
    """u_j and s_j exactly as multi.py's docstring writes them (recomputed here)."""
    if isinstance(m, NumericMechanism):
        j = m.levels
        return float(m.c0) + float(m.c2) * (1 / 3 + 2 / (3 * j * j)) - 1 / 3, 1 / 3
    f = 1 / m.k
    p, q = m.support_p, m.support_q
    return (f * p * (1 - p) + (1 - f) * q * (1 - q)) / (p - q) ** 2, f * (1 - f)


def written_totals(metric: MultiMetric, eps: Decimal) -> tuple[float, float]:
    d = len(metric.attributes)
    split = sum(
        written_unit(build_attribute(a, split_epsilon(eps, d)))[0] for a in metric.attributes
    )
    sample = 0.0
    for a in metric.attributes:
        u, s = written_unit(build_attribute(a, eps))
        sample += d * u + (d - 1) * s
    return split, sample


AUTO_METRICS = [
    SMALL,
    MIXED,
    MultiMetric((cat("a", 2), cat("b", 2))),
    MultiMetric((cat("a", 50, "oue"), cat("b", 50, "oue"), cat("c", 50, "oue"))),
    MultiMetric((num("x", "duchi"), num("y", "duchi"))),
    MultiMetric(tuple(cat(f"a{i}", 3) for i in range(8))),
]


@pytest.mark.parametrize("metric", AUTO_METRICS, ids=lambda m: f"d{len(m.attributes)}")
@pytest.mark.parametrize("eps", ["0.5", "1", "2", "4", "8"])
def test_auto_picks_the_lower_written_total(metric: MultiMetric, eps: str) -> None:
    split, sample = written_totals(metric, Decimal(eps))
    scores = mode_scores(metric, Decimal(eps))
    assert math.isclose(scores.split, split, rel_tol=1e-12)
    assert math.isclose(scores.sample, sample, rel_tol=1e-12)
    expected = "multi-sample" if sample < split else "multi-split"
    assert resolve("auto", Decimal(eps), metric) == expected


def test_both_modes_are_chosen_somewhere() -> None:
    choices = {resolve("auto", Decimal(e), m) for m in AUTO_METRICS for e in ("0.5", "1", "8")}
    assert choices == {"multi-split", "multi-sample"}


def test_auto_check_fails_on_a_formula_without_the_subsample_term() -> None:
    """A scorer that forgets (d - 1) s_j disagrees with `auto` somewhere in the grid."""
    disagreements = 0
    for metric in AUTO_METRICS:
        for eps in ("0.5", "1", "2", "4", "8"):
            split, sample = written_totals(metric, Decimal(eps))
            d = len(metric.attributes)
            forgetful = sample - sum(
                (d - 1) * written_unit(build_attribute(a, Decimal(eps)))[1]
                for a in metric.attributes
            )
            broken = "multi-sample" if forgetful < split else "multi-split"
            disagreements += broken != resolve("auto", Decimal(eps), metric)
    assert disagreements > 0


def test_auto_resolves_attribute_autos_per_mode() -> None:
    metric = MultiMetric((cat("a", 40, "auto"), num("x", "piecewise")))
    scores = mode_scores(metric, Decimal(4))
    from fedldp.client.mechanisms.auto import choose_frequency_oracle

    assert scores.split_ids[0] == choose_frequency_oracle(40, split_epsilon(Decimal(4), 2))
    assert scores.sample_ids[0] == choose_frequency_oracle(40, Decimal(4))
    assert scores.split_ids[1] == scores.sample_ids[1] == "piecewise"
