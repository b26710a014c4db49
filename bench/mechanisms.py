"""Benchmark of the mechanism suite against pure-ldp, multi-freq-ldpy and plain numpy.

    python -m bench.mechanisms            # k in {16, 256, 4096}, eps in {0.5, 1, 2, 4}, n = 1e6
    python -m bench.mechanisms --quick    # k in {16, 4096}, eps in {1, 4}, n = 1e5 (< 1 minute)
    python -m bench.mechanisms --json out.json

Per (mechanism, k, eps), over Zipf(1.1) values on [0, k) (numeric mechanisms: 100 * Beta(2, 5)
on [0, 100]):

* batch perturbation, reports/s: `perturb_batch` on all n values (numpy generator);
* single-value perturb, microseconds: `perturb(value)` with the OS CSPRNG (the device path);
* estimation, seconds: from the n raw batch outputs to the estimate (`accumulate_batch` +
  `estimate`), i.e. what the aggregator does;
* MSE / exact variance: empirical MSE of the estimates over runs and coordinates divided by the
  mean closed-form variance at the true frequencies (1.0 = as theory predicts); the 95% band of
  that ratio from sampling alone is printed with it;
* top-10 max abs error: the largest absolute error over the 10 most frequent values (median
  over runs).

Timings are medians over --runs runs (min and max in the JSON). Peers run per-value Python
loops, so they are measured on --peer-n values (estimation on --peer-est-n reports) and their
estimation time is extrapolated linearly to n (their cost is linear in n); the table marks
extrapolated figures with "~". "numpy" is plain vectorized numpy doing the same arithmetic the
textbook way (one uniform draw per bit for unary encodings, O(n k) hashing for OLH estimation).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.mechanisms.olh import OLH
from fedldp.client.mechanisms.oracle import FrequencyOracle

from bench._common import (
    Timing,
    fmt_float,
    fmt_rate,
    format_table,
    summarize,
    time_runs,
    write_json,
)

FREQUENCY = ["grr", "oue", "sue", "olh", "hr", "ss"]
NUMERIC = ["duchi", "piecewise", "hybrid"]  # on their default grids (levels, cells)
PACKAGES = ["numpy", "pure-ldp", "multi-freq-ldpy", "xxhash", "fedldp"]
NUMERIC_RANGE = (Decimal(0), Decimal(100))


@dataclass
class Row:
    """One line of the table: one library's figures for one setting."""

    mechanism: str
    library: str
    k: int | None
    epsilon: str
    n: int
    batch_rate: Timing | None = None
    single_us: Timing | None = None
    estimation_s: Timing | None = None
    estimation_extrapolated: bool = False
    mse_ratio: float | None = None
    mse_band: tuple[float, float] | None = None
    top10_max_abs: float | None = None
    notes: list[str] = field(default_factory=list)


def zipf_values(k: int, n: int, seed: int) -> np.ndarray:
    """n draws of Zipf(1.1) truncated to [0, k): P[i] ∝ (i + 1)^-1.1."""
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    return np.random.default_rng(seed).choice(k, size=n, p=weights / weights.sum())


def mse_band(samples: int) -> tuple[float, float]:
    """Approximate 95% band of MSE/Var from `samples` squared errors alone."""
    half = 1.96 * math.sqrt(2.0 / max(1, samples))
    return (1.0 - half, 1.0 + half)


# --- fedldp -------------------------------------------------------------------------------


def _slice(outputs: Any, start: int, stop: int) -> Any:
    if isinstance(outputs, tuple):
        return tuple(x[start:stop] for x in outputs)
    return outputs[start:stop]


