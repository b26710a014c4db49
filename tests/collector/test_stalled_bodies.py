"""One enrolled device that sends headers and withholds its bodies cannot block
everyone (issue 34, item 1).

The attack: one valid token, 40 Submit calls over 4 connections that send their
metadata and then nothing, each reopened as soon as it ends. Before the fix, 32
such calls filled a process's 32 MiB byte budget and every honest Submit was
refused. Now a subject holds at most `max_subject_inflight_bytes` (4 MiB) per
process, and an admitted call whose body does not come within `body_timeout_ms`
gives its reservation back and is refused RESOURCE_EXHAUSTED with
`retry-after-ms`. Checked on both servers in-process and on `fedldp collector
serve` with the default process count (the cores), with the default limits:
honest devices, each on its own connection, get at least 95 % of the OK answers
they get without the attack, for the same number of calls. (The throughput
figure itself is bench.collector_memory's `stalled` case.)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from collector_testkit import (
    CollectorProcess,
    Deployment,
    coarse,
    make_report,
    spawn,
    write_config,
)
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.config import CollectorConfig, default_processes
from fedldp.collector.server import RunningCollector, next_within, start_collector
from fedldp.v1 import collector_pb2 as pb
from stalled_bodies import StalledBodies, honest_devices

MiB = 1024 * 1024
HONEST_DEVICES = 16
CALLS_EACH = 20


def _valid(deployment: Deployment, now: int) -> Callable[[], bytes]:
    """A maker of one-report Submit requests under the deployment's first policy."""
    policy = deployment.verified(deployment.envelopes[0])

    def make() -> bytes:
        report = make_report(policy, CategoryOutput(1), coarse_time=coarse(now))
        return pb.SubmitRequest(reports=[report]).SerializeToString()

    return make


def _hint_ms(error: Any) -> int:
    """The `retry-after-ms` trailer of a refused call (0 without one)."""
    trailers: Any = error.trailing_metadata() or ()
    return next((int(value) for key, value in trailers if key == "retry-after-ms"), 0)


def _share_held(
    deployment: Deployment, sqlite_url: str, server: str
) -> tuple[RunningCollector, tuple[tuple[str, str], ...], StalledBodies]:
    """A collector on `server` (body deadline 60 s) whose subject "staller" holds its
    share with 4 withheld bodies (waited for, up to 30 s): the collector, the
    staller's metadata and the attack (the caller stops both; on a failure here
    they are stopped)."""
    config = deployment.config(
        sqlite_url.replace("ledger.db", f"{server}.db"), server=server, body_timeout_ms=60_000
    )
    running = start_collector(config, registry=deployment.registry())
    staller = bearer_metadata(deployment.token("staller"))
    attack = StalledBodies(running.address, staller, calls=4).start()
    try:
        admission = running.admission
        assert admission is not None
        deadline = time.monotonic() + 30
        while admission.bytes < admission.max_subject_bytes:
            assert time.monotonic() < deadline, attack.tally
            time.sleep(0.02)
    except BaseException:
        attack.stop()
        running.stop(1.0)
        raise
    return running, staller, attack


def _stop(proc: CollectorProcess) -> int:
    """SIGTERM a collector process; its exit status."""
    proc.proc.send_signal(signal.SIGTERM)
    return proc.proc.wait(timeout=60)


def _compare(address: str, deployment: Deployment, now: int, held: Callable[[], bool]) -> None:
    """Honest devices without, then with, the attack on `address`: the same calls,
    at least 95 % of the OK answers; the attack's calls ended with a hint.
    `held()` says the attack holds what it can (waited for before measuring)."""
    make = _valid(deployment, now)
    tokens = [bearer_metadata(deployment.token(f"honest-{i}")) for i in range(HONEST_DEVICES)]
    unloaded = honest_devices(address, tokens, make, calls=CALLS_EACH)
    attack = StalledBodies(address, bearer_metadata(deployment.token("staller"))).start()
    try:
        deadline = time.monotonic() + 30
        while not held() and time.monotonic() < deadline:
            time.sleep(0.05)
        attacked = honest_devices(address, tokens, make, calls=CALLS_EACH)
        # The asyncio server answers a share refusal only after its hint, so the
        # attacker's first reopen may come after the honest phase: wait for it.
        deadline = time.monotonic() + 30
        while attack.opened <= attack.calls and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        attack.stop()
    assert unloaded.tally.ok == HONEST_DEVICES * CALLS_EACH, unloaded.tally
    assert attacked.tally.ok >= 0.95 * unloaded.tally.ok, (attacked.tally, attack.tally)
    assert attacked.tally.without_hint == 0
    assert attack.opened > attack.calls  # refused calls were reopened: it kept attacking
    assert attack.tally.without_hint == 0, attack.tally
    assert attack.tally.with_hint == attack.tally.codes.get("RESOURCE_EXHAUSTED", 0) > 0


