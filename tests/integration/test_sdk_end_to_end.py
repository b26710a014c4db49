"""The SDK against a real collector: record, flush, the ledger agrees, refusals say why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.device_store import Event
from fedldp.client.outbox import Outbox
from fedldp.client.sdk import BadValueError, NoPolicyError
from fedldp.v1 import collector_pb2
from sdk_testkit import LABELS, Deployment, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_record_flush_and_ledger_agree(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="0.5", epsilon_cap="2")
    collector = deployment.start()
    events: list[Event] = []
    with deployment.client(collector.address, tmp_path / "dev", on_event=events.append) as c:
        assert [p.policy_id for p in c.policies()] == ["homepage"]
        results = [c.record("browser.homepage", label) for label in LABELS[:3]]
        assert [r.epsilon_spent for r in results] == [
            Decimal("0.5"),
            Decimal("1.0"),
            Decimal("1.5"),
        ]
        assert results[-1].epsilon_remaining == Decimal("0.5")
        stored = {e.report_id: e.report for e in Outbox(c._store).entries()}
        # One run of ids (client/report_ids.py): a shared prefix, counting up, so
        # the collector's id index takes a batch in one place.
        ids = [r.report_id for r in results]
        assert list(stored) == ids
        assert len({rid[:8] for rid in ids}) == 1
        first = int.from_bytes(ids[0][8:], "big")
        assert [(int.from_bytes(rid[8:], "big") - first) % 2**64 for rid in ids] == [0, 1, 2]
        assert c.pending() == 3
        flushed = c.flush(timeout=10)
        assert (flushed.acknowledged, flushed.pending, flushed.refused) == (3, 0, 0)
        assert c.pending() == 0
        assert c.counters()["acknowledged"] == 3
        (budget,) = c.budget()
        assert budget.epsilon_spent == Decimal("1.5")
        remote = c._transport.get_budget("homepage").budgets[0]
        assert Decimal(remote.epsilon_spent) == budget.epsilon_spent
    assert events == []
    rows = ledger_rows(collector)
    assert {r for r, _, _ in rows} == set(stored)
    assert {s for _, s, _ in rows} == {"device-1"}
    for rid, _, payload in rows:
        report = collector_pb2.Report.FromString(stored[rid])
        assert json.loads(payload)["index"] == report.category.index
        assert report.coarse_time % 3600 == 0


def test_without_policy_record_refuses_and_says_why(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()
    events: list[Event] = []
    with deployment.client(collector.address, tmp_path / "d", on_event=events.append) as c:
        with pytest.raises(NoPolicyError, match=r"no policy for metric 'app\.other'") as info:
            c.record("app.other", "x")
        assert info.value.reason == "NO_POLICY"
        with pytest.raises(BadValueError) as bad:
            c.record("browser.homepage", "secret-value.example")
        assert "secret-value" not in str(bad.value)
        with pytest.raises(BadValueError, match="categorical"):
            c.record("browser.homepage", 3)
        assert c.pending() == 0
        assert c.counters()["record_refused_no_policy"] == 1
        assert c.counters()["record_refused_bad_value"] == 2
    assert [e.reason for e in events] == ["NO_POLICY", "BAD_VALUE", "BAD_VALUE"]
    assert all("secret-value" not in e.detail for e in events)


def test_policy_above_device_maximum_is_refused(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="2", epsilon_cap="4")
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", max_epsilon=Decimal("1")) as c:
        assert c.policies() == []
        with pytest.raises(NoPolicyError, match="above this device's maximum") as info:
            c.record("browser.homepage", LABELS[0])
        assert info.value.reason == "POLICY_REJECTED"
        assert any(e.kind == "policy_rejected" for e in c.events())


def test_offline_start_uses_cached_policies(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()
    deployment.client(collector.address, tmp_path / "d").close()
    collector.stop()
    # The collector is gone: the constructor's fetch fails quietly, the cache is used.
    with deployment.client(
        collector.address, tmp_path / "d", timeout_seconds=1, policy_refresh_seconds=0.001
    ) as c:
        assert c.record("browser.homepage", LABELS[1]).policy_id == "homepage"
        result = c.flush(timeout=0.5)
        assert result.pending == 1 and result.failed_attempts >= 1
