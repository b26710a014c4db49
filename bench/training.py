"""Benchmark: DP-SGD epoch time per Opacus grad-sample mode vs non-private training.

    python -m bench.training [--quick] [--json PATH] [--threads N]
    python -m bench.training --digits [--quick]      # the accuracy example instead

Models (see BENCHMARKS.md: references measured in the same run):

- digits MLP 64→64→10 on scikit-learn's digits (1,797 rows), batch 256;
- a small CNN (2 conv layers, 8×8 digits images), batch 256;
- a tabular MLP 50→128→128→2 on 100,000 × 50 synthetic rows, batch 256 and 1024.

For each, the non-private reference (same model, same data, shuffled fixed
batches of the same size, plain SGD) and every grad-sample mode (hooks, ghost,
functorch, ew) through the module's own `build_private_step` with Poisson
sampling (DPDataLoader), per-sample clipping and noise.

Timed section: W training steps including batch loading (W = one epoch, capped at
`--max-steps`), repeated R times; epoch time = mean step time of a repetition ×
steps per epoch; figures are the median (min, max) over the R repetitions. Set-up
(model wrapping, data generation) is excluded.

Also reported: the mode the module chooses automatically — by rule, or (no rule
applies, e.g. Conv2d) by the module's timing probe, run R times to show how often
it picks what — its time relative to the fastest mode and the probe's cost, and
the module's own overhead in a full `train_private` run
(ledger reservation and settlement, noise calibration, step limit, per-epoch
accountant checks, artifact and receipt) as a share of its training-loop time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from decimal import Decimal
from importlib import metadata
from pathlib import Path
from typing import Any

MODES = ("hooks", "ghost", "functorch", "ew")


def _models() -> dict[str, Callable[[], Any]]:
    from torch import nn

    return {
        "digits-mlp": lambda: nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 10)),
        "digits-cnn": lambda: nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Linear(128, 10),
        ),
        "tabular-mlp": lambda: nn.Sequential(
            nn.Linear(50, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 2)
        ),
    }


def _data(name: str, rows: int) -> tuple[Any, Any]:
    import numpy as np
    import torch

    if name.startswith("digits"):
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
        if name == "digits-cnn":
            x = x.reshape(-1, 1, 8, 8)
    else:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(rows, 50))
        y = (x @ rng.normal(size=50) > 0).astype(int)
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.long)


def _summ(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def time_nonprivate(
    make: Callable[[], Any], x: Any, y: Any, batch: int, window: int, reps: int
) -> list[float]:
    """Epoch-time estimates (s) of plain SGD on shuffled fixed batches."""
    import torch
    from fedldp.aggregator.training.step import _BatchTensorDataset, _take_batch
    from torch import nn
    from torch.utils.data import DataLoader

    n = len(y)
    per_epoch = max(1, n // batch)
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    loader = DataLoader(
        _BatchTensorDataset(x, y), batch_size=batch, shuffle=True, collate_fn=_take_batch
    )
    out = []
    for _ in range(reps + 1):  # the first repetition warms up
        it = iter(loader)
        t0 = time.perf_counter()
        done = 0
        while done < window:
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
            done += 1
        out.append((time.perf_counter() - t0) / window * per_epoch)
    return out[1:]


def time_private(
    make: Callable[[], Any], x: Any, y: Any, batch: int, mode: str, window: int, reps: int
) -> list[float]:
    """Epoch-time estimates (s) of DP-SGD in `mode` through the module's build_private_step."""
    from fedldp.aggregator.training.engine import build_private_step, poisson_loader
    from fedldp.aggregator.training.randomness import StepRandomness

    n = len(y)
    q = batch / n
    per_epoch = int(1 / q)
    rand = StepRandomness()
    step = build_private_step(
        make(),
        mode=mode,
        expected_batch_size=batch,
        max_grad_norm=1.0,
        noise_multiplier=1.0,
        optimizer="sgd",
        learning_rate=0.1,
        momentum=0.9,
        noise_generator=rand.noise,
    )
    loader = poisson_loader(x, y, sample_rate=q, generator=rand.sampling)
    out = []
    for _ in range(reps + 1):
        it = iter(loader)
        t0 = time.perf_counter()
        done = 0
        while done < window:
            rand.reseed()
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(loader)
                continue
            step(xb, yb)
            done += 1
        out.append((time.perf_counter() - t0) / window * per_epoch)
    return out[1:]


