"""TypeScript SDK figures (issue 31 item 5): browser bundle size, record() latency in
Node and in headless Chromium, reports/s a page randomizes and persists.

    python -m bench.sdk_js [--quick] [--json PATH] [--runs N] [--reports N]

Needs node >= 20 with sdk/js's dependencies (`cd sdk/js && npm ci`) and, for the
Chromium figures, /usr/bin/chromium. It builds the SDK (tsc, then the esbuild
browser bundles) and runs sdk/js/bench/sdk_bench.ts, which starts a real
`fedldp collector serve` with its web endpoint and measures:

* **Bundle size**, minified and gzip -9, of what a page loads up front from the
  ESM browser build (the entry and the chunks it imports statically; lazy chunks
  — @noble/ed25519, the gRPC-Web transport — listed apart) with GRR/OLH only and
  with every mechanism, and the bytes by origin (esbuild metafile). References:
  a bundle of the @bufbuild/protobuf runtime with the generated descriptors
  (create, toBinary, fromBinary of the Collector messages) and one that adds
  connect-web's Connect transport (transport_connect.ts) — the floors any page
  using those libraries pays.
* **record() latency per call** (GRR, k = 3), median over the calls of each run,
  then median / min / max over the runs. Timed section: record() — policy
  lookup, budget check, randomization, serialization and the durable write of its
  change (Node: one framed append to the state file and fdatasync;
  Chromium: one IndexedDB readwrite transaction, durability "strict"; the
  same with durability "relaxed" — committed, not flushed — is also shown).
  References in the same run: the mechanism's perturb() alone (the randomizer
  floor), in Node record() into an in-memory store (all but the storage), and
  the storage floor of one durable write: in Node a bare 250-byte write into
  preallocated space with fdatasync, in Chromium a bare IndexedDB transaction
  of one small put, durability "strict".
* **Reports/s a page randomizes and persists**: `reports` record() calls one
  after another in the page (and in Node), divided by the sum of their times
  (nothing sent meanwhile). Each record() call is followed by one call of the
  storage-floor reference, so both meet the same disk; the ratio of their
  run medians is the portable figure.

Absolute times depend on the disk (fsync) and the load; the ratios to the
references are the portable figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
from pathlib import Path
from typing import Any

from bench._common import REPO_ROOT, Timing, format_table, summarize, write_json

JS = REPO_ROOT / "sdk" / "js"


def _per_run_medians(runs: list[list[float]]) -> Timing:
    """Median / min / max over runs of each run's median (milliseconds)."""
    return summarize([statistics.median(r) for r in runs])


def _ratios(numerator: list[list[float]], denominator: list[list[float]]) -> Timing:
    """Median / min / max over runs of (run median of `numerator` ÷ run median of `denominator`)."""
    return summarize(
        [
            statistics.median(a) / statistics.median(b)
            for a, b in zip(numerator, denominator, strict=True)
        ]
    )


def measure(runs: int, reports: int) -> dict[str, Any]:
    """Build the SDK, run sdk_bench.js, and reduce its samples to figures."""
    if shutil.which("node") is None or not (JS / "node_modules").is_dir():
        raise SystemExit("node and sdk/js/node_modules are needed: cd sdk/js && npm ci")
    subprocess.run(["npx", "tsc", "-p", "tsconfig.json"], cwd=JS, check=True)
    sizes = json.loads(
        subprocess.run(
            [
                "node",
                "-e",
                "import('./scripts/build_browser.mjs').then(async m => "
                "console.log(JSON.stringify(await m.buildBrowser())))",
            ],
            cwd=JS,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    raw = json.loads(
        subprocess.run(
            ["node", "dist/bench/sdk_bench.js", "--runs", str(runs), "--n", str(reports)],
            cwd=JS,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    node, chromium = raw["node"], raw["chromium"]
    return {
        "bundle_bytes": {**sizes, **raw["runtimeFloor"]},
        "node_record_ms": _per_run_medians(node["record"]),
        "node_record_memory_store_ms": _per_run_medians(node["memory"]),
        "node_perturb_ms": _per_run_medians(node["perturb"]),
        "node_bare_fdatasync_ms": _per_run_medians(node["bare"]),
        "node_reports_per_s": summarize([reports / s for s in node["seconds"]]),
        "chromium_record_ms": _per_run_medians(chromium["record"]),
        "chromium_record_relaxed_ms": _per_run_medians(chromium["relaxed"]),
        "chromium_perturb_ms": _per_run_medians(chromium["perturb"]),
        "chromium_bare_idb_transaction_ms": _per_run_medians(chromium["bare"]),
        "node_record_to_bare_fdatasync": _ratios(node["record"], node["bare"]),
        "chromium_record_to_bare_idb_transaction": _ratios(chromium["record"], chromium["bare"]),
        "chromium_reports_per_s": summarize(chromium["reportsPerSecond"]),
        "versions": {"node": raw["nodeVersion"], "chromium": raw["chromiumVersion"]},
    }


def _row(name: str, t: Timing, unit: str) -> list[str]:
    return [name, f"{t.median:.3g} {unit}", f"{t.min:.3g} – {t.max:.3g}"]


def main(argv: list[str] | None = None) -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="5 runs of 20 reports (about a minute)"
    )
    parser.add_argument("--runs", type=int, default=None, help="runs (default 7; quick 5)")
    parser.add_argument("--reports", type=int, default=None, help="record() calls per run")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 7)
    reports = args.reports or (20 if args.quick else 200)
    figures = measure(runs, reports)
    sizes = figures["bundle_bytes"]
    print(
        format_table(
            ["bundle", "minified", "gzip"],
            [[k, f"{v['minified']:,} B", f"{v['gzip']:,} B"] for k, v in sizes.items()],
        )
    )
    print()
    timings = [
        _row("Node record() (file outbox)", figures["node_record_ms"], "ms"),
        _row(
            "Node record() (memory store, reference)", figures["node_record_memory_store_ms"], "ms"
        ),
        _row("Node perturb() alone (reference)", figures["node_perturb_ms"], "ms"),
        _row(
            "Node bare 250 B write + fdatasync (reference)", figures["node_bare_fdatasync_ms"], "ms"
        ),
        _row("Chromium record() (IndexedDB outbox)", figures["chromium_record_ms"], "ms"),
        _row(
            "Chromium record() (IndexedDB, relaxed durability)",
            figures["chromium_record_relaxed_ms"],
            "ms",
        ),
        _row("Chromium perturb() alone (reference)", figures["chromium_perturb_ms"], "ms"),
        _row(
            "Chromium bare IndexedDB put transaction, strict (reference)",
            figures["chromium_bare_idb_transaction_ms"],
            "ms",
        ),
        _row(
            "Chromium page: reports/s randomized + persisted",
            figures["chromium_reports_per_s"],
            "/s",
        ),
        _row("Node: reports/s randomized + persisted", figures["node_reports_per_s"], "/s"),
        _row(
            "Node record() ÷ bare fdatasync, same run",
            figures["node_record_to_bare_fdatasync"],
            "×",
        ),
        _row(
            "Chromium record() ÷ bare IndexedDB transaction, same run",
            figures["chromium_record_to_bare_idb_transaction"],
            "×",
        ),
    ]
    print(format_table(["figure", "median", "min – max"], timings))
    print(f"\n{runs} runs of {reports} reports; {figures['versions']}")
    if args.json is not None:
        write_json(
            args.json,
            benchmark="sdk_js",
            params={"runs": runs, "reports": reports, "mechanism": "grr", "k": 3},
            figures=figures,
        )


if __name__ == "__main__":
    main()
