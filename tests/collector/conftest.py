"""Fixtures for the collector tests: a deployment, both ledger stores, a running collector."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from collector_testkit import Deployment
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import Ledger, open_ledger
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2_grpc

STORES = ["sqlite", "postgresql"]


@pytest.fixture(params=STORES)
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """One contract suite, every store: a SQLite file, and a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    return str(request.getfixturevalue("postgresql_url"))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    """An open ledger on each store (shard "shard-a"), closed afterwards."""
    led = open_ledger(ledger_url, shard="shard-a")
    yield led
    led.close()


@pytest.fixture(scope="module")
def now() -> int:
    return int(time.time())


@pytest.fixture(scope="module")
def deployment(now: int) -> Deployment:
    d = Deployment.create(now=now)
    d.add_categorical(
        "color", labels=("red", "green", "blue", "other"), epsilon="0.5", epsilon_cap="2"
    )
    return d


@pytest.fixture
def small_policy(deployment: Deployment) -> VerifiedPolicy:
    """ε = 0.001, cap 1: a thousand reports fit."""
    return deployment.verified(
        deployment.add_categorical("small", epsilon="0.001", epsilon_cap="1")
    )


@pytest.fixture(params=["sync", "asyncio"])
def collector(
    request: pytest.FixtureRequest, deployment: Deployment, sqlite_url: str
) -> Iterator[RunningCollector]:
    """A running collector on a SQLite file, on each of grpcio's servers."""
    config = deployment.config(sqlite_url, server=request.param)
    running = start_collector(config, registry=deployment.registry())
    yield running
    running.stop(1.0)


@pytest.fixture
def stub(collector: RunningCollector) -> Iterator[collector_pb2_grpc.CollectorStub]:
    with grpc.insecure_channel(collector.address) as channel:
        yield collector_pb2_grpc.CollectorStub(channel)
