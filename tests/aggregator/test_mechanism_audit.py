"""The black-box ε auditor (fedldp.aggregator.audit_ldp): it passes the shipped
mechanisms and fails each broken variant of issue 14.

Error control: every audit runs at α = 1e-6 (its default; Bonferroni inside),
and the batch path and, except where stated, the device path run on fixed seeds,
so each outcome here is deterministic. The one test on the OS CSPRNG (the real
device path) has a false-failure rate of at most 1e-6.
"""

from __future__ import annotations

import math
import random
import struct
from decimal import Decimal

import numpy as np
import pytest
from fedldp.aggregator.audit_ldp import (
    AuditReport,
    AuditSettings,
    MechanismSpec,
    audit_mechanism,
    audit_spec,
    resolve_spec,
    stats,
)
from fedldp.aggregator.audit_ldp.features import olh_hash
from fedldp.aggregator.audit_ldp.sampling import sample_device, wire_bits
from fedldp.client.mechanisms import create, registered_ids
from fedldp.client.mechanisms.base import NumericOutput
from fedldp.client.mechanisms.memo import RapporGRR
from fedldp.client.mechanisms.olh import OLH, hash_value

from tests.aggregator.broken_mechanisms import (
    DoubledGRR,
    FloatSquareWave,
    HalvedGRR,
    SequentialChargeRapporGRR,
    StickyOUE,
    UniformIndexPiecewise,
    WholeDomainGRR,
)
from tests.client.mechanisms.legacy_float_numeric import (
    LegacyHybrid,
    LegacyLaplace,
    LegacyPiecewise,
)

K = 16
RANGE = (Decimal(0), Decimal(1))


def seeded(samples: int = 200_000, device: int = 3_000, **kw: object) -> AuditSettings:
    """Batch and device paths on fixed seeds."""
    return AuditSettings(
        samples=samples,
        device_samples=device,
        seed=20261201,
        device_rng=random.Random(14),
        **kw,  # type: ignore[arg-type]
    )


def spec(wire_id: str, epsilon: str = "1", reports: int = 1) -> MechanismSpec:
    eps = Decimal(epsilon)
    return resolve_spec(wire_id, eps, K, RANGE, {}, 2 * eps)


# --- statistics ---


def test_clopper_pearson_bounds_match_closed_forms() -> None:
    n, level = 1000, 1e-6
    # No successes: the upper bound solves (1 - p)^n = level; all successes: p^n = level.
    assert float(stats.cp_upper(0, n, level)) == pytest.approx(1 - level ** (1 / n), rel=1e-9)
    assert float(stats.cp_lower(n, n, level)) == pytest.approx(level ** (1 / n), rel=1e-9)
    assert float(stats.cp_lower(0, n, level)) == 0.0
    assert float(stats.cp_upper(n, n, level)) == 1.0
    lo, hi = float(stats.cp_lower(300, n, level)), float(stats.cp_upper(300, n, level))
    assert lo < 0.3 < hi


def test_event_selection_finds_the_leaking_key_and_bounds_it_on_fresh_samples() -> None:
    rng = np.random.default_rng(1)
    n, level = 100_000, 1e-7
    # Key 3 has probability 0.04 under x and 0.01 under x': ratio 4 (ln 4 = 1.386).
    law_x, law_y = [0.32, 0.32, 0.32, 0.04], [0.33, 0.33, 0.33, 0.01]
    sel_x, sel_y, est_x, est_y = (rng.choice(4, size=n, p=p) for p in (law_x, law_y, law_x, law_y))
    event = stats.select_event(stats.histogram(sel_x), stats.histogram(sel_y), level)
    assert event.forward and event.keys.tolist() == [3]
    bound = stats.bound_event(event, est_x, est_y, level)
    assert 1.0 < bound.epsilon_lb < math.log(4)
    # Swapping the inputs finds the same event, oriented the other way.
    assert not stats.select_event(stats.histogram(sel_y), stats.histogram(sel_x), level).forward


def test_chi_square_pools_small_cells_and_flags_impossible_outputs() -> None:
    probabilities = np.array([0.5, 0.5 - 1e-9, 1e-9])
    assert stats.chi_square_p_value(np.array([5000, 5000, 0]), probabilities) > 0.5
    assert stats.chi_square_p_value(np.array([5000, 4990, 10]), probabilities) < 1e-12
    assert stats.chi_square_p_value(np.array([5, 5, 1]), np.array([0.5, 0.5, 0.0])) == 0.0


# --- reading the wire ---


