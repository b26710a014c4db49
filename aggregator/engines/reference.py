"""The pure-Python bounded aggregation: the reference every engine must match exactly.

It reads rows as mappings of column -> raw value (a CSV's texts, "" read as
NULL, or Python values) and applies plan.py's definition step by step, with
no shortcut. It is also the engine of last resort (`engine = "python"`): slow
(a Python loop over every row), but it needs no library.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from fedldp.aggregator.engines.plan import (
    BoolOp,
    BoundedQuery,
    Cmp,
    Cond,
    FineKey,
    InList,
    IsNull,
    Not,
    NumericSpec,
    Result,
    Totals,
    cell_code,
    group_key,
    row_key,
)

Row = Mapping[str, object]
Value = Decimal | str | None


def text_of(value: object) -> str | None:
    """The text of a categorical or unit value (None for NULL and for "")."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fixed(value: object, spec: NumericSpec) -> Decimal | None:
    """A numeric value as a decimal with `spec.scale` places (round half up, as the
    engines' CAST to DECIMAL does); None for NULL; ValueError when it is no number."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("data contains a value that is not a number")
    try:
        d = Decimal(value) if isinstance(value, int | str | Decimal) else Decimal(repr(value))
    except (InvalidOperation, TypeError):
        raise ValueError("data contains a value that is not a number") from None
    if not d.is_finite():
        raise ValueError("data contains a non-finite value")
    return d.quantize(Decimal(1).scaleb(-spec.scale), rounding=ROUND_HALF_UP) + 0


def _compare(op: str, a: Decimal | str, b: Decimal | str) -> bool:
    ops: dict[str, Callable[[object, object], bool]] = {
        "=": lambda x, y: x == y,
        "!=": lambda x, y: x != y,
        "<": lambda x, y: x < y,  # type: ignore[operator]
        "<=": lambda x, y: x <= y,  # type: ignore[operator]
        ">": lambda x, y: x > y,  # type: ignore[operator]
        ">=": lambda x, y: x >= y,  # type: ignore[operator]
    }
    return ops[op](a, b)


def truth(cond: Cond, values: Mapping[str, Value]) -> bool | None:
    """SQL three-valued truth of `cond` (None: unknown, the row is dropped)."""
    if isinstance(cond, IsNull):
        return (values[cond.column] is not None) if cond.negated else values[cond.column] is None
    if isinstance(cond, Not):
        inner = truth(cond.item, values)
        return None if inner is None else not inner
    if isinstance(cond, BoolOp):
        seen = [truth(c, values) for c in cond.items]
        decisive = cond.op == "or"  # True decides an OR, False an AND
        if decisive in seen:
            return decisive
        return None if None in seen else not decisive
    v = values[cond.column]
    if v is None:
        return None
    if isinstance(cond, Cmp):
        return _compare(cond.op, v, cond.value)
    assert isinstance(cond, InList)
    found = any(v == x for x in cond.values)
    return not found if cond.negated else found


def _clamp(d: Decimal | None, spec: NumericSpec) -> int | None:
    return None if d is None else spec.to_int(min(max(d, spec.lower), spec.upper))


def _kept(q: BoundedQuery, row: Row) -> tuple[dict[str, Value], tuple[str | int | None, ...]]:
    """(the typed values of the row's columns, the bounded row's field values)."""
    values: dict[str, Value] = {}
    for col in q.where_columns() | set(q.fields()):
        spec = q.numeric.get(col)
        values[col] = fixed(row.get(col), spec) if spec else text_of(row.get(col))
    out: list[str | int | None] = []
    for col in q.fields():
        spec = q.numeric.get(col)
        v = values[col]
        if isinstance(v, Decimal) and spec is not None:
            out.append(_clamp(v, spec))
        else:
            out.append(None if v is None else str(v))
    return values, tuple(out)


def _admitted(q: BoundedQuery, values: Mapping[str, Value]) -> bool:
    if q.where is not None and truth(q.where, values) is not True:
        return False
    for col in q.group_by:
        if values[col] is None or (col in q.domains and values[col] not in q.domains[col]):
            return False
    split = q.split
    return not (
        split is not None
        and split.kind == "values"
        and split.column in q.domains
        and values[split.column] not in q.domains[split.column]
    )


def bounded(q: BoundedQuery, rows: Iterable[Row]) -> list[tuple[str | None, tuple[object, ...]]]:
    """The bounded rows: (unit text, field values), after filtering and bounding."""
    fields = q.fields()
    by_unit: dict[str | None, list[tuple[str, tuple[str | int | None, ...]]]] = {}
    dups: dict[tuple[object, ...], int] = {}
    for row in rows:
        values, kept = _kept(q, row)
        if not _admitted(q, values):
            continue
        unit = text_of(row.get(q.unit))
        texts = tuple(None if v is None else str(v) for v in kept)
        dup = dups[(unit, texts)] = dups.get((unit, texts), 0) + 1
        by_unit.setdefault(unit, []).append((row_key(q.key_hex, (unit, *texts), dup), kept))
    depth = len(q.group_by)
    out: list[tuple[str | None, tuple[object, ...]]] = []
    for unit, ranked in by_unit.items():
        groups: dict[tuple[object, ...], list[tuple[str, tuple[str | int | None, ...]]]] = {}
        for h, kept in ranked:
            groups.setdefault(kept[:depth], []).append((h, kept))
        names = sorted(groups, key=lambda g: group_key(q.key_hex, (unit, *map(str, g))))
        if q.groups_per_unit is not None:
            names = names[: q.groups_per_unit]
        for g in names:
            for _, kept in sorted(groups[g])[: q.rows_per_unit]:
                out.append((unit, kept))
    del fields
    return out


def run(q: BoundedQuery, rows: Iterable[Row]) -> Result:
    """The bounded aggregation (plan.py) of `rows`, per fine group."""
    depth = len(q.group_by)
    fields = q.fields()
    result: Result = {}
    seen: set[tuple[object, ...]] = set()
    for unit, kept in bounded(q, rows):
        values = dict(zip(fields, kept, strict=True))
        key: FineKey = tuple(values[c] for c in q.group_by)  # type: ignore[misc]
        if q.split is not None:
            v = values[q.split.column]
            spec = q.numeric.get(q.split.column)
            if q.split.kind == "cells" and spec is not None and isinstance(v, int):
                key = (*key, cell_code(spec, v))
            else:
                key = (*key, v if v is None else str(v))
        t = result.setdefault(key, Totals())
        t.rows += 1
        if (q.group_by or q.groups_per_unit is not None) and (unit, kept[:depth]) not in seen:
            seen.add((unit, kept[:depth]))
            t.units += 1
        for c in q.sums:
            v = values[c]
            if isinstance(v, int):
                t.sums[c] = t.sums.get(c, 0) + v
                t.counts[c] = t.counts.get(c, 0) + 1
            else:
                t.sums.setdefault(c, 0)
                t.counts.setdefault(c, 0)
    return result
