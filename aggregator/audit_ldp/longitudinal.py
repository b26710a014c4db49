"""The longitudinal test: neighbouring inputs are two SEQUENCES of values, changed or not.

A memoized mechanism keeps one permanent response per value on the device, so a
user's reports of one value are correlated: they carry the fingerprint of a
shared permanent response, which tells whether two reports share a value. Its
neighbouring inputs are therefore two sequences x, x' of T values (DESIGN.md:
"a memoized mechanism's charge must bound the loss of any two sequences of
values, changed or not"), and the claim is what the ledger charges for T
reports, T · report_charge (value-blind; memo_loss, "Sequences of values"), or
`lifetime_epsilon(T)` where the mechanism defines it (`audit.claim_for`).

Sequences (`sequence_pairs`), from distinct audited values a, b, c, ...
(categorical 0, 1, 2, ...; numeric lo, hi and points between):

* same           (a, a, ..., a)
* changed once   (a, ..., a, b)
* alternating    (a, b, a, b, ...)      (for T = 2 it is "changed once")
* all distinct   (b, c, d, ...)         (values of k wrap when k <= T)

and the pairs (same, changed once), (same, alternating), (same, all distinct).

Paths. Device: `perturb(value, rng=None, memo=m)` with one fresh `new_memo()`
per simulated user, shared by that user's T reports, on the OS CSPRNG unless a
test passes a seeded `random.Random` — exactly what the SDK does. Batch: the
mechanism's `perturb_batch_sequences(values, rng)` when it has one (values of
shape (n, T); the law of T calls of `perturb` with one memo), else for the
memo.py family (one independent permanent response per value: memo.py, "Memo
state") the reports of each distinct value come from one call of
`perturb_batch_longitudinal(values, T, rng)`; a mechanism whose
`perturb_batch_longitudinal(values, rng)` takes values of shape (n, T) (loloha,
dbitflip) is called with the sequences; any other memoized mechanism is
audited on the device path only (a note says so).

Features (each user's T reports -> one int64 key; any function of the output is
post-processing, Dwork and Roth 2014, Proposition 2.1). D is the set of report
positions (s, t) whose sharing differs between x and x' (x_s = x_t in one
sequence only): the pairs where a fingerprint shows.

* every kind but bit vectors — "equal reports": for each (s, t) in D, whether
  reports s and t are equal (the whole payload);
* category reports — "classes and equal reports": each report's class (which
  audited value it names, or other), joint over T, with the equalities on D;
* hashed (loloha) and index-bits (dbitflip) reports — "supports of the values
  and equal reports": whether each report supports each audited value (the
  contract hash; the bucket sampled and its bit), joint over T, with the
  equalities on D;
* bit vectors — "fingerprint": over the columns of no value of x or x', the
  number of columns where reports s and t are both set, and where they differ,
  summed over the pairs of D that share in x and, apart, in x' (a shared
  permanent response makes reports agree in columns nobody holds);
  "agreement": the number of differing columns alone (Hamming distance);
  "bits at the values": the bits of the values of x and x', joint over T;
  "likelihood-ratio score": a fitted score (`_score_fit`): the outside
  columns' (both set, differing, both clear) counts weighted by their log
  rate ratio, plus the log ratio of the bits at the values, both estimated on
  the selection half only.

A feature whose key space would exceed `MAX_KEYS` (`MAX_COUNT_KEY` for the
summed counts) is left out of the plan.

Events are chosen on the first half of the users and bounded on the second
(`stats.py`), each CP bound at the audit's Bonferroni level, as for one value.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fedldp.aggregator.audit_ldp.features import index_support, olh_hash
from fedldp.aggregator.audit_ldp.sampling import (
    TUPLE_KINDS,
    Reports,
    _perturb,
    device_column,
    split_rounds,
    takes_report_count,
)
from fedldp.client.mechanisms.base import Output
from fedldp.client.mechanisms.memo import MemoizedUnary, RapporGRR

if TYPE_CHECKING:
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]

#: Largest key space of a joint feature; a feature that would exceed it is not planned.
MAX_KEYS = 1 << 24
#: Largest key of a summed-count feature (int64 keys; its keys are few, its range wide).
MAX_COUNT_KEY = 1 << 62
#: Quantization step of the fitted likelihood-ratio score (nats).
SCORE_STEP = 0.05


@dataclass(frozen=True)
class Sequence:
    """One input of the longitudinal test: T values, one per report."""

    label: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class SequenceFeature:
    """A named function of a user's T reports on the sequence pair (x, x').

    `keys` maps reports to keys. A fitted feature (`fit` set) first learns its
    function from the SELECTION halves of x and x' (`fit(x_sel, y_sel)` returns
    `keys`); it is then applied to both halves, so the bound on the fresh half
    stays valid (the function is fixed before the fresh half is looked at).
    """

    name: str
    keys: Callable[[Reports], IntArray]
    fit: Callable[[Reports, Reports], Callable[[Reports], IntArray]] | None = None

    def fitted(self, x_sel: Reports, y_sel: Reports) -> Callable[[Reports], IntArray]:
        """The key function to use, learnt on the selection halves if this feature fits."""
        return self.keys if self.fit is None else self.fit(x_sel, y_sel)


def sequence_values(domain: Any, count: int) -> list[Any]:
    """`count` audited values of `domain`, distinct where it has that many.

    Categorical k: 0, 1, ..., wrapping at k; numeric (lo, hi): lo, hi, then
    evenly spaced points between (as floats). Other domains have no sequence test.
    """
    if isinstance(domain, int):
        return [i % domain for i in range(count)]
    if isinstance(domain, tuple):
        lo, hi = float(domain[0]), float(domain[1])
        inner = [lo + (hi - lo) * i / count for i in range(1, count - 1)]
        return [lo, hi, *inner][:count]
    raise ValueError("the sequence test covers categorical and numeric domains")


def _label(values: tuple[Any, ...]) -> str:
    """A sequence as people write it: (0, 0, 1)."""
    return "(" + ", ".join(str(v) for v in values) + ")"


def sequence_pairs(domain: Any, reports: int) -> tuple[list[Sequence], list[tuple[int, int]]]:
    """The audited sequences of `reports` values and the pairs of them (module doc)."""
    values = sequence_values(domain, reports + 1)
    a, b = values[0], values[1]
    candidates = [
        ("same", (a,) * reports),
        ("changed once", (a,) * (reports - 1) + (b,)),
        ("alternating", tuple(a if t % 2 == 0 else b for t in range(reports))),
        ("all distinct", tuple(values[1 : reports + 1])),
    ]
    seqs: list[Sequence] = []
    for name, vals in candidates:
        if all(s.values != vals for s in seqs):
            seqs.append(Sequence(f"{name} {_label(vals)}", vals))
    return seqs, [(0, j) for j in range(1, len(seqs))]


def differing_pairs(x: tuple[Any, ...], y: tuple[Any, ...]) -> list[tuple[int, int, bool]]:
    """(s, t, shared in x) for every s < t where exactly one sequence repeats a value."""
    out = []
    for s in range(len(x)):
        for t in range(s + 1, len(x)):
            if (x[s] == x[t]) != (y[s] == y[t]):
                out.append((s, t, x[s] == x[t]))
    return out


def _equal(kind: str, a: Any, b: Any) -> npt.NDArray[np.bool_]:
    """Per user: are the two reports (columns in the batch layout) equal?"""
    parts = list(zip(a, b, strict=True)) if kind in TUPLE_KINDS else [(a, b)]
    equal = np.ones(np.asarray(parts[0][0]).shape[0], dtype=np.bool_)
    for pa, pb in parts:
        same = np.asarray(pa) == np.asarray(pb)
        equal &= same.reshape(same.shape[0], -1).all(axis=1)
    return equal


def _equalities(kind: str, pairs: list[tuple[int, int, bool]]) -> Callable[[Reports], IntArray]:
    """Key: one bit per pair (s, t) of `pairs`, whether reports s and t are equal."""

    def keys(reports: Reports) -> IntArray:
        """The equality bits of each user's reports."""
        key = np.zeros(reports.n, dtype=np.int64)
        for s, t, _ in pairs:
            key = 2 * key + _equal(kind, reports.columns[s], reports.columns[t])
        return key

    return keys


