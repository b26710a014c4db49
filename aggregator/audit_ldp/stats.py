"""The statistics of a black-box ε audit: Clopper–Pearson bounds, event selection, law tests.

A mechanism M is ε-LDP when P[M(x) ∈ E] <= e^ε P[M(x') ∈ E] for every pair of
inputs and every event E. Given n reports of x and n of x' and an event E fixed
*before* looking at them, the exact binomial (Clopper–Pearson) bounds

    p_lo <= P[M(x) ∈ E],    P[M(x') ∈ E] <= p_hi,

each holding with probability >= 1 - β, give ε >= ln(p_lo / p_hi) with
probability >= 1 - 2β (Clopper and Pearson, Biometrika 1934; the audit recipe
of Jagielski, Ullman, Oprea, NeurIPS 2020, Section 3, and of Ding, Wang, Wang,
Zhang, Kifer, "Detecting Violations of Differential Privacy", CCS 2018,
Section 4: choose the event on one half of the samples, bound it on a fresh
half). The event searched for on the first half is a likelihood-ratio threshold
set (the keys sorted by their estimated ratio; Neyman–Pearson lemma): the prefix
whose bound, evaluated on the first half, is largest.

Law tests compare a sampler with the law the mechanism declares: an exact
two-sided binomial test of a support rate (scipy.stats.binomtest) and Pearson's
chi-square over outputs, cells with expected count below 5 pooled (Cochran's
rule, Cochran 1954).

All levels are per test; the caller applies Bonferroni across the tests it runs.
The Clopper–Pearson bounds themselves live in aggregator/intervals.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

# cp_lower and cp_upper stay part of this module's interface (their home: intervals.py).
from fedldp.aggregator.intervals import cp_lower as cp_lower
from fedldp.aggregator.intervals import cp_upper as cp_upper
from scipy import stats

if TYPE_CHECKING:
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]
    FloatArray = npt.NDArray[np.float64]

#: Cells with a smaller expected count are pooled before a chi-square test (Cochran 1954).
MIN_EXPECTED = 5.0


def log_ratio_bound(
    hits: IntArray | int, misses: IntArray | int, n: int, level: float
) -> FloatArray:
    """ln(cp_lower(hits) / cp_upper(misses)): -inf when `hits` is 0."""
    with np.errstate(divide="ignore"):
        return np.asarray(
            np.log(cp_lower(hits, n, level)) - np.log(cp_upper(misses, n, level)),
            dtype=np.float64,
        )


@dataclass(frozen=True)
class Event:
    """A set of output keys, oriented: it is likelier under the `forward` input."""

    keys: IntArray
    forward: bool
    #: Its bound on the selection half (what the choice maximized).
    selection_bound: float


@dataclass(frozen=True)
class Histogram:
    """The distinct keys of n samples (sorted) and how often each occurs."""

    keys: IntArray
    counts: IntArray
    n: int


def histogram(keys: IntArray) -> Histogram:
    """The histogram of one input's keys."""
    distinct, counts = np.unique(keys, return_counts=True)
    return Histogram(distinct, counts.astype(np.int64), int(keys.shape[0]))


def _on(universe: IntArray, h: Histogram) -> IntArray:
    """`h`'s counts on `universe` (sorted, containing every key of `h`)."""
    counts = np.zeros(universe.shape[0], dtype=np.int64)
    counts[np.searchsorted(universe, h.keys)] = h.counts
    return counts


def _best_prefix(
    universe: IntArray, hits: IntArray, misses: IntArray, n: int, level: float
) -> tuple[IntArray, float]:
    """The likelihood-ratio threshold set with the largest bound, and that bound.

    The bound of prefix i, ln cp_lower(H_i) - ln cp_upper(M_i) (H, M the cumulative
    hits and misses), is increasing in H_i and decreasing in M_i, so only the prefixes
    that no other prefix dominates are evaluated: those whose last key has hits
    (else prefix i - 1 has the same H and no more misses) and whose next key has
    misses (else prefix i + 1 has more hits and the same M). The first maximum over
    these is the first maximum over all prefixes. With no hits at all every bound is
    -inf and the first prefix is taken."""
    order = np.argsort(-(hits + 0.5) / (misses + 0.5), kind="stable")
    h, m = hits[order], misses[order]
    candidates = np.flatnonzero((h > 0) & np.append(m[1:] > 0, True))
    if candidates.shape[0] == 0:
        candidates = np.zeros(1, dtype=np.int64)
    bounds = log_ratio_bound(np.cumsum(h)[candidates], np.cumsum(m)[candidates], n, level)
    best = int(np.argmax(bounds))
    return universe[order[: int(candidates[best]) + 1]], float(bounds[best])


def select_event(x: Histogram, y: Histogram, level: float) -> Event:
    """Choose, on selection samples of x and of x' (same size), the event to bound.

    Both orientations are tried (E likelier under x, or under x'); the better wins.
    """
    if x.n != y.n:
        raise ValueError("selection samples of both inputs must have the same size")
    universe = np.union1d(x.keys, y.keys)
    cx, cy = _on(universe, x), _on(universe, y)
    fwd_keys, fwd = _best_prefix(universe, cx, cy, x.n, level)
    bwd_keys, bwd = _best_prefix(universe, cy, cx, x.n, level)
    if fwd >= bwd:
        return Event(fwd_keys, True, fwd)
    return Event(bwd_keys, False, bwd)


@dataclass(frozen=True)
class EventBound:
    """An event's counts on the fresh estimation half and the ε lower bound they give."""

    hits: int
    misses: int
    n: int
    epsilon_lb: float


def bound_event(event: Event, keys_x: IntArray, keys_y: IntArray, level: float) -> EventBound:
    """Count `event` on fresh samples of x and x' and bound ε (each CP bound at `level`)."""
    if keys_x.shape != keys_y.shape:
        raise ValueError("estimation samples of both inputs must have the same size")
    in_x = int(np.count_nonzero(np.isin(keys_x, event.keys)))
    in_y = int(np.count_nonzero(np.isin(keys_y, event.keys)))
    hits, misses = (in_x, in_y) if event.forward else (in_y, in_x)
    n = keys_x.shape[0]
    return EventBound(hits, misses, n, float(log_ratio_bound(hits, misses, n, level)))


def binomial_p_value(successes: int, n: int, p: float) -> float:
    """Exact two-sided binomial test of P[success] = p."""
    return float(stats.binomtest(successes, n, p).pvalue)


def chi_square_p_value(observed: IntArray, probabilities: FloatArray) -> float:
    """Pearson's chi-square goodness of fit, cells of expected count < 5 pooled.

    `probabilities` is the declared law over the same cells (it must sum to 1
    within rounding). With fewer than two cells after pooling the test is vacuous (1.0).
    """
    n = int(observed.sum())
    expected = probabilities * n / probabilities.sum()
    if np.any((expected == 0) & (observed > 0)):
        return 0.0  # an output the declared law says is impossible
    small = expected < MIN_EXPECTED
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    if obs.shape[0] < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)