def test_withheld_bodies_from_one_token_leave_honest_devices_served(
    deployment: Deployment, collector: RunningCollector, now: int
) -> None:
    admission = collector.admission
    assert admission is not None
    share = admission.max_subject_bytes
    assert share == 4 * MiB and admission.max_bytes == 32 * MiB  # the defaults

    def held() -> bool:
        return admission.bytes >= share

    _compare(collector.address, deployment, now, held)
    assert admission.bytes <= share  # the attack never held more than its share


def test_the_default_process_count_withstands_withheld_bodies(
    deployment: Deployment, tmp_path: Path, now: int
) -> None:
    """`fedldp collector serve` with `processes` unset (the cores) and default limits."""
    config = write_config(
        deployment,
        tmp_path,
        f"sqlite:///{tmp_path / 'ledger.db'}",
        "default",
        processes=None,
        log_level="INFO",
    )
    assert "processes" not in config.read_text(encoding="utf-8")
    proc = spawn(config, "default")
    try:
        started = time.monotonic()
        _compare(proc.address, deployment, now, lambda: time.monotonic() - started > 1.0)
    finally:
        assert _stop(proc) == 0
    log = proc.log.read_text(encoding="utf-8")
    if default_processes() > 1:
        assert "collector processes serving" in log


def test_a_withheld_body_is_refused_with_a_hint_at_the_body_deadline(
    deployment: Deployment, sqlite_url: str, now: int
) -> None:
    """body_timeout_ms = 150: each stalled call ends RESOURCE_EXHAUSTED with the hint,
    counted as `body deadline`, its reservation given back; calls past the
    subject's share are refused at once (`subject bytes`), never admitted."""
    for server in ("asyncio", "sync"):
        config = deployment.config(
            sqlite_url.replace("ledger.db", f"{server}.db"), server=server, body_timeout_ms=150
        )
        running = start_collector(config, registry=deployment.registry())
        try:
            attack = StalledBodies(
                running.address, bearer_metadata(deployment.token("staller")), calls=6
            ).start()
            registry = running.metrics.registry

            def shed(limit: str, registry: Any = registry) -> float:
                value = registry.get_sample_value("fedldp_collector_shed_total", {"limit": limit})
                return value or 0.0

            deadline = time.monotonic() + 30
            while shed("body deadline") < 8:  # two rounds of the 4 calls of its share
                assert time.monotonic() < deadline, attack.tally
                time.sleep(0.05)
            attack.stop()
            timed_out, at_share = shed("body deadline"), shed("subject bytes")
            assert timed_out and timed_out >= 4, server
            assert at_share and at_share >= 2, server  # 6 calls, room for 4
            assert attack.tally.without_hint == 0, attack.tally
            assert set(attack.tally.codes) == {"RESOURCE_EXHAUSTED"}, attack.tally
            assert running.admission is not None
            deadline = time.monotonic() + 10
            while running.admission.bytes or running.admission.rpcs:  # the last calls end
                assert time.monotonic() < deadline, (running.admission.bytes, server)
                time.sleep(0.05)
            # And the collector still serves.
            request = _valid(deployment, now)()
            with grpc.insecure_channel(running.address) as channel:
                call = channel.unary_unary("/fedldp.v1.Collector/Submit", None, None)
                reply = pb.SubmitResponse.FromString(
                    call(request, metadata=bearer_metadata(deployment.token("after")), timeout=10)
                )
            assert [o.outcome for o in reply.outcomes] == [pb.OUTCOME_ACCEPTED]
        finally:
            running.stop(1.0)


def test_the_sync_servers_timed_read_uses_grpcios_request_iterator() -> None:
    """next_within reads grpcio's own request iterator with a deadline: if grpcio
    renames what it uses, the sync server would lose its body deadline, so fail."""
    from grpc import _server

    for part in ("_raise_or_start_receive_message", "_look_for_request"):
        assert hasattr(_server._RequestIterator, part), part
    assert "_state" in _server._RequestIterator.__annotations__  # set per call in __init__
    assert next_within(iter([b"x"]), 1.0) == b"x"  # any other iterator: plain next
    assert next_within(iter([]), 1.0) is None