def bench_frequency(
    wire_id: str,
    k: int,
    eps: Decimal,
    values: np.ndarray,
    runs: int,
    single_calls: int,
    seed: int,
) -> Row:
    """Timed on all n values per run; accuracy pooled over blocks of users per run.

    Each run's reports are also split into B = ceil(1000 / k) blocks of users; every
    block is estimated on its own (and the blocks' statistics merged give the
    full-n estimate), so MSE/Var pools about 1000 x runs squared errors whatever k.
    """
    mech = create(wire_id, eps, k)
    assert isinstance(mech, FrequencyOracle)
    n = values.shape[0]
    truth = np.bincount(values, minlength=k) / n
    top = np.argsort(-truth)[:10]
    blocks = max(1, math.ceil(1000 / k))
    edges = [int(x) for x in np.linspace(0, n, blocks + 1)]
    spans = list(itertools.pairwise(edges))
    block_truth = [np.bincount(values[a:b], minlength=k) / (b - a) for a, b in spans]
    block_var = [mech.variance(b - a, f) for (a, b), f in zip(spans, block_truth, strict=True)]
    rng = np.random.default_rng(seed)
    perturb_s, estimate_s, ratios, top_errors = [], [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = mech.perturb_batch(values, rng)
        middle = time.perf_counter()
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, outputs)
        mech.estimate(statistic)
        end = time.perf_counter()
        perturb_s.append(middle - start)
        estimate_s.append(end - middle)
        merged = mech.new_statistic()
        sq_error, variance = 0.0, 0.0
        for (a, b), f, var in zip(spans, block_truth, block_var, strict=True):
            part = mech.new_statistic()
            mech.accumulate_batch(part, _slice(outputs, a, b))
            sq_error += float(np.sum((mech.estimate(part).values - f) ** 2))
            variance += float(np.sum(var))
            merged.merge(part)
        ratios.append(sq_error / variance)
        full = mech.estimate(merged).values  # additive statistics: the merge is the full one
        top_errors.append(float(np.abs(full - truth)[top].max()))
        del outputs
    row = Row(wire_id, "fedldp", k, str(eps), n)
    row.batch_rate = summarize(perturb_s).rate(n)
    row.estimation_s = summarize(estimate_s)
    row.mse_ratio = float(np.mean(ratios))
    row.mse_band = mse_band(runs * blocks * k)
    row.top10_max_abs = float(np.median(top_errors))
    row.single_us = single_perturb_us(mech, [int(v) for v in values[:single_calls]], runs)
    row.notes.append(f"MSE/Var over {blocks} block(s) of users per run")
    if isinstance(mech, OLH):
        row.notes.append(f"g={mech.g}")
    return row


def single_perturb_us(mech: Any, values: Sequence[Any], runs: int) -> Timing:
    """Microseconds per `perturb(value)` with the OS CSPRNG (rng=None)."""

    def loop() -> None:
        for value in values:
            mech.perturb(value)

    timing, _ = time_runs(loop, runs)
    return timing.scaled(1e6 / len(values))


def bench_numeric(
    wire_id: str,
    eps: Decimal,
    values: np.ndarray,
    runs: int,
    single_calls: int,
    seed: int,
    blocks: int = 1000,
) -> Row:
    mech = create(wire_id, eps, NUMERIC_RANGE)
    assert isinstance(mech, NumericMechanism)
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    size = n // blocks
    block_values = values[: size * blocks].reshape(blocks, size)
    block_truth = block_values.mean(axis=1)
    block_var = np.array([mech.variance(b) for b in block_values])
    perturb_s, estimate_s, ratios, errors = [], [], [], []
    for _ in range(runs):
        start = time.perf_counter()
        outputs = mech.perturb_batch(values, rng)
        middle = time.perf_counter()
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, outputs)
        estimate = mech.estimate(statistic)
        end = time.perf_counter()
        perturb_s.append(middle - start)
        estimate_s.append(end - middle)
        errors.append(abs(float(estimate.values[0]) - float(values.mean())))
        # Accuracy from `blocks` independent groups of users within the run.
        block_est = mech._lo + mech.scale * (
            outputs[: size * blocks].reshape(blocks, size).mean(axis=1) + 1
        )
        ratios.append(np.mean((block_est - block_truth) ** 2) / np.mean(block_var))
    row = Row(wire_id, "fedldp", None, str(eps), n)
    row.batch_rate = summarize(perturb_s).rate(n)
    row.estimation_s = summarize(estimate_s)
    row.mse_ratio = float(np.mean(ratios))
    row.mse_band = mse_band(blocks * runs)
    row.top10_max_abs = float(np.median(errors))
    row.single_us = single_perturb_us(mech, [float(v) for v in values[:single_calls]], runs)
    row.notes.append("error column: |mean error|")
    row.notes.append(f"grid: {mech.levels} levels, {len(mech.table)} wire values")
    return row


# --- plain numpy references ----------------------------------------------------------------


