"""Backup and restore of a ledger under load, and the restore epoch.

A real collector ingests reports over gRPC while `fedldp ledger backup` copies
its ledger (SQLite's online backup API; pg_dump of the suite's real PostgreSQL
server); `fedldp ledger restore` puts the copy into a fresh file or database,
which reconciles. The restored ledger has lost what was charged after the
backup, so it refuses every charge in a window overlapping [backup, restore]
(collector/ledger/restore.py) and accepts again once such windows are over. The
broken variants: the same restore without its epoch lets a subject spend again
what it spent after the backup; a backup copied back by hand charges nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from collector_testkit import Deployment, checked_report, coarse, make_report
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import ACCEPTED, BUDGET_EXHAUSTED, Ledger, open_ledger
from fedldp.collector.ledger.restore import RestoreGap, refused_by
from fedldp.collector.ledger.schema import restore_epochs
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

from fedldp.cli import main


@pytest.fixture(scope="module")
def deployment() -> Deployment:
    d = Deployment.create(now=int(time.time()))
    # ε 0.5 per report, cap 2 per day: four reports per subject and window.
    d.add_categorical("color", labels=("red", "green", "blue", "other"), window_seconds=86400)
    return d


@pytest.fixture(scope="module")
def policy(deployment: Deployment) -> VerifiedPolicy:
    return deployment.verified(deployment.envelopes[0])


@dataclass
class Store:
    live: str
    restored: str
    pg_bin: list[str]


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store(f"sqlite:///{tmp_path / 'live.db'}", f"sqlite:///{tmp_path / 'new.db'}", [])
    server = request.getfixturevalue("postgresql_server")
    return Store(
        server.create_database(), server.create_database(), ["--pg-bin", str(server.bindir)]
    )


class Load:
    """Devices sending two reports per request over real gRPC, one new subject each
    (bounded: at most `limit` requests), until stopped."""

    def __init__(self, deployment: Deployment, policy: VerifiedPolicy, address: str) -> None:
        self.deployment, self.policy, self.address = deployment, policy, address
        self.acknowledged = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def _run(self, limit: int = 5000) -> None:
        try:
            with grpc.insecure_channel(self.address) as channel:
                stub = collector_pb2_grpc.CollectorStub(channel)
                for i in range(limit):
                    if self.stop.is_set():
                        return
                    reports = [
                        make_report(
                            self.policy, CategoryOutput(k), coarse_time=coarse(int(time.time()))
                        )
                        for k in (0, 1)
                    ]
                    response = stub.Submit(
                        pb.SubmitRequest(reports=reports),
                        metadata=bearer_metadata(self.deployment.token(f"load-{i}")),
                        timeout=30,
                    )
                    assert all(o.outcome == pb.OUTCOME_ACCEPTED for o in response.outcomes)
                    self.acknowledged += 1
        except BaseException as exc:  # reported by wait_for/finish
            self.error = exc

    def wait_for(self, count: int) -> None:
        deadline = time.monotonic() + 60
        while self.acknowledged < count and self.error is None:
            assert time.monotonic() < deadline, "the load made no progress"
            time.sleep(0.01)
        assert self.error is None, self.error

    def finish(self) -> int:
        self.stop.set()
        self.thread.join(30)
        assert self.error is None, self.error
        return self.acknowledged


def _spend(address: str, deployment: Deployment, policy: VerifiedPolicy, subject: str) -> None:
    """`subject` spends its whole cap (four reports) through the collector."""
    reports = [
        make_report(policy, CategoryOutput(k), coarse_time=coarse(int(time.time())))
        for k in range(4)
    ]
    with grpc.insecure_channel(address) as channel:
        response = collector_pb2_grpc.CollectorStub(channel).Submit(
            pb.SubmitRequest(reports=reports),
            metadata=bearer_metadata(deployment.token(subject)),
            timeout=30,
        )
    assert [o.outcome for o in response.outcomes] == [pb.OUTCOME_ACCEPTED] * 4


def _cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


@pytest.fixture
def running(deployment: Deployment, store: Store) -> Iterator[RunningCollector]:
    collector = start_collector(deployment.config(store.live), registry=deployment.registry())
    yield collector
    collector.stop(2.0)


def _charge(led: Ledger, policy: VerifiedPolicy, subject: str, now: int) -> object:
    (outcome,) = led.submit(subject, [checked_report(policy)], now=now)
    return outcome


def _report_total(url: str) -> int:
    with open_ledger(url) as led:
        return led.report_count("color", 1)


def test_backup_under_load_restores_and_refuses_the_gap(
    deployment: Deployment,
    policy: VerifiedPolicy,
    store: Store,
    running: RunningCollector,
    tmp_path: Path,
) -> None:
    load = Load(deployment, policy, running.address)
    load.thread.start()
    _spend(running.address, deployment, policy, "before-backup")
    load.wait_for(30)
    acknowledged_before = load.acknowledged
    backup = tmp_path / "ledger.backup"
    made = _cli("ledger", "backup", "--ledger", store.live, *store.pg_bin, str(backup))
    assert made.exit_code == 0, made.output
    load.wait_for(load.acknowledged + 30)  # reports keep flowing after the backup
    _spend(running.address, deployment, policy, "after-backup")
    total = load.finish()
    running.stop(2.0)
    assert _report_total(store.live) == 2 * total + 8

    restored = _cli("ledger", "restore", "--ledger", store.restored, *store.pg_bin, str(backup))
    assert restored.exit_code == 0, restored.output
    assert "ledger consistent" in restored.output
    now = int(time.time())
    with open_ledger(store.restored) as led:
        assert led.reconcile() == []
        # Everything acknowledged before the backup began is there; what came after
        # the backup finished is not.
        kept = led.report_count("color", 1)
        assert 2 * acknowledged_before + 4 <= kept < 2 * total + 8
        window = policy.window_start(now)
        assert led.spent("before-backup", "color", window) == 2
        assert led.spent("after-backup", "color", window) == 0  # lost with the backup
        (gap,) = led.restore_gaps
        assert gap.restore_time is not None and gap.backup_time <= gap.restore_time <= now + 1
        # The rule: no charge in the window in progress, for anyone...
        assert _charge(led, policy, "after-backup", now) == BUDGET_EXHAUSTED
        assert _charge(led, policy, "someone-new", now) == BUDGET_EXHAUSTED
        # ... until it ends: the next window charges again.
        next_window = window + policy.window_seconds
        assert next_window > gap.restore_time
        assert _charge(led, policy, "after-backup", next_window) == ACCEPTED
        assert led.reconcile() == []

    # Through a collector on the restored ledger: GetBudget says nothing is left in
    # this window, and Submit is refused.
    collector = start_collector(deployment.config(store.restored), registry=deployment.registry())
    try:
        auth = bearer_metadata(deployment.token("after-backup"))
        with grpc.insecure_channel(collector.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            (budget,) = stub.GetBudget(
                pb.GetBudgetRequest(policy_id="color"), metadata=auth
            ).budgets
            assert (budget.epsilon_spent, budget.epsilon_remaining) == ("0", "0")
            report = make_report(policy, CategoryOutput(1), coarse_time=coarse(int(time.time())))
            response = stub.Submit(pb.SubmitRequest(reports=[report]), metadata=auth)
            assert response.outcomes[0].outcome == pb.OUTCOME_BUDGET_EXHAUSTED
    finally:
        collector.stop(2.0)

    # Broken variant: the same restore without its epoch would let "after-backup"
    # spend again in this window what it spent after the backup.
    engine = sa.create_engine(store.restored)
    with engine.begin() as connection:
        connection.execute(restore_epochs.delete())
    engine.dispose()
    with open_ledger(store.restored) as led:
        assert led.restore_gaps == ()
        assert _charge(led, policy, "after-backup", now) == ACCEPTED


def test_a_backup_copied_back_by_hand_charges_nothing(
    deployment: Deployment, policy: VerifiedPolicy, tmp_path: Path
) -> None:
    live = f"sqlite:///{tmp_path / 'live.db'}"
    with open_ledger(live) as led:
        assert _charge(led, policy, "a", int(time.time())) == ACCEPTED
    copy = tmp_path / "copy.db"
    assert _cli("ledger", "backup", "--ledger", live, str(copy)).exit_code == 0
    with open_ledger(f"sqlite:///{copy}") as led:
        (gap,) = led.restore_gaps
        assert gap.restore_time is None  # an unrestored backup: the gap has no end
        far = int(time.time()) + 400 * 86400
        assert _charge(led, policy, "b", far) == BUDGET_EXHAUSTED
        assert led.reconcile() == []  # reading and auditing still work


def test_the_gap_rule_at_its_edges() -> None:
    gap = RestoreGap(backup_time=1000, restore_time=2000)
    assert not gap.refuses(900, 100)  # ends exactly when the backup was taken
    assert gap.refuses(901, 100)  # its last second is after the backup
    assert gap.refuses(2000, 100)  # starts at the restore
    assert not gap.refuses(2001, 100)  # starts after the restore
    assert gap.refuses(0, 10_000)  # contains the whole gap
    assert RestoreGap(1000, None).refuses(10**9, 60)
    assert not refused_by((), 0, 60)
    assert refused_by((RestoreGap(0, 10), gap), 1500, 10)


def test_refusals_change_nothing(tmp_path: Path) -> None:
    live = f"sqlite:///{tmp_path / 'live.db'}"
    assert _cli("ledger", "migrate", "--ledger", live).exit_code == 0
    out = tmp_path / "b.db"
    out.write_bytes(b"keep")
    exists = _cli("ledger", "backup", "--ledger", live, str(out))
    assert exists.exit_code == 1 and "exists" in exists.output
    assert out.read_bytes() == b"keep"
    backup = tmp_path / "good.db"
    assert _cli("ledger", "backup", "--ledger", live, str(backup)).exit_code == 0
    # Restoring over an existing ledger is refused and leaves it as it was.
    over = _cli("ledger", "restore", "--ledger", live, str(backup))
    assert over.exit_code == 1 and "restore into a new file" in over.output
    with open_ledger(live) as led:
        assert led.restore_gaps == ()
    missing_tool = _cli(
        "ledger",
        "backup",
        "--ledger",
        "postgresql+psycopg://x@127.0.0.1:9/x",
        "--pg-bin",
        str(tmp_path),
        str(tmp_path / "pg.dump"),
    )
    assert missing_tool.exit_code == 1 and "pg_dump not found" in missing_tool.output
    assert not (tmp_path / "pg.dump").exists()
