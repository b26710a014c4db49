"""The analyst report of a multi-attribute metric: one report per attribute.

Each attribute's estimate and exact variance come from the multi-attribute
mechanism (`fedldp.client.mechanisms.multi`, `attribute_estimates`): under
multi-split the attribute mechanism's estimator at ε/d over all n reports,
under multi-sample its estimator at ε over the n_j reports that drew the
attribute, with the subsample term added to the variance. A categorical
attribute becomes a `FrequencyReport` over its labels, a numeric one a
`NumericReport` of its mean over its range (intervals as in
`fedldp.aggregator.estimation`).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from fedldp.aggregator.consistency import Consistency
from fedldp.aggregator.estimation import (
    FrequencyReport,
    NumericReport,
    ReportContext,
    csv_text,
    frequency_report_from_estimate,
    numeric_report_from_estimate,
    repr_float,
)
from fedldp.client.mechanisms.multi import MultiAttribute, MultiStatistic

#: Identifies the JSON layout; bump the suffix only for an incompatible change.
MULTI_SCHEMA = "fedldp.report.multi/v1"


@dataclass(frozen=True)
class AttributeReport:
    """One attribute's report and the number of reports that carried it."""

    name: str
    reports: int
    report: FrequencyReport | NumericReport

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: name, reports, and the attribute's own report."""
        return {"name": self.name, "reports": self.reports, "report": self.report.to_dict()}


@dataclass(frozen=True)
class MultiReport:
    """A multi-attribute metric's report: every attribute's estimates with error bars."""

    mechanism: str
    epsilon: Decimal
    attribute_epsilon: Decimal
    n: int
    confidence: float
    attributes: tuple[AttributeReport, ...]
    context: ReportContext = field(default_factory=ReportContext)

    def by_name(self, name: str) -> FrequencyReport | NumericReport:
        """The report of attribute `name` (KeyError if there is none)."""
        for attribute in self.attributes:
            if attribute.name == name:
                return attribute.report
        raise KeyError(f"no attribute named {name!r}")

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON layout (schema `fedldp.report.multi/v1`)."""
        return {
            "schema": MULTI_SCHEMA,
            "kind": "multi",
            "mechanism": self.mechanism,
            "epsilon": str(self.epsilon),
            "attribute_epsilon": str(self.attribute_epsilon),
            "n": self.n,
            "confidence": self.confidence,
            "context": self.context.to_dict(),
            "attributes": [a.to_dict() for a in self.attributes],
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """`to_dict()` as JSON text."""
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self) -> str:
        """One row per (attribute, label) or numeric attribute: attribute, reports, label
        (empty for a mean), estimate, std_error, ci_low, ci_high."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(
            ["attribute", "reports", "label", "estimate", "std_error", "ci_low", "ci_high"]
        )
        for a in self.attributes:
            r = a.report
            if isinstance(r, NumericReport):
                rows = [("", r.mean, r.std_error, r.ci_low, r.ci_high)]
            else:
                rows = [
                    (e.label, e.estimate, e.std_error, e.ci_low, e.ci_high) for e in r.estimates
                ]
            for label, *values in rows:
                writer.writerow(
                    [csv_text(a.name), a.reports, csv_text(label), *map(repr_float, values)]
                )
        return buf.getvalue()


def multi_report(
    mechanism: MultiAttribute,
    statistic: MultiStatistic,
    *,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    context: ReportContext | None = None,
) -> MultiReport:
    """Every attribute's report from a multi-attribute mechanism's merged statistic.

    `simultaneous` and `consistency` apply to each categorical attribute on its own.
    Raises ValueError when an attribute has no reports yet (multi-sample).
    """
    base = context or ReportContext()
    attributes = []
    for j, part in enumerate(mechanism.attribute_estimates(statistic)):
        spec = part.spec
        sub = replace(base, metric=f"{base.metric}.{spec.name}" if base.metric else spec.name)
        wire_id = mechanism.mechanisms[j].wire_id
        report: FrequencyReport | NumericReport
        if spec.labels is not None:
            report = frequency_report_from_estimate(
                part.estimate,
                list(spec.labels),
                mechanism_id=wire_id,
                epsilon=mechanism.attribute_epsilon,
                confidence=confidence,
                simultaneous=simultaneous,
                consistency=consistency,
                context=sub,
            )
        else:
            assert spec.numeric_range is not None
            lo, hi = spec.numeric_range
            report = numeric_report_from_estimate(
                part.estimate,
                mechanism_id=wire_id,
                epsilon=mechanism.attribute_epsilon,
                confidence=confidence,
                value_range=(float(lo), float(hi)),
                context=sub,
            )
        attributes.append(AttributeReport(spec.name, part.reports, report))
    return MultiReport(
        mechanism=mechanism.wire_id,
        epsilon=mechanism.epsilon,
        attribute_epsilon=mechanism.attribute_epsilon,
        n=statistic.n,
        confidence=float(confidence),
        attributes=tuple(attributes),
        context=base,
    )


__all__ = ["MULTI_SCHEMA", "AttributeReport", "MultiReport", "multi_report"]
