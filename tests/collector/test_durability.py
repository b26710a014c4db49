"""Pipelined group commit: nothing is acknowledged before its commit is durable.

The SQLite ledger commits ingestion transactions without an fsync and makes
them durable with one fsync of the write-ahead log (collector/ledger/
sqlite_ingest.py); the group committer acknowledges a request only after that.
These tests hold the fsync back, or make it fail, and watch what the waiting
requests see.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.errors import LedgerUnavailableError
from fedldp.collector.ledger import (
    ACCEPTED,
    CheckedReport,
    Ledger,
    SubmitBatch,
    open_ledger,
    sqlite_ingest,
)
from fedldp.collector.ledger.sqlite_ingest import DurabilityError
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.testing import Deployment


def _report(policy: VerifiedPolicy) -> CheckedReport:
    return CheckedReport(
        secrets.token_bytes(16), policy, CategoryOutput(1), hashlib.sha256(b"c").digest(), 0
    )


@pytest.fixture
def policy(deployment: Deployment) -> VerifiedPolicy:
    return deployment.verified(
        deployment.add_categorical("durable", epsilon="0.001", epsilon_cap="1")
    )


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    led = open_ledger(sqlite_url, shard="s")
    yield led
    led.close()


class _GatedLedger(Ledger):
    """A real SQLite ledger whose `make_durable` waits for the test's go-ahead."""

    def __init__(self, url: str) -> None:
        super().__init__(url, shard="s")
        self.syncing = threading.Event()
        self.go = threading.Event()
        self.fail = False

    def make_durable(self, sequence: int) -> None:
        self.syncing.set()
        assert self.go.wait(10)
        if self.fail:
            raise DurabilityError(5, "fsync of the ledger's write-ahead log failed: EIO")
        super().make_durable(sequence)


def test_fsync_of_the_log_follows_each_commit(
    ledger: Ledger, policy: VerifiedPolicy, now: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`submit_many` returns only after an fsync of the WAL file issued after COMMIT;
    one fsync covers every transaction committed before it."""
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(sqlite_ingest.os, "fsync", fsync)
    wal_inode = None
    for _ in range(3):
        assert ledger.submit("alice", [_report(policy)], now=now) == [ACCEPTED]
        wal = Path(ledger.url.removeprefix("sqlite:///") + "-wal")
        wal_inode = os.stat(wal).st_ino
        assert synced and synced[-1] == wal_inode
    count = len(synced)
    outcomes, first = ledger.submit_many_deferred([SubmitBatch("bob", [_report(policy)], now)])
    _, second = ledger.submit_many_deferred([SubmitBatch("bob", [_report(policy)], now)])
    assert outcomes == [[ACCEPTED]] and second == first + 1
    assert len(synced) == count  # committed, not yet synced
    ledger.make_durable(second)
    ledger.make_durable(first)  # already covered by the fsync for `second`
    assert len(synced) == count + 1 and synced[-1] == wal_inode


def test_no_request_is_acknowledged_before_its_group_is_durable(
    sqlite_url: str, policy: VerifiedPolicy, now: int
) -> None:
    ledger = _GatedLedger(sqlite_url)
    committer = GroupCommitter(ledger, CollectorMetrics())
    report = _report(policy)
    result: list[object] = []
    waiter = threading.Thread(
        target=lambda: result.append(committer.submit(SubmitBatch("alice", [report], now)))
    )
    try:
        waiter.start()
        assert ledger.syncing.wait(10)
        # Committed (visible to readers), yet its request is still waiting.
        assert ledger.has_report(report.report_id)
        waiter.join(0.2)
        assert waiter.is_alive() and result == []
        ledger.go.set()
        waiter.join(10)
        assert result == [[ACCEPTED]]
    finally:
        ledger.go.set()
        committer.close()
        ledger.close()


def test_a_failed_fsync_is_never_acknowledged_and_stops_the_collector(
    sqlite_url: str, policy: VerifiedPolicy, now: int
) -> None:
    """After an fsync error nothing is acknowledged: the waiting request gets an
    error (its device will resend; the ledger answers DUPLICATE if the commit
    survived), and every later request is refused at once."""
    ledger = _GatedLedger(sqlite_url)
    ledger.fail = True
    ledger.go.set()
    committer = GroupCommitter(ledger, CollectorMetrics())
    try:
        with pytest.raises(LedgerUnavailableError, match="cannot make commits durable"):
            committer.submit(SubmitBatch("alice", [_report(policy)], now))
        with pytest.raises(LedgerUnavailableError, match="cannot make commits durable"):
            committer.submit(SubmitBatch("alice", [_report(policy)], now))
        assert ledger.reconcile() == []  # the commit itself is consistent
    finally:
        committer.close()
        ledger.close()


def test_close_makes_everything_committed_durable(
    sqlite_url: str, policy: VerifiedPolicy, now: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = open_ledger(sqlite_url, shard="s")
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(sqlite_ingest.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    _, sequence = ledger.submit_many_deferred([SubmitBatch("a", [_report(policy)], now)])
    assert sequence and not synced
    ledger.close()
    assert synced


def test_delayed_group_commit_gathers_concurrent_requests(
    sqlite_url: str, policy: VerifiedPolicy, now: int
) -> None:
    """With a delay, requests arriving within it share one transaction (the group
    closes early once it holds `max_reports`)."""
    ledger = open_ledger(sqlite_url, shard="s")
    metrics = CollectorMetrics()
    committer = GroupCommitter(ledger, metrics, max_reports=8, delay_seconds=30)
    start = threading.Barrier(8)
    results: list[object] = []

    def one() -> None:
        start.wait()
        results.append(committer.submit(SubmitBatch("alice", [_report(policy)], now)))

    threads = [threading.Thread(target=one) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert results == [[ACCEPTED]] * 8
        groups = metrics.commit_requests.collect()[0].samples
        count = next(s.value for s in groups if s.name.endswith("_count"))
        assert count == 1
    finally:
        committer.close()
        ledger.close()
