"""Benchmark of heavy-hitter discovery (pem + aggregator/discovery.py) beside pure-ldp's PEM.

    python -m bench.heavy_hitters            # n = 1e6, eps in {2, 4, 8}, 5 runs
    python -m bench.heavy_hitters --quick    # n = 1e5, eps in {4, 8}, 1 run (< 1 minute)
    python -m bench.heavy_hitters --json out.json

Data: a vocabulary of 10,000 distinct random lowercase words of 3..8 letters
(fixed seed), ranked, and n users drawn from Zipf(1.1) over the ranks; strings
of up to 8 bytes (`OpenDomain(8)`), the default pem params (4-bit steps from 4
bits: 15 groups; g the power of two nearest e^ε + 1) and the default threshold
rule (α = 0.05 per level, at most 32 kept).

Per ε:

* recall of the top 20: |found ∩ true top 20| / 20;
* precision of the top 20: |20 largest found ∩ true top 20| / |20 largest found|
  (1.0 when nothing is found);
* device, µs per report: `perturb(word)` with the OS CSPRNG (the SDK's path), on
  --device-reports words;
* the side-by-side run: fedldp and pure-ldp on --peer-n users of a
  vocabulary of strings of up to --peer-bytes L = 3 bytes (pure-ldp's local
  hashing allocates 2^(8L) cells per group and cannot run L = 8);
* analysis, s: `accumulate_batch` of the n simulated reports + `discover`
  (what `fedldp report` does after reading the statistic); the simulated
  reports come from `perturb_batch` (not timed);
* discover CPU s, and beside it the reference in the same run: the CPU
  seconds (`time.process_time`) of `discover` alone and of
  `discover(..., reference=True)` (every candidate's hash evaluated in full by
  `PEM.estimate_prefixes`; the same result), on the same statistic. CPU time,
  not wall time: on a shared machine the wall time also counts other work.
  scipy.stats, which the threshold imports on first use (≈ 1 s of CPU once per
  process), is imported before any timing.

The stored statistic (bench/_pem_storage.py, issue #33), unless --no-stored:

* analysis from the ledger, s: per ε, the same n reports read from a SQLite
  ledger (`Ledger.statistics`), merged and discovered, as the collector stores
  them (chunk rows of --commit-size reports), beside the same reports stored
  as one JSON statistics row (the form before ledger migration 0008) in the
  same run; wall and CPU seconds;
* commit CPU ms: one `Ledger.submit_many` of --commit-size pem reports into a
  window already holding N reports (--commit-windows), chunk rows against the
  JSON row rewritten per commit (ε = the first of --epsilons).

Medians over --runs runs (min and max in the JSON). The peer is pure-ldp's
prefix-extending heavy hitters (`pure_ldp.heavy_hitters.prefix_extending`),
run by --peer-python (a separate virtual environment holding pure-ldp, never
a fedldp dependency) on --peer-n users with the same data, the words as
64-bit strings (the same padding), the same 4-bit steps from 4 bits, and its
own rule (the top 20 at every level, OLH by xxhash); it is skipped, and says
why, when that interpreter or pure-ldp is missing or fails.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.aggregator.discovery import discover
from fedldp.client.mechanisms import OpenDomain
from fedldp.client.mechanisms.pem import PEM

from bench import _pem_storage as pem_storage
from bench._common import format_table, summarize, write_json

VOCABULARY = 10_000
ZIPF_S = 1.1
MAX_BYTES = 8
TOP = 20
PACKAGES = ["numpy", "scipy", "fedldp"]
DEFAULT_PEER_PYTHON = "/work/wt/pem-peer/bin/python"


def vocabulary(seed: int, max_bytes: int = MAX_BYTES) -> tuple[list[str], np.ndarray]:
    """Distinct random lowercase words (min(3, L)..L letters) in rank order, Zipf weights."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        size = int(rng.integers(min(3, max_bytes), max_bytes + 1))
        words["".join(rng.choice(letters, size))] = None
    weights = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF_S
    return list(words), weights / weights.sum()


