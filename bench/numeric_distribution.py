"""Numeric distributions: Square Wave + EMS against the mean-only numeric mechanisms.

    python -m bench.numeric_distribution            # eps in {1, 2, 4}, n = 100,000, 5 runs
    python -m bench.numeric_distribution --quick    # eps in {1, 4}, n = 20,000, 5 runs
    python -m bench.numeric_distribution --json out.json
    python -m bench.numeric_distribution --coverage   # the sw bands' coverage, shipped vs basic

Data on [0, 100], fixed per seed: "beta" = 100 * Beta(2, 5); "bimodal" = two normal
bumps at 30 and 70 (sd 8, equal weight), clipped to the range. Every mechanism runs
on its default grid (the policy defaults) through the batch path, n reports each.

Per (distribution, ε, mechanism), medians over --runs runs with min and max:

* W1: the Wasserstein-1 distance, in value units, between the distribution the
  mechanism's estimate implies and the empirical distribution of the n true values
  (∫ |F̂ - F| over [0, 100]). sw: the EMS histogram over --buckets buckets, uniform
  within each (fedldp.aggregator.histogram). duchi, piecewise, hybrid estimate only
  the mean, so the distribution they imply is a point mass at the estimated mean.
  "point mass at true mean" is the floor for any mean-only summary (mean |x - mean|).
* |mean error|: |estimated mean - true mean|; for sw, the mechanism's unbiased
  mean (`estimate`) and, in its own row, the mean of the EMS reconstruction.
* EMS seconds (sw): from the counts to the histogram (one EMS fit).
* bands seconds (sw): the histogram with its bands as a report computes it
  (`bootstrap`: the fit and R = --time-replicates parametric-bootstrap refits, on
  Square Wave's factored transition law), and, as the reference in the same run,
  the same fit, draws and refits on the dense transition matrix (numpy's BLAS
  products, refits in blocks of 8: the aggregator before 2026-12-07).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.aggregator.histogram import (
    FINE_BUCKETS,
    bootstrap,
    bootstrap_band,
    ems,
    point_mass_wasserstein,
    replicate_counts,
    wasserstein_to_sample,
)
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.square_wave import SquareWave

from bench._common import Timing, fmt_float, format_table, summarize, write_json

LO, HI = 0.0, 100.0
MEAN_ONLY = ["duchi", "piecewise", "hybrid"]
DISTRIBUTIONS = ["beta", "bimodal"]


def population(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """n true values on [0, 100] (module docstring)."""
    if kind == "beta":
        return 100.0 * rng.beta(2.0, 5.0, size=n)
    left = rng.random(n) < 0.5
    return np.clip(np.where(left, rng.normal(30, 8, n), rng.normal(70, 8, n)), LO, HI)


@dataclass
class Row:
    distribution: str
    epsilon: str
    method: str
    w1: Timing | None  # None: a mean with no distribution (sw's unbiased mean)
    mean_error: Timing
    ems_seconds: Timing | None = None
    bands_seconds: Timing | None = None
    dense_bands_seconds: Timing | None = None


def _dense_bootstrap(mech: SquareWave, counts: np.ndarray, buckets: int, replicates: int) -> None:
    """The reference for `bootstrap`: the fit, draws and refits on the dense matrix."""
    matrix = mech.transition_matrix(buckets * -(-FINE_BUCKETS // buckets))
    fine, _ = ems(counts, matrix)
    n = int(counts.sum())
    draws = replicate_counts(n, matrix @ fine, replicates, np.random.default_rng(0))
    for k in range(0, replicates, 8):
        ems(draws[:, k : k + 8], matrix)


def _bands_seconds(
    mech: SquareWave, statistic: Any, buckets: int, replicates: int
) -> tuple[float, float]:
    """(seconds of `bootstrap`, seconds of its dense reference) on one statistic."""
    start = time.perf_counter()
    bootstrap(mech, statistic, buckets=buckets, replicates=replicates, seed=0)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    _dense_bootstrap(mech, np.asarray(statistic.counts, dtype=np.float64), buckets, replicates)
    return seconds, time.perf_counter() - start


def _sw_run(
    mech: SquareWave, values: np.ndarray, args: argparse.Namespace, rng: np.random.Generator
) -> tuple[float, float, float, float, float, float]:
    """(W1 of EMS, |unbiased mean error|, |EMS mean error|, EMS seconds, bands seconds,
    dense bands seconds) for one run."""
    buckets = args.buckets
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
    per_bucket = -(-FINE_BUCKETS // buckets)
    matrix = mech.transition_matrix(buckets * per_bucket)
    start = time.perf_counter()
    fine, _ = ems(np.asarray(statistic.counts, dtype=np.float64), matrix)
    seconds = time.perf_counter() - start
    x = fine.reshape(buckets, per_bucket).sum(axis=1)
    edges = np.linspace(LO, HI, buckets + 1)
    mids = (edges[:-1] + edges[1:]) / 2
    truth = float(values.mean())
    unbiased = float(mech.estimate(statistic).values[0])
    return (
        wasserstein_to_sample(edges, x, values),
        abs(unbiased - truth),
        abs(float(mids @ x) - truth),
        seconds,
        *_bands_seconds(mech, statistic, buckets, args.time_replicates),
    )


def run(args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    for kind in args.distributions:
        values = population(kind, args.n, np.random.default_rng(args.seed))
        truth = float(values.mean())
        for eps in args.eps:
            epsilon = Decimal(eps)
            rng = np.random.default_rng([args.seed, int(Decimal(eps) * 1000)])
            sw = create("sw", epsilon, (Decimal(LO), Decimal(HI)))
            assert isinstance(sw, SquareWave)
            runs = [_sw_run(sw, values, args, rng) for _ in range(args.runs)]
            w1, unbiased, ems_err, *timed = (list(c) for c in zip(*runs, strict=True))
            seconds = [summarize(t) for t in timed]
            rows.append(Row(kind, eps, "sw + EMS", summarize(w1), summarize(ems_err), *seconds))
            rows.append(Row(kind, eps, "sw (unbiased mean)", None, summarize(unbiased)))
            for wire_id in MEAN_ONLY:
                mech = create(wire_id, epsilon, (Decimal(LO), Decimal(HI)))
                w1s, errs = [], []
                for _ in range(args.runs):
                    statistic = mech.new_statistic()
                    mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
                    mean = float(mech.estimate(statistic).values[0])
                    w1s.append(point_mass_wasserstein(mean, values))
                    errs.append(abs(mean - truth))
                rows.append(
                    Row(kind, eps, f"{wire_id} (point mass)", summarize(w1s), summarize(errs))
                )
            floor = point_mass_wasserstein(truth, values)
            rows.append(
                Row(kind, eps, "point mass at true mean", summarize([floor]), summarize([0.0]))
            )
    return rows


@dataclass
class CoverageRow:
    """Pointwise coverage of the true bucket frequencies by a band, over runs."""

    distribution: str
    epsilon: str
    band: str
    coverage: Timing
    width: Timing


def basic_band(fitted: np.ndarray, boot: np.ndarray, confidence: float) -> tuple[Any, Any]:
    """The band before issue 33: the basic interval alone (the reference)."""
    alpha = 1.0 - confidence
    q_low, q_high = np.quantile(boot, [alpha / 2, 1 - alpha / 2], axis=1)
    return 2 * fitted - q_high, 2 * fitted - q_low


def coverage(args: argparse.Namespace) -> list[CoverageRow]:
    """Per (shape, ε): the share of buckets whose band holds the true frequency, per run
    (fresh reports each run, bootstrap seed = run), for the shipped band and the basic
    band, from the same replicates; medians over --runs."""
    rows: list[CoverageRow] = []
    bands = {"union (shipped)": bootstrap_band, "basic (before)": basic_band}
    for kind in args.distributions:
        values = population(kind, args.n, np.random.default_rng(args.seed))
        truth = np.histogram(values, bins=args.buckets, range=(LO, HI))[0] / values.shape[0]
        for eps in args.eps:
            sw = create("sw", Decimal(eps), (Decimal(LO), Decimal(HI)))
            assert isinstance(sw, SquareWave)
            rng = np.random.default_rng([args.seed, int(Decimal(eps) * 1000)])
            found: dict[str, tuple[list[float], list[float]]] = {b: ([], []) for b in bands}
            for run in range(args.runs):
                statistic = sw.new_statistic()
                sw.accumulate_batch(statistic, sw.perturb_batch(values, rng))
                fit = bootstrap(
                    sw, statistic, buckets=args.buckets, replicates=args.replicates, seed=run
                )
                for name, band in bands.items():
                    low, high = band(fit.fitted, fit.replicates, args.confidence)
                    low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
                    found[name][0].append(float(np.mean((low <= truth) & (truth <= high))))
                    found[name][1].append(float(np.mean(high - low)))
            for name, (covered, widths) in found.items():
                rows.append(CoverageRow(kind, eps, name, summarize(covered), summarize(widths)))
    return rows


def render_coverage(rows: Sequence[CoverageRow], args: argparse.Namespace) -> str:
    """The coverage table."""
    headers = ["data", "ε", "band", "coverage", "mean width"]
    body = [[r.distribution, r.epsilon, r.band, _cell(r.coverage), _cell(r.width)] for r in rows]
    note = (
        f"nominal {args.confidence:.0%} pointwise bands, {args.buckets} buckets, R = "
        f"{args.replicates} replicates, n = {args.n:,}, {args.runs} runs (median [min, max])"
    )
    return format_table(headers, body) + "\n" + note


def _cell(t: Timing | None) -> str:
    if t is None:
        return "-"
    if t.runs == 1:
        return fmt_float(t.median)
    return f"{fmt_float(t.median)} [{fmt_float(t.min)}, {fmt_float(t.max)}]"


def render(rows: Sequence[Row], args: argparse.Namespace) -> str:
    headers = ["data", "ε", "method", "W1 (value units)", "|mean error|", "EMS s"]
    headers += ["bands s", "bands s, dense"]
    body = [
        [
            r.distribution,
            r.epsilon,
            r.method,
            _cell(r.w1),
            _cell(r.mean_error),
            _cell(r.ems_seconds),
            _cell(r.bands_seconds),
            _cell(r.dense_bands_seconds),
        ]
        for r in rows
    ]
    note = (
        f"n = {args.n:,} per run, {args.runs} runs (median [min, max]), range [0, 100], "
        f"{args.buckets} EMS buckets; W1 against the empirical law of the true values; "
        f"bands: R = {args.time_replicates} refits."
    )
    return format_table(headers, body) + "\n" + note


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.numeric_distribution",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="n = 20,000, eps 1 and 4 (< 1 min)")
    parser.add_argument("--json", type=Path, help="write every figure, params, commit, machine")
    parser.add_argument("--n", type=int, help="values per run (default 100,000; quick 20,000)")
    parser.add_argument("--eps", nargs="+", help="epsilons (default 1 2 4; quick 1 4)")
    parser.add_argument("--distributions", nargs="+", choices=DISTRIBUTIONS, default=DISTRIBUTIONS)
    parser.add_argument("--buckets", type=int, default=32, help="EMS histogram buckets")
    parser.add_argument("--runs", type=int, default=5, help="runs per figure (>= 5)")
    parser.add_argument("--seed", type=int, default=20260101)
    parser.add_argument(
        "--coverage",
        action="store_true",
        help="only the sw bands' coverage of the true histogram (16 buckets, nominal 90%%)",
    )
    parser.add_argument("--replicates", type=int, default=100, help="bootstrap replicates R")
    parser.add_argument("--confidence", type=float, default=0.9, help="band level")
    parser.add_argument(
        "--time-replicates", type=int, help="refits in the timed bands (default 100; quick 8)"
    )
    args = parser.parse_args(argv)
    if args.coverage:
        args.buckets = 16 if args.buckets == 32 else args.buckets
        if args.quick:
            args.replicates, args.eps, args.distributions = 20, args.eps or ["2"], ["beta"]
    args.n = args.n or (20_000 if args.quick else 100_000)
    args.time_replicates = args.time_replicates or (8 if args.quick else 100)
    args.eps = args.eps or (["1", "4"] if args.quick else ["1", "2", "4"])
    if args.runs < 1 or args.n < 1 or args.buckets < 1:
        parser.error("--runs, --n and --buckets must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.coverage:
        found = coverage(args)
        print(render_coverage(found, args))
        if args.json is not None:
            params = {k: v for k, v in vars(args).items() if k != "json"}
            write_json(
                args.json,
                benchmark="numeric_distribution_coverage",
                params=params,
                figures=[r.__dict__ for r in found],
            )
        return 0
    rows = run(args)
    print(render(rows, args))
    if args.json is not None:
        figures: list[dict[str, Any]] = [
            {
                "distribution": r.distribution,
                "epsilon": r.epsilon,
                "method": r.method,
                "w1": r.w1,
                "mean_error": r.mean_error,
                "ems_seconds": r.ems_seconds,
                "bands_seconds": r.bands_seconds,
                "dense_bands_seconds": r.dense_bands_seconds,
            }
            for r in rows
        ]
        params = {k: v for k, v in vars(args).items() if k != "json"}
        write_json(args.json, benchmark="numeric_distribution", params=params, figures=figures)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
