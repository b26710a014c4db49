"""Report ids: 16 bytes, distinct, adjacent within a run, fresh CSPRNG runs."""

from __future__ import annotations

import itertools
import secrets
import threading

import pytest
from fedldp.client.report_ids import RUN_LENGTH, ReportIds
from fedldp.client.wire import REPORT_ID_BYTES


def test_ids_are_16_bytes_and_distinct() -> None:
    ids = ReportIds()
    drawn = [ids.next() for _ in range(10 * RUN_LENGTH + 7)]
    assert all(len(rid) == REPORT_ID_BYTES for rid in drawn)
    assert len(set(drawn)) == len(drawn)


def test_a_run_shares_its_prefix_and_counts_up() -> None:
    ids = ReportIds()
    run = [ids.next() for _ in range(RUN_LENGTH)]
    assert len({rid[:8] for rid in run}) == 1
    counters = [int.from_bytes(rid[8:], "big") for rid in run]
    assert all((b - a) % (1 << 64) == 1 for a, b in itertools.pairwise(counters))
    # The next id begins a new run: a new prefix (equal with probability 2^-64).
    assert ids.next()[:8] != run[0][:8]


def test_runs_are_independent_between_sources() -> None:
    # Two devices (or two processes of one device): different prefixes and starts,
    # equal with probability 2^-64 each.
    a, b = ReportIds().next(), ReportIds().next()
    assert a[:8] != b[:8]
    assert a[8:] != b[8:]


def test_prefix_and_start_come_from_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "token_bytes", lambda n: b"\xab" * n)
    monkeypatch.setattr(secrets, "randbits", lambda k: (1 << k) - 1)  # wraps at 2^64
    ids = ReportIds(run_length=3)
    assert [ids.next() for _ in range(3)] == [
        b"\xab" * 8 + b"\xff" * 8,
        b"\xab" * 8 + b"\x00" * 8,
        b"\xab" * 8 + b"\x00" * 7 + b"\x01",
    ]


def test_thread_safe() -> None:
    ids = ReportIds(run_length=5)
    out: list[bytes] = []
    lock = threading.Lock()

    def draw() -> None:
        mine = [ids.next() for _ in range(500)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 2000


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_run_length_must_be_a_positive_integer(bad: object) -> None:
    with pytest.raises(ValueError, match="run_length"):
        ReportIds(run_length=bad)  # type: ignore[arg-type]
