"""`fedldp train --service ADDR ...` and `fedldp train status JOB`: DP-SGD jobs run by the
release service (docs/release-service.md, "Training jobs").

The analyst holds the service's address and a bearer token (or a client
certificate), never the data, the ledger or a cap: the job names a catalog dataset,
a purpose, (ε, δ), a zoo model, declared columns and hyper-parameters; the service
queues it, reserves, trains, signs. The command waits for the job (unless
`--no-wait`), then writes `model.pt` and `receipt.json` into `--out`, where
`fedldp verify training OUT/receipt.json --ledger URL --trusted-key KEY` checks them.
Only click is imported at module level (the grpc stubs inside the commands).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from fedldp.cli_common import decimal_option
from fedldp.cli_release_client import SERVICE_OPTIONS, bearer, token_from_env
from fedldp.cli_release_client import channel as _channel
from fedldp.cli_release_client import rpc as _rpc

F = TypeVar("F", bound=Callable[..., Any])
_OPTIMIZERS = ("sgd", "adam")
_ACCOUNTANTS = ("prv", "rdp")
#: Seconds each GetTrainingJob call waits on the server (its maximum).
_WAIT = 30


def _decimal(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is not None:
            decimal_option(value, name)
        return value

    return check


CONNECTION = [
    click.option("--service", help="host:port of the release service (runs the job there)"),
    *SERVICE_OPTIONS,
]

JOB = [
    click.option("--dataset", help="catalog dataset id (with --service)"),
    click.option("--purpose", help="a purpose granted to you on the dataset (with --service)"),
    click.option(
        "--epsilon", callback=_decimal("--epsilon"), help="plain decimal (with --service)"
    ),
    click.option(
        "--delta",
        callback=_decimal("--delta"),
        help="plain decimal, 0 < delta < 1 (with --service)",
    ),
    click.option("--model", "model_name", help="a model of the service's zoo (with --service)"),
    click.option("--label", help="declared categorical column to predict (with --service)"),
    click.option(
        "--feature",
        "features",
        multiple=True,
        help="declared input column, repeatable (default: every other column; with --service)",
    ),
    click.option("--epochs", type=click.IntRange(min=1), help="epochs (with --service)"),
    click.option(
        "--expected-batch-size",
        type=click.IntRange(min=1),
        help="expected Poisson batch size (or --sample-rate; with --service)",
    ),
    click.option(
        "--sample-rate",
        callback=_decimal("--sample-rate"),
        help="Poisson sampling rate q (or --expected-batch-size; with --service)",
    ),
    click.option(
        "--learning-rate",
        callback=_decimal("--learning-rate"),
        help="optimizer step size, plain decimal (with --service)",
    ),
    click.option(
        "--max-grad-norm",
        callback=_decimal("--max-grad-norm"),
        help="per-sample clipping norm (with --service)",
    ),
    click.option(
        "--optimizer",
        type=click.Choice(_OPTIMIZERS),
        default="sgd",
        show_default=True,
        help="update rule (with --service)",
    ),
    click.option(
        "--momentum",
        callback=_decimal("--momentum"),
        default="0",
        show_default=True,
        help="SGD momentum in [0, 1) (with --service)",
    ),
    click.option(
        "--accountant",
        type=click.Choice(_ACCOUNTANTS),
        default="prv",
        show_default=True,
        help="privacy accountant (with --service)",
    ),
    click.option(
        "--key",
        "idempotency_key",
        help="idempotency key: a retry returns the same job, charged once (with --service)",
    ),
    click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="folder for model.pt and receipt.json (with --service)",
    ),
    click.option("--no-wait", is_flag=True, help="print the job id and return (with --service)"),
]


def with_options(options: list[Any]) -> Callable[[F], F]:
    """Apply click options in the order listed."""

    def wrap(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return wrap


_REQUIRED = {
    "dataset": "--dataset",
    "purpose": "--purpose",
    "epsilon": "--epsilon",
    "delta": "--delta",
    "model_name": "--model",
    "label": "--label",
    "epochs": "--epochs",
    "learning_rate": "--learning-rate",
    "max_grad_norm": "--max-grad-norm",
    "idempotency_key": "--key",
}


def submit_and_wait(o: dict[str, Any], *, as_json: bool) -> None:
    """`fedldp train --service ...`: submit, wait, download (module docstring)."""
    missing = [flag for name, flag in _REQUIRED.items() if not o.get(name)]
    if missing:
        raise click.UsageError(f"a job on the release service needs {', '.join(missing)}")
    if (o["expected_batch_size"] is None) == (o["sample_rate"] is None):
        raise click.UsageError("give exactly one of --expected-batch-size and --sample-rate")
    if not o["no_wait"] and o["out_dir"] is None:
        raise click.UsageError("--out DIR is needed to receive the model (or pass --no-wait)")
    for name in ("model.pt", "receipt.json"):  # refused before anything is charged
        if o["out_dir"] is not None and (o["out_dir"] / name).exists():
            raise click.ClickException(
                f"{o['out_dir'] / name} exists; a model is never overwritten"
            )
    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    hyper = pb.TrainingHyperparameters(
        epochs=o["epochs"],
        learning_rate=o["learning_rate"],
        max_grad_norm=o["max_grad_norm"],
        momentum=o["momentum"],
        optimizer=pb.TrainingOptimizer.Value(f"TRAINING_OPTIMIZER_{o['optimizer'].upper()}"),
        accountant=pb.TrainingAccountant.Value(f"TRAINING_ACCOUNTANT_{o['accountant'].upper()}"),
    )
    if o["expected_batch_size"] is not None:
        hyper.expected_batch_size = o["expected_batch_size"]
    else:
        hyper.sample_rate = o["sample_rate"]
    request = pb.SubmitTrainingRequest(
        dataset=o["dataset"],
        purpose=o["purpose"],
        epsilon=o["epsilon"],
        delta=o["delta"],
        idempotency_key=o["idempotency_key"],
        model=o["model_name"],
        label=o["label"],
        features=list(o["features"]),
        hyperparameters=hyper,
    )
    with _channel(o["service"], o["tls_ca"], insecure=o["insecure"]) as channel:
        metadata = bearer(token_from_env(o["token_env"]))
        stub = release_pb2_grpc.ReleaseServiceStub(channel)
        job = _rpc(lambda: stub.SubmitTraining(request, metadata=metadata))
        click.echo(f"job {job.job_id} submitted", err=True)
        if o["no_wait"]:
            _show(job, as_json=as_json)
            return
        job = _wait(stub, job.job_id, metadata)
        _finish(stub, job, metadata, o["out_dir"], as_json=as_json)


def _wait(stub: Any, job_id: str, metadata: Any) -> Any:
    from fedldp.v1 import release_pb2 as pb

    terminal = (pb.TRAINING_JOB_STATE_SUCCEEDED, pb.TRAINING_JOB_STATE_FAILED)
    while True:
        job = _rpc(
            lambda: stub.GetTrainingJob(
                pb.GetTrainingJobRequest(job_id=job_id, wait_seconds=_WAIT), metadata=metadata
            )
        )
        if job.state in terminal:
            return job


def _finish(stub: Any, job: Any, metadata: Any, out_dir: Path | None, *, as_json: bool) -> None:
    """Download a finished job's files into `out_dir`; a failed job is an error (exit 1)."""
    from fedldp.v1 import release_pb2 as pb

    if job.state == pb.TRAINING_JOB_STATE_FAILED:
        charged = "its budget is spent" if job.charged else "nothing was charged"
        raise click.ClickException(
            f"training job {job.job_id} failed: {job.error_code}: {job.error_message} ({charged})"
        )
    if job.state == pb.TRAINING_JOB_STATE_SUCCEEDED and out_dir is not None:
        download(stub, job, metadata, out_dir)
        click.echo(f"model:   {out_dir / 'model.pt'}", err=True)
        click.echo(f"receipt: {out_dir / 'receipt.json'}", err=True)
    _show(job, as_json=as_json)