@pytest.mark.parametrize("value", [0.0, -0.0, 1.5, -3.25e-310, 1.0000000000000002, -7.0])
def test_numeric_reports_are_read_as_the_wire_bytes(value: float) -> None:
    expected = int.from_bytes(struct.pack("<d", value), "little")
    assert wire_bits(NumericOutput(value)) == expected


def test_olh_support_feature_uses_the_contract_hash() -> None:
    mech = create("olh", Decimal(1), 300, {"g": "5"})
    assert isinstance(mech, OLH)
    seeds = np.random.default_rng(3).integers(0, mech.seed_space, size=500, dtype=np.int64)
    for value in (0, 1, 299):
        got = olh_hash(seeds, value, mech.g, mech.m)
        assert got.tolist() == [hash_value(int(s), value, mech.g, mech.m) for s in seeds]


# --- the shipped mechanisms pass ---


@pytest.mark.parametrize("wire_id", registered_ids())
def test_shipped_mechanism_passes_one_report(wire_id: str) -> None:
    s = spec(wire_id)
    report = audit_spec(s, seeded())
    assert report.passed, _describe(report)
    assert 0.0 < report.epsilon_lb("batch") <= float(s.epsilon)


def test_device_path_on_the_os_csprng_passes() -> None:
    """rng=None: exactly what a device runs. False-failure rate <= 1e-6."""
    settings = AuditSettings(samples=2, device_samples=20_000, paths=("device",))
    for wire_id in ("grr", "oue"):
        report = audit_spec(spec(wire_id), settings)
        assert report.passed, _describe(report)


# --- broken variants fail ---


def test_whole_domain_randomized_response_fails() -> None:
    """Keeping the truth w.p. p and else answering uniformly over all k values gives
    P[x | x] / P[x | x'] = 1 + k e^ε/(k - 1) > e^ε (ln = 1.36 at k = 16, ε = 1)."""
    broken = WholeDomainGRR(Decimal(1), K)
    report = audit_mechanism(broken, K, seeded())
    assert report.epsilon_lb("batch") > 1.0
    # Its law is not the declared one either, on both paths.
    failed = {law.path for law in report.laws if not law.passed}
    assert failed == {"device", "batch"}
    assert not report.passed


def test_mechanism_much_noisier_than_claimed_fails_its_law() -> None:
    """GRR randomizing at ε/2 while declaring ε: no ε bound can exceed the claim,
    but the law check sees that the declared law (and so the estimator) is wrong."""
    broken = HalvedGRR(Decimal(1), K)
    report = audit_mechanism(broken, K, seeded())
    assert report.epsilon_lb() <= 1.0
    assert {law.path for law in report.laws if not law.passed} == {"device", "batch"}
    assert not report.passed


def test_unary_encoding_keeping_the_true_bit_too_often_fails() -> None:
    # p = 3/4 with OUE's q at ε = 1: true ratio 3 e (ln = 2.10).
    broken = StickyOUE(Decimal(1), K)
    report = audit_mechanism(broken, K, seeded())
    assert report.epsilon_lb("batch") > 1.5
    assert report.epsilon_lb("device") > 1.0
    assert not report.passed


def test_epsilon_off_by_a_factor_fails() -> None:
    broken = DoubledGRR(Decimal(1), K)  # randomizes at ε = 2, claims 1
    report = audit_mechanism(broken, K, seeded())
    assert report.law_passed  # its law is GRR's at 2: only the ε bound sees it
    assert report.epsilon_lb("batch") > 1.5
    assert not report.passed


@pytest.mark.parametrize("epsilon", ["0.5", "1", "2", "4"])
def test_floating_point_piecewise_fails_on_its_raw_bits(epsilon: str) -> None:
    """The piecewise mechanism as it shipped before issue 14 (a double computed
    from the input): events on the wire bits occur under one input only."""
    broken = LegacyPiecewise(Decimal(epsilon), *RANGE)
    report = audit_mechanism(broken, RANGE, seeded(samples=100_000, device=5_000))
    assert report.epsilon_lb("batch") > float(epsilon) + 1.0
    assert report.epsilon_lb("device") > float(epsilon)
    assert not report.passed


@pytest.mark.parametrize("legacy", [LegacyHybrid, LegacyLaplace])
def test_floating_point_hybrid_and_laplace_fail_on_their_raw_bits(legacy: type) -> None:
    broken = legacy(Decimal(2), *RANGE)
    report = audit_mechanism(broken, RANGE, seeded(samples=100_000, device=2))
    assert report.epsilon_lb("batch") > 3.0
    assert not report.passed


