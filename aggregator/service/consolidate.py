"""From collected to consolidated: per-policy, per-window debiased LDP estimates as a table.

The collector's ledger stores, per policy version and window, the partial
statistics of the randomized reports. `estimate_rows` turns each window that
passes the policy's release gate (`min_reports_for_release`) into rows of the
table::

    policy_id, policy_version, window_start, metric, label, n,
    estimate, variance, std_error, ci_low, ci_high, confidence

one row per label of a categorical policy (the unbiased frequency estimate,
before any consistency post-processing, with its exact variance: see
docs/aggregator.md "How the error bars are computed"), one row with label
"mean" for a numeric policy. Sketch policies (open domains: cms, hcms) have
no list of values to consolidate and give no rows (their reports need the
analyst's candidate strings: `fedldp report --candidates`). `write_table`
stores them in an SQL table of the deployment's SQLite or PostgreSQL
(replacing the rows of the same policy version and window, so reruns are
idempotent).

Privacy: every value in the table is a function of the reports only, which
are already ε-LDP outputs charged at the device: this is post-processing
(Dwork and Roth 2014, Proposition 2.1) and needs no further budget. The table
can be published or shared with analysts as is.

What it can NOT feed: central DP releases or DP-SGD treating its rows as
records of individuals. A row is an aggregate over a window, not a person;
the raw reports are single randomized values per device and report, with no
stable privacy unit across reports the service could bound. DP-SGD needs
per-example records with a declared privacy unit and contribution bound: a
consolidated table of such records (registered in the release service's
catalog), not the LDP report table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fedldp.aggregator.estimation import FrequencyReport, NumericReport
from fedldp.aggregator.multi_report import MultiReport
from fedldp.aggregator.reports import (
    CandidatesRequiredError,
    InsufficientReportsError,
    report_from_ledgers,
)
from fedldp.client.policy import VerifiedPolicy


@dataclass(frozen=True)
class EstimateRow:
    """One debiased estimate of one window (module docstring)."""

    policy_id: str
    policy_version: int
    window_start: int
    metric: str
    label: str
    n: int
    estimate: float
    variance: float
    std_error: float
    ci_low: float
    ci_high: float
    confidence: float


def estimate_rows(
    ledger: Any, policy: VerifiedPolicy, *, confidence: float = 0.95
) -> list[EstimateRow]:
    """Rows for every window of `policy` with stored reports that passes the release gate
    (none for a sketch policy, module docstring)."""
    stats = ledger.statistics(policy.policy_id, policy.version)
    rows: list[EstimateRow] = []
    for window in sorted({int(s.window_start) for s in stats}):
        try:
            report = report_from_ledgers(
                [("ledger", ledger)], policy, window_start=window, confidence=confidence
            )
        except InsufficientReportsError:
            continue  # below the policy's minimum for release: not consolidated
        except CandidatesRequiredError:
            return []  # a sketch: no list of values to consolidate
        if isinstance(report, MultiReport):  # one metric per attribute: metric.attribute
            for a in report.attributes:
                metric = f"{policy.metric_name}.{a.name}"
                base = (policy.policy_id, policy.version, window, metric)
                rows.extend(_report_rows(base, a.report, confidence))
        else:
            base = (policy.policy_id, policy.version, window, policy.metric_name)
            rows.extend(_report_rows(base, report, confidence))
    return rows


def _report_rows(
    base: tuple[str, int, int, str], report: FrequencyReport | NumericReport, confidence: float
) -> list[EstimateRow]:
    """A report's rows: one per label, or one named "mean"."""
    if isinstance(report, FrequencyReport):
        return [
            EstimateRow(
                *base,
                e.label,
                report.n,
                e.raw_estimate,
                e.std_error**2,
                e.std_error,
                e.ci_low,
                e.ci_high,
                confidence,
            )
            for e in report.estimates
        ]
    return [
        EstimateRow(
            *base,
            "mean",
            report.n,
            report.mean,
            report.std_error**2,
            report.std_error,
            report.ci_low,
            report.ci_high,
            confidence,
        )
    ]


def write_table(url: str, table_name: str, rows: Sequence[EstimateRow]) -> int:
    """Create `table_name` if needed and replace the rows of each (policy, version, window)."""
    import sqlalchemy as sa

    metadata = sa.MetaData()
    table = sa.Table(
        table_name,
        metadata,
        sa.Column("policy_id", sa.String(256), nullable=False),
        sa.Column("policy_version", sa.Integer, nullable=False),
        sa.Column("window_start", sa.BigInteger, nullable=False),
        sa.Column("metric", sa.String(256), nullable=False),
        sa.Column("label", sa.String(256), nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Column("estimate", sa.Float, nullable=False),
        sa.Column("variance", sa.Float, nullable=False),
        sa.Column("std_error", sa.Float, nullable=False),
        sa.Column("ci_low", sa.Float, nullable=False),
        sa.Column("ci_high", sa.Float, nullable=False),
        sa.Column("confidence", sa.Float, nullable=False),
        sa.PrimaryKeyConstraint("policy_id", "policy_version", "window_start", "label"),
    )
    engine = sa.create_engine(url)
    try:
        metadata.create_all(engine)
        with engine.begin() as conn:
            for key in {(r.policy_id, r.policy_version, r.window_start) for r in rows}:
                conn.execute(
                    sa.delete(table).where(
                        table.c.policy_id == key[0],
                        table.c.policy_version == key[1],
                        table.c.window_start == key[2],
                    )
                )
            if rows:
                conn.execute(sa.insert(table), [asdict(r) for r in rows])
    finally:
        engine.dispose()
    return len(rows)
