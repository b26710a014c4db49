"""`record({...})` for a multi-attribute metric, end to end on a real collector: one
report per call, charged ε once on the device and in the ledger; every bad dict is
refused with a message that names attributes, never values, and changes nothing;
the aggregator reports every attribute (JSON, CSV, table, HTML, `fedldp report`)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fedldp.aggregator.multi_report import MultiReport
from fedldp.aggregator.render import render_html, render_table
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.aggregator.service.consolidate import estimate_rows
from fedldp.client.outbox import Outbox
from fedldp.client.sdk import BadValueError
from fedldp.v1 import collector_pb2, policy_pb2
from sdk_testkit import AUDIENCE, Deployment, ledger_rows, running_deployment

from fedldp.cli import main

SECRET = "secret-value-0451"
OS = ("android", "ios", "other")


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def _multi(d: Deployment, mechanism: str) -> policy_pb2.SignedEnvelope:
    policy = d.authority.multi_policy(
        policy_id="profile",
        metric="app.profile",
        attributes=[
            {"name": "os", "values": list(OS), "mechanism": "grr"},
            {"name": "age", "lo": "0", "hi": "100", "mechanism": "hybrid"},
        ],
        mechanism=mechanism,
        epsilon="2",
        epsilon_cap="200",
        window_seconds=86400,
        now=d.now - 60,
        min_reports=1,
        audience=(AUDIENCE,),
    )
    envelope = d.authority.sign(policy)
    d.envelopes.append(envelope)
    return envelope


BAD: list[tuple[Any, str]] = [
    ("android", "pass a dict of them, not str"),
    (["android", 3], "pass a dict of them, not list"),
    ({"os": "android"}, "missing attribute(s) ['age']"),
    ({"age": 3}, "missing attribute(s) ['os']"),
    ({"os": "android", "age": 3, SECRET: 1}, "1 key(s) that are not attributes"),
    ({"os": SECRET, "age": 3}, "attribute 'os': value is not in its domain"),
    ({"os": 3, "age": 3}, "attribute 'os' is categorical: pass the value's label as a str"),
    ({"os": "ios", "age": SECRET}, "attribute 'age' is numeric: pass an int, float or Decimal"),
    ({"os": "ios", "age": math.nan}, "attribute 'age': value must be finite"),
    ({"os": "ios", "age": Decimal("Infinity")}, "attribute 'age': value must be finite"),
    ({"os": "ios", "age": True}, "attribute 'age' is numeric"),
]


@pytest.mark.parametrize("mechanism", ["multi-split", "multi-sample"])
def test_record_a_dict_one_report_charged_once(
    deployment: Deployment, tmp_path: Path, mechanism: str
) -> None:
    _multi(deployment, mechanism)
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d") as c:
        result = c.record("app.profile", {"os": "android", "age": 34})
        assert result.epsilon_charged == Decimal(2) and result.epsilon_spent == Decimal(2)
        assert result.clipped is False
        assert c.record("app.profile", {"age": Decimal("150"), "os": "ios"}).clipped is True
        assert c.record("app.profile", {"os": "other", "age": -3.5}).clipped is True
        for bad, message in BAD:
            with pytest.raises(BadValueError) as info:
                c.record("app.profile", bad)
            assert message in str(info.value)
            assert SECRET not in str(info.value)
        entries = list(Outbox(c._store).entries())
        assert len(entries) == 3  # the refusals stored nothing
        payloads = [collector_pb2.Report.FromString(e.report) for e in entries]
        assert {p.WhichOneof("payload") for p in payloads} == {"multi"}
        parts = {len(p.multi.parts) for p in payloads}
        assert parts == ({2} if mechanism == "multi-split" else {1})
        assert c.flush(timeout=10).acknowledged == 3
    assert len(ledger_rows(collector)) == 3
    policy = deployment_policy(deployment)
    window = policy.window_start(deployment.now)
    assert collector.ledger.spent("device-1", "profile", window) == 3 * Decimal(2)


def deployment_policy(d: Deployment) -> Any:
    from fedldp.client.policy import verify_policy

    return verify_policy(d.envelopes[-1], d.authority.trust_store(now=d.now), now=d.now)


@pytest.mark.parametrize("mechanism", ["multi-split", "multi-sample"])
def test_the_aggregator_reports_every_attribute(
    deployment: Deployment, tmp_path: Path, mechanism: str
) -> None:
    envelope = _multi(deployment, mechanism)
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", subject="dev") as c:
        for i in range(60):
            c.record("app.profile", {"os": OS[i % 3], "age": i})
        assert c.flush(timeout=20).acknowledged == 60
    policy = deployment_policy(deployment)
    report = report_from_ledgers([("ledger", collector.ledger)], policy)
    assert isinstance(report, MultiReport)
    assert [a.name for a in report.attributes] == ["os", "age"]
    assert report.epsilon == Decimal(2)
    assert report.context.epsilon_charged == 60 * Decimal(2)
    data = json.loads(report.to_json())
    assert data["kind"] == "multi" and len(data["attributes"]) == 2
    assert data["attributes"][0]["report"]["kind"] == "frequency"
    assert data["attributes"][1]["report"]["kind"] == "numeric"
    assert sum(a.reports for a in report.attributes) == (120 if mechanism == "multi-split" else 60)
    csv_rows = report.to_csv().splitlines()
    assert csv_rows[0].startswith("attribute,reports,label") and len(csv_rows) == 1 + 3 + 1
    table = render_table(report)
    assert "attribute os" in table and "attribute age" in table and "mean" in table
    html = render_html(report, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Attribute os" in html and "Attribute age" in html
    rows = estimate_rows(collector.ledger, policy)
    assert {r.metric for r in rows} == {"app.profile.os", "app.profile.age"}
    # The CLI on the same ledger and policy, with --audit (recompute from the raw rows).
    policy_dir = tmp_path / "policies"
    policy_dir.mkdir()
    from fedldp.authoring import write_envelope

    write_envelope(envelope, policy_dir / "profile.policy")
    for fmt in ("table", "json", "csv"):
        result = CliRunner().invoke(
            main,
            [
                "report",
                "--policy",
                "profile",
                "--policies",
                str(policy_dir),
                "--trust",
                str(deployment.trust_dir()),
                "--ledger",
                f"sqlite:///{deployment.tmp / 'ledger.db'}",
                "--audit",
                "--format",
                fmt,
            ],
        )
        assert result.exit_code == 0, result.output
        assert "age" in result.output
