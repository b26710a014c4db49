"""Analyst estimates with honest error bars: frequency, mean, heavy hitters.

Everything here starts from a mechanism's own `estimate(statistic)`, which
returns the unbiased estimate and its *exact* variance per coordinate (the
frequency-dependent term included, evaluated at the estimate). The aggregator
never re-derives a mechanism's probabilities (DESIGN.md, "One definition per
mechanism").

Confidence intervals are Wald intervals ``f̂ ± z·σ̂`` with ``z = Φ⁻¹(1 − α/2)``
for confidence level 1 − α: the estimators are sums of n independent bounded
terms, so the central limit theorem applies (Wang et al., USENIX Security
2017, Section 3, use the same normal approximation). With ``simultaneous=True``
the level is split over the k coordinates (Bonferroni): ``z = Φ⁻¹(1 − α/(2k))``,
so all k intervals cover at once with probability ≥ 1 − α.

Intervals are intersected with the parameter space ([0, 1] for a frequency,
[lo, hi] for a mean): the truth lies there, so the intersection covers exactly
when the unclipped interval does. Consistency post-processing
(`fedldp.aggregator.consistency`) changes the point estimate only; the
interval and the standard error always describe the raw unbiased estimate,
which is reported alongside (``raw_estimate``).

The reports are plain frozen dataclasses. `to_dict()` follows the documented
JSON schema (docs/aggregator.md, "Report JSON schema"); `to_dataframe()` needs
pandas, which is optional.
"""

from __future__ import annotations

import csv
import importlib
import io
import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

from fedldp.aggregator.consistency import Consistency, apply_consistency
from fedldp.aggregator.histogram import (
    DEFAULT_BUCKETS,
    DEFAULT_REPLICATES,
    DEFAULT_SEED,
    Histogram,
)
from fedldp.aggregator.intervals import bonferroni_z

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Estimate, Mechanism

#: Identifies the JSON layout; bump the suffix only for an incompatible change.
FREQUENCY_SCHEMA = "fedldp.report.frequency/v1"
NUMERIC_SCHEMA = "fedldp.report.numeric/v1"

#: Default significance level for heavy-hitter detection.
HEAVY_HITTER_ALPHA = 0.05


def z_value(confidence: float, *, tests: int = 1, sided: int = 2) -> float:
    """Normal quantile for a (Bonferroni-split) confidence level.

    ``z = Φ⁻¹(1 − α/(sided·tests))`` with α = 1 − confidence.
    """
    if not (isinstance(confidence, float | int) and 0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if tests < 1 or sided not in (1, 2):
        raise ValueError("tests must be >= 1 and sided 1 or 2")
    alpha = 1.0 - float(confidence)
    return bonferroni_z(alpha, sided * tests)


def _optional_pandas() -> Any:
    try:
        return importlib.import_module("pandas")
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "to_dataframe() needs pandas, which fedldp does not install; pip install pandas"
        ) from None


