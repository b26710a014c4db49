"""Group commit: concurrent requests share one ledger transaction.

Request threads (or asyncio handlers) hand their checked reports to the
`GroupCommitter` and wait; one committer thread takes everything that queued up
while the previous transaction was committing (up to `max_reports`), charges it
in ONE ledger transaction (`Ledger.submit_many`) and wakes every waiter with its
outcomes. So the durable throughput is one fsync per group, not per report, and
no request is acknowledged before its commit.

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
    """One committer thread batching pending submits into shared transactions."""

    def __init__(
        self, ledger: Ledger, metrics: CollectorMetrics, *, max_reports: int = 20_000
    ) -> None:
        self.ledger = ledger
        self.metrics = metrics
        self.max_reports = max_reports
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="ledger-committer", daemon=True)
        self._thread.start()

    def submit(self, batch: SubmitBatch) -> list[OutcomeValue]:
        """Charge `batch` in the next group transaction; block until it commits.

        Raises LedgerUnavailableError when the transaction failed (nothing of the
        batch was committed), ShuttingDownError at once after `close`.
        """
        lock = threading.Lock()
        lock.acquire()
        pending = _Pending(batch, lock=lock)
        self._enqueue(pending)
        lock.acquire()  # released by the committer once the group's transaction ended
        if pending.error is not None:
            raise pending.error
        return pending.outcomes

    def submit_async(self, batch: SubmitBatch) -> asyncio.Future[list[OutcomeValue]]:
        """`submit` for an asyncio handler: a future of the running loop, resolved after
        the group's transaction (with the same errors)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[OutcomeValue]] = loop.create_future()
        self._enqueue(_Pending(batch, loop=loop, future=future))
        return future

    def _enqueue(self, pending: _Pending) -> None:
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the collector is shutting down; retry later")
            self._queue.append(pending)
            self._cond.notify()
        self.metrics.in_flight.inc()

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            taken: list[_Pending] = []
            count = 0
            while self._queue and (
                not taken or count + len(self._queue[0].batch.reports) <= self.max_reports
            ):
                item = self._queue.popleft()
                taken.append(item)
                count += len(item.batch.reports)
            return taken

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            self._commit(taken)
            self._wake(taken)

    def _commit(self, taken: list[_Pending]) -> None:
        """One transaction for every batch in `taken`; each gets outcomes or the error."""
        started = time.perf_counter()
        error: Exception | None = None
        try:
            results = self.ledger.submit_many([p.batch for p in taken])
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
            self.metrics.commit_seconds.observe(time.perf_counter() - started)
            self.metrics.commit_requests.observe(len(taken))
            self.metrics.commit_reports.observe(sum(len(p.batch.reports) for p in taken))
            for p, result in zip(taken, results, strict=True):
                p.outcomes = result
        if error is not None:
            for p in taken:
                p.error = error
        self.metrics.in_flight.dec(len(taken))

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
        """Refuse new work, commit everything queued, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
