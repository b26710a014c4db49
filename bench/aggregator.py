"""Benchmark of the aggregator: report time over stored statistics, recompute, peers, accuracy.

    python -m bench.aggregator            # 1M + 10M stored reports, 200k raw rows, accuracy n = 1M
    python -m bench.aggregator --quick    # same sizes for report time, smaller rest (< 1 minute)
    python -m bench.aggregator --json out.json

Sections (Zipf(1.1) values over [0, k) throughout, fixed seeds):

* report time: a SQLite ledger file whose statistics table holds the partial statistics of
  N in {1M, 10M} randomized reports (GRR k = 256 and OLH k = 4096, eps = 1), split over 8
  collector shards. The partial statistics are built with the mechanisms' batch paths
  (`perturb_batch` + `accumulate_batch`) and written straight into the statistics table
  (the raw report rows are not stored at this size). Timed: `report_from_ledgers` = read the
  shard rows, decode, merge, estimate with exact variance, CIs, Norm-Sub; median over --runs.
  Reference: plain numpy computing the same estimate from an in-memory count vector.
* incremental vs full recompute: R reports really submitted through `Ledger.submit`
  (raw rows + incremental statistics in the same transactions); the report from the
  statistics versus `Ledger.recompute_statistics` from the raw rows + estimate. Checked equal.
* peers on the same reports: our estimate from the same GRR outputs (k = 256) versus
  multi-freq-ldpy's `GRR_Aggregator_MI` and pure-ldp's `DEServer` (both per-report Python
  loops, measured on --peer-n reports). For OLH k = 4096 the peers use their own hash
  families (xxhash), so they run on the same values and seed, not the same reports, at
  --peer-olh-n reports (their aggregation is O(n k) hashing).
* accuracy at k = 4096 (GRR eps = 4, top value 0.16): empirical MSE / closed-form variance
  of the raw estimate (1.0 = theory), and the error of Norm-Sub, projection, base-cut and
  multi-freq-ldpy's default (clip and renormalize) on the same reports, with the head value.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from fedldp.aggregator.consistency import apply_consistency, clip_and_normalize
from fedldp.aggregator.estimation import FrequencyReport, frequency_report
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.authoring import Authority
from fedldp.client.policy import VerifiedPolicy, verify_policy
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.ledger.schema import statistics
from fedldp.collector.ledger.store import CheckedReport
from fedldp.collector.wire import content_digest

from bench._common import (
    Timing,
    fmt_float,
    format_table,
    time_runs,
    write_json,
)

PACKAGES = ["numpy", "sqlalchemy", "pure-ldp", "multi-freq-ldpy", "fedldp"]
SHARDS = 8
NOW = int(time.time())
WINDOW = 86400


def zipf(k: int, s: float = 1.1) -> np.ndarray:
    """Zipf(s) probabilities over k values."""
    w = 1.0 / np.arange(1, k + 1) ** s
    return np.asarray(w / w.sum())


def fixed_values(k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n values whose histogram is exactly round(n * Zipf(1.1)), shuffled."""
    truth = zipf(k)
    scaled = truth * n
    counts = np.floor(scaled).astype(np.int64)
    counts[np.argsort(counts - scaled)[: n - counts.sum()]] += 1
    values = np.repeat(np.arange(k), counts)
    rng.shuffle(values)
    return values


class Setup:
    """An authority and verified policies for the benchmark."""

    def __init__(self) -> None:
        self.authority = Authority.generate(now=NOW - 3600)

    def policy(self, policy_id: str, mechanism: str, k: int, epsilon: str) -> VerifiedPolicy:
        pol = self.authority.categorical_policy(
            policy_id=policy_id,
            metric=f"bench.{policy_id}",
            labels=[f"v{i}" for i in range(k)],
            epsilon=epsilon,
            epsilon_cap="1000000000",
            window_seconds=WINDOW,
            now=NOW - 60,
            mechanism=mechanism,
            min_reports=1,
        )
        return verify_policy(self.authority.sign(pol), self.authority.trust_store(now=NOW), now=NOW)


def fill_statistics(ledger: Ledger, policy: VerifiedPolicy, n: int, seed: int) -> float:
    """Write SHARDS partial statistics totalling n randomized reports; returns build seconds."""
    mech = policy.mechanism
    rng = np.random.default_rng(seed)
    k = len(policy.labels or ())
    start = time.perf_counter()
    rows = []
    window = NOW - NOW % WINDOW
    chunk = 1_000_000
    for shard in range(SHARDS):
        stat = mech.new_statistic()
        size = n // SHARDS + (1 if shard < n % SHARDS else 0)
        done = 0
        while done < size:
            m = min(chunk, size - done)
            values = rng.choice(k, size=m, p=zipf(k))
            mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
            done += m
        rows.append(
            {
                "policy_id": policy.policy_id,
                "policy_version": policy.version,
                "window_start": window,
                "shard": f"collector-{shard}",
                "n": size,
                "statistic_json": mech.statistic_to_json(stat),
                "updated_at": NOW,
            }
        )
    ledger.transaction(lambda conn: conn.execute(sa.insert(statistics), rows))
    return time.perf_counter() - start


