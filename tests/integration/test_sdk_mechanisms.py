"""Numeric metrics (clipping reported) and memoized metrics (permanent responses kept)."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import DeviceStore
from fedldp.client.mechanisms import create
from fedldp.client.outbox import Outbox
from fedldp.client.sdk import BadValueError
from fedldp.v1 import collector_pb2, policy_pb2
from sdk_testkit import AUDIENCE, LABELS, Deployment, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_numeric_values_are_clipped_and_reported(deployment: Deployment, tmp_path: Path) -> None:
    policy = deployment.authority.numeric_policy(
        policy_id="minutes",
        metric="session.minutes",
        lo="0",
        hi="100",
        epsilon="1",
        epsilon_cap="10",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=1,
        audience=(AUDIENCE,),
    )
    deployment.envelopes.append(deployment.authority.sign(policy))
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d") as c:
        assert c.record("session.minutes", 150).clipped is True
        assert c.record("session.minutes", -0.5).clipped is True
        assert c.record("session.minutes", Decimal("42.5")).clipped is False
        assert c.record("session.minutes", 100).clipped is False
        for bad in ("50", math.nan, math.inf, True, Decimal("NaN")):
            with pytest.raises(BadValueError):
                c.record("session.minutes", bad)
        kinds = {
            collector_pb2.Report.FromString(e.report).WhichOneof("payload")
            for e in Outbox(c._store).entries()
        }
        assert kinds == {"numeric"}
        assert c.flush(timeout=10).acknowledged == 4
    assert len(ledger_rows(collector)) == 4


def _memo_rows(state: Path) -> list[tuple[str, str, bytes, bytes]]:
    store = DeviceStore(state)
    try:
        with store.transaction() as conn:
            rows = conn.execute("SELECT metric, scope, value_key, state FROM memo").fetchall()
        return [(str(m), str(s), bytes(k), bytes(v)) for m, s, k, v in rows]
    finally:
        store.close()


def test_memoized_permanent_response_is_drawn_once(deployment: Deployment, tmp_path: Path) -> None:
    # One value recorded over three app runs: one permanent response, drawn on the
    # first record and stored (as a keyed hash of the value, never the value), then
    # reused byte for byte; a second value draws a second one.
    policy = deployment.authority.categorical_policy(
        policy_id="memo",
        metric="browser.homepage",
        labels=list(LABELS),
        epsilon="1",
        epsilon_cap="100",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=1,
        audience=(AUDIENCE,),
        mechanism="rappor-grr",
        params={"epsilon_permanent": "2"},
        memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,
    )
    deployment.envelopes.append(deployment.authority.sign(policy))
    collector = deployment.start()
    state = tmp_path / "d"
    seen: list[list[tuple[str, str, bytes, bytes]]] = []
    for _ in range(3):  # three app runs
        with deployment.client(collector.address, state) as c:
            for _ in range(4):
                c.record("browser.homepage", LABELS[1])
            assert c.flush(timeout=10).acknowledged == 4
        seen.append(_memo_rows(state))
    assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2]  # reused across restarts
    metric, scope, value_key, permanent = seen[0][0]
    assert metric == "browser.homepage" and "rappor-grr" in scope
    assert 0 <= int.from_bytes(permanent, "little") < len(LABELS)
    assert LABELS[1].encode() not in value_key and len(value_key) == 32  # keyed hash only

    charge = create("rappor-grr", Decimal(1), len(LABELS), {"epsilon_permanent": "2"}).report_charge
    assert charge > Decimal(1)  # max(ε1, ε_I): any two value sequences (memo.py)
    with deployment.client(collector.address, state) as c:
        c.record("browser.homepage", LABELS[2])
        assert c.budget()[0].epsilon_spent == 13 * charge  # charged per report, exactly
    assert len(_memo_rows(state)) == 2
    window = int(time.time()) - int(time.time()) % 86400
    assert collector.ledger.spent("device-1", "memo", window) == 12 * charge
