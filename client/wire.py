"""Conversion between mechanism outputs and the wire's `Report` payload.

The one place that maps `fedldp.client.mechanisms` Output dataclasses to and from
the `payload` oneof of `fedldp.v1.Report`. The device uses `fill_payload` to build
a report; the collector uses `output_from_report` before running the mechanism's
own output-domain check. Neither ever sees or carries the raw value.
"""

from __future__ import annotations

import math

from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitOutput,
    NumericOutput,
    Output,
    OutputDomainError,
)
from fedldp.v1 import collector_pb2

#: Length of a report id in bytes (made by the device: `fedldp.client.report_ids`).
REPORT_ID_BYTES = 16


def fill_payload(report: collector_pb2.Report, output: Output) -> None:
    """Set `report`'s payload oneof from a mechanism output."""
    if isinstance(output, CategoryOutput):
        report.category.index = output.index
    elif isinstance(output, BitVectorOutput):
        report.bits.bits = output.bits
        report.bits.length = output.length
    elif isinstance(output, HashedOutput):
        report.hashed.seed = output.seed
        report.hashed.value = output.value
    elif isinstance(output, NumericOutput):
        report.numeric.value = output.value
    elif isinstance(output, IndexBitOutput):
        report.index_bit.index = output.index
        report.index_bit.bit = output.bit
    else:  # pragma: no cover - exhaustive over Output
        raise TypeError(f"unknown output type {type(output).__name__}")


def output_from_report(report: collector_pb2.Report) -> Output:
    """The mechanism output a report carries.

    Raises OutputDomainError("MISSING_PAYLOAD") when no payload is set and
    OutputDomainError("NON_FINITE") for a NaN or infinite numeric payload. Whether
    the output is possible for the policy's mechanism is the mechanism's own
    `check_output`, which the caller runs next.
    """
    kind = report.WhichOneof("payload")
    if kind == "category":
        return CategoryOutput(report.category.index)
    if kind == "bits":
        return BitVectorOutput(report.bits.bits, report.bits.length)
    if kind == "hashed":
        return HashedOutput(report.hashed.seed, report.hashed.value)
    if kind == "numeric":
        value = report.numeric.value
        if not math.isfinite(value):
            raise OutputDomainError("NON_FINITE", "numeric payload must be finite")
        return NumericOutput(value)
    if kind == "index_bit":
        return IndexBitOutput(report.index_bit.index, report.index_bit.bit)
    raise OutputDomainError("MISSING_PAYLOAD", "report carries no payload")
