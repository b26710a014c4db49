"""Square Wave (sw) beyond the shared numeric contract (mech_cases.NUMERIC_CASES,
test_numeric_exact.py): its band is the paper's closed form, its table is the cell
centres, its transition matrix is the sampler's exact law (and its factored form
has the same products), its statistic is exact
counts, its policy params are validated, and two broken variants are caught: a
band weight rounded up (exact ratio above e^ε) and a continuous float output
(not a table value, bits that depend on the input)."""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from fedldp.client.mechanisms import CountStatistic, NumericOutput, OutputDomainError, create
from fedldp.client.mechanisms.numeric import Weights, square_wave_band
from fedldp.client.mechanisms.square_wave import SquareWave
from mech_cases import HI, LO, exp_bounds, numeric_max_ratio, wire_bytes  # type: ignore[import-not-found]
from test_mechanism_contract import assert_numeric_exact_privacy  # type: ignore[import-not-found]

from tests.aggregator.broken_mechanisms import FloatSquareWave


def paper_b(epsilon: float) -> float:
    """Li et al. SIGMOD 2020, Section 4: b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε))."""
    e = math.exp(epsilon)
    return (epsilon * e - e + 1) / (2 * e * (e - 1 - epsilon))


@pytest.mark.parametrize("epsilon", ["0.25", "0.5", "1", "2", "4", "8"])
@pytest.mark.parametrize("levels", [16, 256, 4096])
def test_band_is_the_papers_closed_form_on_the_grid(epsilon: str, levels: int) -> None:
    band = square_wave_band(Decimal(epsilon), levels)
    assert band == max(1, min(levels, round(2 * paper_b(float(epsilon)) * levels)))
    mech = SquareWave(Decimal(epsilon), LO, HI, levels)
    assert (mech.levels, mech.cells, mech.band) == (levels, levels + band, band)


def test_table_is_the_cell_centres_and_the_band_is_centred_on_the_level() -> None:
    mech = SquareWave(Decimal(2), LO, HI, 8, 12)
    assert mech.table == tuple(float(Fraction(2 * i - 11, 8)) for i in range(12))
    for level in range(9):
        band = [i for i, w in enumerate(mech.index_weights(level)) if w == mech.grid.weights.high]
        centre = sum(Fraction(2 * i - 11, 8) for i in band) / len(band)
        assert centre == Fraction(2 * level, 8) - 1  # t_j


def test_transition_matrix_is_the_exact_law_averaged_over_each_bucket() -> None:
    """Column k = the exact index law (`level_law` x `index_weights`) averaged over
    many inputs spread evenly in bucket k."""
    mech = SquareWave(Decimal(1), Decimal(0), Decimal(1), 8, 12)
    buckets = 4
    matrix = mech.transition_matrix(buckets)
    assert matrix.shape == (12, buckets)
    assert np.allclose(matrix.sum(axis=0), 1.0)
    points = 400
    for k in range(buckets):
        law = np.zeros(12)
        for p in range(points):
            x = (k + (p + 0.5) / points) / buckets
            for level, prob in mech.level_law(x):
                w = np.array(mech.index_weights(level), dtype=np.float64)
                law += float(prob) * w / w.sum()
        assert np.allclose(matrix[:, k], law / points, atol=1e-5)


@pytest.mark.parametrize(
    ("epsilon", "levels", "cells", "buckets"),
    [
        ("1", None, None, 256),  # the policy default grid, EMS's fine buckets
        ("4", None, None, 256),
        ("0.5", None, None, 300),  # buckets not a multiple of the levels
        ("2", 32, None, 8),  # several levels per bucket
        ("1", 256, 400, 128),  # a wider band than the default
        ("3", 100, None, 7),
        ("1", 16, None, 1),
        ("1", 8, 12, 4),
    ],
)
def test_banded_transition_has_the_transition_matrixs_products(
    epsilon: str, levels: int | None, cells: int | None, buckets: int
) -> None:
    """`transition(B)` (what EMS iterates with) is `transition_matrix(B)` factored: the
    same shape, M x and M^T y for several columns to float64 rounding."""
    mech = SquareWave(Decimal(epsilon), Decimal(0), Decimal(1), levels, cells)
    matrix, law = mech.transition_matrix(buckets), mech.transition(buckets)
    assert law.shape == matrix.shape
    rng = np.random.default_rng(1)
    x = rng.random((buckets, 3))
    x[:, 0] /= x[:, 0].sum()
    y = rng.random((mech.cells, 3)) * [1.0, 100.0, 1e4]
    np.testing.assert_allclose(law.forward(x), matrix @ x, rtol=1e-13, atol=0)
    np.testing.assert_allclose(law.adjoint(y), matrix.T @ y, rtol=1e-13, atol=0)


