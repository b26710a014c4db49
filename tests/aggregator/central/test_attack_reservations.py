"""Attack on the shared reservation lifecycle (aggregator/central/reservations.py)
through the releases and the analyst's hold, on real SQLite files and the suite's
PostgreSQL. The contract under attack (reservations.py, docs/architecture.md):
the only refund is a cancel before the data is opened; after the open, *any*
failure settles the reservation in full as spent; a key another run holds makes a
release replay the earlier output."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from fedldp.aggregator.central import releases
from fedldp.collector.ledger import Ledger, open_ledger

SUBJECT, PURPOSE = "s", "p"
START = 1_000_000


@pytest.fixture
def ledger(url: str) -> Iterator[Ledger]:
    led = open_ledger(url)
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(2), delta_cap=Decimal("1e-5"))
    yield led
    led.close()


class _LostFinalSettle:
    """The ledger, except that the run's final settle (the one carrying the release's
    events) fails before it commits, as a dropped connection does. Every other call,
    including a settle-as-spent without events, goes to the real ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ledger, name)

    def settle(self, reservation_id: str, **kwargs: Any) -> Any:
        if kwargs.get("events"):
            raise ConnectionError("the ledger went away before the commit")
        return self._ledger.settle(reservation_id, **kwargs)


def _count(ledger: Any, key: str, now: int = START) -> releases.CentralRelease:
    return releases.private_count(
        ledger,
        subject=SUBJECT,
        purpose=PURPOSE,
        epsilon=Decimal(1),
        idempotency_key=key,
        now=now,
        load=lambda: iter(range(30)),
    )


def test_a_release_whose_final_settle_fails_is_settled_as_spent(ledger: Ledger) -> None:
    with pytest.raises(ConnectionError):
        _count(_LostFinalSettle(ledger), "k")
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.data_opened_at is not None  # the data was read
    # The contract: any failure after the open settles the reservation in full as spent.
    assert (res.status, res.epsilon_spent) == ("settled", Decimal(1))
    assert ledger.central_events(SUBJECT, PURPOSE) == []  # nothing released
    # A retry of the key is told the release failed (spent, nothing released), not that
    # a (dead) run still holds it.
    with pytest.raises(releases.ReleaseFailedError):
        _count(ledger, "k", now=START + 5)
