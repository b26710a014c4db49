"""The durable outbox: randomized reports waiting for the collector's acknowledgement.

A row is the exact serialized ``fedldp.v1.Report`` bytes made when the value was
randomized. Those bytes are what every send and every retry puts on the wire, with
the same report id, until the collector acknowledges them (ACCEPTED or
DUPLICATE) or refuses them for good; a value is never randomized twice for one
report. Rows are written in the same SQLite transaction as the device budget
charge (see `fedldp.client.sdk`), so there is no charge without its report and no
report without its charge.

Bounded size, policy when full: **refuse new records**. When `max_reports` rows
are pending, `record()` raises `OutboxFullError` *before* randomizing: nothing is
randomized, charged or stored, and the app learns it at once. We refuse rather
than drop the oldest report because the oldest report has already spent privacy
budget (its randomized output exists and is charged on the device); throwing it
away would waste that budget silently, while refusing the new value spends
nothing. Every refusal bumps the ``dropped_outbox_full`` counter and emits an
event (log line and callback), so nothing is ever lost without a trace.

Reports that the collector refuses permanently (invalid, budget exhausted,
unknown or expired policy, id conflict) leave the outbox with an event and a
counter; their budget is not refunded, because the randomized output did reach
the collector's network endpoint.

Backoff is per device and collector, not per report (`SendGate`): a failed
Submit call (no answer, or a refusal with a ``retry-after-ms`` hint) pauses
every send to that collector until the backoff or the hint ends; the next
attempt is one batch (a probe), and the rest follow only once it succeeded. The
gate lives in the state file and is read in the transaction that picks each
batch, so every process sharing the folder (and a restarted app) obeys it, and
one send slot in it keeps a single call in flight per device and collector.
"""

from __future__ import annotations

import json
import random
import secrets
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from fedldp.client.device_store import DeviceStore, Event
from fedldp.client.send_slot import SendSlot
from fedldp.client.transport import Backoff

#: Default bound on pending reports.
DEFAULT_MAX_REPORTS = 10_000


class RecordRefusedError(Exception):
    """`Client.record` refused; nothing was randomized, charged or stored.

    `reason` is a stable upper-case code (e.g. "OUTBOX_FULL", "NO_POLICY",
    "BUDGET_EXHAUSTED", "BAD_VALUE"). Messages never contain the value.
    """

    reason: str = "REFUSED"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class OutboxFullError(RecordRefusedError):
    """The outbox holds its maximum number of pending reports (policy: refuse new)."""

    reason = "OUTBOX_FULL"


@dataclass(frozen=True)
class OutboxEntry:
    """One pending report: exact wire bytes plus bookkeeping that never goes on the wire."""

    seq: int
    report_id: bytes
    policy_id: str
    policy_version: int
    window_start: int
    epsilon: Decimal
    report: bytes
    created_at: int
    attempts: int
    next_attempt_at: float
    last_error: str | None


_COLUMNS = (
    "seq, report_id, policy_id, policy_version, window_start, epsilon, report, created_at, "
    "attempts, next_attempt_at, last_error"
)


def _entry(row: Sequence[object]) -> OutboxEntry:
    return OutboxEntry(
        seq=int(row[0]),  # type: ignore[call-overload]
        report_id=bytes(row[1]),  # type: ignore[call-overload]
        policy_id=str(row[2]),
        policy_version=int(row[3]),  # type: ignore[call-overload]
        window_start=int(row[4]),  # type: ignore[call-overload]
        epsilon=Decimal(str(row[5])),
        report=bytes(row[6]),  # type: ignore[call-overload]
        created_at=int(row[7]),  # type: ignore[call-overload]
        attempts=int(row[8]),  # type: ignore[call-overload]
        next_attempt_at=float(row[9]),  # type: ignore[arg-type]
        last_error=None if row[10] is None else str(row[10]),
    )


