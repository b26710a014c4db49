"""CPU per report of the collector's ingestion path, in process (no gRPC, one thread).

    python -m bench.ingest_cpu                # 100 and 1 reports/call, 300,000 rows stored first
    python -m bench.ingest_cpu --quick        # 30,000 rows stored first (< 1 minute)
    python -m bench.ingest_cpu --json out.json

What bench/collector.py measures end to end, split into its parts: each timed
group is `requests` requests of `reports` reports, made as the benchmark's load
generator makes them (one subject per device, report ids as the SDK makes
them), validated by `CollectorService.prepare`, charged in one
`Ledger.submit_many` on a durable SQLite ledger (WAL, synchronous=FULL) and
answered by `CollectorService.finish`. Thread CPU time (`time.thread_time`) per
report, median [min-max] of the timed runs, for:

* validate: parse the request bytes and `prepare` (authentication, rate limit
  and gRPC are not included);
* plan: the ledger's work before its transaction (`Ledger._plan_group`);
* transaction: the ledger's transaction, COMMIT included (with several
  processes on one SQLite file, the part that holds the writer lock);
* respond: `finish` and serialization.

The ledger starts with `--prefill` stored reports, because the id index's size
sets the cost of an insert.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._common import Timing, format_table, summarize, write_json

PHASES = ("validate", "plan", "transaction", "respond")


class _Clock:
    """Thread CPU seconds spent in each phase (the ledger's two are wrapped)."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PHASES, 0.0)

    def wrap(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[phase] += time.thread_time() - started

        return timed


def measure(reports: int, requests: int, prefill: int, runs: int, per_run: int) -> dict[str, Any]:
    """One shape: per-phase CPU µs per report over `runs` runs of `per_run` reports."""
    from fedldp.client.report_ids import ReportIds
    from fedldp.collector.committer import GroupCommitter
    from fedldp.collector.ledger import open_ledger
    from fedldp.collector.metrics import CollectorMetrics
    from fedldp.collector.service import CollectorService, Limits
    from fedldp.v1 import collector_pb2 as pb

    from bench.collector import RequestFactory
    from tests.support.collector_testkit import Deployment

    now = int(time.time())
    deployment = Deployment.create(now=now)
    deployment.add_categorical("bench", epsilon="0.001", epsilon_cap="1000000")
    factory = RequestFactory(deployment, now)
    devices = 64
    subjects = [f"device-{i}" for i in range(devices)]
    ids = [ReportIds() for _ in range(devices)]
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="fedldp-bench-ingest-") as base:
        ledger = open_ledger(f"sqlite:///{Path(base) / 'ledger.db'}")
        # Instance attributes shadow the methods: only this ledger is timed.
        ledger._plan_group = clock.wrap("plan", ledger._plan_group)  # type: ignore[method-assign]
        ledger._ingest_transaction = clock.wrap(  # type: ignore[method-assign]
            "transaction", ledger._ingest_transaction
        )
        metrics = CollectorMetrics()
        committer = GroupCommitter(ledger, metrics)  # unused: groups are submitted directly
        service = CollectorService(
            deployment.registry(now=now), ledger, committer, metrics, Limits(), lambda: now
        )
        device = 0

        def group() -> None:
            nonlocal device
            prepared = []
            for _ in range(requests):
                body = factory.request(reports, ids[device % devices])
                started = time.thread_time()
                request = pb.SubmitRequest.FromString(body)
                prepared.append(service.prepare(subjects[device % devices], request, body))
                clock.spent["validate"] += time.thread_time() - started
                device += 1
            outcomes = ledger.submit_many([p.batch for p in prepared])
            started = time.thread_time()
            for p, out in zip(prepared, outcomes, strict=True):
                service.finish(p, out).SerializeToString()
            clock.spent["respond"] += time.thread_time() - started

        per_group = reports * requests
        for _ in range(max(1, prefill // per_group)):
            group()
        samples: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for _ in range(runs):
            clock.spent = dict.fromkeys(PHASES, 0.0)
            groups = max(1, per_run // per_group)
            for _ in range(groups):
                group()
            for phase in PHASES:
                samples[phase].append(clock.spent[phase] / (groups * per_group) * 1e6)
        committer.close()
        ledger.close()
    timings = {phase: summarize(values) for phase, values in samples.items()}
    total = summarize([sum(values) for values in zip(*samples.values(), strict=True)])
    return {
        "reports_per_call": reports,
        "requests_per_group": requests,
        "prefill": prefill,
        "us_per_report": {**timings, "total": total},
    }


def _fmt(t: Timing) -> str:
    return f"{t.median:.1f} [{t.min:.1f}-{t.max:.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller prefill (< 1 minute)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per shape")
    args = parser.parse_args(argv)
    prefill = 30_000 if args.quick else 300_000
    shapes = [(100, 7, 35_000), (1, 20, 4_000)]
    results = [
        measure(reports, requests, prefill, args.runs, per_run)
        for reports, requests, per_run in shapes
    ]
    rows = [
        [
            r["reports_per_call"],
            r["requests_per_group"],
            *(_fmt(r["us_per_report"][k]) for k in (*PHASES, "total")),
        ]
        for r in results
    ]
    print(
        f"CPU µs per report, in process, {prefill:,} rows stored first "
        f"(median [min-max] of {args.runs} runs):"
    )
    print(
        format_table(
            ["reports/call", "requests/group", *PHASES, "total"],
            rows,
        )
    )
    if args.json:
        write_json(
            Path(args.json),
            benchmark="ingest_cpu",
            params={"prefill": prefill, "runs": args.runs, "shapes": shapes},
            figures=results,
            packages=("grpcio", "protobuf", "sqlalchemy"),
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
