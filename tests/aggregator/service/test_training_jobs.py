"""DP-SGD training jobs through the release service: real gRPC on port 0, real SQLite
and PostgreSQL ledgers, the real Opacus engine (tiny tables, a few steps)."""

from __future__ import annotations

import base64
import csv
import json
import logging
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.signing import trusted_keys
from fedldp.aggregator.service.catalog import (
    CategoricalColumn,
    Dataset,
    NumericColumn,
    load_catalog,
)
from fedldp.aggregator.service.engine import ledger_key
from fedldp.aggregator.service.jobs import JobsFolderBusyError, job_id_of, train_ledger_key
from fedldp.aggregator.service.policy import ledger_subject, load_release_policy
from fedldp.aggregator.service.server import (
    RunningReleaseService,
    ServiceConfig,
    start_release_service,
)
from fedldp.aggregator.service.training import TrainingSetup, training_table
from fedldp.authoring import write_private_key, write_public_key
from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, Authenticator, TokenAuthority
from fedldp.collector.daemon import JsonFormatter
from fedldp.v1 import release_pb2 as pb
from prometheus_client import generate_latest

from fedldp.cli import main
from tests.aggregator.service.conftest import (
    CATALOG,
    NOW,
    POLICY,
    SECRET,
    Client,
    signed_policy,
    write_data,
)

pytest.importorskip("opacus", reason="training jobs need the train extra")
pytestmark = [pytest.mark.train, pytest.mark.filterwarnings("ignore::UserWarning")]

SUBJECT = ledger_subject("release-service", "visits")
TRAINING = """
[training]
max_epochs = 5
max_steps = 400
max_expected_batch_size = 200
[training.models.tiny]
hidden = [4]
"""
#: The catalog with training enabled on `visits` (397 units: one record each is read).
TRAIN_CATALOG = (
    CATALOG.replace("contribution_bound = 2", "contribution_bound = 2\ntraining_rows = 400")
    + TRAINING
)

Make = Callable[..., RunningReleaseService]


@pytest.fixture
def key_file(tmp_path: Path, receipt_key: Ed25519PrivateKey) -> Path:
    return write_private_key(receipt_key, tmp_path / "receipts.key")


@pytest.fixture
def make_trainer(
    tmp_path: Path,
    receipt_key: Ed25519PrivateKey,
    key_file: Path,
    policy_key: Ed25519PrivateKey,
) -> Iterator[Make]:
    """make_trainer(ledger_url=None, eps_cap="1", queue=4, workers=1, catalog=TRAIN_CATALOG)."""
    started: list[RunningReleaseService] = []

    def make(
        ledger_url: str | None = None,
        eps_cap: str = "1",
        queue: int = 4,
        workers: int = 1,
        catalog: str = TRAIN_CATALOG,
        policy_extra: str = "",
    ) -> RunningReleaseService:
        if not (tmp_path / "visits.csv").exists():
            write_data(tmp_path / "visits.csv")
        (tmp_path / "catalog.toml").write_text(catalog, encoding="utf-8")
        envelope = signed_policy(tmp_path, POLICY.format(eps=eps_cap) + policy_extra, policy_key)
        config = ServiceConfig(
            catalog=load_catalog(tmp_path / "catalog.toml"),
            policy=load_release_policy(envelope, trusted_keys([policy_key.public_key()])),
            ledger_url=ledger_url or f"sqlite:///{tmp_path / 'ledger.db'}",
            signing_key=receipt_key,
            authenticator=Authenticator(TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE)),
            training=TrainingSetup(
                jobs_dir=tmp_path / "jobs",
                signing_key_path=key_file,
                queue_size=queue,
                workers=workers,
            ),
        )
        svc = start_release_service(config, clock=lambda: NOW)
        started.append(svc)
        return svc

    yield make
    for svc in started:
        svc.stop(60)


def job_request(key: str = "j1", **changes: Any) -> pb.SubmitTrainingRequest:
    """A small job: 2 epochs of q = 0.1 (20 steps), label city, feature amount."""
    fields: dict[str, Any] = {
        "dataset": "visits",
        "purpose": "study",
        "epsilon": "0.8",
        "delta": "0.000001",
        "idempotency_key": key,
        "model": "tiny",
        "label": "city",
        "features": ["amount"],
        "hyperparameters": pb.TrainingHyperparameters(
            epochs=2, expected_batch_size=40, learning_rate="0.5", max_grad_norm="1"
        ),
    }
    fields.update(changes)
    return pb.SubmitTrainingRequest(**fields)