def scores(found: list[str], truth: list[str]) -> tuple[float, float]:
    """(recall, precision) of the top 20 (module docstring)."""
    top = set(truth[:TOP])
    recall = len(top & set(found)) / TOP
    head = found[:TOP]
    precision = len(top & set(head)) / len(head) if head else 1.0
    return recall, precision


def run_fedldp(
    epsilon: str, n: int, runs: int, device_reports: int, seed: int, max_bytes: int = MAX_BYTES
) -> dict[str, Any]:
    words, weights = vocabulary(seed, max_bytes)
    mech = PEM(Decimal(epsilon), OpenDomain(max_bytes))
    table = mech.encode_batch(words)
    recalls, precisions, analysis, found_counts = [], [], [], []
    cpu: dict[str, list[float]] = {"discover": [], "reference": []}
    import scipy.stats  # noqa: F401  # discover's threshold imports it once (≈ 1 s): not timed

    for r in range(runs):
        rng = np.random.default_rng([seed, r])
        reports = mech.perturb_batch(table[rng.choice(VOCABULARY, size=n, p=weights)], rng)
        start = time.perf_counter()
        stat = mech.new_statistic()
        mech.accumulate_batch(stat, reports)
        started = time.process_time()
        found = discover(mech, stat)
        cpu["discover"].append(time.process_time() - started)
        analysis.append(time.perf_counter() - start)
        started = time.process_time()
        discover(mech, stat, reference=True)  # the same result (tests/aggregator/test_discovery.py)
        cpu["reference"].append(time.process_time() - started)
        recall, precision = scores(list(found.strings), words)
        recalls.append(recall)
        precisions.append(precision)
        found_counts.append(len(found.strings))
    sample = random.Random(seed).choices(words, weights=weights.tolist(), k=device_reports)
    device = []
    for _ in range(runs):
        start = time.perf_counter()
        for word in sample:
            mech.perturb(word)
        device.append((time.perf_counter() - start) / device_reports * 1e6)
    return {
        "epsilon": epsilon,
        "n": n,
        "max_bytes": max_bytes,
        "groups": mech.groups,
        "g": mech.g,
        "recall": summarize(recalls),
        "precision": summarize(precisions),
        "found": summarize(found_counts),
        "device_us": summarize(device),
        "analysis_s": summarize(analysis),
        "discover_cpu_s": summarize(cpu["discover"]),
        "reference_discover_cpu_s": summarize(cpu["reference"]),
    }


#: Runs in the peer's interpreter: pure-ldp's PEM on the same words; prints one JSON line.
PEER_SCRIPT = r"""
import json, sys, time
import numpy as np
args = json.loads(sys.stdin.read())
from pure_ldp.heavy_hitters.prefix_extending import PEMClient, PEMServer
words, weights = args["words"], np.array(args["weights"])
rng = np.random.default_rng(args["seed"])
size = args["max_bytes"]
def bits(word):
    return "".join(f"{b:08b}" for b in word.encode().ljust(size, b"\0"))
def text(bitstring):
    return int(bitstring, 2).to_bytes(size, "big").rstrip(b"\0").decode("utf-8", "replace")
data = [bits(words[i]) for i in rng.choice(len(words), size=args["n"], p=weights)]
eps = float(args["epsilon"])
kw = dict(epsilon=eps, start_length=args["start_bits"], max_string_length=8 * size,
          fragment_length=args["step_bits"])
client, server = PEMClient(**kw), PEMServer(**kw)
t0 = time.perf_counter()
reports = [client.privatise(word) for word in data]
t1 = time.perf_counter()
for report in reports:
    server.aggregate(report)
found, _ = server.find_heavy_hitters(k=args["top"])
t2 = time.perf_counter()
print(json.dumps({"found": [text(f) for f in found], "device_us": (t1 - t0) / len(data) * 1e6,
                  "analysis_s": t2 - t1}))
"""