def module_overhead(
    make: Callable[[], Any], x: Any, y: Any, batch: int, epochs: int, reps: int
) -> dict[str, Any]:
    """Overhead of a full train_private run (everything but the training loop) / loop time.

    For flat-input models (the MLPs); the loop time excludes the accountant checks.
    """
    from fedldp.aggregator.training.config import config_from_mapping
    from fedldp.aggregator.training.data import dataset_from_arrays
    from fedldp.aggregator.training.engine import train_private
    from fedldp.collector.ledger import open_ledger

    data = dataset_from_arrays(x.reshape(len(y), -1).numpy(), y.numpy())
    shares, overheads, loops = [], [], []
    parts: dict[str, list[float]] = {
        "ledger": [],
        "calibration+step limit": [],
        "interval checks+final eps": [],
        "data+files": [],
    }
    issue_shares: list[float] = []
    mode = ""
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{tmp}/ledger.db"
            ledger = open_ledger(url)
            ledger.set_central_cap(
                "bench", "bench", epsilon_cap=Decimal(8), delta_cap=Decimal("1e-5")
            )
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
                        "num_classes": int(y.max()) + 1,
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
            result = train_private(config, ledger=ledger, model=make(), load=lambda _c: data)
            ledger.close()
            mode = result.receipt["training"]["grad_sample_mode"]["mode"]
            shares.append(result.overhead_seconds / result.training_seconds)
            t = result.timings
            loop = result.training_seconds
            parts["ledger"].append((t["reserve"] + t["settle"]) / loop)
            parts["calibration+step limit"].append(t["plan"] / loop)
            parts["interval checks+final eps"].append((t["checks"] + t["final"]) / loop)
            parts["data+files"].append((t["load"] + t["write"]) / loop)
            # the issue's list: ledger, accountant checks, receipt (not the one-off planning)
            issue = t["reserve"] + t["settle"] + t["checks"] + t["final"] + t["write"]
            issue_shares.append(issue / loop)
            overheads.append(result.overhead_seconds)
            loops.append(result.training_seconds)
    return {
        "mode": mode,
        "epochs": epochs,
        "overhead_share": _summ(shares),
        "ledger_checks_receipt_share": _summ(issue_shares),
        "share_by_part": {k: _summ(v) for k, v in parts.items()},
        "overhead_seconds": _summ(overheads),
        "loop_seconds": _summ(loops),
    }