def numpy_reference(
    wire_id: str,
    k: int,
    eps: Decimal,
    values: np.ndarray,
    runs: int,
    seed: int,
    est_n: int,
    ue_n: int,
) -> Row | None:
    """The same arithmetic written the textbook numpy way."""
    e = math.exp(float(eps))
    rng = np.random.default_rng(seed)
    n = values.shape[0]
    row = Row(wire_id, "numpy", k, str(eps), n)
    if wire_id == "grr":
        p = e / (e + k - 1)

        def perturb() -> np.ndarray:
            keep = rng.random(n) < p
            other = rng.integers(0, k - 1, size=n)
            other += other >= values
            return np.where(keep, values, other)

        timing, outs = time_runs(perturb, runs)
        row.batch_rate = timing.rate(n)
        row.estimation_s, _ = time_runs(lambda: np.bincount(outs[-1], minlength=k), runs)
        return row
    if wire_id in ("oue", "sue"):
        if wire_id == "oue":
            p, q = 0.5, 1 / (e + 1)
        else:
            h = math.exp(float(eps) / 2)
            p, q = h / (h + 1), 1 / (h + 1)
        m = min(n, ue_n)  # a slice: one uniform draw per bit is slow

        def perturb_ue() -> np.ndarray:
            v = values[:m]
            bits = rng.random((m, k)) < q
            bits[np.arange(m), v] = rng.random(m) < p
            return np.packbits(bits, axis=1, bitorder="little")

        timing, outs = time_runs(perturb_ue, runs)
        row.batch_rate = timing.rate(m)
        est, _ = time_runs(
            lambda: np.unpackbits(outs[-1], axis=1, bitorder="little")[:, :k].sum(axis=0), runs
        )
        row.estimation_s = est.scaled(n / m)
        row.estimation_extrapolated = m < n
        row.notes.append(f"measured on {m} reports")
        return row
    if wire_id == "olh":
        mech = OLH(eps, k)
        timing, outs = time_runs(lambda: mech.perturb_batch(values, rng), runs)
        row.batch_rate = timing.rate(n)
        seeds, ys = outs[-1]
        m = min(n, est_n)
        est, _ = time_runs(lambda: mech._support_direct(seeds[:m], ys[:m]), runs)
        row.estimation_s = est.scaled(n / m)
        row.estimation_extrapolated = m < n
        row.notes.append(f"O(n k) estimation on {m} reports")
        return row
    return None


# --- peers -----------------------------------------------------------------------------------


def _privatise(client: Any, value: int) -> Any:
    return client.privatise(value + 1)  # pure-ldp's default index mapper is x - 1


def _peer_row(
    wire_id: str,
    library: str,
    k: int,
    eps: Decimal,
    n: int,
    values: np.ndarray,
    client: Callable[[int], Any],
    aggregate: Callable[[list[Any]], np.ndarray],
    runs: int,
    est_n: int,
    variance: Callable[[int, np.ndarray], np.ndarray],
) -> Row:
    row = Row(wire_id, library, k, str(eps), n)
    peer_values = [int(v) for v in values]
    timing, outs = time_runs(lambda: [client(v) for v in peer_values], runs)
    row.batch_rate = timing.rate(len(peer_values))
    row.single_us = timing.scaled(1e6 / len(peer_values))
    reports = outs[-1][:est_n]
    est_timing, estimates = time_runs(lambda: aggregate(reports), runs)
    row.estimation_s = est_timing.scaled(n / len(reports))
    row.estimation_extrapolated = len(reports) < n
    truth = np.bincount(values[: len(reports)], minlength=k) / len(reports)
    errors = [np.asarray(est, dtype=float) - truth for est in estimates[:1]]
    row.mse_ratio = float(np.mean(errors[0] ** 2) / np.mean(variance(len(reports), truth)))
    row.mse_band = mse_band(k)
    top = np.argsort(-truth)[:10]
    row.top10_max_abs = float(np.abs(errors[0][top]).max())
    row.notes.append(f"{len(peer_values)} perturbed, {len(reports)} estimated")
    return row


