"""Compile a `BoundedQuery` into one SQL statement (DuckDB or Spark SQL).

The statement implements plan.py's definition with the functions both
dialects share (SHA-256 as hex, byte lengths, `||`, window functions), so
DuckDB and Spark return the same fine-group totals as reference.py. Only
identifiers the catalog declares and literals the plan holds (decimals,
texts, quoted here) appear in it; nothing of the analyst's SQL text is pasted.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Literal

from fedldp.aggregator.engines.plan import (
    GRID,
    BoolOp,
    BoundedQuery,
    Cmp,
    Cond,
    InList,
    IsNull,
    Not,
    NumericSpec,
    PlanError,
)

Dialect = Literal["duckdb", "spark"]


def ident(name: str, dialect: Dialect) -> str:
    """A quoted identifier."""
    if dialect == "spark":
        return "`" + name.replace("`", "``") + "`"
    return '"' + name.replace('"', '""') + '"'


def text(value: str) -> str:
    """A quoted string literal (both dialects; backslashes doubled for Spark's parser)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def decimal(value: Decimal, scale: int) -> str:
    """A DECIMAL(38, scale) literal."""
    return f"CAST({text(format(value, 'f'))} AS DECIMAL(38, {scale}))"


@dataclass(frozen=True)
class _Names:
    """Column aliases inside the statement."""

    dialect: Dialect

    def col(self, i: int) -> str:
        return f"f{i}"

    def sha(self, expr: str) -> str:
        return f"sha256({expr})" if self.dialect == "duckdb" else f"sha2({expr}, 256)"

    def blen(self, expr: str) -> str:
        return f"strlen({expr})" if self.dialect == "duckdb" else f"octet_length({expr})"

    def idiv(self, a: str, b: str) -> str:
        return f"(({a}) // ({b}))" if self.dialect == "duckdb" else f"(({a}) DIV ({b}))"

    def same(self, a: str, b: str) -> str:
        """NULL-safe equality (NULL equals NULL, as in a PARTITION BY)."""
        return f"({a} IS NOT DISTINCT FROM {b})" if self.dialect == "duckdb" else f"({a} <=> {b})"


def _raw(q: BoundedQuery, col: str, d: Dialect) -> str:
    """The typed value of a source column: fixed-point decimal or text."""
    spec = q.numeric.get(col)
    if spec is not None:
        return f"CAST({ident(col, d)} AS DECIMAL(38, {spec.scale}))"
    return f"CAST({ident(col, d)} AS STRING)"


def _literal(q: BoundedQuery, col: str, value: Decimal | str) -> str:
    spec = q.numeric.get(col)
    if spec is not None:
        assert isinstance(value, Decimal)
        exponent = value.as_tuple().exponent
        places = -exponent if isinstance(exponent, int) else 0
        return decimal(value, max(spec.scale, places))
    return text(str(value))


def condition(q: BoundedQuery, cond: Cond, d: Dialect) -> str:
    """SQL text of a WHERE condition (SQL's own three-valued logic)."""
    if isinstance(cond, BoolOp):
        joiner = " AND " if cond.op == "and" else " OR "
        return "(" + joiner.join(condition(q, c, d) for c in cond.items) + ")"
    if isinstance(cond, Not):
        return f"(NOT {condition(q, cond.item, d)})"
    raw = _raw(q, cond.column, d)
    if isinstance(cond, IsNull):
        return f"({raw} IS {'NOT ' if cond.negated else ''}NULL)"
    if isinstance(cond, Cmp):
        op = "<>" if cond.op == "!=" else cond.op
        return f"({raw} {op} {_literal(q, cond.column, cond.value)})"
    assert isinstance(cond, InList)
    items = ", ".join(_literal(q, cond.column, v) for v in cond.values)
    return f"({raw} {'NOT ' if cond.negated else ''}IN ({items}))"


def _clamped_int(raw: str, spec: NumericSpec) -> str:
    """value·10^scale of the clamped value, a BIGINT (NULL stays NULL: CASE, not LEAST)."""
    lo, hi = decimal(spec.lower, spec.scale), decimal(spec.upper, spec.scale)
    clamped = f"CASE WHEN {raw} < {lo} THEN {lo} WHEN {raw} > {hi} THEN {hi} ELSE {raw} END"
    factor = decimal(Decimal(10) ** spec.scale, 0)
    return f"CAST(CAST({clamped} AS DECIMAL(38, {spec.scale})) * {factor} AS BIGINT)"


def _content(exprs: list[str], n: _Names) -> str:
    """plan.row_content in SQL: `<byte length>:<text>` per field, `~` for NULL."""
    parts = [
        f"CASE WHEN {e} IS NULL THEN '~' ELSE CAST({n.blen(e)} AS STRING) || ':' || {e} END"
        for e in exprs
    ]
    return " || ".join(parts) if parts else "''"


def _src(q: BoundedQuery, source: str, d: Dialect) -> str:
    """The filtered rows: u (unit text) and f0.. (field values: text or clamped int)."""
    n = _Names(d)
    cols = [f"CAST({ident(q.unit, d)} AS STRING) AS u"]
    for i, col in enumerate(q.fields()):
        spec = q.numeric.get(col)
        raw = _raw(q, col, d)
        cols.append(f"{_clamped_int(raw, spec) if spec else raw} AS {n.col(i)}")
    where = [] if q.where is None else [condition(q, q.where, d)]
    for col in q.group_by:
        where.append(f"({_raw(q, col, d)} IS NOT NULL)")
    admitted = list(q.group_by)
    if q.split is not None and q.split.kind == "values":
        admitted.append(q.split.column)
    for col in admitted:
        if col in q.domains:
            items = ", ".join(text(v) for v in q.domains[col])
            where.append(f"({_raw(q, col, d)} IN ({items}))")
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT {', '.join(cols)} FROM {source}{clause}"


def _count_only(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """An ungrouped COUNT(*): Σ_u min(n_u, c) is the same whichever c rows are kept, so no
    row is hashed (the fast path of the most common release)."""
    c = int(q.rows_per_unit)
    return (
        f"WITH src AS ({_src(q, source, dialect)}) "
        f"SELECT coalesce(sum(CASE WHEN n > {c} THEN {c} ELSE n END), 0) AS n_rows, 0 AS n_units "
        "FROM (SELECT u, count(*) AS n FROM src GROUP BY u) AS per_unit"
    )


def _kept_ungrouped(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """The WITH clause whose last table, `both_kept`, holds the bounded rows (u, f0..) of
    an ungrouped query: a unit with at most c rows keeps them all; only the rows of
    larger units are ranked by the keyed hash (plan.py step 4), which is where the time
    goes."""
    n = _Names(dialect)
    fcols = [n.col(i) for i in range(len(q.fields()))]
    texts = ["u", *(f"CAST({c} AS STRING)" for c in fcols)]
    c = int(q.rows_per_unit)
    row_h = n.sha(f"{text(q.key_hex)} || '|' || {_content(texts, n)} || '|' || CAST(dup AS STRING)")
    cols = ", ".join(["u", *fcols])
    return (
        f"WITH src AS ({_src(q, source, dialect)}), "
        "cnt AS (SELECT *, count(*) OVER (PARTITION BY u) AS n_u FROM src), "
        f"dup AS (SELECT {cols}, row_number() OVER (PARTITION BY {cols} ORDER BY u) AS dup "
        f"FROM cnt WHERE n_u > {c}), "
        f"rk AS (SELECT {cols}, row_number() OVER (PARTITION BY u ORDER BY {row_h}) AS rn "
        "FROM dup), "
        f"both_kept AS (SELECT {cols} FROM rk WHERE rn <= {c} "
        f"UNION ALL SELECT {cols} FROM cnt WHERE n_u <= {c})"
    )


def _ungrouped(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """Ungrouped: the aggregate of `_kept_ungrouped`'s rows, per split value."""
    n = _Names(dialect)
    fields = q.fields()
    keys, group_cols = [], []
    if q.split is not None:
        keys.append(f"{_split(q, fields.index(q.split.column), n)} AS split")
        group_cols.append("split")
    stats = ["count(*) AS n_rows", "0 AS n_units"]
    for j, col in enumerate(q.sums):
        i = fields.index(col)
        stats.append(f"coalesce(sum(CAST(f{i} AS DECIMAL(38, 0))), 0) AS s{j}")
        stats.append(f"count(f{i}) AS c{j}")
    by = f" GROUP BY {', '.join(group_cols)}" if group_cols else ""
    return (
        f"{_kept_ungrouped(q, source, dialect)}, "
        f"kept AS (SELECT *, {', '.join(keys) or '1 AS one'} FROM both_kept) "
        f"SELECT {', '.join([*group_cols, *stats])} FROM kept{by}"
    )


def compile_rows(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """The bounded rows themselves (not their aggregate) of an ungrouped query: one row
    per kept row, columns f0.. in `q.fields()` order (text, or value·10^scale of the
    clamped value). For a DP-SGD job's table inside the service; never sent out."""
    if q.group_by or q.groups_per_unit is not None or q.split is not None or q.sums:
        raise PlanError("bounded rows are read for ungrouped queries that only carry columns")
    fcols = [_Names(dialect).col(i) for i in range(len(q.fields()))]
    return f"{_kept_ungrouped(q, source, dialect)} SELECT {', '.join(fcols) or '1'} FROM both_kept"


def compile_query(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """The one statement: filter, bound (plan.py), aggregate per fine group.

    Output columns: g0.. (group values), [split], n_rows, n_units, then s<i>, c<i> for
    each sum column (Σ value·10^scale and the non-NULL count).
    """
    if not q.group_by and q.groups_per_unit is None:
        if q.split is None and not q.sums:
            return _count_only(q, source, dialect)
        return _ungrouped(q, source, dialect)
    if q.split is None:
        return _grouped_by_pairs(q, source, dialect)
    n = _Names(dialect)
    fields = q.fields()
    fcols = [n.col(i) for i in range(len(fields))]
    texts = ["u", *(f"CAST({c} AS STRING)" for c in fcols)]
    depth = len(q.group_by)
    part_all = ", ".join(["u", *fcols])
    part_group = ", ".join(["u", *fcols[:depth]])
    row_h = n.sha(f"{text(q.key_hex)} || '|' || {_content(texts, n)} || '|' || CAST(dup AS STRING)")
    ranks = f"row_number() OVER (PARTITION BY {part_group} ORDER BY h) AS rn"
    keep = f"rn <= {int(q.rows_per_unit)}"
    group_h = ""
    if q.groups_per_unit is not None:
        group_h = ", " + n.sha(f"{text(q.key_hex)} || '|g|' || {_content(texts[: depth + 1], n)}")
        group_h += " AS gh"
        ranks += ", dense_rank() OVER (PARTITION BY u ORDER BY gh) AS gr"
        keep += f" AND gr <= {int(q.groups_per_unit)}"
    keys = [f"f{i} AS g{i}" for i in range(depth)]
    group_cols = [f"g{i}" for i in range(depth)]
    if q.split is not None:
        keys.append(f"{_split(q, fields.index(q.split.column), n)} AS split")
        group_cols.append("split")
    stats = [
        "count(*) AS n_rows",
        "coalesce(sum(CASE WHEN rn = 1 THEN 1 ELSE 0 END), 0) AS n_units",
    ]
    for j, col in enumerate(q.sums):
        i = fields.index(col)
        stats.append(f"coalesce(sum(CAST(f{i} AS DECIMAL(38, 0))), 0) AS s{j}")
        stats.append(f"count(f{i}) AS c{j}")
    by = f" GROUP BY {', '.join(group_cols)}" if group_cols else ""
    return (
        f"WITH src AS ({_src(q, source, dialect)}), "
        f"dup AS (SELECT *, row_number() OVER (PARTITION BY {part_all} ORDER BY u) AS dup "
        "FROM src), "
        f"hk AS (SELECT *, {row_h} AS h{group_h} FROM dup), "
        f"rk AS (SELECT *, {ranks} FROM hk), "
        f"kept AS (SELECT *, {', '.join(keys) or '1 AS one'} FROM rk WHERE {keep}) "
        f"SELECT {', '.join([*group_cols, *stats])} FROM kept{by}"
    )


def _kept_pairs(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """The WITH clause whose last table, `kp`, holds each kept (unit, group) pair with
    its row count `n` and its Σ / non-NULL count of each sum column over all its rows
    (`ps<j>`, `pc<j>`). L0 (`groups_per_unit`) ranks the pairs of a unit by the keyed
    group hash (plan.py step 4), and only for units with more than L0 pairs: a unit
    with at most L0 groups keeps them all whichever the key."""
    n = _Names(dialect)
    fields = q.fields()
    gcols = [n.col(i) for i in range(len(q.group_by))]
    stats = ["count(*) AS n"]
    for j, col in enumerate(q.sums):
        f = n.col(fields.index(col))
        stats += [f"sum(CAST({f} AS DECIMAL(38, 0))) AS ps{j}", f"count({f}) AS pc{j}"]
    pair_cols = ", ".join(["u", *gcols, "n", *(f"ps{j}, pc{j}" for j in range(len(q.sums)))])
    by = ", ".join(["u", *gcols])
    head = (
        f"WITH src AS ({_src(q, source, dialect)}), "
        f"pairs AS (SELECT {by}, {', '.join(stats)} FROM src GROUP BY {by})"
    )
    if q.groups_per_unit is None:
        return f"{head}, kp AS (SELECT {pair_cols} FROM pairs)"
    l0 = int(q.groups_per_unit)
    texts = ["u", *(f"CAST({c} AS STRING)" for c in gcols)]
    gh = n.sha(f"{text(q.key_hex)} || '|g|' || {_content(texts, n)}")
    return (
        f"{head}, "
        "ng AS (SELECT *, count(*) OVER (PARTITION BY u) AS n_g FROM pairs), "
        f"gr AS (SELECT {pair_cols}, row_number() OVER (PARTITION BY u ORDER BY {gh}) AS gr "
        f"FROM ng WHERE n_g > {l0}), "
        f"kp AS (SELECT {pair_cols} FROM ng WHERE n_g <= {l0} "
        f"UNION ALL SELECT {pair_cols} FROM gr WHERE gr <= {l0})"
    )


def _grouped_by_pairs(q: BoundedQuery, source: str, dialect: Dialect) -> str:
    """A grouped query without a split (grouped count, sum, mean; DP SQL): the same
    totals as the row-ranking statement, but a kept (unit, group) pair with at most L∞
    rows contributes its pair totals (all its rows are kept whichever the key, and a
    group's `units` counts its kept pairs); only the rows of pairs with more than L∞
    rows are ranked by the keyed row hash (plan.py step 4)."""
    n = _Names(dialect)
    fields = q.fields()
    fcols = [n.col(i) for i in range(len(fields))]
    depth = len(q.group_by)
    gcols = fcols[:depth]
    c = int(q.rows_per_unit)
    texts = ["u", *(f"CAST({f} AS STRING)" for f in fcols)]
    row_h = n.sha(f"{text(q.key_hex)} || '|' || {_content(texts, n)} || '|' || CAST(dup AS STRING)")
    joined = " AND ".join(n.same(f"s.{x}", f"b.{x}") for x in ["u", *gcols])
    part_all = ", ".join(["u", *fcols])
    part_group = ", ".join(["u", *gcols])
    easy = [*gcols, "n AS n_rows", "1 AS n_units"]
    hard = [*gcols, "1 AS n_rows", "CASE WHEN rn = 1 THEN 1 ELSE 0 END AS n_units"]
    out = [*(f"{g} AS g{i}" for i, g in enumerate(gcols)), "coalesce(sum(n_rows), 0) AS n_rows"]
    out.append("coalesce(sum(n_units), 0) AS n_units")
    for j, col in enumerate(q.sums):
        f = n.col(fields.index(col))
        easy += [f"ps{j} AS s{j}", f"pc{j} AS c{j}"]
        hard += [
            f"CAST({f} AS DECIMAL(38, 0)) AS s{j}",
            f"CASE WHEN {f} IS NULL THEN 0 ELSE 1 END AS c{j}",
        ]
        out += [f"coalesce(sum(s{j}), 0) AS s{j}", f"coalesce(sum(c{j}), 0) AS c{j}"]
    by = f" GROUP BY {', '.join(gcols)}" if gcols else ""
    return (
        f"{_kept_pairs(q, source, dialect)}, "
        f"big AS (SELECT {', '.join(['u', *gcols])} FROM kp WHERE n > {c}), "
        f"hrows AS (SELECT {', '.join('s.' + x for x in ['u', *fcols])} FROM src AS s "
        f"JOIN big AS b ON {joined}), "
        f"dup AS (SELECT *, row_number() OVER (PARTITION BY {part_all} ORDER BY u) AS dup "
        "FROM hrows), "
        f"rk AS (SELECT *, row_number() OVER (PARTITION BY {part_group} ORDER BY {row_h}) AS rn "
        "FROM dup), "
        f"parts AS (SELECT {', '.join(easy)} FROM kp WHERE n <= {c} "
        f"UNION ALL SELECT {', '.join(hard)} FROM rk WHERE rn <= {c}) "
        f"SELECT {', '.join(out)} FROM parts{by}"
    )


def _split(q: BoundedQuery, index: int, n: _Names) -> str:
    assert q.split is not None
    col = f"f{index}"
    if q.split.kind == "values":
        return col
    spec = q.numeric[q.split.column]
    width = spec.to_int(spec.upper) - spec.to_int(spec.lower)
    num = f"(({col} - {spec.to_int(spec.lower)}) * {GRID})"
    on = f"CASE WHEN {num} % {width} = 0 THEN 0 ELSE 1 END"
    return f"(2 * {n.idiv(num, str(width))} + {on})"
