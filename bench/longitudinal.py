"""Longitudinal mechanisms: calibration of the error bars, and utility across value changes.

    python -m bench.longitudinal            # full sizes (a few minutes)
    python -m bench.longitudinal --quick    # small sizes (< 1 minute)
    python -m bench.longitudinal --json out.json

1. Calibration: MSE ÷ exact variance of loloha's frequencies and of dbitflip's
   histogram and mean (one report per user, fresh memos, batch path), averaged
   over coordinates and repetitions: near 1 when the stated variance is exact.
2. Utility after 10 value changes at the same lifetime loss: every user
   reports T = 11 rounds and changes value every round (uniformly to another
   value), with one memo across rounds. Each mechanism runs at the largest ε1
   (on a 0.01 grid, ε∞ = 4) whose lifetime charge T · report_charge fits the
   same budget B; the table gives the per-round MSE of the frequency estimate,
   averaged over rounds and values. rappor-grr and loloha on k values;
   dbitflip against rappor-grr on the same k buckets.
"""

from __future__ import annotations

import argparse
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.memo import Memoized, RapporGRR

from bench._common import fmt_float, format_table, write_json

ROUNDS = 11
#: ε∞ of the utility comparison (ε1 is searched below it).
EPSILON_PERMANENT = Decimal(4)


def _calibration(wire_id: str, n: int, reps: int, rng: np.random.Generator) -> dict[str, Any]:
    """Mean over repetitions and coordinates of (estimate - truth)^2 / exact variance."""
    k = 16
    truth = rng.dirichlet(np.ones(k))
    if wire_id == "loloha":
        mech: Any = create("loloha", Decimal(1), k, {"epsilon_permanent": "2"})
    else:
        params = {"epsilon_permanent": "2", "buckets": str(k), "d": "4"}
        mech = create("dbitflip", Decimal(1), (Decimal(0), Decimal(k)), params)
    ratios, mean_ratios = [], []
    for _ in range(reps):
        values = rng.choice(k, size=n, p=truth)
        stat = mech.new_statistic()
        inputs = values + 0.5 if wire_id == "dbitflip" else values
        mech.accumulate_batch(stat, mech.perturb_batch(inputs, rng))
        hist = mech.bucket_estimate(stat) if wire_id == "dbitflip" else mech.estimate(stat)
        ratios.append(float(np.mean((hist.values - truth) ** 2 / mech.variance(n, truth))))
        if wire_id == "dbitflip":
            true_mean = float(np.dot(truth, mech.midpoints))
            mean = mech.estimate(stat).values[0]
            mean_ratios.append((mean - true_mean) ** 2 / mech.mean_variance(n, truth))
    out: dict[str, Any] = {"mechanism": wire_id, "n": n, "reps": reps}
    out["mse_over_variance"] = float(np.mean(ratios))
    if mean_ratios:
        out["mean_mse_over_variance"] = float(np.mean(mean_ratios))
    return out


def _build(wire_id: str, eps1: Decimal, k: int) -> Memoized:
    params = {"epsilon_permanent": str(EPSILON_PERMANENT)}
    if wire_id == "dbitflip":
        params.update(buckets=str(k), d="4")
        mech = create(wire_id, eps1, (Decimal(0), Decimal(k)), params)
    else:
        mech = create(wire_id, eps1, k, params)
    assert isinstance(mech, Memoized)
    return mech


def _at_budget(wire_id: str, budget: Decimal, k: int) -> Memoized:
    """The mechanism at the largest ε1 (0.01 grid) with ROUNDS · charge <= budget."""
    lo, hi = 1, 399  # hundredths, below ε∞
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ROUNDS * _build(wire_id, Decimal(mid) / 100, k).report_charge <= budget:
            lo = mid
        else:
            hi = mid - 1
    return _build(wire_id, Decimal(lo) / 100, k)


