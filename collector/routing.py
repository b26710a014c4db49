"""The collector over a sharded ledger: one group committer per shard, routed by subject.

A Submit request comes from one authenticated subject, so it goes whole to that
subject's shard (`ShardedLedger.route`): a request is never split. Each shard
has its own `GroupCommitter` (its own thread and transactions), so the requests
that arrive together are split by shard and each part commits on its shard, in
parallel. When a shard fails, only its requests fail (UNAVAILABLE, "nothing was
stored or charged"); requests of subjects on the other shards are answered as
usual. Every report's outcome is per report and idempotent (store.py), so the
device's retry of a failed request completes it: ACCEPTED, or DUPLICATE for a
report whose commit happened before the answer was lost.

A plain ledger (one URL) keeps the single `GroupCommitter`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import sqlalchemy as sa
from fedldp.collector.committer import FailureLog, GroupCommitter
from fedldp.collector.config import CollectorConfig
from fedldp.collector.errors import LedgerUnavailableError, SubjectSplitRefusedError
from fedldp.collector.ledger import Ledger, SubmitBatch, open_ledger
from fedldp.collector.ledger.shards import (
    ShardedLedger,
    SubjectSplitError,
    open_sharded,
    refuse_if_shard,
)
from fedldp.collector.ledger.store import OutcomeValue
from fedldp.collector.metrics import CollectorMetrics

log = logging.getLogger(__name__)

AnyLedger = Ledger | ShardedLedger


def open_collector_ledger(config: CollectorConfig) -> AnyLedger:
    """The collector's ledger: `ledger_shards` (sharded) or `ledger_url` (one database,
    refused when it is one shard of a sharded ledger: `refuse_if_shard`)."""
    instance = config.instance_id or None
    isolation = config.ledger_isolation or None
    if config.ledger_shards:
        return open_sharded(config.ledger_shards, shard=instance, isolation=isolation)
    ledger = open_ledger(config.ledger_url, shard=instance, isolation=isolation)
    try:
        refuse_if_shard(ledger)
    except BaseException:
        ledger.close()
        raise
    return ledger


def ledger_for(ledger: AnyLedger, subject: str) -> Ledger:
    """The single ledger holding `subject`'s charges."""
    return ledger.for_subject(subject) if isinstance(ledger, ShardedLedger) else ledger


class ShardedCommitter:
    """`GroupCommitter`'s interface over one committer per shard (module docstring)."""

    def __init__(self, ledger: ShardedLedger, metrics: CollectorMetrics, **options: Any) -> None:
        self.ledger = ledger
        self.failure_log = FailureLog()  # one line budget for every shard
        self.committers = [
            GroupCommitter(s, metrics, shard_index=i, failure_log=self.failure_log, **options)
            for i, s in enumerate(ledger.shards)
        ]
        self._children = {
            (i, r): metrics.shard_requests.labels(str(i), r)
            for i in range(len(self.committers))
            for r in ("ok", "unavailable")
        }

    def _route(self, batch: SubmitBatch) -> int:
        try:
            return self.ledger.route(batch.subject)
        except SubjectSplitError as exc:
            log.error("subject split over shards: refused")
            raise SubjectSplitRefusedError(str(exc)) from None
        except sa.exc.SQLAlchemyError as exc:
            self.failure_log.failed(
                "ledger shard unreachable while routing",
                {"error": type(exc).__name__},
            )
            raise LedgerUnavailableError(
                "a ledger shard is unavailable; nothing was stored or charged, retry later"
            ) from None

    def submit(self, batch: SubmitBatch) -> list[OutcomeValue]:
        """`GroupCommitter.submit` on the subject's shard."""
        index = self._route(batch)
        try:
            outcomes = self.committers[index].submit(batch)
        except LedgerUnavailableError:
            self._children[(index, "unavailable")].inc()
            raise
        self._children[(index, "ok")].inc()
        return outcomes

    def submit_async(self, batch: SubmitBatch) -> asyncio.Future[list[OutcomeValue]]:
        """`GroupCommitter.submit_async` on the subject's shard (a moved slot's first
        request of a subject reads the shards once, on the event loop)."""
        index = self._route(batch)
        future = self.committers[index].submit_async(batch)

        def count(done: asyncio.Future[list[OutcomeValue]]) -> None:
            failed = done.cancelled() or done.exception() is not None
            self._children[(index, "unavailable" if failed else "ok")].inc()

        future.add_done_callback(count)
        return future

    def close(self) -> None:
        """Close every shard's committer (each commits what it has queued)."""
        for c in self.committers:
            c.close()


def make_committer(
    ledger: AnyLedger, metrics: CollectorMetrics, **options: Any
) -> GroupCommitter | ShardedCommitter:
    """A `GroupCommitter` for a plain ledger, a `ShardedCommitter` for shards."""
    if isinstance(ledger, ShardedLedger):
        return ShardedCommitter(ledger, metrics, **options)
    return GroupCommitter(ledger, metrics, **options)
