"""Grouped central releases: count / sum / mean / quantile per group, with the groups
either a public domain or chosen by DP partition selection.

Contribution bounding (done by the engine: aggregator/engines/plan.py): each
privacy unit contributes to at most L0 groups and at most L∞ rows per group, so
adding or removing a unit changes at most L0 groups, each by at most L∞ rows
(Wilson et al. 2020; PipelineDP). Sensitivities over the vector of all groups
(L1, which bounds L2 too): count L0·L∞; sum L0·L∞·max(|L|, |U|); a mean is
releases.private_mean's centred form per group, M + noisy Σ(x − M) / noisy count
with M = (L + U)/2: its centred sum L0·L∞·(U − L)/2 and its count L0·L∞, with
half of its ε each; a quantile is one exponential
mechanism per group at ε/L0 (a unit moves the scores of at most L0 groups by at
most L∞·max(Q, D − Q): basic composition over those groups, parallel elsewhere).

Budget split: ε is divided equally, exactly (decimal; the last part takes the
remainder), among the aggregates and, without a public domain, the partition
selection; all of δ goes to the partition selection (with a public domain δ
must be 0). The split is recorded in the reservation's metadata ("split") and
every part is one ledger event, so the signed receipt states it.

Partition selection (Korolova et al. 2009; Wilson et al. 2020, Section 4;
Desfontaines, Voss, Gipson, Mandayam 2022, "Differentially private partition
selection", PoPETs; Google's DP library `LaplacePartitionSelection`): each
group present in the bounded data gets n_units + Z, Z exact discrete Laplace of
scale L0/ε_ps (a unit changes at most L0 groups' unit counts by 1: L1
sensitivity L0), and is released iff that reaches the threshold τ. A group
only one neighbour has holds one unit, and is released with probability
P[Z ≥ τ − 1] = p^(τ−1)/(1 + p), p = e^(−ε_ps/L0); with at most L0 such groups,
the smallest τ with L0·p^(τ−1)/(1 + p) ≤ δ makes the selection (ε_ps, δ)-DP.
τ is computed at 60 digits and checked exactly against the inequality
(`threshold`). Only the selection is released, never the noisy unit counts.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_DOWN, Decimal, localcontext
from fractions import Fraction
from typing import TYPE_CHECKING

from fedldp.aggregator.central import quantile as qm
from fedldp.aggregator.central.noise import discrete_laplace
from fedldp.aggregator.central.releases import (
    NoiseMechanism,
    ReleaseRequest,
    RequestFields,
    _run_release,
    centre_of,
    exact_half,
    exponential_choice,
    mean_of,
    plan_noise,
)
from fedldp.aggregator.central.reservations import CentralLedger

if TYPE_CHECKING:
    from typing_extensions import Unpack

GroupKey = tuple[str, ...]


@dataclass(frozen=True)
class Aggregate:
    """One output column: `kind` count/sum/mean/quantile, its column and q."""

    label: str
    kind: str
    column: str | None = None
    lower: Decimal | None = None
    upper: Decimal | None = None
    quantile: Decimal | None = None


@dataclass
class GroupStats:
    """A group's bounded true statistics (the engine's, never released)."""

    rows: int = 0
    units: int = 0
    sums: dict[str, Decimal] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    cells: dict[str, tuple[Sequence[int], Sequence[int]]] = field(default_factory=dict)


@dataclass(frozen=True)
class GroupedRelease:
    """The released table {group label: {aggregate label: value}} and its reservation."""

    table: dict[str, dict[str, str]]
    reservation_id: str
    split: dict[str, str]


def split_budget(epsilon: Decimal, parts: Sequence[str]) -> dict[str, Decimal]:
    """ε divided equally among `parts`, exactly: 27-digit shares, the last the rest."""
    with localcontext() as ctx:
        ctx.prec = 60
        share = (epsilon / len(parts)).quantize(
            Decimal(1).scaleb(epsilon.adjusted() - 27), rounding=ROUND_DOWN
        )
    out = {p: share for p in parts[:-1]}
    out[parts[-1]] = epsilon - share * (len(parts) - 1)
    return out


def threshold(epsilon: Decimal, delta: Decimal, l0: int) -> int:
    """The smallest τ with l0·p^(τ−1)/(1 + p) ≤ δ, p = e^(−ε/l0) (module docstring)."""
    with localcontext() as ctx:
        ctx.prec = 60
        p = (-epsilon / l0).exp()
        need = (Decimal(l0) / (delta * (1 + p))).ln() / (epsilon / l0)
        tau = max(1, int(need.to_integral_value(rounding="ROUND_CEILING")) + 1)
        while tau > 1 and l0 * p ** (tau - 2) / (1 + p) <= delta:  # pragma: no cover
            tau -= 1
        while l0 * p ** (tau - 1) / (1 + p) > delta:  # pragma: no cover
            tau += 1
    return tau


def label_of(key: GroupKey) -> str:
    """A group's label: the canonical JSON list of its values."""
    return json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))


