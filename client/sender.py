"""Sending: deliver the outbox's stored bytes to the collector, obeying the device's gate.

`Sender.flush` and the background loop submit the stored report bytes,
unchanged, batch by batch, until the collector acknowledges them (ACCEPTED or
DUPLICATE) or refuses them for good (budget exhausted, invalid, unknown or
expired policy, id conflict: an event, never a retry). A failed call (no
answer, or a refusal with a ``retry-after-ms`` hint) closes the device's one
`SendGate` for that collector (exponential backoff with full jitter, never
shorter than the hint); the next send is one batch as a probe, and the rest
follow once it succeeded. `wake()` makes every pending report due at once.

Sends happen on the sender's schedule, never inside `record()`, so the timing
of sends does not follow the timing of values.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedldp.client.device_store import DeviceStore, Event
from fedldp.client.events import EventSink
from fedldp.client.outbox import Outbox, OutboxEntry, SendGate
from fedldp.client.results import ClientClosedError, FlushResult
from fedldp.client.transport import Backoff, Transport, TransportError
from fedldp.v1 import collector_pb2

logger = logging.getLogger("fedldp.client")

#: Outcomes that acknowledge a report (the collector committed it, now or before).
_ACKNOWLEDGED = frozenset({collector_pb2.OUTCOME_ACCEPTED, collector_pb2.OUTCOME_DUPLICATE})
#: Outcomes that refuse a report for good: retrying the same bytes cannot succeed.
_PERMANENT = frozenset(
    {
        collector_pb2.OUTCOME_BUDGET_EXHAUSTED,
        collector_pb2.OUTCOME_INVALID,
        collector_pb2.OUTCOME_UNKNOWN_POLICY,
        collector_pb2.OUTCOME_EXPIRED_POLICY,
        collector_pb2.OUTCOME_CONFLICT,
    }
)


class Signal:
    """Wakes waiting senders (`wake()`, `close()`); nothing is lost between check and wait.

    A waiter reads `generation()` before its work and waits for it to change, so
    a notification that arrives during the work ends the wait at once.
    """

    def __init__(self) -> None:
        """A signal that has not been notified yet (generation 0)."""
        self._condition = threading.Condition()
        self._generation = 0

    def generation(self) -> int:
        """The number of notifications so far; pass it to `wait`."""
        with self._condition:
            return self._generation

    def notify(self) -> None:
        """End every current wait."""
        with self._condition:
            self._generation += 1
            self._condition.notify_all()

    def wait(self, generation: int, timeout: float) -> None:
        """Wait up to `timeout` s, or until notified after `generation` was read."""
        with self._condition:
            self._condition.wait_for(lambda: self._generation != generation, timeout)


@dataclass
class _Totals:
    acknowledged: int = 0
    duplicates: int = 0
    refused: int = 0
    failed_attempts: int = 0
    last_error: str | None = None
    #: The outbox's (next due time, pending) as read right after the last change made
    #: by this flush, when that read came for free; None: read it again.
    schedule: tuple[float | None, int] | None = None

    def result(
        self, pending: int, stopped: str = "DONE", paused_until: float | None = None
    ) -> FlushResult:
        return FlushResult(
            acknowledged=self.acknowledged,
            duplicates=self.duplicates,
            refused=self.refused,
            failed_attempts=self.failed_attempts,
            pending=pending,
            last_error=self.last_error,
            stopped=stopped,
            paused_until=paused_until,
        )


class Sender:
    """The one sender of a client: flushes, the background loop, wake-ups.

    `lock` admits one sender at a time (and guards the gate); `signal` wakes a
    waiting flush or background loop; `closing` (the client's) ends both.
    Thread-safe.
    """

    def __init__(
        self,
        store: DeviceStore,
        outbox: Outbox,
        transport: Transport,
        gate: SendGate,
        events: EventSink,
        *,
        backoff: Backoff,
        jitter: random.Random,
        batch_size: int,
        clock: Callable[[], float],
        closing: threading.Event,
    ) -> None:
        """A sender of `outbox` over `transport`, paced by `gate`."""
        self._store = store
        self._outbox = outbox
        self._transport = transport
        self._gate = gate
        self._events = events
        self._backoff = backoff
        self._jitter = jitter
        self._batch_size = batch_size
        self._clock = clock
        self._closing = closing
        self.lock = threading.Lock()  # one sender at a time; guards the gate
        self.signal = Signal()  # wakes a waiting flush() or background loop
        self._retry_requested = threading.Event()  # set by wake(), applied by the sender

    def flush(self, timeout: float | None, *, retry_now: bool) -> FlushResult:
        """Send pending reports until the outbox is empty or `timeout` s pass.

        The contract is `Client.flush`'s; the caller has checked the client is open.
        While nothing can be sent (a pause, another sender's call in flight,
        reports not yet due) it waits, up to the deadline, for the earliest
        moment something can, so it returns before the deadline only when the
        outbox is empty or the client closes; the result says why it stopped.
        """
        if retry_now:
            self._retry_requested.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        totals = _Totals()
        pending: int | None = None
        next_due: float | None = None
        with self.lock:
            while not self._closing.is_set():
                generation = self.signal.generation()
                self._send_due(totals)
                known, totals.schedule = totals.schedule, None
                next_due, pending = known if known is not None else self._outbox.schedule()
                if next_due is None:
                    break
                wait = max(0.0, max(next_due, self._gate.resume_at) - time.time())
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait = min(wait, left)
                pending = None
                if wait > 0:
                    self.signal.wait(generation, wait)
            self._store.checkpoint()
        pending = self._outbox.pending() if pending is None else pending
        return totals.result(pending, *self._stopped(next_due, pending))

    def _stopped(self, next_due: float | None, pending: int) -> tuple[str, float | None]:
        """Why a flush ended (`FlushResult.stopped`) and, for a pause, until when."""
        if self._closing.is_set():
            return "CLOSED", None
        if next_due is None or pending == 0:
            return "DONE", None
        now = time.time()
        gate = self._gate.state
        if gate.resume_at > now:
            return "PAUSED", gate.resume_at
        if self._gate.busy:
            return "SENDER_BUSY", None
        if next_due > now:
            return "NOT_DUE", next_due
        return "TIMEOUT", None

    def wake(self) -> None:
        """Make every pending report due at the next send and wake the sender (`Client.wake`)."""
        self._retry_requested.set()
        self.signal.notify()

    def run_background(
        self,
        refresh_policies: Callable[[], object],
        *,
        send_interval: float,
        policy_refresh: float,
    ) -> None:
        """The background sender's loop, until the client closes (see `Client.start_background`).

        Sends every `send_interval` s with ±50 % jitter (sooner when a report or
        the gate is due, or on `wake()`), calls `refresh_policies` every
        `policy_refresh` s while the gate is open, and checkpoints the state
        file after each round.
        """
        next_refresh = time.monotonic()
        while not self._closing.is_set():
            generation = self.signal.generation()
            # Policy fetches wait for the gate too (as stored: any process may have
            # paused it): a paused device makes no calls.
            if time.monotonic() >= next_refresh:
                self._outbox.read_gate(self._gate, time.time())
            if time.monotonic() >= next_refresh and self._gate.resume_at <= time.time():
                next_refresh = time.monotonic() + policy_refresh
                try:
                    refresh_policies()
                except TransportError as exc:
                    next_refresh = time.monotonic() + min(policy_refresh, 60.0)
                    logger.info("fedldp: policy refresh failed (%s)", exc.code)
                except ClientClosedError:
                    return
            with self.lock:
                if self._closing.is_set():
                    return
                self._send_due(_Totals())
                next_due = self._outbox.next_due_at()
                self._store.checkpoint()
            wait = send_interval * self._jitter.uniform(0.5, 1.5)
            if next_due is not None:
                wait = min(wait, max(0.05, max(next_due, self._gate.resume_at) - time.time()))
            self.signal.wait(generation, wait)

    def _send_due(self, totals: _Totals) -> None:
        """Send every report due now, batch by batch, if the gate is open (caller holds the lock).

        After a failure the first batch is a probe: `_send_batch` resets the gate
        when it succeeds, and the loop goes on to the rest; when it fails the gate
        closes and the loop stops. A batch shorter than `batch_size` was
        everything due when it was read; reports recorded meanwhile are seen by
        the caller's next `schedule()`.
        """
        if self._retry_requested.is_set():
            self._retry_requested.clear()
            self._outbox.retry_now(self._gate, now=time.time())
            totals.schedule = None
        while not self._closing.is_set():
            batch = self._outbox.claim_due(self._gate, time.time(), self._batch_size)
            if not batch:
                return
            try:
                sent = self._send_batch(batch, totals)
            finally:
                self._gate.release()  # after the outcome's transaction committed
            if not sent or len(batch) < self._batch_size:
                return

    def _send_batch(self, batch: Sequence[OutboxEntry], totals: _Totals) -> bool:
        """Submit one batch; False when the call failed (the gate is then closed)."""
        try:
            response = self._transport.submit_raw([e.report for e in batch])
        except TransportError as exc:
            self._call_failed(batch, f"{exc.code.name}: {exc.detail}", exc.retry_after, totals)
            if not exc.transient:
                # Authentication, permission or configuration: retrying alone will not
                # fix it; the reports stay queued and the app is told.
                self._events.record(
                    Event(int(self._clock()), "transport_error", exc.code.name, exc.detail)
                )
            return False
        outcomes = list(response.outcomes)
        if len(outcomes) != len(batch) or any(
            o.report_id != e.report_id for o, e in zip(outcomes, batch, strict=False)
        ):
            self._call_failed(batch, "PROTOCOL: outcomes do not match the batch", None, totals)
            return False
        acknowledged: list[bytes] = []
        duplicates = 0
        retry: list[OutboxEntry] = []
        now = int(self._clock())
        for entry, outcome in zip(batch, outcomes, strict=True):
            if outcome.outcome in _ACKNOWLEDGED:
                acknowledged.append(entry.report_id)
                duplicates += outcome.outcome == collector_pb2.OUTCOME_DUPLICATE
            elif outcome.outcome in _PERMANENT:
                name = collector_pb2.Outcome.Name(outcome.outcome)
                detail = outcome.detail
                if outcome.outcome == collector_pb2.OUTCOME_INVALID:
                    detail = f"{collector_pb2.RejectReason.Name(outcome.reason)}: {detail}"
                self._events.emit(self._outbox.refuse(entry, outcome=name, detail=detail, now=now))
                totals.refused += 1
            else:
                retry.append(entry)
        # A short batch was everything due: read the schedule the flush needs next
        # in the same transaction (COUNT(*) scans the outbox, so not per batch).
        # A probe's success reopens the gate in that transaction too.
        totals.schedule = self._outbox.acknowledge(
            acknowledged,
            duplicates=duplicates,
            read_schedule=len(batch) < self._batch_size,
            gate=self._gate,
            now=time.time(),
        )
        totals.acknowledged += len(acknowledged)
        totals.duplicates += duplicates
        if retry:
            self._defer_unknown(retry, totals)
        return True

    def _call_failed(
        self,
        batch: Sequence[OutboxEntry],
        error: str,
        retry_after: float | None,
        totals: _Totals,
    ) -> None:
        """Close the gate after a failed call: nothing is sent until the pause ends."""
        delay = self._outbox.call_failed(
            batch, gate=self._gate, now=time.time(), error=error, retry_after=retry_after
        )
        totals.schedule = None
        totals.failed_attempts += 1
        totals.last_error = error
        logger.info(
            "fedldp: send of %d report(s) failed (%s); sending paused for %.2f s "
            "(%d consecutive failure(s))",
            len(batch),
            error,
            delay,
            self._gate.failures,
        )

    def _defer_unknown(self, entries: Sequence[OutboxEntry], totals: _Totals) -> None:
        """Reports answered with an outcome this SDK does not know: retry each later."""
        error = "PROTOCOL: unknown outcome"
        failures = max(e.attempts for e in entries) + 1
        delay = self._backoff.delay(failures, rng=self._jitter)
        self._outbox.defer([(e, delay) for e in entries], now=time.time(), error=error)
        totals.schedule = None
        totals.last_error = error
        logger.info(
            "fedldp: %d report(s) got an unknown outcome; retry in %.2f s", len(entries), delay
        )


__all__ = ["Sender", "Signal"]
