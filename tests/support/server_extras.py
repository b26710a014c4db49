"""The modules of fedldp's server-side extras, in one list.

Blocking them in a child process stands for an install of the `cli` extra only
(tests/client/test_light_install.py, tests/cli/test_bad_inputs.py).
"""

from __future__ import annotations

#: Top-level modules that only the server-side extras (collector, aggregator,
#: train, dashboard, spark) bring.
SERVER_MODULES = [
    "numpy",
    "scipy",
    "sqlalchemy",
    "alembic",
    "prometheus_client",
    "psycopg",
    "grpc_health",
    "matplotlib",
    "dp_accounting",
    "duckdb",
    "pyarrow",
    "sqlglot",
    "pyspark",
    "starlette",
    "uvicorn",
    "torch",
    "opacus",
    "sklearn",
]