def _classes(
    audited: list[Any], pairs: list[tuple[int, int, bool]]
) -> Callable[[Reports], IntArray]:
    """Key: each report's class (index in `audited`, or other), joint, then the
    equality bits of `pairs`."""
    base = len(audited) + 1
    equalities = _equalities("category", pairs)

    def keys(reports: Reports) -> IntArray:
        """The classes and equalities of each user's reports."""
        key = np.zeros(reports.n, dtype=np.int64)
        for column in reports.columns:
            cls = np.full(column.shape[0], len(audited), dtype=np.int64)
            for i, value in enumerate(audited):
                cls[column == value] = i
            key = key * base + cls
        return key * (1 << len(pairs)) + equalities(reports)

    return keys


def _support_digit(kind: str, column: Any, value: Any, mech: Any) -> IntArray:
    """Per report, how it supports `value`: hashed (OLH, loloha) 0/1 by the contract
    hash; index bits (dbitflip) 0 absent, 2 sampled with bit 0, 3 with bit 1."""
    if kind == "hashed":
        seeds, hashed = column
        return np.asarray(olh_hash(seeds, int(value), mech.g, mech.m) == hashed, dtype=np.int64)
    return index_support(column, value, mech)


def _supports(
    kind: str, mech: Any, audited: list[Any], pairs: list[tuple[int, int, bool]]
) -> Callable[[Reports], IntArray]:
    """Key: how each report supports each audited value, joint over T, then the
    equality bits of `pairs`."""
    equalities = _equalities(kind, pairs)

    def keys(reports: Reports) -> IntArray:
        """The supports and equalities of each user's reports."""
        key = np.zeros(reports.n, dtype=np.int64)
        for column in reports.columns:
            for value in audited:
                key = 4 * key + _support_digit(kind, column, value, mech)
        return key * (1 << len(pairs)) + equalities(reports)

    return keys


