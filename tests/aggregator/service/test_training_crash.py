"""A release service killed while a DP-SGD job trains: the reservation and the analyst's
own-cap hold stay spent, and the restarted service settles both in full and reports the
job FAILED without refunding (real processes, real gRPC, real SQLite and PostgreSQL ledgers)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.service.policy import analyst_subject, ledger_subject
from fedldp.aggregator.service.training import STOPPED_MESSAGE
from fedldp.authoring import write_private_key, write_public_key
from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, TokenAuthority, bearer_metadata
from fedldp.collector.ledger import DataOpenedError, open_ledger
from fedldp.v1 import release_pb2 as pb
from fedldp.v1 import release_pb2_grpc

from tests.aggregator.service.conftest import CATALOG, SECRET, signed_policy, write_data

pytest.importorskip("opacus", reason="training jobs need the train extra")
pytestmark = [
    pytest.mark.train,
    pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals"),
]

#: A long job is allowed: 200 steps per epoch (q = 2/400) for 200 epochs.
LONG = """
[training]
max_epochs = 1000
max_steps = 1000000
[training.models.tiny]
hidden = [4]
"""
SUBJECT = ledger_subject("release-service", "visits")
OWN_SUBJECT = analyst_subject("release-service", "visits", "alice")


def _serve(base: Path, ledger_url: str) -> tuple[subprocess.Popen[str], int]:
    fedldp = Path(sys.executable).parent / "fedldp"
    proc = subprocess.Popen(
        [
            str(fedldp),
            "release-service",
            "serve",
            "--catalog",
            str(base / "catalog.toml"),
            "--policy",
            str(base / "policy.json"),
            "--policy-key",
            str(base / "policy.pub"),
            "--ledger",
            ledger_url,
            "--signing-key",
            str(base / "receipts.key"),
            "--token-secret-file",
            str(base / "secret.hex"),
            "--listen",
            "127.0.0.1:0",
            "--jobs-dir",
            str(base / "jobs"),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("release service on port "):
            # keep reading its log lines, so a full pipe never blocks the service
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, int(line.rsplit(" ", 1)[1])
    proc.kill()
    raise AssertionError(f"the service did not start (exit {proc.wait()})")


def _job(port: int, job_id: str) -> pb.TrainingJob:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return _job_on(channel, job_id)


def _job_on(channel: grpc.Channel, job_id: str) -> pb.TrainingJob:
    metadata = bearer_metadata(
        TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
            "alice", expires_at=int(time.time()) + 600
        )
    )
    stub = release_pb2_grpc.ReleaseServiceStub(channel)
    job: pb.TrainingJob = stub.GetTrainingJob(
        pb.GetTrainingJobRequest(job_id=job_id), metadata=metadata
    )
    return job


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_crash_mid_training_leaves_the_reservation_spent_and_a_restart_reports_failed(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    if backend == "postgresql":
        url = str(request.getfixturevalue("postgresql_url"))
    else:
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
    write_data(tmp_path / "visits.csv")
    catalog = CATALOG.replace(
        "contribution_bound = 2", "contribution_bound = 2\ntraining_rows = 400"
    )
    (tmp_path / "catalog.toml").write_text(catalog + LONG)
    policy_key = Ed25519PrivateKey.generate()
    signed_policy(
        tmp_path,
        'version = 1\n[[cap]]\ndataset = "visits"\npurpose = "study"\n'
        'epsilon = "3"\ndelta = "0.00001"\n'
        '[[analyst_cap]]\ndataset = "visits"\npurpose = "study"\nanalyst = "alice"\n'
        'epsilon = "2"\ndelta = "0.00001"\n',
        policy_key,
    )
    write_public_key(policy_key.public_key(), tmp_path / "policy.pub")
    write_private_key(Ed25519PrivateKey.generate(), tmp_path / "receipts.key")
    (tmp_path / "secret.hex").write_text(SECRET.hex())
    proc, port = _serve(tmp_path, url)
    try:
        metadata = bearer_metadata(
            TokenAuthority(SECRET, audience=RELEASE_SERVICE_AUDIENCE).mint(
                "alice", expires_at=int(time.time()) + 600
            )
        )
        job = pb.SubmitTrainingRequest(
            dataset="visits",
            purpose="study",
            epsilon="1",
            delta="0.000001",
            idempotency_key="long",
            model="tiny",
            label="city",
            features=["amount"],
            hyperparameters=pb.TrainingHyperparameters(
                epochs=200, expected_batch_size=2, learning_rate="0.1", max_grad_norm="1"
            ),
        )
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = release_pb2_grpc.ReleaseServiceStub(channel)
            job_id = stub.SubmitTraining(job, metadata=metadata).job_id
            # wait (bounded) for the job to open the data: from then on it is charged
            deadline = time.monotonic() + 120
            while not (polled := _job_on(channel, job_id)).charged:
                assert time.monotonic() < deadline, "the job never opened its data"
                time.sleep(0.1)
        assert polled.state == pb.TRAINING_JOB_STATE_RUNNING
    finally:
        proc.kill()  # SIGKILL: no handler, no settle, no cleanup
        proc.wait(timeout=30)

    with open_ledger(url) as store:
        (res,) = store.reservations(SUBJECT, "study")
        assert res.status == "reserved" and res.data_opened_at is not None
        (hold,) = store.reservations(OWN_SUBJECT, "study")
        assert hold.idempotency_key == f"analyst-cap:{res.id}"
        assert hold.status == "reserved" and hold.data_opened_at is not None
        for opened in (res, hold):
            with pytest.raises(DataOpenedError):  # a refund is what the ledger refuses
                store.cancel(opened.id, now=int(time.time()), owner=None)

    proc, port = _serve(tmp_path, url)
    try:
        done = _job(port, job_id)
        assert done.state == pb.TRAINING_JOB_STATE_FAILED and done.charged
        assert (done.error_code, done.error_message) == ("UNAVAILABLE", STOPPED_MESSAGE)
        assert done.reservation_id == res.id and not done.receipt and not done.model_sha256
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0

    with open_ledger(url) as store:
        (closed,) = store.reservations(SUBJECT, "study")
        assert closed.status == "settled"
        assert (closed.epsilon_spent, closed.delta_spent) == (res.epsilon, res.delta)  # in full
        assert "stopped during training" in (closed.close_reason or "")
        actions = [e["action"] for e in store.reservation_log(res.id)]
        assert actions == ["reserved", "data_opened", "settled"]
        (own,) = store.reservations(OWN_SUBJECT, "study")  # the analyst's hold: spent too
        assert own.status == "settled" and own.id == hold.id
        assert (own.epsilon_spent, own.delta_spent) == (hold.epsilon, hold.delta)
        assert [e["action"] for e in store.reservation_log(own.id)] == actions
    assert not (tmp_path / "jobs" / job_id / "out" / "model.pt").exists()
