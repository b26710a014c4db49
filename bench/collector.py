"""Collector throughput and latency against a do-nothing gRPC server, in one run.

    python -m bench.collector [--quick] [--json PATH]
    python -m bench.collector --interleave-servers [--quick]   # sync vs asyncio A/B

What is measured (each figure: median over >= 5 timed runs, with min and max):

* one report per call from many concurrent devices (`--concurrency`, each its own
  subject and bearer token): calls/s, p50 and p99 latency;
* 100 reports per call: reports/s;
* the CPU time of every server process per report (all threads, user and
  system; it moves less with the machine's other load than the rates do);
* peak resident memory of each collector process (VmHWM, i.e. since its start,
  under the load above);
* the same against a PostgreSQL ledger, and with two collector processes
  sharing one PostgreSQL ledger.

The reference is a do-nothing gRPC server that parses the same SubmitRequest
bytes and answers one ACCEPTED outcome per report, so the messages are the
same size both ways; it is measured in the same run, with the same load
generator, in both grpcio flavours (sync, with the same thread pool size, and
asyncio) and with one and several processes. Each row has three ratios: to the
one-process sync do-nothing server, to the do-nothing server of its own flavour
and process count, and to the best do-nothing server of the run (the strictest
reading of the issue's target). The collector's defaults are the asyncio server
and `processes` unset (one process per usable core: the "defaults" rows say how
many); the sync server has rows of its own (the server-choice question in
docs/collector.md).

`--interleave-servers` answers that question more robustly on a shared machine:
a sync and an asyncio collector run side by side and are loaded in alternating
rounds, so both see the same background load; it prints calls/s and the
collector's CPU time per call for each (SQLite, then PostgreSQL).

Durability: the collector runs as a real process (`fedldp collector serve`)
with its defaults: SQLite in WAL mode with synchronous=FULL, PostgreSQL with
fsync on; every acknowledged report is committed. The timed section is the
load phase only: process start, key generation, policy signing and PostgreSQL
initdb are excluded. The load generator (grpc.aio, in this process) and the
servers share the machine's cores, so absolute figures depend on the machine;
the ratios to the do-nothing server are the portable figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._common import Timing, format_table, summarize, write_json

SUBMIT = "/fedldp.v1.Collector/Submit"
PACKAGES = ("grpcio", "protobuf", "sqlalchemy", "psycopg", "prometheus-client")


# --- the do-nothing reference server (run as a subprocess: --serve-null) ---


def _null_response(request_bytes: bytes) -> bytes:
    from fedldp.v1 import collector_pb2 as pb

    request = pb.SubmitRequest.FromString(request_bytes)
    return pb.SubmitResponse(
        outcomes=[
            pb.ReportOutcome(report_id=r.report_id, outcome=pb.OUTCOME_ACCEPTED)
            for r in request.reports
        ]
    ).SerializeToString()


def serve_null(port_file: str, kind: str, workers: int, port: int = 0) -> None:
    """A gRPC server answering Submit with one ACCEPTED per report, nothing else.

    `port` > 0: bind it with SO_REUSEPORT (several processes share it)."""
    import grpc

    listen = f"127.0.0.1:{port}"
    options = [("grpc.so_reuseport", 1 if port else 0)]

    if kind == "sync":

        def behavior(request: bytes, _context: Any) -> bytes:
            return _null_response(request)

        handler = grpc.method_handlers_generic_handler(
            "fedldp.v1.Collector", {"Submit": grpc.unary_unary_rpc_method_handler(behavior)}
        )
        server = grpc.server(ThreadPoolExecutor(max_workers=workers), options=options)
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port(listen)
        server.start()
        Path(port_file).write_text(str(port))
        signal.signal(signal.SIGTERM, lambda *_: server.stop(0))
        server.wait_for_termination()
        return

    async def main() -> None:
        async def abehavior(request: bytes, _context: Any) -> bytes:
            return _null_response(request)

        handler = grpc.method_handlers_generic_handler(
            "fedldp.v1.Collector", {"Submit": grpc.unary_unary_rpc_method_handler(abehavior)}
        )
        server = grpc.aio.server(options=options)
        server.add_generic_rpc_handlers((handler,))
        bound = server.add_insecure_port(listen)
        await server.start()
        Path(port_file).write_text(str(bound))
        await server.wait_for_termination()

    asyncio.run(main())


# --- servers under test ---


@dataclass
class Server:
    """A server subprocess (or several) and the addresses to load."""

    name: str
    procs: list[subprocess.Popen[bytes]]
    addresses: list[str]
    #: Client connections per address: one per device where several processes
    #: share the port (the kernel spreads connections, not calls, over them).
    per_device_connections: bool = False

    def pids(self) -> list[int]:
        """Every server process: each started one and its children (a supervisor's)."""
        out: list[int] = []
        for p in self.procs:
            out.append(p.pid)
            try:
                children = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split()
            except OSError:
                children = []
            out.extend(int(c) for c in children)
        return out

    def peak_rss_mb(self) -> list[float]:
        """VmHWM (peak resident set since start) of each serving process, MB (a
        supervisor, which serves nothing, is left out)."""
        pids = self.pids()
        started = {p.pid for p in self.procs}
        serving = [pid for pid in pids if pid not in started] or pids
        out = []
        for pid in serving:
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        out.append(int(line.split()[1]) / 1024)
            except OSError:
                pass
        return out

    def stop(self) -> None:
        for p in self.procs:
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def start_null(kind: str, base: Path, workers: int, processes: int = 1) -> Server:
    """The do-nothing server; `processes` > 1: that many on one SO_REUSEPORT port,
    as the collector runs with `processes` (collector/supervisor.py)."""
    import socket

    reserved = None
    port = 0
    if processes > 1:
        reserved = socket.socket()
        reserved.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        reserved.bind(("127.0.0.1", 0))
        port = reserved.getsockname()[1]
    procs = []
    for i in range(processes):
        port_file = base / f"null-{kind}-{i}.port"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.collector",
                "--serve-null",
                str(port_file),
                "--null-kind",
                kind,
                "--null-port",
                str(port),
                "--workers",
                str(workers),
            ],
            cwd=Path(__file__).parent.parent,
        )
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not port_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the do-nothing server did not start")
            time.sleep(0.05)
        time.sleep(0.05)
        port = int(port_file.read_text())
    if reserved is not None:
        reserved.close()
    name = f"do-nothing ({kind}" + (f", {processes} processes)" if processes > 1 else ")")
    return Server(name, procs, [f"127.0.0.1:{port}"], per_device_connections=processes > 1)


