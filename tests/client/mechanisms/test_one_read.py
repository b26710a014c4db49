"""One OS CSPRNG read per report (`system_random(read_bytes)`, `OneReadRandom`), same law.

The law cannot change if every draw is the same function of the same bytes: a
`OneReadRandom` and `random.SystemRandom` fed one byte stream (a fake
``os.urandom``) make identical draws and identical reports, whatever the call
pattern. What does change is the number of OS reads: one per CMS / OUE report
(counted), where `SystemRandom` made one per draw (a dozen and more).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterator
from decimal import Decimal

import pytest
from fedldp.client.mechanisms import base
from fedldp.client.mechanisms._common import bernoulli_read_bytes, byte_length
from fedldp.client.mechanisms.base import OneReadRandom, OpenDomain, system_random
from fedldp.client.mechanisms.sketch import CMS
from fedldp.client.mechanisms.unary import OUE


class ByteStream:
    """A deterministic stand-in for ``os.urandom``: one continuous stream (SHA-256 in
    counter mode), whatever the read sizes; reads counted."""

    def __init__(self, seed: bytes) -> None:
        self.seed, self.counter, self.calls = seed, 0, 0
        self.sizes: list[int] = []
        self._left = b""

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        self.sizes.append(n)
        out = bytearray(self._left)
        while len(out) < n:
            out += hashlib.sha256(self.seed + self.counter.to_bytes(8, "big")).digest()
            self.counter += 1
        self._left = bytes(out[n:])
        return bytes(out[:n])


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bytes], ByteStream]]:
    """Install a fresh byte stream as both SystemRandom's and OneReadRandom's OS read."""

    def install(seed: bytes) -> ByteStream:
        stream = ByteStream(seed)
        monkeypatch.setattr(random, "_urandom", stream)
        monkeypatch.setattr(base, "_urandom", stream)
        return stream

    yield install


def _draws(r: random.Random) -> list[object]:
    """A mixed call pattern: every method a mechanism uses, odd bit counts included."""
    return [
        r.getrandbits(1),
        r.getrandbits(53),
        r.getrandbits(1024),
        r.getrandbits(0),
        r.randrange(7),
        r.random(),
        r.randbytes(5),
        r.getrandbits(13),
        r.randrange(1 << 40),
    ]


def test_same_bytes_same_draws(streams: Callable[[bytes], ByteStream]) -> None:
    streams(b"a")
    expected = _draws(random.SystemRandom())
    stream = streams(b"a")
    got = _draws(OneReadRandom(4))  # far too small: refills, same draws
    assert got == expected
    assert stream.calls > 1


def test_one_read_serves_a_whole_call_pattern(streams: Callable[[bytes], ByteStream]) -> None:
    stream = streams(b"b")
    r = OneReadRandom(4096)
    _draws(r)
    assert (stream.calls, r.reads) == (1, 1)


@pytest.mark.parametrize("seed", [b"1", b"2", b"3", b"4"])
def test_cms_report_is_one_read_and_the_same_report(
    seed: bytes, streams: Callable[[bytes], ByteStream]
) -> None:
    """The device path (no rng) reads once; the report equals SystemRandom's on the same bytes."""
    cms = CMS(Decimal("4"), OpenDomain(16), rows=16, columns=1024)
    stream = streams(seed)
    one_read = cms.perturb("selfie")
    assert stream.calls == 1 and stream.sizes == [8 + bernoulli_read_bytes(1024)]
    streams(seed)
    assert cms.perturb("selfie", rng=random.SystemRandom()) == one_read


def test_cms_per_draw_reads_are_many(streams: Callable[[bytes], ByteStream]) -> None:
    """The reference: one read per draw (what the device did before)."""
    cms = CMS(Decimal("4"), OpenDomain(16), rows=16, columns=1024)
    stream = streams(b"c")
    cms.perturb("selfie", rng=random.SystemRandom())
    assert stream.calls >= 10


def test_oue_report_is_one_read_and_the_same_report(
    streams: Callable[[bytes], ByteStream],
) -> None:
    oue = OUE(Decimal("1"), 64)
    stream = streams(b"d")
    one_read = oue.perturb(3)
    assert stream.calls == 1
    streams(b"d")
    assert oue.perturb(3, rng=random.SystemRandom()) == one_read


def test_read_size_covers_all_but_a_tiny_fraction() -> None:
    """L levels leave a position undecided w.p. <= length * 2**-L <= 2**-12."""
    for length in (1, 2, 16, 64, 1000, 1024, 16384):
        levels = bernoulli_read_bytes(length) // byte_length(length)
        assert length * 2.0**-levels <= 2.0**-12 or levels == 53


def test_system_random_without_size_is_system_random() -> None:
    assert type(system_random()) is random.SystemRandom
    assert isinstance(system_random(64), OneReadRandom)
    with pytest.raises(ValueError, match="non-negative"):
        OneReadRandom(8).getrandbits(-1)