def _rounds(mech: Any, values: Any, rng: np.random.Generator) -> list[Any]:
    """Per-round batch outputs of users reporting values (n, T) with one memo each."""
    if isinstance(mech, RapporGRR):  # a permanent response per (user, value), drawn up front
        n, k = values.shape[0], mech.k
        table = mech.permanent.perturb_batch(np.tile(np.arange(k), n), rng).reshape(n, k)
        outs = []
        for t in range(values.shape[1]):
            permanent = table[np.arange(n), values[:, t]]
            keep = rng.random(n) < mech.p_r
            other = rng.integers(0, k - 1, size=n)
            other += other >= permanent
            outs.append(np.where(keep, permanent, other))
        return outs
    if mech.wire_id == "dbitflip":
        indices, bits = mech.perturb_batch_longitudinal(values + 0.5, rng)
        return [(indices, bits[:, t]) for t in range(values.shape[1])]
    seeds, hashed = mech.perturb_batch_longitudinal(values, rng)
    return [(seeds, hashed[:, t]) for t in range(values.shape[1])]


def _changing_values(n: int, k: int, rng: np.random.Generator) -> Any:
    values = np.empty((n, ROUNDS), dtype=np.int64)
    values[:, 0] = rng.integers(0, k, size=n)
    for t in range(1, ROUNDS):  # change every round, to another value uniformly
        step = rng.integers(1, k, size=n)
        values[:, t] = (values[:, t - 1] + step) % k
    return values


def _utility(
    wire_id: str, budget: Decimal, k: int, n: int, rng: np.random.Generator
) -> dict[str, Any]:
    mech: Any = _at_budget(wire_id, budget, k)
    values = _changing_values(n, k, rng)
    errors, ratios = [], []
    for t, out in enumerate(_rounds(mech, values, rng)):
        truth = np.bincount(values[:, t], minlength=k) / n
        stat = mech.new_statistic()
        mech.accumulate_batch(stat, out)
        est = mech.bucket_estimate(stat) if wire_id == "dbitflip" else mech.estimate(stat)
        errors.append(float(np.mean((est.values - truth) ** 2)))
        ratios.append(float(np.mean((est.values - truth) ** 2 / mech.variance(n, truth))))
    return {
        "mechanism": wire_id,
        "k": k,
        "epsilon": str(mech.epsilon),
        "epsilon_permanent": str(mech.epsilon_permanent),
        "report_charge": str(mech.report_charge),
        "lifetime_charge": str(ROUNDS * mech.report_charge),
        "fits_budget": ROUNDS * mech.report_charge <= budget,
        "mse": float(np.mean(errors)),
        "mse_over_variance": float(np.mean(ratios)),
    }


def main(argv: list[str] | None = None) -> int:
    """Run both parts and print their tables."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.longitudinal",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 minute")
    parser.add_argument("--json", type=Path, help="write figures, params, commit, machine here")
    args = parser.parse_args(argv)
    params = {
        "quick": args.quick,
        "calibration_n": 20_000 if args.quick else 100_000,
        "calibration_reps": 10 if args.quick else 40,
        "utility_n": 20_000 if args.quick else 100_000,
        "rounds": ROUNDS,
        "budget": "20",
        "k": 16,
    }
    rng = np.random.default_rng(2024)
    calibration = [
        _calibration(m, params["calibration_n"], params["calibration_reps"], rng)
        for m in ("loloha", "dbitflip")
    ]
    print("## MSE ÷ exact variance (one report per user; 1 = the stated variance is exact)")
    rows = [
        [
            c["mechanism"],
            c["n"],
            c["reps"],
            fmt_float(c["mse_over_variance"]),
            fmt_float(c.get("mean_mse_over_variance")),
        ]
        for c in calibration
    ]
    print(format_table(["mechanism", "n", "reps", "frequencies", "mean"], rows))
    budget = Decimal(params["budget"])
    utility = [
        _utility(m, budget, params["k"], params["utility_n"], rng)
        for m in ("rappor-grr", "loloha", "dbitflip")
    ]
    print(f"\n## After 10 value changes, same lifetime charge (B = {budget} over {ROUNDS} reports)")
    rows = [
        [
            u["mechanism"],
            u["epsilon"],
            u["report_charge"],
            u["lifetime_charge"],
            f"{u['mse']:.3g}",
            fmt_float(u["mse_over_variance"]),
        ]
        for u in utility
    ]
    headers = ["mechanism", "ε1", "charge/report", "lifetime", "per-round MSE", "MSE÷Var"]
    print(format_table(headers, rows))
    if args.json:
        figures = {"calibration": calibration, "utility": utility}
        write_json(args.json, benchmark="longitudinal", params=params, figures=figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
