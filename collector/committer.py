"""Group commit: concurrent requests share one ledger transaction.

Request threads hand their checked reports to `GroupCommitter.submit` and block;
one committer thread takes everything that queued up while the previous
transaction was committing (up to `max_reports`), charges it in ONE ledger
transaction (`Ledger.submit_many`) and wakes every waiter with its outcomes. So
the durable throughput is one fsync per group, not per report, and no request
is acknowledged before its commit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import sqlalchemy as sa
from fedldp.collector.errors import LedgerUnavailableError, ShuttingDownError
from fedldp.collector.ledger import Ledger, SubmitBatch
from fedldp.collector.ledger.store import OutcomeValue
from fedldp.collector.metrics import CollectorMetrics

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    batch: SubmitBatch
    future: Future[list[OutcomeValue]] = field(default_factory=Future)


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
        """Charge `batch` in the next group transaction; block until it commits."""
        return self.submit_future(batch).result()

    def submit_future(self, batch: SubmitBatch) -> Future[list[OutcomeValue]]:
        """Queue `batch`; the future resolves after its group transaction commits.

        It fails with LedgerUnavailableError when the transaction failed (nothing
        of the batch was committed); ShuttingDownError is raised at once after
        `close`.
        """
        pending = _Pending(batch)
        with self._cond:
            if self._closing:
                raise ShuttingDownError("the collector is shutting down; retry later")
            self._queue.append(pending)
            self.metrics.in_flight.inc()
            self._cond.notify()
        return pending.future

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
            started = time.perf_counter()
            errors: Exception | None = None
            results: list[list[OutcomeValue]] = []
            try:
                results = self.ledger.submit_many([p.batch for p in taken])
            except sa.exc.SQLAlchemyError as exc:
                self.metrics.ledger_errors.inc()
                log.error("ledger transaction failed: %s", type(exc).__name__)
                errors = LedgerUnavailableError(
                    "the ledger is unavailable; nothing was stored or charged, retry later"
                )
            except Exception as exc:  # a bug must not hang every waiter
                self.metrics.ledger_errors.inc()
                log.exception("ledger transaction crashed")
                errors = LedgerUnavailableError(
                    f"ledger transaction failed ({type(exc).__name__}); nothing was stored "
                    "or charged"
                )
            else:
                self.metrics.commit_seconds.observe(time.perf_counter() - started)
                self.metrics.commit_requests.observe(len(taken))
                self.metrics.commit_reports.observe(sum(len(p.batch.reports) for p in taken))
            self.metrics.in_flight.dec(len(taken))
            if errors is not None:
                for p in taken:
                    p.future.set_exception(errors)
            else:
                for p, result in zip(taken, results, strict=True):
                    p.future.set_result(result)

    def close(self) -> None:
        """Refuse new work, commit everything queued, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join()
