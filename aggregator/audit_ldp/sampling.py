"""Run the shipped randomizer on one input, many times, through the device or the batch path.

The device path calls `mech.perturb(value)` exactly as the SDK does: `rng=None`
(the OS CSPRNG, `secrets.SystemRandom`) unless a test passes a seeded
`random.Random`, and, for a memoized mechanism, one fresh `MemoState` per
simulated user shared by that user's T reports (the SDK keeps one permanent
response per (user, metric, value); `client/sdk.py`, `_perturb_memoized`).
A numeric report is taken from the wire: the `NumericPayload` message the SDK
sends (`fedldp.client.wire.fill_payload`), serialized, and its IEEE-754 binary64
bit pattern read back from those bytes.

The batch path calls `mech.perturb_batch(values, generator)` (for T reports of
a memoized mechanism, `perturb_batch_longitudinal(values, T, generator)`), and
reads a numeric output's bit pattern from its float64 array (the same bytes as
struct.pack('<d')).

Both paths return `Reports`: per report index t < T, one column in the batch
layout of the mechanism (int64 indices; uint8 packed rows; (seeds, values);
uint64 bit patterns for numeric outputs; (groups, keys, values) for PEM's
group-hashed outputs; (rows, packed rows) for CMS and (rows, columns, bits)
for HCMS sketch reports).
"""

from __future__ import annotations

import inspect
import random
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    GroupHashedOutput,
    HashedOutput,
    IndexBitsOutput,
    Mechanism,
    MultiOutput,
    NumericOutput,
    Output,
    SketchBitOutput,
    SketchRowOutput,
)
from fedldp.client.wire import fill_payload
from fedldp.v1 import collector_pb2

if TYPE_CHECKING:
    import numpy.typing as npt

#: Output kinds the auditor reads (the payload kinds of the wire contract it supports).
KINDS: dict[type, str] = {
    CategoryOutput: "category",
    BitVectorOutput: "bits",
    HashedOutput: "hashed",
    NumericOutput: "numeric",
    MultiOutput: "joint",
    GroupHashedOutput: "group_hashed",
    SketchRowOutput: "sketch_row",
    SketchBitOutput: "sketch_bit",
    IndexBitsOutput: "index_bits",
}
#: Kinds whose batch column is a tuple of arrays over the users.
TUPLE_KINDS = ("hashed", "group_hashed", "sketch_row", "sketch_bit", "index_bits")
_TUPLE_KINDS = TUPLE_KINDS
#: NumericPayload's only field, `double value = 1`: wire type 1 (64-bit), tag byte 0x09.
_DOUBLE_TAG = 0x09


@dataclass(frozen=True)
class Reports:
    """n users' reports on one input: `columns[t]` holds every user's t-th report."""

    kind: str
    columns: list[Any]

    @property
    def n(self) -> int:
        """Number of users."""
        first = self.columns[0]
        return int((first[0] if self.kind in _TUPLE_KINDS else first).shape[0])

    def rows(self, start: int, stop: int) -> Reports:
        """Users start..stop-1."""
        if self.kind in _TUPLE_KINDS:
            cols = [tuple(part[start:stop] for part in c) for c in self.columns]
            return Reports(self.kind, cols)
        return Reports(self.kind, [c[start:stop] for c in self.columns])


def output_kind(mech: Mechanism, value: Any) -> str:  # type: ignore[type-arg]
    """The payload kind of `mech`'s reports (one report of `value`, seeded generator)."""
    probe = _perturb(mech, value, random.Random(0), _new_memo(mech))
    try:
        return KINDS[type(probe)]
    except KeyError:
        raise ValueError(f"{mech.wire_id}: cannot audit {type(probe).__name__} reports") from None


def is_memoized(mech: Any) -> bool:
    """Whether `mech` keeps device state between reports (duck typing): it has
    `new_memo()` and takes `perturb(value, memo=...)`, like the RAPPOR family of
    memo.py and any longitudinal mechanism built the same way."""
    return callable(getattr(mech, "new_memo", None))


def _new_memo(mech: Mechanism) -> Any:  # type: ignore[type-arg]
    memoized: Any = mech
    return memoized.new_memo() if is_memoized(mech) else None


