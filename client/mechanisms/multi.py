"""Multi-attribute collection: one report covers d attributes (categorical and numeric).

Wang, Xiao, Yang, Zhao, Hui, Shin, Shin, Yu, "Collecting and Analyzing
Multidimensional Data with Local Differential Privacy", ICDE 2019, Section IV;
Arcolezi, Couchot, Al Bouna, Xiao, "Random Sampling Plus Fake Data:
Multidimensional Frequency Estimates With Local Differential Privacy", CIKM
2021, Section 3 (their SPL and SMP protocols). Two registered mechanisms over a
`MultiMetric` of 2..`MAX_ATTRIBUTES` attributes, each attribute with its own
registered categorical or numeric mechanism M_j (built through the registry,
so every exactness guarantee of M_j carries over):

* ``multi-split`` (SPL): every report holds one part per attribute, in
  attribute order, M_j run at ε_j = ε/d. ε/d is rounded toward zero to
  `SPLIT_DIGITS` significant digits, so d·ε_j <= ε exactly (the shortfall is
  below d·10^(1 - SPLIT_DIGITS)·ε/d relative). The parts use independent
  randomness, so for every output the probability ratio between two inputs is
  the product of the attributes' ratios, <= e^(d ε_j) <= e^ε (sequential
  composition; the exact law is `exact_probability`).
* ``multi-sample`` (SMP): the device draws one attribute J uniformly with the
  OS CSPRNG (`randrange(d)`, exact, independent of the values) and reports
  (J, M_J(x_J)) with the full ε. P[(j, y) | x] = P_j(y | x_j)/d, so the ratio
  is M_j's, <= e^ε.

Either way one report is charged ε once (`report_charge`, the ledger's per
report charge): the mechanisms are not memoized (memoized attribute mechanisms
are refused, their charge would differ from their ε).

Estimates (`attribute_estimates`). Let n be the number of reports.

* split: attribute j's estimate is M_j's own unbiased estimator over the n
  parts j, and its variance is M_j's exact variance at ε_j with n reports:
  Var_split,j = V_j(ε/d, n).
* sample: n_j reports drew attribute j; given n_j (n_j ~ Bin(n, 1/d), the
  draw independent of the values), they are a uniformly random subset S_j of
  the n users, and M_j's estimator over them (at ε) is unbiased for S_j's
  frequency (mean), hence for the population's. The variance reported is the
  one conditional on the realized n_j (the estimator is conditionally unbiased,
  so the unconditional variance is its expectation over n_j):

      Var_sample,j = V_j(ε, n_j) + σ_j^2 (n - n_j) / (n_j (n - 1)),

  V_j(ε, n_j) the mechanism's variance averaged over S_j (it is linear in the
  frequency for a frequency oracle, an average of per-user terms for a numeric
  mechanism, so the average is V_j at the population's values), and the second
  term the variance of a simple random sample's frequency or mean drawn
  without replacement (Cochran, Sampling Techniques, 3rd ed., Theorem 2.2), with
  σ_j^2 = f_v (1 - f_v) for a frequency and the population variance of the
  normalized values t for a mean (times ((hi - lo)/2)^2). With n_j = 0 the
  attribute has no estimate yet.

Plug-in variances (estimates). Split: M_j's own. Sample: M_j's own at n_j plus
σ_j^2 estimated as f̂ (1 - f̂) (f̂ clipped to [0, 1]) or, for a mean, as
m̂2 - t̂^2 with m̂2 the numeric plug-in of E[t^2] (numeric.py; the worst case 1
when the mechanism's outputs carry no information on t^2).

`auto` (`choose_mode`). The total variance at the uniform reference, in
scale-free units (a frequency per value; a mean in half-range units t), per
report (times n, large-n form with n_j = n/d):

    split:  Σ_j u_j(ε/d)
    sample: Σ_j (d u_j(ε) + (d - 1) s_j)

with, at uniform frequencies f_v = 1/k (Wang et al., USENIX Security 2017,
eq. (2)),  u_j = (f p*(1 - p*) + (1 - f) q*(1 - q*)) / (p* - q*)^2 and
s_j = f (1 - f); and for a numeric attribute with t uniform on [-1, 1]
(numeric.py, Var[y | t] = c0 + c2 (t^2 + r(t)) - t^2, E[t^2] = 1/3,
E[r] = (2/J)^2 / 6): u_j = c0 + c2 (1/3 + 2/(3 J^2)) - 1/3 and s_j = 1/3.
The lower total wins; a tie goes to split. An attribute whose id is "auto"
is resolved per mode (`auto.choose_frequency_oracle` at that mode's ε) before
the comparison.

Wire: MultiPayload (`MultiOutput`); split: exactly d parts, part i for
attribute i; sample: exactly one part. Batch layout: `MultiBatch`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Context, Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any, ClassVar

from fedldp.client.mechanisms.base import (
    AttributeOutput,
    AttributeSpec,
    Estimate,
    Mechanism,
    MultiMetric,
    MultiOutput,
    NumericOutput,
    Output,
    OutputDomainError,
    system_random,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

#: Fewest and most attributes of a multi-attribute metric.
MIN_ATTRIBUTES = 2
MAX_ATTRIBUTES = 16
#: Significant digits of the split ε/d (rounded toward zero).
SPLIT_DIGITS = 20
#: Wire ids of the two modes.
SPLIT_ID = "multi-split"
SAMPLE_ID = "multi-sample"
MULTI_IDS = (SPLIT_ID, SAMPLE_ID)


def split_epsilon(epsilon: Decimal, d: int) -> Decimal:
    """ε/d rounded toward zero to SPLIT_DIGITS significant digits: d · result <= ε exactly.

    ValueError when d < 1 or the share rounds to zero."""
    if d < 1:
        raise ValueError(f"epsilon cannot be split over {d} attributes")
    share = Context(prec=SPLIT_DIGITS, rounding=ROUND_DOWN).divide(epsilon, d)
    if share <= 0 or Context(prec=SPLIT_DIGITS + 10).multiply(share, d) > epsilon:
        raise ValueError(f"epsilon {epsilon} cannot be split over {d} attributes")
    return share


def attribute_epsilon(mode: str, epsilon: Decimal, d: int) -> Decimal:
    """The ε each attribute mechanism runs at: ε/d (split, rounded down) or ε (sample)."""
    if mode == SPLIT_ID:
        return split_epsilon(epsilon, d)
    if mode == SAMPLE_ID:
        return epsilon
    raise ValueError(f"unknown multi-attribute mode {mode!r}; use one of {MULTI_IDS}")


def build_attribute(spec: AttributeSpec, epsilon: Decimal) -> Mechanism:  # type: ignore[type-arg]
    """Attribute `spec`'s mechanism at `epsilon`, through the registry.

    Refused (ValueError): a multi-attribute id (no nesting), "auto" (resolve it
    at authoring), and mechanisms charged other than their ε per report
    (memoized ones: their permanent responses would need per-attribute device state).
    """
    from fedldp.client.mechanisms.registry import create

    if spec.mechanism_id in MULTI_IDS:
        raise ValueError(f"attribute {spec.name!r}: a multi-attribute mechanism cannot be nested")
    if spec.mechanism_id == "auto":
        raise ValueError(f"attribute {spec.name!r}: resolve 'auto' before signing")
    from fedldp.client.mechanisms.memo import Memoized

    try:
        mechanism = create(spec.mechanism_id, epsilon, spec.metric, dict(spec.params))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"attribute {spec.name!r}: {exc}") from None
    except KeyError as exc:  # UnknownMechanismError: its message is args[0]
        raise ValueError(f"attribute {spec.name!r}: {exc.args[0] if exc.args else exc}") from None
    if isinstance(mechanism, Memoized) or mechanism.report_charge != mechanism.epsilon:
        raise ValueError(
            f"attribute {spec.name!r}: memoized mechanism {spec.mechanism_id!r} cannot be an "
            "attribute mechanism (its charge per report differs from its epsilon)"
        )
    return mechanism


@dataclass
class MultiStatistic:
    """Additive statistic: each attribute mechanism's statistic, and the report count n."""

    parts: list[Any]
    n: int = 0

    def merge(self, other: MultiStatistic) -> None:
        """Add another partial statistic in place (each part with its own exact merge)."""
        if len(other.parts) != len(self.parts):
            raise ValueError("cannot merge statistics of different attribute counts")
        for mine, theirs in zip(self.parts, other.parts, strict=True):
            mine.merge(theirs)
        self.n += other.n


