"""Real collector processes: kill -9 under load, SIGTERM drain, and two collectors
sharing one PostgreSQL ledger."""

from __future__ import annotations

import signal
import threading
import time
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report, spawn, write_config
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import open_ledger
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

ACKED = {pb.OUTCOME_ACCEPTED, pb.OUTCOME_DUPLICATE, pb.OUTCOME_BUDGET_EXHAUSTED}


def _load(
    address: str,
    deployment: Deployment,
    batches: dict[str, list[list[pb.Report]]],
    outcomes: dict[bytes, int],
    stop: threading.Event,
) -> list[threading.Thread]:
    """One thread per subject sending its batches until done, an error, or `stop`."""
    lock = threading.Lock()

    def device(subject: str) -> None:
        auth = bearer_metadata(deployment.token(subject))
        with grpc.insecure_channel(address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            for batch in batches[subject]:
                if stop.is_set():
                    return
                try:
                    response = stub.Submit(
                        pb.SubmitRequest(reports=batch), metadata=auth, timeout=10
                    )
                except grpc.RpcError:
                    return  # unacknowledged: the device keeps it in its outbox
                with lock:
                    for o in response.outcomes:
                        outcomes[o.report_id] = o.outcome

    threads = [threading.Thread(target=device, args=(s,)) for s in batches]
    for t in threads:
        t.start()
    return threads


@pytest.fixture(scope="module")
def wide(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_categorical("wide", epsilon="0.01", epsilon_cap="1000")
    d.add_categorical("tight", epsilon="0.5", epsilon_cap="10")
    return d


def _batches(
    d: Deployment, now: int, subjects: int, per_subject: int, size: int
) -> dict[str, list[list[pb.Report]]]:
    policy = d.verified(d.envelopes[0])
    return {
        f"dev{s}": [
            [
                make_report(policy, CategoryOutput((s + j) % 4), coarse_time=coarse(now))
                for j in range(size)
            ]
            for _ in range(per_subject)
        ]
        for s in range(subjects)
    }


def test_kill_9_under_load_then_resubmit(wide: Deployment, tmp_path: Path, now: int) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = write_config(wide, tmp_path, url, "c1")
    # 1,000 reports; the kill comes once 300 are answered, the devices still sending.
    batches = _batches(wide, now, subjects=8, per_subject=25, size=5)
    outcomes: dict[bytes, int] = {}
    proc = spawn(config, "c1")
    stop = threading.Event()
    threads = _load(proc.address, wide, batches, outcomes, stop)
    deadline = time.monotonic() + 20
    while len(outcomes) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.proc.send_signal(signal.SIGKILL)  # kill -9 mid-load
    proc.proc.wait()
    stop.set()
    for t in threads:
        t.join()
    acked_before = dict(outcomes)
    assert len(acked_before) >= 300
    assert set(acked_before.values()) <= ACKED

    # Restart on the same ledger, resubmit every report never acknowledged.
    proc2 = spawn(config, "c1")
    try:
        pending = {
            s: [[r for r in b if r.report_id not in acked_before] for b in bs]
            for s, bs in batches.items()
        }
        pending = {s: [b for b in bs if b] for s, bs in pending.items()}
        resubmitted: dict[bytes, int] = {}
        for t in _load(proc2.address, wide, pending, resubmitted, threading.Event()):
            t.join()
        assert set(resubmitted) == {r.report_id for bs in pending.values() for b in bs for r in b}
        assert set(resubmitted.values()) <= {pb.OUTCOME_ACCEPTED, pb.OUTCOME_DUPLICATE}
    finally:
        proc2.proc.send_signal(signal.SIGTERM)
        assert proc2.proc.wait(timeout=30) == 0  # SIGTERM drains and exits cleanly

    all_ids = [r.report_id for bs in batches.values() for b in bs for r in b]
    with open_ledger(url) as led:
        # Every report is now stored exactly once (ids are the primary key) ...
        assert all(led.has_report(rid) for rid in all_ids)
        assert led.report_count("wide", 1) == len(all_ids)
        # ... and charged exactly once: spend = 0.01 x stored reports, per subject.
        policy = wide.verified(wide.envelopes[0])
        for subject, bs in batches.items():
            n = sum(len(b) for b in bs)
            assert led.spent(subject, "wide", policy.window_start(now)) == Decimal("0.01") * n
        assert led.reconcile() == []


@pytest.mark.postgres
def test_two_collector_processes_share_one_postgresql_cap(
    wide: Deployment, tmp_path: Path, now: int, postgresql_url: str
) -> None:
    """Devices of one subject race through two collectors: exactly cap/ε reports accepted."""
    config_a = write_config(wide, tmp_path, postgresql_url, "a")
    config_b = write_config(wide, tmp_path, postgresql_url, "b")
    a, b = spawn(config_a, "a"), spawn(config_b, "b")
    tight = wide.verified(wide.envelopes[1])  # ε 0.5, cap 10: 20 reports fit
    outcomes: dict[bytes, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def device(i: int) -> None:
        address = (a if i % 2 else b).address
        auth = bearer_metadata(wide.token("hot"))
        with grpc.insecure_channel(address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            barrier.wait()
            for _ in range(6):
                batch = [
                    make_report(tight, CategoryOutput(i % 4), coarse_time=coarse(now))
                    for _ in range(2)
                ]
                response = stub.Submit(pb.SubmitRequest(reports=batch), metadata=auth)
                with lock:
                    for o in response.outcomes:
                        outcomes[o.report_id] = o.outcome

    try:
        threads = [threading.Thread(target=device, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for p in (a, b):
            p.proc.send_signal(signal.SIGTERM)
        codes = [p.proc.wait(timeout=30) for p in (a, b)]
    assert codes == [0, 0]
    values = list(outcomes.values())
    assert len(values) == 96
    assert values.count(pb.OUTCOME_ACCEPTED) == 20
    assert values.count(pb.OUTCOME_BUDGET_EXHAUSTED) == 76
    with open_ledger(postgresql_url) as led:
        assert led.spent("hot", "tight", tight.window_start(now)) == Decimal("10")
        assert {p.shard for p in led.statistics("tight", 1)} <= {"a", "b"}
        assert sum(p.n for p in led.statistics("tight", 1)) == 20
        assert led.reconcile() == []
