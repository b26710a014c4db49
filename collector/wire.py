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

from fedldp.client.mechanisms.base import CategoryOutput, Output
from fedldp.client.wire import (
    REPORT_ID_BYTES,
    fill_payload,
    kind_of,
    kind_of_json,
    output_from_report,
)
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
    kind = kind_of(output)
    report = collector_pb2.Report()
    kind.fill(report, output)
    return {kind.payload: getattr(report, kind.payload)}


def _output_encoding(output: Output) -> bytes:
    """The output's part of `content_digest`'s input: its kind's tag, then its encoding."""
    kind = kind_of(output)
    return kind.tag + kind.encode(output)


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
    if type(output) is CategoryOutput:  # the common case (docs/performance.md)
        return f'{{"k":"category","index":{int(output.index)}}}'
    kind = kind_of(output)
    obj = {"k": kind.json_kind, **kind.to_json(output)}
    return json.dumps(obj, separators=(",", ":"))


def output_from_json(text: str) -> Output:
    """Inverse of `output_to_json`."""
    obj = json.loads(text)
    return kind_of_json(obj["k"]).from_json(obj)
