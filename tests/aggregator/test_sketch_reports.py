"""Sketch policies in the aggregator: candidate files, candidate reports, and the
black-box auditor on a broken sketch (fixed seeds: each outcome is deterministic)."""

from __future__ import annotations

import random
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest
from fedldp.aggregator.audit_ldp import AuditSettings, audit_mechanism
from fedldp.aggregator.audit_ldp.audit import open_inputs
from fedldp.aggregator.sketches import CandidateFileError, candidate_report, read_candidates
from fedldp.client.mechanisms import OpenDomain, create
from fedldp.client.mechanisms._common import PROB_ONE, DyadicProbability, dyadic_from_exp
from fedldp.client.mechanisms.sketch import CMS, Sketch

DOMAIN = OpenDomain(32)


def test_candidate_files(tmp_path: Path) -> None:
    good = tmp_path / "good.txt"
    good.write_bytes(" spaced \r\nplain\n\n😀\n".encode())
    assert read_candidates(good) == [" spaced ", "plain", "😀"]
    for name, data, match in [
        ("latin1.txt", "caf\u00e9\n".encode("latin-1"), "not UTF-8"),
        ("blank.txt", b"\n\r\n", "no candidate"),
    ]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CandidateFileError, match=match):
            read_candidates(tmp_path / name)
    with pytest.raises(CandidateFileError, match="cannot read"):
        read_candidates(tmp_path / "missing.txt")


def test_candidate_report_is_a_frequency_report_over_the_candidates() -> None:
    mech = create("hcms", Decimal(4), DOMAIN, {"rows": "8", "columns": "64"})
    assert isinstance(mech, Sketch)
    words = ["alpha"] * 3000 + ["beta"] * 1000 + [f"w{i}" for i in range(1000)]
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, mech.perturb_batch(words, np.random.default_rng(2)))
    report = candidate_report(mech, statistic, ["alpha", "beta", "gamma"], simultaneous=True)
    assert report.labels == ["alpha", "beta", "gamma"] and report.n == 5000
    assert report.mechanism == "hcms" and report.simultaneous
    alpha = report.by_label("alpha")
    assert alpha.ci_low <= 0.6 <= alpha.ci_high and alpha.z_score > 5
    with pytest.raises(ValueError, match="complete domain"):
        candidate_report(mech, statistic, ["alpha"], consistency="norm-sub")


def test_audit_inputs_differ_in_every_row() -> None:
    mech = create("cms", Decimal(1), DOMAIN, {})
    assert isinstance(mech, Sketch)
    (_, x), (_, y) = open_inputs(mech)
    assert all(a != b for a, b in zip(mech.cells(x), mech.cells(y), strict=True))


class PerBitEpsilonCMS(CMS):
    """Broken: every bit flipped at 1/(1 + e^ε) (ε per bit, not ε/2): two changed bits
    give a ratio of e^{2ε}."""

    def __init__(self, epsilon: Decimal, domain: OpenDomain, rows: int, columns: int) -> None:
        super().__init__(epsilon, domain, rows, columns)
        self.flip = dyadic_from_exp(lambda e: 1 / (e + 1), epsilon, round_up=True)
        self.keep = DyadicProbability(PROB_ONE - self.flip.numerator)


def test_auditor_fails_a_sketch_leaking_twice_its_epsilon() -> None:
    broken = PerBitEpsilonCMS(Decimal(1), DOMAIN, 4, 16)
    settings = AuditSettings(
        samples=200_000, device_samples=3_000, seed=20261201, device_rng=random.Random(14)
    )
    report = audit_mechanism(broken, DOMAIN, settings)
    assert report.epsilon_lb("batch") > 1.2
    assert not report.passed
    honest = audit_mechanism(CMS(Decimal(1), DOMAIN, 4, 16), DOMAIN, settings)
    assert honest.passed and 0.5 < honest.epsilon_lb("batch") <= 1.0