@pytest.mark.parametrize("epsilon", ["1", "4"])
def test_floating_point_square_wave_fails_on_its_raw_bits(epsilon: str) -> None:
    """Square Wave drawn as a continuous double (Li et al.'s formulation, no grid):
    its wire bits carry the input, and no report is a table value."""
    broken = FloatSquareWave(Decimal(epsilon), *RANGE)
    report = audit_mechanism(broken, RANGE, seeded(samples=100_000, device=5_000))
    assert report.epsilon_lb("batch") > float(epsilon)
    assert {law.path for law in report.laws if not law.passed} == {"device", "batch"}
    assert not report.passed


def test_numeric_sampler_off_its_declared_law_fails_the_law_check() -> None:
    """Grid piecewise drawing its table index uniformly: it leaks nothing (ε bound
    about 0) but is not the declared law, so its estimates are wrong."""
    report = audit_mechanism(UniformIndexPiecewise(Decimal(1), *RANGE), RANGE, seeded())
    assert report.epsilon_lb() < 0.1
    assert {law.path for law in report.laws if not law.passed} == {"device", "batch"}
    assert not report.passed


#: Issue 14's longitudinal case: k = 64, ε1 = 0.5, ε∞ = 2, T = 2 reports of one value,
#: exact loss L(2) = 1.478; 2·10⁶ users per input and half give the audit its power.
LONGITUDINAL = AuditSettings(samples=4_000_000, reports=2, paths=("batch",), seed=7)


def test_sequential_charging_of_rappor_grr_fails_the_longitudinal_audit() -> None:
    """Charged ε1 per report, two reports cost 1.0 < 1.478: the audit proves more."""
    broken = SequentialChargeRapporGRR(Decimal("0.5"), 64, Decimal(2))
    report = audit_mechanism(broken, 64, LONGITUDINAL)
    assert report.claim == Decimal("1.0")
    assert 1.0 < report.epsilon_lb(sequences=False) < 1.478
    # The sequence test proves more: (0, 0) against (1, 2) loses 2.017 exactly.
    assert 1.0 < report.epsilon_lb(sequences=True) < 2.017
    assert report.law_passed
    assert not report.passed


def test_rappor_grr_joint_charge_passes_the_same_audit() -> None:
    mech = create("rappor-grr", Decimal("0.5"), 64, {"epsilon_permanent": "2"})
    report = audit_mechanism(mech, 64, LONGITUDINAL)
    assert report.claim == 2 * mech.report_charge >= Decimal("1.4776")
    assert 1.0 < report.epsilon_lb() <= float(report.claim)
    assert report.passed, _describe(report)


@pytest.mark.parametrize("wire_id", ["rappor-grr", "rappor-oue", "rappor-sue"])
def test_memoized_mechanisms_pass_three_reports_on_both_paths(wire_id: str) -> None:
    report = audit_spec(spec(wire_id), seeded(reports=3))
    assert report.reports == 3 and {e.path for e in report.events} == {"device", "batch"}
    assert report.passed, _describe(report)


def _describe(report: AuditReport) -> str:
    best = report.best_event()
    bad = [law for law in report.laws if not law.passed]
    return f"{report.wire_id}: claim {report.claim}, best {best}, law failures {bad}"


class _PermanentOnlyGRR(RapporGRR):
    """rappor-grr whose report IS its permanent response (ε1 = ε∞: refused when built
    through the registry, whose charge would be unbounded); here only to see the
    sharing."""

    def _instantaneous_rate(self) -> Decimal:
        return Decimal(0)


def test_device_path_shares_one_permanent_response_per_user() -> None:
    """With ε1 = ε∞ the instantaneous response is the permanent one: T equal reports."""
    mech = _PermanentOnlyGRR(Decimal(1), 8, Decimal(1))
    assert mech.p_r_exact == 1
    reports = sample_device(mech, "category", 3, 500, 3, random.Random(2))
    first, *others = reports.columns
    assert all(np.array_equal(first, other) for other in others)
    assert len(set(first.tolist())) > 1  # ... while users draw their own


def test_pem_randomizing_at_twice_its_epsilon_fails() -> None:
    """PEM (open domain) keeping the hash with the probability for 2ε while claiming ε:
    the group-and-support feature bounds ε above the claim, and its law check fails."""
    from fedldp.client.mechanisms import OpenDomain
    from fedldp.client.mechanisms.olh import keep_probability
    from fedldp.client.mechanisms.pem import PEM

    class DoubledPEM(PEM):
        def __init__(self, epsilon: Decimal, domain: OpenDomain) -> None:
            super().__init__(epsilon, domain, g=4)
            self.keep = keep_probability(2 * epsilon, self.g)

    domain = OpenDomain(2)
    report = audit_mechanism(DoubledPEM(Decimal(1), domain), domain, seeded())
    assert report.epsilon_lb("batch") > 1.0
    assert not report.law_passed
    assert not report.passed
