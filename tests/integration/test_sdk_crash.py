"""Crash safety: SIGKILL between randomize and send, or mid-send; sent once, randomized once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import DeviceStore
from fedldp.client.outbox import Outbox
from fedldp.v1 import collector_pb2
from sdk_testkit import CHILD, Deployment, Relay, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _start(phase: str, target: str, state: Path, trust: Path, token: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), phase, target, str(state), str(trust), token],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _persisted_id(child: subprocess.Popen[str]) -> bytes:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("PERSISTED "):
        child.kill()
        raise AssertionError(f"child said {line!r}; stderr: {child.stderr.read()}")  # type: ignore[union-attr]
    return bytes.fromhex(line.split()[1])


def _state(state: Path) -> tuple[list[tuple[bytes, bytes]], int, Decimal]:
    store = DeviceStore(state)
    try:
        entries = [(e.report_id, e.report) for e in Outbox(store).entries()]
        rows = store.budget_rows()
        return entries, sum(r.reports for r in rows), sum((r.spent for r in rows), Decimal(0))
    finally:
        store.close()


def _resume(target: str, state: Path, trust: Path, token: str) -> list[str]:
    child = _start("resume", target, state, trust, token)
    out, err = child.communicate(timeout=60)
    assert child.returncode == 0, err
    return out.split()


def test_killed_after_persist_before_send(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="5")
    collector = deployment.start()
    trust, state, token = deployment.trust_dir(), tmp_path / "state", deployment.token()
    child = _start("record", collector.address, state, trust, token)
    report_id = _persisted_id(child)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    entries, randomizations, spent = _state(state)
    assert [rid for rid, _ in entries] == [report_id]
    assert (randomizations, spent) == (1, Decimal(1))
    assert ledger_rows(collector) == []  # nothing was sent before the kill

    assert _resume(collector.address, state, trust, token) == ["FLUSHED", "1", "0"]
    (row,) = ledger_rows(collector)
    assert row[0] == report_id
    persisted = collector_pb2.Report.FromString(entries[0][1])
    assert f'"index":{persisted.category.index}' in row[2].replace(" ", "")
    assert _state(state) == ([], 1, Decimal(1))  # sent once, randomized once


def test_killed_after_commit_before_acknowledgement(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="5")
    collector = deployment.start()
    trust, state, token = deployment.trust_dir(), tmp_path / "state", deployment.token()
    child: subprocess.Popen[str] | None = None
    killed: list[bytes] = []

    def kill_once_committed(_connection: int) -> bool:
        # Runs before each chunk from the collector reaches the device: once the
        # report is committed, the device dies before it can read the answer.
        rows = ledger_rows(collector)
        if rows and child is not None:
            killed.append(rows[0][0])
            os.kill(child.pid, signal.SIGKILL)
            return False
        return True

    relay = Relay(("127.0.0.1", collector.port), on_upstream_data=kill_once_committed)
    try:
        child = _start("send", relay.address, state, trust, token)
        report_id = _persisted_id(child)
        child.wait(timeout=60)
    finally:
        relay.close()
    assert child.returncode == -signal.SIGKILL, child.stdout.read()  # type: ignore[union-attr]
    assert killed and killed[0] == report_id

    entries, randomizations, spent = _state(state)
    assert [rid for rid, _ in entries] == [report_id]  # not acknowledged on the device
    assert (randomizations, spent) == (1, Decimal(1))

    # After restart the same bytes go again: the collector answers DUPLICATE and
    # charges nothing more.
    assert _resume(collector.address, state, trust, token) == ["FLUSHED", "1", "1"]
    assert [r for r, _, _ in ledger_rows(collector)] == [report_id]
    (spend,) = collector.ledger.subject_spend("device-1")
    assert (spend.epsilon_spent, spend.report_count) == (Decimal(1), 1)
    assert _state(state) == ([], 1, Decimal(1))
