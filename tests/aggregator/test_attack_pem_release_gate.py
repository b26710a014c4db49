"""ATTACK (audit atk2): the release gate for pem counts every group's reports, but each
discovered string's estimate rests on ONE group's reports.

docs/architecture.md lists "no estimate below the policy's minimum report count"
(`check_release_gate`), and for multi-sample, where each attribute's estimate rests on
the reports that carry it, the gate applies to min_j n_j (docs/mechanisms.md,
aggregator/reports.py). PEM splits the users into G groups and a string's estimate is
the last group's f̂ (aggregator/discovery.py), so `report_for_policy` must gate on the
smallest group, not the total n: with min_reports_for_release = 60 and 60 reports over
G = 3 groups, no string may be released (each estimate would rest on about 20 reports).
Real signed policy, fixed seed.
"""

from __future__ import annotations

import random

import pytest
from collector_testkit import Deployment
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import (
    InsufficientReportsError,
    MergedStatistic,
    report_for_policy,
)
from fedldp.client.mechanisms.pem import PEM
from fedldp.client.policy import VerifiedPolicy

MINIMUM = 60


def released_inputs(
    now: int, reports: int = MINIMUM
) -> tuple[VerifiedPolicy, MergedStatistic, PEM]:
    d = Deployment.create(now=now)
    policy = d.authority.open_policy(
        policy_id="gate-words",
        metric="app.gate_words",
        max_bytes=2,
        epsilon="8",
        epsilon_cap="8",
        window_seconds=86400,
        now=d.now - 60,
        min_reports=MINIMUM,
        audience=(d.audience,),
    )
    verified = d.verified(d.authority.sign(policy))
    mech = verified.mechanism
    assert isinstance(mech, PEM) and mech.groups == 3
    assert verified.min_reports_for_release == MINIMUM
    rng = random.Random(5)
    stat = mech.new_statistic()
    for _ in range(reports):
        mech.accumulate(stat, mech.perturb("ok", rng=rng))
    merged = MergedStatistic(statistic=stat, n=stat.n, partials=1, sources=("local",))
    return verified, merged, mech


def test_n_reaches_the_minimum_while_every_group_is_below_it(now: int) -> None:
    _, merged, mech = released_inputs(now)
    assert merged.n == MINIMUM
    assert max(merged.statistic.group_size(j) for j in range(mech.groups)) < MINIMUM


def test_no_string_is_released_from_fewer_reports_than_the_minimum(now: int) -> None:
    verified, merged, _ = released_inputs(now)
    with pytest.raises(InsufficientReportsError):
        report_for_policy(verified, merged)


def test_strings_are_released_once_every_group_reaches_the_minimum(now: int) -> None:
    verified, merged, mech = released_inputs(now, reports=8 * MINIMUM)
    assert min(merged.statistic.group_size(j) for j in range(mech.groups)) >= MINIMUM
    report = report_for_policy(verified, merged)
    assert isinstance(report, FrequencyReport)
    assert "ok" in report.labels
