"""Central (ε, δ) reservations: caps, reserve, open data, settle, cancel, restore re-entry."""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import (
    Any,
)

import sqlalchemy as sa
from fedldp.collector.ledger import restore
from fedldp.collector.ledger.engine import (
    LedgerCore,
)
from fedldp.collector.ledger.model import (
    DEFAULT_LEASE_SECONDS,
    EXACT,
    CentralBudgetExhaustedError,
    CentralEvent,
    CentralSpendUnconfirmedError,
    DataOpenedError,
    IdempotencyConflictError,
    LeaseActiveError,
    NoCentralCapError,
    NothingToConfirmError,
    Reservation,
    ReservationNotFoundError,
    ReservationOwnedError,
    ReservationStateError,
    _dec,
    _exact_decimal,
    _s,
)
from fedldp.collector.ledger.schema import (
    central_caps,
    central_reservation_log,
    central_reservations,
)


def _reentry(
    subject: str, purpose: str, eps: Decimal, delta: Decimal
) -> tuple[str, str, Decimal, Decimal]:
    """One validated (subject, purpose, ε > 0, 0 ≤ δ < 1) re-entry for `confirm_central`."""
    if not subject or not purpose:
        raise ValueError("subject and purpose must be non-empty")
    _exact_decimal("epsilon", eps, positive=True)
    _exact_decimal("delta", delta, positive=False)
    if delta >= 1:
        raise ValueError("delta must be below 1")
    return subject, purpose, eps, delta


def _refuse_if_unconfirmed(conn: sa.Connection) -> None:
    """CentralSpendUnconfirmedError while a restore's central spend is unconfirmed."""
    gap = restore.unconfirmed_central(conn)
    if gap is None:
        return
    if gap.restore_time is None:
        raise CentralSpendUnconfirmedError(
            f"this ledger is a backup copy (taken at {gap.backup_time}) that was never "
            "restored: restore it with `fedldp ledger restore`, then confirm its central "
            "spend with `fedldp ledger confirm-central`"
        )
    raise CentralSpendUnconfirmedError(
        f"central reservations are blocked: this ledger was restored from a backup taken at "
        f"{gap.backup_time} (restored at {gap.restore_time}) and the central spend made after "
        "the backup is unconfirmed; re-enter it with `fedldp ledger confirm-central --spent "
        "SUBJECT PURPOSE EPSILON DELTA` (once per release) or confirm none was made with "
        "`fedldp ledger confirm-central --none`"
    )


def _unrestored_hint(conn: sa.Connection) -> str:
    gap = restore.unconfirmed_central(conn)
    if gap is not None and gap.restore_time is None:
        return " (this is a backup copy never restored: run `fedldp ledger restore` first)"
    return ""


def _check_owner(res: Reservation, owner: str | None) -> None:
    """ReservationOwnedError when `owner` is given and is not the reservation's owner."""
    if owner is not None and res.owner is not None and not res.held_by(owner):
        raise ReservationOwnedError(
            f"reservation {res.id} belongs to another run; this run may not change it"
        )


def _log(conn: sa.Connection, reservation_id: str, now: int, action: str, **detail: object) -> None:
    conn.execute(
        sa.insert(central_reservation_log).values(
            reservation_id=reservation_id,
            at=now,
            action=action,
            detail_json=json.dumps(detail, sort_keys=True),
        )
    )


#: The log's reservation_id and action of a central cap's change (schema.py).
CAP_EVENT_ID = ""
CAP_SET = "cap_set"

#: close_reason prefix of a reservation an operator settled with `settle_stale`.
STALE_REASON = "operator: stale lease settled as spent"


def _same_events(stored: str | None, new: str) -> bool:
    """Whether a settled reservation's stored events equal `new` (both JSON lists)."""
    return stored is not None and json.loads(stored) == json.loads(new)


