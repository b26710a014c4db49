"""Conversion between mechanism outputs and the wire's `Report` payload.

The one place that maps `fedldp.client.mechanisms` Output dataclasses to and from
the `payload` oneof of `fedldp.v1.Report`. The device uses `fill_payload` to build
a report; the collector uses `output_from_report` before running the mechanism's
own output-domain check. Neither ever sees or carries the raw value.
"""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedldp.client.mechanisms.base import (
    AttributeOutput,
    BitVectorOutput,
    CategoryOutput,
    GroupHashedOutput,
    HashedOutput,
    IndexBitOutput,
    IndexBitsOutput,
    MultiOutput,
    NumericOutput,
    Output,
    OutputDomainError,
    SealedOutput,
    SketchBitOutput,
    SketchRowOutput,
)
from fedldp.client.mechanisms.multi import MAX_ATTRIBUTES
from fedldp.v1 import collector_pb2

#: Length of a report id in bytes (made by the device: `fedldp.client.report_ids`).
REPORT_ID_BYTES = 16


@dataclass(frozen=True)
class OutputKind:
    """How one mechanism output type travels and is stored: the one dispatch over
    the output types (`KINDS`). Every conversion of an output (the wire payload,
    the ledger's digest encoding and stored JSON) goes through its kind.

    `payload`: the `Report.payload` oneof field; `fill(report, output)` sets it
    and `read(message)` is its inverse. `tag` + `encode(output)`: the output's
    part of the content digest (fedldp.collector.wire; a new kind gets a new tag,
    a tag never changes meaning). `json_kind` with `to_json`/`from_json`: the
    stored form (the ledger's `reports.payload`).
    """

    type: type[Output]
    payload: str
    fill: Callable[[collector_pb2.Report, Any], None]
    read: Callable[[Any], Output]
    tag: bytes
    encode: Callable[[Any], bytes]
    json_kind: str
    to_json: Callable[[Any], dict[str, Any]]
    from_json: Callable[[dict[str, Any]], Output]


def _fill_category(report: collector_pb2.Report, o: CategoryOutput) -> None:
    report.category.index = o.index


def _fill_bits(report: collector_pb2.Report, o: BitVectorOutput) -> None:
    report.bits.bits = o.bits
    report.bits.length = o.length


def _fill_hashed(report: collector_pb2.Report, o: HashedOutput) -> None:
    report.hashed.seed = o.seed
    report.hashed.value = o.value


def _fill_numeric(report: collector_pb2.Report, o: NumericOutput) -> None:
    report.numeric.value = o.value


def _fill_index_bit(report: collector_pb2.Report, o: IndexBitOutput) -> None:
    report.index_bit.index = o.index
    report.index_bit.bit = o.bit


def _fill_sketch_row(report: collector_pb2.Report, o: SketchRowOutput) -> None:
    report.sketch_row.row = o.row
    report.sketch_row.bits = o.bits
    report.sketch_row.length = o.length


def _fill_sketch_bit(report: collector_pb2.Report, o: SketchBitOutput) -> None:
    report.sketch_bit.row = o.row
    report.sketch_bit.column = o.column
    report.sketch_bit.bit = o.bit


def _fill_group_hashed(report: collector_pb2.Report, o: GroupHashedOutput) -> None:
    report.group_hashed.group = o.group
    report.group_hashed.key = o.key
    report.group_hashed.value = o.value


def _fill_sealed(report: collector_pb2.Report, o: SealedOutput) -> None:
    report.sealed.ciphertext = o.ciphertext
    report.sealed.key_id = o.key_id


def _encode_sealed(o: SealedOutput) -> bytes:
    key = o.key_id.encode("utf-8")
    return struct.pack("<QI", len(o.ciphertext), len(key)) + o.ciphertext + key


def _fill_multi(report: collector_pb2.Report, o: MultiOutput) -> None:
    multi = report.multi
    multi.SetInParent()  # an empty part list is still a multi payload (refused by the check)
    for attribute, output in o.parts:
        part = multi.parts.add()
        part.attribute = attribute
        kind = _attribute_kind(output)
        kind.fill(part, output)  # type: ignore[arg-type]  # AttributePayload has the same fields


def _read_multi(m: collector_pb2.MultiPayload) -> MultiOutput:
    """The parts of a MultiPayload. A list longer than any multi-attribute metric
    allows (MAX_ATTRIBUTES) is refused as WRONG_LENGTH before any part is decoded;
    the mechanism's `check_output` then checks the policy's exact count."""
    if len(m.parts) > MAX_ATTRIBUTES:
        raise OutputDomainError(
            "WRONG_LENGTH", f"a multi-attribute report has at most {MAX_ATTRIBUTES} parts"
        )
    parts: list[tuple[int, AttributeOutput]] = []
    for part in m.parts:
        kind = _BY_PAYLOAD.get(part.WhichOneof("payload") or "")
        if kind is None:
            raise OutputDomainError("MISSING_PAYLOAD", "a multi-attribute part carries no payload")
        output = kind.read(getattr(part, kind.payload))
        parts.append((part.attribute, output))  # type: ignore[arg-type]  # attribute kinds only
    return MultiOutput(tuple(parts))


