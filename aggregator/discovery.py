"""Heavy-hitter discovery over an open string domain from PEM reports.

Wang, Li, Lin, Jha, "Locally Differentially Private Heavy Hitter
Identification", IEEE TDSC 2019, Section IV (Prefix Extending Method); the
mechanism, its groups, hash family and per-group estimator are
`fedldp.client.mechanisms.pem`. Discovery walks the groups in order:

* level 0: the candidates are every prefix of ℓ_0 = start_bits + step_bits
  bits (2^ℓ_0 of them);
* level j > 0: the candidates are the survivors of level j - 1, each extended
  by every one of the 2^step_bits possible next bits, in increasing prefix
  value (so the previous level's rank never breaks a tie);
* each candidate x is estimated from group j's reports alone (f̂_x, unbiased,
  `PEM.estimate_prefixes`).

Threshold rule (fixed; the same for every level and every policy). With C_j
candidates at level j and n_j reports in group j: when no user's prefix is x
(H0: f_x = 0) each report supports x independently with probability exactly
q = 1/g (the hash family is strongly universal), so the support count C(x) is
exactly Binomial(n_j, q). With c_j the (1 - α/C_j) quantile of that law (the
smallest c with P[C > c] <= α / C_j), a candidate survives when

    C(x) > c_j,  i.e.  f̂_x > (c_j / n_j - q) / (p - q)     (Bonferroni over C_j)

and, of those, at most `top` T with the largest estimates survive (sort key
(-f̂_x, x): ties at the cut go to the smaller prefix, and the survivors are
listed largest estimate first, equal estimates smaller prefix first).
α = `DEFAULT_ALPHA` = 0.05 and T = `DEFAULT_TOP` = 32 unless the analyst states
others. So at each level the chance that any candidate
nobody holds survives is at most α, exactly (no normal approximation: with
few reports per group and a large g, one chance collision would pass a z
test); T bounds the analysis cost (C_j <= T · 2^step_bits) and the report
length.

Result. The survivors of the last level are whole padded strings; each is
decoded (the zero bytes at its end removed; a candidate that is empty, holds a
zero byte before its end or is not UTF-8 is not a possible value and is
dropped). Its estimate is the last group's f̂ (the fraction of ALL users, since
groups are a uniform sample; the count is n · f̂), its variance the
local-hashing term at the clipped estimate plus the group-sampling term
(`PEM.estimate_prefixes` with population n), and its interval
f̂ ± z_{1-(1-confidence)/2} · SE clipped to [0, 1]. The same reports select and
estimate the last level, so the estimates of the strings found are biased
upward near the threshold (selection); the interval is per string, not
simultaneous, and does not cover strings that were not found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from fedldp.aggregator.estimation import (
    FrequencyReport,
    ReportContext,
    frequency_report_from_estimate,
)
from fedldp.client.mechanisms._common import support_variance
from fedldp.client.mechanisms.base import Estimate
from fedldp.client.mechanisms.pem import PEM, GroupReports

if TYPE_CHECKING:
    import numpy.typing as npt

#: Family-wise false-keep rate per level (Bonferroni over the level's candidates).
DEFAULT_ALPHA = 0.05
#: Most prefixes kept per level (and strings reported).
DEFAULT_TOP = 32


@dataclass(frozen=True)
class Level:
    """What one level of discovery did."""

    group: int
    prefix_bits: int
    reports: int
    candidates: int
    threshold: float
    kept: int


@dataclass(frozen=True)
class Discovery:
    """The strings found (largest estimate first) with their estimate, and each level's trace."""

    strings: tuple[str, ...]
    estimate: Estimate
    levels: tuple[Level, ...]
    dropped: int
    alpha: float
    top: int


def threshold(mech: PEM, n_j: int, candidates: int, alpha: float) -> float:
    """The level's keep threshold on f̂: the (1 - α/C) quantile c of Binomial(n_j, 1/g)
    as an estimate, (c/n_j - q)/(p - q) (module docstring)."""
    from scipy.stats import binom

    q = mech.support_q
    cut = float(binom.ppf(1.0 - alpha / candidates, n_j, q))
    return (cut / n_j - q) / (mech.p - q)


