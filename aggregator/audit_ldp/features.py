"""Features: map each simulated user's reports to one integer key; events are sets of keys.

An ε-LDP mechanism satisfies the ratio bound for every event on its output, in
particular for every set of values of any function of the output (post-processing;
Dwork and Roth, "The Algorithmic Foundations of Differential Privacy", 2014,
Proposition 2.1). Each feature below is such a function, chosen to keep the
key space small enough that a few hundred thousand samples find the worst set:

* category reports — the output index itself; and the class of each report
  (= x, = x', other), joint over a user's T reports;
* bit vectors — bits x and x' of each report (joint over T), plus, for T = 1,
  the number of set bits;
* hashed reports (OLH) — whether the report supports x and whether it supports
  x', by the hash family of the wire contract (proto/fedldp/v1/collector.proto);
* sketch reports (CMS, HCMS) — the report's row J and whether it supports x and
  whether it supports x' (CMS: the bit at cell h_J(x) is set; HCMS: the bit is
  the sign of H[h_J(x)][column]), by the sketch hash family of the wire contract;
* group-hashed reports (PEM) — the group and whether the report supports the
  prefix of x, and of x', at the group's length (`PEM.supports_batch`, the
  hash family of the wire contract);
* index-bits reports (dBitFlipPM) — per report, whether the buckets of x and of x'
  are among its sampled indices and its bits there, joint over T;
* numeric reports — the RAW BITS of the binary64 wire value: (sign, exponent)
  with the last 1, 4 or 8 mantissa bits; (sign, exponent, first 4 mantissa bits),
  an interval; and each of the 8 bytes. A mechanism whose output set depends on
  its input (Mironov, "On Significance of the Least Significant Bits for
  Differential Privacy", CCS 2012) shows up as keys seen under one input only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fedldp.aggregator.audit_ldp.sampling import Reports

if TYPE_CHECKING:
    import numpy.typing as npt

    IntArray = npt.NDArray[np.int64]

#: keys(reports, x, x', mechanism) -> one int64 key per user.
KeyFunction = Callable[[Reports, Any, Any, Any], "IntArray"]

_MANTISSA_BITS = 52
_MANTISSA_MASK = (1 << _MANTISSA_BITS) - 1


@dataclass(frozen=True)
class Feature:
    """A named function of a user's reports; `pairwise` when it depends on (x, x')."""

    name: str
    keys: KeyFunction
    pairwise: bool


def _as_keys(values: Any) -> IntArray:
    """An int64 key array (keys are small non-negative integers)."""
    return np.asarray(values, dtype=np.int64)


def _joint(parts: list[IntArray], base: int) -> IntArray:
    """Combine per-report keys in [0, base) into one key per user (base-`base` digits)."""
    key = np.zeros(parts[0].shape[0], dtype=np.int64)
    for part in reversed(parts):
        key = key * base + part
    return key


def _category_index(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    return np.asarray(reports.columns[0], dtype=np.int64)


def _category_class(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    parts = [np.where(c == x, 0, np.where(c == y, 1, 2)).astype(np.int64) for c in reports.columns]
    return _joint(parts, 3)


def _bit(rows: npt.NDArray[np.uint8], i: int) -> IntArray:
    """Bit i of packed little-endian rows."""
    return _as_keys((rows[:, i >> 3] >> (i & 7)) & 1)


def _bits_pair(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    return _joint([_bit(c, x) + 2 * _bit(c, y) for c in reports.columns], 4)


def _bits_pair_weight(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    rows = reports.columns[0]
    weight = np.unpackbits(rows, axis=1).sum(axis=1, dtype=np.int64)
    return _as_keys(_bit(rows, x) + 2 * _bit(rows, y) + 4 * weight)


def olh_hash(seeds: IntArray, value: int, g: int, m: int) -> IntArray:
    """h_seed(value) for an array of seeds, as the wire contract defines it.

    seed = s_0 + s_1 g + ... + s_m g^m, value = v_0 + ... + v_{m-1} g^{m-1} (base g),
    h = (s_m + Σ_j s_j v_j) mod g  (collector.proto, HashedPayload).
    """
    rest = seeds.copy()
    acc = np.zeros(seeds.shape[0], dtype=np.int64)
    for _ in range(m):
        rest, digit = np.divmod(rest, g)
        value, v = divmod(value, g)
        acc = (acc + digit * v) % g
    return _as_keys((acc + rest) % g)


def _hashed_support(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    seeds, hashed = reports.columns[0]
    sx = olh_hash(seeds, x, mech.g, mech.m) == hashed
    sy = olh_hash(seeds, y, mech.g, mech.m) == hashed
    return _as_keys(sx.astype(np.int64) + 2 * sy.astype(np.int64))


def sketch_supports(reports: Reports, value: Any, mech: Any) -> npt.NDArray[np.bool_]:
    """Per report: does it support `value` (CMS: bit h_J(value) set; HCMS: bit equal to
    the sign of H[h_J(value)][column], True = +1), by the contract's sketch hash."""
    cells = mech.hash_table([value])[0]
    if reports.kind == "sketch_row":
        rows, packed = reports.columns[0]
        cell = cells[rows]
        bits = (packed[np.arange(rows.shape[0]), cell >> 3] >> (cell & 7)) & 1
        return np.asarray(bits == 1, dtype=np.bool_)
    rows, columns, bits = reports.columns[0]
    folded = cells[rows] & columns
    parity = np.zeros(rows.shape[0], dtype=np.int64)
    while np.any(folded):
        parity ^= folded & 1
        folded = folded >> 1
    return np.asarray((parity == 0) == bits, dtype=np.bool_)


