"""The send slot survives a killed holder; flush() waits for a pause and says why it stopped.

Real processes, real gRPC, the real collector. A child process holding the send
slot (its Submit call stalled in a proxy, so it is mid-send for sure) is killed
with SIGKILL; the restarted app on the same state folder must deliver within
one flush, not after the killed call's lease. The fallback for platforms
without ``flock`` (the stored claim) is the variant beside it: there the
restarted app is held back and its flush says so (SENDER_BUSY).

No test asserts speed: delivery is bounded by the flush's own timeout, and the
pause test counts flush() calls, which a slow machine can only make fewer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client import send_slot
from fedldp.client.transport import Backoff
from sdk_testkit import LABELS, Deployment, FaultProxy, running_deployment

SENDER_CHILD = Path(__file__).with_name("sdk_sender_child.py")
#: The killed child's call deadline: its stored claim (fallback) would last this + 5 s.
CHILD_TIMEOUT_S = 120.0
#: The restarted app's flush timeout: far below the lapse of a killed child's claim.
FLUSH_S = 10.0

pytestmark = pytest.mark.skipif(not send_slot.available(), reason="flock not available")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


@contextlib.contextmanager
def _killed_mid_send(
    deployment: Deployment, tmp_path: Path, gate: str
) -> Iterator[tuple[Path, str]]:
    """Record 3 reports; a child flushes them into a stalled call and is killed (SIGKILL).

    Yields the state folder and the address of the proxy the child sent
    through (its first Submit call stalls, later ones pass; the gate is per
    collector address), which stays up meanwhile. `gate` is
    the child's sdk_sender_child.py mode ("stored": the OS lock; "lease": the
    stored claim).
    """
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start()
    state = tmp_path / "d"
    with deployment.client(collector.address, state) as c:
        for i in range(3):
            c.record("browser.homepage", LABELS[i])
    proxy = FaultProxy(collector.address, stall_first=1)
    args = [proxy.address, str(state), str(deployment.trust_dir()), deployment.token(), gate]
    child = subprocess.Popen(
        [sys.executable, str(SENDER_CHILD), *args, str(CHILD_TIMEOUT_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "READY\n"
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert proxy.stalled.wait(60), "the child's Submit call never arrived"
        os.kill(child.pid, signal.SIGKILL)  # mid-send: its call is in flight
        assert child.wait(timeout=60) == -signal.SIGKILL
        yield state, proxy.address
    finally:
        if child.poll() is None:
            child.kill()
        proxy.close()


def test_a_holder_killed_mid_send_frees_the_slot_at_once(
    deployment: Deployment, tmp_path: Path
) -> None:
    with (
        _killed_mid_send(deployment, tmp_path, "stored") as (state, target),
        deployment.client(target, state, fetch_policies=False) as c,
    ):
        assert c.pending() == 3
        result = c.flush(timeout=FLUSH_S)
    assert (result.acknowledged, result.pending, result.stopped) == (3, 0, "DONE")
    assert result.failed_attempts == 0 and result.last_error is None


def test_fallback_claim_of_a_killed_holder_blocks_and_flush_says_so(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The variant without flock: the killed child's stored claim holds the slot."""
    monkeypatch.setattr(send_slot, "available", lambda: False)
    with (
        _killed_mid_send(deployment, tmp_path, "lease") as (state, target),
        deployment.client(target, state, fetch_policies=False) as c,
    ):
        result = c.flush(timeout=0.3)  # the claim lasts CHILD_TIMEOUT_S + 5 s
    assert (result.acknowledged, result.pending, result.stopped) == (0, 3, "SENDER_BUSY")


def test_flush_waits_for_a_pause_and_says_until_when(
    deployment: Deployment, tmp_path: Path
) -> None:
    """`while c.pending(): c.flush(timeout=t)` makes about pause / t calls, not thousands."""
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start()
    proxy = FaultProxy(collector.address, fail_first=1, retry_after_ms=600)
    try:
        with deployment.client(
            proxy.address, tmp_path / "d", backoff=Backoff(base_seconds=0.01, max_seconds=0.05)
        ) as c:
            c.record("browser.homepage", LABELS[0])
            started = time.time()
            first = c.flush(timeout=0.12)
            calls, results = 1, [first]
            while c.pending() and calls < 200:
                results.append(c.flush(timeout=0.12))
                calls += 1
    finally:
        proxy.close()
    assert first.failed_attempts == 1 and first.last_error is not None
    assert first.stopped == "PAUSED" and first.paused_until is not None
    assert started + 0.6 <= first.paused_until <= time.time() + 0.6
    assert results[-1].stopped == "DONE" and results[-1].acknowledged == 1
    # 0.6 s of pause in flushes of 0.12 s: at most 6 of them (each waits its timeout
    # or until the pause ends) and the delivering one; a flush that returned at once
    # would have made 200.
    assert calls <= 8, [r.stopped for r in results]
    assert all(r.stopped == "PAUSED" for r in results[:-1])


def test_flush_waits_for_another_senders_call_and_says_so(
    deployment: Deployment, tmp_path: Path
) -> None:
    """Another descriptor holds the lock (another process mid-call): wait, then SENDER_BUSY."""
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start()
    state = tmp_path / "d"
    with deployment.client(collector.address, state) as c:
        c.record("browser.homepage", LABELS[0])
        other = send_slot.SendSlot(state)
        assert other.try_acquire()
        started = time.monotonic()
        busy = c.flush(timeout=0.3)
        waited = time.monotonic() - started
        other.close()  # the other sender is done (or died)
        done = c.flush(timeout=FLUSH_S)
    assert (busy.stopped, busy.acknowledged, busy.pending) == ("SENDER_BUSY", 0, 1)
    assert waited >= 0.3  # it waited out its timeout instead of returning at once
    assert (done.stopped, done.acknowledged) == ("DONE", 1)
