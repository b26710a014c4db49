"""Benchmark of the sketches (CMS, HCMS) over an open domain, beside pure-ldp's.

    python -m bench.sketches                 # n = 1,000,000, eps in {2, 4, 8}
    python -m bench.sketches --quick         # n = 100,000, eps in {4}, < 1 minute
    python -m bench.sketches --json out.json
    python -m bench.sketches --curve         # top-20 recall over m, and at the auto size
    python -m bench.sketches --curve --quick

Data: n users' strings drawn (fixed seed) from Zipf(1.1) over a dictionary of
--domain strings ("word-00000", ...); the analyst's candidates are the whole
dictionary. Sketch size: the policy defaults (rows k = 64, columns m = 1024) unless
--rows/--columns. Per (mechanism, eps):

* top-20 recall and precision: the reported set is the 20 candidates with the
  largest estimates whose 95% interval lies above 0 (at most 20); recall = |reported ∩
  true top 20| / 20, precision = |reported ∩ true top 20| / |reported|;
* MSE / exact variance: the mean squared error of the count estimates over all
  candidates divided by the mean exact variance at the truth (collision term
  included; 1.0 = as theory predicts);
* device, µs per report: `perturb(value)` with the OS CSPRNG (the device path), the
  median over --runs runs of 2,000 calls;
* analysis, s: from the n batch outputs to the candidate estimates
  (`accumulate_batch` + `estimate_candidates` over the dictionary), median over
  --analysis-runs runs; simulation, s: `perturb_batch` over the n values (once).

pure-ldp (its `apple_cms` CMSClient/CMSServer, same k, m, eps and data) runs a Python
loop per report, so it is measured on the first --peer-n users, and fedldp is measured
on the same users beside it; its timings are per report and per analysis at that n.
pure-ldp 1.2.0's CMSServer calls numpy.zeros(None), which current numpy refuses; the
benchmark patches that one call (pure_ldp.core._freq_oracle_server) and says so.
Its hash family is xxhash (`pure_ldp.core.generate_hash`), seeded per row; the
installed xxhash version is recorded in the JSON. Without pure-ldp the benchmark
runs and prints why the peer rows are missing.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import types
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.client.mechanisms import OpenDomain, create
from fedldp.client.mechanisms.sketch import DEFAULT_COLUMNS, DEFAULT_ROWS, Sketch

from bench._common import Timing, fmt_float, format_table, summarize, time_runs, write_json

PACKAGES = ["numpy", "pure-ldp", "xxhash", "fedldp"]
TOP = 20
#: z of the 95% intervals that decide whether a top candidate is reported.
Z95 = 1.959963984540054


@dataclass
class Row:
    """One (library, mechanism, eps, n) measurement."""

    library: str
    mechanism: str
    epsilon: str
    n: int
    recall: float
    precision: float
    mse_ratio: float | None
    device_us: Timing | None
    analysis_s: Timing | None
    simulate_s: float | None = None
    notes: list[str] = field(default_factory=list)


def dictionary(size: int) -> list[str]:
    """The candidate strings, most frequent first in the Zipf law."""
    return [f"word-{i:05d}" for i in range(size)]


def population(size: int, n: int, seed: int) -> np.ndarray:
    """n indices into the dictionary from Zipf(1.1) (fixed seed)."""
    weights = 1.0 / np.arange(1, size + 1) ** 1.1
    return np.random.default_rng(seed).choice(size, size=n, p=weights / weights.sum())


def top_scores(
    estimates: np.ndarray, std_errors: np.ndarray | None, truth: np.ndarray
) -> tuple[float, float]:
    """(recall, precision) of the reported top 20 (module docstring)."""
    order = np.argsort(-estimates)[:TOP]
    if std_errors is not None:
        order = order[estimates[order] - Z95 * std_errors[order] > 0]
    true_top = set(np.argsort(-truth)[:TOP].tolist())
    hits = len(true_top & set(order.tolist()))
    return hits / TOP, (hits / len(order) if len(order) else 0.0)


def device_timing(mech: Sketch, words: list[str], runs: int) -> Timing:
    """µs per `perturb` on the OS CSPRNG, 2,000 calls per run."""
    sample = [words[i % len(words)] for i in range(2000)]
    timing, _ = time_runs(lambda: [mech.perturb(w) for w in sample], runs)
    return timing.scaled(1e6 / len(sample))


def fedldp_row(
    wire_id: str,
    epsilon: str,
    words: list[str],
    indices: np.ndarray,
    args: argparse.Namespace,
    *,
    timings: bool,
) -> Row:
    mech = create(
        wire_id,
        Decimal(epsilon),
        OpenDomain(64),
        {"rows": str(args.rows), "columns": str(args.columns)},
    )
    assert isinstance(mech, Sketch)
    values = np.array(words, dtype=object)[indices]
    start = time.perf_counter()
    outputs = mech.perturb_batch(values, np.random.default_rng(args.seed + 1))
    simulate = time.perf_counter() - start

    def analyse() -> Any:
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, outputs)
        return mech.estimate_candidates(statistic, words)

    analysis, results = time_runs(analyse, args.analysis_runs if timings else 1)
    estimate = results[0]
    n = indices.shape[0]
    counts = np.bincount(indices, minlength=len(words)).astype(np.float64)
    pairs = float((counts * (counts - 1)).sum())
    exact = mech.count_variance(n, counts, pairs - counts * (counts - 1))
    mse = float(np.mean((estimate.values * n - counts) ** 2))
    recall, precision = top_scores(estimate.values, np.sqrt(estimate.variances), counts)
    return Row(
        "fedldp",
        wire_id,
        epsilon,
        n,
        recall,
        precision,
        mse / float(np.mean(exact)),
        device_timing(mech, words, args.runs) if timings else None,
        analysis,
        simulate,
    )


@dataclass
class CurvePoint:
    """Top-20 recall of one (mechanism, ε, k, m) over --curve-runs simulated runs."""

    mechanism: str
    epsilon: str
    n: int
    rows: int
    columns: int
    auto: bool
    recall: Timing
    collision_ratio: float


def simulated_statistic(mech: Sketch, table: np.ndarray, indices: np.ndarray, seed: int) -> Any:
    """The sketch statistic of n reports (one per user) drawn from the mechanism's law.

    CMS: each report's row is uniform and each of its m bits is set independently
    (the true cell w.p. p, any other w.p. q), so a cell's count is Binomial(X, p) +
    Binomial(R_j - X, q), X the row's reports hashing there and R_j the row's
    reports: exactly the law `accumulate_batch` of `perturb_batch` has, without
    drawing n·m bits. HCMS: `perturb_batch` and `accumulate_batch` themselves.
    """
    from fedldp.client.mechanisms.sketch import SketchStatistic

    rng = np.random.default_rng(seed)
    if mech.wire_id == "hcms":
        statistic = mech.new_statistic()
        words = np.array([f"word-{i:05d}" for i in range(table.shape[0])], dtype=object)
        mech.accumulate_batch(statistic, mech.perturb_batch(words[indices], rng))
        return statistic
    assert hasattr(mech, "p") and hasattr(mech, "q")
    rows = rng.integers(0, mech.k, size=indices.shape[0])
    cells = table[indices, rows]
    x = np.bincount(rows * mech.m + cells, minlength=mech.k * mech.m).reshape(mech.k, mech.m)
    per_row = np.bincount(rows, minlength=mech.k)
    counts = rng.binomial(x, mech.p) + rng.binomial(per_row[:, None] - x, mech.q)
    return SketchStatistic(
        counts=counts.reshape(-1).tolist(),
        row_reports=per_row.tolist(),
        n=int(indices.shape[0]),
    )


def curve_point(
    wire_id: str,
    epsilon: str,
    size: tuple[int, int],
    words: list[str],
    indices: np.ndarray,
    args: argparse.Namespace,
    *,
    auto: bool,
) -> CurvePoint:
    """Top-20 recall at one sketch size: median, min and max over --curve-runs runs."""
    rows, columns = size
    mech = create(
        wire_id, Decimal(epsilon), OpenDomain(64), {"rows": str(rows), "columns": str(columns)}
    )
    assert isinstance(mech, Sketch)
    table = mech.hash_table(words)
    truth = np.bincount(indices, minlength=len(words)).astype(np.float64)
    recalls = []
    for run in range(args.curve_runs):
        statistic = simulated_statistic(mech, table, indices, args.seed + 100 + run)
        estimate = mech.estimate_candidates(statistic, words)
        recalls.append(top_scores(estimate.values, np.sqrt(estimate.variances), truth)[0])
    n = indices.shape[0]
    pairs = float((truth * (truth - 1)).sum())
    scale = columns / (columns - 1)
    noise = scale**2 * float(mech.noise_count_variance(n, 0))
    collision = float(mech.collision_count_variance(n, 0, pairs))
    return CurvePoint(
        wire_id, epsilon, n, rows, columns, auto, summarize(recalls), collision / noise
    )


def recall_curve(
    words: list[str], indices: np.ndarray, args: argparse.Namespace
) -> list[CurvePoint]:
    """Recall over m (k = --rows) per (mechanism, ε), and at the `auto` size authoring
    chooses for this n and ε with the data's own Σf² (authoring/sizing.py)."""
    from fedldp.authoring.sizing import auto_size

    counts = np.bincount(indices, minlength=len(words)).astype(np.float64)
    same = Decimal(str(round(float((counts * (counts - 1)).sum()) / len(indices) ** 2, 6)))
    out = []
    for wire_id in ("cms", "hcms"):
        for eps in [e.strip() for e in args.epsilons.split(",") if e.strip()]:
            for m in args.curve_columns:
                if args.rows * m <= 1 << 20:
                    out.append(
                        curve_point(wire_id, eps, (args.rows, m), words, indices, args, auto=False)
                    )
            size = auto_size(
                wire_id,
                Decimal(eps),
                OpenDomain(64),
                expected_reports=len(indices),
                same_string=same,
            )
            out.append(
                curve_point(
                    wire_id, eps, (size.rows, size.columns), words, indices, args, auto=True
                )
            )
    return out