class Outbox:
    """Outbox operations over a `DeviceStore`. Thread-safe through the store's lock."""

    def __init__(self, store: DeviceStore, *, max_reports: int = DEFAULT_MAX_REPORTS) -> None:
        if isinstance(max_reports, bool) or not isinstance(max_reports, int) or max_reports < 1:
            raise ValueError(f"max_reports must be a positive integer, got {max_reports!r}")
        self.store = store
        self.max_reports = max_reports

    # --- writing (inside the caller's transaction) ---

    def ensure_room(self, conn: sqlite3.Connection) -> None:
        """Raise `OutboxFullError` when `max_reports` reports are pending."""
        pending = int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        if pending >= self.max_reports:
            raise OutboxFullError(
                f"the outbox holds {pending} unsent reports (max_reports={self.max_reports}); "
                "the value was not recorded; call flush() when the collector is reachable "
                "or raise max_reports"
            )

    @staticmethod
    def add(
        conn: sqlite3.Connection,
        *,
        report_id: bytes,
        policy_id: str,
        policy_version: int,
        window_start: int,
        epsilon: Decimal,
        report: bytes,
        created_at: int,
    ) -> None:
        """Insert a randomized report inside the caller's transaction."""
        conn.execute(
            "INSERT INTO outbox (report_id, policy_id, policy_version, window_start, epsilon, "
            "report, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (report_id, policy_id, policy_version, window_start, str(epsilon), report, created_at),
        )

    # --- reading ---

    def due(self, now: float, limit: int) -> list[OutboxEntry]:
        """Up to `limit` reports whose next attempt is due, oldest first."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox WHERE next_attempt_at <= ? ORDER BY seq LIMIT ?",
                (now, limit),
            ).fetchall()
        return [_entry(r) for r in rows]

    def claim_due(self, gate: SendGate, now: float, limit: int) -> list[OutboxEntry]:
        """Up to `limit` due reports, oldest first, with the send slot claimed for them.

        With an OS lock (`SendGate.slot`, POSIX): the lock on the state folder is
        taken first, without waiting; then one read transaction reads the stored
        gate (one primary-key read) and, when it is open, the due rows. The lock is
        kept only when rows are returned (the caller releases it with
        `SendGate.release` once the call's outcome is committed). Reading the gate
        under the lock means a call never starts on a gate read before the
        previous call's outcome was stored.

        Without one (`fedldp.client.send_slot.available` False): one ``BEGIN
        IMMEDIATE`` transaction reads the gate and, only when it is open and no
        other sender's call is in flight, reads the due rows and claims the stored
        slot (`SendGate.claim`), committed without an fsync (a lost claim is
        harmless; the outcome's transaction is durable and frees it).

        Empty: nothing due, or the gate says wait (`gate.resume_at`).
        """
        if gate.slot is not None:
            return self._claim_with_lock(gate, now, limit)
        with self.store.transaction(durable=False) as conn:
            gate.load(conn, now=now)
            if gate.resume_at > now:
                return []
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox WHERE next_attempt_at <= ? ORDER BY seq LIMIT ?",
                (now, limit),
            ).fetchall()
            if rows and not gate.claim(conn, now=now):
                return []
        return [_entry(r) for r in rows]

    def _claim_with_lock(self, gate: SendGate, now: float, limit: int) -> list[OutboxEntry]:
        """`claim_due` with the OS lock: lock, then read the gate and the due rows."""
        if not gate.acquire(now):
            return []
        rows: list[Sequence[object]] = []
        try:
            with self.store.transaction(write=False) as conn:
                gate.load(conn, now=now)
                if gate.resume_at <= now:
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM outbox WHERE next_attempt_at <= ? "
                        "ORDER BY seq LIMIT ?",
                        (now, limit),
                    ).fetchall()
        finally:
            if not rows:
                gate.release()
        return [_entry(r) for r in rows]

    def read_gate(self, gate: SendGate, now: float) -> None:
        """Refresh `gate` from the stored row (another process may have paused it)."""
        with self.store.transaction(durable=False) as conn:
            gate.load(conn, now=now)

    def entries(self, limit: int | None = None) -> list[OutboxEntry]:
        """Pending reports, oldest first (all of them when `limit` is None)."""
        with self.store.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM outbox ORDER BY seq LIMIT ?",
                (-1 if limit is None else limit,),
            ).fetchall()
        return [_entry(r) for r in rows]

    def pending(self) -> int:
        """Number of reports not yet acknowledged."""
        with self.store.transaction() as conn:
            return int(conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def next_due_at(self) -> float | None:
        """When the earliest pending report may next be sent (None: outbox empty)."""
        return self.schedule()[0]

    def schedule(self) -> tuple[float | None, int]:
        """`next_due_at` and `pending`, read together in one transaction."""
        with self.store.transaction() as conn:
            return self._schedule(conn)

    @staticmethod
    def _schedule(conn: sqlite3.Connection) -> tuple[float | None, int]:
        row = conn.execute("SELECT MIN(next_attempt_at), COUNT(*) FROM outbox").fetchone()
        return (None if row[0] is None else float(row[0])), int(row[1])

    # --- outcomes ---

    def acknowledge(
        self,
        report_ids: Sequence[bytes],
        *,
        duplicates: int = 0,
        read_schedule: bool = False,
        gate: SendGate | None = None,
        now: float = 0.0,
    ) -> tuple[float | None, int] | None:
        """The collector committed these reports: remove them, count them.

        With `read_schedule`, returns `schedule()` as read in the same
        transaction, after the removal (a flush's last batch saves a transaction);
        otherwise, or when there was nothing to acknowledge and no gate, None.
        A `gate` (the call that answered held its slot) leaves backoff and frees
        the slot in the same transaction.
        """
        if not report_ids and gate is None:
            return None
        with self.store.transaction() as conn:
            if gate is not None:
                gate.succeeded(conn, now=now)
            if report_ids:
                conn.executemany("DELETE FROM outbox WHERE report_id=?", [(r,) for r in report_ids])
                DeviceStore.bump(conn, "acknowledged", len(report_ids))
            if duplicates:
                DeviceStore.bump(conn, "acknowledged_duplicate", duplicates)
            return self._schedule(conn) if read_schedule else None

    def refuse(self, entry: OutboxEntry, *, outcome: str, detail: str, now: int) -> Event:
        """The collector refused a report for good: remove it, count it, log an event."""
        event = Event(
            at=now,
            kind="report_refused",
            reason=outcome,
            detail=detail,
            policy_id=entry.policy_id,
            report_id=entry.report_id,
        )
        with self.store.transaction() as conn:
            conn.execute("DELETE FROM outbox WHERE report_id=?", (entry.report_id,))
            DeviceStore.bump(conn, "refused")
            DeviceStore.bump(conn, f"refused_{outcome.lower()}")
            DeviceStore.add_event(conn, event)
        return event

    def defer(self, delays: Sequence[tuple[OutboxEntry, float]], *, now: float, error: str) -> None:
        """Reports the collector answered without an outcome: count an attempt, retry later.

        Each report gets its own next try (the call itself succeeded, so the
        device-wide `SendGate` stays open for the others).
        """
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE outbox SET attempts=attempts+1, next_attempt_at=?, last_error=? "
                "WHERE report_id=?",
                [(now + delay, error, entry.report_id) for entry, delay in delays],
            )

    def call_failed(
        self,
        batch: Sequence[OutboxEntry],
        *,
        gate: SendGate,
        now: float,
        error: str,
        retry_after: float | None,
    ) -> float:
        """A Submit call failed as a whole: close the gate, count the attempt (one transaction).

        The batch's rows count one more attempt and keep the error; their own
        schedule is unchanged (the gate holds every report back). Returns the
        pause in seconds.
        """
        with self.store.transaction() as conn:
            conn.executemany(
                "UPDATE outbox SET attempts=attempts+1, last_error=? WHERE report_id=?",
                [(error, entry.report_id) for entry in batch],
            )
            DeviceStore.bump(conn, "send_failures")
            return gate.failed(conn, now=now, retry_after=retry_after)

    def retry_now(self, gate: SendGate, *, now: float) -> None:
        """Make every pending report due now, once (`Client.wake`).

        Rows waiting out their own delay become due; the gate opens now unless a
        server's retry hint is still running (then it opens when the hint ends).
        The failure count is kept, so the next attempt is a probe and a failed
        probe backs off further.
        """
        with self.store.transaction() as conn:
            conn.execute("UPDATE outbox SET next_attempt_at=0 WHERE next_attempt_at > ?", (now,))
            gate.open_now(conn, now=now)


@dataclass
class GateState:
    """One collector's backoff state and send slot, as stored (Unix seconds)."""

    #: Consecutive failed calls; 0: sending freely. Above 0 the next call is a probe.
    failures: int = 0
    #: No Submit call before this time (the backoff delay or the server's hint).
    resume_at: float = 0.0
    #: The end of the last retry hint (`retry-after-ms`); `wake()` does not override it.
    hint_until: float = 0.0
    #: The sender (a `SendGate.token`) whose Submit call is in flight; "" when none.
    holder: str = ""
    #: The holder's claim lapses at this time (its call's deadline plus a margin).
    held_until: float = 0.0


#: How often a sender waiting for another process's call in flight looks again (s).
SLOT_POLL_SECONDS = 0.05
#: A claim outlives its call's deadline by this much (a killed holder frees it then).
SLOT_MARGIN_SECONDS = 5.0


class SendGate:
    """One backoff state and one send slot per device and collector, shared by processes.

    A failed Submit call (transport failure, or a refusal with a retry hint)
    closes the gate for ``Backoff.delay(failures)`` seconds (full jitter, raised
    to the hint); while it is closed nothing is sent to that collector, by
    `flush()` or the background sender of any process sharing the state
    folder. When it reopens, one batch is sent as a probe; its success resets
    the failure count (in the transaction that applies its outcomes), and only
    then are the remaining batches sent.

    The state lives in the ``meta`` table under ``send_gate <collector>`` and is
    the only copy that counts: `Outbox.claim_due` reads it in the transaction
    that picks the batch and, when the gate is open and no other sender's call
    is in flight, claims the send slot in that same ``BEGIN IMMEDIATE``
    transaction (`claim`). The outcome's transaction (`failed`, `succeeded`)
    frees it. So across every process and Client on one state folder at most one
    Submit call to a collector is in flight, a call starts only after the
    previous call's outcome (and any pause it set) is stored, at most one probe
    goes per pause, and no call is made while a stored pause runs.

    The send slot is `slot`, an OS lock on the state folder
    (`fedldp.client.send_slot`), when the platform has one: the kernel frees it
    when its holder dies, so a process killed mid-call blocks nobody. Without
    it (`slot` None: platforms without ``flock``, and tests of the fallback) the
    slot is the stored claim (`claim`), which lapses `lease_seconds` after it
    was taken (a killed process frees it only then).

    Not thread-safe by itself: the client calls it under its send lock.
    """

    def __init__(
        self,
        target: str,
        backoff: Backoff,
        rng: random.Random,
        *,
        lease_seconds: float = 35.0,
        slot: SendSlot | None = None,
    ) -> None:
        self.key = f"send_gate {target}"
        self.backoff = backoff
        self.lease_seconds = lease_seconds
        self.slot = slot
        self._rng = rng
        #: This sender's identity in the stored slot (random per Client).
        self.token = secrets.token_hex(8)
        self.state = GateState()
        self._loaded_at = 0.0
        #: When `acquire` last found the OS lock taken by another sender (None: it did not).
        self._busy_at: float | None = None
        #: The last `load` found a stored row with no failure and no stored claim.
        self._loaded_clean = False

    @property
    def failures(self) -> int:
        """Consecutive failed calls (0: not in backoff)."""
        return self.state.failures

    @property
    def resume_at(self) -> float:
        """Unix time from which the next call may be tried, as last read.

        While another sender's call is in flight, the next look
        (`SLOT_POLL_SECONDS` after the read, at the latest when its claim lapses).
        """
        s = self.state
        if self._busy_at is not None:
            return max(s.resume_at, self._busy_at + SLOT_POLL_SECONDS)
        if self._held_by_other():
            return max(s.resume_at, min(s.held_until, self._loaded_at + SLOT_POLL_SECONDS))
        return s.resume_at

    @property
    def busy(self) -> bool:
        """Whether the last look found another sender's call in flight."""
        return self._busy_at is not None or self._held_by_other()

    def _held_by_other(self) -> bool:
        s = self.state
        return s.holder not in ("", self.token) and s.held_until > self._loaded_at

    def acquire(self, now: float) -> bool:
        """Take the OS lock of `slot` without waiting; False (and `busy`) when another has it."""
        assert self.slot is not None
        if self.slot.try_acquire():
            self._busy_at = None
            return True
        self._busy_at = now
        return False

    def release(self) -> None:
        """Free the OS lock once the call's outcome is committed (no-op without `slot`)."""
        if self.slot is not None:
            self.slot.release()

    def load(self, conn: sqlite3.Connection, *, now: float) -> None:
        """Read the stored state (inside the caller's transaction; one primary-key read).

        A stored pause longer than any the SDK sets (the clock went back, or the
        file was edited) is shortened to the longest legitimate one from `now`,
        and so is a claim longer than `lease_seconds`.
        """
        self._loaded_at = now
        if self.slot is None or self.slot.held:
            self._busy_at = None
        text = DeviceStore.read_meta(conn, self.key)
        if text is None:
            self.state = GateState()
            self._loaded_clean = True  # no row: the same as an open gate's row
            return
        try:
            raw = json.loads(text)
            state = GateState(
                failures=max(0, int(raw["failures"])),
                resume_at=float(raw["resume_at"]),
                hint_until=float(raw["hint_until"]),
                holder=str(raw.get("holder", "")),
                held_until=float(raw.get("held_until", 0.0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            state = GateState()
        longest = now + max(self.backoff.max_seconds, self.backoff.max_hint_seconds)
        state.resume_at = min(state.resume_at, longest)
        state.hint_until = min(state.hint_until, longest)
        state.held_until = min(state.held_until, now + self.lease_seconds)
        self.state = state
        self._loaded_clean = state.failures == 0 and not state.holder

    def claim(self, conn: sqlite3.Connection, *, now: float) -> bool:
        """Take the send slot if the gate is open and no other call is in flight.

        The caller `load`ed the state in this ``BEGIN IMMEDIATE`` transaction,
        which then stores the claim; False leaves the row as it was.
        """
        if self.state.resume_at > now or self._held_by_other():
            return False
        self.state.holder, self.state.held_until = self.token, now + self.lease_seconds
        self._save(conn)
        return True

    def _save(self, conn: sqlite3.Connection) -> None:
        s = self.state
        DeviceStore.set_meta(
            conn,
            self.key,
            json.dumps(
                {
                    "failures": s.failures,
                    "resume_at": s.resume_at,
                    "hint_until": s.hint_until,
                    "holder": s.holder,
                    "held_until": s.held_until,
                }
            ),
        )

    def failed(self, conn: sqlite3.Connection, *, now: float, retry_after: float | None) -> float:
        """A call failed: pause every send, free the slot (in the caller's transaction); the pause.

        Counts from the stored failure count (another process may have moved it).
        """
        self.load(conn, now=now)
        failures = self.state.failures + 1
        delay = self.backoff.delay(failures, rng=self._rng, retry_after=retry_after)
        hint_until = self.state.hint_until
        if retry_after is not None:
            hint_until = now + min(retry_after, self.backoff.max_hint_seconds)
        resume_at = max(now + delay, self.state.resume_at)
        self.state = GateState(failures=failures, resume_at=resume_at, hint_until=hint_until)
        self._save(conn)
        return resume_at - now

    def succeeded(self, conn: sqlite3.Connection, *, now: float) -> None:
        """A call was answered: leave backoff, free the slot (inside the caller's transaction).

        With the OS lock held since the gate was read open with no failure (the
        ordinary case), the stored row already says what this would write (only
        `open_now` can have changed it meanwhile, and only to open it sooner), so
        nothing is read or written.
        """
        if self.slot is not None and self.slot.held and self._loaded_clean:
            return
        self.load(conn, now=now)
        self.state = GateState(hint_until=self.state.hint_until)
        self._save(conn)

    def open_now(self, conn: sqlite3.Connection, *, now: float) -> None:
        """Reopen now, or when a running retry hint ends (inside the caller's transaction)."""
        self.load(conn, now=now)
        resume_at = min(self.state.resume_at, max(now, self.state.hint_until))
        if resume_at != self.state.resume_at:
            self.state.resume_at = resume_at
            self._save(conn)
