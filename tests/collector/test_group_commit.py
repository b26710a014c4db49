"""The group committer and the SQLite ingestion connection.

The committer lingers while requests keep arriving, so concurrent requests
share one transaction; the SQLite ledger runs those transactions on a
connection of its own, which must keep the ledger's durability settings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from collector_testkit import checked_report
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.ledger import ACCEPTED, DUPLICATE, Ledger, SubmitBatch, open_ledger
from fedldp.collector.ledger.sqlite_ingest import WAL_AUTOCHECKPOINT_PAGES
from fedldp.collector.metrics import CollectorMetrics


def _commits(metrics: CollectorMetrics) -> float:
    (metric,) = metrics.commit_requests.collect()
    return next(float(s.value) for s in metric.samples if s.name.endswith("_count"))


@pytest.fixture
def ledger(sqlite_url: str) -> Iterator[Ledger]:
    led = open_ledger(sqlite_url, shard="s")
    yield led
    led.close()


def test_ingestion_connection_keeps_the_ledgers_durability_settings(
    ledger: Ledger, small_policy: VerifiedPolicy, now: int
) -> None:
    """WAL and synchronous=FULL on the connection that commits reports."""
    assert ledger.submit("alice", [checked_report(small_policy)], now=now) == [ACCEPTED]
    ingest = ledger._ingest
    assert ingest is not None
    with ingest.lock:
        conn = ingest.connection()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        checkpoint_pages = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        assert checkpoint_pages == WAL_AUTOCHECKPOINT_PAGES
    assert ledger.reconcile() == []


def test_lingering_committer_puts_concurrent_requests_in_one_transaction(
    ledger: Ledger, small_policy: VerifiedPolicy, now: int
) -> None:
    """Requests arriving while the committer lingers share its transaction; the group
    closes as soon as it holds `max_reports` (not after the whole delay). The
    linger step is long here, so that no scheduling gap can end it early."""
    metrics = CollectorMetrics()
    committer = GroupCommitter(
        ledger, metrics, max_reports=8, delay_seconds=60, linger_step_seconds=30
    )
    start = threading.Barrier(8)
    results: list[object] = []

    def one() -> None:
        start.wait()
        results.append(committer.submit(SubmitBatch("alice", [checked_report(small_policy)], now)))

    threads = [threading.Thread(target=one) for _ in range(8)]
    began = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        assert results == [[ACCEPTED]] * 8
        assert _commits(metrics) == 1
        assert time.monotonic() - began < 25
    finally:
        committer.close()


def test_an_idle_committer_does_not_wait_for_the_whole_delay(
    ledger: Ledger, small_policy: VerifiedPolicy, now: int
) -> None:
    """A lone request is committed after one linger step without arrivals, not after
    `delay_seconds` (here far longer than the test's own time limit)."""
    committer = GroupCommitter(ledger, CollectorMetrics(), delay_seconds=30)
    try:
        began = time.monotonic()
        assert committer.submit(SubmitBatch("alice", [checked_report(small_policy)], now)) == [
            ACCEPTED
        ]
        assert time.monotonic() - began < 10
    finally:
        committer.close()


def test_without_delay_each_request_may_commit_alone(
    ledger: Ledger, small_policy: VerifiedPolicy, now: int
) -> None:
    metrics = CollectorMetrics()
    committer = GroupCommitter(ledger, metrics, delay_seconds=0)
    try:
        for _ in range(3):
            assert committer.submit(SubmitBatch("alice", [checked_report(small_policy)], now)) == [
                ACCEPTED
            ]
        assert _commits(metrics) == 3
    finally:
        committer.close()


def test_reruns_for_a_stored_id_are_counted_by_reason(
    sqlite_url: str, small_policy: VerifiedPolicy, now: int
) -> None:
    """A group that met a stored report id reruns once, and the metric says why."""
    stored = checked_report(small_policy)
    with open_ledger(sqlite_url, shard="s") as first:
        assert first.submit("alice", [stored], now=now) == [ACCEPTED]
    metrics = CollectorMetrics()
    with open_ledger(sqlite_url, shard="s") as ledger:  # decides its first group as new
        committer = GroupCommitter(ledger, metrics, delay_seconds=0)
        try:
            assert committer.submit(SubmitBatch("alice", [stored], now)) == [DUPLICATE]
            assert committer.submit(SubmitBatch("alice", [stored], now)) == [DUPLICATE]
        finally:
            committer.close()

    def reruns(reason: str) -> float | None:
        return metrics.registry.get_sample_value(
            "fedldp_collector_ledger_reruns_total", {"reason": reason}
        )

    assert reruns("stored_id") == 1  # the second group read its ids first
    assert reruns("conflict") is None
