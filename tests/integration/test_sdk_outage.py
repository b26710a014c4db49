"""The SDK under rate limits and outages, over real gRPC against the real collector.

One backoff per device and collector (`fedldp.client.outbox.SendGate`): a refusal
with a retry hint, or a call that got no answer, pauses every send; then one
batch goes as a probe and the rest follow once it succeeded. `wake()` and
`flush(retry_now=True)` retry at once. Each guarantee has a deliberately broken
variant beside it (the gate that does not pause, a wake() that only signals) to
show the test can tell.

Timing: no test asserts how fast something is. Bounds are generous (seconds
where milliseconds are expected), waits are on condition variables
(`SubmitWatch.wait_for`), and the one random quantity (backoff jitter, OS
CSPRNG) is bounded with a false-failure probability below 1e-6, computed in the
test that uses it.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client.aio import AsyncClient
from fedldp.client.outbox import SendGate
from fedldp.client.sdk import Client
from fedldp.client.transport import Backoff, Credentials
from sdk_testkit import (
    LABELS,
    Deployment,
    FaultProxy,
    NoJitter,
    SubmitWatch,
    ledger_rows,
    running_deployment,
)

#: A generous bound on "delivered after wake()" (loopback delivery takes milliseconds).
DELIVERY_BOUND_S = 10.0
#: How long the broken wake() test watches for a delivery that only the end of the
#: 120 s `LONG` pause could bring (a wake() that ends it delivers in milliseconds).
BROKEN_WAKE_WATCH_S = 2.0
#: How long a flush() waits where the device is paused far longer (`LONG`, or a
#: 60 s retry hint): any call it makes comes at once, not after a wait.
PAUSED_FLUSH_S = 0.3
#: The collector's rate limit in the hint-window tests (burst 1): its retry hints
#: last up to 1/RATE s = 200 ms, four times the broken gate's 50 ms backoff ceiling.
RATE_PER_S = 5.0
#: How long the wake() tests wait: half the `LONG` pause, so a delivery within it can
#: only come from a wake() that ended the pause, however loaded the machine.
WAKE_BOUND_S = 60.0
#: The simulated outage in the attempt-counting tests.
OUTAGE_S = 3.0
#: Most Submit attempts the gate allows during `OUTAGE_S` with `JITTERED` (see the test).
MAX_ATTEMPTS_IN_OUTAGE = 20
JITTERED = Backoff(base_seconds=0.1, max_seconds=10.0)
#: Pauses far longer than any test: only wake()/retry_now can end them in time.
LONG = NoJitter(base_seconds=120.0, max_seconds=120.0)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _record(client: Client, n: int) -> None:
    for i in range(n):
        client.record("browser.homepage", LABELS[i % len(LABELS)])


def _never_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: a gate that records the failure but does not pause."""
    original = SendGate.failed

    def failed(self: SendGate, conn: object, *, now: float, retry_after: float | None) -> float:
        original(self, conn, now=now, retry_after=retry_after)  # type: ignore[arg-type]
        self.state.resume_at = now
        self.state.hint_until = now
        self._save(conn)  # type: ignore[arg-type]
        return 0.0

    monkeypatch.setattr(SendGate, "failed", failed)


# --- rate limits: one call per hint window ------------------------------------------------


def _rate_limited_run(deployment: Deployment, tmp_path: Path) -> tuple[FaultProxy, int]:
    """Six batches through a counting proxy to a collector allowing `RATE_PER_S` calls/s,
    burst 1."""
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start(rate_limit_per_second=RATE_PER_S, rate_limit_burst=1.0)
    proxy = FaultProxy(collector.address)
    try:
        with deployment.client(
            proxy.address,
            tmp_path / "d",
            batch_size=2,
            backoff=Backoff(base_seconds=0.01, max_seconds=0.05),
        ) as c:
            _record(c, 12)
            result = c.flush(timeout=60)
    finally:
        proxy.close()
    return proxy, result.acknowledged