def _unfitted(reports: Reports) -> IntArray:
    """The `keys` of a fitted feature before `fit`: never called (`fitted`)."""
    raise AssertionError("a fitted feature's keys come from its fit")


def _unpacked(column: Any, k: int, outside: npt.NDArray[np.bool_]) -> npt.NDArray[np.uint8]:
    """Bits of packed little-endian rows, restricted to the `outside` columns."""
    bits = np.unpackbits(np.asarray(column, dtype=np.uint8), axis=1, bitorder="little")
    return bits[:, :k][:, outside]


def _fingerprint_parts(pairs: list[tuple[int, int, bool]], both: bool) -> list[tuple[bool, str]]:
    """The sums a fingerprint key holds: per side of D present, "differ" (and "both")."""
    sides = sorted({shared_x for _, _, shared_x in pairs}, reverse=True)
    return [
        (side, part) for side in sides for part in (("both", "differ") if both else ("differ",))
    ]


def _fingerprint(
    k: int, audited: list[Any], pairs: list[tuple[int, int, bool]], both: bool
) -> Callable[[Reports], IntArray]:
    """(Σ both set, Σ differing) over the outside columns, per side of D (module doc)."""
    outside = np.ones(k, dtype=np.bool_)
    outside[[int(v) for v in audited]] = False
    base = k * len(pairs) + 1
    parts = _fingerprint_parts(pairs, both)

    def keys(reports: Reports) -> IntArray:
        """The summed counts of each user's reports, as one key."""
        bits = [_unpacked(c, k, outside) for c in reports.columns]
        sums = {part: np.zeros(reports.n, dtype=np.int64) for part in parts}
        for s, t, shared_x in pairs:
            sums[(shared_x, "differ")] += np.count_nonzero(bits[s] != bits[t], axis=1)
            if both:
                sums[(shared_x, "both")] += np.count_nonzero(bits[s] & bits[t], axis=1)
        key = np.zeros(reports.n, dtype=np.int64)
        for part in parts:
            key = key * base + sums[part]
        return key

    return keys


def _value_bits(audited: list[Any]) -> Callable[[Reports], IntArray]:
    """Key: the bits at the audited values' columns, joint over the T reports."""

    def keys(reports: Reports) -> IntArray:
        """The audited columns' bits of each user's reports."""
        key = np.zeros(reports.n, dtype=np.int64)
        for column in reports.columns:
            rows = np.asarray(column, dtype=np.uint8)
            for v in audited:
                key = 2 * key + ((rows[:, int(v) >> 3] >> (int(v) & 7)) & 1)
        return key

    return keys


