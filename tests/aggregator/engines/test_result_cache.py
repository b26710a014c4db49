"""DuckDB keeps the rows of a keyless statement (an ungrouped count) over a file only
while the file's stamp stays: a changed file is scanned again, and a statement that
uses the bounding key is never kept."""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path

from fedldp.aggregator.engines import duck
from fedldp.aggregator.engines.plan import BoundedQuery, NumericSpec, Totals, fresh_key


def _count(path: Path) -> int:
    q = BoundedQuery(unit="u", numeric={}, rows_per_unit=2, key=fresh_key())
    totals: Totals = duck.run(q, duck.FileSource(path, "csv")).get((), Totals())
    return totals.rows


def _kept(path: Path) -> int:
    """How many statements over `path` the engine keeps."""
    return sum(1 for key in list(duck._results) if key[0] == str(path))


def test_a_count_is_rescanned_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("u,x\na,1\na,2\na,3\nb,1\n", encoding="utf-8")
    assert _count(path) == 3  # min(3, 2) + min(1, 2)
    assert _count(path) == 3  # kept: the same statement over the same bytes
    assert _kept(path) == 1
    with path.open("a", encoding="utf-8") as fh:
        fh.write("c,1\n")
    assert _count(path) == 4  # the stamp moved: scanned again
    # the same size and mtime, other bytes: the ctime still moves
    st = path.stat()
    path.write_text("u,x\na,1\nb,2\nc,3\nd,1\ne,2\n", encoding="utf-8")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size
    assert _count(path) == 5 and _kept(path) == 3  # one per stamp
    # the broken variant, a cache keyed on the statement alone, would answer 3 here


def test_a_statement_that_uses_the_key_is_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("u,x\na,1\na,2\na,3\nb,1\n", encoding="utf-8")
    spec = {"x": NumericSpec(Decimal(0), Decimal(9), 0)}
    q = BoundedQuery(unit="u", numeric=spec, sums=("x",), rows_per_unit=2, key=fresh_key())
    duck.run(q, duck.FileSource(path, "csv"))
    assert _kept(path) == 0