@dataclass(frozen=True)
class MultiBatch:
    """Batch layout of `perturb_batch`: per attribute, its mechanism's batch outputs.

    split: `parts[j]` covers every report (in order), `chosen` is None.
    sample: `chosen[i]` is the attribute report i drew, `parts[j]` the outputs of
    the reports that drew j, in report order.
    """

    parts: tuple[Any, ...]
    chosen: Any = None


@dataclass(frozen=True)
class AttributeEstimate:
    """One attribute's estimate: its name, spec, the reports it came from and the estimate."""

    spec: AttributeSpec
    reports: int
    estimate: Estimate


@dataclass(frozen=True)
class ModeScores:
    """`auto`'s comparison: total variance per report at the uniform reference, per mode."""

    split: float
    sample: float
    split_ids: tuple[str, ...] = field(default=())
    sample_ids: tuple[str, ...] = field(default=())

    @property
    def choice(self) -> str:
        """The mode with the lower total (split on a tie)."""
        return SAMPLE_ID if self.sample < self.split else SPLIT_ID


class MultiAttribute(Mechanism[Sequence[Any], MultiStatistic]):
    """Base of multi-split and multi-sample: attribute mechanisms, checks, statistic."""

    mode: ClassVar[str]

    def __init__(self, epsilon: Decimal, metric: MultiMetric) -> None:
        super().__init__(epsilon)
        if not isinstance(metric, MultiMetric):
            raise ValueError(f"{self.wire_id} needs a multi-attribute metric")
        d = len(metric.attributes)
        if not MIN_ATTRIBUTES <= d <= MAX_ATTRIBUTES:
            raise ValueError(
                f"a multi-attribute metric needs {MIN_ATTRIBUTES}..{MAX_ATTRIBUTES} "
                f"attributes, got {d}"
            )
        self.d = d
        self.attributes = metric.attributes
        #: The ε each attribute mechanism runs at.
        self.attribute_epsilon = attribute_epsilon(self.wire_id, epsilon, d)
        self.mechanisms: tuple[Mechanism, ...] = tuple(  # type: ignore[type-arg]
            build_attribute(spec, self.attribute_epsilon) for spec in metric.attributes
        )

    # --- device ---

    def _values(self, value: Sequence[Any]) -> Sequence[Any]:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            raise ValueError(f"{self.wire_id} takes a sequence of {self.d} attribute values")
        if len(value) != self.d:
            raise ValueError(f"{self.wire_id} takes exactly {self.d} attribute values")
        return value

    def exact_probability(self, value: Sequence[Any], output: Output) -> Fraction:
        """P[perturb(value) == output], exactly, from the attribute mechanisms' exact laws."""
        values = self._values(value)
        assert isinstance(output, MultiOutput)
        total = Fraction(1)
        for j, part in output.parts:
            total *= attribute_probability(self.mechanisms[j], values[j], part)
        return total * self._choice_probability()

    def _choice_probability(self) -> Fraction:
        return Fraction(1)

    # --- collector ---

    def check_output(self, output: Output) -> None:
        """The part count and order of the mode, then each part by its attribute's mechanism."""
        if not isinstance(output, MultiOutput):
            raise OutputDomainError(
                "WRONG_PAYLOAD_TYPE", f"{self.wire_id} expects a multi-attribute payload"
            )
        self._check_parts(output.parts)
        for j, part in output.parts:
            try:
                self.mechanisms[j].check_output(part)
            except OutputDomainError as exc:
                raise OutputDomainError(exc.reason, f"attribute {j}: {exc}") from None

    def _check_parts(self, parts: tuple[tuple[int, AttributeOutput], ...]) -> None:
        raise NotImplementedError

    def new_statistic(self) -> MultiStatistic:
        return MultiStatistic(parts=[m.new_statistic() for m in self.mechanisms])

    def accumulate(self, statistic: MultiStatistic, output: Output) -> None:
        self.check_output(output)
        assert isinstance(output, MultiOutput)
        for j, part in output.parts:
            self.mechanisms[j].accumulate(statistic.parts[j], part)
        statistic.n += 1

    def merge_statistics(self, into: MultiStatistic, other: MultiStatistic) -> None:
        for j, mechanism in enumerate(self.mechanisms):
            mechanism.merge_statistics(into.parts[j], other.parts[j])
        into.n += other.n

    def statistic_to_json(self, statistic: MultiStatistic) -> str:
        """{"n": n, "parts": [each attribute mechanism's exact JSON text]}."""
        parts = [
            m.statistic_to_json(s) for m, s in zip(self.mechanisms, statistic.parts, strict=True)
        ]
        return json.dumps({"n": statistic.n, "parts": parts}, separators=(",", ":"))

    def statistic_from_json(self, text: str) -> MultiStatistic:
        data = json.loads(text)
        parts = data["parts"]
        if not isinstance(parts, list) or len(parts) != self.d:
            raise ValueError(f"stored statistic has not {self.d} attribute parts")
        return MultiStatistic(
            parts=[m.statistic_from_json(t) for m, t in zip(self.mechanisms, parts, strict=True)],
            n=int(data["n"]),
        )

    # --- aggregator ---

    def attribute_estimates(self, statistic: MultiStatistic) -> tuple[AttributeEstimate, ...]:
        """Every attribute's unbiased estimate and its variance (module docstring)."""
        if statistic.n <= 0:
            raise ValueError("cannot estimate from zero reports")
        out = []
        for j, (spec, mechanism) in enumerate(zip(self.attributes, self.mechanisms, strict=True)):
            part = statistic.parts[j]
            if part.n <= 0:
                raise ValueError(
                    f"attribute {spec.name!r} has no reports yet (each report carries one "
                    "attribute under multi-sample); wait for more reports"
                )
            estimate = mechanism.estimate(part)
            out.append(
                AttributeEstimate(
                    spec, part.n, self._adjust(mechanism, part, estimate, statistic.n)
                )
            )
        return tuple(out)

    def _adjust(self, mechanism: Any, part: Any, estimate: Estimate, n: int) -> Estimate:
        return estimate

    def estimate(self, statistic: MultiStatistic) -> Estimate:
        """The attributes' estimates concatenated in attribute order (see `attribute_estimates`)."""
        import numpy as np

        parts = self.attribute_estimates(statistic)
        return Estimate(
            n=statistic.n,
            values=np.concatenate([p.estimate.values for p in parts]),
            variances=np.concatenate([p.estimate.variances for p in parts]),
        )

    def exact_variances(
        self, values: Sequence[Any], reports: Sequence[int] | None = None
    ) -> list[npt.NDArray[np.float64]]:
        """Each attribute's exact estimate variance for this population (module docstring).

        `values[j]` holds the n users' true values of attribute j (indices or
        numbers); `reports[j]` the realized n_j under sample (ignored by split).
        """
        raise NotImplementedError

    # --- simulation ---

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> MultiBatch:
        raise NotImplementedError

    def accumulate_batch(self, statistic: MultiStatistic, outputs: Any) -> None:
        """Add a `MultiBatch` (as from `perturb_batch`)."""
        if not isinstance(outputs, MultiBatch) or len(outputs.parts) != self.d:
            raise OutputDomainError("WRONG_LENGTH", f"{self.wire_id} expects {self.d} batch parts")
        reports = self._batch_reports(outputs)
        for j, mechanism in enumerate(self.mechanisms):
            if _batch_size(outputs.parts[j]):
                mechanism.accumulate_batch(statistic.parts[j], outputs.parts[j])
        statistic.n += reports

    def _batch_reports(self, outputs: MultiBatch) -> int:
        raise NotImplementedError

    def batch_outputs(self, batch: MultiBatch) -> list[MultiOutput]:
        """The reports of a `MultiBatch` as `MultiOutput`s, in report order (audits, tests)."""
        distinct, inverse = self.distinct_outputs(batch)
        return [distinct[i] for i in inverse.tolist()]

    def distinct_outputs(
        self, batch: MultiBatch
    ) -> tuple[list[MultiOutput], npt.NDArray[np.int64]]:
        """The distinct reports of a `MultiBatch`, and per report (in report order) the
        index of its own among them: `batch_outputs(batch)[i] == distinct[inverse[i]]`.

        Two reports are the same exactly when their wire payloads are: every part's
        attribute, and its payload bits (a numeric part by its binary64 pattern, so
        +0.0 and -0.0 differ). Found with numpy over the batch arrays; one
        `MultiOutput` is built per distinct report (a batch repeats few of them)."""
        import numpy as np

        reports = self._batch_reports(batch)
        inverse = np.empty(reports, dtype=np.int64)
        distinct: list[MultiOutput] = []
        if batch.chosen is None:  # split: a report is the row of all its parts' codes
            codes = [_part_codes(m, p) for m, p in zip(self.mechanisms, batch.parts, strict=True)]
            first, inverse[:] = _unique_rows(np.hstack(codes))
            for i in first.tolist():
                parts = zip(self.mechanisms, batch.parts, strict=True)
                distinct.append(
                    MultiOutput(tuple((j, _part_output(m, p, i)) for j, (m, p) in enumerate(parts)))
                )
            return distinct, inverse
        chosen = np.asarray(batch.chosen, dtype=np.int64)
        for j, (m, p) in enumerate(zip(self.mechanisms, batch.parts, strict=True)):
            rows = np.flatnonzero(chosen == j)  # part j holds these reports, in order
            if rows.size == 0:
                continue
            first, local = _unique_rows(_part_codes(m, p))
            inverse[rows] = len(distinct) + local
            distinct.extend(MultiOutput(((j, _part_output(m, p, i)),)) for i in first.tolist())
        return distinct, inverse


