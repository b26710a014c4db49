"""A training run's side of the reservation lifecycle (fedldp.aggregator.central.reservations).

    with run_ledger(config, ledger) as led:        # the configured ledger, or the caller's
        held = claim_run(config, led, clock)       # fresh owner, lease; another run's key
                                                   # is refused (`refuse_taken`)
        held.open_data()                           # durable mark BEFORE the first read
        held.renew()                               # before each certified interval
        held.settle(spent, delta, events)          # success: the accountant's spend
        close_failed_run(held, exc, log)           # failure: the refund rule

and `publish` moves a finished file into place without ever replacing one. Only
the process that reserved (rank 0 of a multi-process run) holds the reservation.
"""

from __future__ import annotations

import contextlib
import os
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from fedldp.aggregator.central.reservations import (
    CentralLedger,
    Clock,
    Reservation,
    ReservationAsk,
)
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
        cause = getattr(exc, "orig", None) or exc  # the driver's own words, not the wrapper's
        lines = str(cause).strip().splitlines()
        detail = f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__
        detail = re.sub(r"(\w[\w+.-]*://[^/:@\s]*:)[^@\s]*@", r"\1***@", detail)  # passwords
        raise BudgetRefusedError(
            f"cannot open the ledger at {redact_url(config.budget.ledger)} ([budget] ledger): "
            f"{detail}; check the URL and that the database server is reachable"
        ) from exc
    try:
        yield own
    finally:
        own.close()


def claim_run(
    config: TrainConfig, ledger: CentralLedger, clock: Clock, *, receipt_key_id: str = ""
) -> Reservation:
    """Reserve the configured (ε, δ) for (subject, purpose) under a fresh owner token
    and a lease of TRAIN_LEASE_SECONDS (the lifecycle of reservations.py); the receipt
    may be signed only by the key of id `receipt_key_id` ("" none: `Ledger.reserve`).

    Raises BudgetRefusedError (refused, or the ledger unavailable) and
    ReservationTakenError (the idempotency key belongs to another run's
    reservation, open or closed: `refuse_taken`): in both cases nothing was read.
    """
    import sqlalchemy as sa
    from fedldp.collector.ledger import LedgerError

    budget = config.budget
    ask = ReservationAsk(
        subject=budget.subject,
        purpose=budget.purpose,
        epsilon=budget.epsilon,
        delta=budget.delta,
        idempotency_key=budget.idempotency_key or f"train-{uuid.uuid4().hex}",
        metadata={"kind": "dp-sgd", "data_source": config.data.source},
        lease_seconds=TRAIN_LEASE_SECONDS,
        receipt_key_id=receipt_key_id,
    )
    try:
        return Reservation.claim(ledger, ask, clock=clock, when_taken=refuse_taken)
    except LedgerError as exc:
        raise BudgetRefusedError(f"the ledger refused the reservation: {exc}") from exc
    except sa.exc.SQLAlchemyError as exc:
        raise BudgetRefusedError(
            f"the ledger is unavailable ({type(exc).__name__}); nothing was reserved"
        ) from exc


def refuse_taken(reservation: Any) -> NoReturn:
    """Training's answer for a key another run claimed (`Reservation.claim`'s
    `when_taken`): ReservationTakenError, whatever that run's state."""
    state = (
        f"held by another run (lease until {reservation.lease_expires_at})"
        if reservation.status == "reserved"
        else reservation.status
    )
    raise ReservationTakenError(
        f"idempotency key {reservation.idempotency_key!r} belongs to reservation "
        f"{reservation.id}, which is {state}; a run never trains twice under one "
        "reservation: a new run needs a new key"
    )


def close_failed_run(held: Reservation, exc: BaseException, log: Callable[[str], None]) -> str:
    """Close a failed run's reservation by the refund rule (`Reservation.close_failed`);
    returns what happened, for messages. A ledger error while closing is logged (by
    type only) and leaves the reservation open and charged: the run's own failure
    must still surface."""
    try:
        return held.close_failed(exc).value
    except Exception as close_exc:
        log(f"closing reservation {held.reservation_id} failed: {type(close_exc).__name__}")
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