def peer_rows(
    wire_id: str,
    k: int,
    eps: Decimal,
    n: int,
    values: np.ndarray,
    runs: int,
    est_n: int,
    seed: int,
) -> list[Row]:
    """pure-ldp and multi-freq-ldpy on the same values and parameters (where they have it)."""
    rows: list[Row] = []
    mech = create(wire_id, eps, k)
    assert isinstance(mech, FrequencyOracle)
    variance = mech.variance
    f = float(eps)
    np.random.seed(seed)
    random.seed(seed)
    try:
        from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer
        from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer
        from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer
    except ImportError as exc:
        print(f"  pure-ldp unavailable: {exc}", file=sys.stderr)
    else:
        pure: dict[str, tuple[Any, Any]] = {
            "grr": (DEClient(f, k), lambda: DEServer(f, k)),
            "oue": (UEClient(f, k, use_oue=True), lambda: UEServer(f, k, use_oue=True)),
            "sue": (UEClient(f, k, use_oue=False), lambda: UEServer(f, k, use_oue=False)),
            "olh": (LHClient(f, k, use_olh=True), lambda: LHServer(f, k, use_olh=True)),
        }
        if wire_id in pure:
            client, make_server = pure[wire_id]

            def pure_aggregate(reports: list[Any], make_server: Any = make_server) -> np.ndarray:
                server = make_server()
                for report in reports:
                    server.aggregate(report)
                counts = server.estimate_all(range(1, k + 1), suppress_warnings=True)
                return np.asarray(counts, dtype=float) / len(reports)

            rows.append(
                _peer_row(
                    wire_id,
                    "pure-ldp",
                    k,
                    eps,
                    n,
                    values,
                    partial(_privatise, client),
                    pure_aggregate,
                    runs,
                    est_n,
                    variance,
                )
            )
    try:
        from multi_freq_ldpy.pure_frequency_oracles import GRR, LH, SS, UE
    except ImportError as exc:
        print(f"  multi-freq-ldpy unavailable: {exc}", file=sys.stderr)
    else:
        mfl: dict[str, tuple[Callable[[int], Any], Callable[[list[Any]], np.ndarray]]] = {
            "grr": (lambda v: GRR.GRR_Client(v, k, f), lambda r: GRR.GRR_Aggregator_MI(r, k, f)),
            "oue": (
                lambda v: UE.UE_Client(v, k, f, True),
                lambda r: UE.UE_Aggregator_MI(r, f, True),
            ),
            "sue": (
                lambda v: UE.UE_Client(v, k, f, False),
                lambda r: UE.UE_Aggregator_MI(r, f, False),
            ),
            "olh": (
                lambda v: LH.LH_Client(v, k, f, True),
                lambda r: LH.LH_Aggregator_MI(r, k, f, True),
            ),
            "ss": (lambda v: SS.SS_Client(v, k, f), lambda r: SS.SS_Aggregator_MI(r, k, f)),
        }
        if wire_id in mfl:
            client_fn, aggregate_fn = mfl[wire_id]
            row = _peer_row(
                wire_id,
                "multi-freq-ldpy",
                k,
                eps,
                n,
                values,
                client_fn,
                aggregate_fn,
                runs,
                est_n,
                variance,
            )
            row.notes.append("MI estimator clips and renormalizes (biased)")
            rows.append(row)
    return rows


# --- driver ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mechanisms",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small n and a subset (< 1 minute)")
    parser.add_argument("--json", type=Path, help="write every figure, params, commit, machine")
    parser.add_argument("--n", type=int, help="values per setting (default 1e6; quick 1e5)")
    parser.add_argument("--k", type=int, nargs="+", help="domain sizes (default 16 256 4096)")
    parser.add_argument("--eps", nargs="+", help="epsilons (default 0.5 1 2 4)")
    parser.add_argument("--mechanisms", nargs="+", help=f"subset of {FREQUENCY + NUMERIC}")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per figure (>= 5)")
    parser.add_argument("--peer-n", type=int, default=2000, help="values perturbed by peers")
    parser.add_argument(
        "--peer-est-n",
        type=int,
        default=400,
        help="reports the peers estimate from (local hashing is O(n k) there)",
    )
    parser.add_argument("--no-peers", action="store_true", help="skip pure-ldp / multi-freq-ldpy")
    parser.add_argument("--seed", type=int, default=20260101)
    args = parser.parse_args(argv)
    if args.quick:
        args.n = args.n or 50_000
        args.k = args.k or [16, 4096]
        args.eps = args.eps or ["1"]
        args.mechanisms = args.mechanisms or ["grr", "oue", "olh", "hr", "piecewise"]
        args.peer_n = min(args.peer_n, 500)
        args.peer_est_n = min(args.peer_est_n, 100)
    args.n = args.n or 1_000_000
    args.k = args.k or [16, 256, 4096]
    args.eps = args.eps or ["0.5", "1", "2", "4"]
    args.mechanisms = args.mechanisms or FREQUENCY + NUMERIC
    unknown = set(args.mechanisms) - set(FREQUENCY + NUMERIC)
    if unknown:
        parser.error(f"unknown mechanisms: {sorted(unknown)}")
    if args.runs < 5:
        parser.error("--runs must be at least 5 (figures are medians over >= 5 runs)")
    return args