class MultiSplit(MultiAttribute):
    """Every attribute in every report, each at ε/d (Wang et al. ICDE 2019, Section IV-A)."""

    wire_id = SPLIT_ID

    def perturb(self, value: Sequence[Any], *, rng: random.Random | None = None) -> MultiOutput:
        values = self._values(value)
        r = rng if rng is not None else system_random()
        return MultiOutput(
            tuple((j, m.perturb(values[j], rng=r)) for j, m in enumerate(self.mechanisms))  # type: ignore[misc]
        )

    def _check_parts(self, parts: tuple[tuple[int, AttributeOutput], ...]) -> None:
        if len(parts) != self.d:
            raise OutputDomainError(
                "WRONG_LENGTH", f"multi-split expects exactly {self.d} parts, one per attribute"
            )
        for position, (j, _) in enumerate(parts):
            if j != position:
                raise OutputDomainError(
                    "OUT_OF_DOMAIN", f"multi-split part {position} must be attribute {position}"
                )

    def exact_variances(
        self, values: Sequence[Any], reports: Sequence[int] | None = None
    ) -> list[npt.NDArray[np.float64]]:
        return [
            _mechanism_variance(m, v, len(v)) for m, v in zip(self.mechanisms, values, strict=True)
        ]

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> MultiBatch:
        """`values[j]`: attribute j's n values; every attribute perturbed for every report."""
        if len(values) != self.d:
            raise ValueError(f"{self.wire_id} takes {self.d} attribute value arrays")
        sizes = {len(v) for v in values}
        if len(sizes) != 1:
            raise ValueError("every attribute needs the same number of values")
        return MultiBatch(
            tuple(m.perturb_batch(v, rng) for m, v in zip(self.mechanisms, values, strict=True))
        )

    def _batch_reports(self, outputs: MultiBatch) -> int:
        sizes = {_batch_size(p) for p in outputs.parts}
        if len(sizes) != 1 or outputs.chosen is not None:
            raise OutputDomainError(
                "WRONG_LENGTH", "multi-split batch parts must cover every report"
            )
        return sizes.pop()


