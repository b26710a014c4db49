"""A numeric metric's distribution from Square Wave counts: EMS with bootstrap bands.

Reconstruction (Li, Lee, Clifton, Li, SIGMOD 2020, Section 5, "EMS"). The
range [lo, hi] is cut into D = B ceil(`FINE_BUCKETS` / B) equal fine buckets
(the paper reconstructs at a fine resolution too; smoothing there costs little
bias) and the unknown distribution x over them (uniform within a bucket) is
fitted to the counts c_i of the N output cells by maximum likelihood,
c ~ Multinomial(n, M x) with M the mechanism's own transition matrix
(`SquareWave.transition_matrix`; the aggregator never re-derives the
mechanism's law). Each iteration is one EM step

    x_k <- x_k Σ_i M[i, k] c_i / (n (M x)_i)

followed by the smoothing step of EMS: x <- S x with the binomial kernel
(1, 2, 1)/4, (2, 1)/3 and (1, 2)/3 at the two ends, then renormalized. It stops
when the mean log-likelihood per report, (1/n) Σ_i c_i log (M x)_i, rises by
less than `TOLERANCE` in one iteration, or after `MAX_ITERATIONS` (our choices,
stated here; smoothing makes EMS converge quickly). M x and M^T y are the
products one step needs: the fit of one count vector takes them from the dense
matrix, the bootstrap's R refits from M factored (`SquareWave.transition`: a
band of W cells over a level law with a few levels per bucket, O((N + D) R) per
step instead of O(N D R); the same products to float64 rounding). The result is a
distribution: non-negative, summing to 1; the reported histogram sums it into
the B requested buckets (D / B fine buckets each). Its mean is Σ_k x_k m_k over the bucket
midpoints m_k, reported beside the mechanism's own unbiased mean
(`SquareWave.estimate`).

Uncertainty bands: a parametric bootstrap (Efron and Tibshirani, "An
Introduction to the Bootstrap", 1993, Sections 6.5 and 13.3). R replicate count
vectors are drawn from Multinomial(n, M x̂) with a numpy Generator seeded by the
caller's `seed` and EMS is rerun on each (`bootstrap_band`). The band of bucket
k (and of the mean) is the UNION of the two standard bootstrap intervals at
level `confidence`, α = 1 - confidence, q_a the a-quantile of the replicates:
the percentile interval [q_(α/2), q_(1-α/2)] and the "basic" interval
[2 x̂ - q_(1-α/2), 2 x̂ - q_(α/2)] (Davison and Hinkley, "Bootstrap Methods and
their Application", 1997, Section 5.2), clipped to [0, 1] (the mean's to [lo,
hi]). Why the union: the basic interval subtracts the bootstrap's estimate of
EMS's smoothing bias, measured around x̂; but x̂ is itself smoothed and its
bumps are partly noise, so that estimate points away from the truth as often
as towards it, and the basic interval alone covered 64-88 % at ε ≤ 2 for a
nominal 90 % (the percentile interval alone: no better). Covering both — a band
symmetric about x̂ with the larger of the two half-widths — is what the band
claims: pointwise (per bucket, not simultaneous) coverage of the true bucket
frequencies of the reporting population, measured, not proven: medians over
runs in `python -m bench.numeric_distribution --coverage` (docs/figures.md) and
on fixed seeds in tests/aggregator/test_histogram.py (ε = 2, where the basic
band alone fails). It is wider than either interval (about 25-30 % at ε = 2).
Deterministic given (counts, B, confidence, R, seed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from fedldp.client.mechanisms.base import CountStatistic
    from fedldp.client.mechanisms.square_wave import SquareWave

#: EMS stops when the mean log-likelihood per report rises by less than this.
TOLERANCE = 1e-8
#: EMS reconstructs on at least this many fine buckets (a multiple of B).
FINE_BUCKETS = 256
#: EMS stops after this many iterations at most.
MAX_ITERATIONS = 5000
#: Default buckets of the reported histogram, bootstrap replicates and seed.
DEFAULT_BUCKETS = 32
DEFAULT_REPLICATES = 100
DEFAULT_SEED = 0
#: Replicates fitted together (one block bounds the memory of the refits).
_CHUNK = 128
#: Bounds on what a caller may ask for (memory and time of the analysis).
MAX_BUCKETS = 1024
MAX_REPLICATES = 10_000


@dataclass(frozen=True)
class Histogram:
    """The EMS histogram over B equal buckets of [lo, hi] with bootstrap bands.

    `frequencies[k]` is the estimated fraction of users in bucket k (they sum to
    1); `band_low[k]`, `band_high[k]` its percentile band at `confidence`
    (pointwise); `mean` the mean of the reconstructed distribution (bucket
    midpoints) with its band `mean_low`, `mean_high`. `replicates` and `seed`
    reproduce the bands.
    """

    edges: tuple[float, ...]
    frequencies: tuple[float, ...]
    band_low: tuple[float, ...]
    band_high: tuple[float, ...]
    confidence: float
    mean: float
    mean_low: float
    mean_high: float
    iterations: int
    replicates: int
    seed: int

    @property
    def buckets(self) -> int:
        """B."""
        return len(self.frequencies)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (docs/aggregator.md, "histogram")."""
        return {
            "method": "ems",
            "edges": list(self.edges),
            "frequencies": list(self.frequencies),
            "band_low": list(self.band_low),
            "band_high": list(self.band_high),
            "confidence": self.confidence,
            "band_method": "parametric-bootstrap-basic-percentile-union",
            "replicates": self.replicates,
            "seed": self.seed,
            "mean": self.mean,
            "mean_low": self.mean_low,
            "mean_high": self.mean_high,
            "iterations": self.iterations,
        }


