"""Benchmark of the release service: latency (p50/p99) and throughput of count, mean, quantile.

    python -m bench.release_service                 # 1M-row CSV, 20 queries of each kind
    python -m bench.release_service --rows 100000 --queries 10
    python -m bench.release_service --json out.json
    python -m bench.release_service --quick          # 20,000 rows, 5 queries of each kind

A CSV of --rows rows (user_id with 2 records per unit, amount in [0, 100], city)
is written to a temporary folder and registered (one validating pass, timed),
then a release service runs in-process on port 0 over a SQLite ledger file.
The release policy is signed (a fresh key) and verified as `serve` does.
A gRPC client (bearer token) sends --queries count, --queries mean and
--queries quantile (median, exponential mechanism over 1001 candidates) requests,
sequentially, each with a fresh idempotency key: each one authenticates,
reserves, reads the whole table (bounding contributions, clipping), settles,
builds and signs the receipt. Latency is per request, client side; throughput
is requests per second of that sequential loop (one analyst at a time; the
table scan dominates, so concurrent analysts share the same CPU).
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import format_table, write_json

SECRET = b"b" * 32
CATALOG = """
[datasets.bench]
csv = "bench.csv"
unit = "user_id"
contribution_bound = 2
[datasets.bench.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.bench.columns.city]
type = "categorical"
domain = ["a", "b", "c", "d"]
[[datasets.bench.grants]]
analysts = ["analyst"]
purposes = ["bench"]
"""
POLICY = """
version = 1
[[cap]]
dataset = "bench"
purpose = "bench"
epsilon = "1000000"
delta = "0"
"""


def _write_csv(path: Path, rows: int) -> None:
    rng = random.Random(0)
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user_id", "amount", "city"])
        for i in range(rows):
            w.writerow([f"u{i // 2}", f"{rng.uniform(0, 100):.2f}", "abcd"[i % 4]])


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run(rows: int, queries: int) -> dict[str, Any]:
    """Register, serve, query; the figures (seconds and requests per second)."""
    import grpc
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from fedldp.aggregator.central.signing import canonical_json, trusted_keys
    from fedldp.aggregator.service.catalog import load_catalog
    from fedldp.aggregator.service.policy import load_release_policy, sign_release_policy
    from fedldp.aggregator.service.server import ServiceConfig, start_release_service
    from fedldp.collector.auth import (
        RELEASE_SERVICE_AUDIENCE,
        Authenticator,
        TokenAuthority,
        bearer_metadata,
    )
    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write_csv(folder / "bench.csv", rows)
        (folder / "catalog.toml").write_text(CATALOG)
        (folder / "policy.toml").write_text(POLICY)
        policy_key = Ed25519PrivateKey.generate()
        envelope = sign_release_policy(folder / "policy.toml", policy_key)
        (folder / "policy.json").write_bytes(canonical_json(envelope))
        catalog = load_catalog(folder / "catalog.toml")
        start = time.perf_counter()
        config = ServiceConfig(
            catalog=catalog,
            policy=load_release_policy(
                folder / "policy.json", trusted_keys([policy_key.public_key()])
            ),
            ledger_url=f"sqlite:///{folder / 'ledger.db'}",
            signing_key=Ed25519PrivateKey.generate(),
            authenticator=Authenticator(TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE)),
        )
        svc = start_release_service(config)
        registration = time.perf_counter() - start
        token = TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            "analyst", expires_at=int(time.time()) + 86400
        )
        figures: dict[str, Any] = {"registration_seconds": registration}
        try:
            with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as channel:
                stub = release_pb2_grpc.ReleaseServiceStub(channel)
                for kind, query in (
                    ("count", {"count": pb.CountQuery()}),
                    ("mean", {"mean": pb.MeanQuery(column="amount")}),
                    ("quantile", {"quantile": pb.QuantileQuery(column="amount", quantile="0.5")}),
                ):
                    samples = []
                    for i in range(queries):
                        request = pb.ReleaseRequest(
                            dataset="bench",
                            purpose="bench",
                            epsilon="0.1",
                            delta="0",
                            mechanism=(
                                pb.NOISE_MECHANISM_UNSPECIFIED
                                if kind == "quantile"
                                else pb.NOISE_MECHANISM_LAPLACE
                            ),
                            idempotency_key=f"{kind}-{i}",
                            **query,
                        )
                        t0 = time.perf_counter()
                        stub.Release(request, metadata=bearer_metadata(token))
                        samples.append(time.perf_counter() - t0)
                    figures[kind] = {
                        "p50_seconds": statistics.median(samples),
                        "p99_seconds": _percentile(samples, 0.99),
                        "requests_per_second": len(samples) / sum(samples),
                        "rows_per_second": rows * len(samples) / sum(samples),
                    }
        finally:
            svc.stop(0)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--quick", action="store_true", help="20,000 rows and 5 queries (under a minute)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.queries = 20_000, 5
    figures = run(args.rows, args.queries)
    print(f"registration of {args.rows} rows: {figures['registration_seconds']:.2f} s")
    table = [
        [
            kind,
            f"{figures[kind]['p50_seconds'] * 1000:.0f}",
            f"{figures[kind]['p99_seconds'] * 1000:.0f}",
            f"{figures[kind]['requests_per_second']:.2f}",
            f"{figures[kind]['rows_per_second'] / 1e6:.2f}",
        ]
        for kind in ("count", "mean", "quantile")
    ]
    print(format_table(["query", "p50 ms", "p99 ms", "req/s", "M rows/s"], table))
    if args.json:
        write_json(
            args.json,
            benchmark="release_service",
            params={"rows": args.rows, "queries": args.queries},
            figures=figures,
            packages=("grpcio", "SQLAlchemy"),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