def submit(client: Client, request: pb.SubmitTrainingRequest) -> pb.TrainingJob:
    job: pb.TrainingJob = client.stub.SubmitTraining(request, metadata=client.metadata)
    return job


def finished(client: Client, job_id: str) -> pb.TrainingJob:
    """The job once terminal (the server waits; each call at most 30 s)."""
    terminal = (pb.TRAINING_JOB_STATE_SUCCEEDED, pb.TRAINING_JOB_STATE_FAILED)
    for _ in range(10):
        job: pb.TrainingJob = client.stub.GetTrainingJob(
            pb.GetTrainingJobRequest(job_id=job_id, wait_seconds=30), metadata=client.metadata
        )
        if job.state in terminal:
            return job
    raise AssertionError(f"job {job_id} did not finish within 300 s")


def _code(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    return err.code(), err.details()


def _job_folders(tmp_path: Path) -> list[Path]:
    return [p for p in (tmp_path / "jobs").iterdir() if p.is_dir()]


# --- authorization and the contract ---


def test_an_analyst_without_rights_is_refused_and_nothing_is_stored_or_reserved(
    make_trainer: Make, tmp_path: Path
) -> None:
    svc = make_trainer()
    for analyst, request in [
        ("dave", job_request()),  # no grant at all
        ("carol", job_request()),  # granted "audit", not "study"
        ("alice", job_request(dataset="nope")),  # no such dataset: the same answer
    ]:
        client = Client(svc.port, analyst)
        code, message = _code(lambda: submit(client, request))  # noqa: B023
        assert code is grpc.StatusCode.PERMISSION_DENIED, message
        client.close()
    anonymous = Client(svc.port, None)
    code, _ = _code(lambda: submit(anonymous, job_request()))
    assert code is grpc.StatusCode.UNAUTHENTICATED
    anonymous.close()
    assert _job_folders(tmp_path) == []
    assert svc.ledger.reservations(SUBJECT) == []


def test_a_cap_cannot_be_sent_not_even_as_an_unknown_field(
    make_trainer: Make, tmp_path: Path
) -> None:
    svc = make_trainer(workers=0)
    client = Client(svc.port, "alice")
    request = job_request()
    hyper = request.hyperparameters.SerializeToString()
    request.ClearField("hyperparameters")
    cap = b"\x9a\x06\x041000"  # field 99, length-delimited "1000": a "cap"
    for smuggled in (
        job_request().SerializeToString() + cap,  # at the top
        request.SerializeToString()
        + b"\x4a"
        + bytes([len(hyper) + len(cap)])
        + hyper
        + cap,  # nested
    ):
        call = client.channel.unary_unary(
            "/fedldp.v1.ReleaseService/SubmitTraining",
            request_serializer=None,
            response_deserializer=None,
        )
        code, message = _code(lambda: call(smuggled, metadata=client.metadata))  # noqa: B023
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert "fields this contract does not define" in message
    assert submit(client, job_request()).state == pb.TRAINING_JOB_STATE_QUEUED  # without: served
    client.close()
    assert len(_job_folders(tmp_path)) == 1


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"model": "resnet"}, "model zoo"),
        ({"label": "amount"}, "categorical"),
        ({"features": ["city"]}, "other than the label"),
        ({"features": ["user_id"]}, "declared columns"),
        ({"delta": "0"}, "0 < delta < 1"),
        ({"epsilon": "1e-3"}, "plain decimal"),
        (
            {
                "hyperparameters": pb.TrainingHyperparameters(
                    epochs=50, expected_batch_size=40, learning_rate="0.5", max_grad_norm="1"
                )
            },
            "epochs must be 1..5",
        ),
        (
            {
                "hyperparameters": pb.TrainingHyperparameters(
                    epochs=1, sample_rate="0.001", learning_rate="0.5", max_grad_norm="1"
                )
            },
            "expected batch of at least 1",
        ),
        (
            {
                "hyperparameters": pb.TrainingHyperparameters(
                    epochs=5, expected_batch_size=4, learning_rate="0.5", max_grad_norm="1"
                )
            },
            "exceed the operator's limit 400",
        ),
        (
            {
                "hyperparameters": pb.TrainingHyperparameters(
                    epochs=1, expected_batch_size=40, learning_rate="50", max_grad_norm="1"
                )
            },
            "learning_rate",
        ),
        ({"idempotency_key": ""}, "idempotency_key"),
    ],
)
def test_bad_jobs_are_refused_before_anything_is_stored(
    make_trainer: Make, tmp_path: Path, changes: dict[str, Any], needle: str
) -> None:
    svc = make_trainer()
    client = Client(svc.port, "alice")
    code, message = _code(lambda: submit(client, job_request(**changes)))
    client.close()
    assert code is grpc.StatusCode.INVALID_ARGUMENT and needle in message, message
    assert _job_folders(tmp_path) == []
    assert svc.ledger.reservations(SUBJECT) == []