def _column_counts(
    k: int, audited: list[Any], pairs: list[tuple[int, int, bool]]
) -> Callable[[Reports], npt.NDArray[np.int64]]:
    """Per user, (both set, differing, both clear) column counts over the outside columns,
    per side of D: shape (n, 3 · sides)."""
    outside = np.ones(k, dtype=np.bool_)
    outside[[int(v) for v in audited]] = False
    sides = sorted({shared_x for _, _, shared_x in pairs}, reverse=True)
    width = int(outside.sum())

    def counts(reports: Reports) -> npt.NDArray[np.int64]:
        """The column counts of each user's reports."""
        bits = [_unpacked(c, k, outside) for c in reports.columns]
        out = np.zeros((reports.n, 3 * len(sides)), dtype=np.int64)
        for s, t, shared_x in pairs:
            col = 3 * sides.index(shared_x)
            both = np.count_nonzero(bits[s] & bits[t], axis=1)
            differ = np.count_nonzero(bits[s] != bits[t], axis=1)
            out[:, col] += both
            out[:, col + 1] += differ
            out[:, col + 2] += width - both - differ
        return out

    return counts


def _log_ratio_table(x: IntArray, y: IntArray) -> Callable[[IntArray], npt.NDArray[np.float64]]:
    """ln of the smoothed ratio of key frequencies under x and y (selection half)."""
    universe = np.union1d(x, y)
    cx = np.full(universe.shape[0], 0.5)
    cy = np.full(universe.shape[0], 0.5)
    np.add.at(cx, np.searchsorted(universe, x), 1)
    np.add.at(cy, np.searchsorted(universe, y), 1)
    table = np.log(cx / cy)

    def lookup(keys: IntArray) -> npt.NDArray[np.float64]:
        """Each key's log ratio (0 for a key the selection half never saw)."""
        at = np.clip(np.searchsorted(universe, keys), 0, universe.shape[0] - 1)
        return np.asarray(np.where(universe[at] == keys, table[at], 0.0), dtype=np.float64)

    return lookup


def _score_fit(
    k: int, audited: list[Any], pairs: list[tuple[int, int, bool]]
) -> Callable[[Reports, Reports], Callable[[Reports], IntArray]]:
    """Fit the "likelihood-ratio score" of bit-vector reports on the selection halves.

    Outside the audited values the columns are independent and identically
    distributed given the sequence (each is one permanent bit, flipped per report),
    so for T = 2 the column counts are sufficient there and their log likelihood
    ratio is Σ count · ln(π_x / π_y), π the per-column rate of each count
    estimated on the selection half; the bits at the values add their own
    estimated log ratio. The score, quantized at `SCORE_STEP`, is the key.
    """
    counts = _column_counts(k, audited, pairs)
    value_bits = _value_bits(audited)

    def fit(x_sel: Reports, y_sel: Reports) -> Callable[[Reports], IntArray]:
        """The score's key function, from the selection halves of x and x'."""
        cx, cy = counts(x_sel).sum(axis=0) + 0.5, counts(y_sel).sum(axis=0) + 0.5
        weights = np.log(cx / cy)
        values = _log_ratio_table(value_bits(x_sel), value_bits(y_sel))

        def keys(reports: Reports) -> IntArray:
            """Each user's quantized score."""
            score = counts(reports) @ weights + values(value_bits(reports))
            return np.asarray(np.round(score / SCORE_STEP), dtype=np.int64)

        return keys

    return fit


def _bit_features(
    mech: Any, audited: list[Any], pairs: list[tuple[int, int, bool]], reports: int
) -> list[SequenceFeature]:
    """The features of bit-vector reports whose key space fits `MAX_KEYS`."""
    features = []
    if len(audited) * reports <= MAX_KEYS.bit_length() - 1:
        features.append(SequenceFeature("bits at the values", _value_bits(audited)))
    if len(audited) < mech.k:
        base = mech.k * len(pairs) + 1
        for both, name in (
            (True, "fingerprint: columns both set, columns differing"),
            (False, "agreement: columns differing"),
        ):
            if base ** len(_fingerprint_parts(pairs, both)) <= MAX_COUNT_KEY:
                features.append(SequenceFeature(name, _fingerprint(mech.k, audited, pairs, both)))
        if len(audited) * reports <= MAX_KEYS.bit_length() - 1:
            fit = _score_fit(mech.k, audited, pairs)
            features.append(SequenceFeature("likelihood-ratio score", _unfitted, fit))
    return features


