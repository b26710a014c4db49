"""Spark (local mode) returns the reference's bounded true aggregate and bounded rows, exactly.

Skipped, with the reason, only when pyspark is not installed or no Java runtime
can be found. Few and small: starting a local Spark costs seconds.
"""

from __future__ import annotations

import csv
import random
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.engines import duck, reference
from fedldp.aggregator.engines.plan import BoolOp, BoundedQuery, Cmp, IsNull, NumericSpec, Split

pytestmark = pytest.mark.spark

SPEC = NumericSpec(Decimal("-5"), Decimal("20"), 1)


def _spark_or_skip() -> Any:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install fedldp[spark])")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (java) on PATH: Spark local mode needs a JVM 17+")
    from fedldp.aggregator.engines import spark

    return spark


def _table(path: Path) -> None:
    rng = random.Random(7)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "region", "minutes"])
        for _ in range(400):
            w.writerow(
                [
                    f"u{rng.randrange(30)}",  # about 13 rows per unit: far past every bound
                    rng.choice(["eu", "us", "", "é-asia"]),
                    rng.choice(["", "2.5", "2.25", "-7", "25", str(rng.randrange(-10, 30))]),
                ]
            )


# The JVM of a test-sized local session: C1 only, one compiler thread, the serial collector.
# Its start-up and JIT cost 35 s of CPU with the defaults, 18 s with these (the Python side
# of the test is 3 s); a real cluster keeps the JVM defaults.
_TEST_JVM_OPTIONS = (
    "-XX:TieredStopAtLevel=1 -XX:CICompilerCount=1 -XX:+UseSerialGC -XX:-UsePerfData"
)


def test_spark_local_matches_the_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spark = _spark_or_skip()
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", _TEST_JVM_OPTIONS)
    path = tmp_path / "t.csv"
    _table(path)
    parquet = tmp_path / "t.parquet"
    duck._connection().execute(
        f"COPY (SELECT * FROM read_csv('{path}', all_varchar = true)) "
        f"TO '{parquet}' (FORMAT parquet)"
    )
    where = BoolOp("or", (Cmp("minutes", ">=", Decimal("2.5")), IsNull("minutes")))

    def make(key: bytes, **kw: Any) -> BoundedQuery:
        return BoundedQuery(unit="user", numeric={"minutes": SPEC}, rows_per_unit=2, key=key, **kw)

    grouped = make(b"c", group_by=("region",), sums=("minutes",), groups_per_unit=2)
    cells = make(b"b", split=Split("minutes", "cells"), where=where)
    for q, source in (
        (grouped, duck.FileSource(path, "csv")),
        (cells, duck.FileSource(parquet, "parquet")),
    ):
        with path.open(newline="", encoding="utf-8") as fh:
            expected = reference.run(q, csv.DictReader(fh))
        assert spark.run(q, source, "local[1]") == expected
    # a DP-SGD job's table (duck.rows' contract), in the same session: starting a JVM
    # costs seconds, so every Spark check of the suite shares this one
    rows_q = make(b"r", carry=("region", "minutes"))
    with path.open(newline="", encoding="utf-8") as fh:
        kept = sorted(
            (str(k), -1 if m is None else m)
            for _, (k, m) in reference.bounded(rows_q, csv.DictReader(fh))
        )
    table = spark.rows(rows_q, duck.FileSource(parquet, "parquet"), "local[1]")
    assert table.column_names == ["region", "minutes"]
    got = zip(table.column("region").to_pylist(), table.column("minutes").to_pylist(), strict=True)
    assert sorted((str(k), -1 if m is None else m) for k, m in got) == kept
