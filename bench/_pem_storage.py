"""pem's stored statistic, measured for bench/heavy_hitters.py (issue #33).

Two figures, each beside its reference in the same run:

* `stored_analysis`: what `fedldp report` does for a pem policy after opening
  the ledger — read the window's statistics (`Ledger.statistics`), merge them
  (`merge_partials`: the chunks decoded in bulk) and run `discover` — on a
  SQLite ledger holding n reports as the collector writes them now (chunk rows
  of `commit` reports, `PEM.statistic_chunk`, with the statistics row's n),
  against the same reports stored as one JSON statistics row (the form before
  migration 0008), read and decoded the same way. Set-up (randomizing, writing
  the ledgers) is not timed; each run reads the ledger afresh.
* `commit_cost`: the time of one `Ledger.submit_many` of `commit` new pem
  reports into a window that already holds N reports, for the chunked statistic
  against the pre-0008 JSON form (the same policy charged through a mechanism
  with `chunked_statistic = False`, which decodes, merges and re-encodes the
  window's JSON row in each commit, as before 0008). Each run is a new subject's
  commit into the same window (the first JSON commit also reads the row; the
  others start from the Ledger's cached text, as a running collector does).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from fedldp.aggregator.discovery import discover
from fedldp.aggregator.reports import Partial, merge_partials
from fedldp.client.mechanisms import GroupHashedOutput
from fedldp.client.mechanisms.pem import PEM
from fedldp.collector.ledger import CheckedReport, Ledger, SubmitBatch, open_ledger
from fedldp.collector.ledger.schema import statistic_chunks, statistics

from bench._common import summarize

POLICY_ID = "bench-words"
SHARD = "bench"


class JsonPEM(PEM):
    """The pre-0008 form: the statistic kept as one JSON row, rewritten per commit."""

    chunked_statistic = False


class _Charged:
    """A policy charged and counted with another mechanism object (`JsonPEM`)."""

    def __init__(self, policy: Any, mechanism: PEM) -> None:
        self._policy = policy
        self.mechanism = mechanism

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def _write_window(
    ledger: Ledger, mech: PEM, outputs: Any, window: int, *, commit: int, form: str
) -> None:
    """Store the reports of `outputs` (the batch layout) as one window of POLICY_ID v1:
    chunk rows of `commit` reports each (form "chunks") or one JSON row ("json")."""
    groups, keys, values = outputs
    n = groups.shape[0]
    row = {
        "policy_id": POLICY_ID,
        "policy_version": 1,
        "window_start": window,
        "shard": SHARD,
        "n": n,
        "statistic_json": None,
        "updated_at": window,
    }
    chunks = []
    if form == "json":
        stat = mech.new_statistic()
        mech.accumulate_batch(stat, outputs)
        row["statistic_json"] = mech.statistic_to_json(stat)
    else:
        for start in range(0, n, commit):
            part = mech.new_statistic()
            end = start + commit
            mech.accumulate_batch(part, (groups[start:end], keys[start:end], values[start:end]))
            chunks.append(
                {
                    **{k: row[k] for k in ("policy_id", "policy_version", "window_start")},
                    "shard": SHARD,
                    "n_before": start,
                    "n": part.n,
                    "data": mech.statistic_chunk(part),
                }
            )

    def tx(conn: sa.Connection) -> None:
        conn.execute(sa.insert(statistics).values(**row))
        if chunks:
            conn.execute(sa.insert(statistic_chunks), chunks)

    ledger.transaction(tx)


def _read_and_discover(ledger: Ledger, mech: PEM, window: int) -> Any:
    """`fedldp report`'s path after opening the ledger: read, merge, discover."""
    parts = [
        Partial("ledger", p.shard, p.window_start, p.n, p.statistic_json, p.chunks)
        for p in ledger.statistics(POLICY_ID, 1, window)
    ]
    return discover(mech, merge_partials(mech, parts).statistic)


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s, result) of fn()."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def stored_analysis(mech: PEM, outputs: Any, runs: int, *, commit: int = 100) -> dict[str, Any]:
    """The `stored_analysis` figure (module docstring) on `outputs` (batch layout)."""
    window = 1_796_000_000 - 1_796_000_000 % 86400
    samples: dict[str, dict[str, list[float]]] = {
        form: {"wall": [], "cpu": []} for form in ("chunks", "json")
    }
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ledgers = {}
        for form in ("chunks", "json"):
            ledgers[form] = open_ledger(f"sqlite:///{Path(tmp) / form}.db", shard=SHARD)
            _write_window(ledgers[form], mech, outputs, window, commit=commit, form=form)
        try:
            for _ in range(runs):
                for form in ("chunks", "json"):  # interleaved: the same machine state
                    wall, cpu, result = _timed(
                        functools.partial(_read_and_discover, ledgers[form], mech, window)
                    )
                    samples[form]["wall"].append(wall)
                    samples[form]["cpu"].append(cpu)
                    found[form] = result.strings
        finally:
            for led in ledgers.values():
                led.close()
    if found["chunks"] != found["json"]:
        raise RuntimeError("the chunked and JSON forms found different strings")
    return {
        "n": int(outputs[0].shape[0]),
        "commit": commit,
        **{f"{form}_{k}_s": summarize(v) for form, d in samples.items() for k, v in d.items()},
    }


