"""Square Wave (sw): a numeric mechanism for the distribution, not only the mean.

Li, Lee, Clifton, Li, "Estimating Numerical Distributions under Local
Differential Privacy", SIGMOD 2020, Section 4. For v in [0, 1] the continuous
mechanism reports ṽ in [-b, 1 + b] with density p = e^ε / (2 b e^ε + 1) when
|ṽ - v| <= b and q = 1 / (2 b e^ε + 1) elsewhere; b is their closed form
b = (ε e^ε - e^ε + 1) / (2 e^ε (e^ε - 1 - ε)) (`numeric.square_wave_band`).

On the device it runs on the same finite grid as every numeric mechanism here
(numeric.py: clip, exact randomized rounding onto J + 1 levels, one output index
drawn with integer weights, one table double per index), so the realized ratio is
<= a / b <= e^ε exactly and the wire value's bits carry nothing but the index.
Given level j the index law is the discrete square wave, the same banded law as
the piecewise grid (numeric `_PiecewiseGrid`, shared, not copied): N = J + W
cells, cells [j, j + W) weigh a = floor(e^ε 2^P), every other cell b = 2^P,
total Z = W a + J b for every j. W = max(1, round(2 b J)) by default (the band
[v - b, v + b] on cells of width 1/J); the signed params "levels" J and "cells"
N = J + W are written at authoring (`numeric.grid_params`).

Wire values (t units, t = 2(x - lo)/(hi - lo) - 1): the cell centres
y_i = (2 i - (N - 1)) / J, so level j's band is centred on t_j = -1 + 2j/J and
the outputs span [-1 - (W - 1)/J, 1 + (W - 1)/J] (the paper's [-b, 1 + b]).

Statistic: the count of reports per output cell (`CountStatistic`, exact JSON
integers), from which the aggregator reconstructs the distribution over B
buckets with EMS (`fedldp.aggregator.histogram`, the paper's Section 5) using
`transition_matrix`, or the same matrix factored (`transition`,
`BandedTransition`) where it iterates on many count vectors at once.

Mean (`estimate`). The counts also give an unbiased mean: with
u_i = β (i - (N - 1)/2), β = 2Z / (J (a - b) W), E[u | j] = t_j, since the band
sum is affine in j (the same algebra as the piecewise mechanism, Wang et al.,
ICDE 2019, Section III-B; numeric.py). E[u^2 | j] = c0 + c2 t_j^2 with the
grid's (c0, c2), so the variance and its plug-in are numeric.py's, exactly.
`estimate` returns this one-coordinate mean, as every numeric mechanism does;
the histogram is a separate aggregator step.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from fedldp.client.mechanisms.base import (
    CountStatistic,
    Estimate,
    NumericOutput,
    Output,
    OutputDomainError,
)
from fedldp.client.mechanisms.numeric import (
    NumericMechanism,
    OnPiecewiseGrid,
    Weights,
    _PiecewiseGrid,
    grid_size,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt


class SquareWave(OnPiecewiseGrid, NumericMechanism):
    """Li et al.'s Square Wave on N = J + W exact cell centres (module docstring).

    `levels` and `cells` default to the derived grid (`numeric.grid_size`).
    """

    wire_id = "sw"
    _name = "sw"

    def __init__(
        self,
        epsilon: Decimal,
        lo: Decimal,
        hi: Decimal,
        levels: int | None = None,
        cells: int | None = None,
    ) -> None:
        levels, cells = grid_size(self.wire_id, epsilon, levels, cells)
        super().__init__(epsilon, lo, hi, levels)
        self.grid = _PiecewiseGrid(levels, cells, Weights.for_epsilon(epsilon, 2 * cells))
        c0, c2 = self.grid.moments()
        centres = [Fraction(2 * i - (cells - 1), levels) for i in range(cells)]
        self._set_table(centres, c0, c2, unbiased=self.grid.values())
        #: β of u_i = β (i - (N - 1)/2), exact.
        self.step = self.grid.step()

    @property
    def band(self) -> int:
        """W = N - J: the cells of one level's high band."""
        return self.grid.band

    # --- collector: counts per output cell ---

    def new_statistic(self) -> CountStatistic:
        """N zero counts, one per output cell."""
        return CountStatistic(counts=[0] * self.cells)

    def accumulate(self, statistic: CountStatistic, output: Output) -> None:
        """Check one report bit for bit against the table and count its cell."""
        self.check_output(output)
        assert isinstance(output, NumericOutput)
        statistic.counts[self.index_of(output.value)] += 1
        statistic.n += 1

    def accumulate_batch(self, statistic: CountStatistic, outputs: Any) -> None:
        """Count a float64 array of table values (as from `perturb_batch`), bit for bit."""
        import numpy as np

        y = np.ascontiguousarray(outputs, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            raise OutputDomainError("NON_FINITE", "sw output must be a finite double")
        table = self._table_array()  # increasing: the cell centres
        where = np.minimum(np.searchsorted(table, y), table.shape[0] - 1)
        if not np.array_equal(table[where].view(np.uint64), y.view(np.uint64)):
            raise OutputDomainError("OUT_OF_DOMAIN", "sw outputs must be the policy's grid values")
        counts = np.bincount(where, minlength=self.cells)
        statistic.counts = [a + int(b) for a, b in zip(statistic.counts, counts, strict=True)]
        statistic.n += int(y.shape[0])

    def check_counts(self, statistic: CountStatistic) -> None:
        """Refuse a statistic that is not N non-negative integer counts summing to n."""
        counts = statistic.counts
        if len(counts) != self.cells:
            raise ValueError(f"sw statistic must have {self.cells} counts, got {len(counts)}")
        if any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise ValueError("sw counts must be non-negative integers")
        if sum(counts) != statistic.n:
            raise ValueError("sw counts must sum to the number of reports n")

    # --- aggregator ---

    def estimate(self, statistic: CountStatistic) -> Estimate:
        """The unbiased mean from the counts (module docstring), with its plug-in variance.

        Σu = β Σ_i c_i (2i - (N - 1)) / 2 and Σu^2 = β^2 Σ_i c_i (2i - (N - 1))^2 / 4,
        both summed exactly and rounded once.
        """
        self.check_counts(statistic)
        first = second = 0
        for i, count in enumerate(statistic.counts):
            offset = 2 * i - (self.cells - 1)
            first += count * offset
            second += count * offset * offset
        total = float(self.step * first / 2)
        total_sq = float(self.step**2 * second / 4)
        return self._mean_estimate(statistic.n, total, total_sq)

    def transition_matrix(self, buckets: int) -> npt.NDArray[np.float64]:
        """M[i, k] = P(output cell i | x uniform on bucket k of B equal buckets of [lo, hi]).

        Exact in law up to float64: given level j, P(i | j) = (b + (a - b) [j <= i < j + W]) / Z
        (the sampler's weights); given u = J (x - lo)/(hi - lo), the level is
        floor(u) + 1 with probability u - floor(u) (the rounding of numeric.py,
        up to its 2^-K grid), i.e. P(j | u) = max(0, 1 - |u - j|), whose average
        over bucket k is (H(u_{k+1} - j) - H(u_k - j)) / (u_{k+1} - u_k) with H
        the antiderivative of the hat (`_level_law`). Columns sum to 1. Shape (N, B).
        """
        import numpy as np

        levels, cells, band = self.levels, self.cells, self.band
        level_law = self._level_law(buckets)
        cumulative = np.vstack([np.zeros((1, buckets)), np.cumsum(level_law, axis=0)])
        i = np.arange(cells)
        top = np.minimum(i, levels) + 1
        bottom = np.maximum(i - band + 1, 0)
        in_band = cumulative[top] - cumulative[bottom]  # P(j in (i - W, i] | bucket)
        a, b = self.grid.weights.high, self.grid.weights.low
        total = float(self.grid.total)
        matrix = (b + (a - b) * in_band) / total
        return np.asarray(matrix, dtype=np.float64)

    def transition(self, buckets: int) -> BandedTransition:
        """`transition_matrix(buckets)` factored (`BandedTransition`): the same law, with
        products in O((N + B) R) for R columns instead of O(N B R)."""
        a, b = self.grid.weights.high, self.grid.weights.low
        total = float(self.grid.total)
        return BandedTransition.build(
            self._level_law(buckets), self.band, b / total, (a - b) / total
        )

    def _level_law(self, buckets: int) -> npt.NDArray[np.float64]:
        """P(level j | x uniform on bucket k), shape (J + 1, B) (`transition_matrix`)."""
        import numpy as np

        if isinstance(buckets, bool) or not isinstance(buckets, int) or buckets < 1:
            raise ValueError("buckets must be a positive integer")
        levels = self.levels
        edges = np.arange(buckets + 1, dtype=np.float64) * (levels / buckets)
        j = np.arange(levels + 1, dtype=np.float64)[:, None]
        antiderivative = _hat_antiderivative(edges[None, :] - j)  # (J + 1, B + 1)
        return np.asarray(np.diff(antiderivative, axis=1) / np.diff(edges)[None, :])


@dataclass(frozen=True, eq=False)  # array fields: identity, not ==
class BandedTransition:
    """Square Wave's transition matrix M (N x B, `SquareWave.transition_matrix`) factored as

        M = (b 1 1^T + (a - b) A L) / Z,

    L (J + 1, B) the level law (`_level_law`), A (N, J + 1) the band incidence
    A[i, j] = [j <= i < j + W]. L has a few non-zeros per row and per column (the
    levels whose hat meets a bucket), kept as a scipy sparse matrix, and A is a window
    sum of W terms, done with prefix sums; so, for R columns,

        M x = (b Σ_k x_k + (a - b) Σ_{j = i-W+1..i} (L x)_j) / Z,
        M^T y = (b Σ_i y_i + (a - b) (L^T h)_k) / Z,  h_j = Σ_{i = j..j+W-1} y_i,

    cost O((N + B) R) each and agree with the dense products to float64 rounding
    (prefix-sum differences: an absolute error of a few ulps of Σ x, resp. Σ y).
    Needs scipy (the aggregator's), imported by `build`.
    """

    #: (a - b) / Z L, sparse (J + 1, B).
    scaled_levels: Any
    #: W, and b / Z.
    band: int
    low: float

    @classmethod
    def build(
        cls, level_law: npt.NDArray[np.float64], band: int, low: float, high_minus_low: float
    ) -> BandedTransition:
        """From L (J + 1, B), W, b / Z and (a - b) / Z."""
        from scipy import sparse

        return cls(sparse.csr_array(high_minus_low * level_law), band, low)

    @property
    def shape(self) -> tuple[int, int]:
        """(N, B), as the dense matrix's."""
        levels, buckets = self.scaled_levels.shape
        return (int(levels) + self.band - 1, int(buckets))

    def forward(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M x for x of shape (B, R)."""
        import numpy as np

        lx = np.asarray(self.scaled_levels @ x)  # (J + 1, R)
        levels, band = lx.shape[0] - 1, self.band
        # prefix[W + j] = Σ_{j' <= j} (L x)_j', zero before and constant after, so that
        # cell i's window (i - W, i] of levels is prefix[W + i] - prefix[i].
        prefix = np.empty((levels + 2 * band, lx.shape[1]))
        prefix[:band] = 0.0
        np.cumsum(lx, axis=0, out=prefix[band : band + levels + 1])
        prefix[band + levels + 1 :] = prefix[band + levels]
        cells = levels + band
        out: npt.NDArray[np.float64] = prefix[band : band + cells] - prefix[:cells]
        out += self.low * np.sum(x, axis=0)
        return out

    def adjoint(self, y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M^T y for y of shape (N, R)."""
        import numpy as np

        cells = y.shape[0]
        prefix = np.empty((cells + 1, y.shape[1]))
        prefix[0] = 0.0
        np.cumsum(y, axis=0, out=prefix[1:])
        h = prefix[self.band :] - prefix[: cells + 1 - self.band]  # (J + 1, R)
        out: npt.NDArray[np.float64] = np.asarray(self.scaled_levels.T @ h)
        out += self.low * prefix[-1]
        return out


def _hat_antiderivative(s: Any) -> Any:
    """H(s) = ∫_{-∞}^s max(0, 1 - |v|) dv (elementwise)."""
    import numpy as np

    s = np.clip(s, -1.0, 1.0)
    return np.where(s < 0, (s + 1.0) ** 2 / 2.0, 1.0 - (1.0 - s) ** 2 / 2.0)


__all__ = ["BandedTransition", "SquareWave"]
