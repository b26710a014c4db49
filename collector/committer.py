"""Group commit: concurrent requests share one ledger transaction.

Request threads (or asyncio handlers) hand their checked reports to the
`GroupCommitter` and wait; one committer thread takes everything that queued up
while the previous transaction was committing (up to `max_reports`), charges it
in ONE ledger transaction (`Ledger.submit_many`) and wakes every waiter with its
outcomes. So the durable throughput is one fsync per group, not per report, and
no request is acknowledged before its commit.

Under load, the committer lingers before it commits, for as long as requests
keep arriving (`delay_seconds` at most, in steps of `LINGER_STEP_SECONDS`; it
stops at the first step that brought nothing, or at `max_reports`): fewer,
larger transactions, whose fixed cost (statements, WAL write, fsync) is spread
over more requests. An idle collector adds one step of latency.

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
from fedldp.collector.logbudget import LogBudget
from fedldp.collector.metrics import CollectorMetrics

log = logging.getLogger(__name__)

#: The committer's linger step (see the module docstring).
LINGER_STEP_SECONDS = 0.0005


class FailureLog:
    """ERROR lines for failed ledger transactions, at most `lines` per `interval` s.

    A ledger (or shard) outage fails every group transaction, hundreds a second:
    each is counted (`fedldp_collector_ledger_errors_total`), but only `lines`
    lines per interval are written, each naming the shard (its index and its
    database, password hidden) and the error class; the failures past that are
    reported by one `ledger failures not logged` line, with their count, when
    the next interval starts (the refusals' rule, collector/server.py RefusalLog).
    One log per ledger: shared by the committers of a sharded ledger.
    """

    def __init__(
        self, *, lines: int = 10, interval: float = 10.0, clock: Any = time.monotonic
    ) -> None:
        self.budget = LogBudget(lines=lines, interval=interval, clock=clock)

    def failed(self, message: str, fields: dict[str, Any]) -> None:
        """Log one failure (`fields`: shard, database, error), within the budget."""
        allowed, suppressed = self.budget.admit()
        if suppressed:
            log.error(
                "ledger failures not logged",
                extra={"fields": {"count": suppressed, "seconds": self.budget.interval}},
            )
        if allowed:
            log.error(message, extra={"fields": fields})


def ledger_name(ledger: Ledger) -> str:
    """The ledger's database URL with the password hidden (for log lines)."""
    try:
        return sa.make_url(ledger.url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "?"


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
        self,
        ledger: Ledger,
        metrics: CollectorMetrics,
        *,
        max_reports: int = 20_000,
        delay_seconds: float = 0.0,
        linger_step_seconds: float = LINGER_STEP_SECONDS,
        shard_index: int | None = None,
        failure_log: FailureLog | None = None,
    ) -> None:
        self.ledger = ledger
        #: This committer's shard of a sharded ledger (None: the one ledger).
        self.shard_index = shard_index
        self.failure_log = failure_log or FailureLog()
        self._failure_fields = {"shard": shard_index, "database": ledger_name(ledger)}
        self.metrics = metrics
        self.max_reports = max_reports
        #: The longest the committer lingers for more requests before a commit.
        self.delay_seconds = delay_seconds
        self.linger_step_seconds = linger_step_seconds
        self._queued_reports = 0
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
            self._queued_reports += len(pending.batch.reports)
            # The committer waits for a first request, or lingers until this many.
            if len(self._queue) == 1 or self._queued_reports >= self.max_reports:
                self._cond.notify()
        self.metrics.in_flight.inc()

    def _take(self) -> list[_Pending] | None:
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            self._linger()
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

    def _linger(self) -> None:
        """Wait (holding nothing but the condition) while requests keep arriving, up
        to `delay_seconds`. Call with `_cond` held and the queue non-empty."""
        if self.delay_seconds <= 0:
            return
        deadline = time.monotonic() + self.delay_seconds
        seen = len(self._queue)
        while self._queued_reports < self.max_reports and not self._closing:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(min(self.linger_step_seconds, left))
            if len(self._queue) == seen:
                return  # a step without arrivals: commit now
            seen = len(self._queue)

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
        ledger = self.ledger
        retries, stored_id_reruns = ledger.retries, ledger.stored_id_reruns
        try:
            results = ledger.submit_many([p.batch for p in taken])
        except sa.exc.SQLAlchemyError as exc:
            self.metrics.ledger_errors.inc()
            self.failure_log.failed(
                "ledger transaction failed",
                {**self._failure_fields, "error": type(exc).__name__},
            )
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
        if ledger.retries != retries:  # counters only grow (a read retried meanwhile counts too)
            self.metrics.ledger_reruns.labels("conflict").inc(ledger.retries - retries)
        if ledger.stored_id_reruns != stored_id_reruns:
            self.metrics.ledger_reruns.labels("stored_id").inc(
                ledger.stored_id_reruns - stored_id_reruns
            )
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