def sequence_features(
    kind: str, mech: Any, x: Sequence, y: Sequence
) -> tuple[SequenceFeature, ...]:
    """The features audited on the sequence pair (x, y) for reports of `kind`."""
    pairs = differing_pairs(x.values, y.values)
    if not pairs:
        return ()
    audited = sorted(set(x.values) | set(y.values))
    features: list[SequenceFeature] = []
    if kind != "bits":  # bit vectors of a large k are almost never equal: the fingerprint
        features.append(SequenceFeature("equal reports", _equalities(kind, pairs)))
    if kind == "category" and (len(audited) + 1) ** len(x.values) << len(pairs) <= MAX_KEYS:
        features.append(SequenceFeature("classes and equal reports", _classes(audited, pairs)))
    if kind == "bits":
        features.extend(_bit_features(mech, audited, pairs, len(x.values)))
    if (
        kind in ("hashed", "index_bits")
        and 4 ** (len(audited) * len(x.values)) << len(pairs) <= MAX_KEYS
    ):
        name = "supports of the values and equal reports"
        features.append(SequenceFeature(name, _supports(kind, mech, audited, pairs)))
    return tuple(features)


def sample_device(
    mech: Any, kind: str, seq: Sequence, users: int, rng: random.Random | None
) -> Reports:
    """`users` simulated devices, each with a fresh memo, reporting the values of `seq`."""
    columns: list[list[Output]] = [[] for _ in seq.values]
    for _ in range(users):
        memo = mech.new_memo()
        for column, value in zip(columns, seq.values, strict=True):
            column.append(_perturb(mech, value, rng, memo))
    return Reports(kind, [device_column(kind, c) for c in columns])


def _per_value(mech: Any) -> bool:
    """Whether `mech` keeps one independent permanent response per value (memo.py's
    RAPPOR family), so that a sequence's reports are drawn value by value."""
    return isinstance(mech, (MemoizedUnary, RapporGRR))


def _sequence_form(mech: Any) -> Callable[[Any, np.random.Generator], Any] | None:
    """The mechanism's batch path over values (n, T), if it has one: its
    `perturb_batch_sequences`, or a `perturb_batch_longitudinal(values, rng)`."""
    sequences = getattr(mech, "perturb_batch_sequences", None)
    if callable(sequences):
        return sequences  # type: ignore[no-any-return]
    longitudinal = getattr(mech, "perturb_batch_longitudinal", None)
    if callable(longitudinal) and not takes_report_count(longitudinal):
        return longitudinal  # type: ignore[no-any-return]
    return None


def has_batch_path(mech: Any) -> bool:
    """Whether the batch path can draw sequences for `mech` (module doc, "Paths")."""
    return _sequence_form(mech) is not None or _per_value(mech)


def sample_batch(
    mech: Any, kind: str, seq: Sequence, users: int, generator: np.random.Generator
) -> Reports:
    """`users` simulated devices reporting `seq`, on the numpy path (`has_batch_path`)."""
    dtype = np.float64 if any(isinstance(v, float) for v in seq.values) else np.int64
    rounds = len(seq.values)
    sequences = _sequence_form(mech)
    if sequences is not None:
        values = np.tile(np.asarray(seq.values, dtype=dtype), (users, 1))
        return Reports(kind, split_rounds(kind, sequences(values, generator), rounds))
    if not _per_value(mech):
        raise ValueError(f"{mech.wire_id} has no batch path for sequences of values")
    longitudinal: Any = mech.perturb_batch_longitudinal
    columns: list[Any] = [None] * rounds
    for value in dict.fromkeys(seq.values):  # one permanent response per value (memo.py)
        positions = [t for t, v in enumerate(seq.values) if v == value]
        out = longitudinal(np.full(users, value, dtype=dtype), len(positions), generator)
        for t, column in zip(positions, split_rounds(kind, out, len(positions)), strict=True):
            columns[t] = column
    return Reports(kind, columns)