def run_peer(
    python: str, epsilon: str, n: int, seed: int, max_bytes: int, timeout: float
) -> dict[str, Any]:
    """pure-ldp's PEM in its own interpreter; {"skipped": why} when it cannot run."""
    if not Path(python).exists():
        return {"skipped": f"no peer interpreter at {python} (pure-ldp is optional)"}
    words, weights = vocabulary(seed, max_bytes)
    args = {
        "words": words,
        "weights": weights.tolist(),
        "seed": seed,
        "n": n,
        "epsilon": epsilon,
        "max_bytes": max_bytes,
        "start_bits": 4,
        "step_bits": 4,
        "top": TOP,
    }
    try:
        done = subprocess.run(
            [python, "-c", PEER_SCRIPT],
            input=json.dumps(args),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"pure-ldp did not finish within {timeout:.0f} s"}
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"skipped": f"pure-ldp failed: {last}"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    recall, precision = scores(result["found"], words)
    return {**result, "recall": recall, "precision": precision, "n": n, "max_bytes": max_bytes}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="n = 1e5, eps 4 and 8, 1 run")
    parser.add_argument("--n", type=int, default=None, help="users (default 1e6; quick 1e5)")
    parser.add_argument("--epsilons", default=None, help="comma-separated (default 2,4,8)")
    parser.add_argument("--runs", type=int, default=None, help="runs per figure (default 5)")
    parser.add_argument("--device-reports", type=int, default=2000)
    parser.add_argument("--peer-python", default=DEFAULT_PEER_PYTHON)
    parser.add_argument("--peer-n", type=int, default=2_000, help="users for the peer")
    parser.add_argument("--peer-timeout", type=float, default=600.0, help="seconds per peer run")
    parser.add_argument(
        "--peer-bytes",
        type=int,
        default=3,
        help="string length of the side-by-side run (pure-ldp allocates 2^(8L) cells)",
    )
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--no-stored", action="store_true", help="skip the stored-form figures")
    parser.add_argument("--commit-size", type=int, default=100, help="reports per commit")
    parser.add_argument(
        "--commit-windows",
        default=None,
        help="window sizes N of the commit figure (default 1000,10000,100000,1000000; quick "
        "1000,10000)",
    )
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    n = args.n or (100_000 if args.quick else 1_000_000)
    runs = args.runs or (1 if args.quick else 5)
    epsilons = (args.epsilons or ("4,8" if args.quick else "2,4,8")).split(",")
    rows: list[list[str]] = []
    figures: list[dict[str, Any]] = []
    if not args.no_stored:
        windows = args.commit_windows or (
            "1000,10000" if args.quick else "1000,10000,100000,1000000"
        )
        figures.append({"commit": _commit_figure(epsilons[0], windows, runs, args)})
        stored_rows = [_stored_row(eps, n, runs, args, figures) for eps in epsilons]
        print(format_table(STORED_HEADERS, stored_rows))
    for eps in epsilons:
        ours = run_fedldp(eps, n, runs, args.device_reports, args.seed)
        figures.append({"fedldp": ours})
        rows.append(_row(f"fedldp pem, L={MAX_BYTES}", eps, ours))
        if args.no_peer:
            continue
        side = run_fedldp(eps, args.peer_n, runs, args.device_reports, args.seed, args.peer_bytes)
        peer = run_peer(
            args.peer_python, eps, args.peer_n, args.seed, args.peer_bytes, args.peer_timeout
        )
        figures.append({"fedldp (peer setting)": side, "pure-ldp": peer})
        rows.append(_row(f"fedldp pem, L={args.peer_bytes}", eps, side))
        if "skipped" in peer:
            rows.append([f"pure-ldp PEM, L={args.peer_bytes}", eps, *"----", peer["skipped"], "-"])
        else:
            rows.append(
                [
                    f"pure-ldp PEM, L={args.peer_bytes}",
                    eps,
                    f"{peer['n']:,}",
                    f"{peer['recall']:.2f}",
                    f"{peer['precision']:.2f}",
                    f"{peer['device_us']:.0f}",
                    f"{peer['analysis_s']:.2f}",
                    "-",
                ]
            )
        print(rows[-3:], file=sys.stderr)
    headers = [
        "library",
        "ε",
        "n",
        "recall@20",
        "precision@20",
        "device µs/report",
        "analysis s",
        "discover CPU s (reference)",
    ]
    print(format_table(headers, rows))
    print(f"runs {runs}; Zipf({ZIPF_S}) over {VOCABULARY:,} words; seed {args.seed}")
    if args.json is not None:
        params = {
            "n": n,
            "epsilons": epsilons,
            "runs": runs,
            "peer_n": args.peer_n,
            "peer_bytes": args.peer_bytes,
        }
        write_json(
            args.json, benchmark="heavy_hitters", params=params, figures=figures, packages=PACKAGES
        )


