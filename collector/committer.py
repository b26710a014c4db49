"""Group commit: concurrent requests share one ledger transaction.

Request threads (or asyncio handlers) hand their checked reports to the
`GroupCommitter` and wait; one committer thread takes everything that queued up
while the previous transaction was committing (up to `max_reports`), charges it
in ONE ledger transaction (`Ledger.submit_many_deferred`) and passes the group
to a sync thread, which makes it durable (`Ledger.make_durable`: on SQLite one
fsync of the log covers every group committed before it) and then wakes every
waiter with its outcomes. So the durable throughput is one fsync per group or
fewer, not per report; the next group's transaction runs while the disk syncs
the last one; and no request is acknowledged before its commit is durable.

Waking waiters is the committer's per-request cost, so it is kept small: a
blocked thread waits on a bare lock that the committer releases (one futex wake,
no Condition or Future objects), and the asyncio handlers of one event loop are
resolved by a single `call_soon_threadsafe` per group.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from typing import Any

import sqlalchemy as sa
from fedldp.collector.errors import LedgerUnavailableError, ShuttingDownError
from fedldp.collector.ledger import Ledger, SubmitBatch
from fedldp.collector.ledger.sqlite_ingest import DurabilityError
from fedldp.collector.ledger.store import OutcomeValue
from fedldp.collector.metrics import CollectorMetrics

log = logging.getLogger(__name__)


class _Pending:
    """One request's batch, waiting for its group's commit.

    Exactly one of `lock` (a blocked thread waits to acquire it) and `future`
    (an asyncio future of `loop`) is set.
    """

    __slots__ = ("batch", "error", "future", "lock", "loop", "outcomes")

    def __init__(
        self,
        batch: SubmitBatch,
        lock: Any = None,
        loop: asyncio.AbstractEventLoop | None = None,
        future: asyncio.Future[list[OutcomeValue]] | None = None,
    ) -> None:
        self.batch = batch
        self.lock = lock
        self.loop = loop
        self.future = future
        self.outcomes: list[OutcomeValue] = []
        self.error: Exception | None = None


def _resolve(pending: list[_Pending]) -> None:
    """Set the asyncio futures of `pending` (runs on their event loop)."""
    for p in pending:
        future = p.future
        if future is None or future.done():  # cancelled: the caller went away
            continue
        if p.error is not None:
            future.set_exception(p.error)
        else:
            future.set_result(p.outcomes)


class GroupCommitter:
    """A committer thread batching pending submits into shared transactions, and a
    sync thread acknowledging them once durable."""

    def __init__(
        self,
        ledger: Ledger,
        metrics: CollectorMetrics,
        *,
        max_reports: int = 20_000,
        delay_seconds: float = 0.0,
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.max_reports = max_reports
        #: How long the oldest queued request waits for others to join its group.
        self.delay_seconds = delay_seconds
        self._queued_reports = 0
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closing = False
        # Committed groups waiting for durability: (requests, commit sequence, started).
        self._committed: deque[tuple[list[_Pending], int, float] | None] = deque()
        self._committed_cond = threading.Condition()
        #: Set once an fsync failed: nothing is acknowledged any more.
        self._failed: LedgerUnavailableError | None = None
        self._thread = threading.Thread(target=self._run, name="ledger-committer", daemon=True)
        self._sync_thread = threading.Thread(target=self._run_sync, name="ledger-sync", daemon=True)
        self._thread.start()
        self._sync_thread.start()

    def submit(self, batch: SubmitBatch) -> list[OutcomeValue]:
        """Charge `batch` in the next group transaction; block until it is durable.

        Raises LedgerUnavailableError when the transaction failed (nothing of the
        batch was committed) or the ledger can no longer make commits durable,
        ShuttingDownError at once after `close`.
        """
        lock = threading.Lock()
        lock.acquire()
        pending = _Pending(batch, lock=lock)
        self._enqueue(pending)
        lock.acquire()  # released by the sync thread once the group is durable
        if pending.error is not None:
            raise pending.error
        return pending.outcomes

    def submit_async(self, batch: SubmitBatch) -> asyncio.Future[list[OutcomeValue]]:
        """`submit` for an asyncio handler: a future of the running loop, resolved once
        the group's transaction is durable (with the same errors)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[OutcomeValue]] = loop.create_future()
        self._enqueue(_Pending(batch, loop=loop, future=future))
        return future

    def _enqueue(self, pending: _Pending) -> None:
        with self._cond:
            if self._failed is not None:
                raise self._failed
            if self._closing:
                raise ShuttingDownError("the collector is shutting down; retry later")
            self._queue.append(pending)
            self._queued_reports += len(pending.batch.reports)
            if len(self._queue) == 1 or self._queued_reports >= self.max_reports:
                self._cond.notify()
        self.metrics.in_flight.inc()

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            if self.delay_seconds > 0 and not self._closing:
                # Let concurrent requests join this group (fewer, larger transactions:
                # the per-transaction cost is spread over more reports).
                deadline = time.monotonic() + self.delay_seconds
                while self._queued_reports < self.max_reports and not self._closing:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            taken: list[_Pending] = []
            count = 0
            while self._queue and (
                not taken or count + len(self._queue[0].batch.reports) <= self.max_reports
            ):
                item = self._queue.popleft()
                taken.append(item)
                count += len(item.batch.reports)
            self._queued_reports -= count
            return taken

    def _run(self) -> None:
        try:
            while True:
                taken = self._take()
                if taken is None:
                    return
                started = time.perf_counter()
                sequence = self._commit(taken)
                with self._committed_cond:
                    self._committed.append((taken, sequence, started))
                    self._committed_cond.notify()
        finally:
            with self._committed_cond:
                self._committed.append(None)  # no more groups: the sync thread ends
                self._committed_cond.notify()

    def _commit(self, taken: list[_Pending]) -> int:
        """One transaction for every batch in `taken`; each gets outcomes or the error.

        Returns the commit's sequence number for `Ledger.make_durable` (0: nothing
        to make durable, e.g. the transaction failed).
        """
        if self._failed is not None:
            for p in taken:
                p.error = self._failed
            return 0
        try:
            results, sequence = self.ledger.submit_many_deferred([p.batch for p in taken])
        except sa.exc.SQLAlchemyError as exc:
            self.metrics.ledger_errors.inc()
            log.error("ledger transaction failed: %s", type(exc).__name__)
            error = LedgerUnavailableError(
                "the ledger is unavailable; nothing was stored or charged, retry later"
            )
        except Exception as exc:  # a bug must not hang every waiter
            self.metrics.ledger_errors.inc()
            log.exception("ledger transaction crashed")
            error = LedgerUnavailableError(
                f"ledger transaction failed ({type(exc).__name__}); nothing was stored or charged"
            )
        else:
            self.metrics.commit_requests.observe(len(taken))
            self.metrics.commit_reports.observe(sum(len(p.batch.reports) for p in taken))
            for p, result in zip(taken, results, strict=True):
                p.outcomes = result
            return sequence
        for p in taken:
            p.error = error
        return 0

    def _run_sync(self) -> None:
        """Make committed groups durable (one fsync for all that are waiting), then
        wake their waiters, in commit order."""
        ended = False
        while not ended:
            with self._committed_cond:
                while not self._committed:
                    self._committed_cond.wait()
                groups = list(self._committed)
                self._committed.clear()
            if groups[-1] is None:
                ended = True
            done = [g for g in groups if g is not None]
            sequence = max((g[1] for g in done), default=0)
            if sequence and self._failed is None:
                try:
                    self.ledger.make_durable(sequence)
                except DurabilityError:
                    self.metrics.ledger_errors.inc()
                    log.critical(
                        "fsync of the ledger failed; refusing every request from now on "
                        "(restart the collector once the disk is healthy)"
                    )
                    self._failed = LedgerUnavailableError(
                        "the ledger cannot make commits durable; retry against a healthy collector"
                    )
            finished = time.perf_counter()
            for taken, group_sequence, started in done:
                if group_sequence and self._failed is not None:
                    for p in taken:  # committed, but not provably durable: never acknowledged
                        p.error = self._failed
                if taken[0].error is None:  # the group's requests share one outcome
                    self.metrics.commit_seconds.observe(finished - started)
                self.metrics.in_flight.dec(len(taken))
                self._wake(taken)

    @staticmethod
    def _wake(taken: list[_Pending]) -> None:
        """Wake every waiter of a finished group: release blocked threads, and hand
        each event loop its futures in one callback."""
        by_loop: dict[asyncio.AbstractEventLoop, list[_Pending]] = {}
        for p in taken:
            if p.loop is None:
                p.lock.release()
            else:
                by_loop.setdefault(p.loop, []).append(p)
        for loop, pending in by_loop.items():
            try:
                loop.call_soon_threadsafe(_resolve, pending)
            except RuntimeError:  # the loop was closed: nobody is waiting any more
                log.warning(
                    "event loop closed before %d request(s) got their outcomes", len(pending)
                )

    def close(self) -> None:
        """Refuse new work, commit (durably) everything queued, and stop the threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
        self._sync_thread.join()
