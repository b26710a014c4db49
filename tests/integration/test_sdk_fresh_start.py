"""A fresh install's start commits nothing; its configured trust is saved by the first refresh.

Real collector, real gRPC, real state files (read back with sqlite3, read-only).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client.device_store import STATE_FILE_NAME
from sdk_testkit import LABELS, Deployment, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _trust_rows(state: Path) -> list[tuple[int]]:
    conn = sqlite3.connect(f"file:{state / STATE_FILE_NAME}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT root_version FROM trust").fetchall()
    finally:
        conn.close()


def test_fresh_start_writes_nothing_and_the_first_refresh_saves_the_trust(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical()
    collector = deployment.start()
    state = tmp_path / "d"
    with deployment.client(collector.address, state, fetch_policies=False) as c:
        assert c._store._conn.total_changes == 0  # the start committed nothing
        assert _trust_rows(state) == []
        c.refresh_policies()
        assert _trust_rows(state) == [(1,)]
        c.record("browser.homepage", LABELS[0])
    # Offline restart: the stored trust is used, the cached policy still verifies.
    with deployment.client("127.0.0.1:1", state, fetch_policies=False) as c:
        assert c._store._conn.total_changes == 0
        assert [p.policy_id for p in c.policies()] == ["homepage"]
        assert c.pending() == 1


def test_offline_fresh_start_records_nothing_and_keeps_no_trust(
    deployment: Deployment, tmp_path: Path
) -> None:
    """No refresh ever succeeded: nothing is stored, and the next start is the same."""
    state = tmp_path / "d"
    for _ in range(2):
        with deployment.client("127.0.0.1:1", state, timeout_seconds=1.0) as c:
            assert c.policies() == []
        assert _trust_rows(state) == []