def _attribute_kind(output: object) -> OutputKind:
    """The kind of one part of a multi-attribute output (only the attribute kinds)."""
    kind = KINDS.get(type(output))
    if kind is None or kind.payload not in ATTRIBUTE_PAYLOADS:
        raise TypeError(f"{type(output).__name__} cannot be a multi-attribute part")
    return kind


def _encode_multi(o: MultiOutput) -> bytes:
    """Digest encoding: the part count, then per part its attribute index, its kind's
    tag and the length-prefixed encoding of its output."""
    out = [struct.pack("<Q", len(o.parts))]
    for attribute, output in o.parts:
        kind = _attribute_kind(output)
        body = kind.encode(output)
        out.append(struct.pack("<Q", attribute) + kind.tag + struct.pack("<Q", len(body)) + body)
    return b"".join(out)


def _multi_to_json(o: MultiOutput) -> dict[str, Any]:
    parts = []
    for attribute, output in o.parts:
        kind = _attribute_kind(output)
        parts.append({"attribute": attribute, "k": kind.json_kind, **kind.to_json(output)})
    return {"parts": parts}


def _multi_from_json(j: dict[str, Any]) -> MultiOutput:
    parts: list[tuple[int, AttributeOutput]] = []
    for part in j["parts"]:
        kind = _BY_JSON_KIND[part["k"]]
        if kind.payload not in ATTRIBUTE_PAYLOADS:
            raise ValueError(f"stored multi-attribute part of kind {part['k']!r}")
        parts.append((int(part["attribute"]), kind.from_json(part)))  # type: ignore[arg-type]
    return MultiOutput(tuple(parts))


def _fill_index_bits(report: collector_pb2.Report, o: IndexBitsOutput) -> None:
    payload = report.index_bits
    payload.SetInParent()  # no indices is still an index-bits payload (refused by the check)
    payload.indices.extend(o.indices)
    payload.bits = o.bits


def _encode_index_bits(o: IndexBitsOutput) -> bytes:
    """Digest encoding: the index count, each index, then the packed bits."""
    return struct.pack(f"<Q{len(o.indices)}Q", len(o.indices), *o.indices) + o.bits


def _read_numeric(m: collector_pb2.NumericPayload) -> NumericOutput:
    if not math.isfinite(m.value):
        raise OutputDomainError("NON_FINITE", "numeric payload must be finite")
    return NumericOutput(m.value)


