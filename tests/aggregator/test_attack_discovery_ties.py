"""ATTACK (audit atk2): discovery's stated tie rule.

aggregator/discovery.py states: "of those, at most `top` T with the largest
estimates survive (ties: the smaller prefix)" and the Discovery result lists the
strings "largest estimate first". The reports below are crafted with a hash key
(a_0 = 2^56, b = 0, g = 256, L = 1) under which h(x) is exactly byte 0 of the
prefix, so every support count is known exactly and the run is deterministic.
At level 1 the candidates are ordered by the previous level's rank, not by
prefix value, so a tie is broken in favour of the extension of the higher
level-0 survivor rather than the smaller prefix.
"""

from __future__ import annotations

import struct
from decimal import Decimal

from fedldp.aggregator.discovery import discover
from fedldp.client.mechanisms import GroupHashedOutput, OpenDomain
from fedldp.client.mechanisms.pem import PEM, GroupReports

#: h_key(x) = ((2^56 x_0) mod 2^64) >> 56 = byte 0 of the prefix (g = 256).
BYTE0_KEY = struct.pack("<QQ", 1 << 56, 0)
#: A hash value no candidate prefix of either level maps to at these counts' scale.
NOWHERE = 0x01


def crafted() -> tuple[PEM, GroupReports]:
    mech = PEM(Decimal(8), OpenDomain(1), start_bits=0, step_bits=4, g=256)
    stat = mech.new_statistic()

    def add(group: int, value: int, times: int) -> None:
        for _ in range(times):
            mech.accumulate(stat, GroupHashedOutput(group, BYTE0_KEY, value))

    # Level 0 (first nibble): 0x6_ supported 10 times, 0x5_ 5 times: 0x6_ ranks first.
    add(0, 0x60, 10)
    add(0, 0x50, 5)
    add(0, NOWHERE, 20)
    # Level 1 (whole byte): 'a' = 0x61 six times; 'b' = 0x62 and 'Q' = 0x51 tie at five.
    add(1, 0x61, 6)
    add(1, 0x62, 5)
    add(1, 0x51, 5)
    add(1, NOWHERE, 20)
    return mech, stat


def test_crafted_counts_are_what_the_test_assumes() -> None:
    mech, stat = crafted()
    found = discover(mech, stat)
    assert set(found.strings) == {"a", "b", "Q"}
    by_string = dict(zip(found.strings, found.estimate.values, strict=True))
    assert by_string["b"] == by_string["Q"] < by_string["a"]


def test_a_tie_at_the_top_cut_keeps_the_smaller_prefix() -> None:
    mech, stat = crafted()
    found = discover(mech, stat, top=2)
    assert found.strings == ("a", "Q")


def test_equal_estimates_are_listed_smaller_prefix_first() -> None:
    mech, stat = crafted()
    found = discover(mech, stat)
    assert found.strings == ("a", "Q", "b")
