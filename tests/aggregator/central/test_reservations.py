"""The shared reservation lifecycle (aggregator/central/reservations.py) on real ledgers.

State machine reserve → open → settle; the refund rule (a failure before the
data-opened mark cancels and refunds, after it settles in full as spent, and
an unanswered mark counts as opened); lease renewal and expiry; and the one
parameter its callers differ in, the answer for a key another run holds:
releases replay, training refuses. SQLite files and the suite's PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fedldp.aggregator.central import releases
from fedldp.aggregator.central.reservations import (
    Closed,
    Reservation,
    ReservationAsk,
    cancel_unless_opened,
    failure_reason,
)
from fedldp.aggregator.service.holds import AnalystCapLedger
from fedldp.collector.ledger import DataOpenedError, Ledger, open_ledger
from fedldp.collector.ledger.store import ReservationStateError

SUBJECT, PURPOSE, ANALYST = "s", "p", "analyst"
START = 1_000_000
LEASE = 60


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = open_ledger(url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(2), delta_cap=Decimal("1e-5"))
    yield led
    led.close()


class Clock:
    """A ledger clock the test moves."""

    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> int:
        return self.now


def _ask(key: str = "k", epsilon: str = "1", **overrides: Any) -> ReservationAsk:
    fields: dict[str, Any] = {
        "subject": SUBJECT,
        "purpose": PURPOSE,
        "epsilon": Decimal(epsilon),
        "delta": Decimal(0),
        "idempotency_key": key,
        "metadata": {"kind": "test"},
        "lease_seconds": LEASE,
    }
    fields.update(overrides)
    return ReservationAsk(**fields)


def _never_taken(record: Any) -> Any:
    raise AssertionError(f"the key was free, yet {record.id} was taken")


def _claim(ledger: Any, clock: Clock, ask: ReservationAsk | None = None) -> Reservation:
    held = Reservation.claim(ledger, ask or _ask(), clock=clock, when_taken=_never_taken)
    assert isinstance(held, Reservation)
    return held


def _actions(ledger: Ledger, rid: str) -> list[object]:
    return [entry["action"] for entry in ledger.reservation_log(rid)]


def test_reserve_open_settle(ledger: Ledger) -> None:
    clock = Clock()
    held = _claim(ledger, clock)
    res = ledger.reservation(held.reservation_id)
    assert res.status == "reserved" and res.held_by(held.owner)
    assert res.lease_expires_at == START + LEASE and res.data_opened_at is None
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))  # charged now
    assert held.ledger_id() == ledger.ledger_id()

    clock.now += 5
    held.open_data()
    assert held.opened
    assert ledger.reservation(held.reservation_id).data_opened_at == START + 5

    clock.now += 5
    held.settle(Decimal("0.5"), Decimal(0), [{"kind": "k", "output": "7"}])
    res = ledger.reservation(held.reservation_id)
    assert (res.status, res.epsilon_spent, res.closed_at) == ("settled", Decimal("0.5"), START + 10)
    assert [e.event["output"] for e in ledger.central_events(SUBJECT, PURPOSE)] == ["7"]
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal("0.5"), Decimal(0))  # rest released
    assert _actions(ledger, held.reservation_id)[-2:] == ["data_opened", "settled"]


def test_failure_before_open_cancels_and_refunds(ledger: Ledger) -> None:
    held = _claim(ledger, Clock())
    assert held.close_failed(RuntimeError("before the read")) is Closed.CANCELLED
    assert ledger.reservation(held.reservation_id).status == "cancelled"
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))
    _claim(ledger, Clock(), _ask("k2", epsilon="2"))  # the whole cap is free again


def test_failure_after_open_settles_in_full_and_names_no_data(ledger: Ledger) -> None:
    held = _claim(ledger, Clock())
    held.open_data()
    exc = ValueError("row 17 holds 52341")  # a message that may carry data
    assert held.close_failed(exc) is Closed.SPENT
    res = ledger.reservation(held.reservation_id)
    assert (res.status, res.epsilon_spent, res.delta_spent) == ("settled", Decimal(1), Decimal(0))
    assert res.close_reason == failure_reason(exc) and "52341" not in str(res.close_reason)
    assert ledger.central_events(SUBJECT, PURPOSE) == []  # nothing released


class _UnansweredOpen:
    """The ledger, except that open_data commits and then the answer is lost."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def open_data(self, reservation_id: str, **kwargs: Any) -> Any:
        self._ledger.open_data(reservation_id, **kwargs)
        raise ConnectionError("the answer was lost")


