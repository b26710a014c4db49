"""deploy/prometheus/alerts.yml: well-formed alerting rules over metrics the
collector really exports (names and label values checked against
CollectorMetrics), and, where `promtool` is installed (Debian's `prometheus`
package), `promtool check rules` plus rule unit tests on synthetic series."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from fedldp.collector.metrics import CollectorMetrics
from fedldp.v1 import collector_pb2 as pb

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "alerts.yml"
#: Metrics of other exporters the rules use: Prometheus itself, Envoy, kube-state-metrics.
FOREIGN = {"up", "envoy_cluster_membership_healthy", "kube_job_status_failed"}
PROMQL_WORDS = {
    "sum", "by", "rate", "increase", "histogram_quantile", "clamp_min", "min", "max",
    "le", "instance", "reason", "code", "method", "outcome", "job", "job_name",
    "envoy_cluster_name", "shard", "result", "without", "on", "ignoring", "and", "or", "unless",
}  # fmt: skip


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert set(data) == {"groups"}
    rules: list[dict[str, Any]] = []
    for group in data["groups"]:
        assert set(group) == {"name", "rules"} and group["rules"]
        rules.extend(group["rules"])
    return rules


def _exported() -> set[str]:
    """Every series name the collector's registry exposes (counters' _total,
    histograms' _bucket/_sum/_count)."""
    names: set[str] = set()
    for family in CollectorMetrics().registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_sum", "_count"))
        else:
            names.add(family.name)
    return names


def test_rules_are_well_formed() -> None:
    rules = _rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) and all(n.startswith("Fedldp") for n in names)
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert {"summary", "description"} <= set(rule["annotations"])
        assert rule["expr"].count("(") == rule["expr"].count(")")


def test_rules_use_metrics_the_collector_exports() -> None:
    exported = _exported()
    outcomes = {pb.Outcome.Name(v).removeprefix("OUTCOME_").lower() for v in pb.Outcome.values()}
    codes = {"OK", "INTERNAL", "UNKNOWN", "DATA_LOSS", "UNAVAILABLE", "RESOURCE_EXHAUSTED"}
    used: set[str] = set()
    for rule in _rules():
        expr = re.sub(r'"[^"]*"', '""', rule["expr"])  # label values aside
        expr = re.sub(r"\[\d+[smh]\]", "", expr)
        for name in re.findall(r"\b[a-z_][a-z0-9_]*\b", expr):
            if name not in PROMQL_WORDS:
                used.add(name)
        for value in re.findall(r'outcome=~?"([^"]+)"', rule["expr"]):
            assert set(value.split("|")) <= outcomes, value
        for value in re.findall(r'reason="([^"]+)"', rule["expr"]):
            assert value in {"conflict", "stored_id"}, value  # ledger_reruns' reasons
        for value in re.findall(r'code=~"([^"]+)"', rule["expr"]):
            assert set(value.split("|")) <= codes, value
    assert used <= exported | FOREIGN, used - exported - FOREIGN
    assert {n for n in used if n.startswith("fedldp_")}, "the rules watch the collector"
    # The check catches a misspelt metric (a broken variant).
    assert "fedldp_collector_ledger_error_total" not in exported


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return found


def test_promtool_check_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests(tmp_path: Path) -> None:
    promtool = _promtool()
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": 'up{job="fedldp-collector",instance="c1"}', "values": "1 0 0 0 0"},
                    {
                        "series": 'fedldp_collector_ledger_errors_total{instance="c2"}',
                        "values": "0 0 1 1 1",
                    },
                ],
                "alert_rule_test": [
                    {
                        "eval_time": "4m",
                        "alertname": "FedldpCollectorDown",
                        "exp_alerts": [
                            {
                                "exp_labels": {
                                    "severity": "critical",
                                    "job": "fedldp-collector",
                                    "instance": "c1",
                                },
                                "exp_annotations": {
                                    "summary": "collector c1 is not scraped",
                                    "description": "Its metrics endpoint has not answered for "
                                    "2 minutes: the process is down, draining, or cut off.",
                                },
                            }
                        ],
                    },
                    {"eval_time": "1m", "alertname": "FedldpCollectorDown", "exp_alerts": []},
                    {
                        "eval_time": "3m",
                        "alertname": "FedldpLedgerTransactionsFailing",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", "instance": "c2"},
                                "exp_annotations": {
                                    "summary": "ledger transactions fail on c2",
                                    "description": "Reports in those transactions were not "
                                    "acknowledged (devices retry). Check the ledger database: "
                                    "reachable, disk space, connections.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(yaml.safe_dump(tests), encoding="utf-8")
    done = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