def test_subject_share_settings_are_checked() -> None:
    from fedldp.collector.config import ConfigError

    assert CollectorConfig().subject_inflight_bytes() == 4 * MiB  # an eighth of 32 MiB
    small = CollectorConfig(max_inflight_bytes=MiB, max_connection_inflight_bytes=MiB)
    assert small.subject_inflight_bytes() == MiB  # at least one largest message

    with pytest.raises(ConfigError, match="max_subject_inflight_bytes"):
        CollectorConfig(ledger_url="sqlite:////x.db", max_subject_inflight_bytes=1024).validate()
    with pytest.raises(ConfigError, match="body_timeout_ms"):
        CollectorConfig(ledger_url="sqlite:////x.db", body_timeout_ms=0).validate()


def test_admission_caps_what_one_subject_holds() -> None:
    """A subject at its share is refused at once (no wait), on both flavours; other
    subjects still get room; what it gives back is its own again."""
    import asyncio

    from fedldp.collector.admission import Admission

    adm = Admission(max_rpcs=8, max_bytes=100, max_connection_bytes=100, max_subject_bytes=30)
    assert adm.reserve("a", 30, timeout=0, subject="s")
    # Another connection, the same share: refused at once (waiting for the hour
    # would run into the test's timeout).
    assert not adm.reserve("b", 1, timeout=3600, subject="s")
    assert adm.only_subject_full("s", 1) and not adm.only_subject_full("t", 1)
    assert adm.reserve("a", 30, timeout=0, subject="t")

    async def flavour() -> None:
        assert not await adm.reserve_async("c", 1, timeout=3600, subject="s")
        assert await adm.reserve_async("c", 30, timeout=0, subject="u")
        adm.release("c", 30, subject="u")

    asyncio.run(flavour())
    adm.release("a", 30, subject="s")
    assert adm.held_by("s") == 0 and adm.held_by("t") == 30
    assert adm.reserve("b", 30, timeout=0, subject="s")
    adm.release("b", 30, subject="s")
    adm.release("a", 30, subject="t")
    assert adm.bytes == 0


@pytest.mark.parametrize("server", ["asyncio", "sync"])
def test_a_subject_refused_again_and_again_is_told_to_wait_longer(
    deployment: Deployment, sqlite_url: str, now: int, server: str, monkeypatch: Any
) -> None:
    """With its share held by withheld bodies, each further call of the subject is
    refused with a hint that doubles per refusal of its streak (`RefusalHints`;
    the base scaled down to 10 ms here, as both servers answer after the hint).
    Without the growth every hint would stay in [5, 15) ms; the sixth refusal's is
    at least 5 * 2^5 ms."""
    from fedldp.collector import admission as adm

    monkeypatch.setattr(adm, "RETRY_AFTER_MS", 10)
    monkeypatch.setattr(adm, "MAX_RETRY_AFTER_MS", 5_000)
    running, staller, attack = _share_held(deployment, sqlite_url, server)
    try:
        request = _valid(deployment, now)()
        hints: list[int] = []
        waited: list[float] = []
        with grpc.insecure_channel(running.address) as channel:
            call = channel.unary_unary("/fedldp.v1.Collector/Submit", None, None)
            for _ in range(6):
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, metadata=staller, timeout=30)
                waited.append(time.monotonic() - started)
                assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                hints.append(_hint_ms(refused.value))
    finally:
        attack.stop()
        running.stop(1.0)
    assert hints[0] < 15, hints  # the first refusal: the base hint
    assert hints[5] >= 5 * 2**5, hints  # doubled per refusal of the streak
    assert all(h <= 5_000 for h in hints), hints
    # Both servers answer after the (grown) hint: the sync server on one of the
    # threads it has beyond `workers` for this (TARPIT_MAX_CALLS).
    assert waited[5] >= 0.9 * hints[5] / 1000, (waited, hints)


