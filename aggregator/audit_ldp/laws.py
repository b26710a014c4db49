"""Law checks: does the shipped sampler follow the law the mechanism declares?

An ε bound cannot see a sampler that is noisier than claimed, yet the
estimator and its variance assume the declared law, so the auditor also tests
it, on the first report of each simulated user (its marginal law is the
mechanism's at the per-report ε, memoized or not):

* frequency oracles — for each audited value v, the rate of reports supporting
  v against the declared p* (v = the input) or q* (exact two-sided binomial test;
  the support counts are the mechanism's own `accumulate_batch` and
  `support_counts`, so the collector's counting is exercised too);
* PEM (group-hashed reports) — for each audited string v, the rate of reports
  supporting v's prefix at their group's length against the declared mean over
  the groups of p* or 1/g (`PEM.support_rate`; exact two-sided binomial test);
* category reports with at most `MAX_CHI_SQUARE_CELLS` values — the output
  histogram against `output_probability` (Pearson's chi-square);
* sketches (CMS, HCMS) — for each audited string v, the rate of reports
  supporting v (`features.sketch_supports`) against the declared
  (1/k) Σ_j (p if h_j(v) = h_j(x) else q), q = CMS's flip probability or 1/2
  for HCMS (exact two-sided binomial test);
* numeric mechanisms (finite wire table, `numeric.NumericMechanism`) — the
  histogram of the wire values, matched bit for bit to the table, against the
  exact law `level_law` x `index_weights` (chi-square; a value outside the
  table has declared probability 0 and fails).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from fedldp.aggregator.audit_ldp import stats
from fedldp.aggregator.audit_ldp.features import sketch_supports
from fedldp.aggregator.audit_ldp.sampling import Reports
from fedldp.client.mechanisms.base import CategoryOutput, Mechanism
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.mechanisms.pem import PEM
from fedldp.client.mechanisms.sketch import CMS, Sketch

if TYPE_CHECKING:
    import numpy.typing as npt

#: Largest category output range compared with its declared law by chi-square.
MAX_CHI_SQUARE_CELLS = 1024


@dataclass(frozen=True)
class LawTest:
    """One test of one input's reports; `p_value(reports)` runs it."""

    name: str
    p_value: Callable[[Reports], float]


def _cell(mech: FrequencyOracle, value: Any) -> int:
    """The support-count cell of a value: its bucket for a bucketed numeric oracle."""
    bucket = getattr(mech, "bucket", None)
    return int(bucket(value)) if callable(bucket) else int(value)


def _support_p_value(mech: FrequencyOracle, v: int, rate: float, reports: Reports) -> float:
    statistic = mech.new_statistic()
    mech.accumulate_batch(statistic, reports.columns[0])
    support = int(mech.support_counts(statistic)[v])
    return stats.binomial_p_value(support, reports.n, rate)


def _prefix_support_p_value(mech: PEM, v: str, rate: float, reports: Reports) -> float:
    support = int(mech.supports_batch(reports.columns[0], v).sum())
    return stats.binomial_p_value(support, reports.n, rate)


def _category_p_value(mech: FrequencyOracle, x: int, reports: Reports) -> float:
    size = mech.statistic_size()
    observed = np.bincount(np.asarray(reports.columns[0], dtype=np.int64), minlength=size)
    declared = np.array([mech.output_probability(x, CategoryOutput(o)) for o in range(size)])
    return stats.chi_square_p_value(observed, declared)


def sketch_support_rate(mech: Sketch, v: str, x: str) -> float:
    """Declared P[a report of x supports v]: (1/k) Σ_j (p if h_j(v) = h_j(x) else q)."""
    p = float(mech.keep)
    q = float(mech.flip) if isinstance(mech, CMS) else 0.5
    same = sum(a == b for a, b in zip(mech.cells(v), mech.cells(x), strict=True))
    return (same * p + (mech.k - same) * q) / mech.k


def _sketch_p_value(mech: Sketch, v: str, rate: float, reports: Reports) -> float:
    support = int(sketch_supports(reports, v, mech).sum())
    return stats.binomial_p_value(support, reports.n, rate)


def table_law(
    mech: NumericMechanism, x: float
) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64]]:
    """(distinct wire bit patterns, sorted; their declared probabilities) for input x.

    P[index i | x] = Σ_j P(level j | x) W(i | j) / Σ_i' W(i' | j); table values that
    coincide as doubles add up.
    """
    probabilities = np.zeros(len(mech.table))
    for level, p_level in mech.level_law(x):
        weights = np.array(mech.index_weights(level), dtype=np.float64)
        probabilities += float(p_level) * weights / weights.sum()
    patterns = np.array(mech.table, dtype=np.float64).view(np.uint64)
    distinct, inverse = np.unique(patterns, return_inverse=True)
    summed = np.bincount(inverse, weights=probabilities, minlength=distinct.shape[0])
    return distinct, np.asarray(summed, dtype=np.float64)


def _table_p_value(mech: NumericMechanism, x: float, reports: Reports) -> float:
    distinct, declared = table_law(mech, x)
    bits = np.asarray(reports.columns[0], dtype=np.uint64)
    where = np.minimum(np.searchsorted(distinct, bits), distinct.shape[0] - 1)
    if not np.array_equal(distinct[where], bits):
        return 0.0  # a wire value outside the declared table
    return stats.chi_square_p_value(np.bincount(where, minlength=distinct.shape[0]), declared)


def law_tests(
    mech: Mechanism,  # type: ignore[type-arg]
    kind: str,
    inputs: list[tuple[str, Any]],
    x: Any,
) -> list[LawTest]:
    """The law tests of the reports of input `x` (empty when nothing is declared)."""
    if isinstance(mech, FrequencyOracle):
        tests = []
        for label, v in inputs:
            # A bucketed numeric oracle (dbitflip) counts support per bucket.
            cell, x_cell = _cell(mech, v), _cell(mech, x)
            rate = mech.support_p if cell == x_cell else mech.support_q
            test = partial(_support_p_value, mech, cell, rate)
            tests.append(LawTest(f"supports {label}: rate = {rate:.6g}", test))
        if kind == "category" and mech.statistic_size() <= MAX_CHI_SQUARE_CELLS:
            tests.append(LawTest("output law (chi-square)", partial(_category_p_value, mech, x)))
        return tests
    if isinstance(mech, NumericMechanism):
        return [LawTest("wire table law (chi-square)", partial(_table_p_value, mech, x))]
    if isinstance(mech, Sketch):
        tests = []
        for label, v in inputs:
            rate = sketch_support_rate(mech, v, x)
            test = partial(_sketch_p_value, mech, v, rate)
            tests.append(LawTest(f"supports {label}: rate = {rate:.6g}", test))
        return tests
    if isinstance(mech, PEM):
        tests = []
        for label, v in inputs:
            rate = mech.support_rate(v, x)
            test = partial(_prefix_support_p_value, mech, v, rate)
            tests.append(LawTest(f"supports the prefix of {label}: rate = {rate:.6g}", test))
        return tests
    return []