def test_a_dataset_not_declared_for_training_and_a_service_without_training(
    make_trainer: Make, make_service: Make
) -> None:
    svc = make_trainer(catalog=CATALOG + TRAINING)  # no training_rows
    client = Client(svc.port, "alice")
    code, message = _code(lambda: submit(client, job_request()))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "training_rows" in message
    client.close()
    plain = make_service()
    client = Client(plain.port, "alice")
    code, message = _code(lambda: submit(client, job_request()))
    assert code is grpc.StatusCode.FAILED_PRECONDITION and "not enabled" in message
    client.close()


# --- running, receipts, idempotency ---


@pytest.mark.parametrize("ledger", ["sqlite", "postgresql"])
def test_one_job_charged_once_for_two_submissions_with_one_key(
    make_trainer: Make, request: pytest.FixtureRequest, ledger: str
) -> None:
    url = request.getfixturevalue("postgresql_url") if ledger == "postgresql" else None
    svc = make_trainer(ledger_url=url)
    client = Client(svc.port, "alice")
    first = submit(client, job_request("same"))
    second = submit(client, job_request("same"))  # a retry while queued or running
    assert first.job_id == second.job_id
    done = finished(client, first.job_id)
    assert done.state == pb.TRAINING_JOB_STATE_SUCCEEDED, done.error_message
    third = submit(client, job_request("same"))  # a retry after it finished
    assert third.job_id == first.job_id and third.receipt == done.receipt
    code, message = _code(lambda: submit(client, job_request("same", epsilon="0.7")))
    assert code is grpc.StatusCode.ALREADY_EXISTS, message
    # bob's identical key is his own job (keys are scoped to the analyst)
    bob = Client(svc.port, "bob")
    assert submit(bob, job_request("same")).job_id != first.job_id
    code, _ = _code(
        lambda: bob.stub.GetTrainingJob(
            pb.GetTrainingJobRequest(job_id=first.job_id), metadata=bob.metadata
        )
    )
    assert code is grpc.StatusCode.NOT_FOUND  # alice's job is not bob's to see
    # ... but the purpose's cap is shared: alice's job committed 0.8 of 1
    refused = finished(bob, submit(bob, job_request("same")).job_id)
    assert refused.error_code == "RESOURCE_EXHAUSTED" and not refused.charged
    bob.close()
    client.close()
    reservations = svc.ledger.reservations(SUBJECT, "study")
    assert [r.id for r in reservations] == [done.reservation_id]  # one, for the one key
    assert reservations[0].status == "settled"
    assert str(reservations[0].epsilon_spent) == done.epsilon_spent