def test_a_draining_sync_server_answers_held_refusals_at_once(
    deployment: Deployment, sqlite_url: str, now: int, monkeypatch: Any
) -> None:
    """A share refusal held for its 10-30 s hint (at most 5 s here) on the sync
    server's thread does not hold up `stop`: draining wakes it (else the process
    would wait for it at exit)."""
    import threading

    from fedldp.collector import admission as adm
    from fedldp.collector import server as srv

    monkeypatch.setattr(adm, "RETRY_AFTER_MS", 20_000)
    monkeypatch.setattr(srv, "TARPIT_MAX_SECONDS", 5.0)
    running, staller, attack = _share_held(deployment, sqlite_url, "sync")
    servicer = running.transport.servicer  # type: ignore[union-attr]
    ended: list[float] = []
    try:
        request = _valid(deployment, now)()

        def refused_call() -> None:
            with grpc.insecure_channel(running.address) as channel:
                call = channel.unary_unary("/fedldp.v1.Collector/Submit", None, None)
                with pytest.raises(grpc.RpcError):
                    call(request, metadata=staller, timeout=60)
            ended.append(time.monotonic())

        caller = threading.Thread(target=refused_call)
        caller.start()
        deadline = time.monotonic() + 30
        while not servicer.held_refusals:  # the server holds the refusal for its hint
            assert time.monotonic() < deadline and not ended, ended
            time.sleep(0.02)
        assert not ended  # held, not answered
        started = time.monotonic()
    finally:
        attack.stop()
        running.stop(0.5)
    stopped = time.monotonic() - started
    caller.join(30)
    assert stopped < 5, stopped
    assert ended and ended[0] - started < 5
    # The held thread itself has finished (its hold, TARPIT_MAX_SECONDS = 5 s
    # here, would end ~4 s after `started`): nothing waits for it at exit.
    while servicer.held_refusals and time.monotonic() - started < 2:
        time.sleep(0.02)
    assert servicer.held_refusals == 0


def test_refusal_hints_grow_per_subject_and_are_forgotten() -> None:
    """The streak is per subject, capped, forgotten after `forget_after` quiet
    seconds, and at most `max_subjects` streaks are kept."""
    from fedldp.collector.admission import RefusalHints

    clock = [0.0]
    hints = RefusalHints(
        base_ms=100, max_ms=1_000, forget_after=10, max_subjects=2, clock=lambda: clock[0]
    )
    grown = [hints.refused("a") for _ in range(8)]
    assert 50 <= grown[0] < 150  # base, jittered by [0.5, 1.5)
    assert grown[3] >= 400 and all(h <= 1_000 for h in grown)  # 100 * 2^3 jittered; capped
    assert hints.streak("a") == 8
    assert hints.refused("b") < 150  # another subject starts at the base
    clock[0] = 10.5  # quiet for longer than forget_after
    assert hints.streak("a") == 0 and hints.refused("a") < 150
    few = RefusalHints(max_subjects=2, clock=lambda: clock[0])
    for subject in ("x", "y", "x", "z"):  # a third subject: the least recently refused goes
        few.refused(subject)
    assert (few.streak("x"), few.streak("y"), few.streak("z")) == (2, 0, 1)


@pytest.mark.parametrize("server", ["asyncio", "sync"])
def test_a_held_refusal_ends_before_the_calls_deadline_and_the_hold_limit(
    deployment: Deployment, sqlite_url: str, now: int, server: str, monkeypatch: Any
) -> None:
    """A share refusal with a 10-30 s hint is held at most `TARPIT_MAX_SECONDS`
    (0.5 s here) and half the time left to the call's own deadline: the device
    gets RESOURCE_EXHAUSTED with the whole hint, not DEADLINE_EXCEEDED."""
    from fedldp.collector import admission as adm
    from fedldp.collector import server as srv

    monkeypatch.setattr(adm, "RETRY_AFTER_MS", 20_000)
    running, staller, attack = _share_held(deployment, sqlite_url, server)
    answers: list[tuple[grpc.StatusCode, int, float]] = []
    try:
        request = _valid(deployment, now)()
        with grpc.insecure_channel(running.address) as channel:
            call = channel.unary_unary("/fedldp.v1.Collector/Submit", None, None)
            for timeout, hold in ((30.0, 0.5), (1.5, 30.0)):  # the hold limit, the deadline
                monkeypatch.setattr(srv, "TARPIT_MAX_SECONDS", hold)
                started = time.monotonic()
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, metadata=staller, timeout=timeout)
                hint = _hint_ms(refused.value)
                answers.append((refused.value.code(), hint, time.monotonic() - started))
    finally:
        attack.stop()
        running.stop(1.0)
    for code, hint, took in answers:
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, answers
        assert hint >= 10_000 and took < 1.5, answers
