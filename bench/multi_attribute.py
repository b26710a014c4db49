"""Benchmark of multi-attribute collection: MSE ÷ exact variance under split and sample, auto.

    python -m bench.multi_attribute                 # n = 20,000 users, 50 runs per cell
    python -m bench.multi_attribute --quick         # n = 5,000, 20 runs, eps {1, 4} (< 1 minute)
    python -m bench.multi_attribute --json out.json

For a few attribute mixes (categorical on Zipf(1.1) values, numeric on 100 * Beta(2, 5) over
[0, 100]) and ε, per mode (multi-split, multi-sample; fedldp.client.mechanisms.multi):

* MSE ÷ exact variance, per attribute: the empirical MSE of the attribute's estimates over the
  runs (and its coordinates) divided by the mean of the stated exact variance (multi.py:
  split V_j(ε/d, n); sample V_j(ε, n_j) + σ_j^2 (n - n_j)/(n_j (n - 1)) at the realized n_j),
  1.0 = exactly as stated. "band" is the 95% range of that ratio from sampling alone for one
  attribute (chi-square with `runs` degrees of freedom: conservative, as if an attribute's
  coordinates were one; with d attributes a few of the d ratios fall outside it by chance);
* total error: Σ over attributes of the mean squared error per coordinate, in scale-free
  units (a frequency; a mean in half-range units), the quantity `auto` compares at the uniform
  reference; "auto" is the mode `auto` signs for these attributes and ε, "best" the mode with
  the lower empirical total here (the data are not uniform, so they can differ where the two
  totals are close);
* perturb, µs: one device report (`perturb` with the OS CSPRNG, all attributes' values in),
  median over --runs timings of 2,000 calls.

Reference in the same run (all-categorical mix, GRR attributes): multi-freq-ldpy's SPL_GRR and
SMP_GRR on --peer-n users (its per-user Python loops), as MSE ÷ our exact variance of the same
mode at that n. Its aggregator clips negative estimates and renormalizes, so its ratio can sit
below 1 (biased, smaller variance), never the unbiased value.
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
from fedldp.client.mechanisms import AttributeSpec, MultiMetric, create, resolve
from fedldp.client.mechanisms.multi import MultiAttribute
from fedldp.client.mechanisms.numeric import NumericMechanism

from bench._common import fmt_float, format_table, summarize, write_json

PACKAGES = ["numpy", "scipy", "multi-freq-ldpy", "fedldp"]
LO, HI = Decimal(0), Decimal(100)
MODES = ("multi-split", "multi-sample")


def _cat(name: str, k: int, wire_id: str) -> AttributeSpec:
    return AttributeSpec(name, tuple(f"{name}{i}" for i in range(k)), None, wire_id)


def _num(name: str, wire_id: str) -> AttributeSpec:
    return AttributeSpec(name, None, (LO, HI), wire_id)


MIXES: dict[str, MultiMetric] = {
    "3 categorical (grr k=4, grr k=8, oue k=16)": MultiMetric(
        (_cat("os", 4, "grr"), _cat("lang", 8, "grr"), _cat("country", 16, "oue"))
    ),
    "2 categorical + 1 numeric (grr k=4, oue k=16, piecewise)": MultiMetric(
        (_cat("os", 4, "grr"), _cat("country", 16, "oue"), _num("age", "piecewise"))
    ),
    "3 numeric (duchi, piecewise, hybrid)": MultiMetric(
        (_num("minutes", "duchi"), _num("age", "piecewise"), _num("score", "hybrid"))
    ),
    "8 binary (grr k=2)": MultiMetric(tuple(_cat(f"flag{i}", 2, "grr") for i in range(8))),
}
PEER_MIX = "3 categorical (grr k=4, grr k=8, oue k=16)"
PEER_KEY = "multi_freq_ldpy_mse_over_variance"


def population(metric: MultiMetric, n: int, seed: int) -> list[np.ndarray]:
    """Zipf(1.1) indices per categorical attribute, 100 * Beta(2, 5) per numeric one."""
    rng = np.random.default_rng(seed)
    values: list[np.ndarray] = []
    for spec in metric.attributes:
        if spec.labels is not None:
            k = len(spec.labels)
            w = 1.0 / np.arange(1, k + 1) ** 1.1
            values.append(rng.choice(k, size=n, p=w / w.sum()))
        else:
            values.append(100.0 * rng.beta(2.0, 5.0, size=n))
    return values


def truth(mech: MultiAttribute, values: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each attribute's true frequencies or mean (clipped values)."""
    out = []
    for m, v in zip(mech.mechanisms, values, strict=True):
        if isinstance(m, NumericMechanism):
            out.append(np.array([np.clip(v, float(m.lo), float(m.hi)).mean()]))
        else:
            out.append(np.bincount(v, minlength=m.k) / v.shape[0])  # type: ignore[attr-defined]
    return out