def commit_cost(
    policy: Any, windows: list[int], runs: int, seed: int, *, commit: int = 100
) -> list[dict[str, Any]]:
    """The `commit_cost` figure (module docstring) for each window size in `windows`."""
    mech = policy.mechanism
    assert isinstance(mech, PEM)
    json_policy = _Charged(policy, JsonPEM(mech.epsilon, mech.domain, g=mech.g))
    now = 1_796_000_000
    window = policy.window_start(now)
    rng = np.random.default_rng(seed)
    padded = mech.encode_batch(["ok", "hello", "word", "zzz"])
    out = []
    for size in windows:
        prefill = mech.perturb_batch(padded[rng.integers(0, 4, size=size)], rng)
        row: dict[str, Any] = {"window_reports": size, "commit": commit}
        with tempfile.TemporaryDirectory() as tmp:
            for form, charged in (("chunks", policy), ("json", json_policy)):
                ledger = open_ledger(f"sqlite:///{Path(tmp) / form}.db", shard=SHARD)
                try:
                    _write_window(ledger, mech, prefill, window, commit=max(1, size), form=form)
                    cpu = []
                    for r in range(runs):
                        group = [
                            SubmitBatch(f"s{r}", _reports(charged, mech, padded, rng, commit), now)
                        ]
                        _, spent, _ = _timed(functools.partial(ledger.submit_many, group))
                        cpu.append(spent)
                    row[f"{form}_cpu_ms"] = summarize([c * 1000 for c in cpu])
                finally:
                    ledger.close()
        out.append(row)
    return out


def _reports(
    policy: Any, mech: PEM, padded: Any, rng: np.random.Generator, count: int
) -> list[CheckedReport]:
    """`count` new pem reports charged under `policy` (random ids)."""
    groups, keys, values = mech.perturb_batch(padded[rng.integers(0, 4, size=count)], rng)
    out = []
    for g, k, v in zip(groups.tolist(), keys, values.tolist(), strict=True):
        output = GroupHashedOutput(g, k.astype("<u8").tobytes(), v)
        out.append(CheckedReport(rng.bytes(16), policy, output, rng.bytes(32), 0))
    return out


def bench_policy(epsilon: str) -> Any:
    """A signed pem policy over strings of up to 8 bytes at ε (cap: 10^6 reports)."""
    from tests.support.collector_testkit import Deployment

    d = Deployment.create(now=1_796_000_000)
    cap = str(Decimal(epsilon) * 1_000_000)
    return d.verified(
        d.add_open(POLICY_ID, max_bytes=8, epsilon=epsilon, epsilon_cap=cap, window_seconds=86400)
    )
