"""Operations figures: the cost of one health probe, and backup/restore times.

    python -m bench.deploy                 # 200,000 stored reports
    python -m bench.deploy --quick         # 20,000 (< 1 minute)
    python -m bench.deploy --json out.json

* probe: `fedldp collector health` as a container HEALTHCHECK or Kubernetes exec
  probe runs it (a new process each time) against a running collector: wall
  time and the child's CPU time (user + system);
* backup / restore: `fedldp ledger backup` and `fedldp ledger restore` (the
  restore includes its reconcile) as subprocesses, on a SQLite ledger and, when
  PostgreSQL is installed, on a throwaway PostgreSQL server (pg_dump/pg_restore);
  with the ledger's and the backup's sizes.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._common import Timing, format_table, summarize, write_json

FEDLDP = [sys.executable, "-m", "fedldp.cli"]


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_probe(runs: int) -> dict[str, Timing]:
    """Wall and CPU seconds of one `fedldp collector health` process."""
    from fedldp.collector.server import start_collector

    from tests.support.collector_testkit import Deployment

    deployment = Deployment.create(now=int(time.time()))
    deployment.add_categorical("color")
    with tempfile.TemporaryDirectory() as folder:
        running = start_collector(
            deployment.config(f"sqlite:///{folder}/ledger.db"), registry=deployment.registry()
        )
        walls, cpus = [], []
        try:
            for _ in range(runs):
                cpu, start = _child_cpu(), time.perf_counter()
                subprocess.run(
                    [*FEDLDP, "collector", "health", "--addr", running.address],
                    check=True,
                    capture_output=True,
                )
                walls.append(time.perf_counter() - start)
                cpus.append(_child_cpu() - cpu)
        finally:
            running.stop(1.0)
    return {"wall_s": summarize(walls), "cpu_s": summarize(cpus)}


def _fill(url: str, reports: int) -> None:
    """Store `reports` reports (100 per subject) through `Ledger.submit_many`."""
    from fedldp.collector.ledger import SubmitBatch, open_ledger

    from tests.support.collector_testkit import Deployment, checked_report

    deployment = Deployment.create(now=int(time.time()))
    policy = deployment.verified(
        deployment.add_categorical("color", epsilon="0.01", epsilon_cap="10")
    )
    now = int(time.time())
    with open_ledger(url) as led:
        subjects = reports // 100
        for first in range(0, subjects, 20):
            led.submit_many(
                [
                    SubmitBatch(f"s{s}", [checked_report(policy, s % 4) for _ in range(100)], now)
                    for s in range(first, min(first + 20, subjects))
                ]
            )


def _timed(argv: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{argv[3:5]} failed: {done.stdout}{done.stderr}")
    return time.perf_counter() - start


def measure_backup(store: str, reports: int, runs: int) -> dict[str, Any]:
    """Backup and restore seconds of a ledger holding `reports` reports."""
    from tests.support.collector_testkit import PostgresServer, postgres_bindir

    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        server: PostgresServer | None = None
        pg_bin: list[str] = []
        if store == "sqlite":
            live = f"sqlite:///{base / 'live.db'}"
        else:
            bindir = postgres_bindir()
            assert bindir is not None
            server = PostgresServer.start(bindir)
            live, pg_bin = server.create_database(), ["--pg-bin", str(bindir)]
        try:
            _fill(live, reports)
            backups, restores, sizes = [], [], []
            for i in range(runs):
                out = base / f"backup-{i}"
                backups.append(
                    _timed([*FEDLDP, "ledger", "backup", "--url", live, *pg_bin, str(out)])
                )
                sizes.append(out.stat().st_size)
                target = (
                    f"sqlite:///{base / f'restored-{i}.db'}"
                    if server is None
                    else server.create_database()
                )
                restores.append(
                    _timed([*FEDLDP, "ledger", "restore", "--url", target, *pg_bin, str(out)])
                )
        finally:
            if server is not None:
                server.stop()
    return {
        "store": store,
        "reports": reports,
        "backup_s": summarize(backups),
        "restore_and_reconcile_s": summarize(restores),
        "backup_mib": max(sizes) / (1 << 20),
    }


def _fmt(t: Timing) -> str:
    return f"{t.median:.2f} [{t.min:.2f}-{t.max:.2f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 reports (< 1 minute)")
    parser.add_argument("--json", help="write every figure here")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per figure")
    parser.add_argument("--no-postgres", action="store_true", help="skip PostgreSQL")
    args = parser.parse_args(argv)
    from tests.support.collector_testkit import postgres_bindir

    reports = 20_000 if args.quick else 200_000
    probe = measure_probe(max(args.runs, 5))
    print(
        f"fedldp collector health, one process (median [min-max] of {probe['wall_s'].runs}): "
        f"wall {_fmt(probe['wall_s'])} s, CPU {_fmt(probe['cpu_s'])} s"
    )
    stores = ["sqlite"]
    if not args.no_postgres and postgres_bindir() is not None:
        stores.append("postgresql")
    results = [measure_backup(s, reports, args.runs) for s in stores]
    print(f"\nbackup / restore (with reconcile) of {reports:,} reports, seconds:")
    print(
        format_table(
            ["store", "backup", "restore + reconcile", "backup MiB"],
            [
                [
                    r["store"],
                    _fmt(r["backup_s"]),
                    _fmt(r["restore_and_reconcile_s"]),
                    f"{r['backup_mib']:.1f}",
                ]
                for r in results
            ],
        )
    )
    if args.json:
        write_json(
            Path(args.json),
            benchmark="deploy",
            params={"reports": reports, "runs": args.runs},
            figures={"probe": probe, "backup": results},
            packages=("grpcio", "sqlalchemy", "psycopg"),
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