@dataclass
class Cell:
    """One (mix, ε, mode): per-attribute squared errors and exact variances over runs."""

    squared: list[list[np.ndarray]]
    exact: list[list[np.ndarray]]


def measure(mech: MultiAttribute, values: list[np.ndarray], runs: int, seed: int) -> Cell:
    rng = np.random.default_rng(seed)
    true = truth(mech, values)
    cell = Cell([[] for _ in values], [[] for _ in values])
    for _ in range(runs):
        statistic = mech.new_statistic()
        mech.accumulate_batch(statistic, mech.perturb_batch(values, rng))
        parts = mech.attribute_estimates(statistic)
        exact = mech.exact_variances(values, [p.n for p in statistic.parts])
        for j, part in enumerate(parts):
            cell.squared[j].append((part.estimate.values - true[j]) ** 2)
            cell.exact[j].append(exact[j])
    return cell


def scale2(mech: MultiAttribute, j: int) -> float:
    m = mech.mechanisms[j]
    return float(m.scale**2) if isinstance(m, NumericMechanism) else 1.0


def ratio_band(dof: int) -> tuple[float, float]:
    from scipy import stats

    return float(stats.chi2.ppf(0.025, dof) / dof), float(stats.chi2.isf(0.025, dof) / dof)


def perturb_micros(mech: MultiAttribute, values: list[np.ndarray], runs: int) -> Any:
    one = tuple(v[0].item() for v in values)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(2000):
            mech.perturb(one)
        samples.append((time.perf_counter() - start) / 2000 * 1e6)
    return summarize(samples)


def peer_ratio(mode: str, eps: Decimal, n: int, runs: int, seed: int) -> float | None:
    """multi-freq-ldpy's SPL/SMP with GRR attributes: MSE ÷ our exact variance of `mode`."""
    try:
        from multi_freq_ldpy.mdim_freq_est import SMP_solution, SPL_solution
    except ImportError:
        return None
    metric = MultiMetric(
        tuple(_cat(a.name, len(a.labels or ()), "grr") for a in MIXES[PEER_MIX].attributes)
    )
    mech = create(mode, eps, metric)
    assert isinstance(mech, MultiAttribute)
    values = population(metric, n, seed)
    true = truth(mech, values)
    lst_k = [len(a.labels or ()) for a in metric.attributes]
    d = len(lst_k)
    rows = list(zip(*(v.tolist() for v in values), strict=True))
    np.random.seed(seed)  # the peer draws from numpy's global generator
    squared, exact = 0.0, 0.0
    for _ in range(runs):
        if mode == "multi-split":
            reports = [SPL_solution.SPL_GRR_Client(r, lst_k, d, float(eps)) for r in rows]
            est = SPL_solution.SPL_GRR_Aggregator_MI(reports, lst_k, d, float(eps))
            counts = [n] * d
        else:
            reports = [SMP_solution.SMP_GRR_Client(r, lst_k, d, float(eps)) for r in rows]
            est = SMP_solution.SMP_GRR_Aggregator_MI(reports, lst_k, d, float(eps))
            counts = list(np.bincount([a for a, _ in reports], minlength=d))
        variances = mech.exact_variances(values, counts)
        for j in range(d):
            squared += float(np.mean((np.asarray(est[j], dtype=float) - true[j]) ** 2))
            exact += float(np.mean(variances[j]))
    return squared / exact