#: Every output type's kind, by type (the dispatch table; exhaustive over `Output`).
KINDS: dict[type[Any], OutputKind] = {
    k.type: k
    for k in (
        OutputKind(
            CategoryOutput,
            "category",
            _fill_category,
            lambda m: CategoryOutput(m.index),
            b"C",
            lambda o: struct.pack("<Q", o.index),
            "category",
            lambda o: {"index": o.index},
            lambda j: CategoryOutput(int(j["index"])),
        ),
        OutputKind(
            BitVectorOutput,
            "bits",
            _fill_bits,
            lambda m: BitVectorOutput(m.bits, m.length),
            b"B",
            lambda o: struct.pack("<Q", o.length) + o.bits,
            "bits",
            lambda o: {"bits": o.bits.hex(), "length": o.length},
            lambda j: BitVectorOutput(bytes.fromhex(j["bits"]), int(j["length"])),
        ),
        OutputKind(
            HashedOutput,
            "hashed",
            _fill_hashed,
            lambda m: HashedOutput(m.seed, m.value),
            b"H",
            lambda o: struct.pack("<QQ", o.seed, o.value),
            "hashed",
            lambda o: {"seed": o.seed, "value": o.value},
            lambda j: HashedOutput(int(j["seed"]), int(j["value"])),
        ),
        OutputKind(
            NumericOutput,
            "numeric",
            _fill_numeric,
            _read_numeric,
            b"N",
            lambda o: struct.pack("<d", o.value),
            "numeric",
            lambda o: {"value": o.value},
            lambda j: NumericOutput(float(j["value"])),
        ),
        OutputKind(
            IndexBitOutput,
            "index_bit",
            _fill_index_bit,
            lambda m: IndexBitOutput(m.index, m.bit),
            b"I",
            lambda o: struct.pack("<Q?", o.index, o.bit),
            "index_bit",
            lambda o: {"index": o.index, "bit": o.bit},
            lambda j: IndexBitOutput(int(j["index"]), bool(j["bit"])),
        ),
        OutputKind(
            SketchRowOutput,
            "sketch_row",
            _fill_sketch_row,
            lambda m: SketchRowOutput(m.row, m.bits, m.length),
            b"R",
            lambda o: struct.pack("<QQ", o.row, o.length) + o.bits,
            "sketch_row",
            lambda o: {"row": o.row, "bits": o.bits.hex(), "length": o.length},
            lambda j: SketchRowOutput(int(j["row"]), bytes.fromhex(j["bits"]), int(j["length"])),
        ),
        OutputKind(
            SketchBitOutput,
            "sketch_bit",
            _fill_sketch_bit,
            lambda m: SketchBitOutput(m.row, m.column, m.bit),
            b"S",
            lambda o: struct.pack("<QQ?", o.row, o.column, o.bit),
            "sketch_bit",
            lambda o: {"row": o.row, "column": o.column, "bit": o.bit},
            lambda j: SketchBitOutput(int(j["row"]), int(j["column"]), bool(j["bit"])),
        ),
        OutputKind(
            GroupHashedOutput,
            "group_hashed",
            _fill_group_hashed,
            lambda m: GroupHashedOutput(m.group, m.key, m.value),
            b"G",
            lambda o: struct.pack("<QQQ", o.group, o.value, len(o.key)) + o.key,
            "group_hashed",
            lambda o: {"group": o.group, "key": o.key.hex(), "value": o.value},
            lambda j: GroupHashedOutput(int(j["group"]), bytes.fromhex(j["key"]), int(j["value"])),
        ),
        OutputKind(
            IndexBitsOutput,
            "index_bits",
            _fill_index_bits,
            lambda m: IndexBitsOutput(tuple(m.indices), m.bits),
            b"D",
            _encode_index_bits,
            "index_bits",
            lambda o: {"indices": list(o.indices), "bits": o.bits.hex()},
            lambda j: IndexBitsOutput(
                tuple(int(i) for i in j["indices"]), bytes.fromhex(j["bits"])
            ),
        ),
        OutputKind(
            MultiOutput,
            "multi",
            _fill_multi,
            _read_multi,
            b"M",
            _encode_multi,
            "multi",
            _multi_to_json,
            _multi_from_json,
        ),
        OutputKind(
            SealedOutput,
            "sealed",
            _fill_sealed,
            lambda m: SealedOutput(bytes(m.ciphertext), str(m.key_id)),
            b"E",
            _encode_sealed,
            "sealed",
            lambda o: {"ciphertext": base64.b64encode(o.ciphertext).decode(), "key_id": o.key_id},
            lambda j: SealedOutput(base64.b64decode(j["ciphertext"]), str(j["key_id"])),
        ),
    )
}
#: The payload kinds an attribute of a multi-attribute report may carry (AttributePayload).
ATTRIBUTE_PAYLOADS = frozenset({"category", "bits", "hashed", "numeric", "index_bit"})
_BY_PAYLOAD = {k.payload: k for k in KINDS.values()}
_BY_JSON_KIND = {k.json_kind: k for k in KINDS.values()}


def kind_of(output: Output) -> OutputKind:
    """The kind of `output` (TypeError for a type that is not an `Output`)."""
    kind = KINDS.get(type(output))
    if kind is None:  # a subclass of an output type has its base's kind
        kind = next((k for base, k in KINDS.items() if isinstance(output, base)), None)
    if kind is None:
        raise TypeError(f"unknown output type {type(output).__name__}")
    return kind


def kind_of_json(json_kind: str) -> OutputKind:
    """The kind stored as `json_kind` (ValueError for an unknown one)."""
    kind = _BY_JSON_KIND.get(json_kind)
    if kind is None:
        raise ValueError(f"unknown stored payload kind {json_kind!r}")
    return kind


def fill_payload(report: collector_pb2.Report, output: Output) -> None:
    """Set `report`'s payload oneof from a mechanism output."""
    kind_of(output).fill(report, output)


def output_from_report(report: collector_pb2.Report) -> Output:
    """The mechanism output a report carries.

    Raises OutputDomainError("MISSING_PAYLOAD") when no payload is set and
    OutputDomainError("NON_FINITE") for a NaN or infinite numeric payload. Whether
    the output is possible for the policy's mechanism is the mechanism's own
    `check_output`, which the caller runs next.
    """
    kind = _BY_PAYLOAD.get(report.WhichOneof("payload") or "")
    if kind is None:
        raise OutputDomainError("MISSING_PAYLOAD", "report carries no payload")
    return kind.read(getattr(report, kind.payload))
