"""A DP-SGD run records where its sampling and noise came from, in its receipt and in
its ledger event alike: "seeded" (not for release) whenever [randomness] source is
"seeded", "os-entropy" (for release) only when every step reseeded from the OS CSPRNG."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

from fedldp.aggregator.training import train_private
from fedldp.collector.ledger import Ledger

from .conftest import PURPOSE, SUBJECT, ConfigFactory


@pytest.mark.parametrize(
    ("randomness", "source", "for_release"),
    [
        ({"source": "seeded", "seed": 5}, "seeded", False),
        ({"source": "os-entropy", "seed": None}, "os-entropy", True),
    ],
)
def test_receipt_and_ledger_event_name_the_randomness(
    make_config: ConfigFactory,
    ledger: Ledger,
    randomness: dict[str, Any],
    source: str,
    for_release: bool,
) -> None:
    result = train_private(make_config(randomness=randomness), ledger=ledger)
    assert result.receipt["randomness"]["source"] == source
    assert result.receipt["for_release"] is for_release
    (event,) = [
        e.event
        for e in ledger.central_events(SUBJECT, PURPOSE)
        if e.reservation_id == result.reservation_id
    ]
    assert event["randomness"] == source