def run(args: argparse.Namespace) -> dict[str, Any]:
    epsilons = [Decimal(e) for e in args.epsilons]
    figures: list[dict[str, Any]] = []
    for mix_index, (name, metric) in enumerate(MIXES.items()):
        values = population(metric, args.n, seed=20261201)
        for eps_index, eps in enumerate(epsilons):
            auto = resolve("auto", eps, metric)
            totals: dict[str, float] = {}
            for mode in MODES:
                mech = create(mode, eps, metric)
                assert isinstance(mech, MultiAttribute)
                # One stream per (mix, ε), shared by the two modes (a paired comparison);
                # cells of other ε do not reuse it, so their errors are independent.
                cell = measure(mech, values, args.runs, seed=1000 * mix_index + eps_index)
                attrs: list[dict[str, Any]] = []
                total = 0.0
                for j, spec in enumerate(metric.attributes):
                    sq = np.array(cell.squared[j])
                    ex = np.array(cell.exact[j])
                    attrs.append(
                        {
                            "attribute": spec.name,
                            "mse_over_variance": float(sq.mean() / ex.mean()),
                            "dof": int(sq.shape[0]),
                        }
                    )
                    total += float(sq.mean()) / scale2(mech, j)
                totals[mode] = total
                ratios = [a["mse_over_variance"] for a in attrs]
                figures.append(
                    {
                        "mix": name,
                        "epsilon": str(eps),
                        "mode": mode,
                        "attribute_epsilon": str(mech.attribute_epsilon),
                        "attributes": attrs,
                        "ratio_min": min(ratios),
                        "ratio_max": max(ratios),
                        "band": ratio_band(min(a["dof"] for a in attrs)),
                        "total_error": total,
                        "auto": auto,
                        "perturb_us": perturb_micros(mech, values, args.timing_runs),
                    }
                )
            best = min(totals, key=lambda m: totals[m])
            for row in figures[-2:]:
                row["best"] = best
    peers = []
    if not args.no_peer:
        for eps in epsilons:
            for mode in MODES:
                peers.append(
                    {
                        "epsilon": str(eps),
                        "mode": mode,
                        "n": args.peer_n,
                        PEER_KEY: peer_ratio(mode, eps, args.peer_n, args.peer_runs, seed=3),
                    }
                )
    return {"cells": figures, "peer": peers}


def print_tables(result: dict[str, Any]) -> None:
    rows = []
    for c in result["cells"]:
        rows.append(
            [
                c["mix"],
                c["epsilon"],
                c["mode"],
                c["attribute_epsilon"][:8],
                " ".join(f"{a['mse_over_variance']:.3f}" for a in c["attributes"]),
                f"[{c['band'][0]:.2f}, {c['band'][1]:.2f}]",
                fmt_float(c["total_error"], 4),
                c["auto"],
                c["best"],
                f"{c['perturb_us'].median:.1f}",
            ]
        )
    print(
        format_table(
            [
                "mix",
                "ε",
                "mode",
                "ε/attr",
                "MSE ÷ exact variance (per attribute)",
                "95% band",
                "total error",
                "auto",
                "best here",
                "perturb µs",
            ],
            rows,
        )
    )
    if result["peer"]:
        print()
        print(f"multi-freq-ldpy on {PEER_MIX} with grr attributes (MSE ÷ our exact variance):")
        print(
            format_table(
                ["ε", "mode", "n", "multi-freq-ldpy"],
                [
                    [
                        p["epsilon"],
                        p["mode"],
                        p["n"],
                        fmt_float(p["multi_freq_ldpy_mse_over_variance"]),
                    ]
                    for p in result["peer"]
                ],
            )
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="n 5,000, 20 runs, eps 1 and 4")
    parser.add_argument("--n", type=int, default=20_000, help="users")
    parser.add_argument("--runs", type=int, default=50, help="repetitions per cell")
    parser.add_argument("--epsilons", nargs="+", default=["0.5", "1", "2", "4", "8"])
    parser.add_argument("--timing-runs", type=int, default=5, help="perturb timings per cell")
    parser.add_argument("--peer-n", type=int, default=2_000, help="users for the peer")
    parser.add_argument("--peer-runs", type=int, default=10, help="repetitions for the peer")
    parser.add_argument("--no-peer", action="store_true", help="skip multi-freq-ldpy")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.runs, args.epsilons, args.peer_runs = 5_000, 20, ["1", "4"], 5
    result = run(args)
    print_tables(result)
    if args.json is not None:
        write_json(
            args.json,
            benchmark="multi_attribute",
            params={k: v for k, v in vars(args).items() if k != "json"},
            figures=result,
            packages=PACKAGES,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