def test_an_unanswered_open_counts_as_opened(ledger: Ledger) -> None:
    held = _claim(_UnansweredOpen(ledger), Clock())
    with pytest.raises(ConnectionError) as info:
        held.open_data()
    assert not held.opened  # the run cannot know: the ledger decides
    assert held.close_failed(info.value) is Closed.SPENT
    assert ledger.reservation(held.reservation_id).epsilon_spent == Decimal(1)


def test_broken_variant_refunding_after_the_read_is_refused_by_the_ledger(ledger: Ledger) -> None:
    """A broken lifecycle that cancels whatever happened: the ledger refuses the refund."""
    held = _claim(ledger, Clock())
    held.open_data()
    with pytest.raises(DataOpenedError):
        ledger.cancel(held.reservation_id, now=START, owner=held.owner)
    assert not cancel_unless_opened(ledger, held.reservation_id, owner=held.owner, now=START)
    assert ledger.reservation(held.reservation_id).status == "reserved"  # still charged


def test_renewal_keeps_a_long_run_from_going_stale(ledger: Ledger) -> None:
    clock = Clock()
    held = _claim(ledger, clock)
    held.open_data()
    for _ in range(3):  # three stretches of work, each shorter than the lease
        clock.now += LEASE - 1
        held.renew()
        res = ledger.reservation(held.reservation_id)
        assert res.lease_expires_at == clock.now + LEASE and not res.stale(clock.now)
    held.settle(Decimal(1), Decimal(0), [])
    assert ledger.reservation(held.reservation_id).status == "settled"


def test_an_expired_lease_lets_an_operator_take_the_reservation(ledger: Ledger) -> None:
    clock = Clock()
    held = _claim(ledger, clock)
    held.open_data()
    clock.now += LEASE  # no renewal: stale at the lease's end
    assert ledger.reservation(held.reservation_id).stale(clock.now)
    ledger.settle_stale(held.reservation_id, now=clock.now, note="looked crashed")
    with pytest.raises(ReservationStateError):
        held.renew()
    with pytest.raises(ReservationStateError, match="must publish nothing"):
        held.settle(Decimal(1), Decimal(0), [{"output": "1"}])
    assert ledger.central_events(SUBJECT, PURPOSE) == []


def test_another_runs_key_goes_to_when_taken_and_reserves_nothing(ledger: Ledger) -> None:
    first = _claim(ledger, Clock())
    seen: list[Any] = []
    answer = Reservation.claim(ledger, _ask(), clock=Clock(), when_taken=seen.append)
    assert answer is None and [r.id for r in seen] == [first.reservation_id]
    assert seen[0].status == "reserved" and not seen[0].held_by("another owner")
    assert len(ledger.reservations(SUBJECT, PURPOSE)) == 1
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))  # charged once


def _count(ledger: Any, key: str, load: Any, now: int = START) -> releases.CentralRelease:
    return releases.private_count(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal(1),
        idempotency_key=key,
        now=now,
        load=load,
    )


def test_releases_replay_another_runs_key(ledger: Ledger) -> None:
    """The releases' policy: the earlier run's output, read from the ledger, no new read."""
    first = _count(ledger, "r", lambda: iter(range(30)))
    reads: list[int] = []

    def load() -> Iterator[int]:
        reads.append(1)
        return iter(())

    again = _count(ledger, "r", load, now=START + 9)
    assert again == first and reads == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))


def test_releases_refuse_a_key_still_held_or_cancelled(ledger: Ledger) -> None:
    def load() -> Iterator[int]:  # the first run holds the key while it reads
        with pytest.raises(releases.ReleaseInProgressError, match="never released twice"):
            _count(ledger, "r", lambda: iter(()))
        return iter(range(3))

    _count(ledger, "r", load)
    with pytest.raises(ConnectionError):  # the mark is never committed: cancelled
        _count(_LostOpen(ledger), "c", lambda: iter(()))
    with pytest.raises(releases.ReleaseCancelledError, match="retry with a new key"):
        _count(ledger, "c", lambda: iter(()))