def setting_seed(base: int, wire_id: str, k: int | None, eps: str) -> int:
    """A seed per (mechanism, k, eps), so accuracy figures of settings are independent."""
    return base + zlib.crc32(f"{wire_id}|{k}|{eps}".encode()) % 1_000_003


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for k in args.k:
        values = zipf_values(k, args.n, args.seed)
        for text in args.eps:
            eps = Decimal(text)
            for wire_id in [m for m in args.mechanisms if m in FREQUENCY]:
                heavy = wire_id in ("oue", "sue", "ss") and k >= 1024
                single_calls = 200 if heavy else 2000
                rows.append(
                    bench_frequency(
                        wire_id,
                        k,
                        eps,
                        values,
                        args.runs,
                        single_calls,
                        setting_seed(args.seed, wire_id, k, text),
                    )
                )
                reference = numpy_reference(
                    wire_id,
                    k,
                    eps,
                    values,
                    args.runs,
                    args.seed + 2,
                    est_n=max(1000, (1 << 24) // k) // (8 if args.quick else 1),
                    ue_n=2000 if args.quick else 20000,
                )
                if reference is not None:
                    rows.append(reference)
                if not args.no_peers:
                    rows.extend(
                        peer_rows(
                            wire_id,
                            k,
                            eps,
                            args.n,
                            values[: args.peer_n],
                            args.runs,
                            args.peer_est_n,
                            args.seed + 3,
                        )
                    )
                print(f"  done {wire_id} k={k} eps={eps}", file=sys.stderr, flush=True)
    numeric_values = 100.0 * np.random.default_rng(args.seed).beta(2.0, 5.0, size=args.n)
    for text in args.eps:
        for wire_id in [m for m in args.mechanisms if m in NUMERIC]:
            rows.append(
                bench_numeric(
                    wire_id,
                    Decimal(text),
                    numeric_values,
                    args.runs,
                    2000,
                    setting_seed(args.seed, wire_id, None, text),
                )
            )
            print(f"  done {wire_id} eps={text}", file=sys.stderr, flush=True)
    return rows


def table(rows: Sequence[Row]) -> str:
    headers = [
        "k",
        "eps",
        "mechanism",
        "library",
        "batch reports/s",
        "single µs",
        "estimation s",
        "MSE/Var (95% band)",
        "top-10 max abs err",
    ]
    body = []
    for r in rows:
        est = "-"
        if r.estimation_s is not None:
            est = ("~" if r.estimation_extrapolated else "") + fmt_float(r.estimation_s.median)
        mse = "-"
        if r.mse_ratio is not None and r.mse_band is not None:
            mse = f"{r.mse_ratio:.2f} ({r.mse_band[0]:.2f}-{r.mse_band[1]:.2f})"
        body.append(
            [
                r.k if r.k is not None else "-",
                r.epsilon,
                r.mechanism,
                r.library,
                fmt_rate(r.batch_rate.median if r.batch_rate else None),
                fmt_float(r.single_us.median if r.single_us else None),
                est,
                mse,
                fmt_float(r.top10_max_abs),
            ]
        )
    return format_table(headers, body)


def speedups(rows: Sequence[Row]) -> str:
    """The issue's targets: ours vs the faster peer, per setting."""
    lines = []
    by_key: dict[tuple[str, int | None, str], dict[str, Row]] = {}
    for r in rows:
        by_key.setdefault((r.mechanism, r.k, r.epsilon), {})[r.library] = r
    for (mechanism, k, eps), libs in sorted(
        by_key.items(), key=lambda x: (x[0][0], x[0][1] or 0, x[0][2])
    ):
        ours = libs.get("fedldp")
        peers = [libs[p] for p in ("pure-ldp", "multi-freq-ldpy") if p in libs]
        if ours is None or not peers or ours.batch_rate is None:
            continue
        best_rate = max(p.batch_rate.median for p in peers if p.batch_rate)
        best_est = min(p.estimation_s.median for p in peers if p.estimation_s)
        assert ours.estimation_s is not None
        lines.append(
            f"{mechanism:4} k={k:<5} eps={eps:<4} batch x{ours.batch_rate.median / best_rate:,.0f}"
            f"  estimation x{best_est / ours.estimation_s.median:,.0f}  vs the faster peer"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    rows = run(args)
    print(table(rows))
    print()
    print(speedups(rows))
    print(f"\n(total {time.perf_counter() - start:.0f} s; n={args.n}, runs={args.runs})")
    if args.json:
        params = {k: v for k, v in vars(args).items() if k != "json"}
        write_json(
            args.json,
            benchmark="mechanisms",
            params=params,
            figures=[asdict(r) for r in rows],
            packages=PACKAGES,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
