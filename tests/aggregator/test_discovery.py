"""Heavy-hitter discovery (aggregator/discovery.py) on synthetic Zipf data with known
heavy hitters, fixed seeds.

Stated success rate: with n = 300,000 users, ε = 8, strings of up to 8 bytes
(default pem params: 4-bit steps, 15 groups), a Zipf(1.1) vocabulary of 10,000
random words, discovery finds at least 19 of the true top 20 and reports only
real words; at ε = 4 and n = 200,000 it reports no string that nobody holds.
Broken variants are caught: a hash whose two distinct prefixes collide with
probability != 1/g (the low bits of the multiply-add instead of the top bits,
through the reference analysis; only the first 32-bit chunk of each prefix,
through the fast one) finds fewer than 19 of the top 20; with few reports per group (n = 3,000,
ε = 8, g = 4096) a normal-approximation z threshold keeps a chance collision
that the exact binomial threshold does not; and a threshold rule without the binomial
cut (keep any positive estimate) reports strings that nobody holds.
"""

from __future__ import annotations

import math
import struct
from decimal import Decimal
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from fedldp.aggregator import discovery
from fedldp.aggregator.discovery import discover, discovery_report
from fedldp.client.mechanisms import GroupHashedOutput, OpenDomain
from fedldp.client.mechanisms.pem import PEM

VOCABULARY = 10_000
ZIPF_S = 1.1


def vocabulary(seed: int) -> tuple[list[str], np.ndarray]:
    """Distinct random lowercase words of 3..8 letters, in rank order, and Zipf weights."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words: dict[str, None] = {}
    while len(words) < VOCABULARY:
        words["".join(rng.choice(letters, int(rng.integers(3, 9))))] = None
    weights = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF_S
    return list(words), weights / weights.sum()


def run(mech: PEM, n: int, seed: int, **options: Any) -> tuple[discovery.Discovery, list[str]]:
    words, weights = vocabulary(seed)
    rng = np.random.default_rng(seed + 1)
    padded = mech.encode_batch(words)[rng.choice(VOCABULARY, size=n, p=weights)]
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(padded, rng))
    return discover(mech, stat, **options), words


class LowBitsPEM(PEM):
    """Broken: the hash value is the LOW l bits of b + Σ a_i x_i (device and the
    reference analysis alike, which take it through `top_bits`), which depend only on
    the low bits of each chunk: prefixes that differ elsewhere always collide, so the
    collision probability is not 1/g. (The fast path counts support through
    `support_window`, the contract's top bits: it runs with `FirstChunkPEM`.)"""

    def top_bits(self, acc: Any) -> Any:
        return acc & np.uint64(self.g - 1)


class FirstChunkPEM(PEM):
    """Broken: the hash reads only the first 32-bit chunk of a prefix (the others are
    taken as zero, on the device and in both analyses): prefixes that share their
    first 4 bytes always collide, so the collision probability is not 1/g."""

    def prefix_rows(self, padded: Any, bits: int) -> Any:
        rows = super().prefix_rows(padded, bits)
        rows[:, 1:] = 0
        return rows

    def prefix_words(self, prefixes: Any, bits: int) -> Any:
        words = super().prefix_words(prefixes, bits)
        words[:, 1:] = 0
        return words


def pem(cls: type[PEM], epsilon: str) -> PEM:
    return cls(Decimal(epsilon), OpenDomain(8))


def test_discovery_finds_the_top_20_at_epsilon_8() -> None:
    found, words = run(pem(PEM, "8"), 300_000, seed=5)
    assert len(set(words[:20]) & set(found.strings)) >= 19
    assert set(found.strings) <= set(words)
    assert len(found.strings) <= discovery.DEFAULT_TOP
    assert [level.prefix_bits for level in found.levels] == list(range(8, 65, 4))
    # Estimates in decreasing order, each interval from its exact variance.
    assert list(found.estimate.values) == sorted(found.estimate.values, reverse=True)
    assert np.all(found.estimate.variances > 0)


@pytest.mark.parametrize(("broken", "reference"), [(LowBitsPEM, True), (FirstChunkPEM, False)])
def test_a_hash_without_exact_collision_probability_fails_discovery(
    broken: type[PEM], reference: bool
) -> None:
    found, words = run(pem(broken, "8"), 300_000, seed=5, reference=reference)
    assert len(set(words[:20]) & set(found.strings)) < 19


def test_discovery_reports_no_string_that_nobody_holds_at_epsilon_4() -> None:
    found, words = run(pem(PEM, "4"), 200_000, seed=5)
    assert found.strings and set(found.strings) <= set(words)


def test_a_threshold_rule_without_the_binomial_cut_reports_strings_nobody_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discovery, "threshold", lambda *args: 0.0)
    found, words = run(pem(PEM, "4"), 200_000, seed=5)
    assert not set(found.strings) <= set(words)