def _dec(value: Decimal | None) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class ReportContext:
    """Where a report's data came from (all optional for direct API use).

    `epsilon_charged` is Σ ε charged in the ledger for the counted reports
    (= n · the policy's charge per report, exact); `epsilon_cap` is the per-user cap
    per window.
    """

    policy_id: str | None = None
    policy_version: int | None = None
    metric: str | None = None
    window_start: int | None = None
    epsilon_cap: Decimal | None = None
    epsilon_charged: Decimal | None = None
    shards: int | None = None
    sources: tuple[str, ...] = ()
    window_seconds: int | None = None
    purpose: str | None = None  # the signed policy's purpose, for people reading the report
    # shuffle-model reports only: ShuffledRelease.guarantee_dict() (local ε0, central (ε, δ))
    shuffle: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (decimals as exact strings); "shuffle" only for a shuffled batch."""
        out: dict[str, Any] = {
            "policy_id": self.policy_id,
            "policy_version": self.policy_version,
            "metric": self.metric,
            "window_start": self.window_start,
            "epsilon_cap": _dec(self.epsilon_cap),
            "epsilon_charged": _dec(self.epsilon_charged),
            "shards": self.shards,
            "sources": list(self.sources),
            "window_seconds": self.window_seconds,
            "purpose": self.purpose,
        }
        if self.shuffle is not None:
            out["shuffle"] = dict(self.shuffle)
        return out


@dataclass(frozen=True)
class LabelEstimate:
    """One category's estimated frequency.

    `estimate` is after consistency post-processing (equal to `raw_estimate`
    when none); `std_error`, `ci_low`, `ci_high` and `z_score` describe the raw
    unbiased estimate. `z_score` = raw_estimate / std_error, the evidence that
    the value's frequency is above zero.
    """

    label: str
    estimate: float
    raw_estimate: float
    std_error: float
    ci_low: float
    ci_high: float
    z_score: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "label": self.label,
            "estimate": self.estimate,
            "raw_estimate": self.raw_estimate,
            "std_error": self.std_error,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "z_score": self.z_score,
        }


@dataclass(frozen=True)
class FrequencyReport:
    """A categorical metric's estimated distribution with error bars."""

    mechanism: str
    epsilon: Decimal
    n: int
    confidence: float
    simultaneous: bool
    consistency: str
    estimates: tuple[LabelEstimate, ...]
    context: ReportContext = field(default_factory=ReportContext)

    @property
    def labels(self) -> list[str]:
        """The labels in domain order."""
        return [e.label for e in self.estimates]

    def by_label(self, label: str) -> LabelEstimate:
        """The estimate for `label` (KeyError if not in the domain)."""
        for e in self.estimates:
            if e.label == label:
                return e
        raise KeyError("label not in the report's domain")

    def top(self, count: int) -> list[LabelEstimate]:
        """The `count` largest estimates (post-processed), largest first."""
        return sorted(self.estimates, key=lambda e: e.estimate, reverse=True)[:count]

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON layout (schema `fedldp.report.frequency/v1`)."""
        return {
            "schema": FREQUENCY_SCHEMA,
            "kind": "frequency",
            "mechanism": self.mechanism,
            "epsilon": str(self.epsilon),
            "n": self.n,
            "confidence": self.confidence,
            "simultaneous": self.simultaneous,
            "consistency": self.consistency,
            "context": self.context.to_dict(),
            "estimates": [e.to_dict() for e in self.estimates],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """`to_dict()` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self) -> str:
        """One row per label: label, estimate, raw_estimate, std_error, ci_low, ci_high, z_score."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        columns = ["label", "estimate", "raw_estimate", "std_error", "ci_low", "ci_high", "z_score"]
        writer.writerow(columns)
        for e in self.estimates:
            writer.writerow(
                [repr_float(getattr(e, c)) if c != "label" else csv_text(e.label) for c in columns]
            )
        return buf.getvalue()

    def to_dataframe(self) -> Any:
        """A pandas DataFrame, one row per label (needs pandas installed)."""
        pandas = _optional_pandas()
        return pandas.DataFrame([e.to_dict() for e in self.estimates]).set_index("label")


@dataclass(frozen=True)
class NumericReport:
    """A numeric metric's estimated mean with its confidence interval.

    For a Square Wave (sw) metric `histogram` holds the EMS reconstruction of the
    distribution with its bootstrap bands (fedldp.aggregator.histogram); the
    mean and its interval are still the mechanism's unbiased estimate with its
    exact variance. None for the mean-only mechanisms.
    """

    mechanism: str
    epsilon: Decimal
    n: int
    confidence: float
    mean: float
    std_error: float
    ci_low: float
    ci_high: float
    lo: float | None = None
    hi: float | None = None
    context: ReportContext = field(default_factory=ReportContext)
    histogram: Histogram | None = None

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON layout (schema `fedldp.report.numeric/v1`)."""
        return {
            "schema": NUMERIC_SCHEMA,
            "kind": "numeric",
            "mechanism": self.mechanism,
            "epsilon": str(self.epsilon),
            "n": self.n,
            "confidence": self.confidence,
            "mean": self.mean,
            "std_error": self.std_error,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "range": None if self.lo is None else [self.lo, self.hi],
            "histogram": None if self.histogram is None else self.histogram.to_dict(),
            "context": self.context.to_dict(),
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """`to_dict()` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self) -> str:
        """A header and one row: mean, std_error, ci_low, ci_high, n."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["mean", "std_error", "ci_low", "ci_high", "n"])
        writer.writerow(
            [repr_float(v) for v in (self.mean, self.std_error, self.ci_low, self.ci_high)]
            + [self.n]
        )
        return buf.getvalue()

    def to_dataframe(self) -> Any:
        """A one-row pandas DataFrame (needs pandas installed)."""
        pandas = _optional_pandas()
        skip = ("context", "range", "histogram")
        row = {k: v for k, v in self.to_dict().items() if k not in skip}
        return pandas.DataFrame([row])


#: First characters a spreadsheet reads as the start of a formula (OWASP, "CSV Injection").
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(text: str) -> str:
    """A text cell safe to open in a spreadsheet: a cell starting a formula gets a leading
    single quote (OWASP "CSV Injection"; CWE-1236). Labels may be strings users recorded
    (`pem` discovery), so every CSV writer of labels passes them through here."""
    return "'" + text if text.startswith(FORMULA_START) else text


def repr_float(value: float) -> str:
    """Shortest round-tripping text of a float (CSV cells)."""
    return repr(float(value))


def _check_estimate(estimate: Estimate) -> None:
    import numpy as np

    if estimate.n <= 0:
        raise ValueError("cannot report on zero reports")
    values = np.asarray(estimate.values, dtype=np.float64)
    variances = np.asarray(estimate.variances, dtype=np.float64)
    if values.shape != variances.shape or values.ndim != 1:
        raise ValueError("estimate values and variances must be 1-d vectors of one length")
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(variances))):
        raise ValueError("estimate contains non-finite values")
    if np.any(variances < 0):
        raise ValueError("estimate has a negative variance")


