"""A collector's memory under floods of ~1 MB requests, and health under overload.

    python -m bench.collector_memory [--quick] [--json PATH]
        [--concurrency 1000] [--connections 100] [--seconds 60]

For each case — unauthenticated (no credentials), garbage (random bytes with a
valid token) and valid (950 bit-vector reports of 7,800 bits, ~1 MB, fresh
report ids per call) — a fresh collector process (`fedldp collector serve`,
default limits, SQLite ledger) is flooded by `--concurrency` concurrent calls
over `--connections` connections for `--seconds`, from a grpc.aio client in
this process, while a second thread sends a health check on the main port
every 50 ms. Reported per case: the collector's RSS when idle (after a few
requests of the case one at a time), its peak under the flood (sampled every
20 ms), its RSS 1, 3 and 5 s after the flood stops, the calls answered by
status, overload refusals with and without a `retry-after-ms` hint, and the
health checks answered SERVING. One flood per case (each is long, and the peak
is a maximum, not a rate); the client and the collector share the machine.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
from fedldp.collector.auth import bearer_metadata
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench._common import format_table, write_json
from tests.support.collector_testkit import (
    Deployment,
    RssSampler,
    big_bitvector_request,
    rss_bytes,
    run_load,
    spawn,
    with_fresh_ids,
    write_config,
)

MiB = 1024 * 1024
CASES = ("unauthenticated", "garbage", "valid")
#: The bound deploy/collector.toml states for one collector process at the defaults.
BOUND_MIB = 384


def _probe(address: str, stop: threading.Event, tally: dict[str, int]) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not stop.is_set():
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                ok = reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                ok = False
            tally["serving" if ok else "failed"] += 1
            stop.wait(0.05)


def flood(case: str, *, concurrency: int, connections: int, seconds: float) -> dict[str, Any]:
    """One case against a fresh collector process; its figures."""
    now = int(time.time())
    d = Deployment.create(now=now)
    d.add_categorical(
        "big",
        labels=[f"l{i}" for i in range(7800)],
        mechanism="oue",
        epsilon="0.001",
        epsilon_cap="1000000",
    )
    base = Path(tempfile.mkdtemp(prefix="fedldp-memory-"))
    proc = spawn(write_config(d, base, f"sqlite:///{base / 'ledger.db'}", "memory"), "memory")
    try:
        token = bearer_metadata(d.token("flooder"))
        metadata: tuple[tuple[str, str], ...] = () if case == "unauthenticated" else token
        make: Callable[[], bytes]
        if case == "valid":
            blob, offsets = big_bitvector_request(d, "big", now=now, reports=950, bits=7800)
            make = lambda: with_fresh_ids(blob, offsets)  # noqa: E731
        else:
            body = secrets.token_bytes(1_000_000)
            make = lambda: body  # noqa: E731
        pid = proc.proc.pid
        run_load(proc.address, make, metadata, concurrency=1, connections=1, seconds=1.0)
        time.sleep(1.5)
        idle = rss_bytes(pid)
        sampler = RssSampler(pid)
        tally = {"serving": 0, "failed": 0}
        stop = threading.Event()
        prober = threading.Thread(target=_probe, args=(proc.address, stop, tally))
        prober.start()
        try:
            load = run_load(
                proc.address,
                make,
                metadata,
                concurrency=concurrency,
                connections=connections,
                seconds=seconds,
            )
        finally:
            stop.set()
            prober.join()
        ended = time.monotonic()
        time.sleep(5.2)
        sampler.stop()

        def after(delay: float) -> float:
            return next(b for t, b in sampler.samples if t >= ended + delay) / MiB

        return {
            "case": case,
            "request_bytes": len(make()),
            "idle_mib": idle / MiB,
            "peak_mib": sampler.peak / MiB,
            "after_1s_mib": after(1.0),
            "after_3s_mib": after(3.0),
            "after_5s_mib": after(5.0),
            "codes": load.codes,
            "hinted": load.with_hint,
            "unhinted": load.without_hint,
            "health_serving": tally["serving"],
            "health_failed": tally["failed"],
        }
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        proc.proc.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="300 calls for 5 s per case")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--concurrency", type=int, default=None, help="calls in flight")
    parser.add_argument("--connections", type=int, default=None, help="client connections")
    parser.add_argument("--seconds", type=float, default=None, help="length of each flood")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated cases")
    args = parser.parse_args(argv)
    concurrency = args.concurrency or (300 if args.quick else 1000)
    connections = args.connections or max(1, concurrency // 10)
    seconds = args.seconds or (5.0 if args.quick else 60.0)
    rows = []
    for case in args.cases.split(","):
        print(f"{case}: {concurrency} calls, {connections} connections, {seconds} s", flush=True)
        rows.append(flood(case, concurrency=concurrency, connections=connections, seconds=seconds))
    table = [
        [
            r["case"],
            f"{r['idle_mib']:.0f}",
            f"{r['peak_mib']:.0f}",
            f"{r['after_1s_mib']:.0f} / {r['after_3s_mib']:.0f} / {r['after_5s_mib']:.0f}",
            ", ".join(f"{k} {v}" for k, v in sorted(r["codes"].items())),
            f"{r['hinted']} / {r['unhinted']}",
            f"{r['health_serving']}/{r['health_serving'] + r['health_failed']}",
        ]
        for r in rows
    ]
    print(
        format_table(
            [
                "case",
                "idle MiB",
                "peak MiB",
                "after 1/3/5 s MiB",
                "answers",
                "overload hinted / not",
                "health SERVING",
            ],
            table,
        )
    )
    print(f"bound (deploy/collector.toml): {BOUND_MIB} MiB per process")
    if args.json:
        write_json(
            args.json,
            benchmark="collector_memory",
            params={"concurrency": concurrency, "connections": connections, "seconds": seconds},
            figures=rows,
        )
    return 0 if all(r["peak_mib"] < BOUND_MIB and not r["unhinted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
