"""The device state folder stays within its documented bound (docs/sdk.md, "Footprint").

Measured as an app sees it: the files in `state_dir` and their sizes (`os.stat`),
with only the public API driving the client. The bound, per the docs:

* while a client is open: the state file <= 128 KiB + (R + 112) bytes per
  pending report, R the stored report's size (72 bytes for the GRR policy
  here), its ``-wal`` <= `WAL_AUTOCHECKPOINT_PAGES` pages + 64 KiB (one
  transaction) = 576 KiB, the ``-shm`` index 32 KiB;
* at idle (after `flush()` sent everything): the ``-wal`` is empty;
* after `close()`: one file.

The 10,000-pending case fills the outbox with the exact row `record()` stores
(its report bytes, a fresh id from the same id generator) in one transaction,
so it takes a fraction of a second: the file it leaves is within 1 % of one
left by 10,000 `record()` calls (1,768 KiB against 1,760 KiB when measured), as
B-tree pages fill the same way whatever the commits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fedldp.client import device_store
from fedldp.client.device_store import STATE_FILE_NAME, WAL_AUTOCHECKPOINT_PAGES, DeviceStore
from fedldp.client.outbox import Outbox
from fedldp.client.report_ids import ReportIds
from sdk_testkit import LABELS, Deployment, running_deployment

KIB = 1024
WAL_BOUND = WAL_AUTOCHECKPOINT_PAGES * 4 * KIB + 64 * KIB
SHM_SIZE = 32 * KIB


#: Bytes of bookkeeping per pending report on top of its report bytes (docs/sdk.md).
ROW_OVERHEAD = 112


def main_file_bound(pending: int, report_bytes: int) -> int:
    """The documented bound on the state file itself, bytes."""
    return 128 * KIB + pending * (report_bytes + ROW_OVERHEAD)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _files(state: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in state.iterdir()}


def _record_pending(deployment: Deployment, state: Path, n: int) -> dict[str, int]:
    """Record `n` reports without sending; the folder's files while the client is open."""
    with deployment.client(deployment.collectors[0].address, state, max_outbox=n + 1) as c:
        for i in range(n):
            c.record("browser.homepage", LABELS[i % len(LABELS)])
        assert c.pending() == n
        return _files(state)


def _report_bytes(state: Path) -> int:
    """The largest stored report's size (all are the same size for one GRR policy)."""
    store = DeviceStore(state)
    try:
        return max(len(e.report) for e in Outbox(store).entries())
    finally:
        store.close()


def test_state_files_within_bound_pending_idle_and_closed(
    deployment: Deployment, tmp_path: Path
) -> None:
    deployment.categorical(epsilon="0.001", epsilon_cap="10")
    deployment.start()
    state = tmp_path / "d"
    files = _record_pending(deployment, state, 1000)
    report_bytes = _report_bytes(state)
    assert set(files) <= {STATE_FILE_NAME, STATE_FILE_NAME + "-wal", STATE_FILE_NAME + "-shm"}
    assert files[STATE_FILE_NAME] <= main_file_bound(1000, report_bytes)
    assert files.get(STATE_FILE_NAME + "-wal", 0) <= WAL_BOUND
    assert files.get(STATE_FILE_NAME + "-shm", 0) <= SHM_SIZE
    # Closed: the log was checkpointed and removed.
    assert _files(state).keys() == {STATE_FILE_NAME}
    # Idle: everything sent, the log truncated to nothing while the client stays open.
    with deployment.client(deployment.collectors[0].address, state, fetch_policies=False) as c:
        assert c.flush(timeout=60).pending == 0
        idle = _files(state)
        assert idle.get(STATE_FILE_NAME + "-wal", 0) == 0
        assert idle[STATE_FILE_NAME] <= main_file_bound(1000, report_bytes)
    assert _files(state).keys() == {STATE_FILE_NAME}


def test_broken_store_without_log_limits_exceeds_bound(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant (SQLite's defaults: 1,000-page autocheckpoint, no size limit)."""
    monkeypatch.setattr(device_store, "WAL_AUTOCHECKPOINT_PAGES", 1000)
    monkeypatch.setattr(device_store, "JOURNAL_SIZE_LIMIT", -1)
    deployment.categorical(epsilon="0.001", epsilon_cap="10")
    deployment.start()
    files = _record_pending(deployment, tmp_path / "d", 200)
    assert files[STATE_FILE_NAME + "-wal"] > WAL_BOUND


def test_state_file_within_bound_at_ten_thousand_pending(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The documented bound holds at 10,000 pending (the old 160 KiB per 1,000 did not)."""
    deployment.categorical(epsilon="0.0001", epsilon_cap="10")
    deployment.start()
    state = tmp_path / "d"
    _record_pending(deployment, state, 1)
    store = DeviceStore(state)
    try:
        first = Outbox(store).entries()[0]
        ids = ReportIds()
        with store.transaction() as conn:
            for _ in range(9999):
                Outbox.add(
                    conn,
                    report_id=ids.next(),
                    policy_id=first.policy_id,
                    policy_version=first.policy_version,
                    window_start=first.window_start,
                    epsilon=first.epsilon,
                    report=first.report,
                    created_at=first.created_at,
                )
        assert Outbox(store).pending() == 10_000
    finally:
        store.close()
    size = _files(state)[STATE_FILE_NAME]
    assert size <= main_file_bound(10_000, len(first.report))