def numpy_reference(policy: VerifiedPolicy, n: int) -> Callable[[], Any]:
    """Plain numpy: GRR-style debias + variance from an in-memory count vector."""
    k = len(policy.labels or ())
    counts = np.random.default_rng(0).multinomial(n, np.full(k, 1.0 / k)).astype(np.float64)
    p, q = 0.6, 0.4 / (k - 1)

    def run() -> Any:
        f = (counts / n - q) / (p - q)
        var = q * (1 - q) / (n * (p - q) ** 2) + np.clip(f, 0, 1) * (1 - p - q) / (n * (p - q))
        return f, np.sqrt(var)

    return run


def bench_report_time(setup: Setup, sizes: list[int], runs: int, tmp: Path) -> list[dict[str, Any]]:
    out = []
    for mechanism, k in (("grr", 256), ("olh", 4096)):
        for n in sizes:
            policy = setup.policy(f"rt_{mechanism}_{n}", mechanism, k, "1")
            ledger = open_ledger(f"sqlite:///{tmp / f'rt_{mechanism}_{n}.db'}")
            try:
                build = fill_statistics(ledger, policy, n, seed=n + k)

                def report(ledger: Ledger = ledger, policy: VerifiedPolicy = policy) -> Any:
                    return report_from_ledgers([("ledger", ledger)], policy, consistency="norm-sub")

                timing, results = time_runs(report, runs)
                assert results[0].n == n
                ref, _ = time_runs(numpy_reference(policy, n), runs)
            finally:
                ledger.close()
            out.append(
                {
                    "mechanism": mechanism,
                    "k": k,
                    "stored_reports": n,
                    "shards": SHARDS,
                    "report_s": timing,
                    "numpy_estimate_s": ref,
                    "build_s": build,
                }
            )
    return out


def submit_reports(ledger: Ledger, policy: VerifiedPolicy, n: int, seed: int) -> None:
    """n real reports through Ledger.submit (1000 subjects, batches of 500)."""
    mech = policy.mechanism
    rng = np.random.default_rng(seed)
    k = len(policy.labels or ())
    values = rng.choice(k, size=n, p=zipf(k))
    import random as _random

    r = _random.Random(seed)
    coarse = NOW - NOW % 3600
    batch: list[CheckedReport] = []
    for i, v in enumerate(values):
        out = mech.perturb(int(v), rng=r)
        digest = content_digest(
            policy_id=policy.policy_id,
            policy_version=policy.version,
            policy_digest=policy.digest,
            coarse_time=coarse,
            output=out,
        )
        batch.append(CheckedReport(r.randbytes(16), policy, out, digest, coarse))
        if len(batch) == 500 or i == n - 1:
            ledger.submit(f"user{i % 1000}", batch, now=NOW)
            batch = []