def frequency_report_from_estimate(
    estimate: Estimate,
    labels: Sequence[str] | None,
    *,
    mechanism_id: str,
    epsilon: Decimal,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    context: ReportContext | None = None,
) -> FrequencyReport:
    """Build a `FrequencyReport` from an `Estimate` already computed.

    `labels` names the coordinates in index order (None: "0", "1", ...).
    `consistency` None or "none" keeps the raw estimate as the point estimate.
    """
    import numpy as np

    _check_estimate(estimate)
    method = Consistency.parse(consistency)
    raw = np.asarray(estimate.values, dtype=np.float64)
    k = raw.size
    names = [str(i) for i in range(k)] if labels is None else [str(x) for x in labels]
    if len(names) != k:
        raise ValueError(f"{len(names)} labels for an estimate over {k} values")
    se = np.sqrt(np.asarray(estimate.variances, dtype=np.float64))
    z = z_value(confidence, tests=k if simultaneous else 1)
    low = np.clip(raw - z * se, 0.0, 1.0)
    high = np.clip(raw + z * se, 0.0, 1.0)
    point = apply_consistency(method, raw, se)
    # z = raw / se; a zero standard error (degenerate) reports z = 0 (no evidence claimed).
    zs = np.divide(raw, se, out=np.zeros_like(raw), where=se > 0)
    rows = tuple(
        LabelEstimate(
            label=name, estimate=e, raw_estimate=r, std_error=s, ci_low=lo, ci_high=hi, z_score=zz
        )
        for name, e, r, s, lo, hi, zz in zip(
            names,
            point.tolist(),
            raw.tolist(),
            se.tolist(),
            low.tolist(),
            high.tolist(),
            zs.tolist(),
            strict=True,
        )
    )
    return FrequencyReport(
        mechanism=mechanism_id,
        epsilon=epsilon,
        n=int(estimate.n),
        confidence=float(confidence),
        simultaneous=bool(simultaneous),
        consistency=method.value,
        estimates=rows,
        context=context or ReportContext(),
    )


def frequency_report(
    mechanism: Mechanism,  # type: ignore[type-arg]
    statistic: object,
    labels: Sequence[str] | None,
    *,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    context: ReportContext | None = None,
) -> FrequencyReport:
    """Estimate a categorical metric's frequencies from a sufficient statistic.

    `statistic` is the mechanism's own additive statistic (e.g. built with
    `mechanism.accumulate`, read from the ledger, or merged over collectors).
    Standard errors come from the mechanism's exact variance; intervals are at
    level `confidence`, Bonferroni-simultaneous over the k values if
    `simultaneous`. `consistency` ("norm-sub", "base-cut", "project", or
    None/"none") post-processes the point estimate only.
    """
    estimate = mechanism.estimate(statistic)
    return frequency_report_from_estimate(
        estimate,
        labels,
        mechanism_id=mechanism.wire_id,
        epsilon=mechanism.epsilon,
        confidence=confidence,
        simultaneous=simultaneous,
        consistency=consistency,
        context=context,
    )