class MultiSample(MultiAttribute):
    """One uniformly drawn attribute per report, at the full ε (Wang et al. ICDE 2019,
    Section IV-B; Arcolezi et al. CIKM 2021, SMP)."""

    wire_id = SAMPLE_ID

    def perturb(self, value: Sequence[Any], *, rng: random.Random | None = None) -> MultiOutput:
        values = self._values(value)
        r = rng if rng is not None else system_random()
        j = r.randrange(self.d)
        return MultiOutput(((j, self.mechanisms[j].perturb(values[j], rng=r)),))  # type: ignore[arg-type]

    def _choice_probability(self) -> Fraction:
        return Fraction(1, self.d)

    def _check_parts(self, parts: tuple[tuple[int, AttributeOutput], ...]) -> None:
        if len(parts) != 1:
            raise OutputDomainError("WRONG_LENGTH", "multi-sample expects exactly one part")
        if not 0 <= parts[0][0] < self.d:
            raise OutputDomainError("OUT_OF_DOMAIN", f"attribute index outside [0, {self.d})")

    def _adjust(self, mechanism: Any, part: Any, estimate: Estimate, n: int) -> Estimate:
        """Add the subsample term σ̂^2 (n - n_j) / (n_j (n - 1)) (module docstring)."""
        import numpy as np

        n_j = part.n
        factor = (n - n_j) / (n_j * (n - 1)) if n > 1 else 0.0
        sigma2 = _plug_in_population_variance(mechanism, part, estimate)
        return Estimate(
            n=estimate.n,
            values=estimate.values,
            variances=np.asarray(estimate.variances + sigma2 * factor, dtype=np.float64),
        )

    def exact_variances(
        self, values: Sequence[Any], reports: Sequence[int] | None = None
    ) -> list[npt.NDArray[np.float64]]:
        if reports is None or len(reports) != self.d:
            raise ValueError("multi-sample's exact variance needs the realized n_j per attribute")
        out = []
        for m, v, n_j in zip(self.mechanisms, values, reports, strict=True):
            n = len(v)
            factor = (n - n_j) / (n_j * (n - 1)) if n > 1 else 0.0
            out.append(_mechanism_variance(m, v, n_j) + _population_variance(m, v) * factor)
        return out

    def perturb_batch(self, values: Any, rng: np.random.Generator) -> MultiBatch:
        """Each report draws its attribute uniformly; only that attribute is perturbed."""
        import numpy as np

        if len(values) != self.d:
            raise ValueError(f"{self.wire_id} takes {self.d} attribute value arrays")
        n = len(values[0])
        if any(len(v) != n for v in values):
            raise ValueError("every attribute needs the same number of values")
        chosen = rng.integers(0, self.d, size=n, dtype=np.int64)
        parts = tuple(
            m.perturb_batch(np.asarray(v)[chosen == j], rng)
            for j, (m, v) in enumerate(zip(self.mechanisms, values, strict=True))
        )
        return MultiBatch(parts, chosen)

    def _batch_reports(self, outputs: MultiBatch) -> int:
        import numpy as np

        if outputs.chosen is None:
            raise OutputDomainError(
                "WRONG_LENGTH", "multi-sample batches name each report's attribute"
            )
        chosen = np.asarray(outputs.chosen, dtype=np.int64)
        counts = np.bincount(chosen, minlength=self.d) if chosen.size else np.zeros(self.d)
        if counts.shape[0] != self.d or (chosen.size and chosen.min() < 0):
            raise OutputDomainError("OUT_OF_DOMAIN", f"attribute index outside [0, {self.d})")
        if any(int(counts[j]) != _batch_size(p) for j, p in enumerate(outputs.parts)):
            raise OutputDomainError(
                "WRONG_LENGTH", "multi-sample batch parts disagree with the draws"
            )
        return int(chosen.shape[0])