def _select(
    stats: Mapping[GroupKey, GroupStats], eps: Decimal, delta: Decimal, l0: int, rng: random.Random
) -> tuple[list[GroupKey], dict[str, object]]:
    """Partition selection: the groups whose noisy unit count reaches τ, and its event."""
    scale = Fraction(l0) / Fraction(eps)
    tau = threshold(eps, delta, l0)
    kept = [
        g
        for g, s in sorted(stats.items())
        if s.units > 0 and s.units + discrete_laplace(scale, rng) >= tau
    ]
    event: dict[str, object] = {
        "kind": "threshold",
        "query": "partition_selection",
        "epsilon": str(eps),
        "delta": str(delta),
        "scale": str(scale),
        "lattice_sensitivity": l0,
        "threshold": tau,
        "output": json.dumps([label_of(g) for g in kept], separators=(",", ":")),
    }
    return kept, event


def _additive(
    agg: Aggregate,
    eps: Decimal,
    groups: Sequence[GroupKey],
    stats: Mapping[GroupKey, GroupStats],
    l0: int,
    linf: int,
    rng: random.Random,
) -> list[dict[str, object]]:
    """The events of a count, sum or mean over every released group."""
    lower, upper = agg.lower or Decimal(0), agg.upper or Decimal(0)
    bound = max(abs(lower), abs(upper))
    centre = Decimal(0)
    parts = [("count", eps)] if agg.kind == "count" else [("sum", eps)]
    if agg.kind == "mean":
        half = exact_half(eps, "epsilon")
        parts = [("centred_sum", half), ("count", half)]
        centre, bound = centre_of(lower, upper), exact_half(upper - lower, "upper - lower")
    events = []
    for part, e in parts:
        counted = part == "count"
        sens = Decimal(l0 * linf) * (1 if counted else bound)
        plan = plan_noise(
            NoiseMechanism.LAPLACE,
            epsilon=e,
            delta=Decimal(0),
            sensitivity=sens,
            granularity=Decimal(1) if counted else None,
        )
        out = {}
        for g in groups:
            s = stats.get(g, GroupStats())
            if agg.kind == "count":
                true = Decimal(s.rows)
            elif counted:
                true = Decimal(s.counts.get(agg.column or "", 0))
            else:
                true = s.sums.get(agg.column or "", Decimal(0))
                true -= centre * s.counts.get(agg.column or "", 0)  # 0 unless a mean
            out[label_of(g)] = str(plan.noised(true, rng))
        event = plan.event(f"{agg.label}.{part}" if agg.kind == "mean" else agg.label)
        if part == "centred_sum":
            event["centre"] = str(centre)
        event["bins"] = len(groups)
        event["output"] = json.dumps(out, sort_keys=True, separators=(",", ":"))
        events.append(event)
    return events


def _quantiles(
    agg: Aggregate,
    eps: Decimal,
    groups: Sequence[GroupKey],
    stats: Mapping[GroupKey, GroupStats],
    l0: int,
    linf: int,
    rng: random.Random,
) -> dict[str, object]:
    """One exponential mechanism per released group at ε/L0 (module docstring)."""
    assert agg.lower is not None and agg.upper is not None and agg.quantile is not None
    q = qm.quantile_fraction(agg.quantile)
    sens = qm.utility_sensitivity(q, linf)
    grid = qm.candidates(agg.lower, agg.upper)
    per_group = Fraction(eps) / l0
    empty = ([0] * len(grid), [0] * len(grid))
    out = {}
    for g in groups:
        on, between = stats.get(g, GroupStats()).cells.get(agg.column or "", empty)
        utilities = qm.scores_from_cells(on, between, q)
        chosen = exponential_choice(
            utilities,
            Decimal(per_group.numerator) / Decimal(per_group.denominator),
            rng,
            sensitivity=sens,
        )
        out[label_of(g)] = str(grid[chosen])
    return {
        "kind": "exponential",
        "query": agg.label,
        "epsilon": str(eps),
        "delta": "0",
        "utility_sensitivity": sens,
        "groups_per_unit": l0,
        "candidates": len(grid),
        "quantile": str(agg.quantile),
        "lower": str(agg.lower),
        "upper": str(agg.upper),
        "sampler": "report-noisy-max per group at epsilon/groups_per_unit",
        "bins": len(groups),
        "output": json.dumps(out, sort_keys=True, separators=(",", ":")),
    }


