"""A training run's reservation, from claim to settlement (the refund rule of engine.py).

    claim = Claim.reserve(config, ledger, clock)   # atomic claim: fresh owner, lease
    claim.open_data()                              # durable mark BEFORE the first read
    claim.heartbeat()                              # renew the lease before each interval
    claim.settle(spent, delta, events)             # success: the accountant's spend
    claim.fail(exc, log)                           # failure: cancel (nothing read) or
                                                   # settle the full reservation as spent

and `publish` moves a finished file into place without ever replacing one. Only
the process that reserved (rank 0 of a multi-process run) holds a Claim.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import uuid
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from fedldp.aggregator.central.releases import CentralLedger
from fedldp.aggregator.training.config import TrainConfig
from fedldp.aggregator.training.data import redact_url
from fedldp.aggregator.training.errors import (
    BudgetRefusedError,
    OutputExistsError,
    ReservationTakenError,
)

#: Lease of a training run's claim, renewed before every certified interval.
TRAIN_LEASE_SECONDS = 3600


@contextlib.contextmanager
def run_ledger(config: TrainConfig, ledger: CentralLedger | None) -> Iterator[CentralLedger]:
    """`ledger`, or the configured one opened for this run and closed after it.

    An unreachable ledger, or a shard other than shard 0 of a sharded one, raises
    BudgetRefusedError (nothing was reserved or read)."""
    if ledger is not None:
        yield ledger
        return
    import sqlalchemy as sa
    from fedldp.collector.ledger.shards import ShardMapError, open_central_ledger

    try:
        own = open_central_ledger(config.budget.ledger)
    except ShardMapError as exc:  # a shard other than shard 0: no central state there
        raise BudgetRefusedError(str(exc)) from exc
    except (sa.exc.SQLAlchemyError, OSError, ValueError) as exc:
        raise BudgetRefusedError(
            f"cannot open the ledger at {redact_url(config.budget.ledger)}: {type(exc).__name__}"
        ) from exc
    try:
        yield own
    finally:
        own.close()


class Claim:
    """One run's reservation in the ledger and the run's side of the refund rule.

    `opened` becomes true once `open_data` has committed that the protected data is
    being opened; from then on the reservation is never refunded.
    """

    def __init__(
        self,
        config: TrainConfig,
        ledger: CentralLedger,
        reservation: Any,
        owner: str,
        clock: Callable[[], int],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.reservation_id: str = reservation.id
        self.idempotency_key: str = reservation.idempotency_key
        self.owner = owner
        self.clock = clock
        self.opened = False
        self.ledger_id = str(ledger.ledger_id())

    @classmethod
    def reserve(cls, config: TrainConfig, ledger: CentralLedger, clock: Callable[[], int]) -> Claim:
        """Reserve the configured (ε, δ) for (subject, purpose) under a fresh owner token.

        Raises BudgetRefusedError (refused, or the ledger unavailable) and
        ReservationTakenError (the idempotency key belongs to another run's
        reservation, open or closed): in both cases nothing was read.
        """
        import sqlalchemy as sa
        from fedldp.collector.ledger import LedgerError

        budget = config.budget
        key = budget.idempotency_key or f"train-{uuid.uuid4().hex}"
        owner = secrets.token_hex(16)
        try:
            res = ledger.reserve(
                subject=budget.subject,
                purpose=budget.purpose,
                epsilon=budget.epsilon,
                delta=budget.delta,
                idempotency_key=key,
                now=clock(),
                metadata={"kind": "dp-sgd", "data_source": config.data.source},
                owner=owner,
                lease_seconds=TRAIN_LEASE_SECONDS,
            )
        except LedgerError as exc:
            raise BudgetRefusedError(f"the ledger refused the reservation: {exc}") from exc
        except sa.exc.SQLAlchemyError as exc:
            raise BudgetRefusedError(
                f"the ledger is unavailable ({type(exc).__name__}); nothing was reserved"
            ) from exc
        if not res.held_by(owner):
            state = (
                f"held by another run (lease until {res.lease_expires_at})"
                if res.status == "reserved"
                else res.status
            )
            raise ReservationTakenError(
                f"idempotency key {key!r} belongs to reservation {res.id}, which is {state}; "
                "a run never trains twice under one reservation: a new run needs a new key"
            )
        return cls(config, ledger, res, owner, clock)

    def open_data(self) -> None:
        """Commit, durably and before the first read, that this run opens the data."""
        self.ledger.open_data(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=TRAIN_LEASE_SECONDS,
        )
        self.opened = True

    def heartbeat(self) -> None:
        """Renew the claim's lease (before every certified interval)."""
        self.ledger.renew_lease(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=TRAIN_LEASE_SECONDS,
        )

    def settle(
        self, epsilon_spent: Decimal, delta_spent: Decimal, events: Sequence[dict[str, Any]]
    ) -> None:
        """Settle a finished run: charge `epsilon_spent` ≤ reserved, release the rest."""
        self.ledger.settle(
            self.reservation_id,
            epsilon_spent=epsilon_spent,
            delta_spent=delta_spent,
            events=list(events),
            now=self.clock(),
            owner=self.owner,
        )

    def fail(self, exc: BaseException, log: Callable[[str], None]) -> str:
        """Close a failed run: cancel (nothing read) or settle the full reservation as
        spent (data opened); returns what happened, for messages.

        Whether the data was opened is asked of the ledger when unsure (open_data may
        have committed and then failed to answer): the ledger refuses to cancel an
        opened reservation.
        """
        from fedldp.collector.ledger import DataOpenedError

        try:
            if not self.opened:
                try:
                    self.ledger.cancel(self.reservation_id, now=self.clock(), owner=self.owner)
                    return "cancelled (no data was read)"
                except DataOpenedError:
                    pass
            self.ledger.settle(
                self.reservation_id,
                epsilon_spent=self.config.budget.epsilon,
                delta_spent=self.config.budget.delta,
                events=(),
                now=self.clock(),
                owner=self.owner,
                reason=(
                    f"failed after the data was opened ({type(exc).__name__}); nothing released"
                ),
            )
            return "settled as spent (the data had been read)"
        except Exception as close_exc:  # the abort must still surface
            log(f"closing reservation {self.reservation_id} failed: {type(close_exc).__name__}")
            return "left open (charged) for an operator to settle"


def publish(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final` without ever replacing an existing file (hard link, then
    unlink); a concurrent release at the same path makes this raise OutputExistsError."""
    try:
        os.link(tmp, final)
    except FileExistsError as exc:
        raise OutputExistsError(f"{final} appeared during the run; not overwritten") from exc
    except OSError:  # no hard links on this filesystem
        if final.exists():
            raise OutputExistsError(f"{final} appeared during the run; not overwritten") from None
        os.replace(tmp, final)
        return
    tmp.unlink()


def remove_files(paths: Sequence[Path]) -> None:
    """Remove the run's temporary files (those that exist)."""
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
