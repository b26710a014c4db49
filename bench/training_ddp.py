"""Benchmark: wall time of `train_private` on 1 vs 2 processes (`fedldp train --nproc`).

    python -m bench.training_ddp [--rows N] [--batch B] [--epochs E] [--reps R] [--json PATH]
    python -m bench.training_ddp --quick     # 2,000 rows, one repetition

A tabular MLP 50→128→128→2 (ghost clipping, chosen by rule) on N synthetic rows
(default 20,000), expected batch B (default 256), E epochs (default 1), ε = 8, δ = 1e-5, a
real SQLite ledger in a temporary folder. Configurations, interleaved R times
(default 2): one process with 1 torch thread, one process with 2 threads, two
processes with 1 thread each. Reported per configuration (median, min–max over
the R runs): the whole run's wall time, rank 0's training-loop time, and the
rest (for two processes mostly starting the worker and its imports of torch and
Opacus, plus sending it the rows). Timings only: no test asserts them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

CONFIGS = (("1 process, 1 thread", 1, 1), ("1 process, 2 threads", 1, 2), ("2 processes", 2, 2))


def _model() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.Linear(50, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
    )


def _data(rows: int) -> Any:
    import numpy as np
    from fedldp.aggregator.training.data import dataset_from_arrays

    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 50))
    y = (x[:, :5].sum(axis=1) + 0.5 * rng.normal(size=rows) > 0).astype(np.int64)
    return dataset_from_arrays(x, y)


def one_run(data: Any, nproc: int, threads: int, epochs: int, batch: int) -> dict[str, float]:
    """One full train_private run; its wall time, loop time and the rest, in seconds."""
    import torch
    from fedldp.aggregator.training.config import config_from_mapping
    from fedldp.aggregator.training.engine import train_private
    from fedldp.collector.ledger import open_ledger

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/ledger.db"
        ledger = open_ledger(url)
        ledger.set_central_cap("bench", "bench", epsilon_cap=Decimal(8), delta_cap=Decimal("1e-5"))
        config = config_from_mapping(
            {
                "budget": {
                    "ledger": url,
                    "subject": "bench",
                    "purpose": "bench",
                    "epsilon": "8",
                    "delta": "0.00001",
                },
                "data": {
                    "source": "csv",
                    "path": f"{tmp}/unused.csv",
                    "label": "label",
                    "features": list(data.feature_names),
                    "num_classes": 2,
                    "rows": data.n_rows,
                    "privacy_unit": "row",
                },
                "training": {
                    "epochs": epochs,
                    "max_grad_norm": 1.0,
                    "learning_rate": 0.1,
                    "expected_batch_size": batch,
                },
                "output": {"dir": f"{tmp}/out"},
            }
        )
        t0 = time.perf_counter()
        result = train_private(
            config, ledger=ledger, model=_model(), load=lambda _c: data, nproc=nproc
        )
        wall = time.perf_counter() - t0
        ledger.close()
    return {"wall": wall, "loop": result.training_seconds, "rest": wall - result.training_seconds}


def _summ(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=256, help="expected batch size")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--quick", action="store_true", help="2,000 rows, one repetition (under a minute)"
    )
    args = parser.parse_args()
    if args.quick:
        args.rows, args.reps = 2_000, 1
    warnings.filterwarnings("ignore")
    data = _data(args.rows)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in CONFIGS}
    for _ in range(args.reps):
        for name, nproc, threads in CONFIGS:
            runs[name].append(one_run(data, nproc, threads, args.epochs, args.batch))
    figures = {
        name: {k: _summ([r[k] for r in rs]) for k in ("wall", "loop", "rest")}
        for name, rs in runs.items()
    }
    out = {
        "rows": args.rows,
        "epochs": args.epochs,
        "batch": args.batch,
        "reps": args.reps,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "python": platform.python_version(),
        "figures": figures,
    }
    print("| configuration | wall s | training loop s | rest s |")
    print("|---|---|---|---|")
    for name, f in figures.items():
        cells = [
            f"{f[k]['median']:.1f} ({f[k]['min']:.1f}–{f[k]['max']:.1f})"
            for k in ("wall", "loop", "rest")
        ]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
