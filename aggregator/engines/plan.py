"""The bounded aggregation every engine computes, and the contribution bounding it implies.

A release compiles to one `BoundedQuery`: which rows (a WHERE over declared
columns), how each privacy unit's contribution is bounded, and which additive
statistics of the bounded rows come back, per *fine group* (the GROUP BY key
plus, optionally, one split column: a categorical column's value, or the
quantile grid cell of a numeric column). Every statistic returned is additive
over fine groups, so one engine query serves count, sum, mean, histogram,
choice and quantile, grouped or not (`Totals`).

Bounding (Wilson et al. 2020, "Differentially private SQL with bounded user
contribution", PoPETs; PipelineDP's contribution bounding), in this order:

1. the WHERE filter, and rows whose GROUP BY key is NULL or outside a public
   domain are dropped (data-independent filters: the bound holds after them);
2. numeric values become fixed-point decimals with the column's declared
   `scale` places (`CAST(... AS DECIMAL(38, scale))`), then are clamped to the
   declared [lower, upper]; NULL stays NULL (SUM/AVG/quantiles skip it,
   COUNT(*) counts the row);
3. each row gets a rank key: SHA-256 of a per-release secret key (32 bytes from
   the OS CSPRNG, hex) and the row's canonical content (`row_content`) and its
   duplicate ordinal (1, 2, ... among rows identical in every field the query
   uses, in any order: identical rows are interchangeable, so every engine may
   number them differently and still pick the same multiset). Distinct rows get
   distinct keys, so ordering by the key is a pseudo-random permutation of a
   unit's rows, unknown to anyone without the key, and fresh for each release;
4. ungrouped: each unit keeps its `rows_per_unit` (c) rows of smallest rank
   key: a uniformly random c-subset (not "the first c rows read");
   grouped: each unit keeps at most `groups_per_unit` (L0) of its groups, those
   of smallest group key (SHA-256 of the key and the unit's and group's
   canonical content), and at most `rows_per_unit` (L∞) rows per kept group.

Why a hash of the content and not of a row number: no row number is defined
identically in DuckDB, Spark and Python over the same Parquet or CSV data
(parallel scans, `monotonically_increasing_id`), while SHA-256, byte lengths,
string concatenation and integer text are. Secret-prefix SHA-256 is used as a
keyed hash because it is the one keyed construction both SQL dialects can
compute (no HMAC in DuckDB or Spark SQL); its known weakness, length
extension, needs the digests, which never leave the engine.

Numeric content is hashed as the integer value·10^scale of the *clamped*
value (decimal-to-text differs between engines; integer text does not).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

#: Bytes of the per-release bounding key.
KEY_BYTES = 32
#: Quantile grid intervals (aggregator/central/quantile.py STEPS).
GRID = 1000
#: Largest |integer| the engines compute with (BIGINT).
INT_LIMIT = 2**62


class PlanError(ValueError):
    """The query cannot be planned (a named reason, said before any budget is reserved)."""


class EngineError(ValueError):
    """The engine failed on the data (a value it cannot cast, an unreadable file...).

    Its message is fixed: an engine's own error text may quote a value of the data.
    """

    def __init__(self, engine: str) -> None:
        """`engine`: the engine's name (the only detail kept)."""
        super().__init__(f"the {engine} engine could not compute the bounded aggregate")


@dataclass(frozen=True)
class NumericSpec:
    """A declared numeric column: bounds and fixed-point scale (decimal places)."""

    lower: Decimal
    upper: Decimal
    scale: int

    def to_int(self, value: Decimal) -> int:
        """value·10^scale as an exact integer (value has at most `scale` places)."""
        return int(value.scaleb(self.scale))

    def check(self, name: str) -> None:
        """PlanError when the column's integers could leave BIGINT in some engine."""
        widest = max(abs(self.lower), abs(self.upper)).scaleb(self.scale) * GRID * 2
        if widest >= INT_LIMIT:
            raise PlanError(
                f"column {name}: bounds times 10^scale are too large for exact integer "
                "arithmetic in the engines (lower the scale or the bounds)"
            )


@dataclass(frozen=True)
class Cmp:
    """column <op> literal (op: = != < <= > >=); NULL compares to nothing."""

    column: str
    op: str
    value: Decimal | str


@dataclass(frozen=True)
class InList:
    """column [NOT] IN (literals)."""

    column: str
    values: tuple[Decimal | str, ...]
    negated: bool = False


@dataclass(frozen=True)
class IsNull:
    """column IS [NOT] NULL."""

    column: str
    negated: bool = False


@dataclass(frozen=True)
class BoolOp:
    """AND / OR of conditions (SQL three-valued logic)."""

    op: Literal["and", "or"]
    items: tuple[Cond, ...]


@dataclass(frozen=True)
class Not:
    """NOT condition (NOT NULL is NULL: the row is dropped)."""

    item: Cond


Cond = Cmp | InList | IsNull | BoolOp | Not


