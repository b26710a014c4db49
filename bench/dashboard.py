"""Benchmark of `fedldp dashboard`: server-side page time over a ledger of 10M reports.

    python -m bench.dashboard            # 10M reports, 30 daily windows, 3 policies
    python -m bench.dashboard --quick    # 1M reports (< 1 minute)
    python -m bench.dashboard --json out.json

The ledger (a SQLite file created by `open_ledger`) holds the additive statistics of
N randomized reports (GRR k = 64, OLH k = 1024, piecewise numeric on [0, 10]; eps = 1;
Zipf(1.1) values), spread evenly over 30 daily windows and 8 collector shards per
window, built with the mechanisms' batch paths and written straight into the
statistics table (raw report rows are not needed: pages read the statistics only).
The spend table holds one row per (subject, policy, window) of the latest window
(one report per subject: N / 30 rows), so the budget page scans a realistic open
window. Central reservations: 1,000 (open, settled and cancelled).

Timed, median [min-max] over --runs after one warm-up view: each page's server-side
time (`Dashboard` model + HTML rendering, no HTTP), and the same page fetched through
uvicorn on loopback (HTTP GET, whole response read). The budget page is timed twice:
its first view (a fresh Dashboard: one scan of the open window's spend rows; later this
scan runs in a background thread when the figures are older than 10 s) and later views.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from fedldp.aggregator.dashboard import pages
from fedldp.aggregator.dashboard.app import DashboardServer
from fedldp.aggregator.dashboard.model import Dashboard, Options
from fedldp.aggregator.dashboard.source import ReadOnlyLedger
from fedldp.authoring import Authority
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.ledger.schema import central_reservations, spend, statistics

from bench._common import Timing, format_table, time_runs, write_json

PACKAGES = ["numpy", "sqlalchemy", "starlette", "uvicorn", "fedldp"]
NOW = int(time.time())
DAY = 86400
WINDOWS = 30
SHARDS = 8


def policies() -> list[VerifiedPolicy]:
    """GRR k = 64, OLH k = 1024 and piecewise numeric, eps = 1, valid over the windows."""
    authority = Authority.generate(now=NOW - 60 * DAY)
    common: dict[str, Any] = {
        "epsilon": "1",
        "epsilon_cap": "1",
        "window_seconds": DAY,
        "now": NOW - 40 * DAY,
        "lifetime_seconds": 80 * DAY,
        "min_reports": 100,
    }
    made = [
        authority.categorical_policy(
            policy_id="grr64",
            metric="bench.grr64",
            labels=[f"v{i}" for i in range(64)],
            mechanism="grr",
            **common,
        ),
        authority.categorical_policy(
            policy_id="olh1024",
            metric="bench.olh1024",
            labels=[f"v{i}" for i in range(1024)],
            mechanism="olh",
            **common,
        ),
        authority.numeric_policy(
            policy_id="latency", metric="bench.latency", lo="0", hi="10", **common
        ),
    ]
    trust = authority.trust_store(now=NOW)
    return [verify_policy(authority.sign(p), trust, now=NOW) for p in made]


def _zipf(k: int) -> np.ndarray:
    w = 1.0 / np.arange(1, k + 1) ** 1.1
    return np.asarray(w / w.sum())


def _insert(ledger: Ledger, table: sa.Table, rows: list[dict[str, Any]]) -> None:
    """INSERT `rows` into `table` in one transaction."""

    def tx(conn: sa.Connection) -> None:
        conn.execute(sa.insert(table), rows)

    ledger.transaction(tx)


def build(path: Path, chosen: list[VerifiedPolicy], n: int) -> float:
    """Fill the ledger at `path` with n reports' statistics and the latest window's spend."""
    started = time.perf_counter()
    ledger = open_ledger(f"sqlite:///{path}")
    rng = np.random.default_rng(20261201)
    today = NOW - NOW % DAY
    per_cell = n // (len(chosen) * WINDOWS * SHARDS)
    try:
        for policy in chosen:
            mech = policy.mechanism
            rows = []
            for w in range(WINDOWS):
                for shard in range(SHARDS):
                    if policy.labels is not None:
                        k = len(policy.labels)
                        values: Any = rng.choice(k, size=per_cell, p=_zipf(k))
                    else:
                        values = rng.gamma(2.0, 1.0, size=per_cell).clip(0, 10)
                    stat = mech.new_statistic()
                    mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
                    rows.append(
                        {
                            "policy_id": policy.policy_id,
                            "policy_version": policy.version,
                            "window_start": today - (WINDOWS - 1 - w) * DAY,
                            "shard": f"collector-{shard}",
                            "n": per_cell,
                            "statistic_json": mech.statistic_to_json(stat),
                            "updated_at": NOW,
                        }
                    )
            _insert(ledger, statistics, rows)
            subjects = per_cell * SHARDS
            for start in range(0, subjects, 100_000):
                chunk = [
                    {
                        "subject": f"s{i:09d}",
                        "policy_id": policy.policy_id,
                        "window_start": today,
                        "epsilon_spent": "1",
                        "report_count": 1,
                        "epsilon_cap": "1",
                        "updated_at": NOW,
                    }
                    for i in range(start, min(start + 100_000, subjects))
                ]
                _insert(ledger, spend, chunk)
        reservations = [
            {
                "id": f"r{i}",
                "subject": f"a{i % 10}",
                "purpose": f"purpose-{i % 5}",
                "epsilon": "0.5",
                "delta": "0",
                "status": ("reserved", "settled", "cancelled")[i % 3],
                "epsilon_spent": "0.25" if i % 3 == 1 else None,
                "delta_spent": None,
                "idempotency_key": f"k{i}",
                "metadata_json": "{}",
                "events_json": None,
                "created_at": NOW,
                "closed_at": None,
            }
            for i in range(1000)
        ]
        _insert(ledger, central_reservations, reservations)
    finally:
        ledger.close()
    return time.perf_counter() - started


def http_get(url: str) -> Callable[[], int]:
    def run() -> int:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return len(resp.read())

    return run


def _ms(t: Any) -> str:
    assert isinstance(t, Timing)
    return f"{t.median * 1e3:.1f} ms [{t.min * 1e3:.1f}-{t.max * 1e3:.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.dashboard",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="1M reports instead of 10M")
    parser.add_argument("--runs", type=int, default=9, help="repetitions per timing")
    parser.add_argument("--json", type=Path, help="write figures, params, commit, machine here")
    args = parser.parse_args(argv)
    n = 1_000_000 if args.quick else 10_000_000
    chosen = policies()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "ledger.db"
        build_s = build(path, chosen, n)
        dash = Dashboard(ReadOnlyLedger(open_ledger(f"sqlite:///{path}", access="read")), chosen)
        source = ReadOnlyLedger(open_ledger(f"sqlite:///{path}", access="read"))

        def first_budget_view() -> str:
            fresh = Dashboard(source, chosen)
            return pages.budget_page(fresh.budget(), fresh.policies)

        stored = sum(s.n for s in dash.ledger.window_counts())
        opts = Options(consistency="norm-sub")
        views: dict[str, Callable[[], Any]] = {
            "index": lambda: pages.index_page(dash.index(), read_at=NOW),
            "policy grr64 (12 windows)": lambda: pages.policy_page(
                chosen[0], dash.window_reports("grr64", opts), opts, read_at=NOW
            ),
            "policy olh1024 (12 windows)": lambda: pages.policy_page(
                chosen[1], dash.window_reports("olh1024", opts), opts, read_at=NOW
            ),
            "policy latency (numeric)": lambda: pages.policy_page(
                chosen[2], dash.window_reports("latency", Options()), Options(), read_at=NOW
            ),
            "budget (first view)": first_budget_view,
            "budget (later views)": lambda: pages.budget_page(dash.budget(), dash.policies),
            "JSON report grr64 (all windows)": lambda: dash.report("grr64", None, opts),
        }
        rows = []
        for name, fn in views.items():
            fn()  # warm-up (imports, first connection, caches)
            timing, _ = time_runs(fn, args.runs)
            rows.append({"page": name, "server_s": timing})
        server = DashboardServer(dash, port=0).start()
        try:
            paths = {
                "index": "",
                "policy grr64 (12 windows)": "policies/grr64?consistency=norm-sub",
                "policy olh1024 (12 windows)": "policies/olh1024?consistency=norm-sub",
                "policy latency (numeric)": "policies/latency",
                "budget (later views)": "budget",
                "JSON report grr64 (all windows)": "api/policies/grr64/report?consistency=norm-sub",
            }
            for row in rows:
                if row["page"] in paths:
                    get = http_get(server.url + paths[row["page"]])
                    get()
                    row["http_s"], _ = time_runs(get, args.runs)
        finally:
            server.stop()
            source.close()
        spend_rows = len(chosen) * (n // (len(chosen) * WINDOWS * SHARDS)) * SHARDS
        figures = {
            "stored_reports": stored,
            "spend_rows": spend_rows,
            "build_s": build_s,
            "ledger_bytes": path.stat().st_size,
            "pages": rows,
        }
    print(
        f"## Dashboard page time: {stored:,} stored reports, {WINDOWS} windows x {SHARDS} "
        f"shards x 3 policies, {figures['spend_rows']:,} spend rows (latest window); "
        f"median [min-max] of {args.runs}"
    )
    print(
        format_table(
            ["page", "server side (model + HTML)", "HTTP GET via uvicorn"],
            [
                [r["page"], _ms(r["server_s"]), _ms(r["http_s"]) if "http_s" in r else "-"]
                for r in rows
            ],
        )
    )
    print(f"(ledger built in {build_s:.0f} s, {figures['ledger_bytes'] / 2**20:.0f} MiB)")
    if args.json:
        write_json(
            args.json,
            benchmark="dashboard",
            figures=figures,
            params={"reports": n, "runs": args.runs, "windows": WINDOWS, "shards": SHARDS},
            packages=PACKAGES,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
