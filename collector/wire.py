"""Conversion between the wire's `Report` and mechanism outputs, and report digests.

`output_from_report` is the one decoder of the `payload` oneof (it lives in
`fedldp.client.wire` so the SDK needs no server code; it is re-exported here).
`payload_fields` gives the keyword arguments that build a `Report` with a
payload, e.g. ``collector_pb2.Report(report_id=..., **payload_fields(output))``.
`content_digest` is the canonical digest the ledger uses for idempotency: two
reports with the same id and the same digest are the same report.

Compatibility rule (stored in the ledger): the digest encoding below never
changes meaning; a new payload kind gets a new tag byte.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitOutput,
    NumericOutput,
    Output,
)
from fedldp.client.wire import REPORT_ID_BYTES, fill_payload, output_from_report
from fedldp.v1 import collector_pb2

__all__ = [
    "REPORT_ID_BYTES",
    "content_digest",
    "fill_payload",
    "output_from_json",
    "output_from_report",
    "output_to_json",
    "payload_fields",
]

_DIGEST_DOMAIN = b"fedldp.report.v1\x00"


def payload_fields(output: Output) -> dict[str, Any]:
    """Keyword arguments setting a `Report`'s payload oneof to `output`."""
    if isinstance(output, CategoryOutput):
        return {"category": collector_pb2.CategoryPayload(index=output.index)}
    if isinstance(output, BitVectorOutput):
        return {"bits": collector_pb2.BitVectorPayload(bits=output.bits, length=output.length)}
    if isinstance(output, HashedOutput):
        return {"hashed": collector_pb2.HashedPayload(seed=output.seed, value=output.value)}
    if isinstance(output, NumericOutput):
        return {"numeric": collector_pb2.NumericPayload(value=output.value)}
    if isinstance(output, IndexBitOutput):
        return {"index_bit": collector_pb2.IndexBitPayload(index=output.index, bit=output.bit)}
    raise TypeError(f"unknown output type {type(output).__name__}")


def _output_encoding(output: Output) -> bytes:
    if isinstance(output, CategoryOutput):
        return b"C" + struct.pack("<Q", output.index)
    if isinstance(output, BitVectorOutput):
        return b"B" + struct.pack("<Q", output.length) + output.bits
    if isinstance(output, HashedOutput):
        return b"H" + struct.pack("<QQ", output.seed, output.value)
    if isinstance(output, NumericOutput):
        return b"N" + struct.pack("<d", output.value)
    if isinstance(output, IndexBitOutput):
        return b"I" + struct.pack("<Q?", output.index, output.bit)
    raise TypeError(f"unknown output type {type(output).__name__}")


def digest_prefix(policy_id: str, policy_version: int, policy_digest: bytes) -> bytes:
    """The policy part of `content_digest`'s input (see `digest_state`)."""
    pid = policy_id.encode("utf-8")
    return (
        _DIGEST_DOMAIN
        + struct.pack("<I", len(pid))
        + pid
        + struct.pack("<QI", policy_version, len(policy_digest))
        + policy_digest
    )


def digest_state(policy_id: str, policy_version: int, policy_digest: bytes) -> hashlib._Hash:
    """SHA-256 fed with `digest_prefix`: `content_digest` up to a report's own part.

    Computed once per policy; `digest_from_state` copies it for each report, so the
    prefix's first 64-byte block is compressed once rather than per report (a
    category report's input is two blocks: the copy saves about 0.2 µs of 0.7).
    """
    return hashlib.sha256(digest_prefix(policy_id, policy_version, policy_digest))


#: The coarse time and a category output's encoding (`_output_encoding`) in one
#: struct: the same bytes as the two packs, about 0.3 µs less per report.
_TIME_AND_CATEGORY = struct.Struct("<qcQ")


def digest_from_state(state: hashlib._Hash, coarse_time: int, output: Output) -> bytes:
    """`content_digest` of a report, given `digest_state` of its policy (left unchanged)."""
    h = state.copy()
    if type(output) is CategoryOutput:  # the common case
        h.update(_TIME_AND_CATEGORY.pack(coarse_time, b"C", output.index))
    else:
        h.update(struct.pack("<q", coarse_time) + _output_encoding(output))
    return h.digest()


def content_digest(
    *, policy_id: str, policy_version: int, policy_digest: bytes, coarse_time: int, output: Output
) -> bytes:
    """SHA-256 over a canonical, length-prefixed encoding of a report's content.

    Everything but the report id: the policy (id, version, digest), the coarse
    time and the payload. Independent of protobuf serialization details.
    """
    state = digest_state(policy_id, policy_version, policy_digest)
    return digest_from_state(state, coarse_time, output)


def output_to_json(output: Output) -> str:
    """The stored form of a randomized output (the ledger's `reports.payload`).

    Exact: integers as JSON integers, bits as hex, a numeric value as the shortest
    repr that round-trips the double.
    """
    if type(output) is CategoryOutput:  # the common case, without json.dumps
        return f'{{"k":"category","index":{int(output.index)}}}'
    if isinstance(output, CategoryOutput):
        obj: dict[str, Any] = {"k": "category", "index": output.index}
    elif isinstance(output, BitVectorOutput):
        obj = {"k": "bits", "bits": output.bits.hex(), "length": output.length}
    elif isinstance(output, HashedOutput):
        obj = {"k": "hashed", "seed": output.seed, "value": output.value}
    elif isinstance(output, NumericOutput):
        obj = {"k": "numeric", "value": output.value}
    elif isinstance(output, IndexBitOutput):
        obj = {"k": "index_bit", "index": output.index, "bit": output.bit}
    else:
        raise TypeError(f"unknown output type {type(output).__name__}")
    return json.dumps(obj, separators=(",", ":"))


def output_from_json(text: str) -> Output:
    """Inverse of `output_to_json`."""
    obj = json.loads(text)
    kind = obj["k"]
    if kind == "category":
        return CategoryOutput(int(obj["index"]))
    if kind == "bits":
        return BitVectorOutput(bytes.fromhex(obj["bits"]), int(obj["length"]))
    if kind == "hashed":
        return HashedOutput(int(obj["seed"]), int(obj["value"]))
    if kind == "numeric":
        return NumericOutput(float(obj["value"]))
    if kind == "index_bit":
        return IndexBitOutput(int(obj["index"]), bool(obj["bit"]))
    raise ValueError(f"unknown stored payload kind {kind!r}")
