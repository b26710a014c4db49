"""`fedldp demo --release-service`: the trusted release service on a small generated dataset.

After the LDP demo, `run_release_demo` plays both roles of docs/release-service.md
in one process, in a sub-folder `release-service/` of the demo's output:

* the operator: a consolidated per-person table (CSV, 2,000 records of 1,000
  people, at most 2 each: amount in [0, 100], city, mostly set by the amount), a
  catalog granting the analyst "demo-analyst" the purpose "demo-report" (declared
  for training: `training_rows`, a `[training]` zoo with one tiny MLP), a
  release policy signed with a fresh release-policy key (cap ε = 2, δ = 1e-5), a
  receipt key, a token secret, and the service on 127.0.0.1 (random port, its own
  SQLite ledger, training jobs in `jobs/`);
* the analyst: one count and one mean (ε = 0.25 each, Laplace) over gRPC with
  a bearer token, each receipt written to a file and verified against the
  ledger and the receipt key (`fedldp verify release` does the same); then one
  DP-SGD job (ε = 1, δ = 1e-6: the tiny MLP predicts the city from the amount,
  2 epochs at q = 0.1, 20 steps), its model fetched, its receipt verified as
  `fedldp verify training` does, and its accuracy measured on 1,000 fresh
  generated people (the analyst never sees the service's rows). Without torch
  and Opacus (the `train` extra) the job is skipped, saying so.

`release_html` renders the results (noised value, noise standard deviation,
95 % interval, reservation, receipt, verification; the job's status, spend,
steps, σ, accuracy, receipt check and model digest) as a section of the HTML
report. The generated data are synthetic; the simulation seed, when given,
makes them reproducible, while the release noise always comes from the OS CSPRNG.
"""

from __future__ import annotations

import csv
import html
import importlib.util
import random
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ANALYST = "demo-analyst"
PURPOSE = "demo-report"
DATASET = "purchases"
PEOPLE = 1000
RECORDS_PER_PERSON = 2
CITIES = ("lyon", "nice", "paris")
#: The DP-SGD job: 2 epochs at q = 100 / 1000 = 0.1, so 2 x 1/q = 20 steps.
TRAIN_EPSILON, TRAIN_DELTA, TRAIN_EPOCHS, TRAIN_BATCH = "1", "0.000001", 2, 100
TRAIN_SKIPPED = (
    "training job skipped: torch and Opacus are not installed (pip install 'fedldp[train]')"
)

_CATALOG = f"""
[datasets.{DATASET}]
csv = "{DATASET}.csv"
unit = "person_id"
contribution_bound = {RECORDS_PER_PERSON}
training_rows = {PEOPLE}
[datasets.{DATASET}.columns.amount]
type = "numeric"
lower = "0"
upper = "100"
[datasets.{DATASET}.columns.city]
type = "categorical"
domain = ["lyon", "nice", "paris"]
[[datasets.{DATASET}.grants]]
analysts = ["{ANALYST}"]
purposes = ["{PURPOSE}"]
[training]
max_epochs = {TRAIN_EPOCHS}
max_steps = 20
max_expected_batch_size = {TRAIN_BATCH}
[training.models.tiny]
hidden = [8]
"""
_POLICY = f"""
version = 1
[[cap]]
dataset = "{DATASET}"
purpose = "{PURPOSE}"
epsilon = "2"
delta = "0.00001"
"""


@dataclass(frozen=True)
class DemoRelease:
    """One release as the analyst received it, and whether its receipt verified."""

    kind: str
    value: str
    noise_stddev: float
    lower: str
    upper: str
    confidence: str
    reservation_id: str
    receipt: Path
    verified: bool


@dataclass(frozen=True)
class DemoTraining:
    """The DP-SGD job as the analyst received it, and whether its receipt verified."""

    state: str
    epsilon_spent: str
    delta_spent: str
    steps: int
    noise_multiplier: float | None
    accuracy: float | None
    receipt: Path | None
    verified: bool
    model_sha256: str
    error: str


@dataclass(frozen=True)
class DemoResults:
    """The releases, and the training job (or why it was skipped)."""

    releases: list[DemoRelease]
    training: DemoTraining | str