def _perturb(mech: Mechanism, value: Any, rng: random.Random | None, memo: Any) -> Output:  # type: ignore[type-arg]
    if memo is None:
        return mech.perturb(value, rng=rng)
    memoized: Any = mech  # a memoized mechanism takes memo= (is_memoized)
    out: Output = memoized.perturb(value, rng=rng, memo=memo)
    return out


def wire_bits(output: NumericOutput) -> int:
    """The binary64 bit pattern of a numeric report as the device serializes it."""
    report = collector_pb2.Report()
    fill_payload(report, output)
    raw = report.numeric.SerializeToString()
    if not raw:  # proto3 leaves out the default +0.0
        return 0
    if len(raw) != 9 or raw[0] != _DOUBLE_TAG:
        raise ValueError("unexpected NumericPayload encoding")
    return int.from_bytes(raw[1:], "little")


def joint_key(output: MultiOutput) -> int:
    """A multi-attribute report as one key: the first 56 bits of the SHA-256 of its
    digest encoding (client/wire.py, tag "M"), which names every part's attribute,
    kind and exact payload bits; distinct reports collide with probability ~2^-56."""
    import hashlib

    from fedldp.client.wire import KINDS as WIRE_KINDS

    digest = hashlib.sha256(WIRE_KINDS[MultiOutput].encode(output)).digest()
    return int.from_bytes(digest[:7], "little")


def _exact_parts(output: MultiOutput) -> tuple[object, ...]:
    """A dict key equal for two reports exactly when their wire bytes are: numeric parts
    by their binary64 bits (+0.0 and -0.0 are equal floats but different reports)."""
    return tuple(
        (a, struct.pack("<d", p.value) if isinstance(p, NumericOutput) else p)
        for a, p in output.parts
    )


def _joint_keys(outputs: list[MultiOutput]) -> Iterator[int]:
    """`joint_key` of each report, computed once per distinct report (a batch repeats
    few distinct reports many times; the key hashes the whole wire encoding)."""
    seen: dict[tuple[object, ...], int] = {}
    for output in outputs:
        exact = _exact_parts(output)
        key = seen.get(exact)
        if key is None:
            key = seen[exact] = joint_key(output)
        yield key


def device_column(kind: str, outputs: list[Output]) -> Any:
    """One report per user, from `perturb` outputs, in the batch layout of `kind`
    (multi-attribute reports: their `joint_key`s)."""
    if kind == "joint":
        return np.fromiter(_joint_keys(outputs), dtype=np.int64, count=len(outputs))  # type: ignore[arg-type]
    if kind == "category":
        return np.fromiter((o.index for o in outputs), dtype=np.int64, count=len(outputs))  # type: ignore[union-attr]
    if kind == "bits":
        raw = b"".join(o.bits for o in outputs)  # type: ignore[union-attr]
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(outputs), -1)
    if kind == "sketch_row":
        rows = np.fromiter((o.row for o in outputs), dtype=np.int64, count=len(outputs))  # type: ignore[union-attr]
        packed = b"".join(o.bits for o in outputs)  # type: ignore[union-attr]
        return rows, np.frombuffer(packed, dtype=np.uint8).reshape(len(outputs), -1)
    if kind == "sketch_bit":
        triples = [(o.row, o.column, o.bit) for o in outputs]  # type: ignore[union-attr]
        array = np.array(triples, dtype=np.int64).reshape(len(outputs), 3)
        return array[:, 0], array[:, 1], array[:, 2].astype(np.bool_)
    if kind == "hashed":
        seeds = np.fromiter((o.seed for o in outputs), dtype=np.int64, count=len(outputs))  # type: ignore[union-attr]
        values = np.fromiter((o.value for o in outputs), dtype=np.int64, count=len(outputs))  # type: ignore[union-attr]
        return seeds, values
    if kind == "group_hashed":
        return _group_hashed_column(outputs)  # type: ignore[arg-type]
    if kind == "index_bits":
        indices = np.array([o.indices for o in outputs], dtype=np.int64)  # type: ignore[union-attr]
        packed = b"".join(o.bits for o in outputs)  # type: ignore[union-attr]
        return indices.reshape(len(outputs), -1), np.frombuffer(packed, dtype=np.uint8).reshape(
            len(outputs), -1
        )
    return np.fromiter((wire_bits(o) for o in outputs), dtype=np.uint64, count=len(outputs))  # type: ignore[arg-type]