def numeric_report_from_estimate(
    estimate: Estimate,
    *,
    mechanism_id: str,
    epsilon: Decimal,
    confidence: float = 0.95,
    value_range: tuple[float, float] | None = None,
    context: ReportContext | None = None,
    histogram: Histogram | None = None,
) -> NumericReport:
    """Build a `NumericReport` from a one-coordinate `Estimate` of the mean."""
    _check_estimate(estimate)
    if len(estimate.values) != 1:
        raise ValueError("a numeric estimate has exactly one coordinate (the mean)")
    mean = float(estimate.values[0])
    se = math.sqrt(float(estimate.variances[0]))
    z = z_value(confidence)
    low, high = mean - z * se, mean + z * se
    lo = hi = None
    if value_range is not None:
        lo, hi = float(value_range[0]), float(value_range[1])
        if not lo < hi:
            raise ValueError("value range must have lo < hi")
        low, high = min(max(low, lo), hi), min(max(high, lo), hi)
    return NumericReport(
        mechanism=mechanism_id,
        epsilon=epsilon,
        n=int(estimate.n),
        confidence=float(confidence),
        mean=mean,
        std_error=se,
        ci_low=low,
        ci_high=high,
        lo=lo,
        hi=hi,
        context=context or ReportContext(),
        histogram=histogram,
    )


@dataclass(frozen=True)
class HistogramOptions:
    """What `numeric_report` asks of the EMS histogram of a Square Wave metric.

    Buckets B over [lo, hi], bootstrap replicates R and the bootstrap's seed
    (the bands are deterministic given it; fedldp.aggregator.histogram).
    """

    buckets: int = DEFAULT_BUCKETS
    replicates: int = DEFAULT_REPLICATES
    seed: int = DEFAULT_SEED


#: The histogram a Square Wave report carries unless the caller asks otherwise.
DEFAULT_HISTOGRAM = HistogramOptions()


def numeric_report(
    mechanism: Mechanism,  # type: ignore[type-arg]
    statistic: object,
    *,
    confidence: float = 0.95,
    value_range: tuple[float, float] | tuple[Decimal, Decimal] | None = None,
    context: ReportContext | None = None,
    histogram_options: HistogramOptions | None = DEFAULT_HISTOGRAM,
) -> NumericReport:
    """Estimate a numeric metric's mean with a CI from a numeric mechanism's statistic.

    `value_range` is the policy's numeric range; the interval is intersected with it.
    For Square Wave the report also carries the EMS histogram, its bands at the
    same `confidence` (`histogram_options`; None: the mean only, no histogram).
    """
    from fedldp.aggregator.histogram import histogram
    from fedldp.client.mechanisms.base import CountStatistic
    from fedldp.client.mechanisms.square_wave import SquareWave

    estimate = mechanism.estimate(statistic)
    hist = None
    if isinstance(mechanism, SquareWave) and histogram_options is not None:
        assert isinstance(statistic, CountStatistic)  # the mechanism's own statistic
        opts = histogram_options
        hist = histogram(
            mechanism,
            statistic,
            buckets=opts.buckets,
            confidence=confidence,
            replicates=opts.replicates,
            seed=opts.seed,
        )
    rng = None if value_range is None else (float(value_range[0]), float(value_range[1]))
    return numeric_report_from_estimate(
        estimate,
        mechanism_id=mechanism.wire_id,
        epsilon=mechanism.epsilon,
        confidence=confidence,
        value_range=rng,
        context=context,
        histogram=hist,
    )


# --- heavy hitters ---


@dataclass(frozen=True)
class HeavyHitter:
    """A value whose frequency is significantly above zero, with the evidence.

    `lower_bound` is the one-sided Bonferroni lower confidence bound
    raw − Φ⁻¹(1 − α/k)·σ̂ (> 0 by selection); `p_value` is the one-sided
    p-value of H0: f = 0, Bonferroni-adjusted (min(1, k·p)).
    """

    label: str
    estimate: float
    raw_estimate: float
    std_error: float
    z_score: float
    lower_bound: float
    p_value: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dict(self.__dict__)