def _person(rng: random.Random) -> tuple[float, str]:
    """One generated record: an amount, and a city set by the amount 80 % of the time."""
    amount = min(100.0, rng.expovariate(1 / 30))
    city = CITIES[min(2, int(amount // 20))] if rng.random() < 0.8 else rng.choice(CITIES)
    return amount, city


def _write_dataset(path: Path, rng: random.Random) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["person_id", "amount", "city"])
        for person in range(PEOPLE):
            for _ in range(RECORDS_PER_PERSON):
                amount, city = _person(rng)
                writer.writerow([f"p{person}", f"{amount:.2f}", city])


def have_train_extra() -> bool:
    """Whether torch and Opacus (the `train` extra) are installed."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "opacus"))


def release_ledger_url(out: Path) -> str:
    """The URL of the release service's own ledger in the demo's output folder `out`."""
    return f"sqlite:///{(out / 'release-service' / 'release-ledger.db').resolve()}"


def run_release_demo(out: Path, seed: int | None) -> DemoResults:
    """Generate, register, serve, ask a count and a mean, train, verify (module docstring)."""
    import grpc
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from fedldp.aggregator.central.receipts import verify_release_receipt
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
    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    folder = out / "release-service"
    folder.mkdir()
    rng = random.Random(seed) if seed is not None else random.SystemRandom()
    _write_dataset(folder / f"{DATASET}.csv", rng)
    (folder / "catalog.toml").write_text(_CATALOG, encoding="utf-8")
    (folder / "release-policy.toml").write_text(_POLICY, encoding="utf-8")
    policy_key, receipt_key = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    signed = canonical_json(sign_release_policy(folder / "release-policy.toml", policy_key))
    (folder / "release-policy.json").write_bytes(signed)
    write_private_key(receipt_key, folder / "receipt.key")
    secret = secrets.token_bytes(32)
    train = have_train_extra()
    ledger_url = release_ledger_url(out)
    running = start_release_service(
        ServiceConfig(
            catalog=load_catalog(folder / "catalog.toml"),
            policy=load_release_policy(
                folder / "release-policy.json", trusted_keys([policy_key.public_key()])
            ),
            ledger_url=ledger_url,
            signing_key=receipt_key,
            authenticator=Authenticator(TokenAuthority(secret, audience=RELEASE_SERVICE_AUDIENCE)),
            listen="127.0.0.1:0",
            max_workers=2,
            training=TrainingSetup(folder / "jobs", folder / "receipt.key") if train else None,
        )
    )
    token = TokenAuthority(secret, audience=RELEASE_SERVICE_AUDIENCE).mint(
        ANALYST, expires_at=int(time.time()) + 600
    )
    queries: dict[str, dict[str, Any]] = {
        "count": {"count": pb.CountQuery()},
        "mean": {"mean": pb.MeanQuery(column="amount")},
    }
    results = []
    training: DemoTraining | str = TRAIN_SKIPPED
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = release_pb2_grpc.ReleaseServiceStub(channel)
            for kind, query in queries.items():
                reply = stub.Release(
                    pb.ReleaseRequest(
                        dataset=DATASET,
                        purpose=PURPOSE,
                        epsilon="0.25",
                        delta="0",
                        mechanism=pb.NOISE_MECHANISM_LAPLACE,
                        idempotency_key=f"demo-{kind}",
                        **query,
                    ),
                    metadata=bearer_metadata(token),
                )
                receipt = folder / f"{kind}.receipt.json"
                receipt.write_bytes(reply.receipt)
                check = verify_release_receipt(
                    receipt, trusted=trusted_keys([receipt_key.public_key()]), ledger=running.ledger
                )
                (value,) = reply.values
                results.append(
                    DemoRelease(
                        kind,
                        value.value,
                        value.error.noise_stddev,
                        value.error.lower,
                        value.error.upper,
                        value.error.confidence,
                        reply.reservation_id,
                        receipt,
                        check.ok,
                    )
                )
            if train:
                training = _train(stub, bearer_metadata(token), folder, receipt_key, running, rng)
    finally:
        running.stop(5)
    return DemoResults(results, training)


def _train(
    stub: Any,
    metadata: Any,
    folder: Path,
    receipt_key: Any,
    running: Any,
    rng: random.Random,
) -> DemoTraining:
    """Submit the DP-SGD job, wait for it, fetch its model, verify its receipt."""
    from fedldp.aggregator.central.signing import trusted_keys
    from fedldp.aggregator.training.receipt import load_receipt, verify_receipt
    from fedldp.v1 import release_pb2 as pb

    job = stub.SubmitTraining(
        pb.SubmitTrainingRequest(
            dataset=DATASET,
            purpose=PURPOSE,
            epsilon=TRAIN_EPSILON,
            delta=TRAIN_DELTA,
            idempotency_key="demo-training",
            model="tiny",
            label="city",
            features=["amount"],
            hyperparameters=pb.TrainingHyperparameters(
                epochs=TRAIN_EPOCHS,
                expected_batch_size=TRAIN_BATCH,
                learning_rate="0.5",
                max_grad_norm="1",
            ),
        ),
        metadata=metadata,
    )
    terminal = (pb.TRAINING_JOB_STATE_SUCCEEDED, pb.TRAINING_JOB_STATE_FAILED)
    for _ in range(10):  # each call waits at most 30 s on the server
        job = stub.GetTrainingJob(
            pb.GetTrainingJobRequest(job_id=job.job_id, wait_seconds=30), metadata=metadata
        )
        if job.state in terminal:
            break
    state = pb.TrainingJobState.Name(job.state).removeprefix("TRAINING_JOB_STATE_")
    base = DemoTraining(
        state,
        job.epsilon_spent,
        job.delta_spent,
        job.steps,
        None,
        None,
        None,
        False,
        job.model_sha256,
        job.error_message,
    )
    if job.state != pb.TRAINING_JOB_STATE_SUCCEEDED:
        return base
    out = folder / "training"
    out.mkdir()
    receipt = out / "receipt.json"
    receipt.write_bytes(job.receipt)
    artifact = out / str(load_receipt(receipt)["model"]["artifact"])
    with artifact.open("wb") as fh:
        for chunk in stub.FetchModel(pb.FetchModelRequest(job_id=job.job_id), metadata=metadata):
            fh.write(chunk.data)
    check = verify_receipt(
        receipt, trusted=trusted_keys([receipt_key.public_key()]), ledger=running.ledger
    )
    sigma = float(load_receipt(receipt)["training"]["noise_multiplier"])
    return DemoTraining(
        state,
        job.epsilon_spent,
        job.delta_spent,
        job.steps,
        sigma,
        _accuracy(receipt, rng),
        receipt,
        check.ok,
        job.model_sha256,
        "",
    )


def _accuracy(receipt: Path, rng: random.Random) -> float:
    """The model's accuracy on PEOPLE freshly generated people (the service's encoding:
    the amount scaled from [0, 100] to [-1, 1], the city's position in its domain)."""
    import torch

    from fedldp.aggregator.training.receipt import load_trained_model

    model = load_trained_model(receipt)
    people = [_person(rng) for _ in range(PEOPLE)]
    x = torch.tensor([[a / 50.0 - 1.0] for a, _ in people], dtype=torch.float32)
    y = torch.tensor([CITIES.index(c) for _, c in people])
    with torch.no_grad():
        predicted = model(x).argmax(dim=1)
    return float((predicted == y).float().mean())


def short(text: str) -> str:
    """A released decimal shown with 6 significant digits (the receipt keeps it exact)."""
    return f"{float(text):.6g}"


def release_html(demo: DemoResults) -> str:
    """The HTML section of the demo report showing the releases and the training job."""
    results = demo.releases
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(c)}</td>"
            for c in (
                r.kind,
                short(r.value),
                f"{r.noise_stddev:.3g}",
                f"[{short(r.lower)}, {short(r.upper)}] ({float(r.confidence):.0%})",
                r.reservation_id[:12] + "…",
                r.receipt.name,
                "verified" if r.verified else "FAILED",
            )
        )
        + "</tr>"
        for r in results
    )
    head = (
        "<tr><th>query</th><th>noised value</th><th>noise sd</th><th>interval</th>"
        "<th>reservation</th><th>signed receipt</th><th>receipt check</th></tr>"
    )
    return (
        "<h2>Central releases through the release service</h2>"
        f"<p>An analyst ({ANALYST}, purpose {PURPOSE}) asked the trusted release service for "
        f"a count and a mean of a generated consolidated table ({PEOPLE} people, at most "
        f"{RECORDS_PER_PERSON} records each, amount declared in [0, 100]), ε = 0.25 each "
        "(discrete Laplace) against a signed cap of ε = 2, δ = 1e-5. The service never "
        "returned the data or the true aggregate; each receipt was verified against the "
        "service's ledger and receipt key.</p>"
        f"<table>{head}{rows}</table>"
        "<p class='note'>The interval is for the value before noise, over the noise only "
        "(exact for the count; a delta-method approximation for the mean); it does not "
        "include sampling error of the data.</p>" + training_html(demo.training)
    )


