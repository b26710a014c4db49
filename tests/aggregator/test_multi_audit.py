"""`fedldp verify mechanism` on multi-attribute mechanisms: the shipped ones pass (the
registry-wide audit test), and a split that forgets to split ε fails: its joint report
leaks 2 ε over two attributes, and the auditor's lower bound (α = 1e-6, fixed seeds)
lands above the claimed ε."""

from __future__ import annotations

import random
from decimal import Decimal

from fedldp.aggregator.audit_ldp import AuditSettings, audit_mechanism
from fedldp.aggregator.audit_ldp.audit import audit_multi_metric
from fedldp.client.mechanisms.base import MultiMetric
from fedldp.client.mechanisms.multi import MultiSplit, build_attribute


class FullEpsilonSplit(MultiSplit):
    """Broken: every attribute at the full ε (the budget is not split)."""

    def __init__(self, epsilon: Decimal, metric: MultiMetric) -> None:
        super().__init__(epsilon, metric)
        self.attribute_epsilon = epsilon
        self.mechanisms = tuple(build_attribute(a, epsilon) for a in metric.attributes)


SETTINGS = AuditSettings(
    samples=100_000, device_samples=2_000, seed=20261201, device_rng=random.Random(21)
)


def test_a_split_that_does_not_split_fails_the_audit() -> None:
    metric = audit_multi_metric(2, (Decimal(0), Decimal(1)))
    report = audit_mechanism(FullEpsilonSplit(Decimal(1), metric), metric, SETTINGS)
    assert not report.passed
    assert report.epsilon_lb("batch") > 1.0


def test_the_shipped_split_passes_on_the_same_settings() -> None:
    metric = audit_multi_metric(2, (Decimal(0), Decimal(1)))
    report = audit_mechanism(MultiSplit(Decimal(1), metric), metric, SETTINGS)
    assert report.passed
    assert 0.0 < report.epsilon_lb("batch") <= 1.0
