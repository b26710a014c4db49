"""Charging one release against two caps: its (dataset, purpose) and the analyst's own.

The release functions (fedldp.aggregator.central.releases) reserve, open,
settle and cancel one reservation (the lifecycle of
fedldp.aggregator.central.reservations). `AnalystCapLedger` is the ledger they see
for a release by an analyst with an own cap (policy.py): it adds a *hold* of
the same (ε, δ) on the analyst's cap, moved through the same states, so the
analyst's spend counts against both caps:

* reserve: the release's own reservation first (its idempotency key); only a
  freshly claimed one takes the hold (key "analyst-cap:<reservation id>", the
  same owner token). A retry that finds the release's reservation already
  claimed takes no hold: the first run took it. A refused hold cancels the
  release's reservation (nothing was read: the refund rule) and raises
  `AnalystCapExhaustedError` (RESOURCE_EXHAUSTED).
* open_data: the hold first, then the release (from then on both are spent);
* settle: the release, then the hold with the same spent (ε, δ);
* cancel: both (a hold opened before a failure is settled as spent).

Each reservation is one ledger transaction locking one cap row, so neither
cap is ever exceeded under concurrency (each reserve is atomic against its
cap); a release refused by its analyst's cap holds its purpose's budget for
the moment between the two transactions, which can only refuse another
request spuriously, never admit one. A crash between the steps leaves what
was claimed reserved (charged): a release's until an operator settles it as
spent; a training job's is closed by the restarted service with the job's
reservation (training.TrainingJobs.recover).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fedldp.aggregator.central.reservations import cancel_unless_opened
from fedldp.collector.ledger import CentralBudgetExhaustedError
from fedldp.collector.ledger.model import DEFAULT_LEASE_SECONDS


class AnalystCapExhaustedError(CentralBudgetExhaustedError):
    """The analyst's own cap would be exceeded; nothing was read or charged."""


class AnalystCapLedger:
    """The ledger as one release sees it when its analyst has an own cap (module docstring)."""

    def __init__(self, ledger: Any, subject: str, purpose: str) -> None:
        self._ledger, self._subject, self._purpose = ledger, subject, purpose
        self._hold: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def reserve(self, **kwargs: Any) -> Any:
        """The release's reservation; a fresh one also takes the analyst's hold.

        Never opened by the claim (`open_data` is dropped): a refused hold must
        still be able to cancel the release's reservation; `open_data` opens both.
        """
        kwargs.pop("open_data", None)
        res = self._ledger.reserve(**kwargs)
        owner, now = kwargs["owner"], kwargs["now"]
        if not res.held_by(owner):
            return res
        try:
            hold = self._ledger.reserve(
                subject=self._subject,
                purpose=self._purpose,
                epsilon=kwargs["epsilon"],
                delta=kwargs["delta"],
                idempotency_key=f"analyst-cap:{res.id}",
                now=now,
                metadata={"kind": "analyst-cap", "reservation": str(res.id)},
                owner=owner,
                lease_seconds=kwargs["lease_seconds"],
            )
        except BaseException as exc:
            self._ledger.cancel(res.id, now=now, owner=owner)
            if isinstance(exc, CentralBudgetExhaustedError):
                raise AnalystCapExhaustedError(
                    f"your own cap for purpose {self._purpose!r} would be exceeded: {exc}"
                ) from None
            raise
        self._hold = str(hold.id)
        return res

    def open_data(
        self,
        reservation_id: str,
        *,
        owner: str,
        now: int,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> Any:
        """Open the hold, then the release's reservation."""
        if self._hold is not None:
            self._ledger.open_data(self._hold, owner=owner, now=now, lease_seconds=lease_seconds)
        return self._ledger.open_data(
            reservation_id, owner=owner, now=now, lease_seconds=lease_seconds
        )

    def renew_lease(self, reservation_id: str, *, owner: str, now: int, lease_seconds: int) -> Any:
        """Renew both leases."""
        if self._hold is not None:
            self._ledger.renew_lease(self._hold, owner=owner, now=now, lease_seconds=lease_seconds)
        return self._ledger.renew_lease(
            reservation_id, owner=owner, now=now, lease_seconds=lease_seconds
        )

    def settle(
        self,
        reservation_id: str,
        *,
        epsilon_spent: Decimal,
        delta_spent: Decimal,
        events: Any = (),
        now: int,
        owner: str | None = None,
        reason: str = "released",
    ) -> Any:
        """Settle the release, then the hold with the same spend."""
        out = self._ledger.settle(
            reservation_id,
            epsilon_spent=epsilon_spent,
            delta_spent=delta_spent,
            events=events,
            now=now,
            owner=owner,
            reason=reason,
        )
        if self._hold is not None:
            self._ledger.settle(
                self._hold,
                epsilon_spent=epsilon_spent,
                delta_spent=delta_spent,
                now=now,
                owner=owner,
                reason=f"analyst cap of reservation {reservation_id}: {reason}",
            )
        return out

    def cancel(self, reservation_id: str, *, now: int, owner: str | None = None) -> Any:
        """Cancel the release; cancel the hold too (settled as spent if it was opened)."""
        out = self._ledger.cancel(reservation_id, now=now, owner=owner)
        if self._hold is not None and not cancel_unless_opened(
            self._ledger, self._hold, owner=owner, now=now
        ):
            held = self._ledger.reservation(self._hold)
            self._ledger.settle(
                self._hold,
                epsilon_spent=held.epsilon,
                delta_spent=held.delta,
                now=now,
                owner=owner,
                reason="the release failed after its hold was opened",
            )
        return out
