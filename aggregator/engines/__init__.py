"""Release engines: one bounded aggregation per release, executed where the data lives.

`plan` defines the query plan and the contribution bounding every engine
implements identically; `reference` is the pure-Python implementation (the
reference the equivalence tests hold the engines to); `sqlgen` compiles a plan
to one SQL statement (DuckDB and Spark SQL dialects); `duck` runs it in an
embedded DuckDB; `spark` runs it on a Spark cluster (or local mode); `sqlparse`
turns an analyst's SQL into a plan. Nothing here imports duckdb or pyspark at
module import: each engine imports its library when it runs.
"""