def _patch_pure_ldp() -> None:
    """pure-ldp 1.2.0 builds np.zeros(None) in FreqOracleServer; current numpy refuses it."""
    import pure_ldp.core._freq_oracle_server as server

    server.np = types.SimpleNamespace(zeros=lambda d: np.zeros(0 if d is None else d))


def peer_row(
    wire_id: str, epsilon: str, words: list[str], indices: np.ndarray, args: argparse.Namespace
) -> Row:
    """pure-ldp's apple_cms on the same users (module docstring)."""
    from pure_ldp.frequency_oracles.apple_cms import CMSClient, CMSServer

    random.seed(args.seed)
    np.random.seed(args.seed)
    hadamard = wire_id == "hcms"
    server = CMSServer(float(epsilon), args.rows, args.columns, is_hadamard=hadamard)
    client = CMSClient(float(epsilon), server.get_hash_funcs(), args.columns, is_hadamard=hadamard)
    values = [words[i] for i in indices.tolist()]
    start = time.perf_counter()
    reports = [client.privatise(v) for v in values]
    device = (time.perf_counter() - start) / len(values)

    def analyse() -> np.ndarray:
        server.reset()
        for report in reports:
            server.aggregate(report)
        return np.array([server.estimate(w, suppress_warnings=True) for w in words])

    analysis, results = time_runs(analyse, 1)
    counts = np.bincount(indices, minlength=len(words)).astype(np.float64)
    recall, precision = top_scores(results[0], None, counts)
    row = Row(
        "pure-ldp",
        wire_id,
        epsilon,
        len(values),
        recall,
        precision,
        None,
        Timing(device * 1e6, device * 1e6, device * 1e6, 1),
        analysis,
        notes=["top 20 by estimate (no intervals)", "one run"],
    )
    return row


