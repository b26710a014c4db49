"""Amplification by shuffling: the central (ε, δ) of n shuffled ε0-LDP reports, and its gain.

    python -m bench.shuffle            # n in {1e4, 1e5, 1e6} x eps0 in {1, 2, 4, 8}, delta = 1e-8
    python -m bench.shuffle --quick    # n in {1e4, 1e5} x eps0 in {1, 4} (< 1 minute)
    python -m bench.shuffle --json out.json

Per (n, ε0):

* amplified ε: the central ε at δ of n ε0-LDP reports after a uniform shuffle, from
  Feldman-McMillan-Talwar (FOCS 2021) Theorem 3.2's numerical bound
  (fedldp.aggregator.shuffle_amplification), beside the exact ε of shuffled binary randomized
  response (a lower bound no valid bound can beat) and Theorem 3.1's closed form;
* accuracy gain at equal central ε: GRR over k = 64 categories, Zipf(1.1) frequencies. The
  shuffled deployment runs GRR at ε0 and claims the amplified central ε; plain LDP must run GRR
  at local ε = that central ε to claim the same. Gain = mean standard error of plain LDP ÷ that of
  the shuffled deployment (closed-form variances, Wang et al. USENIX Security 2017 eq. (3));
  the central Laplace standard error at the same ε (a trusted curator's, sensitivity 2 for a
  histogram under replacement) is printed as the floor;
* MSE ÷ exact variance of GRR at ε0 over --runs simulated collections (fixed seed; 1.0 = the
  stated variance is exact; shuffling does not change the multiset of reports, so this is the
  shuffled estimator's accuracy too);
* time to compute the bound: median (min, max) over --runs runs, beside the same-run reference
  of one evaluation of the divergence at ε = ε0/2 (the binary search makes ~log2(ε0/1e-6) of
  them); the ratio is the number of evaluations' worth of time.
"""

from __future__ import annotations

import argparse
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
from fedldp.aggregator.shuffle_amplification import (
    TAIL_FRACTION,
    amplified_epsilon,
    binary_rr_epsilon,
    closed_form_epsilon,
    hockey_stick_delta,
)
from fedldp.aggregator.shuffle_analyzer import round_up
from fedldp.client.mechanisms.base import CountStatistic
from fedldp.client.mechanisms.grr import GRR

from bench._common import fmt_float, format_table, time_runs, write_json

K = 64
DELTA = 1e-8
PACKAGES = ["numpy", "scipy", "fedldp"]


def zipf_frequencies(k: int) -> np.ndarray:
    """Zipf(1.1) over [0, k): f_i ∝ (i + 1)^-1.1."""
    weights = 1.0 / np.arange(1, k + 1) ** 1.1
    return np.asarray(weights / weights.sum(), dtype=np.float64)


def grr_std_error(epsilon: float, n: int, freq: np.ndarray) -> float:
    """Root mean (over categories) closed-form variance of GRR's frequency estimate."""
    variance = GRR(Decimal(repr(epsilon)), K).variance(n, freq)
    return float(np.sqrt(np.mean(variance)))


def grr_mse_ratio(epsilon: float, n: int, freq: np.ndarray, runs: int, seed: int) -> float:
    """Empirical MSE ÷ mean closed-form variance of GRR at `epsilon` over `runs` collections."""
    grr = GRR(Decimal(repr(epsilon)), K)
    rng = np.random.default_rng(seed)
    errors = []
    for _ in range(runs):
        values = rng.choice(K, size=n, p=freq)
        truth = np.bincount(values, minlength=K) / n
        statistic = grr.new_statistic()
        grr.accumulate_batch(statistic, grr.perturb_batch(values, rng))
        assert isinstance(statistic, CountStatistic)
        errors.append(np.mean((grr.estimate(statistic).values - truth) ** 2))
    return float(np.mean(errors) / np.mean(grr.variance(n, freq)))


def measure(n: int, eps0: float, runs: int, seed: int) -> dict[str, Any]:
    """Every figure of one (n, ε0) setting."""
    freq = zipf_frequencies(K)
    timing, results = time_runs(lambda: amplified_epsilon(n, eps0, DELTA), runs)
    reference, _ = time_runs(
        lambda: hockey_stick_delta(n, eps0, eps0 / 2, tail=TAIL_FRACTION * DELTA), runs
    )
    central = results[0].epsilon
    se_shuffled = grr_std_error(eps0, n, freq)
    se_plain = grr_std_error(central, n, freq) if central > 0 else math.inf
    return {
        "n": n,
        "epsilon0": eps0,
        "delta": DELTA,
        "amplified_epsilon": central,
        "binary_rr_lower_bound": binary_rr_epsilon(n, eps0, DELTA) if n <= 10**5 else None,
        "closed_form_epsilon": closed_form_epsilon(n, eps0, DELTA),
        "grr_se_shuffled": se_shuffled,
        "grr_se_plain_ldp_equal_central": se_plain,
        "accuracy_gain": se_plain / se_shuffled,
        "central_laplace_se": math.sqrt(2) * 2 / (central * n) if central > 0 else math.inf,
        "grr_mse_over_variance": grr_mse_ratio(eps0, n, freq, max(runs, 5), seed),
        "bound_seconds": timing,
        "one_divergence_seconds": reference,
        "time_ratio": timing.median / reference.median,
    }


def _row(m: dict[str, Any]) -> list[str]:
    """One table line."""
    lower = m["binary_rr_lower_bound"]
    return [
        f"{m['n']:.0e}",
        fmt_float(m["epsilon0"]),
        round_up(m["amplified_epsilon"]),  # an upper bound: never printed below it
        "-" if lower is None else f"{lower:.4f}",
        round_up(m["closed_form_epsilon"]),
        f"{m['grr_se_shuffled']:.2e}",
        f"{m['grr_se_plain_ldp_equal_central']:.2e}",
        f"{m['accuracy_gain']:.1f}x",
        f"{m['central_laplace_se']:.2e}",
        fmt_float(m["grr_mse_over_variance"]),
        f"{m['bound_seconds'].median:.3f} ({m['bound_seconds'].min:.3f}-"
        f"{m['bound_seconds'].max:.3f})",
        f"{m['time_ratio']:.0f}",
    ]


HEADERS = [
    "n",
    "ε0",
    "central ε",
    "binary-RR ε (lower bound)",
    "closed form",
    "GRR se shuffled",
    "GRR se plain LDP",
    "gain",
    "central Laplace se",
    "MSE÷Var",
    "bound s",
    "÷ one divergence",
]


def main(argv: list[str] | None = None) -> int:
    """Print the table (and write --json)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.shuffle",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small grid, < 1 minute")
    parser.add_argument("--json", type=Path, help="write figures, params, commit, machine here")
    parser.add_argument("--runs", type=int, default=5, help="timing runs per setting (>= 5)")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)
    ns = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
    eps0s = [1.0, 4.0] if args.quick else [1.0, 2.0, 4.0, 8.0]
    figures = [measure(n, e0, max(args.runs, 5), args.seed) for n in ns for e0 in eps0s]
    print(f"## Amplification by shuffling at δ = {DELTA:g}; GRR over k = {K}, Zipf(1.1)")
    print(format_table(HEADERS, [_row(m) for m in figures]))
    if args.json:
        params = {"quick": args.quick, "n": ns, "epsilon0": eps0s, "delta": DELTA, "k": K}
        params |= {"runs": max(args.runs, 5), "seed": args.seed}
        write_json(
            args.json, benchmark="shuffle", params=params, figures=figures, packages=PACKAGES
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
