"""Benchmark: a DP-SGD job through the release service vs the training engine directly.

    python -m bench.release_service_training                  # 5,000 units, 5 pairs
    python -m bench.release_service_training --units 20000 --reps 7 --json out.json
    python -m bench.release_service_training --quick          # 500 units, 5 pairs

One table of --units privacy units (one record each: amount in [0, 100], city in
4 values; the label is the city's position, the feature the amount scaled to
[-1, 1]) is written twice: as a catalog dataset for the service, and already
encoded as a CSV for the engine. Each repetition runs, in alternating order,

* **engine**: `train_private` on the encoded CSV with its own SQLite ledger
  (what `fedldp train --config` does, less the CLI);
* **service**: an in-process release service (SQLite ledger, jobs folder) and a
  gRPC client that submits the same job, waits for it (GetTrainingJob with the
  server-side wait), and fetches the model: wall time as the analyst sees it
  (authentication, validation, the job record's fsyncs, the queue, reading and
  encoding the catalog dataset, the engine's own work, streaming the model).

Same model (MLP, one hidden layer of 32), ε = 2, δ = 1e-6, 3 epochs, expected
batch 64, PRV accountant, one torch thread. Reported: median seconds per arm
(min-max), the median of the per-pair ratios service / engine, and the median
of the per-pair differences (the service's overhead in seconds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

from bench._common import format_table, summarize, write_json

SECRET = b"t" * 32
CITIES = ("a", "b", "c", "d")
CATALOG = """
[datasets.bench]
csv = "bench.csv"
unit = "user_id"
contribution_bound = 1
training_rows = {units}
[datasets.bench.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.bench.columns.city]
type = "categorical"
domain = ["a", "b", "c", "d"]
[[datasets.bench.grants]]
analysts = ["analyst"]
purposes = ["bench"]