def peers_available() -> str | None:
    """None when pure-ldp imports (patched), else why not."""
    try:
        _patch_pure_ldp()
        from pure_ldp.frequency_oracles.apple_cms import CMSServer

        CMSServer(1.0, 2, 16)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="users (one report each)")
    parser.add_argument("--domain", type=int, default=10_000, help="dictionary size")
    parser.add_argument("--epsilons", default="2,4,8", help="comma-separated epsilons")
    parser.add_argument("--rows", type=int, default=DEFAULT_ROWS, help="sketch rows k")
    parser.add_argument("--columns", type=int, default=DEFAULT_COLUMNS, help="sketch columns m")
    parser.add_argument("--runs", type=int, default=5, help="repeats of the device timing")
    parser.add_argument(
        "--analysis-runs", type=int, default=3, help="repeats of the analysis timing"
    )
    parser.add_argument("--peer-n", type=int, default=50_000, help="users the peer runs on")
    parser.add_argument("--no-peers", action="store_true", help="skip pure-ldp")
    parser.add_argument("--seed", type=int, default=20261201, help="data and simulation seed")
    parser.add_argument(
        "--curve", action="store_true", help="only the recall curve over m (and the auto size)"
    )
    parser.add_argument(
        "--curve-columns",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[256, 1024, 4096, 16384],
        help="columns m of the recall curve (k = --rows)",
    )
    parser.add_argument("--curve-runs", type=int, default=5, help="simulated runs per point")
    parser.add_argument("--quick", action="store_true", help="n = 100,000, eps 4, < 1 minute")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.epsilons, args.peer_n = 100_000, "4", 5_000
        args.runs, args.analysis_runs = 3, 1
        if args.curve:
            args.domain, args.curve_columns = 2_000, [256, 1024, 4096]
    return args


