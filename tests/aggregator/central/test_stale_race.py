"""Finding 05: an operator settles a release's reservation as stale while the run still reads
its data; the run must then publish nothing, and its settle must not be taken as idempotent
(SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fedldp.aggregator.central import releases
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.ledger.store import ReservationStateError

SUBJECT, PURPOSE = "s", "p"
START = 1_000_000


@pytest.fixture
def ledgers(url: str) -> Iterator[tuple[Ledger, Ledger]]:
    """(the run's ledger connection, the operator's) on one database."""
    run, operator = open_ledger(url), open_ledger(url)
    run.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(5), delta_cap=Decimal(0))
    yield run, operator
    run.close()
    operator.close()


def test_a_release_settled_stale_while_reading_publishes_nothing(
    ledgers: tuple[Ledger, Ledger],
) -> None:
    run, operator = ledgers
    later = START + releases.RELEASE_LEASE_SECONDS + 1

    def load() -> Iterator[str]:
        # the read outlives the lease: the operator sees a stale reservation and settles it
        (res,) = operator.reservations(SUBJECT, PURPOSE)
        assert res.stale(later)
        operator.settle_stale(res.id, now=later, note="looked crashed")
        return iter(["1"] * 40)

    with pytest.raises(ReservationStateError, match="settled as stale by an operator"):
        releases.private_count(
            run,
            subject=SUBJECT,
            purpose=PURPOSE,
            epsilon=Decimal(1),
            idempotency_key="key-1",
            now=START,
            load=load,
        )
    (res,) = operator.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon_spent == Decimal(1)  # charged in full
    assert operator.central_events(SUBJECT, PURPOSE) == []  # and nothing was published
    with pytest.raises(releases.ReleaseFailedError, match="nothing was released"):
        releases.private_count(
            run,
            subject=SUBJECT,
            purpose=PURPOSE,
            epsilon=Decimal(1),
            idempotency_key="key-1",
            now=later,
            load=lambda: iter([]),
        )


def _settled(run: Ledger, events: list[dict[str, Any]]) -> tuple[str, str]:
    res = run.reserve(
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal(1),
        delta=Decimal(0),
        idempotency_key="k",
        now=START,
        owner="o" * 32,
    )
    run.open_data(res.id, owner="o" * 32, now=START)
    run.settle(
        res.id, epsilon_spent=Decimal(1), delta_spent=Decimal(0), events=events, now=START,
        owner="o" * 32,
    )  # fmt: skip
    return res.id, "o" * 32


def test_settle_is_idempotent_only_with_the_same_events(ledgers: tuple[Ledger, Ledger]) -> None:
    run, _ = ledgers
    rid, owner = _settled(run, [{"kind": "discrete_laplace", "output": "3"}])
    same = run.settle(
        rid, epsilon_spent=Decimal(1), delta_spent=Decimal(0),
        events=[{"kind": "discrete_laplace", "output": "3"}], now=START, owner=owner,
    )  # fmt: skip
    assert same.status == "settled"
    with pytest.raises(ReservationStateError):
        run.settle(
            rid, epsilon_spent=Decimal(1), delta_spent=Decimal(0),
            events=[{"kind": "discrete_laplace", "output": "4"}], now=START, owner=owner,
        )  # fmt: skip
    with pytest.raises(ReservationStateError):
        run.settle(
            rid, epsilon_spent=Decimal(1), delta_spent=Decimal(0), events=(), now=START,
            owner=owner,
        )  # fmt: skip