def test_the_returned_receipt_verifies_with_fedldp_verify_training_and_a_tampered_one_fails(
    make_trainer: Make, tmp_path: Path, receipt_key: Ed25519PrivateKey
) -> None:
    svc = make_trainer()
    pub = write_public_key(receipt_key.public_key(), tmp_path / "receipts.pub")
    out = tmp_path / "model-out"
    env = {
        "FEDLDP_TOKEN": TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            "alice", expires_at=NOW + 3600
        )
    }
    args = [
        "train",
        "--service",
        f"127.0.0.1:{svc.port}",
        "--dataset=visits",
        "--purpose=study",
        "--epsilon=0.8",
        "--delta=0.000001",
        "--model=tiny",
        "--label=city",
        "--feature=amount",
        "--epochs=2",
        "--expected-batch-size=40",
        "--learning-rate=0.5",
        "--max-grad-norm=1",
        "--key=cli-job",
        f"--out={out}",
        "--json",
    ]
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["state"] == "TRAINING_JOB_STATE_SUCCEEDED" and "receipt" not in shown
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    verify = ["verify", "training", str(out / "receipt.json"), "--ledger", ledger_url]
    verify += ["--trusted-key", str(pub)]
    ok = CliRunner().invoke(main, verify)
    assert ok.exit_code == 0, ok.output
    # the job again through `train status --out`: same files, nothing overwritten
    again = CliRunner().invoke(
        main,
        [
            "train",
            "status",
            shown["jobId"],
            "--service",
            f"127.0.0.1:{svc.port}",
            "--out",
            str(out),
        ],
        env=env,
    )
    assert again.exit_code == 1 and "never overwritten" in again.output
    # a new job into the same folder is refused before it is submitted (nothing charged)
    other = [a if a != "--key=cli-job" else "--key=other" for a in args]
    refused = CliRunner().invoke(main, other, env=env)
    assert refused.exit_code == 1 and "never overwritten" in refused.output
    assert len(svc.ledger.reservations(SUBJECT)) == 1
    # a tampered receipt (one ε digit of the payload changed, signature kept) fails
    envelope = json.loads((out / "receipt.json").read_bytes())
    payload = json.loads(base64.b64decode(envelope["payload"]))
    payload["privacy"]["epsilon_budget"] = "5"
    envelope["payload"] = base64.b64encode(
        json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    ).decode()
    (out / "receipt.json").write_text(json.dumps(envelope))
    bad = CliRunner().invoke(main, verify)
    assert bad.exit_code == 1 and "FAIL signature" in bad.output, bad.output


def test_a_full_queue_is_refused_and_stores_nothing(make_trainer: Make, tmp_path: Path) -> None:
    svc = make_trainer(queue=2, workers=0)  # no worker: the queue only fills
    client = Client(svc.port, "alice")
    submit(client, job_request("a"))
    submit(client, job_request("b"))
    assert submit(client, job_request("a")).state == pb.TRAINING_JOB_STATE_QUEUED  # a retry
    code, message = _code(lambda: submit(client, job_request("c")))
    client.close()
    assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "queue is full" in message
    assert len(_job_folders(tmp_path)) == 2
    assert svc.ledger.reservations(SUBJECT) == []  # queued jobs reserve nothing yet


def test_a_refused_reservation_fails_the_job_uncharged_and_the_key_may_run_again(
    make_trainer: Make,
) -> None:
    svc = make_trainer(eps_cap="0.5")
    client = Client(svc.port, "alice")
    job = finished(client, submit(client, job_request("big", epsilon="0.8")).job_id)
    assert job.state == pb.TRAINING_JOB_STATE_FAILED
    assert job.error_code == "RESOURCE_EXHAUSTED" and not job.charged and not job.reservation_id
    assert svc.ledger.reservations(SUBJECT) == []
    again = submit(client, job_request("big", epsilon="0.8"))  # nothing was reserved: re-queued
    assert again.job_id == job.job_id and again.state == pb.TRAINING_JOB_STATE_QUEUED
    assert finished(client, again.job_id).error_code == "RESOURCE_EXHAUSTED"
    client.close()


# --- what never leaves the boundary ---

#: Distinctive values: none may appear in what the service says or logs.
SECRET_AMOUNT = "77.123457"
SECRET_LABEL = "zz-secret-city-4711"


