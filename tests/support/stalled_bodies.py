"""A device that sends headers and withholds its bodies, and honest devices beside it.

`StalledBodies` is the attack of issue 34: with one valid token, keep `calls`
Submit calls open over `connections` connections, each sending its call
metadata and then nothing (a stream-unary call whose request iterator never
yields); every call that ends (refused, or timed out by the collector's body
deadline) is opened again — at once, or with `honour_hint` after the
refusal's `retry-after-ms` (as the SDK would) — until `stop`. `honest_devices` runs `devices`
devices, each with its own token and connection, each sending `calls` small
valid Submits one after another, and counts their answers. Both use real gRPC
(grpc.aio) and only the wire contract; tests/collector/test_stalled_bodies.py
and bench/collector_memory.py share them.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

SUBMIT_METHOD = "/fedldp.v1.Collector/Submit"
_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]


@dataclass
class Tally:
    """Answers by status code name, overload refusals with and without a hint."""

    codes: dict[str, int] = field(default_factory=dict)
    with_hint: int = 0
    without_hint: int = 0

    def add(self, code: str, trailers: Any) -> None:
        """Count one answer (`trailers`: its trailing metadata, for the hint)."""
        self.codes[code] = self.codes.get(code, 0) + 1
        if code in ("RESOURCE_EXHAUSTED", "UNAVAILABLE"):
            if any(key == "retry-after-ms" for key, _ in trailers or ()):
                self.with_hint += 1
            else:
                self.without_hint += 1

    @property
    def ok(self) -> int:
        """Calls answered OK."""
        return self.codes.get("OK", 0)


def _hint_seconds(trailers: Any) -> float:
    """The `retry-after-ms` hint of a refusal's trailers, in seconds (0 without one)."""
    for key, value in trailers or ():
        if key == "retry-after-ms":
            try:
                return max(0.0, int(value) / 1000)
            except ValueError:
                return 0.0
    return 0.0


async def _withheld(release: asyncio.Event) -> AsyncIterator[bytes]:
    """A request stream that sends nothing until `release` is set, then ends."""
    await release.wait()
    nothing: tuple[bytes, ...] = ()
    for item in nothing:  # pragma: no cover - never yields
        yield item


class StalledBodies:
    """`calls` Submit calls kept open without a body, from one subject (`metadata`),
    on a thread of their own; `tally` counts how the collector ended them."""

    def __init__(
        self,
        address: str,
        metadata: Sequence[tuple[str, str]],
        *,
        calls: int = 40,
        connections: int = 4,
        honour_hint: bool = False,
    ) -> None:
        self.address = address
        self.metadata = tuple(metadata)
        self.calls = calls
        self.connections = connections
        self.honour_hint = honour_hint
        self.tally = Tally()
        self.opened = 0
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="stalled-bodies", daemon=True)

    def start(self) -> StalledBodies:
        """Start the attack; returns at once."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the attack (every open call is cancelled) and wait for its thread."""
        stop = self._stop
        if stop is not None:
            self._loop.call_soon_threadsafe(stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        """The thread: the attack's event loop until `stop`."""
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._attack())
        finally:
            self._loop.close()

    async def _attack(self) -> None:
        """Open `calls` stalled calls and reopen each one that ends, until stopped."""
        self._stop = asyncio.Event()
        channels = [
            grpc.aio.insecure_channel(self.address, options=_OPTIONS)
            for _ in range(max(1, self.connections))
        ]
        stop = self._stop

        async def one(i: int) -> None:
            call_fn = channels[i % len(channels)].stream_unary(SUBMIT_METHOD, None, None)
            while not stop.is_set():
                self.opened += 1
                call = call_fn(_withheld(stop), metadata=self.metadata, timeout=120)
                wait = 0.0
                try:
                    await call
                    self.tally.add("OK", ())
                except grpc.aio.AioRpcError as exc:
                    if not stop.is_set():
                        self.tally.add(exc.code().name, exc.trailing_metadata())
                        wait = _hint_seconds(exc.trailing_metadata()) if self.honour_hint else 0
                except asyncio.CancelledError:
                    return
                if wait > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)

        tasks = [asyncio.ensure_future(one(i)) for i in range(self.calls)]
        await stop.wait()
        for ch in channels:
            await ch.close(None)
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class HonestRun:
    """What honest devices saw: their answers and how long the run took."""

    tally: Tally
    seconds: float

    @property
    def calls_per_second(self) -> float:
        """OK answers per second of the run."""
        return self.tally.ok / self.seconds if self.seconds > 0 else 0.0


def honest_devices(
    address: str,
    tokens: Sequence[Sequence[tuple[str, str]]],
    make_request: Callable[[], bytes],
    *,
    calls: int,
    timeout: float = 30.0,
) -> HonestRun:
    """Each device (one per entry of `tokens`: its call metadata) on a connection of
    its own sends `calls` requests from `make_request`, one after another."""
    return asyncio.run(_honest(address, tokens, make_request, calls=calls, timeout=timeout))


async def _honest(
    address: str,
    tokens: Sequence[Sequence[tuple[str, str]]],
    make_request: Callable[[], bytes],
    *,
    calls: int,
    timeout: float,
) -> HonestRun:
    """`honest_devices` on this thread's event loop."""
    tally = Tally()
    channels = [grpc.aio.insecure_channel(address, options=_OPTIONS) for _ in tokens]

    async def device(channel: grpc.aio.Channel, metadata: Sequence[tuple[str, str]]) -> None:
        call_fn = channel.unary_unary(SUBMIT_METHOD, None, None)
        for _ in range(calls):
            try:
                await call_fn(make_request(), metadata=tuple(metadata), timeout=timeout)
                tally.add("OK", ())
            except grpc.aio.AioRpcError as exc:
                tally.add(exc.code().name, exc.trailing_metadata())

    started = time.monotonic()
    try:
        await asyncio.gather(*(device(ch, md) for ch, md in zip(channels, tokens, strict=True)))
    finally:
        for ch in channels:
            await ch.close(None)
    return HonestRun(tally, time.monotonic() - started)
