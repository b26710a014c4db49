"""The analyst client stays light on a real call (issue 30, item 6).

`fedldp release count --service` and `fedldp release sql --service` answered by
a real release service (gRPC on port 0, SQLite ledger, DuckDB engine) must not
import torch, Opacus, DuckDB, pyspark or the service itself: the client imports
the proto stubs and its own code. Each command runs in a fresh interpreter through
the `fedldp` script's entry point; its exit status and `sys.modules` are read back.
No time is asserted (the CPU figure is `python -m bench.cli_startup`'s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

from fedldp.aggregator.service.server import RunningReleaseService
from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, TokenAuthority

from tests.aggregator.service.conftest import NOW, SECRET

HEAVY = [
    "torch",
    "opacus",
    "duckdb",
    "pyspark",
    "pyarrow",
    "sqlalchemy",
    "sqlglot",
    "fedldp.aggregator.training",
    "fedldp.aggregator.service.server",
    "fedldp.aggregator.engines.duck",
]

_WRAPPER = """
import json, sys
heavy = json.loads(sys.argv[1])
sys.argv = ["fedldp", *sys.argv[2:]]
from fedldp.launcher import main
try:
    main()
    code = 0
except SystemExit as exc:
    code = exc.code or 0
print(json.dumps([code, [m for m in heavy if m in sys.modules]]), file=sys.stderr)
"""


def _client(args: list[str], token: str, heavy: list[str] = HEAVY) -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDLDP_")}
    env["ANALYST_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(heavy), *args, "--token-env", "ANALYST_TOKEN"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    code, found = json.loads(done.stderr.strip().splitlines()[-1])
    return int(code), list(found), done.stdout


def test_the_analyst_client_answers_without_heavy_imports(
    make_service: Callable[..., RunningReleaseService],
) -> None:
    svc = make_service(eps_cap="5")
    token = TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
        "alice", expires_at=NOW + 3600
    )
    service = ["--service", f"127.0.0.1:{svc.port}", "--purpose", "study"]
    count = ["release", "count", *service, "--dataset", "visits", "--epsilon", "1", "--key", "k1"]
    sql = ["release", "sql", "SELECT city, COUNT(*) FROM visits GROUP BY city", *service]
    for args in (count, [*sql, "--epsilon", "1"]):
        code, heavy, out = _client(args, token)
        assert code == 0, out
        assert json.loads(out)  # a release came back
        assert heavy == [], args
    # the check is not blind: modules the client does import are reported
    code, heavy, _ = _client([*count[:-1], "k2"], token, [*HEAVY, "grpc", "fedldp.v1.release_pb2"])
    assert code == 0 and heavy == ["grpc", "fedldp.v1.release_pb2"]