def _write(args: argparse.Namespace, benchmark: str, figures: list[dict[str, Any]]) -> None:
    """Every figure, with the parameters, to --json (when given)."""
    if args.json is not None:
        write_json(
            args.json,
            benchmark=benchmark,
            params={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            figures=figures,
            packages=PACKAGES,
        )


def print_curve(points: list[CurvePoint], args: argparse.Namespace) -> None:
    """The recall curve as a table (and its JSON with --json)."""
    headers = [
        "mech",
        "ε",
        "n",
        "k",
        "m",
        "size",
        "top-20 recall (median [min, max])",
        "collision/noise",
    ]
    table = [
        [
            p.mechanism,
            p.epsilon,
            f"{p.n:,}",
            str(p.rows),
            f"{p.columns:,}",
            "auto" if p.auto else "",
            f"{p.recall.median:.2f} [{p.recall.min:.2f}, {p.recall.max:.2f}]",
            f"{p.collision_ratio:.2f}",
        ]
        for p in points
    ]
    print(
        f"top-20 recall over m, {args.curve_runs} simulated runs per point, dictionary "
        f"{args.domain} strings, Zipf(1.1)"
    )
    print(format_table(headers, table))
    _write(
        args, "sketches-recall-curve", [{**p.__dict__, "recall": p.recall.__dict__} for p in points]
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    words = dictionary(args.domain)
    indices = population(args.domain, args.n, args.seed)
    if args.curve:
        print_curve(recall_curve(words, indices, args), args)
        return
    epsilons = [e.strip() for e in args.epsilons.split(",") if e.strip()]
    peer_problem = "--no-peers" if args.no_peers else peers_available()
    if peer_problem is not None:
        print(f"pure-ldp rows skipped: {peer_problem}", file=sys.stderr)
    rows: list[Row] = []
    for wire_id in ("cms", "hcms"):
        for eps in epsilons:
            rows.append(fedldp_row(wire_id, eps, words, indices, args, timings=True))
            if peer_problem is None:
                head = indices[: args.peer_n]
                rows.append(fedldp_row(wire_id, eps, words, head, args, timings=False))
                rows.append(peer_row(wire_id, eps, words, head, args))
    headers = [
        "library",
        "mech",
        "ε",
        "n",
        "top-20 recall",
        "precision",
        "MSE/var",
        "device µs/report",
        "analysis s",
        "simulate s",
    ]
    table = [
        [
            r.library,
            r.mechanism,
            r.epsilon,
            f"{r.n:,}",
            f"{r.recall:.2f}",
            f"{r.precision:.2f}",
            fmt_float(r.mse_ratio),
            "-" if r.device_us is None else f"{r.device_us.median:.1f}",
            "-" if r.analysis_s is None else f"{r.analysis_s.median:.2f}",
            fmt_float(r.simulate_s),
        ]
        for r in rows
    ]
    print(f"k = {args.rows} rows, m = {args.columns} columns, dictionary {args.domain} strings")
    print(format_table(headers, table))
    _write(args, "sketches", [r.__dict__ for r in rows])


if __name__ == "__main__":
    main()
