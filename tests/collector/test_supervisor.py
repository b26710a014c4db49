"""`processes` > 1: a supervisor and several collector processes on one port and one
ledger (collector/supervisor.py), as real processes on both stores."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from collector_testkit import (
    CollectorProcess,
    Deployment,
    coarse,
    free_port,
    make_report,
    spawn,
    write_config,
)
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.config import ConfigError, load_config
from fedldp.collector.ledger import open_ledger
from fedldp.collector.supervisor import restart_delay
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc


@pytest.fixture(scope="module")
def two(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_categorical("wide", epsilon="0.01", epsilon_cap="1000")
    d.add_categorical("tight", epsilon="0.5", epsilon_cap="10")  # 20 reports fit
    return d


def _children(proc: CollectorProcess) -> list[int]:
    text = Path(f"/proc/{proc.proc.pid}/task/{proc.proc.pid}/children").read_text()
    return [int(pid) for pid in text.split()]


def _stop(proc: CollectorProcess) -> int:
    proc.proc.send_signal(signal.SIGTERM)
    return proc.proc.wait(timeout=60)


def _wait_until(condition: Callable[[], bool], *, seconds: float = 60.0) -> None:
    """Poll `condition` until it holds; AssertionError after `seconds` (a bound for
    the wait, not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def test_restart_delay_backs_off() -> None:
    assert [restart_delay(n) for n in (1, 2, 3, 4, 7, 20)] == [1.0, 2.0, 4.0, 8.0, 60.0, 60.0]


def test_processes_is_validated() -> None:
    for bad in ("0", "65"):
        with pytest.raises(ConfigError, match="processes"):
            load_config(
                env={"FEDLDP_COLLECTOR_LEDGER_URL": "sqlite:////x.db"}, overrides={"processes": bad}
            )


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_processes_share_one_cap_exactly(
    two: Deployment, tmp_path: Path, now: int, store: str, request: pytest.FixtureRequest
) -> None:
    """One subject races through many connections of a 2-process collector: exactly
    cap/ε reports are accepted, both processes served, reconcile agrees."""
    url = (
        f"sqlite:///{tmp_path / 'ledger.db'}"
        if store == "sqlite"
        else str(request.getfixturevalue("postgresql_url"))
    )
    config = write_config(two, tmp_path, url, "multi", processes=2)
    proc = spawn(config, "multi")
    tight = two.verified(two.envelopes[1])
    wide = two.verified(two.envelopes[0])
    outcomes: dict[bytes, int] = {}
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    auth = bearer_metadata(two.token("hot"))

    def device(i: int) -> None:
        # Three connections per thread, 24 in all: the chance that the kernel puts
        # every one on the same process is 2 * 2^-24 < 1e-6.
        channels = [
            grpc.insecure_channel(proc.address, options=[("grpc.use_local_subchannel_pool", 1)])
            for _ in range(3)
        ]
        try:
            barrier.wait()
            for k in range(6):
                stub = collector_pb2_grpc.CollectorStub(channels[k % 3])
                batch = [
                    make_report(tight, CategoryOutput(i % 4), coarse_time=coarse(now)),
                    make_report(tight, CategoryOutput(k % 4), coarse_time=coarse(now)),
                    make_report(wide, CategoryOutput(k % 4), coarse_time=coarse(now)),
                ]
                response = stub.Submit(pb.SubmitRequest(reports=batch), metadata=auth, timeout=30)
                with lock:
                    for o in response.outcomes:
                        outcomes[o.report_id] = o.outcome
        finally:
            for ch in channels:
                ch.close()

    try:
        assert len(_children(proc)) == 2
        threads = [threading.Thread(target=device, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        code = _stop(proc)
    assert code == 0  # SIGTERM: every process drained and exited 0
    values = list(outcomes.values())
    assert len(values) == 8 * 6 * 3
    assert values.count(pb.OUTCOME_BUDGET_EXHAUSTED) == 96 - 20
    assert values.count(pb.OUTCOME_ACCEPTED) == 20 + 48
    with open_ledger(url) as led:
        assert led.spent("hot", "tight", tight.window_start(now)) == Decimal("10")
        shards = {p.shard for p in led.statistics("wide", 1)}
        assert shards == {"multi/0", "multi/1"}  # both processes took connections
        assert sum(p.n for p in led.statistics("wide", 1)) == 48
        assert led.reconcile() == []


def test_a_killed_process_is_restarted_and_nothing_acknowledged_is_lost(
    two: Deployment, tmp_path: Path, now: int
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = write_config(two, tmp_path, url, "multi", processes=2)
    proc = spawn(config, "multi")
    wide = two.verified(two.envelopes[0])
    acknowledged: list[bytes] = []
    sent: list[bytes] = []
    stop = threading.Event()
    lock = threading.Lock()

    def device(i: int) -> None:
        auth = bearer_metadata(two.token(f"dev{i}"))
        while not stop.is_set():
            reports = [
                make_report(wide, CategoryOutput(j % 4), coarse_time=coarse(now)) for j in range(5)
            ]
            with lock:
                sent.extend(r.report_id for r in reports)
            try:
                with grpc.insecure_channel(
                    proc.address, options=[("grpc.use_local_subchannel_pool", 1)]
                ) as ch:
                    response = collector_pb2_grpc.CollectorStub(ch).Submit(
                        pb.SubmitRequest(reports=reports), metadata=auth, timeout=10
                    )
            except grpc.RpcError:
                continue  # unacknowledged: a device would retry it
            with lock:
                acknowledged.extend(o.report_id for o in response.outcomes)

    threads = [threading.Thread(target=device, args=(i,)) for i in range(4)]
    try:
        for t in threads:
            t.start()
        _wait_until(lambda: len(acknowledged) >= 50)  # the load is flowing
        victim = _children(proc)[0]
        os.kill(victim, signal.SIGKILL)  # kill -9 one process mid-load
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the supervisor starts a new one
            children = _children(proc)
            if len(children) == 2 and victim not in children:
                break
            time.sleep(0.1)
        assert len(children) == 2 and victim not in children
        before = len(acknowledged)
        _wait_until(lambda: len(acknowledged) > before)  # and the service goes on
    finally:
        stop.set()
        for t in threads:
            t.join()
        code = _stop(proc)
    assert code == 0
    with open_ledger(url) as led:
        assert all(led.has_report(rid) for rid in acknowledged)
        assert led.report_count("wide", 1) <= len(sent)
        assert led.reconcile() == []


@dataclass
class Reloading:
    """A 2-process supervisor serving the policy "first" and its metrics endpoint."""

    deployment: Deployment
    base: Path
    proc: CollectorProcess
    metrics_port: int


@pytest.fixture(scope="module")
def reloading(now: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Reloading]:
    """One supervisor shared by the metrics and SIGHUP tests (either order: the
    metrics test submits under "first" only; the SIGHUP test adds "second")."""
    base = tmp_path_factory.mktemp("reloading")
    d = Deployment.create(now=now)
    d.add_categorical("first", epsilon="0.1", epsilon_cap="1")
    port = free_port()
    url = f"sqlite:///{base / 'ledger.db'}"
    config = write_config(d, base, url, "multi", processes=2, metrics_listen=f"127.0.0.1:{port}")
    proc = spawn(config, "multi")
    try:
        yield Reloading(d, base, proc, port)
    finally:
        assert _stop(proc) == 0


def test_metrics_sum_every_process(reloading: Reloading, now: int) -> None:
    d, proc = reloading.deployment, reloading.proc
    first = d.verified(d.envelopes[0])
    for i in range(12):
        reports = [make_report(first, CategoryOutput(1), coarse_time=coarse(now))]
        auth = bearer_metadata(d.token(f"m{i}"))
        with grpc.insecure_channel(
            proc.address, options=[("grpc.use_local_subchannel_pool", 1)]
        ) as ch:
            collector_pb2_grpc.CollectorStub(ch).Submit(
                pb.SubmitRequest(reports=reports), metadata=auth, timeout=30
            )
    url = f"http://127.0.0.1:{reloading.metrics_port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read()
    lines = text.decode().splitlines()
    assert 'fedldp_collector_reports_total{outcome="accepted",reason="unspecified"} 12.0' in lines
    assert "fedldp_collector_commit_queue_requests 0.0" in lines


def test_sighup_reloads_policies_in_every_process(reloading: Reloading) -> None:
    d, proc = reloading.deployment, reloading.proc

    def listed() -> list[int]:
        """How many policies 16 fresh connections see (spread over both processes: all
        16 on one with probability 2 * 2^-16, and then the test cannot fail)."""
        seen = []
        for _ in range(16):
            with grpc.insecure_channel(
                proc.address, options=[("grpc.use_local_subchannel_pool", 1)]
            ) as ch:
                response = collector_pb2_grpc.CollectorStub(ch).GetPolicies(
                    pb.GetPoliciesRequest(),
                    metadata=bearer_metadata(d.token("reader")),
                    timeout=30,
                )
            seen.append(len(response.policies))
        return seen

    assert listed() == [1] * 16
    d.add_categorical("second", epsilon="0.1", epsilon_cap="1")
    d.write_folders(reloading.base)
    proc.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while True:
        seen = listed()
        if seen == [2] * 16 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert seen == [2] * 16


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_processes_die_with_their_supervisor_and_a_new_one_starts_clean(
    two: Deployment, tmp_path: Path, now: int
) -> None:
    """kill -9 of the supervisor: its processes drain and exit (parent-death signal,
    liveness pipe); a new supervisor on the same fixed port and ledger then starts
    and serves alone, and nothing acknowledged was lost."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    port = free_port()
    config = write_config(
        two, tmp_path, url, "multi", processes=2, listen=f"127.0.0.1:{port}", drain_seconds=2.0
    )
    first = spawn(config, "multi")
    wide = two.verified(two.envelopes[0])
    acknowledged: list[bytes] = []
    auth = bearer_metadata(two.token("d"))

    def submit_one() -> None:
        report = make_report(wide, CategoryOutput(1), coarse_time=coarse(now))
        with grpc.insecure_channel(
            f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
        ) as ch:
            out = collector_pb2_grpc.CollectorStub(ch).Submit(
                pb.SubmitRequest(reports=[report]), metadata=auth, timeout=30
            )
        assert out.outcomes[0].outcome == pb.OUTCOME_ACCEPTED
        acknowledged.append(report.report_id)

    children = _children(first)
    assert len(children) == 2
    for _ in range(4):
        submit_one()
    first.proc.kill()  # kill -9 of the supervisor
    first.proc.wait()
    deadline = time.monotonic() + 60  # a bound for the wait, not a timing assertion
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in children)
    second = spawn(config, "multi")
    try:
        assert len(_children(second)) == 2
        for _ in range(4):
            submit_one()
    finally:
        assert _stop(second) == 0
    log = first.log.read_text()
    assert "the supervisor is gone; draining" in log
    with open_ledger(url) as led:
        assert all(led.has_report(rid) for rid in acknowledged)
        assert led.report_count("wide", 1) == 8
        assert led.reconcile() == []


def test_a_supervisor_does_not_start_beside_a_live_generation(
    two: Deployment, tmp_path: Path
) -> None:
    """While the generation lock of the ledger is held (an earlier generation still
    serving), a new supervisor waits, then exits 1 saying why, starting nothing."""
    import fcntl

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    config = write_config(two, tmp_path, url, "multi", processes=2, drain_seconds=0.0)
    with open(tmp_path / "ledger.db-serve.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(RuntimeError, match="exited with 1"):
            spawn(config, "multi")
    assert (
        "an earlier generation of collector processes still serves"
        in (tmp_path / "multi.log").read_text()
    )
