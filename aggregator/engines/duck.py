"""The embedded DuckDB engine: one bounded aggregation per release, in process.

Sources: a CSV file (read with every column as text, as the reference reads
it; an empty field is NULL), a Parquet file (typed columns, cast as plan.py
says), or a SQL table reached through SQLAlchemy and streamed to DuckDB as
Arrow record batches (DuckDB's own sqlite/postgres scanners are extensions it
downloads on first use, which a service without network access cannot do).
Only the fine-group totals come back (`plan.Totals`), never a row.

`duckdb` (and `pyarrow` for SQL tables) is imported when a query runs, never
at module import.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedldp.aggregator.engines.plan import BoundedQuery, EngineError, Result, Totals
from fedldp.aggregator.engines.sqlgen import compile_query, compile_rows, text

#: Rows per Arrow batch streamed from a SQL database.
SQL_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class FileSource:
    """A CSV or Parquet file."""

    path: Path
    format: str  # "csv" or "parquet"

    def relation(self, dialect: str = "duckdb") -> str:
        """The table expression that reads it (DuckDB)."""
        del dialect
        if self.format == "parquet":
            return f"read_parquet({text(str(self.path))})"
        return (
            f"read_csv({text(str(self.path))}, header = true, all_varchar = true, "
            "auto_detect = true)"
        )


@dataclass(frozen=True)
class SqlSource:
    """A table of a SQL database (SQLAlchemy URL)."""

    url: str
    table: str


Source = FileSource | SqlSource


def to_result(rows: Sequence[Sequence[Any]], q: BoundedQuery) -> Result:
    """Engine output rows (sqlgen.compile_query's columns) as fine-group totals."""
    depth = len(q.group_by) + (1 if q.split is not None else 0)
    out: Result = {}
    for row in rows:
        n_rows = int(row[depth])
        if n_rows == 0:
            continue
        key = tuple(
            None if v is None else (int(v) if isinstance(v, int) else str(v)) for v in row[:depth]
        )
        t = Totals(rows=n_rows, units=int(row[depth + 1]))
        for j, col in enumerate(q.sums):
            t.sums[col] = int(row[depth + 2 + 2 * j])
            t.counts[col] = int(row[depth + 3 + 2 * j])
        out[key] = t
    return out


def rows_table(q: BoundedQuery, kept: Sequence[Sequence[Any]]) -> Any:
    """Bounded rows (tuples of `q.fields()` values) as `rows` returns them: a pyarrow
    Table, numeric columns BIGINT value·10^scale, the others text."""
    import pyarrow as pa

    names = q.fields()
    columns = list(zip(*kept, strict=True)) if kept else [() for _ in names]
    return pa.table(
        {
            name: pa.array(
                [None if v is None else (int(v) if name in q.numeric else str(v)) for v in col],
                pa.int64() if name in q.numeric else pa.string(),
            )
            for name, col in zip(names, columns, strict=True)
        }
    )


_local = threading.local()
#: Every connection `_connection` made, closed at interpreter exit (`_close_all`): a
#: DuckDB database destroyed during finalization, from whichever thread drops it
#: last, can abort the process ("terminate called ... exception not rethrown").
_opened: list[Any] = []
_opened_lock = threading.Lock()


def _close_all() -> None:
    """Close every cached connection (atexit), while the interpreter is whole."""
    with _opened_lock:
        while _opened:
            with contextlib.suppress(Exception):  # closing at exit must not raise
                _opened.pop().close()


def _connection() -> Any:
    """One in-memory DuckDB connection per thread (connecting costs ~10 ms)."""
    import duckdb

    con = getattr(_local, "con", None)
    if con is None:
        con = duckdb.connect(":memory:")
        _local.con = con
        with _opened_lock:
            if not _opened:
                atexit.register(_close_all)
            _opened.append(con)
    return con


def _sql_batches(source: SqlSource, columns: Sequence[str]) -> Any:
    """An Arrow RecordBatchReader over the table's columns (every value as text)."""
    import pyarrow as pa
    import sqlalchemy as sa

    schema = pa.schema([(c, pa.string()) for c in columns])

    def batches() -> Iterator[Any]:
        engine = sa.create_engine(source.url)
        try:
            table = sa.Table(source.table, sa.MetaData(), autoload_with=engine)
            with engine.connect() as conn:
                result = conn.execution_options(stream_results=True).execute(
                    sa.select(*(table.c[c] for c in columns))
                )
                while chunk := result.fetchmany(SQL_BATCH_ROWS):
                    cols = list(zip(*chunk, strict=True))
                    yield pa.record_batch(
                        [
                            pa.array([None if v is None else str(v) for v in col], pa.string())
                            for col in cols
                        ],
                        schema=schema,
                    )
        finally:
            engine.dispose()

    return pa.RecordBatchReader.from_batches(schema, batches())


def _execute(q: BoundedQuery, source: Source, compile_: Any, arrow: bool) -> Any:
    """Run `compile_(q, relation, "duckdb")` over `source`: its rows, or an Arrow table."""
    import duckdb

    relation = "fedldp_sql_source" if isinstance(source, SqlSource) else source.relation()
    sql = compile_(q, relation, "duckdb")  # a PlanError is said as it is
    con = _connection().cursor()
    try:
        if isinstance(source, SqlSource):
            columns = sorted({q.unit, *q.fields(), *q.where_columns()})
            con.register(relation, _sql_batches(source, columns))
        if not arrow:
            return con.execute(sql).fetchall()
        found = con.sql(sql)  # a relation's Arrow output makes no extra copy
        # to_arrow_table: DuckDB 1.4+; fetch_arrow_table: the older name
        to_table = getattr(found, "to_arrow_table", None) or found.fetch_arrow_table
        return to_table()
    except (duckdb.Error, OSError, ValueError):
        raise EngineError("duckdb") from None  # its text may quote a value
    finally:
        con.close()


#: Engine rows of keyless statements over files, by (path, file stamp, statement).
_results: OrderedDict[tuple[str, tuple[int, ...], str], list[Any]] = OrderedDict()
_results_lock = threading.Lock()
#: Most statements whose rows are kept.
RESULT_CACHE = 64


def _stamp(path: Path) -> tuple[int, ...]:
    """What changes when a file's bytes may have: device, inode, size, mtime and ctime
    (ctime: no user can set it back)."""
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def run(q: BoundedQuery, source: Source) -> Result:
    """Execute the bounded aggregation of `q` over `source` in DuckDB.

    A statement that does not use the bounding key (an ungrouped COUNT(*):
    Σ_u min(n_u, c) whichever rows are kept) is a function of the file's bytes
    alone, so its rows over a file are kept while the file's stamp stays
    (`RESULT_CACHE` statements, least recently used dropped): a repeated count is
    answered without a scan. Only those few engine numbers are kept, in the
    service's memory; the noise of every release is fresh.
    """
    if not isinstance(source, FileSource):
        return to_result(_execute(q, source, compile_query, arrow=False), q)
    sql = compile_query(q, source.relation(), "duckdb")
    if not q.key or q.key_hex in sql:  # the statement depends on the key: run it
        return to_result(_execute(q, source, compile_query, arrow=False), q)
    cache_key = (str(source.path), _stamp(source.path), sql)
    with _results_lock:
        found = _results.get(cache_key)
        if found is not None:
            _results.move_to_end(cache_key)
            return to_result(found, q)
    found = _execute(q, source, compile_query, arrow=False)
    with _results_lock:
        _results[cache_key] = found
        while len(_results) > RESULT_CACHE:
            _results.popitem(last=False)
    return to_result(found, q)


def rows(q: BoundedQuery, source: Source) -> Any:
    """The bounded rows of `q` (sqlgen.compile_rows) as a pyarrow Table whose columns are
    named by `q.fields()`: a categorical column as text, a numeric one as the BIGINT
    value·10^scale of its clamped value (NULL stays NULL). In any order."""
    table = _execute(q, source, compile_rows, arrow=True)
    return table.rename_columns(list(q.fields()))