def start_collectors(
    deployment: Any,
    base: Path,
    url: str,
    count: int,
    name: str,
    workers: int,
    server: str = "asyncio",
    processes: int | None = 1,
) -> Server:
    """`count` collector daemons (each with `processes` processes; None: the
    collector's default, one per usable core) on one ledger."""
    from fedldp.collector.config import default_processes

    from tests.support.collector_testkit import spawn, write_config

    procs, addresses = [], []
    for i in range(count):
        config = write_config(
            deployment,
            base,
            url,
            f"{name}{i}",
            workers=workers,
            log_level="ERROR",
            server=server,
            processes=processes,
        )
        p = spawn(config, f"{name}{i}")
        procs.append(p.proc)
        addresses.append(p.address)
    resolved = default_processes() if processes is None else processes
    return Server(name, procs, addresses, per_device_connections=resolved > 1)


def defaults_label(store: str) -> str:
    """The label of a collector row on its defaults (`processes` unset: one per usable
    core, so the label says how many that is here)."""
    from fedldp.collector.config import default_processes

    n = default_processes()
    return f"collector ({store}, asyncio: defaults, {n} process{'es' if n > 1 else ''})"


# --- the load generator ---


class RequestFactory:
    """Builds SubmitRequest bytes fast: a serialized report template with a fresh id."""

    def __init__(self, deployment: Any, now: int) -> None:
        from fedldp.client.mechanisms import CategoryOutput
        from fedldp.client.transport import submit_request_bytes

        from tests.support.collector_testkit import coarse, make_report

        self.encode = submit_request_bytes

        policy = deployment.verified(deployment.envelopes[0])
        self.tails: list[bytes] = []
        for index in range(4):
            report = make_report(
                policy, CategoryOutput(index), report_id=b"\x00" * 16, coarse_time=coarse(now)
            )
            raw = report.SerializeToString()
            assert raw.startswith(b"\x0a\x10" + b"\x00" * 16)
            self.tails.append(raw[18:])

    def request(self, reports: int, ids: Any = None) -> bytes:
        """`reports` reports with ids from `ids` (a device's `ReportIds`, as the SDK
        makes them) or, when None, 16 random bytes each."""
        parts = []
        for i in range(reports):
            rid = os.urandom(16) if ids is None else ids.next()
            parts.append(b"\x0a\x10" + rid + self.tails[i & 3])
        return self.encode(parts)