def test_the_report_lists_strings_with_intervals() -> None:
    mech = pem(PEM, "8")
    words, weights = vocabulary(5)
    rng = np.random.default_rng(6)
    padded = mech.encode_batch(words)[rng.choice(VOCABULARY, size=300_000, p=weights)]
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(padded, rng))
    report = discovery_report(mech, stat, confidence=0.95)
    assert report.n == 300_000 and report.mechanism == "pem"
    top = {row.label: row for row in report.estimates}
    assert words[0] in top
    row = top[words[0]]
    assert row.ci_low <= weights[0] <= row.ci_high
    assert row.ci_low < row.estimate < row.ci_high


def test_bad_options_are_refused() -> None:
    mech = pem(PEM, "8")
    with pytest.raises(ValueError, match="alpha"):
        discover(mech, mech.new_statistic(), alpha=0.0)
    with pytest.raises(ValueError, match="top"):
        discover(mech, mech.new_statistic(), top=0)


def test_an_empty_group_ends_discovery_with_nothing_found() -> None:
    mech = pem(PEM, "8")
    found = discover(mech, mech.new_statistic())
    assert found.strings == () and found.levels[0].kept == 0


def z_rule(mech: PEM, n_j: int, candidates: int, alpha: float) -> float:
    """Broken: z_{1-α/C} times the null standard error (normal approximation)."""
    q = mech.support_q
    z = NormalDist().inv_cdf(1 - alpha / candidates)
    return z * math.sqrt(q * (1 - q) / (n_j * (mech.p - q) ** 2))


def test_few_reports_per_group_report_no_chance_collision() -> None:
    found, words = run(pem(PEM, "8"), 3_000, seed=5)
    assert found.strings and set(found.strings) <= set(words)


def test_a_normal_approximation_threshold_keeps_a_chance_collision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(discovery, "threshold", z_rule)
    found, words = run(pem(PEM, "8"), 3_000, seed=5)
    assert not set(found.strings) <= set(words)


def test_a_discovered_string_cannot_drive_the_analysts_terminal() -> None:
    """Discovered strings come from users: the terminal table escapes control characters
    (the HTML page escapes markup)."""
    from fedldp.aggregator.estimation import frequency_report_from_estimate
    from fedldp.aggregator.render import render_table
    from fedldp.client.mechanisms.base import Estimate

    estimate = Estimate(n=10, values=np.array([0.5]), variances=np.array([0.01]))
    report = frequency_report_from_estimate(
        estimate, ["\x1b[2Jok"], mechanism_id="pem", epsilon=Decimal(8)
    )
    table = render_table(report)
    assert "\x1b" not in table and "\\x1b[2Jok" in table


