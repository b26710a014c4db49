"""DP SQL for analysts: one SELECT parsed with sqlglot into a grouped release plan.

Accepted: `SELECT <group columns and aggregates> FROM <dataset> [WHERE <condition>]
[GROUP BY <categorical columns>]`, where an aggregate is COUNT(*), SUM(col),
AVG(col), MEDIAN(col) or QUANTILE_CONT(col, q) / PERCENTILE_CONT(col, q) on a
declared numeric column, and a condition combines =, <>, <, <=, >, >=, IN,
BETWEEN, IS [NOT] NULL, AND, OR, NOT over declared columns and literals.
Everything else is refused with a named reason (`SqlRefusedError`) before any
budget is reserved: joins, subqueries, CTEs, DISTINCT, HAVING, ORDER BY,
LIMIT, window functions, expressions inside aggregates, undeclared columns,
the privacy-unit column, several statements. Refusals depend on the query
text and the public catalog only, never on the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from fedldp.aggregator.engines.plan import BoolOp, Cmp, Cond, InList, IsNull, Not

#: Largest SQL text accepted (characters).
MAX_SQL = 10_000


class SqlRefusedError(ValueError):
    """The SQL is outside the supported subset (its message names the construct)."""


@dataclass(frozen=True)
class SqlAggregate:
    """One aggregate of the SELECT list."""

    label: str
    kind: str  # count, sum, mean, quantile
    column: str | None
    quantile: Decimal | None = None


@dataclass(frozen=True)
class SqlPlan:
    """The parsed query."""

    table: str
    where: Cond | None
    group_by: tuple[str, ...]
    aggregates: tuple[SqlAggregate, ...]


_FORBIDDEN = (
    "Join",
    "Subquery",
    "With",
    "Distinct",
    "Having",
    "Order",
    "Limit",
    "Window",
    "Union",
    "Intersect",
    "Except",
    "Lateral",
    "Offset",
    "Qualify",
)


def _column(node: Any, columns: Mapping[str, str], what: str) -> str:
    import sqlglot.expressions as exp

    if not isinstance(node, exp.Column) or node.table:
        raise SqlRefusedError(f"{what} must be a plain declared column name")
    name = str(node.name)
    if name not in columns:
        raise SqlRefusedError(f"column {name!r} is not declared in the catalog for this dataset")
    return name


def _literal(node: Any, kind: str) -> Decimal | str:
    import sqlglot.expressions as exp

    negative = isinstance(node, exp.Neg)
    inner = node.this if negative else node
    if not isinstance(inner, exp.Literal):
        raise SqlRefusedError("conditions compare a column with a literal only")
    if kind == "numeric":
        if inner.is_string:
            raise SqlRefusedError("a numeric column is compared with a number")
        try:
            value = Decimal(str(inner.this))
        except InvalidOperation:
            raise SqlRefusedError("a numeric literal is not a number") from None
        return -value if negative else value
    if not inner.is_string or negative:
        raise SqlRefusedError("a categorical column is compared with a quoted string")
    return str(inner.this)


def _condition(node: Any, columns: Mapping[str, str]) -> Cond:
    import sqlglot.expressions as exp

    if isinstance(node, exp.Paren):
        return _condition(node.this, columns)
    if isinstance(node, exp.And | exp.Or):
        op: Literal["and", "or"] = "and" if isinstance(node, exp.And) else "or"
        return BoolOp(op, (_condition(node.this, columns), _condition(node.expression, columns)))
    if isinstance(node, exp.Not):
        inner = node.this
        if isinstance(inner, exp.Is):
            return IsNull(_column(inner.this, columns, "IS NULL's operand"), negated=True)
        return Not(_condition(inner, columns))
    if isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise SqlRefusedError("IS compares with NULL only")
        return IsNull(_column(node.this, columns, "IS NULL's operand"))
    ops = {exp.EQ: "=", exp.NEQ: "!=", exp.LT: "<", exp.LTE: "<=", exp.GT: ">", exp.GTE: ">="}
    for cls, sign in ops.items():
        if isinstance(node, cls):
            col = _column(node.this, columns, "a comparison's left side")
            return Cmp(col, sign, _literal(node.expression, columns[col]))
    if isinstance(node, exp.In):
        col = _column(node.this, columns, "IN's operand")
        if node.args.get("query") is not None:
            raise SqlRefusedError("IN takes a list of literals, not a subquery")
        return InList(col, tuple(_literal(v, columns[col]) for v in node.expressions))
    if isinstance(node, exp.Between):
        col = _column(node.this, columns, "BETWEEN's operand")
        low = _literal(node.args["low"], columns[col])
        high = _literal(node.args["high"], columns[col])
        return BoolOp("and", (Cmp(col, ">=", low), Cmp(col, "<=", high)))
    raise SqlRefusedError(f"unsupported condition {type(node).__name__.upper()}")


def _aggregate(node: Any, label: str, columns: Mapping[str, str]) -> SqlAggregate:
    import sqlglot.expressions as exp

    if isinstance(node, exp.Count):
        if not isinstance(node.this, exp.Star):
            raise SqlRefusedError(
                "COUNT takes * only (COUNT(column) or COUNT(DISTINCT) is not supported)"
            )
        return SqlAggregate(label, "count", None)
    kinds = {exp.Sum: "sum", exp.Avg: "mean", exp.Median: "quantile"}
    for cls, kind in kinds.items():
        if isinstance(node, cls):
            col = _column(node.this, columns, f"{kind}'s argument")
            if columns[col] != "numeric":
                raise SqlRefusedError(f"{kind} needs a numeric column; {col!r} is categorical")
            return SqlAggregate(label, kind, col, Decimal("0.5") if kind == "quantile" else None)
    if isinstance(node, exp.PercentileCont | exp.Quantile):
        col = _column(node.this, columns, "the quantile's column")
        q = _literal(node.expression, "numeric")
        if columns[col] != "numeric":
            raise SqlRefusedError(f"a quantile needs a numeric column; {col!r} is categorical")
        return SqlAggregate(label, "quantile", col, Decimal(q))
    raise SqlRefusedError(
        f"unsupported select item {type(node).__name__.upper()}: use a GROUP BY column, "
        "COUNT(*), SUM, AVG, MEDIAN or QUANTILE_CONT(column, q)"
    )


def parse(sql: str, datasets: Mapping[str, Mapping[str, str]]) -> SqlPlan:
    """The plan of `sql`; `datasets` maps each dataset id to {column: "numeric" or
    "categorical"} (its declared columns). SqlRefusedError names what is not supported."""
    import sqlglot
    import sqlglot.expressions as exp
    from sqlglot.errors import ParseError

    if len(sql) > MAX_SQL:
        raise SqlRefusedError(f"the query is longer than {MAX_SQL} characters")
    try:
        statements = sqlglot.parse(sql, read="duckdb")
    except ParseError:
        raise SqlRefusedError("the query does not parse as SQL") from None
    if len(statements) != 1 or not isinstance(statements[0], exp.Select):
        raise SqlRefusedError("exactly one SELECT statement is supported")
    tree = statements[0]
    for name in _FORBIDDEN:
        cls = getattr(exp, name, None)
        if cls is not None and tree.find(cls) is not None:
            raise SqlRefusedError(f"{name.upper()} is not supported")
    source = tree.args.get("from_") or tree.args.get("from")
    tables = list(tree.find_all(exp.Table))
    if source is None or len(tables) != 1 or not isinstance(source.this, exp.Table):
        raise SqlRefusedError("FROM names exactly one dataset")
    table = str(tables[0].name)
    if table not in datasets:
        raise SqlRefusedError(f"no dataset {table!r} is open to you")
    columns = datasets[table]
    group = tree.args.get("group")
    group_by = tuple(_column(g, columns, "GROUP BY") for g in (group.expressions if group else []))
    for g in group_by:
        if columns[g] != "categorical":
            raise SqlRefusedError(f"GROUP BY takes categorical columns; {g!r} is numeric")
    where_node = tree.args.get("where")
    where = _condition(where_node.this, columns) if where_node is not None else None
    aggregates = []
    for item in tree.expressions:
        node, label = (item.this, str(item.alias)) if isinstance(item, exp.Alias) else (item, "")
        if isinstance(node, exp.Column):
            if _column(node, columns, "a select item") not in group_by:
                raise SqlRefusedError(f"column {node.name!r} is selected but not in GROUP BY")
            continue
        agg = _aggregate(node, label or node.sql(dialect="duckdb").lower(), columns)
        aggregates.append(agg)
    if not aggregates:
        raise SqlRefusedError("select at least one aggregate")
    if len({a.label for a in aggregates}) != len(aggregates):
        raise SqlRefusedError("two aggregates have the same label: give them distinct aliases")
    if len({a.column for a in aggregates if a.kind == "quantile"}) > 1:
        raise SqlRefusedError("quantiles of at most one column per query")
    return SqlPlan(table, where, group_by, tuple(aggregates))
