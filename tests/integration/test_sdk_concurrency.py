"""Thread safety, the background sender, and the asyncio client, against a real collector."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.aio import AsyncClient
from fedldp.client.sdk import ClientClosedError, OutboxFullError
from fedldp.client.transport import Backoff, Credentials
from sdk_testkit import LABELS, Deployment, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_records_from_threads_while_background_sender_runs(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical(epsilon="0.01", epsilon_cap="10")
    collector = deployment.start()
    with deployment.client(
        collector.address, tmp_path / "d", background=True, send_interval_seconds=0.05, batch_size=7
    ) as c:

        def worker(i: int) -> None:
            for j in range(25):
                c.record("browser.homepage", LABELS[(i + j) % 4])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 20
        while c.pending() and time.monotonic() < deadline:
            c.wake()
            time.sleep(0.05)
        assert c.pending() == 0
        assert c.counters()["acknowledged"] == 100
        assert c.budget()[0].epsilon_spent == Decimal("1.00")
    assert len(ledger_rows(collector)) == 100
    with pytest.raises(ClientClosedError):
        c.record("browser.homepage", LABELS[0])


def test_outbox_full_refuses_with_counter_and_event(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="0.1", epsilon_cap="10")
    collector = deployment.start()
    seen: list[str] = []
    with deployment.client(
        collector.address, tmp_path / "d", max_outbox=2, on_event=lambda e: seen.append(e.reason)
    ) as c:
        c.record("browser.homepage", LABELS[0])
        c.record("browser.homepage", LABELS[1])
        with pytest.raises(OutboxFullError):
            c.record("browser.homepage", LABELS[2])
        assert c.counters()["dropped_outbox_full"] == 1
        assert c.budget()[0].epsilon_spent == Decimal("0.2")  # the refused value cost nothing
        assert seen == ["OUTBOX_FULL"]
        c.flush(timeout=10)
        c.record("browser.homepage", LABELS[2])  # room again after the flush


def test_async_client(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()

    async def main() -> tuple[int, int]:
        async with AsyncClient(
            collector.address,
            trust_root=deployment.trust_root(),
            state_dir=tmp_path / "d",
            credentials=Credentials.insecure_bearer(deployment.token()),
            backoff=Backoff(base_seconds=0.01, max_seconds=0.05),
        ) as client:
            await asyncio.gather(
                *(client.record("browser.homepage", label) for label in LABELS[:3])
            )
            pending = await client.pending()
            result = await client.flush(timeout=10)
            return pending, result.acknowledged

    assert asyncio.run(main()) == (3, 3)
    assert len(ledger_rows(collector)) == 3
