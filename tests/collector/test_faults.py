"""Fault injection under load: the database failing mid-batch, the ledger's disk
full, and kill -9 of the collector at random points. Devices keep every report
in an outbox until it is acknowledged and resend what was not (the SDK's
behaviour). Each test asserts that nothing acknowledged is lost, nothing is
charged twice (each subject's spend is exactly its reports x epsilon) and that
reconcile is clean."""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path

import grpc
from collector_testkit import (
    Deployment,
    coarse,
    free_port,
    make_report,
    spawn,
    write_config,
)
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

ACKNOWLEDGED = {pb.OUTCOME_ACCEPTED, pb.OUTCOME_DUPLICATE}
EPSILON = Decimal("0.01")


class Fleet:
    """Devices with outboxes of batches, sending until every batch is acknowledged."""

    def __init__(
        self,
        deployment: Deployment,
        policy: VerifiedPolicy,
        now: int,
        *,
        devices: int,
        batches: int,
    ) -> None:
        self.deployment = deployment
        self.outboxes = {
            f"device-{i}": [
                [
                    make_report(policy, CategoryOutput(j % 4), coarse_time=coarse(now))
                    for j in range(5)
                ]
                for _ in range(batches)
            ]
            for i in range(devices)
        }
        self.acknowledged: dict[bytes, int] = {}
        self.sent: dict[str, list[bytes]] = {subject: [] for subject in self.outboxes}
        self.errors = 0
        self._lock = threading.Lock()

    def run(
        self,
        address: Callable[[], str],
        *,
        deadline: float,
        stop: threading.Event | None = None,
    ) -> None:
        """Send every outbox (one thread per device; no new batch once `stop` is
        set), each batch until acknowledged or `deadline`."""

        def device(subject: str) -> None:
            auth = bearer_metadata(self.deployment.token(subject))
            for batch in self.outboxes[subject]:
                if stop is not None and stop.is_set():
                    return
                self.sent[subject].extend(r.report_id for r in batch)
                while time.monotonic() < deadline:
                    try:
                        with grpc.insecure_channel(address()) as channel:
                            response = collector_pb2_grpc.CollectorStub(channel).Submit(
                                pb.SubmitRequest(reports=batch), metadata=auth, timeout=5
                            )
                    except grpc.RpcError:
                        with self._lock:
                            self.errors += 1
                        time.sleep(0.02)
                        continue  # unacknowledged: resend the same batch
                    assert [o.report_id for o in response.outcomes] == [r.report_id for r in batch]
                    with self._lock:
                        for o in response.outcomes:
                            assert o.outcome in ACKNOWLEDGED, o
                            self.acknowledged[o.report_id] = o.outcome
                    break

        threads = [threading.Thread(target=device, args=(s,)) for s in self.outboxes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def check(self, led: Ledger, policy: VerifiedPolicy, now: int) -> None:
        """Every report acknowledged and stored once, each subject charged exactly
        its reports x epsilon, reconcile clean."""
        sent = [rid for ids in self.sent.values() for rid in ids]
        assert set(self.acknowledged) == set(sent)  # every report acknowledged at last
        assert all(led.has_report(rid) for rid in sent)
        assert led.report_count(policy.policy_id, policy.version) == len(sent)
        window = policy.window_start(now)
        for subject, ids in self.sent.items():
            assert led.spent(subject, policy.policy_id, window) == EPSILON * len(ids)
        assert led.reconcile() == []


def _deployment(now: int) -> tuple[Deployment, VerifiedPolicy]:
    d = Deployment.create(now=now)
    env = d.add_categorical("wide", epsilon=str(EPSILON), epsilon_cap="1000")
    return d, d.verified(env)


def _ledger_errors(running: RunningCollector) -> float:
    return running.metrics.registry.get_sample_value("fedldp_collector_ledger_errors_total") or 0.0


def _ingest(running: RunningCollector) -> tuple[threading.Lock, sqlite3.Connection]:
    ingest = running.ledger._ingest
    assert ingest is not None
    with ingest.lock:
        return ingest.lock, ingest.connection()  # type: ignore[return-value]


def test_the_database_failing_mid_batch_loses_and_double_charges_nothing(
    tmp_path: Path, now: int
) -> None:
    """SQLite interrupts group transactions at random steps (a progress handler,
    every 50 virtual-machine steps a 1% chance: a transaction fails anywhere from
    BEGIN to COMMIT); the requests of a failed group answer UNAVAILABLE and are
    resent."""
    d, policy = _deployment(now)
    running = start_collector(
        d.config(f"sqlite:///{tmp_path / 'ledger.db'}"), registry=d.registry(now=now)
    )
    rng = random.Random(20261201)
    _, conn = _ingest(running)
    conn.set_progress_handler(lambda: rng.random() < 0.01, 50)
    fleet = Fleet(d, policy, now, devices=6, batches=12)
    try:
        fleet.run(lambda: running.address, deadline=time.monotonic() + 120)
        assert _ledger_errors(running) > 0 and fleet.errors > 0  # faults happened
        conn.set_progress_handler(None, 0)
        fleet.check(running.ledger, policy, now)
    finally:
        running.stop(1.0)


def test_a_full_disk_refuses_then_recovers_without_loss(tmp_path: Path, now: int) -> None:
    """The ledger may not grow (`max_page_count` at its size: SQLITE_FULL, as on a
    full disk) for a while under load, then has room again."""
    d, policy = _deployment(now)
    running = start_collector(
        d.config(f"sqlite:///{tmp_path / 'ledger.db'}"), registry=d.registry(now=now)
    )
    lock, conn = _ingest(running)
    with lock:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages}")
    fleet = Fleet(d, policy, now, devices=4, batches=10)
    freed = threading.Timer(1.0, lambda: _free(lock, conn))
    try:
        freed.start()
        fleet.run(lambda: running.address, deadline=time.monotonic() + 120)
        freed.join()
        assert _ledger_errors(running) > 0 and fleet.errors > 0  # the disk was full
        fleet.check(running.ledger, policy, now)
    finally:
        running.stop(1.0)


def _free(lock: threading.Lock, conn: sqlite3.Connection) -> None:
    with lock:
        conn.execute("PRAGMA max_page_count=1073741823")


def test_kill_9_at_random_points_under_load_loses_nothing(tmp_path: Path, now: int) -> None:
    """The collector process is killed (SIGKILL) three times at random moments under
    load and restarted on the same port; devices resend what was not acknowledged."""
    d, policy = _deployment(now)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    port = free_port()
    config = write_config(d, tmp_path, url, "victim", listen=f"127.0.0.1:{port}")
    proc = spawn(config, "victim")
    fleet = Fleet(d, policy, now, devices=4, batches=300)  # more than they get to
    stop = threading.Event()
    sender = threading.Thread(
        target=fleet.run,
        args=(lambda: f"127.0.0.1:{port}",),
        kwargs={"deadline": time.monotonic() + 180, "stop": stop},
    )
    rng = random.Random(4242)
    sender.start()
    try:
        for _ in range(3):
            # Devices reconnect within 20 ms of a start (their retry pause), so each
            # kill lands 0.1-0.5 s into a stream of calls.
            time.sleep(rng.uniform(0.1, 0.5))
            proc.proc.kill()
            proc.proc.wait()
            proc = spawn(config, "victim")
        time.sleep(0.2)
        stop.set()  # no new batches; what is outstanding is resent until acknowledged
        sender.join()
    finally:
        stop.set()
        proc.proc.kill()
        proc.proc.wait()
    assert fleet.errors > 0  # calls failed across the kills
    with open_ledger(url) as led:
        fleet.check(led, policy, now)