STORED_HEADERS = [
    "ε",
    "n",
    "analysis from the ledger: chunks, wall s (CPU s)",
    "JSON row (before 0008), wall s (CPU s)",
    "JSON ÷ chunks (CPU)",
]


def _stored_row(eps: str, n: int, runs: int, args: Any, figures: list[Any]) -> list[str]:
    """The analysis-from-the-ledger figure at ε (module docstring), as a table row."""
    words, weights = vocabulary(args.seed)
    mech = PEM(Decimal(eps), OpenDomain(MAX_BYTES))
    rng = np.random.default_rng([args.seed, 0])
    reports = mech.perturb_batch(
        mech.encode_batch(words)[rng.choice(VOCABULARY, size=n, p=weights)], rng
    )
    import scipy.stats  # noqa: F401  # discover's threshold imports it once (≈ 1 s): not timed

    fig = pem_storage.stored_analysis(mech, reports, runs, commit=args.commit_size)
    figures.append({"stored": {"epsilon": eps, **fig}})
    ratio = fig["json_cpu_s"].median / fig["chunks_cpu_s"].median
    return [
        eps,
        f"{n:,}",
        f"{fig['chunks_wall_s'].median:.2f} ({fig['chunks_cpu_s'].median:.2f})",
        f"{fig['json_wall_s'].median:.2f} ({fig['json_cpu_s'].median:.2f})",
        f"{ratio:.1f}",
    ]


def _commit_figure(eps: str, windows: str, runs: int, args: Any) -> list[dict[str, Any]]:
    """The commit-cost figure (module docstring), printed as a table."""
    sizes = [int(w) for w in windows.split(",")]
    found = pem_storage.commit_cost(
        pem_storage.bench_policy(eps), sizes, runs, args.seed, commit=args.commit_size
    )
    table = [
        [f"{r['window_reports']:,}", _spread(r["chunks_cpu_ms"]), _spread(r["json_cpu_ms"])]
        for r in found
    ]
    headers = [
        "window holds",
        f"commit of {args.commit_size}, chunks: CPU ms",
        "JSON row rewritten (before 0008): CPU ms",
    ]
    print(format_table(headers, table))
    return found


def _spread(t: Any) -> str:
    """median (min-max), one decimal."""
    return f"{t.median:.1f} ({t.min:.1f}-{t.max:.1f})"


def _row(name: str, eps: str, ours: dict[str, Any]) -> list[str]:
    recall = ours["recall"]
    return [
        name,
        eps,
        f"{ours['n']:,}",
        f"{recall.median:.2f} ({recall.min:.2f}-{recall.max:.2f})",
        f"{ours['precision'].median:.2f}",
        f"{ours['device_us'].median:.0f}",
        f"{ours['analysis_s'].median:.2f}",
        f"{ours['discover_cpu_s'].median:.2f} ({ours['reference_discover_cpu_s'].median:.2f})"
        if "discover_cpu_s" in ours
        else "-",
    ]


if __name__ == "__main__":
    main()
