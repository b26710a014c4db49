"""Retired policies answer EXPIRED_POLICY; a policy folder that fails to load is
never served: at start the collector refuses to start, on reload (SIGHUP) the set
served before stays, with an ERROR line and a metric saying so."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report, spawn, write_config
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.policies import PolicyFolderError, PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc, policy_pb2


@pytest.fixture
def folders(tmp_path: Path, now: int) -> tuple[Deployment, Path, Path]:
    d = Deployment.create(now=now)
    d.add_categorical("alpha")
    d.add_categorical("beta")
    trust_dir, policy_dir = d.write_folders(tmp_path)
    return d, trust_dir, policy_dir


@pytest.fixture
def running(folders: tuple[Deployment, Path, Path], tmp_path: Path) -> Iterator[RunningCollector]:
    d, trust_dir, policy_dir = folders
    config = d.config(
        f"sqlite:///{tmp_path / 'l.db'}", trust_dir=str(trust_dir), policy_dir=str(policy_dir)
    )
    collector = start_collector(config)
    yield collector
    collector.stop(1.0)


def _submit(d: Deployment, address: str, policy: VerifiedPolicy, now: int) -> pb.ReportOutcome:
    report = make_report(policy, CategoryOutput(1), coarse_time=coarse(now))
    with grpc.insecure_channel(address) as channel:
        response = collector_pb2_grpc.CollectorStub(channel).Submit(
            pb.SubmitRequest(reports=[report]), metadata=bearer_metadata(d.token("alice"))
        )
    return response.outcomes[0]


def _served(d: Deployment, address: str) -> list[str]:
    with grpc.insecure_channel(address) as channel:
        response = collector_pb2_grpc.CollectorStub(channel).GetPolicies(
            pb.GetPoliciesRequest(), metadata=bearer_metadata(d.token("alice"))
        )
    return sorted(policy_pb2.Policy.FromString(e.payload).policy_id for e in response.policies)


def _reloads(collector: RunningCollector, result: str) -> float:
    value = collector.metrics.registry.get_sample_value(
        "fedldp_collector_policy_reloads_total", {"result": result}
    )
    return value or 0.0


@pytest.mark.parametrize("how", ["retired-list", "retired-version", "renamed"])
def test_a_retired_policy_answers_expired_policy(
    folders: tuple[Deployment, Path, Path], running: RunningCollector, now: int, how: str
) -> None:
    d, _, policy_dir = folders
    alpha = d.verified(d.envelopes[0])
    assert _submit(d, running.address, alpha, now).outcome == pb.OUTCOME_ACCEPTED
    if how == "retired-list":
        (policy_dir / "retired").write_text("alpha  # superseded\n")
    elif how == "retired-version":
        (policy_dir / "retired").write_text("alpha 1\n")
    else:
        (policy_dir / "p0.policy").rename(policy_dir / "p0.policy.retired")
    running.reload_policies()
    assert _served(d, running.address) == ["beta"]
    outcome = _submit(d, running.address, alpha, now)
    assert outcome.outcome == pb.OUTCOME_EXPIRED_POLICY
    assert "retired" in outcome.detail
    assert _submit(d, running.address, d.verified(d.envelopes[1]), now).outcome == (
        pb.OUTCOME_ACCEPTED
    )
    assert _reloads(running, "ok") == 1.0
    # A policy never signed for this folder stays unknown.
    d2 = Deployment.create(now=now)
    stranger = d2.verified(d2.add_categorical("gamma"))
    assert _submit(d, running.address, stranger, now).outcome == pb.OUTCOME_UNKNOWN_POLICY


@pytest.mark.parametrize("fault", ["malformed-retired", "junk-policy", "foreign-signer"])
def test_a_reload_that_fails_keeps_the_served_set(
    folders: tuple[Deployment, Path, Path],
    running: RunningCollector,
    now: int,
    fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    d, _, policy_dir = folders
    if fault == "malformed-retired":
        (policy_dir / "retired").write_text("alpha one\n")
    elif fault == "junk-policy":
        (policy_dir / "junk.policy").write_bytes(b"\x00garbage")
    else:
        other = Deployment.create(now=now)
        other.add_categorical("rogue")
        other.write_folders(policy_dir.parent / "other")
        (policy_dir.parent / "other" / "policies" / "p0.policy").rename(policy_dir / "rogue.policy")
    with (
        caplog.at_level(logging.ERROR, logger="fedldp.collector"),
        pytest.raises(PolicyFolderError),
    ):
        running.reload_policies()
    assert _served(d, running.address) == ["alpha", "beta"]
    alpha = d.verified(d.envelopes[0])
    assert _submit(d, running.address, alpha, now).outcome == pb.OUTCOME_ACCEPTED
    assert _reloads(running, "failed") == 1.0 and _reloads(running, "ok") == 0.0
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert messages == ["policy reload failed; keeping the policies served before"]


def test_a_folder_that_fails_to_load_refuses_to_start(
    folders: tuple[Deployment, Path, Path], tmp_path: Path, now: int
) -> None:
    d, trust_dir, policy_dir = folders
    (policy_dir / "retired").write_text("alpha 1 2\n")
    with pytest.raises(PolicyFolderError, match="retired"):
        PolicyRegistry.from_folders(trust_dir, policy_dir, now=now, audience=d.audience)
    config = d.config(
        f"sqlite:///{tmp_path / 'l.db'}", trust_dir=str(trust_dir), policy_dir=str(policy_dir)
    )
    with pytest.raises(PolicyFolderError):
        start_collector(config)


def test_sighup_with_a_malformed_retired_file_keeps_serving(now: int, tmp_path: Path) -> None:
    """The daemon: SIGHUP after a malformed `retired` file keeps every policy served
    and logs the failure (not "policies reloaded")."""
    d = Deployment.create(now=now)
    d.add_categorical("alpha")
    config = write_config(d, tmp_path, f"sqlite:///{tmp_path / 'l.db'}", "one")
    proc = spawn(config, "one")
    try:
        (tmp_path / "policies" / "retired").write_text("alpha one\n")
        proc.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "policy reload failed" not in proc.log.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "policies reloaded" not in proc.log.read_text()
        assert _served(d, proc.address) == ["alpha"]
        assert _submit(d, proc.address, d.verified(d.envelopes[0]), now).outcome == (
            pb.OUTCOME_ACCEPTED
        )
    finally:
        proc.proc.send_signal(signal.SIGTERM)
        assert proc.proc.wait(timeout=60) == 0