def _sketch_support(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    rows = reports.columns[0][0]
    sx = sketch_supports(reports, x, mech).astype(np.int64)
    sy = sketch_supports(reports, y, mech).astype(np.int64)
    return _as_keys(4 * rows + sx + 2 * sy)


def _group_support(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    column = reports.columns[0]
    sx = mech.supports_batch(column, x).astype(np.int64)
    sy = mech.supports_batch(column, y).astype(np.int64)
    return _as_keys(4 * np.asarray(column[0], dtype=np.int64) + sx + 2 * sy)


def index_support(column: Any, value: Any, mech: Any) -> IntArray:
    """Per index-bits report (dBitFlipPM): 2·[the value's bucket is among its indices]
    + its bit there (0 when absent)."""
    indices, packed = column
    bucket = mech.bucket(value) if callable(getattr(mech, "bucket", None)) else int(value)
    hit = np.asarray(indices) == bucket
    present = hit.any(axis=1)
    position = hit.argmax(axis=1)
    rows = np.arange(position.shape[0])
    bit = (packed[rows, position >> 3] >> (position & 7)) & 1
    return _as_keys(2 * present + (present & (bit == 1)))


def _index_support(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    parts = [index_support(c, x, mech) + 4 * index_support(c, y, mech) for c in reports.columns]
    return _joint(parts, 16)


def _numeric_bits(reports: Reports) -> npt.NDArray[np.uint64]:
    return np.asarray(reports.columns[0], dtype=np.uint64)


def _sign_exponent_low(bits: int) -> KeyFunction:
    def keys(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
        u = _numeric_bits(reports)
        high = u >> np.uint64(_MANTISSA_BITS)
        return _as_keys((high << np.uint64(bits)) | (u & np.uint64((1 << bits) - 1)))

    return keys


def _sign_exponent_top4(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
    u = _numeric_bits(reports)
    return _as_keys(u >> np.uint64(_MANTISSA_BITS - 4))


def _byte(j: int) -> KeyFunction:
    def keys(reports: Reports, x: Any, y: Any, mech: Any) -> IntArray:
        return _as_keys((_numeric_bits(reports) >> np.uint64(8 * j)) & np.uint64(0xFF))

    return keys


NUMERIC_FEATURES: tuple[Feature, ...] = (
    Feature("sign, exponent, last mantissa bit", _sign_exponent_low(1), False),
    Feature("sign, exponent, last 4 mantissa bits", _sign_exponent_low(4), False),
    Feature("sign, exponent, last 8 mantissa bits", _sign_exponent_low(8), False),
    Feature("sign, exponent, first 4 mantissa bits (interval)", _sign_exponent_top4, False),
    *(Feature(f"wire byte {j}", _byte(j), False) for j in range(8)),
)


def features_for(kind: str, reports: int) -> tuple[Feature, ...]:
    """The features audited for reports of `kind`, `reports` per user."""
    if kind == "numeric":
        return NUMERIC_FEATURES
    if kind == "joint":  # multi-attribute: the whole report over all its parts
        return (Feature("joint report (all attributes)", _category_index, False),)
    if kind == "hashed":
        return (Feature("supports x, supports x'", _hashed_support, True),)
    if kind in ("sketch_row", "sketch_bit"):
        return (Feature("row, supports x, supports x'", _sketch_support, True),)
    if kind == "group_hashed":
        return (Feature("group, supports x, supports x'", _group_support, True),)
    if kind == "index_bits":
        name = "buckets of x, x' sampled, their bits" + (
            f" ({reports} reports)" if reports > 1 else ""
        )
        return (Feature(name, _index_support, True),)
    if kind == "bits":
        if reports == 1:
            return (Feature("bits x, x' and weight", _bits_pair_weight, True),)
        return (Feature(f"bits x, x' of {reports} reports", _bits_pair, True),)
    joint = Feature(
        "report = x, = x', other" + (f" ({reports} reports)" if reports > 1 else ""),
        _category_class,
        True,
    )
    if reports == 1:
        return (Feature("output index", _category_index, False), joint)
    return (joint,)