def _smooth(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """S x along axis 0 (`smoothing_matrix`), as a stencil."""
    import numpy as np

    if x.shape[0] == 1:
        return x
    out = np.empty_like(x)
    out[1:-1] = (x[:-2] + 2 * x[1:-1] + x[2:]) / 4
    out[0] = (2 * x[0] + x[1]) / 3
    out[-1] = (x[-2] + 2 * x[-1]) / 3
    return out


def smoothing_matrix(buckets: int) -> npt.NDArray[np.float64]:
    """S: the binomial (1, 2, 1)/4 kernel, (2, 1)/3 and (1, 2)/3 at the ends (B x B)."""
    import numpy as np

    s = np.zeros((buckets, buckets))
    if buckets == 1:
        s[0, 0] = 1.0
        return s
    for k in range(buckets):
        for d, w in ((-1, 1.0), (0, 2.0), (1, 1.0)):
            if 0 <= k + d < buckets:
                s[k, k + d] = w
    return np.asarray(s / s.sum(axis=1, keepdims=True), dtype=np.float64)


class Transition(Protocol):
    """The products EMS needs of a transition matrix M (N x B): a dense matrix
    (`DenseTransition`) or Square Wave's factored one (`SquareWave.transition`)."""

    @property
    def shape(self) -> tuple[int, int]:
        """(N, B)."""
        ...

    def forward(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M x, x of shape (B, R)."""
        ...

    def adjoint(self, y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M^T y, y of shape (N, R)."""
        ...


@dataclass(frozen=True, eq=False)  # array fields: identity, not ==
class DenseTransition:
    """A dense transition matrix M (N x B) as a `Transition`."""

    matrix: npt.NDArray[np.float64]

    @property
    def shape(self) -> tuple[int, int]:
        """(N, B)."""
        rows, columns = self.matrix.shape
        return (int(rows), int(columns))

    def forward(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M x."""
        return self.matrix @ x

    def adjoint(self, y: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """M^T y."""
        transposed: npt.NDArray[np.float64] = self.matrix.T
        return transposed @ y


def ems(
    counts: npt.NDArray[np.float64] | npt.NDArray[np.int64],
    matrix: npt.NDArray[np.float64] | Transition,
    *,
    tolerance: float = TOLERANCE,
    max_iterations: int = MAX_ITERATIONS,
) -> tuple[npt.NDArray[np.float64], int]:
    """EMS (module docstring) on one count vector (N,) or many as columns (N, R).

    `matrix` is M dense (N, B) or any `Transition` with M's products (the same
    iterates, to float64 rounding). Returns (x, iterations): x of shape (B,) or
    (B, R), each column a distribution; every column iterates until its own
    log-likelihood gain is below `tolerance` (a converged column is frozen).
    """
    import numpy as np

    law_of = matrix if not isinstance(matrix, np.ndarray) else DenseTransition(matrix)
    c = np.asarray(counts, dtype=np.float64)
    single = c.ndim == 1
    c = c[:, None] if single else c
    cells, buckets = law_of.shape
    if c.shape[0] != cells:
        raise ValueError(f"{c.shape[0]} counts for a transition matrix with {cells} cells")
    n = c.sum(axis=0)
    if np.any(n <= 0):
        raise ValueError("cannot reconstruct a distribution from zero reports")
    x = np.full((buckets, c.shape[1]), 1.0 / buckets)
    mx = law_of.forward(x)  # the law of the outputs under x, kept from step to step
    active = np.ones(c.shape[1], dtype=bool)
    previous = np.full(c.shape[1], -np.inf)
    iterations = 0
    while iterations < max_iterations and active.any():
        iterations += 1
        index = np.flatnonzero(active)
        # Views while every column iterates, copies of the active ones after.
        cols = slice(None) if index.shape[0] == active.shape[0] else index
        ca, na = c[:, cols], n[cols]
        step = _smooth(x[:, cols] * law_of.adjoint(ca / mx[:, cols]) / na)
        step /= step.sum(axis=0, keepdims=True)
        law = law_of.forward(step)
        loglik = np.sum(ca * np.log(law), axis=0) / na
        x[:, cols], mx[:, cols] = step, law
        active[index[loglik - previous[cols] < tolerance]] = False
        previous[cols] = loglik
    result = x[:, 0] if single else x
    return np.asarray(result, dtype=np.float64), iterations


def _check_request(buckets: int, confidence: float, replicates: int, seed: int) -> None:
    for name, value, top in (
        ("buckets", buckets, MAX_BUCKETS),
        ("replicates", replicates, MAX_REPLICATES),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise ValueError(f"{name} must be an integer in [1, {top}]")
    if not (isinstance(confidence, float | int) and 0.0 < float(confidence) < 1.0):
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError("seed must be a non-negative integer")


def replicate_counts(
    n: int, probabilities: npt.NDArray[np.float64], replicates: int, rng: np.random.Generator
) -> npt.NDArray[np.float64]:
    """R bootstrap count vectors from Multinomial(n, probabilities), as columns (N, R)."""
    import numpy as np

    draws = rng.multinomial(n, probabilities / probabilities.sum(), size=replicates)
    return np.asarray(draws.T, dtype=np.float64)


def bootstrap_band(
    estimate: npt.NDArray[np.float64], replicates: npt.NDArray[np.float64], confidence: float
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """(low, high) per row: the union of the percentile and basic bootstrap intervals
    (module docstring) of `estimate` (K,) from `replicates` (K, R); not clipped."""
    import numpy as np

    alpha = 1.0 - float(confidence)
    q_low, q_high = np.quantile(replicates, [alpha / 2, 1 - alpha / 2], axis=1)
    low = np.minimum(q_low, 2 * estimate - q_high)
    high = np.maximum(q_high, 2 * estimate - q_low)
    return np.asarray(low, dtype=np.float64), np.asarray(high, dtype=np.float64)


@dataclass(frozen=True)
class Bootstrap:
    """EMS's bucket frequencies `fitted` (B,), its R bootstrap refits `replicates` (B, R)
    (module docstring) and the iterations of the fit."""

    fitted: npt.NDArray[np.float64]
    replicates: npt.NDArray[np.float64]
    iterations: int


def bootstrap(
    mechanism: SquareWave,
    statistic: CountStatistic,
    *,
    buckets: int,
    replicates: int,
    seed: int,
) -> Bootstrap:
    """EMS on the statistic, summed into `buckets`, and `replicates` parametric-bootstrap
    refits drawn with a Generator seeded by `seed` (module docstring)."""
    import numpy as np

    mechanism.check_counts(statistic)
    if statistic.n <= 0:
        raise ValueError("cannot reconstruct a distribution from zero reports")
    per_bucket = -(-FINE_BUCKETS // buckets)
    # One column: the dense matrix (one matrix-vector product per step beats the
    # factored law's dozen small numpy calls); the R refits: the factored law.
    matrix = mechanism.transition_matrix(buckets * per_bucket)
    counts = np.asarray(statistic.counts, dtype=np.float64)
    fine, iterations = ems(counts, matrix)
    draws = replicate_counts(statistic.n, matrix @ fine, replicates, np.random.default_rng(seed))
    law = mechanism.transition(buckets * per_bucket)
    boot_fine = np.hstack(
        [ems(draws[:, k : k + _CHUNK], law)[0] for k in range(0, replicates, _CHUNK)]
    )
    return Bootstrap(
        fitted=np.asarray(fine.reshape(buckets, per_bucket).sum(axis=1), dtype=np.float64),
        replicates=np.asarray(
            boot_fine.reshape(buckets, per_bucket, replicates).sum(axis=1), dtype=np.float64
        ),
        iterations=iterations,
    )


def histogram(
    mechanism: SquareWave,
    statistic: CountStatistic,
    *,
    buckets: int = DEFAULT_BUCKETS,
    confidence: float = 0.95,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = DEFAULT_SEED,
) -> Histogram:
    """The EMS histogram of a Square Wave statistic with parametric-bootstrap bands."""
    import numpy as np

    _check_request(buckets, confidence, replicates, seed)
    fit = bootstrap(mechanism, statistic, buckets=buckets, replicates=replicates, seed=seed)
    fitted, boot, iterations = fit.fitted, fit.replicates, fit.iterations
    lo, hi = float(mechanism.lo), float(mechanism.hi)
    edges = lo + (hi - lo) * np.arange(buckets + 1) / buckets
    edges[-1] = hi
    mids = (edges[:-1] + edges[1:]) / 2
    low, high = bootstrap_band(fitted, boot, confidence)
    low, high = np.clip(low, 0.0, 1.0), np.clip(high, 0.0, 1.0)
    mean = float(mids @ fitted)
    m_low, m_high = bootstrap_band(np.array([mean]), (mids @ boot)[None, :], confidence)
    mean_low = min(max(float(m_low[0]), lo), hi)
    mean_high = min(max(float(m_high[0]), lo), hi)
    return Histogram(
        edges=tuple(float(e) for e in edges),
        frequencies=tuple(float(f) for f in fitted),
        band_low=tuple(float(v) for v in low),
        band_high=tuple(float(v) for v in high),
        confidence=float(confidence),
        mean=mean,
        mean_low=float(mean_low),
        mean_high=float(mean_high),
        iterations=iterations,
        replicates=replicates,
        seed=seed,
    )


def wasserstein_to_sample(
    edges: Any, frequencies: Any, values: Any, *, points: int = 4096
) -> float:
    """W1 between a histogram (uniform within buckets) and the empirical law of `values`.

    W1 = ∫ |F̂(x) - F(x)| dx over [edges[0], edges[-1]] (Vallender 1974), by the
    midpoint rule on `points` equal steps; values are clipped to the range.
    """
    import numpy as np

    e = np.asarray(edges, dtype=np.float64)
    f = np.asarray(frequencies, dtype=np.float64)
    lo, hi = float(e[0]), float(e[-1])
    width = (hi - lo) / points
    grid = lo + width * (np.arange(points) + 0.5)
    estimated = np.interp(grid, e, np.concatenate([[0.0], np.cumsum(f)]))
    sample = np.sort(np.clip(np.asarray(values, dtype=np.float64), lo, hi))
    empirical = np.searchsorted(sample, grid, side="right") / sample.shape[0]
    return float(np.sum(np.abs(estimated - empirical)) * width)


def point_mass_wasserstein(mean: float, values: Any) -> float:
    """W1 between a point mass at `mean` and the empirical law of `values`: mean |x - m|."""
    import numpy as np

    return float(np.mean(np.abs(np.asarray(values, dtype=np.float64) - mean)))


__all__ = [
    "Bootstrap",
    "DenseTransition",
    "Histogram",
    "Transition",
    "bootstrap",
    "bootstrap_band",
    "ems",
    "histogram",
    "point_mass_wasserstein",
    "replicate_counts",
    "smoothing_matrix",
    "wasserstein_to_sample",
]
