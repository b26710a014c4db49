"""Every central release records where its noise came from: "seeded" (and a receipt
not for release) whenever the caller passed a generator, "os-csprng" (for release)
only when the OS CSPRNG drew the noise. The ledger's event and the receipt built
from it say the same, for each release function of aggregator/central/releases.py.

Broken variant caught: `private_histogram` recorded "os-csprng" for a caller's
seeded generator, so its receipt claimed to be for release.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.central import releases
from fedldp.aggregator.central.receipts import release_receipt
from fedldp.collector.ledger import Ledger, open_ledger

SUBJECT, PURPOSE = "team", "labels"
VALUES = [str(v) for v in range(1, 31)]
CITIES = ["paris", "lyon", "nice"]

#: Each release function with the arguments of one small release (besides the
#: request fields every release takes).
RELEASES: dict[str, Callable[..., releases.CentralRelease]] = {
    "private_count": lambda led, **f: releases.private_count(
        led, epsilon=Decimal("0.5"), load=lambda: VALUES, **f
    ),
    "private_sum": lambda led, **f: releases.private_sum(
        led, epsilon=Decimal("0.5"), load=lambda: VALUES, lower=Decimal(0), upper=Decimal(40), **f
    ),
    "private_mean": lambda led, **f: releases.private_mean(
        led, epsilon=Decimal("0.5"), load=lambda: VALUES, lower=Decimal(0), upper=Decimal(40), **f
    ),
    "private_choice": lambda led, **f: releases.private_choice(
        led, epsilon=Decimal("0.5"), candidates=CITIES, load=lambda: CITIES * 4, **f
    ),
    "private_histogram": lambda led, **f: releases.private_histogram(
        led, epsilon=Decimal("0.5"), domain=CITIES, load=lambda: CITIES * 4, **f
    ),
    "private_quantile": lambda led, **f: releases.private_quantile(
        led,
        epsilon=Decimal("0.5"),
        quantile=Decimal("0.5"),
        lower=Decimal(0),
        upper=Decimal(40),
        load=lambda: VALUES,
        **f,
    ),
}


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    led.set_central_cap(SUBJECT, PURPOSE, epsilon_cap=Decimal(100), delta_cap=Decimal(0))
    yield led
    led.close()


def test_every_release_function_is_covered() -> None:
    """A release function added to releases.py without a row here fails this test."""
    public = {
        name
        for name, fn in inspect.getmembers(releases, inspect.isfunction)
        if name.startswith("private_") and fn.__module__ == releases.__name__
    }
    assert public == set(RELEASES)


def _labels(ledger: Ledger, release: releases.CentralRelease) -> tuple[set[Any], Any, Any]:
    """(the randomness of the release's ledger events, the receipt's, its for_release)."""
    events = [
        e.event
        for e in ledger.central_events(SUBJECT, PURPOSE)
        if e.reservation_id == release.reservation_id
    ]
    receipt = release_receipt(ledger, release.reservation_id, value=str(release.value))
    return {e.get("randomness") for e in events}, receipt["randomness"], receipt["for_release"]


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_a_seeded_generator_is_recorded_as_seeded(ledger: Ledger, name: str) -> None:
    release = RELEASES[name](
        ledger, subject=SUBJECT, purpose=PURPOSE, idempotency_key=name, now=1, rng=random.Random(7)
    )
    assert _labels(ledger, release) == ({"seeded"}, {"source": "seeded"}, False)


@pytest.mark.parametrize("name", sorted(RELEASES))
def test_the_os_csprng_is_recorded_as_os_csprng(ledger: Ledger, name: str) -> None:
    release = RELEASES[name](
        ledger, subject=SUBJECT, purpose=PURPOSE, idempotency_key=f"{name}-os", now=1
    )
    assert _labels(ledger, release) == ({"os-csprng"}, {"source": "os-csprng"}, True)
