"""One dispatch over the output types (`fedldp.client.wire.KINDS`): every output
type has one kind, and each conversion through it gives the bytes and text the
stored data and the wire were written with (golden values, recorded before the
dispatch replaced four isinstance ladders)."""

from __future__ import annotations

import typing

import pytest
from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitOutput,
    NumericOutput,
    Output,
    OutputDomainError,
)
from fedldp.client.wire import KINDS, fill_payload, kind_of, output_from_report
from fedldp.collector.wire import (
    _output_encoding,
    output_from_json,
    output_to_json,
    payload_fields,
)
from fedldp.v1 import collector_pb2 as pb

GOLDEN: list[tuple[Output, str, str]] = [
    (CategoryOutput(7), '{"k":"category","index":7}', "430700000000000000"),
    (CategoryOutput(0), '{"k":"category","index":0}', "430000000000000000"),
    (
        BitVectorOutput(b"\x05\x80", 9),
        '{"k":"bits","bits":"0580","length":9}',
        "4209000000000000000580",
    ),
    (
        HashedOutput(2**40 + 3, 11),
        '{"k":"hashed","seed":1099511627779,"value":11}',
        "4803000000000100000b00000000000000",
    ),
    (NumericOutput(-0.1), '{"k":"numeric","value":-0.1}', "4e9a9999999999b9bf"),
    (NumericOutput(1e300), '{"k":"numeric","value":1e+300}', "4e9c7500883ce4377e"),
    (IndexBitOutput(5, True), '{"k":"index_bit","index":5,"bit":true}', "49050000000000000001"),
    (IndexBitOutput(0, False), '{"k":"index_bit","index":0,"bit":false}', "49000000000000000000"),
]


def test_every_output_type_has_exactly_one_kind() -> None:
    assert set(KINDS) == set(typing.get_args(Output))
    assert len({k.tag for k in KINDS.values()}) == len(KINDS)
    assert len({k.payload for k in KINDS.values()}) == len(KINDS)
    assert len({k.json_kind for k in KINDS.values()}) == len(KINDS)


@pytest.mark.parametrize(("output", "stored", "encoding"), GOLDEN)
def test_conversions_give_the_recorded_bytes_and_round_trip(
    output: Output, stored: str, encoding: str
) -> None:
    assert output_to_json(output) == stored
    assert output_from_json(stored) == output
    assert _output_encoding(output).hex() == encoding
    report = pb.Report()
    fill_payload(report, output)
    assert report.WhichOneof("payload") == kind_of(output).payload
    assert output_from_report(report) == output
    built = pb.Report(**payload_fields(output))
    assert built == report
    assert output_from_report(pb.Report.FromString(built.SerializeToString())) == output


def test_unknown_types_and_kinds_are_refused() -> None:
    with pytest.raises(TypeError, match="unknown output type"):
        kind_of(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown stored payload kind"):
        output_from_json('{"k":"nope"}')
    with pytest.raises(OutputDomainError) as missing:
        output_from_report(pb.Report())
    assert missing.value.reason == "MISSING_PAYLOAD"
    with pytest.raises(OutputDomainError) as nan:
        output_from_report(pb.Report(numeric=pb.NumericPayload(value=float("nan"))))
    assert nan.value.reason == "NON_FINITE"


def test_broken_variant_a_kind_with_another_tag_is_caught() -> None:
    """A kind whose digest tag changed would change every stored digest: the
    golden encodings catch it."""
    import dataclasses

    kind = KINDS[CategoryOutput]
    KINDS[CategoryOutput] = dataclasses.replace(kind, tag=b"c")
    try:
        assert _output_encoding(CategoryOutput(7)).hex() != GOLDEN[0][2]
    finally:
        KINDS[CategoryOutput] = kind
