"""pem's stored forms (client/mechanisms/pem.py, "Statistic"): chunks and JSON.

* Chunks concatenate: the chunks of any split of a set of reports, concatenated
  in any order, decode to the statistic of all of them (the same canonical
  JSON), and `chunk_count` counts them.
* Malformed chunks are refused with a ValueError that echoes nothing from the
  data: a partial record, a group outside [0, G), a hash value outside [0, g).
  The broken variant (no range checks) accepts each, and is caught.
* `statistic_to_json` orders each group's records as Python's `sorted` orders
  their bytes (the reference: the code before numpy, kept here), zero bytes
  anywhere in a record included; `statistic_from_json` inverts it.
* `support_window` is `top_bits` exactly: at every boundary of every value's
  interval and on random sums, for g = 2 .. 2^31.
"""

from __future__ import annotations

import base64
import itertools
import json
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import GroupHashedOutput, OpenDomain
from fedldp.client.mechanisms.pem import PEM, GroupReports


def pem(g: int | None = None, max_bytes: int = 8) -> PEM:
    return PEM(Decimal(4), OpenDomain(max_bytes), g=g)


def outputs(m: PEM, count: int, seed: int) -> list[GroupHashedOutput]:
    rng = random.Random(seed)
    words = ["ok", "hello", "a", "zzzzzzzz"]
    return [m.perturb(rng.choice(words), rng=rng) for _ in range(count)]


def stat_of(m: PEM, outs: list[GroupHashedOutput]) -> GroupReports:
    stat = m.new_statistic()
    for o in outs:
        m.accumulate(stat, o)
    return stat


def test_chunks_concatenate_in_any_order() -> None:
    m = pem()
    outs = outputs(m, 500, seed=1)
    whole = m.statistic_to_json(stat_of(m, outs))
    cuts = [0, 1, 2, 90, 91, 300, 500]
    spans = list(itertools.pairwise(cuts))
    chunks = [m.statistic_chunk(stat_of(m, outs[a:b])) for a, b in spans]
    for chunk, (a, b) in zip(chunks, spans, strict=True):
        assert len(chunk) == (b - a) * (m.record_size + 2)
    for order in (chunks, chunks[::-1], random.Random(2).sample(chunks, len(chunks))):
        data = b"".join(order)
        assert m.chunk_count(data) == 500
        stat = m.statistic_from_chunks(data)
        assert stat.n == 500 and m.statistic_to_json(stat) == whole
    # In chunk order, each group's records come back in the order they were added.
    assert m.statistic_from_chunks(b"".join(chunks)) == stat_of(m, outs)
    empty = m.statistic_from_chunks(b"")
    assert empty.n == 0 and m.chunk_count(b"") == 0


class UncheckedPEM(PEM):
    """Broken: decodes chunks without the range checks."""

    def statistic_from_chunks(self, data: bytes) -> GroupReports:
        records = np.frombuffer(data[: len(data) - len(data) % (self.record_size + 2)], np.uint8)
        stat = self.new_statistic()
        size = self.record_size + 2
        for row in records.reshape(-1, size):
            stat.records[int(row[0]) % self.groups] += row[2:].tobytes()
            stat.n += 1
        return stat


def _record(m: PEM, group: int, value: int) -> bytes:
    return group.to_bytes(2, "little") + bytes(range(m.key_bytes)) + value.to_bytes(4, "little")


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("partial", "partial record"),
        ("group", "group outside"),
        ("value", "hash value outside"),
    ],
)
@pytest.mark.parametrize("cls", [PEM, UncheckedPEM])
def test_malformed_chunks_are_refused_and_name_no_value(
    cls: type[PEM], damage: str, message: str
) -> None:
    m = cls(Decimal(4), OpenDomain(8), g=64)
    good = m.statistic_chunk(stat_of(m, outputs(m, 3, seed=3)))
    bad = {
        "partial": good + b"\x01",
        "group": good + _record(m, m.groups, 5),
        "value": good + _record(m, 0, m.g),
    }[damage]
    if cls is UncheckedPEM:  # the broken variant takes each as a report
        assert m.statistic_from_chunks(bad).n >= 3
        return
    with pytest.raises(ValueError, match=message) as caught:
        m.statistic_from_chunks(bad)
    assert bytes(range(m.key_bytes)).hex() not in str(caught.value)
    assert str(m.g) in str(caught.value) or damage != "value"


def _sorted_reference(m: PEM, stat: GroupReports) -> str:
    """`statistic_to_json` as written before numpy: Python's bytewise sort."""
    size = stat.record_size
    groups = []
    for buf in stat.records:
        records = sorted(bytes(buf[i : i + size]) for i in range(0, len(buf), size))
        groups.append(base64.b64encode(b"".join(records)).decode("ascii"))
    return json.dumps({"n": stat.n, "groups": groups}, separators=(",", ":"))


def test_json_records_are_sorted_as_bytes_zero_bytes_included() -> None:
    m = pem(g=256, max_bytes=4)
    rng = random.Random(4)
    stat = m.new_statistic()
    for _ in range(3000):  # keys of mostly zero bytes: trailing and inner zeros everywhere
        key = bytes(rng.choice([0, 0, 0, 1, 128, 255]) for _ in range(m.key_bytes))
        m.accumulate(stat, GroupHashedOutput(rng.randrange(m.groups), key, rng.randrange(4)))
    text = m.statistic_to_json(stat)
    assert text == _sorted_reference(m, stat)
    assert m.statistic_to_json(m.statistic_from_json(text)) == text


@pytest.mark.parametrize("g", [2, 8, 64, 4096, 1 << 31])
def test_the_support_window_is_the_top_bits(g: int) -> None:
    m = pem(g=g)
    width = 1 << (64 - m.hash_bits)
    rng = np.random.default_rng(g)
    values = rng.integers(0, g, size=2000, dtype=np.uint64)
    values[:4] = [0, 1, g - 2, g - 1]
    sums: list[Any] = [rng.integers(0, 2**64 - 1, size=2000, dtype=np.uint64, endpoint=True)]
    for v in (0, 1, g - 1):  # each side of some interval boundaries
        for edge in (v * width, (v + 1) * width):
            for delta in (-1, 0, 1):
                sums.append(np.full(2000, (edge + delta) % 2**64, dtype=np.uint64))
    offsets, limit = m.support_window(values)
    for acc in sums:
        window = (acc - offsets) < limit
        assert np.array_equal(window, m.top_bits(acc) == values)
