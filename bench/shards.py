"""Collector throughput over ledger shards: 1, 2, 3 collectors x 1, 2 PostgreSQL shards.

    python -m bench.shards [--quick] [--json PATH]

Each cell starts its PostgreSQL server(s) (one per shard, each its own
postmaster, fsync on) and its collector daemons (`fedldp collector serve`, one
process each, `ledger_shards` listing every shard), then loads them from this
process (grpc.aio, `bench.collector`'s load generator: 100 reports per call,
SDK report ids, every device its own subject, spread over the collectors) and
reports reports/s (median of the timed runs, with min and max).

Bottleneck: during the timed runs the CPU time of each group of processes is
read from /proc (collectors; every PostgreSQL server process; this load
generator) and shown as cores used (CPU seconds per second) and as CPU µs per
acknowledged report; /proc/stat gives how busy the whole machine was (anyone's
processes). The machine's CPU is the bottleneck when its cores were nearly all
busy; else a collector near one core is; else neither (commit latency). The load
generator shares the cores with the servers, and on a shared machine so do other
people's processes: absolute figures depend on the machine; CPU per report and
the core shares say where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import format_table, summarize, write_json
from bench.collector import PACKAGES, RequestFactory, Server, _load, _process_cpu_seconds


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _cpu(pids: list[int]) -> float:
    """CPU seconds of `pids` so far (processes that ended meanwhile count 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += _process_cpu_seconds(pid)
    return total


def _postgres_pids(server: Any) -> list[int]:
    """The postmaster of `server` and every process it forked (backends, writers)."""
    head = (server.base / "data" / "postmaster.pid").read_text().split()[0]
    return [int(head), *_children(int(head))]


def _machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far (/proc/stat, every core)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    tick = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / tick, sum(fields) / tick


def _self_cpu() -> float:
    times = os.times()
    return times.user + times.system


def run_cell(
    deployment: Any,
    tokens: list[str],
    factory: RequestFactory,
    bindir: Path,
    base: Path,
    *,
    collectors: int,
    shards: int,
    seconds: float,
    runs: int,
    concurrency: int,
) -> dict[str, Any]:
    """One (collectors, shards) cell: reports/s and the cores each group used."""
    from tests.support.collector_testkit import PostgresServer, spawn, write_config

    servers = [PostgresServer.start(bindir) for _ in range(shards)]
    procs = []
    try:
        urls = [s.create_database() for s in servers]
        for i in range(collectors):
            name = f"c{collectors}s{shards}n{i}"
            config = write_config(
                deployment, base, "", name, ledger_shards=urls, log_level="ERROR", processes=1
            )
            procs.append(spawn(config, name))
        server = Server(
            f"{collectors}x{shards}", [p.proc for p in procs], [p.address for p in procs]
        )
        load = (server.addresses, tokens, factory, 100, concurrency)
        asyncio.run(_load(*load, 1.0, "sdk", True))  # warm-up (schema, connections)
        pg_pids = [pid for s in servers for pid in _postgres_pids(s)]
        col_pids = [p.proc.pid for p in procs]
        machine = _machine_busy()
        before = (_cpu(col_pids), _cpu(pg_pids), _self_cpu(), time.perf_counter())
        results = [asyncio.run(_load(*load, seconds, "sdk", True)) for _ in range(runs)]
        wall = time.perf_counter() - before[3]
        used = (
            (_cpu(col_pids) - before[0]) / wall,
            (_cpu(pg_pids) - before[1]) / wall,
            (_self_cpu() - before[2]) / wall,
        )
        after = _machine_busy()
        busy = (after[0] - machine[0]) / max(after[1] - machine[1], 1e-9)
        reports = sum(r.reports for r in results)
        server.stop()
    finally:
        for p in procs:
            if p.proc.poll() is None:
                p.proc.kill()
        for s in servers:
            s.stop()
    rates = summarize([r.reports / r.seconds for r in results])
    return {
        "collectors": collectors,
        "shards": shards,
        "reports_per_s": rates,
        "errors": sum(r.errors for r in results),
        "cores_collectors": used[0],
        "cores_postgres": used[1],
        "cores_load": used[2],
        "machine_busy": busy,  # fraction of every core's time busy (anyone's processes)
        # CPU per acknowledged report, µs: independent of how much CPU others took
        "us_per_report_collectors": used[0] * wall / reports * 1e6,
        "us_per_report_postgres": used[1] * wall / reports * 1e6,
    }


def _bottleneck(cell: dict[str, Any], cores: int) -> str:
    """Where the time goes: the machine's CPU when its cores were (nearly) all busy,
    else each collector's core, else neither (commit latency)."""
    col, pg, load = cell["cores_collectors"], cell["cores_postgres"], cell["cores_load"]
    ours = col + pg + load
    if cell["machine_busy"] >= 0.9:
        top = "collectors" if col >= pg else "PostgreSQL"
        return (
            f"machine CPU: {cell['machine_busy']:.0%} busy, this benchmark {ours:.2f} of "
            f"{cores} cores (others the rest); of ours, most: {top}"
        )
    if col >= 0.85 * cell["collectors"]:
        return "collector CPU (each ~1 core)"
    return f"neither CPU-bound ({ours:.2f} of {cores} cores): commit latency / fsync"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 run of 2 s per cell")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--concurrency", type=int, default=48, help="devices (calls in flight)")
    args = parser.parse_args(argv)
    from tests.support.collector_testkit import Deployment, postgres_bindir

    bindir = postgres_bindir()
    if bindir is None:
        parser.error("PostgreSQL is not installed (initdb/pg_ctl not found)")
    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical("bench", epsilon="0.001", epsilon_cap="1000000")
    tokens = [deployment.token(f"device-{i}") for i in range(args.concurrency)]
    factory = RequestFactory(deployment, now)
    seconds, runs = (2.0, 1) if args.quick else (5.0, 3)
    cores = len(os.sched_getaffinity(0))
    cells = []
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-shards-") as tmp:
        for shards in (1, 2):
            for collectors in (1, 2, 3):
                cell = run_cell(
                    deployment,
                    tokens,
                    factory,
                    bindir,
                    Path(tmp),
                    collectors=collectors,
                    shards=shards,
                    seconds=seconds,
                    runs=runs,
                    concurrency=args.concurrency,
                )
                cell["bottleneck"] = _bottleneck(cell, cores)
                cells.append(cell)
                print(f"{collectors} collector(s) x {shards} shard(s): done", flush=True)
    rows = [
        [
            c["collectors"],
            c["shards"],
            f"{c['reports_per_s'].median:,.0f} [{c['reports_per_s'].min:,.0f}-"
            f"{c['reports_per_s'].max:,.0f}]",
            f"{c['cores_collectors']:.2f} ({c['us_per_report_collectors']:.1f} µs/r)",
            f"{c['cores_postgres']:.2f} ({c['us_per_report_postgres']:.1f} µs/r)",
            f"{c['cores_load']:.2f}",
            c["bottleneck"],
        ]
        for c in cells
    ]
    print(
        f"\n100 reports per call, {args.concurrency} devices, {runs} run(s) of {seconds} s; "
        f"{cores} cores shared by servers, load generator and anything else running"
    )
    print(
        format_table(
            [
                "collectors",
                "shards",
                "reports/s",
                "cores: collectors",
                "postgres",
                "load",
                "bottleneck",
            ],
            rows,
        )
    )
    if args.json:
        write_json(
            args.json,
            benchmark="shards",
            params={"concurrency": args.concurrency, "seconds": seconds, "runs": runs},
            figures=cells,
            packages=PACKAGES,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
