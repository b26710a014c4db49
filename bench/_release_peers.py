"""The peer libraries of bench/release_engines.py, run on the same rows at the same ε.

PipelineDP (`pipeline-dp`, LocalBackend: its in-process backend) computes each
query with the same contribution bounds (c = 5 rows per unit; grouped: 1 group
per unit, c rows per group), the same clamping bounds and the same public
partitions (the 100 regions), Laplace noise at ε = 1 (the mean and the SQL query:
PipelineDP splits ε over its metrics itself). Its median is PERCENTILE(50).
The rows are handed to it as Python tuples; reading the Parquet file into
them is not timed (say so beside the figure).

Tumult Analytics (`tmlt-analytics` 0.21.0) cannot be installed beside fedldp's
pinned torch: it requires sympy < 1.13 and pyspark < 3.6 while torch 2.13.0
requires sympy >= 1.13.3 (pip's resolver refuses the pair). `tumult_status`
says so in the benchmark's output; where it is importable it is not run either
(no code here drives it: an untested driver would be a claim, not a figure).
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

#: Why Tumult Analytics is not run (printed by the benchmark).
TUMULT_WHY = (
    "tmlt-analytics 0.21.0 not run: it requires sympy<1.13 and pyspark<3.6, while the "
    "pinned torch 2.13.0 requires sympy>=1.13.3, so pip cannot install it beside fedldp[all]"
)


def version(package: str) -> str | None:
    """The installed version of `package`, or None."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def pipeline_dp_queries(
    rows: list[tuple[Any, ...]], c: int, groups: list[str], epsilon: float
) -> dict[str, Callable[[], Any]]:
    """{query: a call that releases it with PipelineDP} over `rows` (user, minutes,
    region, day); each call returns the released value (a dict per group when grouped)."""
    import pipeline_dp

    def run(
        metrics: list[Any], grouped: bool, where: Callable[[tuple[Any, ...]], bool] | None
    ) -> Any:
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        params = pipeline_dp.AggregateParams(
            noise_kind=pipeline_dp.NoiseKind.LAPLACE,
            metrics=metrics,
            max_partitions_contributed=1,
            max_contributions_per_partition=c,
            min_value=0.0,
            max_value=100.0,
        )
        extractors = pipeline_dp.DataExtractors(
            privacy_id_extractor=lambda r: r[0],
            partition_extractor=(lambda r: r[2]) if grouped else (lambda r: 0),
            value_extractor=lambda r: r[1],
        )
        data = rows if where is None else [r for r in rows if where(r)]
        result = engine.aggregate(
            data, params, extractors, public_partitions=groups if grouped else [0]
        )
        accountant.compute_budgets()
        out = dict(result)
        return out if grouped else out[0]

    m = pipeline_dp.Metrics
    late = lambda r: r[3] >= "2026-11-15"  # noqa: E731
    return {
        "count": lambda: run([m.COUNT], False, None).count,
        "sum": lambda: run([m.SUM], False, None).sum,
        "mean": lambda: run([m.MEAN], False, None).mean,
        "median": lambda: run([m.PERCENTILE(50)], False, None).percentile_50,
        "grouped count (100)": lambda: {k: v.count for k, v in run([m.COUNT], True, None).items()},
        "sql": lambda: {k: v.mean for k, v in run([m.COUNT, m.MEAN], True, late).items()},
    }