@pytest.mark.parametrize(("epsilon", "n", "seed"), [("8", 60_000, 3), ("2", 30_000, 4)])
def test_level_counts_equal_the_mechanisms_support_counts(epsilon: str, n: int, seed: int) -> None:
    """`level_counts` (each hash as a parent's part plus a suffix's part) gives exactly
    `mech.support_counts` of the candidates, at three levels, and discovery finds
    exactly the strings, levels, estimates and variances of the reference
    procedure (`reference=True`: every candidate through `estimate_prefixes`)."""
    mech = pem(PEM, epsilon)
    words, weights = vocabulary(seed)
    rng = np.random.default_rng(seed + 1)
    padded = mech.encode_batch(words)[rng.choice(VOCABULARY, size=n, p=weights)]
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(padded, rng))
    for j, parents in ((0, list(range(16))), (3, [5, 77, 1000, 4095]), (14, [1, 2**59 - 1])):
        keys, values = mech.group_arrays(stat, j)
        candidates = [(x << mech.step_bits) | e for x in parents for e in range(16)]
        x = mech.prefix_words(candidates, mech.prefix_bits(j))
        expected = mech.support_counts(keys, values, x)
        assert np.array_equal(discovery.level_counts(mech, stat, j, parents), expected), j
    found = discover(mech, stat)
    reference = discover(mech, stat, reference=True)
    assert found.levels == reference.levels and len(found.levels) == mech.groups
    assert found.strings == reference.strings and found.strings
    assert np.array_equal(found.estimate.values, reference.estimate.values)
    assert np.array_equal(found.estimate.variances, reference.estimate.variances)


@pytest.mark.parametrize(
    ("g", "n", "parents", "block"),
    [
        (2, 1, 1, 1 << 17),  # one report, the smallest hash range
        (8, 1_003, 3, 64),  # many blocks, the last one partial, rows not a multiple of 8
        (4096, 20_000, 33, 1 << 17),  # more parents than the discovery rule keeps
        (1 << 31, 5_000, 16, 8),  # the largest hash range; blocks of one report per parent
    ],
)
def test_level_counts_at_odd_sizes_equal_the_support_counts(
    g: int, n: int, parents: int, block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`level_counts` against `mech.support_counts` (every hash in full) at sizes that
    split blocks and packed bytes unevenly, at every level of a statistic whose reports
    support the candidates (their strings share the parents' prefixes)."""
    monkeypatch.setattr(discovery, "_BLOCK_PAIRS", block)
    mech = PEM(Decimal(4), OpenDomain(6), g=g)  # two 32-bit chunks
    rng = np.random.default_rng(g + n)
    words = ["ab", "abcde", "b", "zz", "\u00e9t\u00e9"]
    padded = mech.encode_batch(words)[rng.integers(0, len(words), size=n)]
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(padded, rng))
    for j in range(mech.groups):
        bits = mech.prefix_bits(j) - mech.step_bits
        first = int.from_bytes(padded[0].tobytes(), "big") >> (8 * mech.max_bytes - bits)
        for output in boundary_reports(mech, j, (first << mech.step_bits) | 3, rng):
            mech.accumulate(stat, output)
        chosen = sorted({first, *rng.integers(0, 1 << bits, size=parents - 1).tolist()})
        keys, values = mech.group_arrays(stat, j)
        candidates = [(x << mech.step_bits) | e for x in chosen for e in range(16)]
        expected = mech.support_counts(keys, values, mech.prefix_words(candidates, bits + 4))
        assert np.array_equal(discovery.level_counts(mech, stat, j, chosen), expected), j


def boundary_reports(
    mech: PEM, group: int, prefix: int, rng: np.random.Generator
) -> list[GroupHashedOutput]:
    """Reports of `group` whose sum b + Σ a_i x_i for `prefix` sits at an edge of a hash
    value's interval [v w, (v + 1) w), w = 2^(64-l): on each side of both ends, for
    v = 0, 1 and g - 1 (random a, b solved for). Random sums land there with
    probability 2^-(64-l): an off-by-one comparison would pass on them alone."""
    x = [int(c) for c in mech.prefix_words([prefix], mech.prefix_bits(group))[0]]
    width = 1 << (64 - mech.hash_bits)
    out = []
    for v in (0, 1, mech.g - 1):
        for acc in (v * width - 1, v * width, (v + 1) * width - 1, (v + 1) * width):
            a = [int(w) for w in rng.integers(0, 2**63, size=mech.chunks)]
            b = (acc - sum(ai * xi for ai, xi in zip(a, x, strict=True))) % 2**64
            key = struct.pack(f"<{mech.chunks + 1}Q", *a, b)
            out.append(GroupHashedOutput(group, key, v))
    return out