def _distinctive_data(path: Path) -> list[str]:
    """Rows with SECRET_AMOUNT and other many-digit amounts; returns the values."""
    values = [f"{10 + i * 0.000173:.6f}" for i in range(300)]
    values[17] = SECRET_AMOUNT
    lines = ["user_id,amount,city"]
    lines += [f"u{i},{v},{['paris', 'lyon', 'nice'][i % 3]}" for i, v in enumerate(values)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return values


def test_no_data_row_or_aggregate_appears_in_logs_metrics_errors_or_responses(
    make_trainer: Make, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    values = _distinctive_data(tmp_path / "visits.csv")
    true_mean = f"{sum(Decimal(v) for v in values) / len(values):.6f}"
    true_sum = str(sum(Decimal(v) for v in values))
    caplog.set_level(logging.DEBUG, logger="fedldp")
    svc = make_trainer(eps_cap="2")
    client = Client(svc.port, "alice")
    said: list[str] = []
    good = finished(client, submit(client, job_request("ok")).job_id)
    assert good.state == pb.TRAINING_JOB_STATE_SUCCEEDED, good.error_message
    said += [str(good), good.receipt.decode()]
    for request in (job_request("x", model="nope"), job_request("y", label="amount")):
        said.append(_code(lambda: submit(client, request))[1])  # noqa: B023
    # the data changes after registration: a label outside the domain fails the job
    # after the read (charged) with a fixed message
    text = (tmp_path / "visits.csv").read_text().replace("u5,", "u5,").splitlines()
    text[6] = text[6].rsplit(",", 1)[0] + f",{SECRET_LABEL}"
    (tmp_path / "visits.csv").write_text("\n".join(text) + "\n")
    bad = finished(client, submit(client, job_request("late")).job_id)
    assert bad.state == pb.TRAINING_JOB_STATE_FAILED and bad.charged, bad.error_message
    assert bad.error_code == "FAILED_PRECONDITION" and "budget is spent" in bad.error_message
    said.append(str(bad))
    client.close()
    formatter = JsonFormatter()
    said += [formatter.format(r) for r in caplog.records]
    said.append(generate_latest(svc.metrics.registry).decode())
    said += [p.read_text() for p in (tmp_path / "jobs").glob("*/job.json")]
    everything = "\n".join(said)
    secrets = [SECRET_AMOUNT, SECRET_LABEL, true_mean, true_sum, *values[100:110]]
    assert [s for s in secrets if s in everything] == []
    # positive control: the same scan finds them in the data itself
    data = (tmp_path / "visits.csv").read_text()
    assert [s for s in secrets[:2] if s in data] == secrets[:2]
    assert "training job finished" in everything and "job_id" in everything


def test_fetch_model_streams_the_digested_bytes_and_refuses_unfinished_jobs(
    make_trainer: Make,
) -> None:
    svc = make_trainer(workers=0, queue=1)
    client = Client(svc.port, "alice")
    queued = submit(client, job_request("q"))
    code, _ = _code(
        lambda: list(
            client.stub.FetchModel(
                pb.FetchModelRequest(job_id=queued.job_id), metadata=client.metadata
            )
        )
    )
    assert code is grpc.StatusCode.FAILED_PRECONDITION
    code, _ = _code(
        lambda: client.stub.GetTrainingJob(
            pb.GetTrainingJobRequest(job_id=queued.job_id, wait_seconds=31),
            metadata=client.metadata,
        )
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT
    client.close()


def test_concurrent_submissions_with_one_key_make_one_job(make_trainer: Make) -> None:
    svc = make_trainer(workers=0, queue=4)
    client = Client(svc.port, "alice")
    ids: list[str] = []
    barrier = threading.Barrier(6)

    def go() -> None:
        barrier.wait()
        ids.append(submit(client, job_request("race")).job_id)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    assert len(ids) == 6 and len(set(ids)) == 1
    assert svc.training is not None and svc.training.store.count("queued") == 1


def test_a_restart_runs_queued_jobs(make_trainer: Make, tmp_path: Path) -> None:
    first = make_trainer(workers=0)
    client = Client(first.port, "alice")
    job_id = submit(client, job_request("later")).job_id
    client.close()
    first.stop(0)
    second = make_trainer()
    client = Client(second.port, "alice")
    assert finished(client, job_id).state == pb.TRAINING_JOB_STATE_SUCCEEDED
    client.close()


# --- the training table and the keys ---


def _small_dataset(tmp_path: Path, engine: str = "duckdb") -> Dataset:
    path = tmp_path / "d.csv"
    path.write_text("u,x,k,c\na,0,s,p\na,10,s,q\nb,10,t,q\nc,-5,r,p\nd,99,t,q\n", encoding="utf-8")
    columns: dict[str, NumericColumn | CategoricalColumn] = {
        "x": NumericColumn(Decimal(0), Decimal(10)),
        "k": CategoricalColumn(("r", "s", "t")),
        "c": CategoricalColumn(("p", "q")),
    }
    return Dataset("d", "u", 2, columns, [], csv_path=path, engine=engine)


def test_the_training_table_has_one_record_per_unit_encoded_from_the_declaration(
    tmp_path: Path,
) -> None:
    ds = _small_dataset(tmp_path)
    a_rows = {((-1.0, 0.0, 1.0, 0.0), 0), ((1.0, 0.0, 1.0, 0.0), 1)}  # unit a's two records
    kept_for_a: set[tuple[tuple[float, ...], int]] = set()
    for key in (b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"):
        table = training_table(ds, "c", ["x", "k"], key=key)
        assert table.n_rows == 4  # a, b, c, d: ONE of a's two records
        assert table.feature_names == ("x", "k=r", "k=s", "k=t")
        got = list(zip(map(tuple, table.features.tolist()), table.labels.tolist(), strict=True))
        from_a = [r for r in got if r in a_rows]
        assert len(from_a) == 1
        assert sorted(r for r in got if r not in a_rows) == [
            ((-1.0, 1.0, 0.0, 0.0), 0),  # c: -5 clipped to the lower bound; label p = 0
            ((1.0, 0.0, 0.0, 1.0), 1),  # b
            ((1.0, 0.0, 0.0, 1.0), 1),  # d: 99 clipped to the upper bound
        ]
        kept_for_a |= set(from_a)
        # rows come in a canonical order (features, then label), whatever the engine's
        assert got == sorted(got)
    # the key decides which of a's records is read, not the file order (fixed keys: the
    # broken variant "the first record read" would keep a's first record every time)
    assert kept_for_a == a_rows


def test_the_rows_a_job_reads_are_the_reference_bounded_rows(tmp_path: Path) -> None:
    """DuckDB (the default engine) and the Python reference read the same rows under the
    same key: the same arrays, hence the same dataset digest in the receipt."""
    duck_ds = _small_dataset(tmp_path)
    assert duck_ds.engine == "duckdb"  # the default
    python_ds = _small_dataset(tmp_path, engine="python")
    for key in (b"k0", b"k1", b"k2", b"k3"):
        via_duck = training_table(duck_ds, "c", ["x", "k"], key=key)
        via_reference = training_table(python_ds, "c", ["x", "k"], key=key)
        assert via_duck.features.tolist() == via_reference.features.tolist()
        assert via_duck.labels.tolist() == via_reference.labels.tolist()
        assert via_duck.digest == via_reference.digest


def test_a_value_outside_the_declaration_fails_the_read_with_a_fixed_message(
    tmp_path: Path,
) -> None:
    from fedldp.aggregator.training.data import DataError

    ds = _small_dataset(tmp_path)
    assert ds.csv_path is not None
    ds.csv_path.write_text("u,x,k,c\na,0,s,p\nb,1,zzz,q\n", encoding="utf-8")
    with pytest.raises(DataError, match="column k lies outside its declared domain") as info:
        training_table(ds, "c", ["x", "k"], key=b"k")
    assert "zzz" not in str(info.value)
    ds.csv_path.write_text("u,x,k,c\na,0,s,p\nb,secret-text,s,q\n", encoding="utf-8")
    with pytest.raises(DataError) as info:
        training_table(ds, "c", ["x", "k"], key=b"k")
    assert "secret" not in str(info.value)
    ds.csv_path.write_text("u,x,k,c\na,0,s,p\nb,,s,q\n", encoding="utf-8")
    with pytest.raises(DataError, match="column x is not a number"):
        training_table(ds, "c", ["x", "k"], key=b"k")


def test_a_job_trains_on_the_duckdb_bounded_rows_by_default(
    make_trainer: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real job through the service reads its table with DuckDB (the default engine),
    and the rows it gets are the reference's bounded rows for the job's own key."""
    from fedldp.aggregator.engines import duck, reference

    calls: list[tuple[Any, Any, Any]] = []
    real_rows = duck.rows

    def spy(q: Any, source: Any) -> Any:  # the real engine, recorded
        table = real_rows(q, source)
        calls.append((q, source, table))
        return table

    monkeypatch.setattr(duck, "rows", spy)
    svc = make_trainer()
    client = Client(svc.port, "alice")
    job = finished(client, submit(client, job_request("via-duckdb")).job_id)
    assert job.state == pb.TRAINING_JOB_STATE_SUCCEEDED, job.error_message
    assert len(calls) == 1
    q, source, table = calls[0]
    assert q.rows_per_unit == 1 and len(q.key) == 32  # one row per unit, a fresh key
    with source.path.open(newline="", encoding="utf-8") as fh:
        expected = sorted(kept for _, kept in reference.bounded(q, csv.DictReader(fh)))
    got = sorted(zip(*(table.column(n).to_pylist() for n in q.fields()), strict=True))
    assert got == expected and len(got) == 397  # 397 units, 2 records each
    client.close()


def test_training_keys_are_scoped_to_the_analyst_and_apart_from_release_keys() -> None:
    assert train_ledger_key("a", "b:c") != train_ledger_key("a:b", "c")
    assert job_id_of(train_ledger_key("a", "b:c")) != job_id_of(train_ledger_key("a:b", "c"))
    assert train_ledger_key("alice", "k") != ledger_key("alice", "k")

    def broken(analyst: str, key: str) -> str:  # plain concatenation collides
        return f"release-service-train:{analyst}:{key}"

    assert broken("a", "b:c") == broken("a:b", "c")


def test_two_services_cannot_share_a_jobs_folder(make_trainer: Make) -> None:
    make_trainer(workers=0)
    with pytest.raises(JobsFolderBusyError):
        make_trainer(workers=0)


def test_a_module_entry_of_the_zoo_trains_and_a_broken_one_fails_uncharged(
    make_trainer: Make,
) -> None:
    zoo = (
        '[training.models.linear]\nmodule = "tests.aggregator.service.zoo_models:tiny_linear"\n'
        '[training.models.missing]\nmodule = "tests.aggregator.service.no_such_module:build"\n'
    )
    svc = make_trainer(eps_cap="2", catalog=TRAIN_CATALOG + zoo)
    client = Client(svc.port, "alice")
    good = finished(client, submit(client, job_request("lin", model="linear")).job_id)
    assert good.state == pb.TRAINING_JOB_STATE_SUCCEEDED, good.error_message
    payload = json.loads(base64.b64decode(json.loads(good.receipt)["payload"]))
    assert payload["model"]["kind"] == "custom"
    assert payload["dataset"]["path"] == "catalog:visits"  # not the operator's file path
    bad = finished(client, submit(client, job_request("gone", model="missing")).job_id)
    client.close()
    assert bad.state == pb.TRAINING_JOB_STATE_FAILED and not bad.charged
    assert bad.error_code == "FAILED_PRECONDITION" and "ModuleNotFoundError" in bad.error_message
    assert [r.id for r in svc.ledger.reservations(SUBJECT)] == [good.reservation_id]


def test_a_zoo_module_with_a_buffer_is_refused_uncharged(make_trainer: Make) -> None:
    """An operator-allowed module that keeps a buffer (attack_zoo_models.memorizer copies
    a raw row into it) is refused by the engine before reserving: nothing is charged."""
    zoo = (
        '[training.models.memo]\nmodule = "tests.aggregator.service.attack_zoo_models:memorizer"\n'
    )
    svc = make_trainer(eps_cap="2", catalog=TRAIN_CATALOG + zoo)
    client = Client(svc.port, "alice")
    job = finished(client, submit(client, job_request("memo", model="memo")).job_id)
    client.close()
    assert job.state == pb.TRAINING_JOB_STATE_FAILED and not job.charged
    assert job.error_code == "INVALID_ARGUMENT" and "seen (buffer)" in job.error_message
    assert svc.ledger.reservations(SUBJECT) == []


def test_an_analysts_own_cap_bounds_training_jobs_too(make_trainer: Make) -> None:
    own = (
        '[[analyst_cap]]\ndataset = "visits"\npurpose = "study"\nanalyst = "alice"\n'
        'epsilon = "0.5"\ndelta = "0.00001"\n'
    )
    svc = make_trainer(eps_cap="2", policy_extra=own)
    client = Client(svc.port, "alice")
    job = finished(client, submit(client, job_request("mine", epsilon="0.8")).job_id)
    client.close()
    assert job.state == pb.TRAINING_JOB_STATE_FAILED and not job.charged
    assert job.error_code == "RESOURCE_EXHAUSTED", job.error_message
    assert [r for r in svc.ledger.reservations(SUBJECT) if r.status != "cancelled"] == []