@dataclass(frozen=True)
class Split:
    """The column that subdivides each group: a categorical column's values (histogram,
    choice) or a numeric column's quantile grid cells."""

    column: str
    kind: Literal["values", "cells"]


@dataclass(frozen=True)
class BoundedQuery:
    """One bounded aggregation (module docstring)."""

    unit: str
    numeric: Mapping[str, NumericSpec]
    group_by: tuple[str, ...] = ()
    sums: tuple[str, ...] = ()
    split: Split | None = None
    where: Cond | None = None
    rows_per_unit: int = 1
    groups_per_unit: int | None = None
    #: Public domains of categorical GROUP BY / split columns (rows outside are dropped).
    domains: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    key: bytes = b""
    #: Further columns the bounded rows carry (`bounded_rows`: a DP-SGD job's label and
    #: features); they are hashed with the others, so they take part in the ranking.
    carry: tuple[str, ...] = ()

    def fields(self) -> tuple[str, ...]:
        """The columns the bounded rows carry (and are hashed on): group, sums, split,
        then `carry`."""
        names = [*self.group_by, *self.sums]
        if self.split is not None:
            names.append(self.split.column)
        names.extend(self.carry)
        return tuple(dict.fromkeys(names))

    def where_columns(self) -> set[str]:
        """Columns the WHERE reads."""
        out: set[str] = set()
        stack: list[Cond] = [] if self.where is None else [self.where]
        while stack:
            c = stack.pop()
            if isinstance(c, BoolOp):
                stack.extend(c.items)
            elif isinstance(c, Not):
                stack.append(c.item)
            else:
                out.add(c.column)
        return out

    @property
    def key_hex(self) -> str:
        """The bounding key as lowercase hex (the form every engine hashes)."""
        return self.key.hex()


def fresh_key() -> bytes:
    """A per-release bounding key from the OS CSPRNG."""
    return secrets.token_bytes(KEY_BYTES)


@dataclass
class Totals:
    """Additive statistics of one fine group's bounded rows.

    `rows`: COUNT(*); `units`: distinct privacy units (each unit's first kept row
    in the group counts 1), for grouped queries only (the partition selection's
    input; 0 for ungrouped ones, so engines may skip ranking units with at most
    c rows); `sums[c]`: Σ value·10^scale of the non-NULL clamped
    values of column c (an exact integer); `counts[c]`: how many there are.
    """

    rows: int = 0
    units: int = 0
    sums: dict[str, int] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)


#: Fine-group key: the GROUP BY values, then the split value (a text, or the cell code
#: 2·cell + (0 on the grid point, 1 strictly after it)).
FineKey = tuple[str | int | None, ...]
Result = dict[FineKey, Totals]


def row_content(texts: tuple[str | None, ...]) -> str:
    """Canonical, unambiguous text of a row's fields: `<utf-8 length>:<text>` each, `~`
    for NULL (the same expression in every engine's SQL)."""
    return "".join("~" if t is None else f"{len(t.encode())}:{t}" for t in texts)


def row_key(key_hex: str, texts: tuple[str | None, ...], dup: int) -> str:
    """The rank key of a row (module docstring, step 3)."""
    return hashlib.sha256(f"{key_hex}|{row_content(texts)}|{dup}".encode()).hexdigest()


def group_key(key_hex: str, texts: tuple[str | None, ...]) -> str:
    """The rank key of a (unit, group) pair (module docstring, step 4)."""
    return hashlib.sha256(f"{key_hex}|g|{row_content(texts)}".encode()).hexdigest()


def cell_code(spec: NumericSpec, clamped: int) -> int:
    """2·cell + (0 when the value is the grid point c_cell, else 1), from value·10^scale."""
    width = spec.to_int(spec.upper) - spec.to_int(spec.lower)
    num = (clamped - spec.to_int(spec.lower)) * GRID
    return 2 * (num // width) + (0 if num % width == 0 else 1)


def cells(result: Result, depth: int) -> dict[FineKey, tuple[list[int], list[int]]]:
    """Per group (the first `depth` key parts): the (on, between) record counts of each
    quantile grid cell (quantile.scores_from_cells)."""
    out: dict[FineKey, tuple[list[int], list[int]]] = {}
    for key, totals in result.items():
        group, code = key[:depth], key[depth]
        on, between = out.setdefault(group, ([0] * (GRID + 1), [0] * (GRID + 1)))
        if code is None:
            continue
        assert isinstance(code, int)
        (on if code % 2 == 0 else between)[code // 2] += totals.rows
    return out


def merge(result: Result, depth: int) -> Result:
    """Totals summed over the split (key parts past `depth`)."""
    out: Result = {}
    for key, t in result.items():
        m = out.setdefault(key[:depth], Totals())
        m.rows += t.rows
        m.units += t.units
        for c, v in t.sums.items():
            m.sums[c] = m.sums.get(c, 0) + v
        for c, v in t.counts.items():
            m.counts[c] = m.counts.get(c, 0) + v
    return out
