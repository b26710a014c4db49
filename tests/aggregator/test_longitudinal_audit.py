"""The longitudinal test of the ε auditor (issue 28, item 3): two SEQUENCES of values.

It fails the memoized mechanisms charged the retired rule r* per report (the
old auditor, one unchanged value per user, passes them) and passes them on the
sound charge max(ε1, ε_I) per report.

Error control: every audit runs at α = 1e-6 (Bonferroni inside). The batch path
and the seeded device path run on fixed seeds, so those outcomes are
deterministic; the one test on the OS CSPRNG (the real device path) has a
false-failure rate of at most 1e-6.
"""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from fedldp.aggregator.audit_ldp import AuditReport, AuditSettings, audit_mechanism
from fedldp.aggregator.audit_ldp import longitudinal as lg
from fedldp.client.mechanisms import create
from fedldp.client.mechanisms.base import Output
from fedldp.client.mechanisms.memo import MemoState, RapporGRR

from tests.aggregator.broken_mechanisms import RetiredChargeRapporGRR, RetiredChargeRapporOUE

#: Issue 28's case: rappor-oue, k = 64, ε1 = 1, ε∞ = 2; r* = 1 (two reports: 2.0),
#: the sound charge 90.086782 per report.
OUE_ARGS = (Decimal(1), 64, Decimal(2))


def batch(samples: int, reports: int = 2, **kw: Any) -> AuditSettings:
    """`reports` reports per user, batch path only, fixed seed."""
    return AuditSettings(samples=samples, reports=reports, paths=("batch",), seed=28, **kw)


def _describe(report: AuditReport) -> str:
    return f"{report.wire_id}: claim {report.claim}, best {report.best_event()}"


# --- the plan ---


def test_sequences_cover_unchanged_changed_once_alternating_and_all_distinct() -> None:
    seqs, pairs = lg.sequence_pairs(64, 2)
    assert [s.values for s in seqs] == [(0, 0), (0, 1), (1, 2)]
    assert pairs == [(0, 1), (0, 2)]
    seqs, pairs = lg.sequence_pairs(64, 4)
    assert [s.values for s in seqs] == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 1), (1, 2, 3, 4)]
    assert pairs == [(0, 1), (0, 2), (0, 3)]
    # k = 2 has no third value: the all-distinct sequence wraps (and is deduplicated).
    assert [s.values for s in lg.sequence_pairs(2, 2)[0]] == [(0, 0), (0, 1), (1, 0)]


def test_differing_pairs_are_where_one_sequence_repeats_a_value() -> None:
    assert lg.differing_pairs((0, 0, 0), (0, 0, 1)) == [(0, 2, True), (1, 2, True)]
    assert lg.differing_pairs((0, 1, 0), (1, 2, 3)) == [(0, 2, True)]
    assert lg.differing_pairs((0, 0), (1, 1)) == []


def test_features_fit_the_domain() -> None:
    """k = 2 has no column outside the values: only their bits; k = 64 adds the
    fingerprint; category reports get equalities and classes."""
    names = {
        k: [
            f.name for f in lg.sequence_features("bits", _Unary(k), *lg.sequence_pairs(k, 2)[0][:2])
        ]
        for k in (2, 64)
    }
    assert names[2] == ["bits at the values"]
    assert names[64] == [
        "bits at the values",
        "fingerprint: columns both set, columns differing",
        "agreement: columns differing",
        "likelihood-ratio score",
    ]
    seqs = lg.sequence_pairs(16, 3)[0]
    category = [f.name for f in lg.sequence_features("category", None, seqs[0], seqs[1])]
    assert category == ["equal reports", "classes and equal reports"]
    assert lg.sequence_values((Decimal(0), Decimal(1)), 3) == [0.0, 1.0, pytest.approx(1 / 3)]


def test_the_fitted_score_is_learnt_on_the_selection_half_only() -> None:
    """The score is what `fit` learns from the halves it is given: fitted on two halves
    of ONE input its weights are about 0 (scores near 0); fitted on (0, 0) against
    (0, 1) they are not. The audit fits on the selection halves only."""
    mech = create("rappor-oue", Decimal(1), 64, {"epsilon_permanent": "2"})
    seqs = lg.sequence_pairs(64, 2)[0]
    (score,) = [
        f
        for f in lg.sequence_features("bits", mech, seqs[0], seqs[1])
        if f.name == "likelihood-ratio score"
    ]
    same = lg.sample_batch(mech, "bits", seqs[0], 40_000, np.random.default_rng(1))
    changed = lg.sample_batch(mech, "bits", seqs[1], 40_000, np.random.default_rng(2))
    keys = score.fitted(same.rows(0, 20_000), same.rows(20_000, 40_000))
    assert (
        np.abs(keys(same)).mean()
        < np.abs(score.fitted(same.rows(0, 20_000), changed.rows(0, 20_000))(same)).mean()
    )


class _Unary:
    """Just a domain size, as the bit-vector features read it."""

    def __init__(self, k: int) -> None:
        self.k = k


@pytest.mark.parametrize("path", ["device", "batch"])
def test_reports_of_one_value_share_the_permanent_response_on_both_paths(path: str) -> None:
    """ε1 = 3.9 just under ε∞ = 4: the instantaneous step keeps the permanent index with
    probability 0.988, so two reports of one value are almost always equal, and
    reports of two values (independent permanent responses) rarely."""
    mech = create("rappor-grr", Decimal("3.9"), 8, {"epsilon_permanent": "4"})
    seq = lg.Sequence("x", (3, 3, 5))
    if path == "device":
        reports = lg.sample_device(mech, "category", seq, 2000, random.Random(3))
    else:
        reports = lg.sample_batch(mech, "category", seq, 2000, np.random.default_rng(3))
    first, second, third = reports.columns
    assert np.mean(first == second) > 0.95
    assert np.mean(first == third) < 0.5