def download(stub: Any, job: Any, metadata: Any, out_dir: Path) -> None:
    """Write model.pt (checked against the job's and the receipt's sha256) and receipt.json.

    Existing files are never replaced; nothing is left behind when a check fails.
    """
    from fedldp.v1 import release_pb2 as pb

    data = bytearray()
    for chunk in _rpc(
        lambda: list(stub.FetchModel(pb.FetchModelRequest(job_id=job.job_id), metadata=metadata))
    ):
        if chunk.offset != len(data):
            raise click.ClickException("the model arrived out of order; fetch it again")
        data.extend(chunk.data)
    digest = hashlib.sha256(data).hexdigest()
    payload = _receipt_payload(job.receipt)
    claimed = payload.get("model", {}).get("artifact_sha256")
    if digest != job.model_sha256 or digest != claimed or len(data) != job.model_size:
        raise click.ClickException(
            f"the model received (sha256 {digest}) is not the one the job and its receipt name"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    try:
        for name, content in (("model.pt", bytes(data)), ("receipt.json", job.receipt)):
            path = out_dir / name
            with path.open("xb") as fh:
                written.append(path)
                fh.write(content)
    except FileExistsError as exc:
        for path in written:
            os.unlink(path)
        raise click.ClickException(f"{exc.filename} exists; a model is never overwritten") from None


def _receipt_payload(envelope: bytes) -> dict[str, Any]:
    import base64

    try:
        document = json.loads(envelope)
        payload: dict[str, Any] = json.loads(base64.b64decode(document["payload"]))
    except (ValueError, KeyError, TypeError):
        raise click.ClickException("the job's receipt is not a signed receipt envelope") from None
    return payload


def _show(job: Any, *, as_json: bool) -> None:
    from google.protobuf.json_format import MessageToDict

    from fedldp.v1 import release_pb2 as pb

    if as_json:
        shown = MessageToDict(job)
        shown.pop("receipt", None)
        click.echo(json.dumps(shown, indent=2))
        return
    state = pb.TrainingJobState.Name(job.state).removeprefix("TRAINING_JOB_STATE_").lower()
    click.echo(f"job {job.job_id}: {state}")
    if job.state == pb.TRAINING_JOB_STATE_SUCCEEDED:
        click.echo(
            f"steps {job.steps} ({job.stop_reason}), epsilon spent {job.epsilon_spent} at delta "
            f"{job.delta_spent}; reservation {job.reservation_id}"
        )


@click.command(name="status")
@click.argument("job_id")
@with_options(CONNECTION)
@click.option(
    "--wait", is_flag=True, help="wait until the job has finished (then download with --out)"
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="folder for model.pt and receipt.json of a succeeded job",
)
@click.option("--json", "as_json", is_flag=True, help="print the job as JSON")
def train_status(
    job_id: str,
    service: str | None,
    token_env: str,
    tls_ca: Path | None,
    insecure: bool,
    wait: bool,
    out_dir: Path | None,
    as_json: bool,
) -> None:
    """Show a training job of the release service; download its files with --out."""
    if not service:
        raise click.UsageError("Missing option '--service'")
    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    with _channel(service, tls_ca, insecure=insecure) as channel:
        metadata = bearer(token_from_env(token_env))
        stub = release_pb2_grpc.ReleaseServiceStub(channel)
        if wait:
            job = _wait(stub, job_id, metadata)
        else:
            job = _rpc(
                lambda: stub.GetTrainingJob(
                    pb.GetTrainingJobRequest(job_id=job_id), metadata=metadata
                )
            )
        if job.state == pb.TRAINING_JOB_STATE_FAILED:
            _finish(stub, job, metadata, None, as_json=as_json)
        elif job.state == pb.TRAINING_JOB_STATE_SUCCEEDED and out_dir is not None:
            _finish(stub, job, metadata, out_dir, as_json=as_json)
        else:
            _show(job, as_json=as_json)