# --- helpers over the attribute mechanisms (frequency oracles or numeric mechanisms) ---


def attribute_probability(mechanism: Any, value: Any, output: AttributeOutput) -> Fraction:
    """P[mechanism.perturb(value) == output] exactly (frequency oracle or numeric grid)."""
    from fedldp.client.mechanisms.numeric import NumericMechanism

    if isinstance(mechanism, NumericMechanism):
        assert isinstance(output, NumericOutput)
        return mechanism.wire_probability(value, output.value)
    result: Fraction = mechanism.exact_probability(value, output)
    return result


def _part_outputs(mechanism: Any, batch: Any) -> list[AttributeOutput]:
    """One attribute mechanism's batch layout as outputs (the layouts its module documents:
    indices, packed bit rows, (seeds, values), or float64 table values)."""
    import numpy as np
    from fedldp.client.mechanisms.base import BitVectorOutput, CategoryOutput, HashedOutput

    if _is_numeric(mechanism):
        return [NumericOutput(float(y)) for y in batch]
    if isinstance(batch, tuple):
        seeds, values = batch
        return [HashedOutput(int(a), int(b)) for a, b in zip(seeds, values, strict=True)]
    array = np.asarray(batch)
    if array.ndim == 2:
        return [BitVectorOutput(row.tobytes(), mechanism.k) for row in array]
    return [CategoryOutput(int(i)) for i in array]