def test_statistic_is_exact_counts_and_merges() -> None:
    mech = SquareWave(Decimal(1), LO, HI)
    rng = np.random.default_rng(3)
    batch = mech.perturb_batch(rng.uniform(-3, 7, 500), rng)
    whole = mech.new_statistic()
    mech.accumulate_batch(whole, batch)
    single = mech.new_statistic()
    for y in batch:
        mech.accumulate(single, NumericOutput(float(y)))
    assert single == whole and sum(whole.counts) == whole.n == 500
    assert mech.statistic_from_json(mech.statistic_to_json(whole)) == whole


@pytest.mark.parametrize(
    ("counts", "n", "message"),
    [
        ([1, 2], 3, "counts"),
        (None, -1, "sum"),
        ("negative", 0, "non-negative"),
    ],
)
def test_a_malformed_statistic_is_refused(counts: object, n: int, message: str) -> None:
    mech = SquareWave(Decimal(1), LO, HI, 8, 12)
    if counts is None:
        statistic = CountStatistic([1] * 12, n=13)
    elif counts == "negative":
        statistic = CountStatistic([-1, 1] + [0] * 10, n=0)
    else:
        statistic = CountStatistic(list(counts), n=n)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match=message):
        mech.estimate(statistic)


def test_batch_accumulation_refuses_a_non_table_double() -> None:
    mech = SquareWave(Decimal(1), LO, HI, 8, 12)
    statistic = mech.new_statistic()
    for y, reason in (
        (math.nextafter(mech.table[3], 9.0), "OUT_OF_DOMAIN"),
        ((mech.table[3] + mech.table[4]) / 2, "OUT_OF_DOMAIN"),
        (5.0, "OUT_OF_DOMAIN"),
        (math.nan, "NON_FINITE"),
    ):
        with pytest.raises(OutputDomainError) as info:
            mech.accumulate_batch(statistic, np.array([mech.table[0], y]))
        assert info.value.reason == reason
    assert statistic == mech.new_statistic()  # a refused batch changes nothing


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"levels": "1"}, r"'levels' must be in \[2, 4096\]"),
        ({"levels": "5000"}, r"'levels' must be in \[2, 4096\]"),
        ({"levels": "8", "cells": "8"}, r"'cells' must be in \[levels \+ 1, 2 \* levels\]"),
        ({"levels": "8", "cells": "17"}, r"'cells' must be in \[levels \+ 1, 2 \* levels\]"),
        ({"levels": "-8"}, "plain integer"),
        ({"levels": "8.0"}, "plain integer"),
        ({"cells": "1e3"}, "plain integer"),
        ({"band": "3"}, r"does not take parameter\(s\) \['band'\]"),
    ],
)
def test_bad_policy_params_are_refused_clearly(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create("sw", Decimal(1), (LO, HI), params)


def test_bad_metric_and_range_are_refused() -> None:
    with pytest.raises(ValueError, match="numeric metric"):
        create("sw", Decimal(1), 5)
    with pytest.raises(ValueError, match="lo < hi"):
        create("sw", Decimal(1), (HI, LO))


class RoundedUpSquareWave(SquareWave):
    """Broken: the band weight rounded up, a = floor(e^ε 2^P) + 1 (ratio just above e^ε)."""

    def __init__(self, epsilon: Decimal, levels: int) -> None:
        super().__init__(epsilon, Decimal(0), Decimal(1), levels)
        w = self.grid.weights
        self.grid = type(self.grid)(levels, self.cells, Weights(w.high + 1, w.low))


@pytest.mark.parametrize("epsilon", ["0.5", "1", "4"])
def test_exact_ratio_check_catches_a_band_weight_rounded_up(epsilon: str) -> None:
    assert_numeric_exact_privacy(SquareWave(Decimal(epsilon), LO, HI, 16), Decimal(epsilon))
    broken = RoundedUpSquareWave(Decimal(epsilon), 16)
    ratio = numeric_max_ratio(broken)
    assert ratio is not None and ratio > exp_bounds(Decimal(epsilon))[1]  # above e^ε, exactly
    with pytest.raises(AssertionError, match="exceeds"):
        assert_numeric_exact_privacy(broken, Decimal(epsilon))


def test_a_float_drawn_square_wave_fails_the_wire_check() -> None:
    """Li et al.'s continuous output in floating point: its doubles are not the table,
    the collector check refuses them, and their low bits follow the input."""
    shipped = SquareWave(Decimal(1), Decimal(0), Decimal(1))
    broken = FloatSquareWave(Decimal(1), Decimal(0), Decimal(1))
    table = {wire_bytes(y) for y in shipped.table}
    rng = random.Random(4)
    sent = [broken.perturb(0.3, rng=rng).value for _ in range(200)]
    assert not {wire_bytes(y) for y in sent} <= table
    with pytest.raises(OutputDomainError) as info:
        for y in sent:
            shipped.check_output(NumericOutput(y))
    assert info.value.reason == "OUT_OF_DOMAIN"
    shipped_sent = {wire_bytes(shipped.perturb(0.3, rng=rng).value) for _ in range(200)}
    assert shipped_sent <= table
