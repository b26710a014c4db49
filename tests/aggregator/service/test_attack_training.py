"""Attacks on DP-SGD training jobs through the release service (auditor atk2).
Each test FAILS on the code as audited and passes once its finding is fixed."""

from __future__ import annotations

import io

import pytest
import torch
from fedldp.v1 import release_pb2 as pb

from tests.aggregator.service.conftest import Client
from tests.aggregator.service.test_training_jobs import (  # noqa: F401 - fixtures
    TRAIN_CATALOG,
    Make,
    finished,
    job_request,
    key_file,
    make_trainer,
    submit,
)

pytest.importorskip("opacus", reason="training jobs need the train extra")
pytestmark = [pytest.mark.train, pytest.mark.filterwarnings("ignore::UserWarning")]


def test_attack_a_zoo_module_with_a_data_dependent_buffer_is_not_released(
    make_trainer: Make,  # noqa: F811 - the imported fixture
) -> None:
    """docs/release-service.md: "privacy is bounded by the job's (ε, δ)" and the
    analyst cannot "read a training row". The published artefact is the whole
    `state_dict`, buffers included; Opacus's ModuleValidator does not look at
    arbitrary buffers, so a zoo module that keeps a buffer updated in forward (a
    running statistic, a cache) releases it un-clipped and un-noised while the
    receipt claims (ε, δ). Fix: refuse modules with buffers (or with state_dict
    entries that are not trainable parameters) before reserving, or publish the
    parameters only."""
    zoo = (
        '[training.models.memo]\nmodule = "tests.aggregator.service.attack_zoo_models:memorizer"\n'
    )
    svc = make_trainer(eps_cap="2", catalog=TRAIN_CATALOG + zoo)
    client = Client(svc.port, "alice")
    job = finished(client, submit(client, job_request("memo", model="memo")).job_id)
    if job.state != pb.TRAINING_JOB_STATE_SUCCEEDED:
        client.close()
        return  # refused: the fix
    data = b"".join(
        c.data
        for c in client.stub.FetchModel(
            pb.FetchModelRequest(job_id=job.job_id), metadata=client.metadata
        )
    )
    client.close()
    state = torch.load(io.BytesIO(data), weights_only=True)
    leaked = [k for k in state if k.endswith("seen")]
    assert not leaked, (
        f"the released model carries an un-noised, data-dependent buffer {leaked}: "
        f"{state[leaked[0]].tolist()} (a raw training row's encoded features)"
    )