def _part_output(mechanism: Any, batch: Any, i: int) -> AttributeOutput:
    """Report i of one attribute mechanism's batch layout, as `_part_outputs` builds it."""
    if isinstance(batch, tuple):
        return _part_outputs(mechanism, tuple(part[i : i + 1] for part in batch))[0]
    return _part_outputs(mechanism, batch[i : i + 1])[0]


def _part_codes(mechanism: Any, batch: Any) -> npt.NDArray[np.uint64]:
    """One attribute mechanism's batch layout as uint64 words, one row per report, equal
    rows exactly when `_part_outputs` gives equal outputs (numeric: the binary64 bits;
    (seeds, values); a row's bytes zero-padded to whole 8-byte words; an index)."""
    import numpy as np

    if _is_numeric(mechanism):
        floats = np.ascontiguousarray(batch, dtype=np.float64)
        return floats.view(np.uint64).reshape(-1, 1)
    if isinstance(batch, tuple):
        return np.stack([np.asarray(part).astype(np.uint64) for part in batch], axis=1)
    array = np.asarray(batch)
    if array.ndim == 2:  # the bytes of each row, as `row.tobytes()` gives them
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(array.shape[0], -1)
        padded = np.zeros((raw.shape[0], -(-raw.shape[1] // 8) * 8), dtype=np.uint8)
        padded[:, : raw.shape[1]] = raw
        return padded.view("<u8").astype(np.uint64)
    return array.astype(np.uint64).reshape(-1, 1)


def _unique_rows(
    codes: npt.NDArray[np.uint64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(the first row of each distinct row, each row's distinct index) of `codes` (n, w).

    Column by column: the distinct rows so far (index r < m) and the column's distinct
    values (index c < u) give the row index r u + c < n^2, renumbered (1-D sorts)."""
    import numpy as np

    combined = np.zeros(codes.shape[0], dtype=np.int64)
    for column in codes.T:
        values, index = np.unique(column, return_inverse=True)
        combined = combined * values.shape[0] + index.reshape(-1)
        _, combined = np.unique(combined, return_inverse=True)
        combined = combined.reshape(-1).astype(np.int64)
    _, first = np.unique(combined, return_index=True)
    return first.astype(np.int64), combined


def _batch_size(batch: Any) -> int:
    if isinstance(batch, tuple):  # olh: (seeds, values)
        return len(batch[0])
    return len(batch)


def _is_numeric(mechanism: Any) -> bool:
    from fedldp.client.mechanisms.numeric import NumericMechanism

    return isinstance(mechanism, NumericMechanism)


def _mechanism_variance(mechanism: Any, values: Any, reports: int) -> npt.NDArray[np.float64]:
    """V_j at the population `values` with `reports` reports (a random subset's average)."""
    import numpy as np

    if _is_numeric(mechanism):
        t = mechanism.normalize_batch(values)
        per_user = float(np.mean(mechanism.conditional_variance(t)))
        return np.array([mechanism.scale**2 * per_user / reports])
    truth = np.bincount(np.asarray(values, dtype=np.int64), minlength=mechanism.k) / len(values)
    return np.asarray(mechanism.variance(reports, truth), dtype=np.float64)


def _population_variance(mechanism: Any, values: Any) -> npt.NDArray[np.float64]:
    """σ_j^2: f_v (1 - f_v) per value, or the variance of the clipped values (value units^2)."""
    import numpy as np

    if _is_numeric(mechanism):
        t = mechanism.normalize_batch(values)
        return np.array([mechanism.scale**2 * float(np.var(t))])
    f = np.bincount(np.asarray(values, dtype=np.int64), minlength=mechanism.k) / len(values)
    return np.asarray(f * (1.0 - f), dtype=np.float64)


def _plug_in_population_variance(mechanism: Any, part: Any, estimate: Estimate) -> Any:
    """σ̂_j^2 from attribute j's statistic (module docstring)."""
    import numpy as np

    if _is_numeric(mechanism):
        mean_t = min(1.0, max(-1.0, part.total / part.n))
        if mechanism.c2 == 0:
            m2 = 1.0  # no information on t^2: the worst case
        else:
            m2 = (part.total_sq / part.n - float(mechanism.c0)) / float(mechanism.c2)
            m2 = min(1.0, max(0.0, m2))
        return mechanism.scale**2 * max(0.0, m2 - mean_t * mean_t)
    f = np.clip(estimate.values, 0.0, 1.0)
    return f * (1.0 - f)


# --- auto: the lower total variance at the uniform reference (module docstring) ---


def uniform_unit_variance(mechanism: Any) -> tuple[float, float]:
    """(u_j, s_j): n·Var of attribute j's estimate per report, and σ_j^2, at the uniform
    reference (scale-free units; pure Python, no numpy)."""
    if _is_numeric(mechanism):
        c0, c2, levels = float(mechanism.c0), float(mechanism.c2), mechanism.levels
        third = 1.0 / 3.0
        return c0 + c2 * (third + 2.0 / (3.0 * levels * levels)) - third, third
    f = 1.0 / mechanism.k
    p, q = mechanism.support_p, mechanism.support_q
    gap = (p - q) ** 2
    if not gap > 0.0:  # ε so small that p* and q* coincide in floats
        raise ValueError(
            f"epsilon {mechanism.epsilon} is too small to compare the modes' variances "
            "(the attribute's support probabilities coincide in floating point)"
        )
    return (f * p * (1 - p) + (1 - f) * q * (1 - q)) / gap, f * (1 - f)


def _resolved_ids(attributes: Sequence[AttributeSpec], epsilon: Decimal) -> tuple[str, ...]:
    from fedldp.client.mechanisms.auto import choose_frequency_oracle

    return tuple(
        choose_frequency_oracle(len(a.labels), epsilon)
        if a.mechanism_id == "auto" and a.labels is not None and not a.params
        else a.mechanism_id
        for a in attributes
    )


def mode_scores(metric: MultiMetric, epsilon: Decimal) -> ModeScores:
    """Both modes' total variance per report at the uniform reference (module docstring)."""
    attributes = metric.attributes
    d = len(attributes)
    totals: dict[str, float] = {}
    ids: dict[str, tuple[str, ...]] = {}
    for mode in MULTI_IDS:
        eps = attribute_epsilon(mode, epsilon, d)
        ids[mode] = _resolved_ids(attributes, eps)
        total = 0.0
        for spec, wire_id in zip(attributes, ids[mode], strict=True):
            mechanism = build_attribute(_with_id(spec, wire_id), eps)
            u, s = uniform_unit_variance(mechanism)
            total += u if mode == SPLIT_ID else d * u + (d - 1) * s
        totals[mode] = total
    return ModeScores(totals[SPLIT_ID], totals[SAMPLE_ID], ids[SPLIT_ID], ids[SAMPLE_ID])


def choose_mode(metric: MultiMetric, epsilon: Decimal) -> str:
    """ "multi-split" or "multi-sample": the lower total variance (`mode_scores`)."""
    return mode_scores(metric, epsilon).choice


def _with_id(spec: AttributeSpec, wire_id: str) -> AttributeSpec:
    return AttributeSpec(spec.name, spec.labels, spec.numeric_range, wire_id, spec.params)


__all__ = [
    "MAX_ATTRIBUTES",
    "MIN_ATTRIBUTES",
    "MULTI_IDS",
    "SAMPLE_ID",
    "SPLIT_DIGITS",
    "SPLIT_ID",
    "AttributeEstimate",
    "ModeScores",
    "MultiAttribute",
    "MultiBatch",
    "MultiSample",
    "MultiSplit",
    "MultiStatistic",
    "attribute_epsilon",
    "attribute_probability",
    "build_attribute",
    "choose_mode",
    "mode_scores",
    "split_epsilon",
    "uniform_unit_variance",
]
