"""Migration: reports charged under the retired r* rule are reported, never rewritten.

A rappor-grr policy signed before the sound charge existed keeps working; the
reports its subjects sent under the old collector were charged r* each. The
new `fedldp ledger reconcile --policies DIR` lists every subject window whose
recorded spend is below the sound rule's figure for the same reports, exits 0
when the running totals match (it is a report, not a mismatch), and leaves the
ledger byte for byte as it was.
"""

from __future__ import annotations

import hashlib
import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from collector_testkit import ChargedUnderRetiredRule, Deployment
from fedldp.authoring import write_envelope
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.ledger import ACCEPTED, CheckedReport, Ledger
from fedldp.collector.ledger.charge_audit import sound_charges, undercharged
from fedldp.v1 import policy_pb2

from fedldp.cli import main


def _report(policy: Any, index: int) -> CheckedReport:
    digest = hashlib.sha256(secrets.token_bytes(8)).digest()
    return CheckedReport(secrets.token_bytes(16), policy, CategoryOutput(index), digest, 0)


def test_reconcile_reports_subjects_charged_below_the_sound_rule(
    deployment: Deployment, ledger: Ledger, ledger_url: str, tmp_path: Path, now: int
) -> None:
    env = deployment.add_categorical(
        "memo-old",
        labels=[f"v{i}" for i in range(64)],
        epsilon="0.5",
        epsilon_cap="9",
        mechanism="rappor-grr",
        params={"epsilon_permanent": "2"},
        memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,  # signed by an old authoring
    )
    policy = deployment.verified(env)
    old = ChargedUnderRetiredRule(policy)
    assert (old.charge, policy.charge) == (Decimal("0.738803"), Decimal("2.192184"))
    # Before the upgrade: three reports at r*. After it: one at the sound charge.
    assert ledger.submit("ada", [_report(old, i) for i in range(3)], now=now) == [ACCEPTED] * 3
    assert ledger.submit("ada", [_report(policy, 0)], now=now) == [ACCEPTED]
    assert ledger.submit("bob", [_report(policy, 1)], now=now) == [ACCEPTED]
    window = policy.window_start(now)
    spent_before = ledger.spent("ada", "memo-old", window)
    assert spent_before == Decimal("4.408593")  # 3 × 0.738803 + 2.192184

    findings = undercharged(ledger.charge_groups(), sound_charges([env.payload]))
    assert [(f.subject, f.reports, f.spent, f.sound) for f in findings] == [
        ("ada", 3, Decimal("2.216409"), Decimal("6.576552"))
    ]

    folder = tmp_path / "policies"
    folder.mkdir()
    write_envelope(env, folder / "memo-old.policy")
    result = CliRunner().invoke(
        main, ["ledger", "reconcile", "--ledger", ledger_url, "--policies", str(folder)]
    )
    assert result.exit_code == 0, result.output
    assert (
        f"RETIRED-RULE subject=ada policy=memo-old window={window}: 3 report(s) charged "
        "2.216409 under the retired r* rule; the sound rule's figure is 6.576552"
    ) in result.output
    assert "subject=bob" not in result.output
    assert "UNJUDGED" not in result.output
    assert "ledger consistent" in result.output
    # A report under a policy whose envelope is not in the folder cannot be judged: said.
    other = deployment.verified(deployment.add_categorical("plain", epsilon_cap="2"))
    assert ledger.submit("cyd", [_report(other, 0)], now=now) == [ACCEPTED]
    result = CliRunner().invoke(
        main, ["ledger", "reconcile", "--ledger", ledger_url, "--policies", str(folder)]
    )
    assert result.exit_code == 0, result.output
    assert "UNJUDGED policy=plain version=1: 1 report(s) charged under a policy not in" in (
        result.output
    )
    # A report, not a rewrite: the spend is what it was.
    assert ledger.spent("ada", "memo-old", window) == spent_before
    assert ledger.reconcile() == []


def test_without_policies_reconcile_says_nothing_of_the_rule(
    deployment: Deployment, ledger: Ledger, ledger_url: str
) -> None:
    result = CliRunner().invoke(main, ["ledger", "reconcile", "--ledger", ledger_url])
    assert result.exit_code == 0, result.output
    assert "RETIRED-RULE" not in result.output