def heavy_hitters(
    report: FrequencyReport, *, alpha: float = HEAVY_HITTER_ALPHA, top: int | None = None
) -> list[HeavyHitter]:
    """The values above the noise floor, largest raw estimate first.

    A value is a heavy hitter when its raw estimate exceeds the Bonferroni noise
    floor Φ⁻¹(1 − α/k)·σ̂_v, i.e. the one-sided simultaneous lower bound is above
    zero. Over all k values the chance that any value with true frequency 0 is
    listed is at most α (normal approximation; σ̂ includes the plug-in
    frequency term, which only widens it). `top` keeps the first `top`.
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    k = len(report.estimates)
    z = bonferroni_z(alpha, k)
    found: list[HeavyHitter] = []
    for e in report.estimates:
        lower = e.raw_estimate - z * e.std_error
        if lower <= 0:
            continue
        p_one = 1.0 - NormalDist().cdf(e.z_score)
        found.append(
            HeavyHitter(
                label=e.label,
                estimate=e.estimate,
                raw_estimate=e.raw_estimate,
                std_error=e.std_error,
                z_score=e.z_score,
                lower_bound=lower,
                p_value=min(1.0, k * p_one),
            )
        )
    found.sort(key=lambda h: h.raw_estimate, reverse=True)
    return found if top is None else found[:top]


# --- numeric distributions via a categorical oracle over buckets ---


def bucket_edges(lo: Decimal, hi: Decimal, buckets: int) -> list[Decimal]:
    """`buckets + 1` exact, equally spaced edges of [lo, hi]."""
    if buckets < 1 or not lo < hi:
        raise ValueError("need buckets >= 1 and lo < hi")
    width = (hi - lo) / buckets
    return [lo + width * i for i in range(buckets)] + [hi]


def bucket_labels(lo: Decimal, hi: Decimal, buckets: int) -> list[str]:
    """Labels "[a, b)" for the buckets (the last one closed), for a categorical policy."""
    edges = bucket_edges(lo, hi, buckets)
    labels = [f"[{a}, {b})" for a, b in itertools.pairwise(edges)]
    labels[-1] = labels[-1][:-1] + "]"
    return labels


def bucket_index(value: float | Decimal, lo: Decimal, hi: Decimal, buckets: int) -> int:
    """The device-side bucket of a value (clipped into [lo, hi] first)."""
    v = min(max(Decimal(value) if not isinstance(value, Decimal) else value, lo), hi)
    idx = int((v - lo) * buckets / (hi - lo))
    return min(idx, buckets - 1)


@dataclass(frozen=True)
class DistributionReport:
    """A numeric metric's distribution over its range, from bucketized frequencies.

    `frequencies` is the consistent (non-negative, sum 1) histogram; `mean` is
    its midpoint mean (a plug-in, biased by bucket width at most (hi−lo)/(2·B)).
    """

    edges: tuple[float, ...]
    frequencies: FrequencyReport
    mean: float


def distribution_report(
    mechanism: Mechanism,  # type: ignore[type-arg]
    statistic: object,
    lo: Decimal,
    hi: Decimal,
    *,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str = Consistency.NORM_SUB,
) -> DistributionReport:
    """The distribution of a numeric value collected as a bucket index.

    Method: the device maps its value to one of B equal buckets of [lo, hi]
    (`bucket_index`) and reports it through a categorical frequency oracle
    whose domain is the B buckets (`bucket_labels`); the aggregator estimates
    the bucket frequencies with their exact variance and makes them consistent
    (Norm-Sub by default). B = the mechanism's domain size.
    """
    estimate = mechanism.estimate(statistic)
    buckets = len(estimate.values)
    edges = bucket_edges(lo, hi, buckets)
    freq = frequency_report_from_estimate(
        estimate,
        bucket_labels(lo, hi, buckets),
        mechanism_id=mechanism.wire_id,
        epsilon=mechanism.epsilon,
        confidence=confidence,
        simultaneous=simultaneous,
        consistency=consistency,
    )
    mids = [float((a + b) / 2) for a, b in itertools.pairwise(edges)]
    mean = sum(m * e.estimate for m, e in zip(mids, freq.estimates, strict=True))
    return DistributionReport(edges=tuple(float(e) for e in edges), frequencies=freq, mean=mean)


def truth_vector(
    labels: Sequence[str], truth: Mapping[str, float] | Sequence[float]
) -> list[float]:
    """Truth per label in domain order, from a mapping or a sequence."""
    if isinstance(truth, Mapping):
        return [float(truth.get(label, 0.0)) for label in labels]
    values = [float(t) for t in truth]
    if len(values) != len(labels):
        raise ValueError("truth must have one value per label")
    return values