def _calls_inside_hint_windows(proxy: FaultProxy) -> int:
    """Calls arriving while a retry hint the proxy passed on was still running.

    A window starts when the refusal left the proxy (before the device could
    read it) and lasts the hint; 5 ms is allowed for the device's wall clock
    against this process's monotonic one.
    """
    inside = 0
    for refused in proxy.calls:
        if refused.retry_after_ms is None:
            continue
        end = refused.answered + refused.retry_after_ms / 1000 - 0.005
        inside += sum(refused.answered < c.arrived < end for c in proxy.calls)
    return inside


def test_rate_limited_collector_gets_one_call_per_hint_window(
    deployment: Deployment, tmp_path: Path
) -> None:
    proxy, acknowledged = _rate_limited_run(deployment, tmp_path)
    assert acknowledged == 12
    refusals = [c for c in proxy.calls if c.code == "RESOURCE_EXHAUSTED"]
    assert refusals, "the collector's rate limit never refused: the test shows nothing"
    assert all(r.retry_after_ms is not None for r in refusals)
    # Nothing is sent while a hint runs; after it, one probe, and the calls are
    # strictly one after another (no batch overtakes the probe).
    assert _calls_inside_hint_windows(proxy) == 0
    ordered = sorted(proxy.calls, key=lambda c: c.arrived)
    assert all(a.answered <= b.arrived for a, b in itertools.pairwise(ordered))
    # Every refusal cost exactly one call: 6 batches + one per refusal.
    assert len(proxy.calls) == 6 + len(refusals)


