"""The contract of `pem` (client/mechanisms/pem.py): hash family, exact privacy ratio,
output checks, fixed report shape, statistics, and the estimator.

Statistical checks use fixed seeds and tolerances from a stated false-failure
rate ALPHA = 1e-6; each check is shown to fail on a deliberately broken variant.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from fedldp.client.mechanisms import (
    CategoryOutput,
    GroupHashedOutput,
    HashedOutput,
    OpenDomain,
    OutputDomainError,
    create,
)
from fedldp.client.mechanisms._common import dyadic_from_exp
from fedldp.client.mechanisms.pem import (
    CHUNK_BITS,
    MAX_HASH_BITS,
    PEM,
    WORD_BITS,
    hash_key,
    multiply_add_shift,
    prefix_chunks,
)
from mech_cases import exact_max_ratio, exp_bounds  # type: ignore[import-not-found]

stats = pytest.importorskip("scipy.stats")

ALPHA = 1e-6
TIGHTNESS = Fraction(1, 2**40)


def small(epsilon: str = "1", g: int = 4) -> PEM:
    """L = 2 bytes, 4-bit steps from 4 bits: groups of 8, 12 and 16-bit prefixes."""
    return PEM(Decimal(epsilon), OpenDomain(2), step_bits=4, start_bits=4, g=g)


# --- the hash family: strongly universal, exactly --------------------------------------


def joint_is_uniform(
    chunk_bits: int, out_bits: int, word_bits: int, chunks: int, hash_fn: Any
) -> bool:
    """For every pair x != y of chunk vectors, (h(x), h(y)) over every key (a, b) is uniform."""
    words = range(1 << word_bits)
    keys = [(a, b) for a in itertools.product(words, repeat=chunks) for b in words]
    xs = list(itertools.product(range(1 << chunk_bits), repeat=chunks))
    cells = 1 << (2 * out_bits)
    for x, y in itertools.combinations(xs, 2):
        counts = Counter((hash_fn(a, b, x), hash_fn(a, b, y)) for a, b in keys)
        if len(counts) != cells or set(counts.values()) != {len(keys) // cells}:
            return False
    return True


@pytest.mark.parametrize(
    ("chunk_bits", "out_bits", "chunks"), [(2, 2, 2), (3, 2, 1), (2, 3, 1), (1, 2, 3)]
)
def test_multiply_add_shift_is_strongly_universal_exhaustively(
    chunk_bits: int, out_bits: int, chunks: int
) -> None:
    """The contract's construction at word = chunk + out - 1 bits (the production
    instance, 32-bit chunks in 64-bit words with out <= 31 bits, is within it)."""
    word_bits = chunk_bits + out_bits - 1

    def h(a: Any, b: int, x: Any) -> int:
        return multiply_add_shift(a, b, x, out_bits, word_bits)

    assert joint_is_uniform(chunk_bits, out_bits, word_bits, chunks, h)
    assert WORD_BITS >= CHUNK_BITS + MAX_HASH_BITS - 1


def test_the_universality_check_fails_on_broken_hashes() -> None:
    """Broken: a word one bit too narrow; the low bits instead of the top ones; no b."""
    narrow = 2 + 2 - 2

    def too_narrow(a: Any, b: int, x: Any) -> int:
        return multiply_add_shift(a, b, x, 2, narrow)

    def low_bits(a: Any, b: int, x: Any) -> int:
        acc: int = b + sum(ai * xi for ai, xi in zip(a, x, strict=True))
        return acc & 0b11

    def no_offset(a: Any, b: int, x: Any) -> int:
        return multiply_add_shift(a, 0, x, 2, 3)

    assert not joint_is_uniform(2, 2, narrow, 1, too_narrow)
    assert not joint_is_uniform(2, 2, 3, 1, low_bits)
    assert not joint_is_uniform(2, 2, 3, 1, no_offset)


def test_device_and_batch_hashes_agree() -> None:
    mech = PEM(Decimal(2), OpenDomain(9), step_bits=8, start_bits=0, g=1 << 9)
    rng = random.Random(3)
    words = ["a", "ab", "héllo", "ninebytes", "z" * 9, "日本"]
    padded = mech.encode_batch(words)
    keys = np.array(
        [[rng.getrandbits(64) for _ in range(mech.chunks + 1)] for _ in words], dtype=np.uint64
    )
    for j in range(mech.groups):
        bits = mech.prefix_bits(j)
        batch = mech.hash_rows(keys, mech.prefix_rows(padded, bits))
        for i, word in enumerate(words):
            key = keys[i].astype("<u8").tobytes()
            chunks = prefix_chunks(mech.pad(word), bits)
            assert hash_key(key, chunks, mech.hash_bits) == batch[i]
            assert mech.prefix_rows(padded[i : i + 1], bits)[0].tolist() == chunks


def test_prefix_chunks_follow_the_contract() -> None:
    """Most significant bit of byte 0 first; later bits zero; 32-bit little-endian chunks."""
    padded = b"\xab\xcd\xef\x12\x34"
    assert prefix_chunks(padded, 4) == [0xA0, 0]
    assert prefix_chunks(padded, 12) == [0xC0AB, 0]
    assert prefix_chunks(padded, 40) == [0x12EFCDAB, 0x34]


# --- privacy: exact -----------------------------------------------------------------------


def pem_laws(mech: PEM, inputs: list[str], keys: list[bytes]) -> list[list[Fraction]]:
    """Per input, P[(group, key, y) | input] over every group and y of each given key."""
    outputs = [o for key in keys for o in mech.outputs_for_key(key)]
    return [[mech.exact_probability(x, o) for o in outputs] for x in inputs]


def assert_exact_epsilon(ratio: Fraction | None, epsilon: Decimal) -> None:
    assert ratio is not None, "an output is possible under one input and impossible under another"
    lo, hi = exp_bounds(epsilon)
    assert ratio <= lo, f"realized ratio exceeds e^{epsilon} by {float(ratio / hi - 1):.3g}"
    assert ratio >= hi * (1 - TIGHTNESS), "realized ratio is below e^ε: too much noise"


INPUTS = ["a", "b", "ab", "ba", "zz", "é"]


@pytest.mark.parametrize("eps", ["0.5", "1", "2", "4"])
def test_realized_privacy_ratio_is_at_most_e_to_epsilon_exactly(eps: str) -> None:
    """Every output (group, key, y) has probability (1/G)(1/|keys|) times p or q: the key
    is uniform and independent of the value, so the law at any key is the law."""
    mech = small(eps)
    rng = random.Random(11)
    keys = [
        rng.getrandbits(8 * mech.key_bytes).to_bytes(mech.key_bytes, "little") for _ in range(6)
    ]
    laws = pem_laws(mech, INPUTS, keys)
    per_key = Fraction(1, 1 << (8 * mech.key_bytes))
    for law in laws:
        assert sum(law, Fraction(0)) == per_key * len(keys)
    assert_exact_epsilon(exact_max_ratio(laws), Decimal(eps))
    assert (
        mech.keep.numerator
        == dyadic_from_exp(lambda e: e / (e + mech.g - 1), Decimal(eps)).numerator
    )


class RoundedUpPEM(PEM):
    """Broken: the keep threshold rounded UP (one ulp of 2^-53)."""

    def __init__(self, epsilon: Decimal) -> None:
        super().__init__(epsilon, OpenDomain(2), step_bits=4, start_bits=4, g=4)
        self.keep = dyadic_from_exp(lambda e: e / (e + 3), epsilon, round_up=True)
        self.p_exact = self.keep.exact
        self.q_exact = (1 - self.p_exact) / 3


def test_a_threshold_rounded_the_wrong_way_is_caught_at_one_ulp() -> None:
    mech = RoundedUpPEM(Decimal(1))
    key = bytes(range(mech.key_bytes))
    ratio = exact_max_ratio(pem_laws(mech, INPUTS, [key]))
    assert ratio is not None
    _, hi = exp_bounds(Decimal(1))
    assert hi < ratio < hi * (1 + Fraction(1, 2**45))
    with pytest.raises(AssertionError, match="exceeds"):
        assert_exact_epsilon(ratio, Decimal(1))


def test_the_device_draws_only_integers() -> None:
    """The group, the key and the response come from getrandbits (no float is drawn)."""

    class NoFloats(random.Random):
        def getrandbits(self, k: int) -> int:
            return super().getrandbits(k)

        def random(self) -> float:
            raise AssertionError("the sampler drew a float")

    mech = small("2")
    for word in INPUTS:
        mech.check_output(mech.perturb(word, rng=NoFloats(5)))


# --- outputs -------------------------------------------------------------------------------


def test_output_domain_check() -> None:
    mech = small()
    good = mech.perturb("ab", rng=random.Random(0))
    mech.check_output(good)
    for foreign in (CategoryOutput(0), HashedOutput(0, 0)):
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(foreign)
        assert info.value.reason == "WRONG_PAYLOAD_TYPE"
    bad = [
        (GroupHashedOutput(mech.groups, good.key, 0), "OUT_OF_DOMAIN"),
        (GroupHashedOutput(-1, good.key, 0), "OUT_OF_DOMAIN"),
        (GroupHashedOutput(0, good.key[:-1], 0), "WRONG_LENGTH"),
        (GroupHashedOutput(0, good.key + b"\x00", 0), "WRONG_LENGTH"),
        (GroupHashedOutput(0, b"", 0), "WRONG_LENGTH"),
        (GroupHashedOutput(0, good.key, mech.g), "OUT_OF_DOMAIN"),
        (GroupHashedOutput(0, good.key, -1), "OUT_OF_DOMAIN"),
    ]
    for output, reason in bad:
        with pytest.raises(OutputDomainError) as info:
            mech.check_output(output)
        assert info.value.reason == reason
        assert good.key.hex() not in str(info.value)


def test_report_shape_does_not_depend_on_the_value() -> None:
    mech = small()
    rng = random.Random(1)
    shapes = set()
    groups = set()
    for word in INPUTS:
        for _ in range(30):
            out = mech.perturb(word, rng=rng)
            shapes.add((type(out), len(out.key)))
            groups.add(out.group)
    assert shapes == {(GroupHashedOutput, mech.key_bytes)}
    assert groups == set(range(mech.groups))


def test_values_are_checked_without_echoing_them() -> None:
    mech = small()
    for bad in ("", "abc", "a\x00", 5):
        with pytest.raises(ValueError) as info:
            mech.perturb(bad, rng=random.Random(0))  # type: ignore[arg-type]
        assert "abc" not in str(info.value)


# --- statistics: single and batch agree, merges are exact -----------------------------------


def test_single_and_batch_accumulation_agree_and_merge_exactly() -> None:
    mech = small("2")
    words = [INPUTS[i % len(INPUTS)] for i in range(300)]
    batch = mech.perturb_batch(words, np.random.default_rng(9))
    whole = mech.new_statistic()
    mech.accumulate_batch(whole, batch)
    first, second = mech.new_statistic(), mech.new_statistic()
    groups, keys, values = batch
    for i in range(len(words)):
        output = GroupHashedOutput(int(groups[i]), keys[i].astype("<u8").tobytes(), int(values[i]))
        mech.accumulate(first if i % 2 else second, output)
    second.merge(first)
    text = mech.statistic_to_json(whole)
    assert mech.statistic_to_json(second) == text  # any order: the same canonical JSON
    again = mech.statistic_from_json(text)
    assert again.n == 300 and mech.statistic_to_json(again) == text


def test_malformed_statistics_are_refused() -> None:
    mech = small()
    stat = mech.new_statistic()
    mech.accumulate(stat, mech.perturb("a", rng=random.Random(0)))
    good = json.loads(mech.statistic_to_json(stat))
    broken = [
        {**good, "n": 2},
        {**good, "groups": good["groups"][:-1]},
        {**good, "groups": ["!!", *good["groups"][1:]]},
        {**good, "groups": ["AAAA", *good["groups"][1:]]},  # 3 bytes: a partial record
        [],
    ]
    for doc in broken:
        with pytest.raises(ValueError):
            mech.statistic_from_json(json.dumps(doc))


def test_batch_outputs_outside_the_domain_are_refused() -> None:
    mech = small()
    groups, keys, values = mech.perturb_batch(["a", "b"], np.random.default_rng(0))
    for bad in (
        (groups + mech.groups, keys, values),
        (groups, keys, values + mech.g),
        (groups, keys[:, :-1], values),
    ):
        with pytest.raises(OutputDomainError):
            mech.accumulate_batch(mech.new_statistic(), bad)


# --- the law and the estimator ----------------------------------------------------------------


def support_p_value(mech: PEM, outputs: Any, value: str, truth: str) -> float:
    hits = int(mech.supports_batch(outputs, value).sum())
    n = outputs[0].shape[0]
    return float(stats.binomtest(hits, n, mech.support_rate(value, truth)).pvalue)


def device_outputs(mech: PEM, word: str, n: int, seed: int) -> Any:
    rng = random.Random(seed)
    outs = [mech.perturb(word, rng=rng) for _ in range(n)]
    return (
        np.array([o.group for o in outs], dtype=np.int64),
        np.frombuffer(b"".join(o.key for o in outs), dtype="<u8").reshape(n, -1).astype(np.uint64),
        np.array([o.value for o in outs], dtype=np.int64),
    )


@pytest.mark.parametrize("path", ["device", "batch"])
def test_support_rates_are_the_declared_ones(path: str) -> None:
    """Reports of "ab" support "ab", "aa" (same first byte), "b" at the declared rates."""
    mech = small("2", g=8)
    n = 20_000
    if path == "device":
        outputs = device_outputs(mech, "ab", n, 4)
    else:
        outputs = mech.perturb_batch(["ab"] * n, np.random.default_rng(4))
    for value in ("ab", "aa", "b"):
        assert support_p_value(mech, outputs, value, "ab") >= ALPHA / 6


def test_the_law_check_fails_on_a_broken_sampler() -> None:
    """Broken: the hash is kept with the probability for 2ε."""
    mech = small("2", g=8)
    loose = small("4", g=8)
    outputs = loose.perturb_batch(["ab"] * 20_000, np.random.default_rng(4))
    assert support_p_value(mech, outputs, "ab", "ab") < ALPHA


def zipf_population(mech: PEM, n: int, seed: int) -> tuple[Any, dict[int, float]]:
    """Strings over 40 words; the truth of every first-level prefix (a byte here)."""
    rng = np.random.default_rng(seed)
    words = [f"{chr(97 + i % 26)}{chr(65 + i // 26)}" for i in range(40)]
    weights = 1.0 / np.arange(1, 41) ** 1.1
    weights /= weights.sum()
    truth: dict[int, float] = {}
    for w, f in zip(words, weights, strict=True):
        truth[ord(w[0])] = truth.get(ord(w[0]), 0.0) + float(f)
    return mech.encode_batch(words)[rng.choice(40, size=n, p=weights)], truth


def estimate_within_variance(mech: PEM, n: int, seed: int) -> bool:
    padded, truth = zipf_population(mech, n, seed)
    stat = mech.new_statistic()
    mech.accumulate_batch(stat, mech.perturb_batch(padded, np.random.default_rng(seed)))
    est = mech.estimate(stat)
    f = np.array([truth.get(v, 0.0) for v in range(256)])
    n_j = stat.group_size(0)
    variance = (f * mech.p * (1 - mech.p) + (1 - f) * mech.support_q * (1 - mech.support_q)) / (
        n_j * (mech.p - mech.support_q) ** 2
    ) + f * (1 - f) * (n - n_j) / (n_j * (n - 1))
    z = NormalDist().inv_cdf(1 - ALPHA / (2 * 256))
    return bool(np.all(np.abs(est.values - f) <= z * np.sqrt(variance)))


def test_unbiased_with_the_stated_variance() -> None:
    assert estimate_within_variance(small("2", g=8), 60_000, 21)


def test_unbiasedness_check_fails_on_a_broken_estimator() -> None:
    """Broken: debiasing with q = 0 (as if a different prefix never collided)."""

    class NoCollisions(PEM):
        def __init__(self) -> None:
            super().__init__(Decimal(2), OpenDomain(2), step_bits=4, start_bits=4, g=8)
            self.support_q = 0.0

    assert not estimate_within_variance(NoCollisions(), 60_000, 21)


# --- parameters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"g": "6"}, "power of two"),
        ({"g": "1"}, "power of two"),
        ({"g": str(2**32)}, "at most 2\\^31"),
        ({"step_bits": "3"}, "step_bits"),
        ({"start_bits": "13"}, "start_bits"),
        ({"start_bits": "2"}, "multiple of step_bits"),
        ({"groups": "7"}, "groups must be"),
        ({"depth": "3"}, "does not take"),
    ],
)
def test_bad_params_are_refused(params: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        create("pem", Decimal(1), OpenDomain(2), params)


def test_pem_needs_an_open_domain_and_others_refuse_one() -> None:
    with pytest.raises(ValueError, match="open-domain metric"):
        create("pem", Decimal(1), 5)
    with pytest.raises(ValueError, match="categorical metric"):
        create("grr", Decimal(1), OpenDomain(4))


def test_defaults_are_the_documented_ones() -> None:
    mech = create("pem", Decimal(4), OpenDomain(8))
    assert isinstance(mech, PEM)
    assert (mech.step_bits, mech.start_bits, mech.groups, mech.g) == (4, 4, 15, 64)
    assert mech.key_bytes == 24 and mech.prefix_bits(mech.groups - 1) == 64


@pytest.mark.parametrize("value", ["abc", "ab€", "x" * 40])
def test_a_too_long_value_is_refused_without_its_length(value: str) -> None:
    with pytest.raises(ValueError, match="longer than max_bytes") as info:
        OpenDomain(2).encode(value)
    assert str(len(value.encode())) not in str(info.value)


def test_an_empty_value_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        OpenDomain(2).encode("")
