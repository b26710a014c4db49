"""The reservation lifecycle of a central run, one copy for releases and training.

A central release (releases.py) and a DP-SGD run (fedldp.aggregator.training)
charge a central budget the same way:

    held = Reservation.claim(ledger, ask, clock=clock, when_taken=answer)
    held.open_data()                         # durable mark BEFORE the first read
    held.renew()                             # renew the lease while the work runs
    held.settle(epsilon, delta, events)      # success: the spend, with its events
    held.close_failed(exc)                   # failure: the refund rule below

1. **Claim.** `Ledger.reserve` claims (ε, δ) for (subject, purpose) under the
   caller's idempotency key, a fresh random owner token and a lease of
   `ask.lease_seconds`; the cap is the ledger's, and a refusal (exhausted cap,
   no cap, a conflicting key) raises before anything is read.
2. **Open.** `open_data` commits that the data is being opened, before its
   first byte is read; from then on the reservation is never refunded. A run
   that reads right after its claim (a release) asks for both in one ledger
   transaction (`ReservationAsk.open_at_claim`, `Ledger.reserve(open_data=True)`):
   there is nothing between them to refund, and the mark is still durable
   before the first read.
3. **Renew.** A run longer than its lease renews it (`renew`) before each
   stretch of work, so an operator never sees it stale while it runs.
4. **Settle.** `settle` charges the spend (≤ the reservation; the rest is
   released) and stores the run's events: the receipt of a release or a
   training run is built from this record (receipts.py, training/publish.py).

The refund rule, in `close_failed`: a failure before `open_data` committed
(nothing was read) cancels the reservation, the only refund; any failure
after it - a data error, an interrupt - settles the full reservation as
spent, with no events (a data-dependent failure is itself an output). When
`open_data` may have committed without answering, the ledger decides: it
refuses to cancel an opened reservation (DataOpenedError), and the
reservation is settled as spent. A crash leaves it open, charged, until an
operator settles it as spent (`fedldp ledger reservations`).

Another run's key. The ledger returns the existing reservation when the key
was claimed before, held by another owner; the callers differ only in what
they answer then, the `when_taken` they pass to `claim`: a release replays
(releases.py: the earlier run's published output, or why there is none) and
training refuses (training/lifecycle.py: a run never trains twice under one
reservation).

The ledger seen here is `CentralLedger`: `fedldp.collector.ledger.Ledger`,
or a view of it that moves a second reservation in step with the first
(fedldp.aggregator.service.holds.AnalystCapLedger) or records the job's
progress (the release service's training jobs).
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

#: The ledger clock: epoch seconds, read at each transition.
Clock = Callable[[], int]


class CentralLedger(Protocol):
    """What a central run needs from the ledger (fedldp.collector.ledger.Ledger)."""

    def reserve(
        self,
        *,
        subject: str,
        purpose: str,
        epsilon: Decimal,
        delta: Decimal,
        idempotency_key: str,
        now: int,
        metadata: Mapping[str, str] | None = None,
        owner: str | None = None,
        lease_seconds: int = ...,
        receipt_key_id: str = ...,
        open_data: bool = ...,
    ) -> Any:
        """See `Ledger.reserve`."""
        ...

    def open_data(
        self, reservation_id: str, *, owner: str, now: int, lease_seconds: int = ...
    ) -> Any:
        """See `Ledger.open_data`."""
        ...

    def renew_lease(self, reservation_id: str, *, owner: str, now: int, lease_seconds: int) -> Any:
        """See `Ledger.renew_lease`."""
        ...

    def settle(
        self,
        reservation_id: str,
        *,
        epsilon_spent: Decimal,
        delta_spent: Decimal,
        events: Sequence[Mapping[str, object]] = (),
        now: int,
        owner: str | None = None,
        reason: str = ...,
    ) -> Any:
        """See `Ledger.settle`."""
        ...

    def cancel(self, reservation_id: str, *, now: int, owner: str | None = None) -> Any:
        """See `Ledger.cancel`."""
        ...

    def central_events(self, subject: str, purpose: str) -> Sequence[Any]:
        """See `Ledger.central_events`."""
        ...

    def ledger_id(self) -> str:
        """See `Ledger.ledger_id`."""
        ...


@dataclass(frozen=True)
class ReservationAsk:
    """What a run asks the ledger to reserve: (ε, δ) for (subject, purpose), under
    `idempotency_key`, recorded with `metadata`, leased for `lease_seconds`; the
    receipt may be signed only by the key of id `receipt_key_id` ("" none);
    `open_at_claim`: the claim also commits the data-opened mark (module docstring)."""

    subject: str
    purpose: str
    epsilon: Decimal
    delta: Decimal
    idempotency_key: str
    metadata: Mapping[str, str]
    lease_seconds: int
    receipt_key_id: str = ""
    #: Open the data in the claim's own transaction (`Ledger.reserve(open_data=True)`):
    #: for a run that reads right after its claim, with nothing to refund between.
    open_at_claim: bool = False


class Closed(str, enum.Enum):
    """How `Reservation.close_failed` closed a failed run's reservation (the value is
    the phrase used in messages)."""

    CANCELLED = "cancelled (no data was read)"
    SPENT = "settled as spent (the data had been read)"


def failure_reason(exc: BaseException) -> str:
    """The settlement reason of a run that failed after opening the data (names the
    exception's type only: its message may carry data)."""
    return f"failed after the data was opened ({type(exc).__name__}); nothing released"


def cancel_unless_opened(
    ledger: CentralLedger, reservation_id: str, *, owner: str | None, now: int
) -> bool:
    """Cancel the reservation unless its data was opened; whether it was cancelled.

    The ledger decides, in the cancel's own transaction: it refuses to cancel a
    reservation whose `open_data` committed (DataOpenedError), even when the
    caller never heard the answer. Such a reservation is never refunded: the
    caller settles it as spent.
    """
    from fedldp.collector.ledger import DataOpenedError

    try:
        ledger.cancel(reservation_id, now=now, owner=owner)
    except DataOpenedError:
        return False
    return True


class Reservation:
    """A reservation this run holds (`claim`), and its transitions under the refund rule.

    Every transition is stamped with `clock()` and carries the owner token;
    `opened` becomes true once `open_data` has committed.
    """

    def __init__(
        self, ledger: CentralLedger, ask: ReservationAsk, record: Any, owner: str, clock: Clock
    ) -> None:
        """Hold `record`, the ledger's reservation claimed by `owner` for `ask`."""
        self.ledger, self.ask, self.owner, self.clock = ledger, ask, owner, clock
        self.reservation_id: str = str(record.id)
        self.idempotency_key: str = str(record.idempotency_key)
        self.opened = False

    @classmethod
    def claim(
        cls,
        ledger: CentralLedger,
        ask: ReservationAsk,
        *,
        clock: Clock,
        when_taken: Callable[[Any], T],
    ) -> Reservation | T:
        """Reserve `ask` under a fresh owner token; the held `Reservation`, or what
        `when_taken` answers for the ledger's record of a key another run claimed.

        The ledger's refusals (its LedgerError subclasses, a database error)
        propagate: nothing was reserved or read.
        """
        owner = secrets.token_hex(16)
        record = ledger.reserve(
            subject=ask.subject,
            purpose=ask.purpose,
            epsilon=ask.epsilon,
            delta=ask.delta,
            idempotency_key=ask.idempotency_key,
            now=clock(),
            metadata=dict(ask.metadata),
            owner=owner,
            lease_seconds=ask.lease_seconds,
            receipt_key_id=ask.receipt_key_id,
            open_data=ask.open_at_claim,
        )
        if not record.held_by(owner):
            return when_taken(record)
        held = cls(ledger, ask, record, owner, clock)
        # Opened by the claim only when the ledger committed the mark with it (a view
        # such as holds.AnalystCapLedger may take the claim without it).
        held.opened = getattr(record, "data_opened_at", None) is not None
        return held

    def ledger_id(self) -> str:
        """The id of the ledger holding the reservation (for receipts)."""
        return str(self.ledger.ledger_id())

    def open_data(self) -> None:
        """Commit, durably and before the first read, that this run opens the data
        (nothing to do when the claim committed it: `ReservationAsk.open_at_claim`)."""
        if self.opened:
            return
        self.ledger.open_data(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=self.ask.lease_seconds,
        )
        self.opened = True

    def renew(self) -> None:
        """Renew the lease for another `ask.lease_seconds` (a heartbeat of a long run)."""
        self.ledger.renew_lease(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=self.ask.lease_seconds,
        )

    def settle(
        self,
        epsilon_spent: Decimal,
        delta_spent: Decimal,
        events: Sequence[Mapping[str, object]],
    ) -> None:
        """Settle a finished run: charge the spend (≤ reserved), store its events."""
        self.ledger.settle(
            self.reservation_id,
            epsilon_spent=epsilon_spent,
            delta_spent=delta_spent,
            events=list(events),
            now=self.clock(),
            owner=self.owner,
        )

    def close_failed(self, exc: BaseException) -> Closed:
        """Close the reservation of a run that failed with `exc` (module docstring):
        cancel it if the data was never opened, else settle it in full as spent.

        A ledger error while closing propagates (the reservation stays open and
        charged, for an operator to settle).
        """
        if not self.opened and cancel_unless_opened(
            self.ledger, self.reservation_id, owner=self.owner, now=self.clock()
        ):
            return Closed.CANCELLED
        self.ledger.settle(
            self.reservation_id,
            epsilon_spent=self.ask.epsilon,
            delta_spent=self.ask.delta,
            events=(),
            now=self.clock(),
            owner=self.owner,
            reason=failure_reason(exc),
        )
        return Closed.SPENT