def bench_recompute(setup: Setup, n: int, runs: int, tmp: Path) -> dict[str, Any]:
    policy = setup.policy("recompute", "grr", 256, "1")
    ledger = open_ledger(f"sqlite:///{tmp / 'recompute.db'}")
    try:
        start = time.perf_counter()
        submit_reports(ledger, policy, n, seed=5)
        ingest = time.perf_counter() - start
        mech = policy.mechanism

        def incremental() -> Any:
            rep = report_from_ledgers([("l", ledger)], policy)
            assert isinstance(rep, FrequencyReport)
            return rep.estimates

        def full() -> Any:
            stat = ledger.recompute_statistics(policy)
            return frequency_report(mech, stat, list(policy.labels or ())).estimates

        t_inc, r_inc = time_runs(incremental, runs)
        t_full, r_full = time_runs(full, max(3, runs // 2))
        equal = r_inc[0] == r_full[0]
    finally:
        ledger.close()
    return {
        "raw_reports": n,
        "ingest_s": ingest,
        "incremental_s": t_inc,
        "full_recompute_s": t_full,
        "speedup": t_full.median / t_inc.median,
        "equal": equal,
    }


def bench_peers(n: int, olh_n: int, runs: int) -> list[dict[str, Any]]:
    from fedldp.client.mechanisms import create

    out: list[dict[str, Any]] = []
    rng = np.random.default_rng(11)
    k = 256
    mech = create("grr", Decimal(1), k)
    values = fixed_values(k, n, rng)
    reports = mech.perturb_batch(values, rng)
    report_list = reports.tolist()

    def ours() -> Any:
        stat = mech.new_statistic()
        mech.accumulate_batch(stat, reports)
        return mech.estimate(stat).values

    t_ours, r_ours = time_runs(ours, runs)
    row: dict[str, Any] = {"mechanism": "grr", "k": k, "reports": n, "fedldp_s": t_ours}
    try:
        from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Aggregator_MI

        t_mfl, _ = time_runs(lambda: GRR_Aggregator_MI(report_list, k, 1.0), max(3, runs // 2))
        row["multi_freq_ldpy_s"] = t_mfl
    except ImportError:
        row["multi_freq_ldpy_s"] = None
    try:
        from pure_ldp.frequency_oracles.direct_encoding import DEServer

        def pure() -> Any:
            server = DEServer(1.0, k, index_mapper=lambda x: x)
            server.aggregate_all(report_list)
            return server.estimate_all(range(k), suppress_warnings=True) / n

        t_pure, r_pure = time_runs(pure, max(3, runs // 2))
        row["pure_ldp_s"] = t_pure
        row["pure_ldp_max_abs_diff"] = float(np.max(np.abs(r_pure[0] - r_ours[0])))
    except ImportError:
        row["pure_ldp_s"] = None
    out.append(row)

    # OLH k = 4096: peers hash with xxhash (their own family), so same values, not same reports.
    k = 4096
    olh = create("olh", Decimal(1), k)
    values = fixed_values(k, olh_n, np.random.default_rng(12))
    olh_reports = olh.perturb_batch(values, np.random.default_rng(13))

    def ours_olh() -> Any:
        stat = olh.new_statistic()
        olh.accumulate_batch(stat, olh_reports)
        return olh.estimate(stat).values

    row = {"mechanism": "olh", "k": k, "reports": olh_n, "fedldp_s": time_runs(ours_olh, runs)[0]}
    try:
        from multi_freq_ldpy.pure_frequency_oracles import LH as mfl_lh  # noqa: N811

        np.random.seed(13)
        peer_reports = [mfl_lh.LH_Client(int(v), k, 1.0) for v in values]
        row["multi_freq_ldpy_s"] = time_runs(
            lambda: mfl_lh.LH_Aggregator_MI(peer_reports, k, 1.0), 1
        )[0]
    except ImportError:
        row["multi_freq_ldpy_s"] = None
    try:
        from pure_ldp.frequency_oracles.local_hashing import LHClient, LHServer

        client = LHClient(1.0, k, use_olh=True, index_mapper=lambda x: x)
        priv = [client.privatise(int(v)) for v in values]

        def pure_olh() -> Any:
            server = LHServer(1.0, k, use_olh=True, index_mapper=lambda x: x)
            server.aggregate_all(priv)
            return server.estimate_all(range(k), suppress_warnings=True)

        row["pure_ldp_s"] = time_runs(pure_olh, 1)[0]
    except (ImportError, TypeError, ValueError) as exc:
        row["pure_ldp_s"] = None
        row["pure_ldp_note"] = f"{type(exc).__name__}: {exc}"
    out.append(row)
    return out


def bench_accuracy(n: int, reps: int) -> dict[str, Any]:
    from fedldp.client.mechanisms.grr import GRR

    k = 4096
    mech = GRR(Decimal(4), k)
    rng = np.random.default_rng(21)
    values = fixed_values(k, n, rng)
    exact = np.bincount(values, minlength=k) / n
    theory = float(np.mean(mech.variance(n, exact)))
    methods = ["raw", "norm-sub", "project", "base-cut", "multi-freq-ldpy default"]
    sq = {m: 0.0 for m in methods}
    head = {m: [] for m in methods}  # type: dict[str, list[float]]
    for _ in range(reps):
        stat = mech.new_statistic()
        mech.accumulate_batch(stat, mech.perturb_batch(values, rng))
        est = mech.estimate(stat)
        se = np.sqrt(est.variances)
        outs = {
            "raw": est.values,
            "norm-sub": apply_consistency("norm-sub", est.values, se),
            "project": apply_consistency("project", est.values, se),
            "base-cut": apply_consistency("base-cut", est.values, se),
            "multi-freq-ldpy default": _mfl_default(stat.counts, n, mech),
        }
        for m, f in outs.items():
            sq[m] += float(np.mean((f - exact) ** 2))
            head[m].append(float(f[0]))
    return {
        "k": k,
        "epsilon": 4,
        "reports": n,
        "reps": reps,
        "true_head": float(exact[0]),
        "closed_form_variance": theory,
        "methods": {
            m: {
                "mse": sq[m] / reps,
                "mse_over_variance": sq[m] / reps / theory,
                "head_median": float(np.median(head[m])),
            }
            for m in methods
        },
    }


def _mfl_default(counts: list[int], n: int, mech: Any) -> np.ndarray:
    """multi-freq-ldpy's MI estimator (clip + renormalize) on the same counts, if installed."""
    try:
        from multi_freq_ldpy.estimators.Histogram_estimator import MI

        return np.asarray(MI(np.asarray(counts, dtype=np.float64), n, mech.p, mech.q))
    except ImportError:
        raw = (np.asarray(counts) / n - mech.q) / (mech.p - mech.q)
        return clip_and_normalize(raw)


def _t(t: Timing | None, scale: float = 1.0, unit: str = "s") -> str:
    if t is None:
        return "-"
    lo, hi = fmt_float(t.min * scale), fmt_float(t.max * scale)
    return f"{fmt_float(t.median * scale)} {unit} [{lo}-{hi}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.aggregator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, < 1 minute")
    parser.add_argument("--runs", type=int, default=None, help="repetitions per timing (>= 5)")
    parser.add_argument("--json", type=Path, help="write figures, params, commit, machine here")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 9)
    params = {
        "quick": args.quick,
        "runs": runs,
        "shards": SHARDS,
        "report_sizes": [1_000_000, 10_000_000],
        "raw_reports": 10_000 if args.quick else 200_000,
        "peer_n": 100_000 if args.quick else 1_000_000,
        "peer_olh_n": 300 if args.quick else 2_000,
        "accuracy_n": 300_000 if args.quick else 1_000_000,
        "accuracy_reps": 5 if args.quick else 20,
    }
    setup = Setup()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        figures["report_time"] = bench_report_time(setup, params["report_sizes"], runs, tmp)
        print("## Report time over stored statistics (8 shards; Norm-Sub; median [min-max])")
        print(
            format_table(
                ["mechanism", "k", "stored reports", "report", "numpy estimate (ref)"],
                [
                    [
                        r["mechanism"],
                        r["k"],
                        f"{r['stored_reports']:,}",
                        _t(r["report_s"], 1e3, "ms"),
                        _t(r["numpy_estimate_s"], 1e3, "ms"),
                    ]
                    for r in figures["report_time"]
                ],
            )
        )
        figures["recompute"] = rc = bench_recompute(setup, params["raw_reports"], runs, tmp)
    print(f"\n## Incremental vs full recompute ({rc['raw_reports']:,} raw report rows, GRR k=256)")
    print(
        format_table(
            ["incremental report", "full recompute + estimate", "speedup", "equal"],
            [
                [
                    _t(rc["incremental_s"], 1e3, "ms"),
                    _t(rc["full_recompute_s"], 1e3, "ms"),
                    f"{rc['speedup']:.0f}x",
                    rc["equal"],
                ]
            ],
        )
    )
    figures["peers"] = bench_peers(params["peer_n"], params["peer_olh_n"], runs)
    print("\n## Estimation from raw reports: fedldp vs peers (eps = 1)")
    print(
        format_table(
            ["mechanism", "k", "reports", "fedldp", "multi-freq-ldpy", "pure-ldp"],
            [
                [
                    r["mechanism"],
                    r["k"],
                    f"{r['reports']:,}",
                    _t(r["fedldp_s"], 1e3, "ms"),
                    _t(r.get("multi_freq_ldpy_s"), 1e3, "ms"),
                    _t(r.get("pure_ldp_s"), 1e3, "ms"),
                ]
                for r in figures["peers"]
            ],
        )
    )
    figures["accuracy"] = acc = bench_accuracy(params["accuracy_n"], params["accuracy_reps"])
    print(
        f"\n## Accuracy at k=4096, GRR eps=4, n={acc['reports']:,}, {acc['reps']} reps "
        f"(true head {acc['true_head']:.4f})"
    )
    print(
        format_table(
            ["estimate", "MSE", "MSE / closed-form variance", "head (median)"],
            [
                [
                    m,
                    fmt_float(v["mse"]),
                    fmt_float(v["mse_over_variance"]),
                    f"{v['head_median']:.4f}",
                ]
                for m, v in acc["methods"].items()
            ],
        )
    )
    if args.json:
        write_json(
            args.json, benchmark="aggregator", params=params, figures=figures, packages=PACKAGES
        )
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