def _group_hashed_column(
    outputs: list[GroupHashedOutput],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.uint64], npt.NDArray[np.int64]]:
    """(groups, keys as little-endian uint64 words [n, c + 1], values) of PEM outputs."""
    n = len(outputs)
    groups = np.fromiter((o.group for o in outputs), dtype=np.int64, count=n)
    raw = b"".join(o.key for o in outputs)
    keys = np.frombuffer(raw, dtype="<u8").reshape(n, -1).astype(np.uint64)
    values = np.fromiter((o.value for o in outputs), dtype=np.int64, count=n)
    return groups, keys, values


def sample_device(
    mech: Mechanism,  # type: ignore[type-arg]
    kind: str,
    value: Any,
    users: int,
    reports: int,
    rng: random.Random | None,
) -> Reports:
    """`users` simulated devices each sending `reports` reports of `value`."""
    columns: list[list[Output]] = [[] for _ in range(reports)]
    for _ in range(users):
        memo = _new_memo(mech)
        for column in columns:
            column.append(_perturb(mech, value, rng, memo))
    return Reports(kind, [device_column(kind, c) for c in columns])


def batch_column(kind: str, output: Any) -> Any:
    """The layout of a `perturb_batch` result (numeric: float64 -> uint64 bit patterns)."""
    if kind == "numeric":
        floats: npt.NDArray[np.float64] = np.ascontiguousarray(output, dtype=np.float64)
        return floats.view(np.uint64)
    return output


def sample_batch(
    mech: Mechanism,  # type: ignore[type-arg]
    kind: str,
    value: Any,
    users: int,
    reports: int,
    generator: np.random.Generator,
) -> Reports:
    """`users` simulated devices each sending `reports` reports of `value` (numpy path)."""
    if kind == "joint":  # a multi-attribute mechanism: one value per attribute
        columns = [np.full(users, v) for v in value]
        batch = mech.perturb_batch(columns, generator)
        distinct, inverse = mech.distinct_outputs(batch)  # type: ignore[attr-defined]
        keys = np.fromiter(map(joint_key, distinct), dtype=np.int64, count=len(distinct))
        return Reports(kind, [keys[inverse]])
    dtype = np.float64 if kind == "numeric" or isinstance(value, float) else np.int64
    values: Any = [value] * users if isinstance(value, str) else np.full(users, value, dtype=dtype)
    if reports == 1:
        return Reports(kind, [batch_column(kind, mech.perturb_batch(values, generator))])
    longitudinal = getattr(mech, "perturb_batch_longitudinal", None)
    if longitudinal is None:
        raise ValueError(f"{mech.wire_id} has no batch path for {reports} reports per user")
    if takes_report_count(longitudinal):  # (values, T, rng): T reports of one value
        out = longitudinal(values, reports, generator)
    else:  # (values (n, T), rng): one value per user and round
        out = longitudinal(np.repeat(values[:, None], reports, axis=1), generator)
    return Reports(kind, split_rounds(kind, out, reports))


def takes_report_count(longitudinal: Any) -> bool:
    """Whether a `perturb_batch_longitudinal` is the (values, reports, rng) form (one
    value per user, memo.py's RAPPOR family) rather than (values (n, T), rng), which
    takes a value per user and round (loloha, dbitflip)."""
    return len(inspect.signature(longitudinal).parameters) == 3


def split_rounds(kind: str, out: Any, rounds: int) -> list[Any]:
    """The per-round report columns of a longitudinal batch result.

    Layouts: (n, T) indices or (n, T, bytes) packed rows; hashed (seeds (n,) shared
    or (n, T), values (n, T)); index_bits (indices (n, d) shared, bits (n, T, bytes)).
    """
    if kind == "hashed":
        seeds, hashed = out
        return [(seeds if seeds.ndim == 1 else seeds[:, t], hashed[:, t]) for t in range(rounds)]
    if kind == "index_bits":
        indices, bits = out
        return [(indices, bits[:, t]) for t in range(rounds)]
    if kind in TUPLE_KINDS:
        return [tuple(part[:, t] for part in out) for t in range(rounds)]
    return [batch_column(kind, out[:, t]) for t in range(rounds)]