def training_summary(job: DemoTraining) -> list[tuple[str, str]]:
    """The job's facts as (label, value) rows, for the report and the console."""
    check = {True: "yes", False: "NO"}[job.verified] if job.receipt else "no receipt"
    return [
        ("status", job.state + (f" ({job.error})" if job.error else "")),
        ("ε / δ spent", f"{job.epsilon_spent or '0'} / {job.delta_spent or '0'}"),
        ("steps", str(job.steps)),
        (
            "noise multiplier σ",
            "n/a" if job.noise_multiplier is None else f"{job.noise_multiplier:.4g}",
        ),
        (
            "accuracy (1,000 fresh generated people)",
            "n/a" if job.accuracy is None else f"{job.accuracy:.1%}",
        ),
        ("receipt verified", check),
        ("model sha256", job.model_sha256 or "none"),
    ]


def training_html(training: DemoTraining | str) -> str:
    """The training job's part of the section (or the line saying it was skipped)."""
    head = "<h3>A DP-SGD training job through the release service</h3>"
    if isinstance(training, str):
        return f"{head}<p>{html.escape(training)}.</p>"
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in training_summary(training)
    )
    return (
        f"{head}<p>The analyst asked the service to train a tiny MLP (one hidden layer of 8) "
        f"predicting the city from the amount: ε = {TRAIN_EPSILON}, δ = {TRAIN_DELTA}, "
        f"{TRAIN_EPOCHS} epochs at q = 0.1 (one record per person), charged to the same cap "
        "as the releases. The analyst received the model and a signed receipt, never the "
        "rows; the receipt was verified as <code>fedldp verify training</code> does "
        "(signature, ledger row, model digest, accountant replay).</p>"
        f"<table>{rows}</table>"
    )


def append_to_report(report: Path, section: str) -> None:
    """Insert `section` at the end of the HTML report's body."""
    text = report.read_text(encoding="utf-8")
    closing = "</body></html>"
    report.write_text(text.replace(closing, section + "\n" + closing), encoding="utf-8")
