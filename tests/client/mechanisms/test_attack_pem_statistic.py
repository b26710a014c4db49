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


def test_a_record_outside_the_output_domain_is_refused() -> None:
    with pytest.raises(ValueError):
        mech().statistic_from_json(statistic(1_000_000))


def test_a_boolean_count_is_refused() -> None:
    with pytest.raises(ValueError):
        mech().statistic_from_json(statistic(1, n=True))


@pytest.mark.parametrize("n", [2, 0, "1", 1.0, None, [1]])
def test_a_count_that_is_not_the_record_count_is_refused(n: object) -> None:
    with pytest.raises(ValueError, match="pem statistic n"):
        mech().statistic_from_json(statistic(1, n=n))


def test_a_record_with_a_short_hash_key_is_refused() -> None:
    m = mech()
    record = bytes(m.key_bytes - 1) + struct.pack("<I", 1)
    text = json.dumps(
        {"n": 1, "groups": [base64.b64encode(record).decode(), *[""] * (m.groups - 1)]}
    )
    with pytest.raises(ValueError, match="partial record"):
        m.statistic_from_json(text)


def test_a_record_for_a_group_out_of_range_is_refused() -> None:
    m = mech()
    record = base64.b64encode(bytes(m.key_bytes) + struct.pack("<I", 1)).decode()
    text = json.dumps({"n": 1, "groups": [*[""] * m.groups, record]})
    with pytest.raises(ValueError, match="exactly"):
        m.statistic_from_json(text)


@pytest.mark.parametrize("group", [7, None, ["AAAA"]])
def test_a_group_that_is_not_base64_text_is_refused(group: object) -> None:
    m = mech()
    text = json.dumps({"n": 0, "groups": [group, *[""] * (m.groups - 1)]})
    with pytest.raises(ValueError, match="not base64"):
        m.statistic_from_json(text)


def test_the_refusal_never_echoes_the_value() -> None:
    with pytest.raises(ValueError) as info:
        mech().statistic_from_json(statistic(987_654_321))
    assert "987654321" not in str(info.value)
    assert "3ade68b1" not in str(info.value).lower()  # nor in hex