@dataclass
class RunResult:
    calls: int
    reports: int
    seconds: float
    latencies: list[float]
    errors: int
    error_codes: Counter[str]


async def _load(
    addresses: list[str],
    tokens: list[str],
    factory: RequestFactory,
    reports_per_call: int,
    concurrency: int,
    seconds: float,
    report_ids: str = "sdk",
    per_device_connections: bool = False,
) -> RunResult:
    import grpc
    from fedldp.client.report_ids import ReportIds

    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
    targets = [addresses[i % len(addresses)] for i in range(concurrency)]
    channels = [
        grpc.aio.insecure_channel(a, options=options)
        for a in (targets if per_device_connections else addresses)
    ]
    calls = [ch.unary_unary(SUBMIT, None, None) for ch in channels]
    latencies: list[float] = []
    errors = 0
    error_codes: Counter[str] = Counter()
    stop_at = 0.0

    async def device(i: int) -> None:
        nonlocal errors
        call = calls[i % len(calls)]
        metadata = (("authorization", f"Bearer {tokens[i]}"),)
        ids = ReportIds() if report_ids == "sdk" else None
        while time.perf_counter() < stop_at:
            body = factory.request(reports_per_call, ids)
            t0 = time.perf_counter()
            try:
                await call(body, metadata=metadata, timeout=30)
            except grpc.aio.AioRpcError as exc:
                errors += 1
                error_codes[exc.code().name] += 1
                continue
            latencies.append(time.perf_counter() - t0)

    try:
        for ch in channels:
            await ch.channel_ready()
        stop_at = time.perf_counter() + seconds
        started = time.perf_counter()
        await asyncio.gather(*(device(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    finally:
        for ch in channels:
            await ch.close(None)
    return RunResult(
        len(latencies), len(latencies) * reports_per_call, elapsed, latencies, errors, error_codes
    )


@dataclass
class Figures:
    server: str
    reports_per_call: int
    concurrency: int
    calls_per_s: Timing
    reports_per_s: Timing
    p50_ms: Timing
    p99_ms: Timing
    errors: int
    peak_rss_mb: list[float]
    report_ids: str = "sdk"
    error_codes: dict[str, int] = field(default_factory=dict)
    #: CPU time of every server process (all threads, user + system) per report, µs
    server_cpu_us: Timing | None = None

    @property
    def label(self) -> str:
        return self.server + (", random ids" if self.report_ids == "random" else "")


def measure(
    server: Server,
    tokens: list[str],
    factory: RequestFactory,
    *,
    reports_per_call: int,
    concurrency: int,
    seconds: float,
    runs: int,
    warmup: float,
    report_ids: str = "sdk",
    connections: str = "device",
) -> Figures:
    """`report_ids`: "sdk" (each device's ids as `fedldp.client.report_ids` makes
    them) or "random" (16 random bytes per report, e.g. another client library).
    `connections`: "device" (each device its own connection, as a fleet) or
    "shared" (all devices multiplexed on one connection per address; a server
    of several processes on one port always gets one per device)."""
    load = (server.addresses, tokens, factory, reports_per_call, concurrency)
    spread = connections == "device" or server.per_device_connections
    asyncio.run(_load(*load, warmup, report_ids, spread))
    results, cpu_us = [], []
    for _ in range(runs):
        before = _server_cpu_seconds(server)
        results.append(asyncio.run(_load(*load, seconds, report_ids, spread)))
        used = _server_cpu_seconds(server) - before
        cpu_us.append(used / max(results[-1].reports, 1) * 1e6)

    def pct(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0

    return Figures(
        server=server.name,
        reports_per_call=reports_per_call,
        concurrency=concurrency,
        calls_per_s=summarize([r.calls / r.seconds for r in results]),
        reports_per_s=summarize([r.reports / r.seconds for r in results]),
        p50_ms=summarize([pct(r.latencies, 0.50) for r in results]),
        p99_ms=summarize([pct(r.latencies, 0.99) for r in results]),
        report_ids=report_ids,
        errors=sum(r.errors for r in results),
        error_codes=dict(sum((r.error_codes for r in results), Counter())),
        peak_rss_mb=server.peak_rss_mb(),
        server_cpu_us=summarize(cpu_us),
    )


def _fmt(t: Timing, rate: bool = True) -> str:
    if rate:
        return f"{t.median:,.0f} [{t.min:,.0f}-{t.max:,.0f}]"
    return f"{t.median:.1f} [{t.min:.1f}-{t.max:.1f}]"


def _process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def _server_cpu_seconds(server: Server) -> float:
    """User + system CPU time so far of every process of `server` (a supervisor's
    children included; one that has exited counts 0)."""
    total = 0.0
    for pid in server.pids():
        with contextlib.suppress(OSError):
            total += _process_cpu_seconds(pid)
    return total


def interleaved_servers(
    deployment: Any,
    tokens: list[str],
    factory: RequestFactory,
    base: Path,
    urls: dict[str, str],
    *,
    shapes: list[dict[str, int]],
    seconds: float,
    runs: int,
    workers: int,
    per_device: bool = True,
) -> list[list[Any]]:
    """The sync and asyncio collectors side by side: both started together, loaded
    in alternating rounds (so both see the same background load); per shape and
    server, median calls/s, reports/s and collector CPU per call."""
    servers = {
        kind: start_collectors(
            deployment, base / f"ab-{kind}", url, 1, f"collector ({kind})", workers, server=kind
        )
        for kind, url in urls.items()
    }
    rows: list[list[Any]] = []
    try:
        for shape in shapes:
            rate: dict[str, list[float]] = {kind: [] for kind in servers}
            cpu: dict[str, list[float]] = {kind: [] for kind in servers}
            for srv in servers.values():  # warm-up
                asyncio.run(
                    _load(
                        srv.addresses,
                        tokens,
                        factory,
                        shape["reports_per_call"],
                        shape["concurrency"],
                        1.0,
                        per_device_connections=per_device,
                    )
                )
            for _ in range(runs):
                for kind, srv in servers.items():
                    before = _process_cpu_seconds(srv.procs[0].pid)
                    result = asyncio.run(
                        _load(
                            srv.addresses,
                            tokens,
                            factory,
                            shape["reports_per_call"],
                            shape["concurrency"],
                            seconds,
                            per_device_connections=per_device,
                        )
                    )
                    used = _process_cpu_seconds(srv.procs[0].pid) - before
                    rate[kind].append(result.calls / result.seconds)
                    cpu[kind].append(used / max(result.calls, 1) * 1e6)
            for kind in servers:
                calls = summarize(rate[kind])
                per_call = summarize(cpu[kind])
                rows.append(
                    [
                        kind,
                        shape["reports_per_call"],
                        shape["concurrency"],
                        _fmt(calls),
                        f"{calls.median * shape['reports_per_call']:,.0f}",
                        f"{per_call.median:,.0f} [{per_call.min:,.0f}-{per_call.max:,.0f}]",
                    ]
                )
    finally:
        for srv in servers.values():
            srv.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.collector",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="short runs (< 1 minute in all)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--runs", type=int, default=None, help="timed runs per figure (>= 5)")
    parser.add_argument("--seconds", type=float, default=None, help="length of one timed run")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=64,
        help="concurrent devices for the 1-report-per-call figures",
    )
    parser.add_argument(
        "--batch-concurrency",
        type=int,
        default=32,
        help="concurrent devices for the 100-reports-per-call figures",
    )
    parser.add_argument("--workers", type=int, default=64, help="server handler threads")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL figures")
    parser.add_argument(
        "--connections",
        choices=("device", "shared"),
        default="device",
        help="one client connection per simulated device (default, as a fleet), or all "
        "devices on one shared connection per address",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="also measure the collector with this many processes on one port, against "
        "as many do-nothing processes (1: skip)",
    )
    parser.add_argument(
        "--interleave-servers",
        action="store_true",
        help="instead: the sync and asyncio collectors side by side, in alternating rounds "
        "(SQLite, and PostgreSQL unless --no-postgres)",
    )
    parser.add_argument("--serve-null", help=argparse.SUPPRESS)
    parser.add_argument("--null-kind", default="sync", help=argparse.SUPPRESS)
    parser.add_argument("--null-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_null:
        serve_null(args.serve_null, args.null_kind, args.workers, args.null_port)
        return 0

    from tests.support.collector_testkit import Deployment, PostgresServer, postgres_bindir

    runs = max(5, args.runs or 5)
    seconds = args.seconds or (0.4 if args.quick else 3.0)
    warmup = 0.2 if args.quick else 1.0
    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical("bench", epsilon="0.001", epsilon_cap="1000000")
    tokens = [
        deployment.token(f"device-{i}")
        for i in range(max(args.concurrency, args.batch_concurrency))
    ]
    factory = RequestFactory(deployment, now)
    random.seed(0)
    base = Path(tempfile.mkdtemp(prefix="fedldp-bench-collector-"))
    figures: list[Figures] = []
    single = {"reports_per_call": 1, "concurrency": args.concurrency}
    batch = {"reports_per_call": 100, "concurrency": args.batch_concurrency}

    if args.interleave_servers:
        stores = {"SQLite": {k: f"sqlite:///{base / f'ab-{k}.db'}" for k in ("sync", "asyncio")}}
        pg_ab = None
        bindir_ab = None if args.no_postgres else postgres_bindir()
        if bindir_ab is not None:
            pg_ab = PostgresServer.start(bindir_ab)
            stores["PostgreSQL"] = {k: pg_ab.create_database() for k in ("sync", "asyncio")}
        try:
            for store, urls in stores.items():
                rows = interleaved_servers(
                    deployment,
                    tokens,
                    factory,
                    base / store,
                    urls,
                    shapes=[single, batch],
                    seconds=seconds,
                    runs=runs,
                    workers=args.workers,
                    per_device=args.connections == "device",
                )
                print(f"\n{store} ledger, alternating rounds (median [min-max] of {runs}):")
                print(
                    format_table(
                        [
                            "server",
                            "reports/call",
                            "devices",
                            "calls/s",
                            "reports/s",
                            "collector CPU per call, us",
                        ],
                        rows,
                    )
                )
        finally:
            if pg_ab is not None:
                pg_ab.stop()
            subprocess.run(["rm", "-rf", str(base)], check=False)
        return 0

    def run(server: Server, shapes: list[dict[str, Any]]) -> None:
        try:
            for shape in shapes:
                f = measure(
                    server,
                    tokens,
                    factory,
                    seconds=seconds,
                    runs=runs,
                    warmup=warmup,
                    connections=args.connections,
                    **shape,
                )
                figures.append(f)
                print(
                    f"  {f.label:<46} {f.reports_per_call:>3}/call: "
                    f"{_fmt(f.calls_per_s)} calls/s, {_fmt(f.reports_per_s)} reports/s, "
                    f"p50 {f.p50_ms.median:.2f} ms, p99 {f.p99_ms.median:.2f} ms"
                    + (f", errors {f.error_codes}" if f.errors else ""),
                    file=sys.stderr,
                )
        finally:
            server.stop()

    print("measuring (servers are subprocesses; load from this process) ...", file=sys.stderr)
    run(start_null("sync", base, args.workers), [single, batch])
    run(start_null("aio", base, args.workers), [single, batch])
    sqlite_url = f"sqlite:///{base / 'ledger.db'}"
    run(
        start_collectors(
            deployment,
            base / "sqlite",
            sqlite_url,
            1,
            "collector (SQLite, sync)",
            args.workers,
            server="sync",
        ),
        [single, batch],
    )
    # Several processes on one port (collector/supervisor.py), against as many
    # do-nothing processes on one port; the sync flavour only in full runs
    # (--quick stays under a minute).
    flavours = [("aio", "asyncio", "asyncio")]
    if not args.quick:
        flavours.insert(0, ("sync", "sync", "sync"))
    # Where the collector's default process count is --processes, its asyncio row is
    # the defaults row, and the last SQLite row runs one process instead.
    from fedldp.collector.config import default_processes

    defaults_measured = args.processes > 1 and default_processes() == args.processes
    for null_kind, server_kind, label in flavours if args.processes > 1 else []:
        run(start_null(null_kind, base, args.workers, processes=args.processes), [single, batch])
        run(
            start_collectors(
                deployment,
                base / f"sqlite-procs-{server_kind}",
                f"sqlite:///{base / f'ledger-procs-{server_kind}.db'}",
                1,
                defaults_label("SQLite")
                if defaults_measured and server_kind == "asyncio"
                else f"collector (SQLite, {label}, {args.processes} processes)",
                args.workers,
                server=server_kind,
                processes=args.processes,
            ),
            [single, batch],
        )
    # The same with ids that are random per report (a client that does not make
    # them as the SDK does): every insert goes to a random leaf of the id index.
    # On a fresh ledger (the row above ran after the 1-report-per-call load).
    random_url = f"sqlite:///{base / 'ledger-random.db'}"
    if not args.quick:
        run(
            start_collectors(
                deployment,
                base / "sqlite-random",
                random_url,
                1,
                defaults_label("SQLite"),
                args.workers,
                server="asyncio",
                processes=None,
            ),
            [{**batch, "report_ids": "random"}],
        )
    aio_url = f"sqlite:///{base / 'ledger-aio.db'}"
    run(
        start_collectors(
            deployment,
            base / "sqlite-aio",
            aio_url,
            1,
            (
                "collector (SQLite, asyncio, 1 process)"
                if defaults_measured
                else defaults_label("SQLite")
            ),
            args.workers,
            server="asyncio",
            processes=1 if defaults_measured else None,
        ),
        [single, batch],
    )
    pg_note = None
    bindir = None if args.no_postgres else postgres_bindir()
    if bindir is not None:
        pg = PostgresServer.start(bindir)
        try:
            url = pg.create_database()
            run(
                start_collectors(
                    deployment,
                    base / "pg1",
                    url,
                    1,
                    defaults_label("PostgreSQL"),
                    args.workers,
                    processes=None,
                ),
                [single, batch],
            )
            url2 = pg.create_database()
            run(
                start_collectors(
                    deployment,
                    base / "pg2",
                    url2,
                    2,
                    "2 collectors (asyncio, one PostgreSQL)",
                    args.workers,
                ),
                [single, batch],
            )
        finally:
            pg.stop()
    else:
        pg_note = "PostgreSQL figures skipped (--no-postgres or no initdb/pg_ctl installed)"

    by = {(f.label, f.reports_per_call): f for f in figures}
    best = {
        n: max(
            f.calls_per_s.median
            for f in figures
            if f.server.startswith("do-nothing") and f.reports_per_call == n
        )
        for n in {f.reports_per_call for f in figures}
    }
    rows = []
    for f in figures:
        ref = by[("do-nothing (sync)", f.reports_per_call)]
        # The same grpcio flavour as the server measured (the collector's default
        # is the asyncio server; collector rows naming "sync" run the sync one).
        if f.server.startswith("do-nothing"):
            kind = "aio" if f.server.startswith("do-nothing (aio") else "sync"
        else:
            kind = "sync" if re.search(r"\bsync\b", f.server) else "aio"
        several = re.search(r"(\d+) processes\)", f.server)
        if several:  # against as many do-nothing processes (measured when --processes is that)
            kind += f", {several.group(1)} processes"
        same = by.get((f"do-nothing ({kind})", f.reports_per_call)) or ref
        rows.append(
            [
                f.label,
                f.reports_per_call,
                f.concurrency,
                _fmt(f.calls_per_s),
                _fmt(f.reports_per_s),
                _fmt(f.p50_ms, rate=False),
                _fmt(f.p99_ms, rate=False),
                f"{f.calls_per_s.median / ref.calls_per_s.median:.2f}",
                f"{f.calls_per_s.median / same.calls_per_s.median:.2f}",
                f"{f.calls_per_s.median / best[f.reports_per_call]:.2f}",
                _fmt(f.server_cpu_us, rate=False) if f.server_cpu_us else "-",
                "/".join(f"{m:.0f}" for m in f.peak_rss_mb) or "-",
                f.errors,
            ]
        )
    print(
        format_table(
            [
                "server",
                "reports/call",
                "devices",
                "calls/s",
                "reports/s",
                "p50 ms",
                "p99 ms",
                "x do-nothing (sync)",
                "x do-nothing (same flavour, processes)",
                "x best do-nothing",
                "server CPU us/report",
                "peak RSS MB",
                "errors",
            ],
            rows,
        )
    )
    print(f"\n{runs} runs of {seconds} s each (median [min-max]); cores: {os.cpu_count()}")
    if pg_note:
        print(pg_note)
    if args.json:
        write_json(
            args.json,
            benchmark="collector",
            params={
                "quick": args.quick,
                "runs": runs,
                "seconds": seconds,
                "warmup": warmup,
                "concurrency": args.concurrency,
                "batch_concurrency": args.batch_concurrency,
                "workers": args.workers,
                "processes": args.processes,
                "connections": args.connections,
                "durability": "SQLite WAL synchronous=FULL; PostgreSQL fsync=on",
            },
            figures=[f.__dict__ for f in figures],
            packages=PACKAGES,
        )
    subprocess.run(["rm", "-rf", str(base)], check=False)
    _ = statistics  # (median via bench._common.summarize)
    return 0


if __name__ == "__main__":
    sys.exit(main())