def _reservation(row: Any) -> Reservation:
    return Reservation(
        id=row.id,
        subject=row.subject,
        purpose=row.purpose,
        epsilon=_dec(row.epsilon),
        delta=_dec(row.delta),
        status=row.status,
        epsilon_spent=None if row.epsilon_spent is None else _dec(row.epsilon_spent),
        delta_spent=None if row.delta_spent is None else _dec(row.delta_spent),
        idempotency_key=row.idempotency_key,
        created_at=int(row.created_at),
        metadata=json.loads(row.metadata_json),
        closed_at=None if row.closed_at is None else int(row.closed_at),
        owner=row.owner,
        lease_expires_at=None if row.lease_expires_at is None else int(row.lease_expires_at),
        data_opened_at=None if row.data_opened_at is None else int(row.data_opened_at),
        close_reason=row.close_reason,
        receipt_key_id=row.receipt_key_id,
    )


class CentralReservations(LedgerCore):
    """Central (ε, δ) caps and reservations, each transition logged."""

    def set_central_cap(
        self,
        subject: str,
        purpose: str,
        *,
        epsilon_cap: Decimal,
        delta_cap: Decimal,
        now: int | None = None,
    ) -> None:
        """Set (or change) the central (ε, δ) cap of (subject, purpose): an operator action.

        Lowering a cap below what is already committed is allowed (no new
        reservation will fit) but never releases anything. Every change is
        logged ("cap_set" in the reservation log) so that reconcile judges each
        reservation against the cap in force when it was made; setting the same
        cap again logs nothing.
        """
        _exact_decimal("epsilon_cap", epsilon_cap, positive=False)
        _exact_decimal("delta_cap", delta_cap, positive=False)
        if delta_cap >= 1:
            raise ValueError("delta_cap must be below 1")
        if not subject or not purpose:
            raise ValueError("subject and purpose must be non-empty")
        stamp = int(time.time()) if now is None else now

        def tx(conn: sa.Connection) -> None:
            before = conn.execute(
                sa.select(central_caps.c.epsilon_cap, central_caps.c.delta_cap).where(
                    central_caps.c.subject == subject, central_caps.c.purpose == purpose
                )
            ).first()
            conn.execute(
                self._insert_ignore(central_caps),
                [
                    {
                        "subject": subject,
                        "purpose": purpose,
                        "epsilon_cap": _s(epsilon_cap),
                        "delta_cap": _s(delta_cap),
                        "epsilon_committed": "0",
                        "delta_committed": "0",
                        "updated_at": stamp,
                    }
                ],
            )
            conn.execute(
                sa.update(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .values(epsilon_cap=_s(epsilon_cap), delta_cap=_s(delta_cap), updated_at=stamp)
            )
            # Logged while the row is locked (the update above), so the log's order is
            # the order in which caps and reservations took effect (schema.py).
            if before is None or (_dec(before[0]), _dec(before[1])) != (epsilon_cap, delta_cap):
                _log(
                    conn,
                    CAP_EVENT_ID,
                    stamp,
                    CAP_SET,
                    subject=subject,
                    purpose=purpose,
                    epsilon_cap=_s(epsilon_cap),
                    delta_cap=_s(delta_cap),
                )

        self.transaction(tx)

    def central_cap(self, subject: str, purpose: str) -> tuple[Decimal, Decimal] | None:
        """The (ε, δ) cap of (subject, purpose), or None when none is set."""

        def tx(conn: sa.Connection) -> tuple[Decimal, Decimal] | None:
            row = conn.execute(
                sa.select(central_caps.c.epsilon_cap, central_caps.c.delta_cap).where(
                    central_caps.c.subject == subject, central_caps.c.purpose == purpose
                )
            ).first()
            return None if row is None else (_dec(row[0]), _dec(row[1]))

        return self.transaction(tx, write=False)

    def central_cap_keys(self, subject_prefix: str) -> list[tuple[str, str]]:
        """Every (subject, purpose) with a central cap whose subject starts with
        `subject_prefix` (a service's own caps), sorted."""

        def tx(conn: sa.Connection) -> list[tuple[str, str]]:
            rows = conn.execute(sa.select(central_caps.c.subject, central_caps.c.purpose))
            return sorted((r[0], r[1]) for r in rows if str(r[0]).startswith(subject_prefix))

        return self.transaction(tx, write=False)

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
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
        receipt_key_id: str = "",
        open_data: bool = False,
    ) -> Reservation:
        """Claim (ε, δ) for one central run before any protected data is read.

        The cap is read from the ledger (`set_central_cap`), never from the caller.
        Raises NoCentralCapError when none is set, CentralBudgetExhaustedError when
        reserved + settled + this would exceed the cap (basic composition),
        CentralSpendUnconfirmedError while a restore's central spend is unconfirmed
        (restore.py; read in this transaction), and IdempotencyConflictError when
        `idempotency_key` was used for a different (subject, purpose, ε, δ).

        Ownership: the new row is claimed by `owner` (a fresh random token when
        None) with a lease until now + `lease_seconds`, in the same transaction
        that checks the key (unique: a concurrent insert of the key reruns and
        finds it), so exactly one caller ever claims a key. The same key again
        returns the existing reservation with *its* owner and reserves nothing:
        a caller holds the reservation only when ``result.held_by(owner)``.

        `receipt_key_id` binds the run's receipt to one signing key (the key id
        of its Ed25519 public key, signing.py): `fedldp verify` refuses a receipt
        of this reservation signed by any other key, even a trusted one. "" (the
        default) records that the run signs no receipt.

        `open_data=True` also records, in the same transaction, that the claimant
        opens the data (`open_data`'s mark, logged as "data_opened"): for a run
        that reads right after its claim and has nothing to refund between the
        two, it saves a commit. The mark is durable before the call returns, so
        before the first read, and from then on the reservation is never
        cancelled (the refund rule), exactly as after a separate `open_data`. A
        key claimed before returns its reservation unchanged (not opened by this
        call).
        """
        _exact_decimal("epsilon", epsilon, positive=True)
        _exact_decimal("delta", delta, positive=False)
        if not idempotency_key:
            raise ValueError("idempotency_key must be non-empty")
        if lease_seconds < 1:
            raise ValueError("lease_seconds must be at least 1")
        meta = dict(metadata or {})
        claimant = owner or secrets.token_hex(16)

        def tx(conn: sa.Connection) -> Reservation:
            prior = conn.execute(
                sa.select(central_reservations).where(
                    central_reservations.c.idempotency_key == idempotency_key
                )
            ).first()
            if prior is not None:
                res = _reservation(prior)
                if (res.subject, res.purpose, res.epsilon, res.delta) != (
                    subject,
                    purpose,
                    epsilon,
                    delta,
                ):
                    raise IdempotencyConflictError(
                        "this idempotency key was used for a different reservation; "
                        "use a new key for a new release"
                    )
                return res
            _refuse_if_unconfirmed(conn)
            cap = conn.execute(
                sa.select(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .with_for_update()
            ).first()
            if cap is None:
                raise NoCentralCapError(
                    f"no central cap for subject {subject!r}, purpose {purpose!r}; "
                    "an operator sets one with `fedldp ledger set-cap`"
                )
            eps_total = EXACT.add(_dec(cap.epsilon_committed), epsilon)
            delta_total = EXACT.add(_dec(cap.delta_committed), delta)
            if eps_total > _dec(cap.epsilon_cap) or delta_total > _dec(cap.delta_cap):
                raise CentralBudgetExhaustedError(
                    f"reserving eps={epsilon} delta={delta} would exceed the cap "
                    f"(eps={cap.epsilon_cap}, delta={cap.delta_cap}); committed "
                    f"eps={cap.epsilon_committed}, delta={cap.delta_committed}"
                )
            rid = secrets.token_hex(16)
            conn.execute(
                sa.insert(central_reservations).values(
                    id=rid,
                    subject=subject,
                    purpose=purpose,
                    epsilon=_s(epsilon),
                    delta=_s(delta),
                    status="reserved",
                    epsilon_spent=None,
                    delta_spent=None,
                    idempotency_key=idempotency_key,
                    metadata_json=json.dumps(meta, sort_keys=True),
                    events_json=None,
                    created_at=now,
                    closed_at=None,
                    owner=claimant,
                    lease_expires_at=now + lease_seconds,
                    data_opened_at=now if open_data else None,
                    close_reason=None,
                    receipt_key_id=receipt_key_id,
                )
            )
            conn.execute(
                sa.update(central_caps)
                .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
                .values(
                    epsilon_committed=_s(eps_total), delta_committed=_s(delta_total), updated_at=now
                )
            )
            _log(conn, rid, now, "reserved", epsilon=str(epsilon), delta=str(delta))
            if open_data:
                _log(conn, rid, now, "data_opened")
            return Reservation(
                rid,
                subject,
                purpose,
                epsilon,
                delta,
                "reserved",
                None,
                None,
                idempotency_key,
                now,
                meta,
                None,
                claimant,
                now + lease_seconds,
                data_opened_at=now if open_data else None,
                receipt_key_id=receipt_key_id,
            )

        return self.transaction(tx)

    def confirm_central(
        self,
        spent: Sequence[tuple[str, str, Decimal, Decimal]],
        *,
        now: int,
        note: str = "",
    ) -> int:
        """Lift a restore's block on central reservations (restore.py), re-entering
        the central spend made after the backup; returns the epochs confirmed.

        Each (subject, purpose, ε, δ) in `spent` becomes one settled release,
        added to the cap's committed total even above the cap (it was spent; this
        never refunds); an empty `spent` confirms that none was made. All of it,
        and the confirmation, commit in one transaction. Raises
        NothingToConfirmError when no restored epoch awaits confirmation, and
        NoCentralCapError when a (subject, purpose) has no cap (set it first).
        """
        entries = [_reentry(*entry) for entry in spent]

        def tx(conn: sa.Connection) -> int:
            for subject, purpose, eps, delta in entries:
                self._reenter(conn, subject, purpose, eps, delta, now=now, note=note)
            confirmed = restore.confirm_central(conn, now=now)
            if confirmed == 0:
                raise NothingToConfirmError(
                    "no restore of this ledger awaits confirmation of its central spend"
                    + _unrestored_hint(conn)
                )
            return confirmed

        return self.transaction(tx)

    def _reenter(
        self,
        conn: sa.Connection,
        subject: str,
        purpose: str,
        eps: Decimal,
        delta: Decimal,
        *,
        now: int,
        note: str,
    ) -> None:
        """Record (ε, δ) spent by (subject, purpose) after a backup as a settled release."""
        cap = conn.execute(
            sa.select(central_caps)
            .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
            .with_for_update()
        ).first()
        if cap is None:
            raise NoCentralCapError(
                f"no central cap for subject {subject!r}, purpose {purpose!r}: set it with "
                "`fedldp ledger set-cap` before re-entering its spend"
            )
        rid = secrets.token_hex(16)
        conn.execute(
            sa.insert(central_reservations).values(
                id=rid,
                subject=subject,
                purpose=purpose,
                epsilon=_s(eps),
                delta=_s(delta),
                status="settled",
                epsilon_spent=_s(eps),
                delta_spent=_s(delta),
                idempotency_key=f"restore-reentry:{rid}",
                metadata_json=json.dumps({"reentered_after_restore": note}, sort_keys=True),
                events_json=None,
                created_at=now,
                closed_at=now,
                owner=None,
                lease_expires_at=None,
                data_opened_at=None,
                close_reason="re-entered after a restore from backup",
                receipt_key_id="",
            )
        )
        conn.execute(
            sa.update(central_caps)
            .where(central_caps.c.subject == subject, central_caps.c.purpose == purpose)
            .values(
                epsilon_committed=_s(EXACT.add(_dec(cap.epsilon_committed), eps)),
                delta_committed=_s(EXACT.add(_dec(cap.delta_committed), delta)),
                updated_at=now,
            )
        )
        _log(conn, rid, now, "reentered", epsilon=str(eps), delta=str(delta), note=note)

    def open_data(
        self,
        reservation_id: str,
        *,
        owner: str,
        now: int,
        lease_seconds: int = DEFAULT_LEASE_SECONDS,
    ) -> Reservation:
        """Record, durably, that `owner` is about to read the protected data.

        Call it BEFORE the first read: once committed, the reservation can no
        longer be cancelled (`cancel` raises DataOpenedError), only settled as
        spent, whatever happens to the run (error, interrupt, crash). Renews the
        lease. Idempotent for the owner; another owner gets ReservationOwnedError,
        a closed reservation ReservationStateError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            opened = res.data_opened_at if res.data_opened_at is not None else now
            conn.execute(
                sa.update(central_reservations)
                .where(central_reservations.c.id == reservation_id)
                .values(data_opened_at=opened, lease_expires_at=now + lease_seconds)
            )
            if res.data_opened_at is None:
                _log(conn, reservation_id, now, "data_opened")
            return dataclasses.replace(
                res, data_opened_at=opened, lease_expires_at=now + lease_seconds
            )

        return self.transaction(tx)

    def renew_lease(
        self, reservation_id: str, *, owner: str, now: int, lease_seconds: int
    ) -> Reservation:
        """Extend the owner's lease to now + `lease_seconds` (a heartbeat of a long run)."""

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            conn.execute(
                sa.update(central_reservations)
                .where(central_reservations.c.id == reservation_id)
                .values(lease_expires_at=now + lease_seconds)
            )
            return dataclasses.replace(res, lease_expires_at=now + lease_seconds)

        return self.transaction(tx)

    def settle(
        self,
        reservation_id: str,
        *,
        epsilon_spent: Decimal,
        delta_spent: Decimal,
        events: Sequence[Mapping[str, object]] = (),
        now: int,
        owner: str | None = None,
        reason: str = "released",
    ) -> Reservation:
        """Record what a run really spent (≤ reserved); the rest is released.

        `events` (JSON-serializable mappings, e.g. {"kind":
        "poisson_subsampled_gaussian", "noise_multiplier": ..., "sample_rate":
        ..., "steps": ...}) are kept for replay by an RDP/PLD accountant;
        `reason` says why it closed. `owner` must be the claiming run's token
        (ReservationOwnedError otherwise); None is the administrative path (no
        ownership check). Settling again by the same owner with the same
        amounts AND the same events returns the settled reservation; a
        reservation an operator settled as stale (`settle_stale`) is never
        "already settled" for its run: that raises ReservationStateError, so a
        run whose reservation was taken from it publishes nothing (its events
        would not be recorded). Any other transition raises
        ReservationStateError. Spent above reserved raises ValueError.
        """
        _exact_decimal("epsilon_spent", epsilon_spent, positive=False)
        _exact_decimal("delta_spent", delta_spent, positive=False)
        events_json = json.dumps([dict(e) for e in events], sort_keys=True, default=str)

        def tx(conn: sa.Connection) -> Reservation:
            row = self._locked_reservation(conn, reservation_id)
            res = _reservation(row)
            _check_owner(res, owner)
            if res.status == "settled" and (res.close_reason or "").startswith(STALE_REASON):
                raise ReservationStateError(
                    f"reservation {reservation_id} was settled as stale by an operator "
                    "(its lease had expired); its budget is spent and this run must publish "
                    "nothing"
                )
            if (
                res.status == "settled"
                and (res.epsilon_spent, res.delta_spent) == (epsilon_spent, delta_spent)
                and _same_events(row.events_json, events_json)
            ):
                return res
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if epsilon_spent > res.epsilon or delta_spent > res.delta:
                raise ValueError(
                    f"spent (eps={epsilon_spent}, delta={delta_spent}) exceeds reserved "
                    f"(eps={res.epsilon}, delta={res.delta})"
                )
            self._close(conn, res, "settled", epsilon_spent, delta_spent, events_json, reason, now)
            _log(
                conn,
                reservation_id,
                now,
                "settled",
                epsilon_spent=str(epsilon_spent),
                delta_spent=str(delta_spent),
                reason=reason,
            )
            return dataclasses.replace(
                res,
                status="settled",
                epsilon_spent=epsilon_spent,
                delta_spent=delta_spent,
                closed_at=now,
                close_reason=reason,
            )

        return self.transaction(tx)

    def cancel(self, reservation_id: str, *, now: int, owner: str | None = None) -> Reservation:
        """Release a whole reservation of a run that read no protected byte.

        Refused with DataOpenedError once `open_data` was recorded: from then on
        the reservation is settled as spent, never refunded. Cancelling a
        cancelled reservation returns it; a settled one raises
        ReservationStateError; another owner's, ReservationOwnedError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            _check_owner(res, owner)
            if res.status == "cancelled":
                return res
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if res.data_opened_at is not None:
                raise DataOpenedError(
                    f"reservation {reservation_id} opened the protected data at "
                    f"{res.data_opened_at}; it can only be settled as spent"
                )
            reason = "cancelled before the data was opened"
            self._close(conn, res, "cancelled", None, None, None, reason, now)
            _log(conn, reservation_id, now, "cancelled", reason=reason)
            return dataclasses.replace(res, status="cancelled", closed_at=now, close_reason=reason)

        return self.transaction(tx)

    def settle_stale(self, reservation_id: str, *, now: int, note: str = "") -> Reservation:
        """Operator action: settle an open reservation whose lease ran out, AS SPENT.

        The full reserved (ε, δ) is charged (nothing is ever refunded this way,
        whether or not the run opened its data) and the action is logged as a
        ``settled_stale`` event with `note`. A live lease raises LeaseActiveError;
        a closed reservation, ReservationStateError.
        """

        def tx(conn: sa.Connection) -> Reservation:
            res = _reservation(self._locked_reservation(conn, reservation_id))
            if res.status != "reserved":
                raise ReservationStateError(f"reservation {reservation_id} is {res.status}")
            if not res.stale(now):
                raise LeaseActiveError(
                    f"reservation {reservation_id} is held by a live run until "
                    f"{res.lease_expires_at}; settle it after its lease expires"
                )
            reason = STALE_REASON + (f" ({note})" if note else "")
            self._close(conn, res, "settled", res.epsilon, res.delta, "[]", reason, now)
            _log(
                conn,
                reservation_id,
                now,
                "settled_stale",
                epsilon_spent=str(res.epsilon),
                delta_spent=str(res.delta),
                data_opened=res.data_opened_at is not None,
                note=note,
            )
            return dataclasses.replace(
                res,
                status="settled",
                epsilon_spent=res.epsilon,
                delta_spent=res.delta,
                closed_at=now,
                close_reason=reason,
            )

        return self.transaction(tx)

    def _close(
        self,
        conn: sa.Connection,
        res: Reservation,
        status: str,
        eps_spent: Decimal | None,
        delta_spent: Decimal | None,
        events_json: str | None,
        reason: str,
        now: int,
    ) -> None:
        """Move `res` to `status`, releasing from the cap what was reserved but not spent."""
        self._release(
            conn,
            res,
            EXACT.subtract(res.epsilon, eps_spent or Decimal(0)),
            EXACT.subtract(res.delta, delta_spent or Decimal(0)),
            now,
        )
        conn.execute(
            sa.update(central_reservations)
            .where(central_reservations.c.id == res.id)
            .values(
                status=status,
                epsilon_spent=None if eps_spent is None else _s(eps_spent),
                delta_spent=None if delta_spent is None else _s(delta_spent),
                events_json=events_json,
                closed_at=now,
                close_reason=reason,
            )
        )

    def _locked_reservation(self, conn: sa.Connection, reservation_id: str) -> Any:
        row = conn.execute(
            sa.select(central_reservations)
            .where(central_reservations.c.id == reservation_id)
            .with_for_update()
        ).first()
        if row is None:
            raise ReservationNotFoundError(f"no reservation {reservation_id!r}")
        return row

    def _release(
        self, conn: sa.Connection, res: Reservation, eps: Decimal, delta: Decimal, now: int
    ) -> None:
        cap = conn.execute(
            sa.select(central_caps)
            .where(central_caps.c.subject == res.subject, central_caps.c.purpose == res.purpose)
            .with_for_update()
        ).one()
        conn.execute(
            sa.update(central_caps)
            .where(central_caps.c.subject == res.subject, central_caps.c.purpose == res.purpose)
            .values(
                epsilon_committed=_s(EXACT.subtract(_dec(cap.epsilon_committed), eps)),
                delta_committed=_s(EXACT.subtract(_dec(cap.delta_committed), delta)),
                updated_at=now,
            )
        )

    def reservation(self, reservation_id: str) -> Reservation:
        """One reservation by id (ReservationNotFoundError when there is none)."""

        def tx(conn: sa.Connection) -> Reservation:
            row = conn.execute(
                sa.select(central_reservations).where(central_reservations.c.id == reservation_id)
            ).first()
            if row is None:
                raise ReservationNotFoundError(f"no reservation {reservation_id!r}")
            return _reservation(row)

        return self.transaction(tx, write=False)

    def all_reservations(self) -> list[Reservation]:
        """Every central reservation of every subject, oldest first."""

        def tx(conn: sa.Connection) -> list[Reservation]:
            q = sa.select(central_reservations).order_by(
                central_reservations.c.created_at, central_reservations.c.id
            )
            return [_reservation(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    def reservation_log(self, reservation_id: str) -> list[dict[str, object]]:
        """The transitions of one reservation, oldest first: {"at", "action", **detail}."""

        def tx(conn: sa.Connection) -> list[dict[str, object]]:
            q = (
                sa.select(central_reservation_log)
                .where(central_reservation_log.c.reservation_id == reservation_id)
                .order_by(central_reservation_log.c.id)
            )
            return [
                {"at": int(r.at), "action": r.action, **json.loads(r.detail_json)}
                for r in conn.execute(q)
            ]

        return self.transaction(tx, write=False)

    def central_spend(self, subject: str, purpose: str) -> tuple[Decimal, Decimal]:
        """(ε, δ) reserved + settled for (subject, purpose), by basic composition."""

        def tx(conn: sa.Connection) -> tuple[Decimal, Decimal]:
            row = conn.execute(
                sa.select(central_caps.c.epsilon_committed, central_caps.c.delta_committed).where(
                    central_caps.c.subject == subject, central_caps.c.purpose == purpose
                )
            ).first()
            return (Decimal(0), Decimal(0)) if row is None else (_dec(row[0]), _dec(row[1]))

        return self.transaction(tx, write=False)

    def reservations(self, subject: str, purpose: str | None = None) -> list[Reservation]:
        """Every reservation of `subject` (for `purpose`), oldest first."""

        def tx(conn: sa.Connection) -> list[Reservation]:
            q = sa.select(central_reservations).where(central_reservations.c.subject == subject)
            if purpose is not None:
                q = q.where(central_reservations.c.purpose == purpose)
            q = q.order_by(central_reservations.c.created_at, central_reservations.c.id)
            return [_reservation(r) for r in conn.execute(q)]

        return self.transaction(tx, write=False)

    def central_events(self, subject: str, purpose: str) -> list[CentralEvent]:
        """Every event of every settled release of (subject, purpose), oldest first
        (one read transaction)."""

        def tx(conn: sa.Connection) -> list[CentralEvent]:
            q = (
                sa.select(central_reservations)
                .where(
                    central_reservations.c.subject == subject,
                    central_reservations.c.purpose == purpose,
                    central_reservations.c.status == "settled",
                )
                .order_by(central_reservations.c.created_at, central_reservations.c.id)
            )
            out: list[CentralEvent] = []
            for row in conn.execute(q):
                out.extend(_events_of(_reservation(row), row.events_json))
            return out

        return self.transaction(tx, write=False)

    def release_events(self, reservation_id: str) -> tuple[Reservation, list[CentralEvent]]:
        """One reservation and its events (none unless settled), in one read transaction:
        what a receipt or a replay of one release needs, without reading the other
        releases of its subject (`central_events`). ReservationNotFoundError when
        there is no such reservation."""

        def tx(conn: sa.Connection) -> tuple[Reservation, list[CentralEvent]]:
            row = conn.execute(
                sa.select(central_reservations).where(central_reservations.c.id == reservation_id)
            ).first()
            if row is None:
                raise ReservationNotFoundError(f"no reservation {reservation_id!r}")
            res = _reservation(row)
            return res, _events_of(res, row.events_json) if res.status == "settled" else []

        return self.transaction(tx, write=False)


def _events_of(res: Reservation, events_json: str | None) -> list[CentralEvent]:
    """The `CentralEvent`s of a settled reservation from its stored events."""
    assert res.epsilon_spent is not None and res.delta_spent is not None
    return [
        CentralEvent(
            res.id,
            res.subject,
            res.purpose,
            res.epsilon_spent,
            res.delta_spent,
            res.closed_at or res.created_at,
            ev,
        )
        for ev in (json.loads(events_json) if events_json else [])
    ]