def test_broken_gate_calls_inside_hint_windows(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant (no pause) is caught: calls land inside hint windows."""
    _never_pause(monkeypatch)
    proxy, _ = _rate_limited_run(deployment, tmp_path)
    assert _calls_inside_hint_windows(proxy) > 0


def test_probe_first_then_the_rest(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="0.1", epsilon_cap="10")
    collector = deployment.start()
    proxy = FaultProxy(collector.address, fail_first=2, retry_after_ms=50)
    try:
        with deployment.client(
            proxy.address, tmp_path / "d", batch_size=1, backoff=Backoff(0.01, 0.05)
        ) as c:
            _record(c, 4)
            result = c.flush(timeout=30)
            assert (result.acknowledged, result.failed_attempts, result.pending) == (4, 2, 0)
    finally:
        proxy.close()
    # One call per failure (the probe), never the four batches at once.
    assert proxy.outcomes == ["fail", "fail", "ok", "ok", "ok", "ok"]
    assert _calls_inside_hint_windows(proxy) == 0


# --- outages: attempts bounded, delivery right after wake() --------------------------------


def _outage_attempts(deployment: Deployment, tmp_path: Path) -> tuple[int, int, float, Client]:
    """10 batches queued during a `OUTAGE_S` outage; then the collector is back and woken.

    Returns the failed Submit attempts during the outage, those after the
    wake(), the seconds from wake() to the last delivery (inf if not within
    `DELIVERY_BOUND_S`), and the (closed) client.
    """
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start()
    with deployment.client(
        collector.address,
        tmp_path / "d",
        background=True,
        send_interval_seconds=3600,
        batch_size=2,
        backoff=JITTERED,
        timeout_seconds=5,
    ) as c:
        watch = SubmitWatch(c)
        hold = deployment.outage(collector)
        _record(c, 20)
        c.wake()  # start sending now, into the outage
        time.sleep(OUTAGE_S)  # the outage itself (not a wait for a result)
        in_outage = watch.failures()
        deployment.restart(hold)  # same port, same ledger file
        back = time.monotonic()
        c.wake()  # the app's connectivity hook
        delivered = watch.wait_for(lambda: watch.delivered() >= 20, DELIVERY_BOUND_S)
        took = time.monotonic() - back if delivered else float("inf")
        after = watch.failures(since=back)
    return in_outage, after, took, c


def test_outage_attempts_bounded_and_wake_delivers(deployment: Deployment, tmp_path: Path) -> None:
    """Attempts during an outage do not multiply by the batches; wake() delivers at once.

    The bound: with one gate, k attempts in `OUTAGE_S` = 3 s need the first k-1
    pauses to sum below 3 s. Pause i is uniform(0, min(10, 0.1·2^(i-1))), so
    pauses 7..20 (ranges 6.4, then 10 s) must each be under 3 s:
    P(more than 20 attempts) <= (3/6.4)·(3/10)^13 < 1e-7. (Before the gate, each
    of the 10 batches kept its own backoff: 46-52 attempts in 5 s.)
    """
    in_outage, after, took, _ = _outage_attempts(deployment, tmp_path)
    assert 1 <= in_outage <= MAX_ATTEMPTS_IN_OUTAGE
    assert took <= DELIVERY_BOUND_S
    # The collector was back before wake(): no fast failures from a channel still
    # waiting out gRPC's own reconnect backoff.
    assert after == 0
    (collector,) = [c for c in deployment.collectors if not c._stopped.is_set()]
    assert len(ledger_rows(collector)) == 20


def test_broken_gate_multiplies_attempts(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant (a failure does not pause) exceeds the bound."""
    _never_pause(monkeypatch)
    in_outage, _, _, _ = _outage_attempts(deployment, tmp_path)
    assert in_outage > MAX_ATTEMPTS_IN_OUTAGE


def _wake_after_long_backoff(
    deployment: Deployment, tmp_path: Path, bound: float
) -> tuple[bool, int]:
    """A failure pauses the device for 120 s; the collector comes back; wake().

    Returns whether all 3 reports were delivered within `bound` seconds of the
    wake() (any bound well under the 120 s pause tells a wake() that ends it from
    one that does not), and the failed attempts (the pause allows no other).
    """
    deployment.categorical()
    collector = deployment.start()
    with deployment.client(
        collector.address, tmp_path / "d", send_interval_seconds=3600, backoff=LONG
    ) as c:
        watch = SubmitWatch(c)
        hold = deployment.outage(collector)
        _record(c, 3)
        # The sender thread starts only now, with the reports recorded and the
        # collector down: its first round sends them, fails once and pauses the
        # device for 120 s. (Started with the client, its first round raced
        # _record() and a wake(): under CPU load it could send before the wake(),
        # which then made a second failed attempt.)
        c.start_background()
        assert watch.wait_for(lambda: watch.failures() >= 1, WAKE_BOUND_S)
        deployment.restart(hold)
        c.wake()
        delivered = watch.wait_for(lambda: watch.delivered() >= 3, bound)
        return delivered, watch.failures()


def test_wake_ends_a_long_backoff(deployment: Deployment, tmp_path: Path) -> None:
    delivered, failures = _wake_after_long_backoff(deployment, tmp_path, WAKE_BOUND_S)
    assert delivered
    assert failures == 1


def test_broken_wake_that_only_signals_waits_out_the_backoff(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant (the old wake(): wake the thread, change nothing) is caught."""
    monkeypatch.setattr(Client, "wake", lambda self: self._signal.notify())
    delivered, _ = _wake_after_long_backoff(deployment, tmp_path, BROKEN_WAKE_WATCH_S)
    assert not delivered


def test_backoff_survives_restart_and_flush_retry_now(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical()
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", backoff=LONG) as c:
        hold = deployment.outage(collector)
        _record(c, 2)
        first = c.flush(timeout=PAUSED_FLUSH_S)
        assert (first.failed_attempts, first.pending) == (1, 2)
    deployment.restart(hold)
    # A restarted app honours the stored pause: no call at all.
    with deployment.client(
        collector.address, tmp_path / "d", backoff=LONG, fetch_policies=False
    ) as c:
        watch = SubmitWatch(c)
        assert c.flush(timeout=PAUSED_FLUSH_S).pending == 2
        assert watch.calls == []
        # retry_now: one probe, now, and everything is delivered.
        result = c.flush(timeout=DELIVERY_BOUND_S, retry_now=True)
        assert (result.acknowledged, result.failed_attempts, result.pending) == (2, 0, 0)
        assert len(watch.calls) == 1
        assert c.counters()["send_failures"] == 1


def test_wake_does_not_override_a_retry_hint(deployment: Deployment, tmp_path: Path) -> None:
    """The server's retry-after-ms is its word: wake() moves only the SDK's own backoff."""
    deployment.categorical()
    collector = deployment.start()
    proxy = FaultProxy(collector.address, fail_first=1, retry_after_ms=60_000)
    try:
        with deployment.client(
            proxy.address, tmp_path / "d", backoff=Backoff(0.01, 0.05), fetch_policies=True
        ) as c:
            _record(c, 1)
            assert c.flush(timeout=PAUSED_FLUSH_S).failed_attempts == 1
            c.wake()
            assert c.flush(timeout=PAUSED_FLUSH_S, retry_now=True).pending == 1
    finally:
        proxy.close()
    assert proxy.outcomes == ["fail"]


def test_async_client_wake_and_retry_now(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()

    async def scenario() -> tuple[int, int]:
        async with AsyncClient(
            collector.address,
            trust_root=deployment.trust_root(),
            state_dir=tmp_path / "d",
            credentials=Credentials.insecure_bearer(deployment.token()),
            backoff=LONG,
            timeout_seconds=5.0,
        ) as ac:
            hold = deployment.outage(collector)
            await ac.record("browser.homepage", LABELS[0])
            failed = (await ac.flush(timeout=PAUSED_FLUSH_S)).failed_attempts
            deployment.restart(hold)
            ac.wake()  # non-blocking: fine on the event loop
            return failed, (await ac.flush(timeout=DELIVERY_BOUND_S)).acknowledged

    assert asyncio.run(scenario()) == (1, 1)


# --- several processes on one state folder: one gate, one call in flight ------------------

SENDER_CHILD = Path(__file__).with_name("sdk_sender_child.py")
#: Processes sharing the state folder in the multi-process tests.
PROCESSES = 3
#: The collector's rate limit there (burst 1): hints of up to 100 ms, while the other
#: processes' calls come milliseconds apart (the broken variant's calls inside them).
SHARED_RATE_PER_S = 10.0


def _shared_folder_run(deployment: Deployment, tmp_path: Path, gate: str) -> tuple[FaultProxy, int]:
    """18 batches of 2, flushed at once by `PROCESSES` processes on one state folder.

    The collector allows `SHARED_RATE_PER_S` calls/s, burst 1, behind a counting proxy. The parent
    records (and fetches the policy once); the children flush. `gate` is passed
    to `sdk_sender_child.py` ("stored": as shipped; "local": the broken variant).
    """
    deployment.categorical(epsilon="0.01", epsilon_cap="100")
    collector = deployment.start(rate_limit_per_second=SHARED_RATE_PER_S, rate_limit_burst=1.0)
    state = tmp_path / "d"
    with deployment.client(collector.address, state) as c:
        _record(c, 36)
    proxy = FaultProxy(collector.address)
    args = [proxy.address, str(state), str(deployment.trust_dir()), deployment.token(), gate]
    children = [
        subprocess.Popen(
            [sys.executable, str(SENDER_CHILD), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline() == "READY\n"
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=120)[0] for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        proxy.close()
    assert all(child.returncode == 0 for child in children), outputs
    acknowledged = sum(int(out.split()[-1]) for out in outputs)
    return proxy, acknowledged


def test_processes_sharing_a_state_folder_obey_one_gate(
    deployment: Deployment, tmp_path: Path
) -> None:
    """No call inside any hint window across processes; one call in flight at a time."""
    proxy, acknowledged = _shared_folder_run(deployment, tmp_path, "stored")
    assert acknowledged == 36
    refusals = [c for c in proxy.calls if c.code == "RESOURCE_EXHAUSTED"]
    assert refusals, "the collector's rate limit never refused: the test shows nothing"
    assert _calls_inside_hint_windows(proxy) == 0
    ordered = sorted(proxy.calls, key=lambda c: c.arrived)
    assert all(a.answered <= b.arrived for a, b in itertools.pairwise(ordered))
    # Each refusal cost one call (one probe per pause, whichever process sent it),
    # and no batch went twice.
    assert len(proxy.calls) == 18 + len(refusals)


def test_broken_per_process_gate_calls_inside_hint_windows(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The broken variant (each process its own in-memory gate) is caught."""
    proxy, _ = _shared_folder_run(deployment, tmp_path, "local")
    assert _calls_inside_hint_windows(proxy) > 0