def _select(values: npt.NDArray[np.float64], cut: float, top: int) -> npt.NDArray[np.intp]:
    """Indices of the estimates above `cut`, the `top` largest, by (-value, index): with the
    candidates in increasing prefix value, ties go to the smaller prefix."""
    above = np.flatnonzero(values > cut)
    order = np.lexsort((above, -values[above]))
    return np.asarray(above[order][:top], dtype=np.intp)


def _decode(mech: PEM, prefix: int) -> str | None:
    """The string of a full-length prefix, or None when it is not a possible value."""
    data = prefix.to_bytes(mech.max_bytes, "big").rstrip(b"\x00")
    if not data or b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


#: (report, parent) pairs per block of `level_counts`: its uint64 temporaries (1 MiB
#: each) stay in a core's cache across the passes over them.
_BLOCK_PAIRS = 1 << 17


def level_counts(
    mech: PEM, statistic: GroupReports, group: int, parents: list[int]
) -> npt.NDArray[np.int64]:
    """Support counts C(x) of group `group`'s candidates: every (ℓ_group - step)-bit
    prefix of `parents` (increasing, distinct) extended by every `step_bits`-bit
    suffix, in increasing prefix value (parent-major) — exactly
    `mech.support_counts` of those candidates, computed with less work.

    A report (key a, b; value v) supports x when top_l(b + Σ_i a_i x_i mod 2^64) = v,
    i.e. (`PEM.support_window`) when

        (b - o_v + Σ_i a_i x_i) mod 2^64 < w,   o_v = v · 2^(64-l), w = 2^(64-l).

    A candidate's chunks x are its parent's (suffix 0) plus its suffix's own (the
    suffix bits are zero in the parent's), so the sum is the parent's part
    (b - o_v + Σ a_i x_parent,i, once per (report, parent)) plus the suffix's part
    (Σ a_i x_suffix,i, once per (report, suffix)). Per (report, candidate): one
    uint64 addition and one comparison, into buffers reused block after block
    (reports in blocks whose temporaries fit in cache); each suffix's hits are
    packed to bits and counted per parent by population count.
    """
    keys, values = mech.group_arrays(statistic, group)
    bits = mech.prefix_bits(group)
    width = 1 << mech.step_bits
    base = mech.prefix_words([p << mech.step_bits for p in parents], bits)  # [T, c]
    suffix = mech.prefix_words(list(range(width)), bits)  # [2^step, c]
    used_base = [i for i in range(mech.chunks) if bool(np.any(base[:, i]))]
    used_suffix = [i for i in range(mech.chunks) if bool(np.any(suffix[:, i]))]
    offsets, limit = mech.support_window(values)
    counts = np.zeros((width, len(parents)), dtype=np.int64)
    block = max(8, _BLOCK_PAIRS // len(parents))
    acc = np.empty((len(parents), block), dtype=np.uint64)
    hit = np.empty((len(parents), block), dtype=bool)
    words = np.ascontiguousarray(keys.T)  # [c + 1, n_j]: each key word's values contiguous
    for start in range(0, words.shape[1], block):
        k = words[:, start : start + block]
        nb = k.shape[1]
        part = np.repeat(
            (k[mech.chunks] - offsets[start : start + block])[None, :], len(parents), 0
        )
        for i in used_base:
            part += base[:, i][:, None] * k[i][None, :]  # uint64: mod 2^64
        own = np.zeros((width, nb), dtype=np.uint64)  # [2^step, nb]
        for i in used_suffix:
            own += suffix[:, i][:, None] * k[i][None, :]
        a, h = acc[:, :nb], hit[:, :nb]
        for e in range(width):
            np.add(part, own[e][None, :], out=a)
            np.less(a, limit, out=h)
            counts[e] += _popcount(np.packbits(h, axis=1)).sum(axis=1, dtype=np.int64)
    return np.asarray(counts.T.reshape(-1), dtype=np.int64)


def _popcount(packed: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """The number of set bits of each byte (numpy >= 2: `bitwise_count`)."""
    if hasattr(np, "bitwise_count"):
        return np.asarray(np.bitwise_count(packed), dtype=np.uint8)
    return _BYTE_POPCOUNT[packed]


_BYTE_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def estimate_level(
    mech: PEM, statistic: GroupReports, group: int, parents: list[int]
) -> tuple[list[int], Estimate]:
    """Group `group`'s candidates (as `level_counts`) and their estimates, equal to
    `mech.estimate_prefixes(statistic, group, candidates, population=statistic.n)`
    (the same formula, on `level_counts`' counts)."""
    step = mech.step_bits
    candidates = [(x << step) | e for x in parents for e in range(1 << step)]
    n_j = statistic.group_size(group)
    counts = level_counts(mech, statistic, group, parents)
    q = mech.support_q
    f = (counts / n_j - q) / (mech.p - q)
    clipped = np.clip(f, 0.0, 1.0)
    variances = support_variance(n_j, clipped, mech.p, q)
    population = statistic.n
    if population > 1:
        variances = variances + clipped * (1 - clipped) * (population - n_j) / (
            n_j * (population - 1)
        )
    return candidates, Estimate(n=n_j, values=np.asarray(f, dtype=np.float64), variances=variances)


def discover(
    mech: PEM,
    statistic: GroupReports,
    *,
    alpha: float = DEFAULT_ALPHA,
    top: int = DEFAULT_TOP,
    reference: bool = False,
) -> Discovery:
    """Run the fixed discovery procedure of the module docstring on a merged statistic.

    Each level's candidates are estimated by `estimate_level`; with `reference`,
    by `mech.estimate_prefixes` over the same candidates instead (every hash
    evaluated in full: the reference the fast path is tested and benchmarked
    against; the result is identical)."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if top < 1:
        raise ValueError(f"top must be at least 1, got {top}")
    # The parents of level 0's candidates: every (ℓ_0 - step)-bit prefix.
    parents: list[int] = list(range(1 << (mech.prefix_bits(0) - mech.step_bits)))
    prefixes: list[int] = []
    levels: list[Level] = []
    values = np.zeros(0)
    variances = np.zeros(0)
    for j in range(mech.groups):
        n_j = statistic.group_size(j)
        if n_j == 0 or not parents:
            candidates = len(parents) << mech.step_bits
            levels.append(Level(j, mech.prefix_bits(j), n_j, candidates, float("inf"), 0))
            parents = prefixes = []
            continue
        if reference:
            prefixes = sorted(
                (x << mech.step_bits) | e for x in parents for e in range(1 << mech.step_bits)
            )
            est = mech.estimate_prefixes(statistic, j, prefixes, population=statistic.n)
        else:
            prefixes, est = estimate_level(mech, statistic, j, sorted(parents))
        cut = threshold(mech, n_j, len(prefixes), alpha)
        keep = _select(est.values, cut, top)
        levels.append(Level(j, mech.prefix_bits(j), n_j, len(prefixes), cut, int(keep.size)))
        prefixes = parents = [prefixes[i] for i in keep]
        values, variances = est.values[keep], est.variances[keep]
    strings: list[str] = []
    rows: list[int] = []
    for i, prefix in enumerate(prefixes):
        text = _decode(mech, prefix)
        if text is not None:
            strings.append(text)
            rows.append(i)
    index = np.asarray(rows, dtype=np.intp)
    estimate = Estimate(
        n=statistic.n,
        values=np.asarray(values[index] if prefixes else [], dtype=np.float64),
        variances=np.asarray(variances[index] if prefixes else [], dtype=np.float64),
    )
    return Discovery(
        strings=tuple(strings),
        estimate=estimate,
        levels=tuple(levels),
        dropped=len(prefixes) - len(strings),
        alpha=alpha,
        top=top,
    )


def discovery_report(
    mech: PEM,
    statistic: GroupReports,
    *,
    confidence: float = 0.95,
    context: ReportContext | None = None,
    alpha: float = DEFAULT_ALPHA,
    top: int = DEFAULT_TOP,
) -> FrequencyReport:
    """The analyst's report: the discovered strings as labels, with estimates and intervals."""
    found = discover(mech, statistic, alpha=alpha, top=top)
    return frequency_report_from_estimate(
        found.estimate,
        list(found.strings),
        mechanism_id=mech.wire_id,
        epsilon=mech.epsilon,
        confidence=confidence,
        context=context,
    )


__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_TOP",
    "Discovery",
    "Level",
    "discover",
    "discovery_report",
    "estimate_level",
    "level_counts",
    "threshold",
]
