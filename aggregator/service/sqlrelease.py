"""`release sql`: an analyst's SQL -> one grouped, charged, signed release.

The SQL is parsed (aggregator/engines/sqlparse.py) against the declarations of
the datasets open to the analyst for the request's purpose, checked and
planned before anything is reserved; the dataset's engine computes the bounded
per-group statistics (aggregator/engines/plan.py, L0 groups and L∞ rows per
unit per group); aggregator/central/grouped.py adds the noise, selects the
groups when they have no public domain, charges the ledger and records the
budget split that the signed receipt states.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from fedldp.aggregator.central import grouped as gr
from fedldp.aggregator.engines.plan import (
    BoundedQuery,
    NumericSpec,
    Split,
    cells,
    fresh_key,
    merge,
)
from fedldp.aggregator.engines.sqlparse import SqlPlan, SqlRefusedError, parse
from fedldp.aggregator.service.catalog import (
    MAX_DOMAIN,
    CategoricalColumn,
    Dataset,
    NumericColumn,
)
from fedldp.v1 import release_pb2 as pb


def declared(ds: Dataset) -> dict[str, str]:
    """{column: "numeric" or "categorical"} of a dataset (the unit column is absent)."""
    return {
        name: "numeric" if isinstance(col, NumericColumn) else "categorical"
        for name, col in ds.columns.items()
    }


def plan_sql(sql: str, open_datasets: Mapping[str, Dataset]) -> SqlPlan:
    """Parse `sql` against the datasets open to the analyst (SqlRefusedError otherwise)."""
    return parse(sql, {name: declared(ds) for name, ds in open_datasets.items()})


def _spec(ds: Dataset, column: str) -> NumericSpec:
    col = ds.columns[column]
    assert isinstance(col, NumericColumn)
    spec = NumericSpec(col.lower, col.upper, col.scale)
    spec.check(column)
    return spec


def domain_of(ds: Dataset, plan: SqlPlan) -> list[tuple[str, ...]] | None:
    """Every group of a public domain (the product of the GROUP BY columns' domains), or
    None when some column has none (the groups are then selected privately)."""
    domains = []
    for g in plan.group_by:
        col = ds.columns[g]
        if not isinstance(col, CategoricalColumn) or not col.domain:
            return None
        domains.append(col.domain)
    size = 1
    for d in domains:
        size *= len(d)
    if size > MAX_DOMAIN:
        raise SqlRefusedError(f"the GROUP BY domain has more than {MAX_DOMAIN} groups")
    return [tuple(g) for g in itertools.product(*domains)]


def bounded_query(ds: Dataset, plan: SqlPlan) -> BoundedQuery:
    """The engine's bounded aggregation of a SQL plan (plan.py)."""
    numeric = {
        c: _spec(ds, c)
        for c in {*(a.column for a in plan.aggregates if a.column)}
        | {c for c in _where_columns(plan) if isinstance(ds.columns[c], NumericColumn)}
    }
    quantile = next((a.column for a in plan.aggregates if a.kind == "quantile"), None)
    grouped = bool(plan.group_by)
    domains = {
        g: col.domain
        for g in plan.group_by
        if isinstance(col := ds.columns[g], CategoricalColumn) and col.domain
    }
    return BoundedQuery(
        unit=ds.unit,
        numeric=numeric,
        group_by=plan.group_by,
        sums=tuple(
            sorted({a.column for a in plan.aggregates if a.kind in ("sum", "mean") and a.column})
        ),
        split=Split(quantile, "cells") if quantile else None,
        where=plan.where,
        rows_per_unit=(ds.max_rows_per_group or ds.contribution_bound)
        if grouped
        else ds.contribution_bound,
        groups_per_unit=ds.max_groups_per_unit if grouped else None,
        domains=domains,
        key=fresh_key(),
    )


def _where_columns(plan: SqlPlan) -> set[str]:
    return BoundedQuery(unit="", numeric={}, where=plan.where).where_columns()


def aggregates(ds: Dataset, plan: SqlPlan) -> list[gr.Aggregate]:
    """The grouped release's aggregates (bounds from the catalog, never the request)."""
    out = []
    for a in plan.aggregates:
        col = ds.columns.get(a.column or "")
        lower = col.lower if isinstance(col, NumericColumn) else None
        upper = col.upper if isinstance(col, NumericColumn) else None
        out.append(gr.Aggregate(a.label, a.kind, a.column, lower, upper, a.quantile))
    return out


def loader(
    ds: Dataset, bq: BoundedQuery, opened: Callable[[], object]
) -> Callable[[], dict[tuple[str, ...], gr.GroupStats]]:
    """`load` of private_grouped: the engine's totals as per-group statistics."""

    def load() -> dict[tuple[str, ...], gr.GroupStats]:
        opened()
        result = ds.aggregate(bq)
        depth = len(bq.group_by)
        out: dict[tuple[str, ...], gr.GroupStats] = {}
        for key, t in merge(result, depth).items():
            s = out[tuple(str(k) for k in key)] = gr.GroupStats(rows=t.rows, units=t.units)
            for c, v in t.sums.items():
                s.sums[c] = Decimal(v).scaleb(-bq.numeric[c].scale)
            s.counts.update(t.counts)
        if bq.split is not None:
            for key, pair in cells(result, depth).items():
                out.setdefault(tuple(str(k) for k in key), gr.GroupStats()).cells[
                    bq.split.column
                ] = pair
        return out

    return load


def response(release: gr.GroupedRelease, receipt: bytes, policy_sha256: str) -> pb.ReleaseResponse:
    """The ReleaseResponse of a SQL release: one value per (group, aggregate)."""
    out = pb.ReleaseResponse(
        kind="grouped",
        reservation_id=release.reservation_id,
        receipt=receipt,
        policy_sha256=policy_sha256,
        epsilon_split=json.dumps(release.split, sort_keys=True, separators=(",", ":")),
    )
    for group in sorted(release.table):
        for label, value in release.table[group].items():
            out.values.add(label=label, value=value, group=group)
    return out


def run_sql(
    ledger: Any,
    ds: Dataset,
    plan: SqlPlan,
    delta: Decimal,
    common: dict[str, Any],
    opened: Callable[[], object],
) -> gr.GroupedRelease:
    """Plan the engine query, then release (grouped.private_grouped)."""
    bq = bounded_query(ds, plan)
    domain = [()] if not plan.group_by else domain_of(ds, plan)
    if domain is None and delta <= 0:
        raise SqlRefusedError(
            "the GROUP BY columns have no public domain: the groups are selected privately, "
            "which needs a delta (e.g. --delta 1e-6)"
        )
    return gr.private_grouped(
        ledger,
        delta=delta,
        aggregates=aggregates(ds, plan),
        domain=domain,
        groups_per_unit=bq.groups_per_unit or 1,
        rows_per_group=bq.rows_per_unit,
        load=loader(ds, bq, opened),
        **common,
    )
