"""ATTACK (audit atk2): PEM.statistic_from_json's contract.

client/mechanisms/pem.py: `statistic_from_json` is the inverse of
`statistic_to_json`, "ValueError on a malformed or foreign statistic". It is
what the collector merges into (collector/ledger/ingest.py) and what the
aggregator reads from every shard's statistics row (aggregator/reports.py).
A record whose hash value lies outside [0, g) can never come from
`accumulate` (check_output refuses it), yet it is accepted and silently counted
in n (it supports no candidate, biasing every estimate down); a JSON `true` is
accepted as the count 1. Square Wave's `check_counts` refuses the analogous
malformed statistic.
"""

from __future__ import annotations

import base64
import json
import struct
from decimal import Decimal

import pytest
from fedldp.client.mechanisms import OpenDomain
from fedldp.client.mechanisms.pem import PEM


def mech() -> PEM:
    return PEM(Decimal(8), OpenDomain(1), start_bits=0, step_bits=4, g=256)


def statistic(value: int, n: object = 1) -> str:
    m = mech()
    record = bytes(m.key_bytes) + struct.pack("<I", value)
    groups = [base64.b64encode(record).decode("ascii"), *[""] * (m.groups - 1)]
    return json.dumps({"n": n, "groups": groups})


def test_an_in_domain_record_round_trips() -> None:
    m = mech()
    stat = m.statistic_from_json(statistic(255))
    assert stat.n == 1 and m.statistic_to_json(stat) == m.statistic_to_json(
        m.statistic_from_json(m.statistic_to_json(stat))
    )


@pytest.mark.xfail(
    strict=True,
    reason="ATTACK: pem statistic_from_json accepts a record whose hash value is >= g "
    "(no report could produce it) and counts it in n",
)
def test_a_record_outside_the_output_domain_is_refused() -> None:
    with pytest.raises(ValueError):
        mech().statistic_from_json(statistic(1_000_000))


@pytest.mark.xfail(
    strict=True, reason="ATTACK: pem statistic_from_json accepts n = true (bool) as the count 1"
)
def test_a_boolean_count_is_refused() -> None:
    with pytest.raises(ValueError):
        mech().statistic_from_json(statistic(1, n=True))
