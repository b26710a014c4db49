"""Hash-family, wire-encoding and report-id vectors (hashes.json, wire.json, report_ids.json).

* hashes.json: the OLH dot-product family, the CMS/HCMS sketch hash and the PEM
  multiply-add-shift hash (collector.proto comments) on fixed inputs.
* wire.json: `SubmitRequest` bytes (hex) of fixed reports, one per payload kind
  and one batch, with the report fields that produced them.
* report_ids.json: the report-id layout (prefix || big-endian counter, runs of
  `RUN_LENGTH`) from fixed run prefixes and starts, wrap-around included.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from fedldp.client.mechanisms.base import (
    BitVectorOutput,
    CategoryOutput,
    GroupHashedOutput,
    HashedOutput,
    IndexBitOutput,
    IndexBitsOutput,
    MultiOutput,
    NumericOutput,
    Output,
    SketchBitOutput,
    SketchRowOutput,
)
from fedldp.client.mechanisms.olh import hash_value
from fedldp.client.mechanisms.pem import hash_key, key_length, prefix_chunks
from fedldp.client.mechanisms.sketch import sketch_hash
from fedldp.client.report_ids import RUN_LENGTH
from fedldp.client.wire import fill_payload
from fedldp.v1 import collector_pb2

from conformance.mechanism_vectors import integer, output_json

#: (g, k) pairs of the OLH hash vectors: small, large g, and seeds beyond 2^53.
OLH_PARAMS = ((2, 5), (3, 4), (3, 9), (5, 4), (7, 100), (1000003, 1000), (2147483647, 1000))
SKETCH_STRINGS = ("a", "ab", "hello world", "é", "日本語", "x" * 64)
PEM_STRINGS = ("a", "ab", "abc", "é")


def olh_vectors() -> list[dict[str, Any]]:
    """h_seed(v) for fixed seeds (0, the last, and seeded picks) and values."""
    rng = random.Random(31)
    rows = []
    for g, k in OLH_PARAMS:
        m = 1
        while g**m < k:
            m += 1
        space = g ** (m + 1)
        seeds = [0, 1, space - 1] + [rng.randrange(space) for _ in range(5)]
        values = sorted({0, 1, k - 1, rng.randrange(k), rng.randrange(k)})
        hashes = [[hash_value(s, v, g, m) for v in values] for s in seeds]
        rows.append(
            {
                "g": g,
                "k": k,
                "m": m,
                "seed_space": integer(space),
                "seeds": [integer(s) for s in seeds],
                "values": values,
                "hashes": hashes,
            }
        )
    return rows


def sketch_vectors() -> list[dict[str, Any]]:
    """h_j(u) for rows 0..3, strings in UTF-8 and column counts 16, 1024, 2^16."""
    rows = []
    for text in SKETCH_STRINGS:
        data = text.encode("utf-8")
        for columns in (16, 1024, 1 << 16):
            rows.append(
                {
                    "utf8": data.hex(),
                    "columns": columns,
                    "cells": [sketch_hash(row, data, columns) for row in range(4)],
                }
            )
    return rows


def pem_vectors() -> list[dict[str, Any]]:
    """The prefix chunks and hash of padded strings, for fixed keys and prefix lengths."""
    rows = []
    for max_bytes in (3, 4, 9):
        length = key_length(max_bytes)
        for i, text in enumerate(PEM_STRINGS):
            data = text.encode("utf-8")
            if len(data) > max_bytes:
                continue
            padded = data + bytes(max_bytes - len(data))
            key = hashlib.sha256(b"fedldp/conformance/pem" + bytes([max_bytes, i])).digest()
            key = (key * (1 + length // len(key)))[:length]
            for bits in (4, 8, 8 * max_bytes):
                chunks = prefix_chunks(padded, bits)
                rows.append(
                    {
                        "max_bytes": max_bytes,
                        "utf8": data.hex(),
                        "prefix_bits": bits,
                        "chunks": chunks,
                        "key": key.hex(),
                        "hashes": {str(b): hash_key(key, chunks, b) for b in (1, 3, 8, 31)},
                    }
                )
    return rows


def hash_vectors() -> dict[str, Any]:
    """The whole of hashes.json."""
    return {
        "format": "fedldp.conformance.hashes.v1",
        "olh": olh_vectors(),
        "sketch": sketch_vectors(),
        "pem": pem_vectors(),
    }


#: One output of each payload kind (the wire vectors' reports).
WIRE_OUTPUTS: tuple[Output, ...] = (
    CategoryOutput(3),
    BitVectorOutput(bytes([0b101, 0b1]), 9),
    HashedOutput(2**60 + 5, 2),
    NumericOutput(-0.7071067811865476),
    IndexBitOutput(6, True),
    SketchRowOutput(1, bytes([0, 4]), 16),
    SketchBitOutput(3, 9, False),
    GroupHashedOutput(2, bytes(range(16)), 5),
    IndexBitsOutput((1, 4, 7), bytes([0b110])),
    MultiOutput(((0, CategoryOutput(1)), (1, NumericOutput(1.5)))),
)
WIRE_DIGEST = hashlib.sha256(b"fedldp/conformance/policy").digest()
WIRE_COARSE_TIME = 1_700_000_000 - 1_700_000_000 % 3600


def wire_report(output: Output, index: int) -> collector_pb2.Report:
    """The fixed report of the wire vectors carrying `output`."""
    report = collector_pb2.Report(
        report_id=bytes([index]) * 8 + (index + 1).to_bytes(8, "big"),
        policy_id="conformance.policy",
        policy_version=3,
        policy_digest=WIRE_DIGEST,
        coarse_time=WIRE_COARSE_TIME,
    )
    fill_payload(report, output)
    return report


def _report_json(report: collector_pb2.Report, output: Output) -> dict[str, Any]:
    return {
        "report_id": report.report_id.hex(),
        "policy_id": report.policy_id,
        "policy_version": report.policy_version,
        "policy_digest": report.policy_digest.hex(),
        "coarse_time": report.coarse_time,
        "output": output_json(output),
    }


def wire_vectors() -> dict[str, Any]:
    """The whole of wire.json: one single-report request per kind, then one batch."""
    cases = []
    reports = []
    for i, output in enumerate(WIRE_OUTPUTS):
        report = wire_report(output, i)
        reports.append(report)
        request = collector_pb2.SubmitRequest(reports=[report])
        cases.append(
            {
                "reports": [_report_json(report, output)],
                "submit_request": request.SerializeToString(deterministic=True).hex(),
            }
        )
    batch = collector_pb2.SubmitRequest(reports=reports[:3])
    cases.append(
        {
            "reports": [
                _report_json(r, o) for r, o in zip(reports[:3], WIRE_OUTPUTS[:3], strict=False)
            ],
            "submit_request": batch.SerializeToString(deterministic=True).hex(),
        }
    )
    return {"format": "fedldp.conformance.wire.v1", "cases": cases}


#: (run prefix hex, run start) of the report-id vectors; the last wraps mod 2^64.
REPORT_ID_RUNS = (("0011223344556677", 0), ("8899aabbccddeeff", 2**64 - 2))


def report_id_vectors() -> dict[str, Any]:
    """The whole of report_ids.json: the first ids of runs with fixed prefix and start."""
    runs = []
    for prefix, start in REPORT_ID_RUNS:
        ids = [bytes.fromhex(prefix) + ((start + i) % 2**64).to_bytes(8, "big") for i in range(4)]
        runs.append({"prefix": prefix, "start": str(start), "ids": [x.hex() for x in ids]})
    return {
        "format": "fedldp.conformance.report_ids.v1",
        "id_bytes": 16,
        "prefix_bytes": 8,
        "run_length": RUN_LENGTH,
        "layout": "prefix (8 random bytes per run) || big-endian uint64 (run start + i) mod 2^64",
        "runs": runs,
    }