[training]
max_epochs = 10
max_steps = 100000
[training.models.mlp32]
hidden = [32]
"""
POLICY = """
version = 1
[[cap]]
dataset = "bench"
purpose = "bench"
epsilon = "1000000"
delta = "0.5"
"""
EPSILON, DELTA, EPOCHS, BATCH, LR, CLIP = "2", "0.000001", 3, 64, "0.5", "1"


def _write(folder: Path, units: int) -> None:
    """bench.csv (the catalog's) and encoded.csv (the engine's), same rows, same order."""
    rng = random.Random(0)
    raw = ["user_id,amount,city"]
    encoded = ["amount,label"]
    for i in range(units):
        amount = rng.uniform(0, 100)
        city = rng.randrange(len(CITIES))
        raw.append(f"u{i},{amount:.2f},{CITIES[city]}")
        encoded.append(f"{2 * float(f'{amount:.2f}') / 100 - 1!r},{city}")
    (folder / "bench.csv").write_text("\n".join(raw) + "\n")
    (folder / "encoded.csv").write_text("\n".join(encoded) + "\n")


def _engine_run(folder: Path, n: int, units: int) -> float:
    """One `train_private` run on its own ledger; wall seconds."""
    from fedldp.aggregator.training import config_from_mapping, train_private
    from fedldp.collector.ledger import open_ledger

    url = f"sqlite:///{folder / f'engine-{n}.db'}"
    with open_ledger(url) as ledger:
        ledger.set_central_cap(
            "bench", "bench", epsilon_cap=Decimal(1_000_000), delta_cap=Decimal("0.5")
        )
    config = config_from_mapping(
        {
            "budget": {
                "ledger": url,
                "subject": "bench",
                "purpose": "bench",
                "epsilon": EPSILON,
                "delta": DELTA,
            },
            "data": {
                "source": "csv",
                "path": str(folder / "encoded.csv"),
                "label": "label",
                "features": ["amount"],
                "num_classes": len(CITIES),
                "rows": units,
                "privacy_unit": "one user",
            },
            "model": {"hidden": [32]},
            "training": {
                "epochs": EPOCHS,
                "expected_batch_size": BATCH,
                "learning_rate": float(LR),
                "max_grad_norm": float(CLIP),
            },
            "output": {"dir": str(folder / f"engine-{n}")},
            "receipt": {"signing_key": str(folder / "receipts.key")},
        }
    )
    start = time.perf_counter()
    train_private(config)
    return time.perf_counter() - start


def _service_run(stub: Any, metadata: Any, n: int) -> float:
    """Submit, wait, fetch through gRPC; wall seconds as the analyst sees them."""
    from fedldp.v1 import release_pb2 as pb

    request = pb.SubmitTrainingRequest(
        dataset="bench",
        purpose="bench",
        epsilon=EPSILON,
        delta=DELTA,
        idempotency_key=f"bench-{n}",
        model="mlp32",
        label="city",
        features=["amount"],
        hyperparameters=pb.TrainingHyperparameters(
            epochs=EPOCHS, expected_batch_size=BATCH, learning_rate=LR, max_grad_norm=CLIP
        ),
    )
    start = time.perf_counter()
    job = stub.SubmitTraining(request, metadata=metadata)
    while job.state not in (pb.TRAINING_JOB_STATE_SUCCEEDED, pb.TRAINING_JOB_STATE_FAILED):
        job = stub.GetTrainingJob(
            pb.GetTrainingJobRequest(job_id=job.job_id, wait_seconds=30), metadata=metadata
        )
    if job.state != pb.TRAINING_JOB_STATE_SUCCEEDED:
        raise RuntimeError(f"the job failed: {job.error_code}: {job.error_message}")
    size = sum(
        len(c.data)
        for c in stub.FetchModel(pb.FetchModelRequest(job_id=job.job_id), metadata=metadata)
    )
    elapsed = time.perf_counter() - start
    assert size == job.model_size
    return elapsed


def run(units: int, reps: int) -> dict[str, Any]:
    """Interleaved pairs (engine, service), alternating which goes first."""
    import grpc
    import torch
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from fedldp.aggregator.central.signing import canonical_json, trusted_keys
    from fedldp.aggregator.service.catalog import load_catalog
    from fedldp.aggregator.service.policy import load_release_policy, sign_release_policy
    from fedldp.aggregator.service.server import ServiceConfig, start_release_service
    from fedldp.aggregator.service.training import TrainingSetup
    from fedldp.authoring import write_private_key
    from fedldp.collector.auth import (
        RELEASE_SERVICE_AUDIENCE,
        Authenticator,
        TokenAuthority,
        bearer_metadata,
    )
    from fedldp.v1 import release_pb2_grpc

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", module="opacus")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _write(folder, units)
        (folder / "catalog.toml").write_text(CATALOG.format(units=units))
        (folder / "policy.toml").write_text(POLICY)
        policy_key = Ed25519PrivateKey.generate()
        (folder / "policy.json").write_bytes(
            canonical_json(sign_release_policy(folder / "policy.toml", policy_key))
        )
        key = Ed25519PrivateKey.generate()
        write_private_key(key, folder / "receipts.key")
        svc = start_release_service(
            ServiceConfig(
                catalog=load_catalog(folder / "catalog.toml"),
                policy=load_release_policy(
                    folder / "policy.json", trusted_keys([policy_key.public_key()])
                ),
                ledger_url=f"sqlite:///{folder / 'service.db'}",
                signing_key=key,
                authenticator=Authenticator(
                    TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE)
                ),
                training=TrainingSetup(
                    jobs_dir=folder / "jobs", signing_key_path=folder / "receipts.key"
                ),
            )
        )
        token = TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            "analyst", expires_at=int(time.time()) + 86400
        )
        engine: list[float] = []
        service: list[float] = []
        try:
            with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as channel:
                stub = release_pb2_grpc.ReleaseServiceStub(channel)
                metadata = bearer_metadata(token)
                _service_run(stub, metadata, -1)  # warm-up: imports, first-use costs
                _engine_run(folder, -1, units)
                for n in range(reps):
                    if n % 2 == 0:
                        engine.append(_engine_run(folder, n, units))
                        service.append(_service_run(stub, metadata, n))
                    else:
                        service.append(_service_run(stub, metadata, n))
                        engine.append(_engine_run(folder, n, units))
        finally:
            svc.stop(60)
    ratios = [s / e for s, e in zip(service, engine, strict=True)]
    diffs = [s - e for s, e in zip(service, engine, strict=True)]
    return {
        "engine_seconds": summarize(engine).__dict__,
        "service_seconds": summarize(service).__dict__,
        "ratio_median": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "overhead_seconds_median": statistics.median(diffs),
        "samples": {"engine": engine, "service": service},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--units", type=int, default=5000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="500 units (under a minute)")
    args = parser.parse_args(argv)
    if args.quick:
        args.units = 500
    figures = run(args.units, args.reps)
    e, s = figures["engine_seconds"], figures["service_seconds"]
    print(
        format_table(
            ["path", "median s", "min s", "max s"],
            [
                [
                    "engine (train_private)",
                    f"{e['median']:.2f}",
                    f"{e['min']:.2f}",
                    f"{e['max']:.2f}",
                ],
                [
                    "service (submit..fetch)",
                    f"{s['median']:.2f}",
                    f"{s['min']:.2f}",
                    f"{s['max']:.2f}",
                ],
            ],
        )
    )
    print(
        f"service / engine: {figures['ratio_median']:.2f} (per-pair median; "
        f"{figures['ratio_min']:.2f}-{figures['ratio_max']:.2f}); overhead "
        f"{figures['overhead_seconds_median']:.2f} s per job"
    )
    if args.json:
        write_json(
            args.json,
            benchmark="release_service_training",
            params={"units": args.units, "reps": args.reps, "epochs": EPOCHS, "batch": BATCH},
            figures=figures,
            packages=("torch", "opacus", "grpcio"),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