def _machine() -> dict[str, Any]:
    libs: dict[str, str | None] = {}
    for name in ("torch", "opacus", "numpy", "scikit-learn", "fedldp"):
        try:
            libs[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libs[name] = None
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "libraries": libs,
    }


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def run(quick: bool, reps: int, max_steps: int, threads: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    from fedldp.aggregator.training.engine import probe_grad_sample_mode
    from fedldp.aggregator.training.models import choose_grad_sample_mode

    cases = [("digits-mlp", 256), ("digits-cnn", 256), ("tabular-mlp", 256), ("tabular-mlp", 1024)]
    rows = 20_000 if quick else 100_000
    models = _models()
    results = []
    for name, batch in cases:
        x, y = _data(name, rows)
        n = len(y)
        window = min(int(n / batch), max_steps)
        make = models[name]
        base = time_nonprivate(make, x, y, batch, window, reps)
        entry: dict[str, Any] = {
            "model": name,
            "rows": n,
            "batch": batch,
            "steps_timed_per_rep": window,
            "nonprivate_epoch_s": _summ(base),
            "modes": {},
        }
        for mode in MODES:
            try:
                times = time_private(make, x, y, batch, mode, window, reps)
            except Exception as exc:  # a mode Opacus cannot run for this model: report it
                entry["modes"][mode] = {"error": f"{type(exc).__name__}: {str(exc)[:120]}"}
                continue
            ratios = [t / statistics.median(base) for t in times]
            entry["modes"][mode] = {"epoch_s": _summ(times), "ratio_to_nonprivate": _summ(ratios)}
        auto, reason = choose_grad_sample_mode(make())
        timed = {m: v["epoch_s"]["median"] for m, v in entry["modes"].items() if "epoch_s" in v}
        fastest = min(timed, key=lambda m: timed[m])
        choices, probe_s = [auto], []
        if auto == "hooks":  # no rule applies: train_private runs the timing probe
            choices = []
            for _ in range(reps):  # how reliable is one probe? run it reps times
                t0 = time.perf_counter()
                choice, _, _ = probe_grad_sample_mode(
                    make(),
                    feature_shape=tuple(x.shape[1:]),
                    num_classes=int(y.max()) + 1,
                    expected_batch_size=batch,
                    max_grad_norm=1.0,
                    optimizer="sgd",
                    learning_rate=0.1,
                    momentum=0.9,
                )
                probe_s.append(time.perf_counter() - t0)
                choices.append(choice)
        ratios = [timed[c] / timed[fastest] for c in choices]
        # ew and functorch fail on empty Poisson batches: auto never picks them
        safe = {m: t for m, t in timed.items() if m in ("hooks", "ghost")}
        fastest_safe = min(safe, key=lambda m: safe[m])
        entry["auto"] = {
            "mode": max(set(choices), key=choices.count),
            "choices": choices,
            "reason": reason + ("; timing probe" if probe_s else ""),
            "fastest": fastest,
            "auto_over_fastest": statistics.median(ratios),
            "auto_over_fastest_max": max(ratios),
            "fastest_eligible": fastest_safe,
            "auto_over_fastest_eligible": statistics.median(
                timed[c] / timed[fastest_safe] for c in choices
            ),
            "probe_seconds": _summ(probe_s) if probe_s else None,
            "probe_over_epoch": statistics.median(probe_s) / timed[fastest] if probe_s else None,
        }
        print(_row(entry), flush=True)
        results.append(entry)
    overhead = []
    for name, batch, epochs in (
        [("digits-mlp", 256, 5)] if quick else [("digits-mlp", 256, 20), ("tabular-mlp", 1024, 3)]
    ):
        x, y = _data(name, rows)
        o = module_overhead(models[name], x, y, batch, epochs, max(1, reps if not quick else 1))
        o.update({"model": name, "batch": batch, "rows": len(y)})
        overhead.append(o)
        print(
            f"module overhead {name} b={batch} {epochs} epochs ({o['mode']}): "
            f"{100 * o['overhead_share']['median']:.1f}% of loop time, "
            f"ledger+checks+receipt {100 * o['ledger_checks_receipt_share']['median']:.1f}% "
            f"(overhead {o['overhead_seconds']['median']:.2f}s, "
            f"loop {o['loop_seconds']['median']:.2f}s; "
            + ", ".join(f"{k} {100 * v['median']:.1f}%" for k, v in o["share_by_part"].items())
            + ")",
            flush=True,
        )
    return {
        "benchmark": "training",
        "date": datetime.now(timezone.utc).isoformat(),
        "commit": _commit(),
        "machine": _machine(),
        "params": {
            "quick": quick,
            "reps": reps,
            "max_steps": max_steps,
            "threads": threads,
            "tabular_rows": rows,
        },
        "epoch_times": results,
        "module_overhead": overhead,
    }


def _row(e: dict[str, Any]) -> str:
    parts = [
        f"{e['model']:<12} b={e['batch']:<5} non-private {e['nonprivate_epoch_s']['median']:.3f}s"
    ]
    for mode, v in e["modes"].items():
        if "epoch_s" in v:
            parts.append(f"{mode} {v['ratio_to_nonprivate']['median']:.2f}x")
        else:
            parts.append(f"{mode} n/a")
    a = e["auto"]
    parts.append(
        f"| auto={a['mode']} {a['choices']} fastest={a['fastest']} "
        f"auto/fastest={a['auto_over_fastest']:.2f} (max {a['auto_over_fastest_max']:.2f}; "
        f"vs fastest of hooks/ghost {a['auto_over_fastest_eligible']:.2f})"
    )
    if a["probe_seconds"]:
        parts.append(
            f"probe {a['probe_seconds']['median']:.2f}s = {a['probe_over_epoch']:.2f} epoch"
        )
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="small windows, 20k tabular rows (< 1 min)"
    )
    parser.add_argument(
        "--json", type=Path, help="write figures, params, commit, machine, date here"
    )
    parser.add_argument(
        "--reps", type=int, default=5, help="repetitions per figure (>= 5 for reports)"
    )
    parser.add_argument(
        "--max-steps", type=int, default=20, help="steps timed per repetition, at most"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--digits", action="store_true", help="run the digits accuracy example instead"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if args.digits:
        from fedldp.aggregator.training.examples import main as digits_main

        digits_main(
            [
                "--digits",
                *(["--quick"] if args.quick else []),
                *(["--json", str(args.json)] if args.json else []),
            ]
        )
        return
    reps = args.reps
    max_steps = args.max_steps
    if args.quick:
        reps, max_steps = min(reps, 5), min(max_steps, 6)
    result = run(args.quick, reps, max_steps, args.threads)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