class _LostOpen(_UnansweredOpen):
    """A ledger view that takes the claim without its data-opened mark (as
    service/holds.py does), and whose open_data fails before it commits."""

    def reserve(self, **kwargs: Any) -> Any:
        kwargs.pop("open_data", None)
        return self._ledger.reserve(**kwargs)

    def open_data(self, reservation_id: str, **kwargs: Any) -> Any:
        raise ConnectionError("the ledger went away")


def test_a_claim_asked_to_open_commits_the_mark_with_it(ledger: Ledger) -> None:
    """`open_at_claim`: one transaction claims and opens; `open_data` then has nothing to
    do, and the reservation can no longer be cancelled (the refund rule)."""
    held = _claim(ledger, Clock(), _ask(open_at_claim=True))
    assert held.opened
    res = ledger.reservation(held.reservation_id)
    assert res.data_opened_at == START and res.status == "reserved"
    assert _actions(ledger, res.id) == ["reserved", "data_opened"]
    held.open_data()  # already opened: no second mark
    assert len(ledger.reservation_log(res.id)) == 2
    with pytest.raises(DataOpenedError):
        ledger.cancel(res.id, now=START, owner=held.owner)
    assert held.close_failed(RuntimeError("x")) is Closed.SPENT
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(1), Decimal(0))


def test_another_runs_key_is_not_opened_by_a_claim_asked_to_open(ledger: Ledger) -> None:
    first = _claim(ledger, Clock())
    seen: list[Any] = []
    Reservation.claim(ledger, _ask(open_at_claim=True), clock=Clock(), when_taken=seen.append)
    assert [r.id for r in seen] == [first.reservation_id]
    assert ledger.reservation(first.reservation_id).data_opened_at is None
    assert first.close_failed(RuntimeError("x")) is Closed.CANCELLED


def test_training_refuses_another_runs_key(ledger: Ledger) -> None:
    """Training's policy: ReservationTakenError, whatever the other run's state."""
    pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
    from fedldp.aggregator.training import ReservationTakenError
    from fedldp.aggregator.training.lifecycle import refuse_taken

    first = _claim(ledger, Clock())
    with pytest.raises(ReservationTakenError, match="held by another run") as info:
        Reservation.claim(ledger, _ask(), clock=Clock(), when_taken=refuse_taken)
    assert info.value.__cause__ is None  # the service maps a cause-less refusal to ALREADY_EXISTS
    first.close_failed(RuntimeError("x"))
    with pytest.raises(ReservationTakenError, match="which is cancelled"):
        Reservation.claim(ledger, _ask(), clock=Clock(), when_taken=refuse_taken)
    assert len(ledger.reservations(SUBJECT, PURPOSE)) == 1


def test_an_analyst_hold_follows_the_refund_rule(ledger: Ledger) -> None:
    """Through AnalystCapLedger (service/holds.py): the hold moves with the reservation."""
    ledger.set_central_cap(ANALYST, PURPOSE, epsilon_cap=Decimal(2), delta_cap=Decimal(0))

    def hold_of(rid: str) -> Any:
        (hold,) = [
            h
            for h in ledger.reservations(ANALYST, PURPOSE)
            if h.idempotency_key == f"analyst-cap:{rid}"
        ]
        return hold

    before = _claim(AnalystCapLedger(ledger, ANALYST, PURPOSE), Clock(), _ask("a"))
    assert before.close_failed(RuntimeError("x")) is Closed.CANCELLED
    assert hold_of(before.reservation_id).status == "cancelled"

    after = _claim(AnalystCapLedger(ledger, ANALYST, PURPOSE), Clock(), _ask("b"))
    after.open_data()
    assert after.close_failed(RuntimeError("x")) is Closed.SPENT
    hold = hold_of(after.reservation_id)
    assert (hold.status, hold.epsilon_spent) == ("settled", Decimal(1))
    assert ledger.central_spend(ANALYST, PURPOSE) == (Decimal(1), Decimal(0))
