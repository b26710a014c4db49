"""Opening the SQLite ledger from several processes at once (`processes` = 2 on a
new ledger): the busy timeout comes first on every connection and the journal mode
is set once per file, so no opener fails with "database is locked"."""

from __future__ import annotations

import multiprocessing
import sqlite3
from multiprocessing.synchronize import Barrier
from pathlib import Path

from fedldp.collector.ledger import open_ledger
from fedldp.collector.ledger.sqlite_ingest import BUSY_TIMEOUT_MS

#: The previous order (journal mode on every connection) failed 31 of 50 rounds:
#: it passes 25 rounds with probability (19/50)^25 < 1e-10.
ROUNDS = 25


def _open_each(paths: list[str], barrier: Barrier, results: multiprocessing.Queue[str]) -> None:
    """Open (creating) every ledger in `paths`, in step with the other process."""
    for path in paths:
        barrier.wait(timeout=60)
        try:
            open_ledger(f"sqlite:///{path}", shard="opener").close()
            results.put("ok")
        except Exception as exc:  # reported to the test, which shows it
            results.put(f"{type(exc).__name__}: {exc}")


def test_two_processes_open_a_new_ledger_together_25_times(tmp_path: Path) -> None:
    """Two processes (as the supervisor starts them) open 25 new ledgers, each pair
    released together by a barrier: every open succeeds, every file is in WAL mode.
    (The previous order — journal mode on every connection — failed in 31 of 50.)"""
    paths = [str(tmp_path / f"ledger-{i}.db") for i in range(ROUNDS)]
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    results: multiprocessing.Queue[str] = ctx.Queue()
    procs = [ctx.Process(target=_open_each, args=(paths, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in range(2 * ROUNDS)]
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert [o for o in outcomes if o != "ok"] == []
    for path in paths:
        with sqlite3.connect(path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_every_ledger_connection_has_the_busy_timeout(tmp_path: Path) -> None:
    led = open_ledger(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        for engine in (led._write_engine, led._read_engine):
            with engine.connect() as conn:
                timeout = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
            assert timeout == BUSY_TIMEOUT_MS
        assert led._ingest is not None
        with led._ingest.lock:
            ingest = led._ingest.connection()
            assert ingest.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_TIMEOUT_MS
            assert ingest.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        led.close()
