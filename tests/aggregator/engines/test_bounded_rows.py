"""The bounded rows an engine reads for a DP-SGD job are exactly the reference's.

`duck.rows` (sqlgen.compile_rows) must return the same multiset of bounded rows
as `reference.bounded` for the same query and key: at most c rows per unit,
chosen by the keyed hash, numeric values clamped, on generated tables (ties,
NULLs, values outside the bounds, units with more rows than c), over a CSV and
its Parquet copy. The choice is a keyed random one per unit, not the first rows
read: a broken variant that keeps the first row of each unit is kept here and
must fail the check.
"""

from __future__ import annotations

import csv
import tempfile
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.engines import duck, reference
from fedldp.aggregator.engines.plan import BoundedQuery, Cmp, NumericSpec, PlanError, Split
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.aggregator.engines.test_equivalence import COLUMNS, _write, rows

SPEC = NumericSpec(Decimal("-5"), Decimal("20"), 1)


def _query(key: bytes, c: int, **kw: Any) -> BoundedQuery:
    return BoundedQuery(
        unit="user",
        numeric={"minutes": SPEC},
        rows_per_unit=c,
        carry=("region", "minutes"),
        key=key,
        **kw,
    )


def _reference_rows(q: BoundedQuery, path: Path) -> Counter[tuple[object, ...]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return Counter(kept for _, kept in reference.bounded(q, csv.DictReader(fh)))


def _engine_rows(table: Any) -> Counter[tuple[object, ...]]:
    return Counter(zip(*(table.column(n).to_pylist() for n in table.column_names), strict=True))


@settings(
    max_examples=12, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(rows, st.integers(1, 3), st.booleans())
def test_duckdb_reads_the_reference_bounded_rows(
    table: list[tuple[str, str | None, str | None]], c: int, filtered: bool
) -> None:
    where = Cmp("minutes", ">=", Decimal("2.5")) if filtered else None
    q = _query(b"train", c, where=where)
    with tempfile.TemporaryDirectory() as tmp:
        path, parquet = _write(table, Path(tmp))
        expected = _reference_rows(q, path)
        for source in (duck.FileSource(path, "csv"), duck.FileSource(parquet, "parquet")):
            got = duck.rows(q, source)
            assert got.column_names == ["region", "minutes"]
            assert _engine_rows(got) == expected, q


def test_the_kept_row_is_a_keyed_random_choice_not_the_first_read(tmp_path: Path) -> None:
    """Unit u1 has rows 0..3 in file order; over 200 fixed keys each is kept about a
    quarter of the time. Fixed keys make the check deterministic; the broken variant
    (first row read) keeps row 0 every time and fails it."""
    table = [("u1", "eu", str(i)) for i in range(4)] + [("u2", "us", "7")]
    path, _ = _write(table, tmp_path)
    assert COLUMNS == ("user", "region", "minutes")
    source = duck.FileSource(path, "csv")
    picks: Counter[int] = Counter()
    for k in range(200):
        got = _engine_rows(duck.rows(_query(f"k{k}".encode(), 1), source))
        assert got[("us", 70)] == 1 and sum(got.values()) == 2
        picks.update(int(str(m)) // 10 for region, m in got if region == "eu")

    def uniform(counts: Counter[int]) -> bool:
        return sorted(counts) == [0, 1, 2, 3] and all(25 <= n <= 75 for n in counts.values())

    assert uniform(picks), picks
    first_read = Counter({0: 200})  # the broken variant: "the first c rows read"
    assert not uniform(first_read)


def test_bounded_rows_are_read_only_for_ungrouped_carrying_queries(tmp_path: Path) -> None:
    path, _ = _write([("u1", "eu", "1")], tmp_path)
    for bad in (
        _query(b"k", 1, group_by=("region",)),
        _query(b"k", 1, split=Split("minutes", "cells")),
        _query(b"k", 1, sums=("minutes",)),
    ):
        with pytest.raises(PlanError):
            duck.rows(bad, duck.FileSource(path, "csv"))
