"""Registration's DuckDB scan never accepts a file that the row-by-row check refuses.

`Dataset.register` first asks DuckDB whether any value or unit could violate the
declaration (`_clean_in_duckdb`); only a flagged file is read row by row in Python.
The scan must therefore be at least as strict as `_check_value`: on generated
files (odd numerals, huge numbers, NaN, blanks, too many places, units past the
bound) whenever the scan passes, the Python check passes too, and it finds every
refusal the Python check finds on the handpicked cases below.
"""

from __future__ import annotations

import csv
import tempfile
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.aggregator.service.catalog import (
    CategoricalColumn,
    Dataset,
    NumericColumn,
    RegistrationError,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NUMERALS = [
    "1", "-2", "2.5", "2.55", "2.555", "1e2", " 5", "5.", "+3", "NaN", "Infinity", "",
    "1" + "0" * 40, "100", "100.01", "-0", "0.0", "abc", "١",
]  # fmt: skip
CITIES = ["paris", "lyon", "", "Paris", "nice "]


def _dataset(folder: Path, table: list[tuple[str, str, str]], bound: int) -> Dataset:
    path = folder / "d.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "amount", "city"])
        w.writerows(table)
    columns: dict[str, NumericColumn | CategoricalColumn] = {
        "amount": NumericColumn(Decimal("-5"), Decimal("100"), 2),
        "city": CategoricalColumn(("paris", "lyon")),
    }
    return Dataset("d", "user", bound, columns, [], csv_path=path)


def _python_accepts(ds: Dataset) -> bool:
    ds._clean_in_duckdb = lambda: False  # type: ignore[method-assign]
    try:
        ds.register()
    except RegistrationError:
        return False
    return True


VALID = ["1", "-2", "2.5", "2.55", "100", "-0", "0.0", "-5"]
valid_rows = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(VALID), st.just("paris")),
    min_size=1,
    max_size=8,
)
#: At most one odd cell: (row, column 0-2, text), or none (then the file is clean when
#: no unit passes the bound).
odd_cell = st.none() | st.tuples(
    st.integers(0, 7),
    st.integers(0, 2),
    st.sampled_from([*NUMERALS, *CITIES]),
)


@settings(
    max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(valid_rows, odd_cell, st.integers(1, 3))
def test_the_scan_is_at_least_as_strict_as_the_row_check(
    table: list[tuple[str, str, str]], odd: tuple[int, int, str] | None, bound: int
) -> None:
    if odd is not None:
        row, column, value = odd
        cells = list(table[row % len(table)])
        cells[column] = value
        table[row % len(table)] = (cells[0], cells[1], cells[2])
    with tempfile.TemporaryDirectory() as tmp:
        ds = _dataset(Path(tmp), table, bound)
        if ds._clean_in_duckdb():
            assert _python_accepts(_dataset(Path(tmp), table, bound)), table


@pytest.mark.parametrize("amount", ["1" + "0" * 40, "2.555", "NaN", "", "100.01", "abc"])
def test_each_refused_value_is_flagged_by_the_scan(tmp_path: Path, amount: str) -> None:
    ds = _dataset(tmp_path, [("a", "1", "paris"), ("b", amount, "lyon")], 1)
    assert not ds._clean_in_duckdb()
    with pytest.raises(RegistrationError, match="row 3, column amount"):
        ds.register()


def test_a_clean_file_registers_by_the_scan_with_its_digest(tmp_path: Path) -> None:
    from fedldp.aggregator.central.receipts import file_sha256

    ds = _dataset(tmp_path, [("a", "1", "paris"), ("a", "-5", "lyon"), ("b", "2.5", "lyon")], 2)
    assert ds._clean_in_duckdb()
    ds.register()
    assert ds.registered and ds.csv_path is not None
    assert ds.sha256 == file_sha256(ds.csv_path) == ds.data_digest()
    over = _dataset(tmp_path, [("a", "1", "paris"), ("a", "-5", "lyon")], 1)
    assert not over._clean_in_duckdb()  # unit a has 2 rows, the bound is 1
