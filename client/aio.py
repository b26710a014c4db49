"""The SDK for asyncio applications: the same client, never blocking the event loop.

Design: `AsyncClient` wraps a thread-safe `fedldp.client.sdk.Client` and runs
each call in a worker thread (`asyncio.to_thread`). Nothing is duplicated: the
policies, the budget guard, the outbox and the retry rules are those of
`Client`, so the guarantees are the same (randomize once, persist before any
send, same bytes on retry). Why threads rather than ``grpc.aio``: `record()`
ends with an fsync of the SQLite WAL (synchronous=FULL), which is blocking disk
I/O whichever gRPC flavour is used, and one implementation of the send path is
easier to keep correct than two.

    async with AsyncClient(collector="collector.example:443", trust_root=...,
                           state_dir=..., credentials=token) as client:
        await client.record("browser.homepage", "news.example")
        await client.flush()
        client.wake()        # from a connectivity callback: retry now (never blocks)

Cancelling an awaiting task does not cancel the work already handed to the
thread: a `record()` that was started either completes (report stored) or
raises, never half-applies, because each is one SQLite transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from decimal import Decimal
from types import TracebackType
from typing import Any

from fedldp.client.device_store import Event
from fedldp.client.sdk import BudgetStatus, Client, FlushResult, PolicyRefresh, RecordResult


class AsyncClient:
    """`Client` for asyncio; takes the same arguments (see `fedldp.client.sdk.Client`).

    The constructor does no I/O; `await open()` (or ``async with``) builds the
    underlying client in a thread, fetching policies if the cache is stale.
    """

    def __init__(self, collector: str, **kwargs: Any) -> None:
        self._collector = collector
        self._kwargs = kwargs
        self._client: Client | None = None

    async def open(self) -> AsyncClient:
        """Create the underlying client (idempotent)."""
        if self._client is None:
            self._client = await asyncio.to_thread(Client, self._collector, **self._kwargs)
        return self

    @property
    def client(self) -> Client:
        """The underlying thread-safe client (for synchronous inspection)."""
        if self._client is None:
            raise RuntimeError("AsyncClient is not open: use 'async with' or await open()")
        return self._client

    async def __aenter__(self) -> AsyncClient:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def record(
        self,
        metric: str,
        value: str | int | float | Decimal | Mapping[str, str | int | float | Decimal],
        *,
        policy_id: str | None = None,
    ) -> RecordResult:
        """`Client.record` in a worker thread."""
        return await asyncio.to_thread(self.client.record, metric, value, policy_id=policy_id)

    async def flush(self, timeout: float | None = 30.0, *, retry_now: bool = False) -> FlushResult:
        """`Client.flush` in a worker thread (same backoff gate, same `retry_now`)."""
        return await asyncio.to_thread(self.client.flush, timeout, retry_now=retry_now)

    def wake(self) -> None:
        """`Client.wake`: retry now. Non-blocking, so it is called without await."""
        self.client.wake()

    async def refresh_policies(self) -> PolicyRefresh:
        """`Client.refresh_policies` in a worker thread."""
        return await asyncio.to_thread(self.client.refresh_policies)

    async def budget(self) -> list[BudgetStatus]:
        """`Client.budget` in a worker thread."""
        return await asyncio.to_thread(self.client.budget)

    async def pending(self) -> int:
        """`Client.pending` in a worker thread."""
        return await asyncio.to_thread(self.client.pending)

    async def events(self, limit: int = 100) -> list[Event]:
        """`Client.events` in a worker thread."""
        return await asyncio.to_thread(self.client.events, limit)

    async def close(self) -> None:
        """Close the underlying client (idempotent)."""
        if self._client is not None:
            await asyncio.to_thread(self._client.close)


__all__ = ["AsyncClient"]