def table_of(
    events: Sequence[Mapping[str, object]], aggregates: Sequence[Aggregate]
) -> dict[str, dict[str, str]]:
    """{group label: {aggregate label: released value}} from the events (receipts recompute it)."""
    by = {
        str(e.get("query")): json.loads(str(e["output"]))
        for e in events
        if e.get("query") != "partition_selection"
    }
    table: dict[str, dict[str, str]] = {}
    for agg in aggregates:
        if agg.kind == "mean":
            assert agg.lower is not None and agg.upper is not None
            centred = f"{agg.label}.centred_sum" in by  # tables recorded before: ".sum"
            sums = by[f"{agg.label}.centred_sum" if centred else f"{agg.label}.sum"]
            counts = by[f"{agg.label}.count"]
            for g, s in sums.items():
                v = mean_of(Decimal(s), Decimal(counts[g]), agg.lower, agg.upper, centred=centred)
                table.setdefault(g, {})[agg.label] = str(v)
        else:
            for g, v in by[agg.label].items():
                table.setdefault(g, {})[agg.label] = str(v)
    return table


def private_grouped(
    ledger: CentralLedger,
    *,
    epsilon: Decimal,
    delta: Decimal,
    aggregates: Sequence[Aggregate],
    domain: Sequence[GroupKey] | None,
    groups_per_unit: int,
    rows_per_group: int,
    load: Callable[[], Mapping[GroupKey, GroupStats]],
    **fields: Unpack[RequestFields],
) -> GroupedRelease:
    """Release `aggregates` per group (module docstring); `domain` None: select groups."""
    request = ReleaseRequest(**fields)
    if not aggregates:
        raise ValueError("a grouped release needs at least one aggregate")
    if (domain is None) != (delta > 0):
        raise ValueError(
            "partition selection needs 0 < delta < 1; a public domain needs delta 0"
            if domain is None
            else "the groups are a public domain: delta must be 0"
        )
    names = [a.label for a in aggregates] + ([] if domain is not None else ["partition_selection"])
    shares = split_budget(epsilon, names)
    rng = request.generator()
    l0, linf = groups_per_unit, rows_per_group

    def compute() -> list[dict[str, object]]:
        stats = load()
        events: list[dict[str, object]] = []
        if domain is None:
            groups, event = _select(stats, shares["partition_selection"], delta, l0, rng)
            events.append(event)
        else:
            groups = list(domain)
        for agg in aggregates:
            if agg.kind == "quantile":
                events.append(_quantiles(agg, shares[agg.label], groups, stats, l0, linf, rng))
            else:
                events.extend(_additive(agg, shares[agg.label], groups, stats, l0, linf, rng))
        return events

    split = {k: str(v) for k, v in shares.items()}
    meta = {
        "kind": "grouped",
        "mechanism": "laplace",
        "groups_per_unit": str(l0),
        "rows_per_group": str(linf),
        "split": json.dumps(split, sort_keys=True, separators=(",", ":")),
        "aggregates": json.dumps([_recorded(a) for a in aggregates], separators=(",", ":")),
        "public_domain": "yes" if domain is not None else "no",
    }
    rid, events = _run_release(
        ledger,
        request,
        epsilon=epsilon,
        delta=delta,
        metadata=meta,
        compute=compute,
        randomness=request.randomness,
    )
    return GroupedRelease(table_of(events, aggregates), rid, split)


def _recorded(a: Aggregate) -> list[str]:
    """An aggregate as recorded in the reservation's metadata ("" for an unset part)."""
    parts = (a.column, a.quantile, a.lower, a.upper)
    return [a.label, a.kind, *("" if p is None else str(p) for p in parts)]


def aggregates_of(metadata: Mapping[str, str]) -> list[Aggregate]:
    """The aggregates a grouped reservation's metadata records (receipts use it)."""
    out = []
    for label, kind, column, q, lower, upper in json.loads(metadata["aggregates"]):
        out.append(
            Aggregate(
                label,
                kind,
                column or None,
                Decimal(lower) if lower else None,
                Decimal(upper) if upper else None,
                Decimal(q) if q else None,
            )
        )
    return out
