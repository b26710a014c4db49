"""The Apache Spark engine: the same bounded aggregation (sqlgen.py, Spark dialect) run
on a cluster, for data past one machine.

The catalog names the cluster per dataset (`spark = "..."`): a master URL
("local[2]", "spark://host:7077", "yarn") or a Spark Connect endpoint
("sc://host:15002"). The file is read by the cluster (the path must be one its
executors can read: a shared file system or an object-store URL); a CSV is read
with every column as text and an empty field as NULL, as the reference reads
it. Only the fine-group totals are collected to the service. SQL tables are
DuckDB's (a JDBC driver is not something the service can ship).

`pyspark` is imported when a query runs, never at module import; sessions are
kept per cluster for the life of the process.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from typing import Any

from fedldp.aggregator.engines.duck import FileSource, Source, rows_table, to_result
from fedldp.aggregator.engines.plan import BoundedQuery, EngineError, PlanError, Result
from fedldp.aggregator.engines.sqlgen import compile_query, compile_rows

_sessions: dict[str, Any] = {}
_lock = threading.Lock()


def session(cluster: str) -> Any:
    """The SparkSession of `cluster` (a master URL, or sc://... for Spark Connect)."""
    from pyspark.sql import SparkSession

    with _lock:
        if cluster not in _sessions:
            builder = SparkSession.builder.appName("fedldp-release-service")
            if cluster.startswith("sc://"):
                builder = builder.remote(cluster)
            else:
                builder = (
                    builder.master(cluster)
                    .config("spark.ui.enabled", "false")
                    .config("spark.ui.showConsoleProgress", "false")
                    .config("spark.sql.shuffle.partitions", "4")
                    .config("spark.sql.ansi.enabled", "true")
                )
            _sessions[cluster] = builder.getOrCreate()
        return _sessions[cluster]


def _execute(q: BoundedQuery, source: Source, cluster: str, compile_: Any) -> list[tuple[Any, ...]]:
    """The rows of `compile_(q, view, "spark")` over `source`, collected to the service."""
    if not isinstance(source, FileSource):
        raise PlanError("the Spark engine reads CSV and Parquet files; SQL tables use DuckDB")
    view = f"fedldp_{uuid.uuid4().hex}"
    sql = compile_(q, view, "spark")  # a PlanError is said as it is
    spark = session(cluster)
    try:
        reader = spark.read
        if source.format == "parquet":
            frame = reader.parquet(str(source.path))
        else:
            frame = (
                reader.option("header", "true").option("inferSchema", "false").csv(str(source.path))
            )
        frame.createOrReplaceTempView(view)
        return [tuple(r) for r in spark.sql(sql).collect()]
    except Exception:  # a Py4J/Spark error's text may quote a value of the data
        raise EngineError("spark") from None
    finally:
        with contextlib.suppress(Exception):  # best effort: the view dies with the session
            spark.catalog.dropTempView(view)


def run(q: BoundedQuery, source: Source, cluster: str) -> Result:
    """Execute the bounded aggregation of `q` over `source` on `cluster`."""
    return to_result(_execute(q, source, cluster, compile_query), q)


def rows(q: BoundedQuery, source: Source, cluster: str) -> Any:
    """The bounded rows of `q` as duck.rows returns them (a pyarrow Table named by
    `q.fields()`), computed on `cluster` and collected to the service."""
    return rows_table(q, _execute(q, source, cluster, compile_rows))