# --- the broken variants fail, the shipped mechanisms pass ---


def test_retired_charge_on_rappor_oue_fails_the_sequence_test() -> None:
    broken = RetiredChargeRapporOUE(*OUE_ARGS)
    report = audit_mechanism(broken, 64, batch(100_000))
    assert report.claim == Decimal("2")
    assert report.epsilon_lb(sequences=True) > 2.5
    assert not report.passed
    # The old auditor (one unchanged value per user) does not see it.
    assert report.epsilon_lb(sequences=False) <= 2.0
    assert report.law_passed


def test_sound_charge_on_rappor_oue_passes_the_same_test() -> None:
    mech = create("rappor-oue", OUE_ARGS[0], 64, {"epsilon_permanent": "2"})
    report = audit_mechanism(mech, 64, batch(100_000))
    assert report.claim == 2 * mech.report_charge == Decimal("180.173564")
    assert 2.5 < report.epsilon_lb(sequences=True) <= float(report.claim)
    assert report.passed, _describe(report)


def test_retired_charge_on_rappor_grr_fails_and_the_sound_charge_passes() -> None:
    """k = 64, ε1 = 1, ε∞ = 2: (0, 0) against (1, 2) loses 3.72 exactly; r* = 1."""
    settings = batch(400_000)
    broken = audit_mechanism(RetiredChargeRapporGRR(*OUE_ARGS), 64, settings)
    assert broken.claim == Decimal("2")
    assert broken.epsilon_lb(sequences=True) > 2.0 >= broken.epsilon_lb(sequences=False)
    assert not broken.passed
    sound = audit_mechanism(RapporGRR(*OUE_ARGS), 64, settings)
    assert sound.claim == Decimal("6.583858")
    assert sound.epsilon_lb(sequences=True) > 2.0
    assert sound.passed, _describe(sound)


@pytest.mark.parametrize("wire_id", ["rappor-grr", "rappor-oue", "rappor-sue"])
def test_memoized_mechanisms_pass_three_reports_of_changing_values(wire_id: str) -> None:
    mech = create(wire_id, Decimal(1), 16, {"epsilon_permanent": "2"})
    report = audit_mechanism(mech, 16, batch(100_000, reports=3))
    assert report.has_sequences("batch") and report.reports == 3
    assert report.passed, _describe(report)


def test_no_sequences_setting_runs_the_one_value_test_only() -> None:
    report = audit_mechanism(RetiredChargeRapporOUE(*OUE_ARGS), 64, batch(20_000, sequences=False))
    assert not report.has_sequences() and report.passed


# --- the device path, and any mechanism that keeps a memo ---


class MemoKeeper:
    """A memoized mechanism known only by `new_memo` and `perturb(value, memo=...)`
    (not a `Memoized`): rappor-oue inside, charged the retired r*."""

    wire_id = "test-memo-keeper"

    def __init__(self) -> None:
        self._inner = RetiredChargeRapporOUE(*OUE_ARGS)
        self.epsilon = self._inner.epsilon
        self.k = self._inner.k
        self.report_charge = self._inner.report_charge

    def new_memo(self) -> MemoState:
        """The inner mechanism's memo."""
        return self._inner.new_memo()

    def perturb(
        self, value: int, *, rng: random.Random | None = None, memo: MemoState | None = None
    ) -> Output:
        """The inner mechanism's device path."""
        return self._inner.perturb(value, rng=rng, memo=memo)

    def perturb_batch_longitudinal(self, values: Any, reports: int, rng: Any) -> Any:
        """T reports of ONE value per user (no batch path for sequences)."""
        return self._inner.perturb_batch_longitudinal(values, reports, rng)


def test_any_memo_keeping_mechanism_gets_the_sequence_test_on_the_device_path() -> None:
    """Duck typing on `new_memo`: no batch path for sequences, so the device path only
    (seeded here; the CLI runs the OS CSPRNG). The retired charge fails there too."""
    settings = AuditSettings(
        samples=20_000, device_samples=20_000, reports=2, seed=28, device_rng=random.Random(28)
    )
    report = audit_mechanism(MemoKeeper(), 64, settings)  # type: ignore[arg-type]
    assert report.has_sequences("device") and not report.has_sequences("batch")
    assert any("device path only" in note for note in report.notes)
    assert report.epsilon_lb("device", sequences=True) > 2.0
    assert not report.passed


def test_sound_charge_passes_on_the_os_csprng() -> None:
    """rng=None: exactly what a device runs. False-failure rate <= 1e-6."""
    mech = create("rappor-grr", Decimal(1), 16, {"epsilon_permanent": "2"})
    settings = AuditSettings(samples=2, device_samples=5_000, reports=2, paths=("device",))
    report = audit_mechanism(mech, 16, settings)
    assert report.has_sequences("device")
    assert report.passed, _describe(report)


@pytest.mark.parametrize(
    ("wire_id", "domain", "params", "samples"),
    [
        ("loloha", 16, {"epsilon_permanent": "2"}, 100_000),
        ("dbitflip", (Decimal(0), Decimal(1)), {"epsilon_permanent": "2", "buckets": "8"}, 8_000),
    ],
)
def test_loloha_and_dbitflip_get_the_sequence_test_on_the_batch_path(
    wire_id: str, domain: Any, params: dict[str, str], samples: int
) -> None:
    """Their `perturb_batch_longitudinal(values (n, T), rng)` draws the sequences."""
    mech = create(wire_id, Decimal(1), domain, params)
    assert lg.has_batch_path(mech)
    report = audit_mechanism(mech, domain, batch(samples))
    assert report.has_sequences("batch")
    assert report.passed, _describe(report)
