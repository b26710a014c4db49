"""The mechanism vectors (conformance/v1/mechanisms.json): exact laws, thresholds, charges.

Every case names a registered mechanism, its ε, metric and params, and gives

* `report_charge` (exact decimal string: `Mechanism.report_charge`),
* `thresholds`: the exact integers and rationals the sampler realizes, read from
  the built mechanism (a `DyadicProbability` as {"dyadic53": numerator}, a
  rational as "num/den", an integer as a JSON number below 2^53 or else a decimal
  string; the base and permanent mechanisms of a memoized one nested),
* for a memoized mechanism, `memo`: its memo key, the serialized memo state
  (`MemoState.to_json`) after reports of `values` from a seeded generator, and
  for each of those values the exact law of the next report given that state
  (`instant`: no slot is drawn any more), which pins the slot layout and bytes,
* (top level, `charges`) memoized mechanisms over a wider grid of (k, ε1, ε∞):
  `report_charge`, `memo_key` and `thresholds` only,
* (top level, `grids`) the numeric mechanisms on [0, 1] with grids derived from ε
  (default levels, derived cells): levels, table size, the distinct index weights
  of level 0 and their total, thresholds,
* either `law` (every wire output of every input with its exact probability,
  summing to 1 per input) or `samples` (outputs with their exact probabilities,
  where the output space is too large to list), and for the numeric mechanisms
  the whole output table, the integer index weights of every level, and the
  exact level law and wire law of sample inputs.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from typing import Any

from fedldp.client.mechanisms import registry
from fedldp.client.mechanisms._common import DyadicProbability, byte_length
from fedldp.client.mechanisms.base import (
    AttributeSpec,
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitsOutput,
    Mechanism,
    MetricArg,
    MultiMetric,
    NumericOutput,
    OpenDomain,
    Output,
)
from fedldp.client.mechanisms.dbitflip import DBitFlip
from fedldp.client.mechanisms.loloha import SEED_SLOT, Loloha
from fedldp.client.mechanisms.memo import Memoized, MemoizedUnary, MemoState, RapporGRR
from fedldp.client.mechanisms.numeric import NumericMechanism
from fedldp.client.mechanisms.olh import hash_value
from fedldp.client.mechanisms.oracle import FrequencyOracle
from fedldp.client.wire import kind_of

#: Integers at or above this travel as decimal strings (JSON readers lose bits past it).
SAFE_INTEGER = 2**53


def rational(x: Fraction) -> str:
    """An exact rational as "num/den" (lowest terms, den > 0)."""
    return f"{x.numerator}/{x.denominator}"


def integer(x: int) -> int | str:
    """An integer as a JSON number when below 2^53 in magnitude, else a decimal string."""
    return x if abs(x) < SAFE_INTEGER else str(x)


def double_hex(x: float) -> str:
    """The IEEE 754 binary64 bits of `x`, big-endian hex (16 digits)."""
    return struct.pack(">d", x).hex()


def output_json(output: Output) -> dict[str, Any]:
    """An output in the ledger's stored JSON form plus its "kind" (wire.py's OutputKind);
    a numeric value also carries its exact double bits ("double")."""
    kind = kind_of(output)
    data: dict[str, Any] = {"kind": kind.json_kind, **kind.to_json(output)}
    if isinstance(output, NumericOutput):
        data["double"] = double_hex(output.value)
    if "seed" in data:
        data["seed"] = integer(int(data["seed"]))
    return data


def _threshold_value(value: object) -> Any:
    """The JSON form of one exact attribute, or None for anything else."""
    if isinstance(value, DyadicProbability):
        return {"dyadic53": str(value.numerator)}
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return integer(value)
    if isinstance(value, Fraction):
        return rational(value)
    if isinstance(value, Decimal):
        return str(value)
    return None


def thresholds(mechanism: object, *, depth: int = 0) -> dict[str, Any]:
    """The exact public attributes of a built mechanism (nested once for its parts)."""
    out: dict[str, Any] = {}
    for name, value in sorted(vars(mechanism).items()):
        if name.startswith("_"):
            continue
        converted = _threshold_value(value)
        if converted is not None:
            out[name] = converted
        elif depth == 0 and isinstance(value, Mechanism):
            out[name] = thresholds(value, depth=1)
    return out


def _memo_probability(mechanism: Any, value: int, output: Output) -> Fraction:
    """P[first report = output | value] of rappor-grr/-oue/-sue from an empty memo,
    summed exactly over the permanent response."""
    k = mechanism.k
    if isinstance(output, CategoryOutput):  # rappor-grr
        p_r = mechanism.p_r_exact
        total = Fraction(0)
        for z in range(k):
            perm = mechanism.permanent.exact_probability(value, CategoryOutput(z))
            total += perm * (p_r if output.index == z else (1 - p_r) / (k - 1))
        return total
    assert isinstance(output, BitVectorOutput)
    bits = int.from_bytes(output.bits, "little")
    flip = mechanism.flip_exact
    prob = Fraction(1)
    for i in range(k):
        one_perm = mechanism.permanent.p_exact if i == value else mechanism.permanent.q_exact
        one = one_perm * (1 - flip) + (1 - one_perm) * flip
        prob *= one if (bits >> i) & 1 else 1 - one
    return prob


def categorical_law(mechanism: FrequencyOracle) -> list[dict[str, Any]]:
    """Every output of every input with its exact probability (each input sums to 1)."""
    memo = mechanism.wire_id.startswith("rappor-")
    law = []
    for value in range(mechanism.k):
        rows = []
        total = Fraction(0)
        for output in mechanism.outputs():
            if memo:
                prob = _memo_probability(mechanism, value, output)
            else:
                prob = mechanism.exact_probability(value, output)
            total += prob
            if prob:
                rows.append([output_json(output), rational(prob)])
        if total != 1:
            raise AssertionError(f"{mechanism.wire_id}: the law of {value} sums to {total}")
        law.append({"value": value, "outputs": rows})
    return law


#: Inputs of the numeric sample laws, as fractions of the range (then some outside).
NUMERIC_INPUTS = (0.0, 1.0, 0.5, 0.3, 1 / 3, -0.25, 1.5, 0.999999)


def numeric_section(mechanism: NumericMechanism) -> dict[str, Any]:
    """The numeric output table, index weights per level, and sample input laws."""
    lo, hi = float(mechanism.lo), float(mechanism.hi)
    inputs = []
    for fraction in NUMERIC_INPUTS:
        x = lo + fraction * (hi - lo)
        law: dict[str, Fraction] = {}
        for y in mechanism.table:
            law.setdefault(double_hex(y), mechanism.wire_probability(x, y))
        if sum(law.values()) != 1:
            raise AssertionError(f"{mechanism.wire_id}: the law of {x} does not sum to 1")
        inputs.append(
            {
                "input": x,
                "input_double": double_hex(x),
                "grid_position": str(mechanism._grid_position(mechanism.clip(x)[0])),
                "level_law": [[j, rational(p)] for j, p in mechanism.level_law(x)],
                "law": [[bits, rational(p)] for bits, p in law.items() if p],
            }
        )
    return {
        "levels": mechanism.levels,
        "table": [double_hex(y) for y in mechanism.table],
        "unbiased": [rational(u) for u in mechanism.unbiased],
        "weights": [
            [str(w) for w in mechanism.index_weights(j)] for j in range(mechanism.levels + 1)
        ],
        "inputs": inputs,
    }


def _instant_outputs(mechanism: Any, memo: MemoState, value: Any) -> list[tuple[Output, Fraction]]:
    """Every next report of `value` given `memo` (its slots already drawn), with its probability."""
    responses = memo.responses
    if isinstance(mechanism, RapporGRR):
        stored = int.from_bytes(responses[value], "little")
        p_r = mechanism.p_r_exact
        return [
            (CategoryOutput(y), p_r if y == stored else (1 - p_r) / (mechanism.k - 1))
            for y in range(mechanism.k)
        ]
    if isinstance(mechanism, Loloha):
        seed = int.from_bytes(responses[SEED_SLOT], "little")
        hashed = hash_value(seed, value, mechanism.g, mechanism.m)
        stored = int.from_bytes(responses[hashed], "little")
        p_r = mechanism.p_r_exact
        return [
            (HashedOutput(seed, y), p_r if y == stored else (1 - p_r) / (mechanism.g - 1))
            for y in range(mechanism.g)
        ]
    if isinstance(mechanism, DBitFlip):
        indices = mechanism._indices(responses[SEED_SLOT])
        length = mechanism.d
        permanent = int.from_bytes(responses[mechanism._vector_slot(indices, value)], "little")
    else:
        assert isinstance(mechanism, MemoizedUnary)
        length = mechanism.k
        permanent = int.from_bytes(responses[value], "little")
    flip = mechanism.flip_exact
    rows: list[tuple[Output, Fraction]] = []
    for bits in range(1 << length):
        differ = (bits ^ permanent).bit_count()
        prob = flip**differ * (1 - flip) ** (length - differ)
        packed = bits.to_bytes(byte_length(length), "little")
        out: Output = (
            IndexBitsOutput(indices, packed)
            if isinstance(mechanism, DBitFlip)
            else (BitVectorOutput(packed, length))
        )
        rows.append((out, prob))
    return rows


def memo_section(mechanism: Any, values: list[Any], seed: int) -> dict[str, Any]:
    """The memo key, the memo state after reports of `values`, and each value's next-report law."""
    rng = random.Random(seed)
    memo = mechanism.new_memo()
    for value in values:
        mechanism.perturb(value, rng=rng, memo=memo)
    instant = []
    for value in dict.fromkeys(values):
        rows = _instant_outputs(mechanism, memo, value)
        if sum(p for _, p in rows) != 1:
            raise AssertionError(f"{mechanism.wire_id}: an instantaneous law does not sum to 1")
        instant.append(
            {"value": value, "law": [[output_json(o), rational(p)] for o, p in rows if p]}
        )
    return {"key": mechanism.memo_key, "state": memo.to_json(), "instant": instant}


def _memo_values(mechanism: Any) -> list[Any]:
    """Inputs of the memo section: repeats and a change (dbitflip: numbers in its range)."""
    if isinstance(mechanism, DBitFlip):
        lo, hi = float(mechanism.lo), float(mechanism.hi)
        return [lo + f * (hi - lo) for f in (0.1, 0.9, 0.1, 0.55)]
    return [0, 1, 0, mechanism.k - 1]


def _sample_probability(mechanism: Any, value: Any, output: Output) -> Fraction:
    """The exact probability of a sampled output (sketches take the value's cells)."""
    if mechanism.wire_id in ("cms", "hcms"):
        return Fraction(mechanism.exact_probability(mechanism.cells(value), output))
    return Fraction(mechanism.exact_probability(value, output))


def sampled(mechanism: Any, values: list[Any], seed: int, count: int = 6) -> list[dict[str, Any]]:
    """`count` outputs per value from a seeded generator, with exact probabilities."""
    rng = random.Random(seed)
    rows = []
    for value in values:
        for _ in range(count):
            output = mechanism.perturb(value, rng=rng)
            prob = _sample_probability(mechanism, value, output)
            if prob <= 0:
                raise AssertionError(f"{mechanism.wire_id}: a sampled output has probability 0")
            rows.append(
                {"value": value, "output": output_json(output), "probability": rational(prob)}
            )
        if mechanism.wire_id in ("cms", "hcms"):
            rows[-1]["cells"] = mechanism.cells(value)
    return rows


def _case_grid() -> Iterator[tuple[str, str, MetricArg, dict[str, str]]]:
    """(mechanism id, ε, metric, params) of every case, in file order."""
    for eps in ("0.5", "1", "2.5"):
        for k in (2, 4, 7):
            yield "grr", eps, k, {}
        for wire_id in ("oue", "sue"):
            for k in (2, 4):
                yield wire_id, eps, k, {}
        yield "hr", eps, 5, {}
    yield "olh", "1", 4, {}
    yield "olh", "0.5", 5, {"g": "2"}
    yield "olh", "2", 4, {"g": "5"}
    yield "olh", "1", 9, {"g": "3"}
    yield "ss", "1", 4, {"d": "2"}
    yield "ss", "2", 5, {}
    for wire_id in ("rappor-grr", "rappor-oue", "rappor-sue"):
        yield wire_id, "1", 3, {"epsilon_permanent": "2"}
        yield wire_id, "0.5", 4, {"epsilon_permanent": "1"}
    yield "loloha", "1", 4, {"epsilon_permanent": "2"}
    yield "loloha", "0.5", 3, {"epsilon_permanent": "1", "g": "2"}
    numeric = (Decimal(0), Decimal(10))
    yield "dbitflip", "1", numeric, {"epsilon_permanent": "2", "buckets": "4", "d": "2"}
    yield "dbitflip", "0.5", numeric, {"epsilon_permanent": "1", "buckets": "3", "d": "1"}
    yield "duchi", "1", (Decimal(-1), Decimal(1)), {}
    yield "duchi", "0.5", numeric, {}
    for wire_id in ("piecewise", "hybrid", "sw"):
        yield wire_id, "1", numeric, {"levels": "4"}
        yield wire_id, "2", (Decimal("-2.5"), Decimal("7.5")), {"levels": "8"}
    yield "hybrid", "0.5", numeric, {"levels": "4"}
    yield "multi-split", "2", _multi_metric(), {}
    yield "multi-sample", "2", _multi_metric(), {}
    yield "pem", "4", OpenDomain(4), {}
    yield "pem", "2", OpenDomain(3), {"step_bits": "4", "start_bits": "8", "g": "8"}
    yield "cms", "2", OpenDomain(8), {"rows": "4", "columns": "16"}
    yield "hcms", "2", OpenDomain(8), {"rows": "4", "columns": "16"}


def _multi_metric() -> MultiMetric:
    """Two attributes: a categorical one under grr and a numeric one under duchi."""
    return MultiMetric(
        (
            AttributeSpec("browser", ("a", "b", "c"), None, "grr"),
            AttributeSpec("load", None, (Decimal(0), Decimal(10)), "duchi"),
        )
    )


def _metric_json(metric: MetricArg) -> dict[str, Any]:
    """The JSON description of a metric argument."""
    if isinstance(metric, int):
        return {"k": metric}
    if isinstance(metric, OpenDomain):
        return {"max_bytes": metric.max_bytes}
    if isinstance(metric, MultiMetric):
        return {
            "attributes": [
                {
                    "name": a.name,
                    "mechanism": a.mechanism_id,
                    **({"k": len(a.labels)} if a.labels is not None else {}),
                    **(
                        {"lo": str(a.numeric_range[0]), "hi": str(a.numeric_range[1])}
                        if a.numeric_range is not None
                        else {}
                    ),
                }
                for a in metric.attributes
            ]
        }
    return {"lo": str(metric[0]), "hi": str(metric[1])}


def _samples_for(mechanism: Any, seed: int) -> list[dict[str, Any]]:
    """Sampled outputs of an open-domain or multi-attribute mechanism."""
    if isinstance(mechanism.__dict__.get("attributes"), tuple):
        return sampled(mechanism, [[0, 2.5], [2, 10.0]], seed)
    return sampled(mechanism, ["a", "ab", "abc"], seed)


def mechanism_case(
    wire_id: str, eps: str, metric: MetricArg, params: Mapping[str, str], seed: int
) -> dict[str, Any]:
    """One case of mechanisms.json."""
    mechanism: Any = registry.create(wire_id, Decimal(eps), metric, params)
    case: dict[str, Any] = {
        "mechanism": wire_id,
        "epsilon": eps,
        "metric": _metric_json(metric),
        "params": dict(params),
        "report_charge": str(mechanism.report_charge),
        "thresholds": thresholds(mechanism),
    }
    if isinstance(mechanism, Memoized):
        case["memo"] = memo_section(mechanism, _memo_values(mechanism), 1000 + seed)
    if isinstance(mechanism, NumericMechanism):
        case["numeric"] = numeric_section(mechanism)
    elif isinstance(mechanism, FrequencyOracle):
        case["law"] = categorical_law(mechanism)
    else:
        case["samples"] = _samples_for(mechanism, seed)
    return case


def _charge_grid() -> Iterator[tuple[str, str, MetricArg, dict[str, str]]]:
    """Memoized mechanisms over a wider grid of (k, ε1, ε∞): charges and thresholds only."""
    pairs = (("0.05", "0.5"), ("0.1", "1"), ("1", "2"), ("1.5", "1.6"), ("2", "8"), ("3", "3.5"))
    for wire_id in ("rappor-grr", "rappor-oue", "rappor-sue"):
        for k in (2, 5, 16, 64):
            for eps, permanent in pairs:
                yield wire_id, eps, k, {"epsilon_permanent": permanent}
    for eps, permanent in pairs:
        yield "loloha", eps, 10, {"epsilon_permanent": permanent}
        for d in ("1", "3"):
            params = {"epsilon_permanent": permanent, "buckets": "8", "d": d}
            yield "dbitflip", eps, (Decimal(-1), Decimal(1)), params


def charge_case(
    wire_id: str, eps: str, metric: MetricArg, params: Mapping[str, str]
) -> dict[str, Any]:
    """One entry of mechanisms.json's `charges`: a memoized mechanism's charge and thresholds."""
    mechanism: Any = registry.create(wire_id, Decimal(eps), metric, params)
    return {
        "mechanism": wire_id,
        "epsilon": eps,
        "metric": _metric_json(metric),
        "params": dict(params),
        "report_charge": str(mechanism.report_charge),
        "memo_key": mechanism.memo_key,
        "thresholds": thresholds(mechanism),
    }


def _default_grids() -> Iterator[tuple[str, str, dict[str, str]]]:
    """Numeric grids derived from ε alone (default levels, derived cells) over a range of ε."""
    for wire_id in ("duchi", "piecewise", "hybrid", "sw"):
        for eps in ("0.3", "0.61", "0.62", "1", "2.5", "5", "10"):
            yield wire_id, eps, {}
            if wire_id != "duchi":
                yield wire_id, eps, {"levels": "1000"}


def grid_case(wire_id: str, eps: str, params: Mapping[str, str]) -> dict[str, Any]:
    """One entry of mechanisms.json's `grids`: the derived grid and weights of a numeric id."""
    mechanism: Any = registry.create(wire_id, Decimal(eps), (Decimal(0), Decimal(1)), params)
    first = mechanism.index_weights(0)
    return {
        "mechanism": wire_id,
        "epsilon": eps,
        "params": dict(params),
        "levels": mechanism.levels,
        "cells": len(mechanism.table),
        "weight_values": [str(w) for w in sorted(set(first))],
        "weight_total": str(sum(first)),
        "thresholds": thresholds(mechanism),
    }


def mechanism_vectors() -> dict[str, Any]:
    """The whole of mechanisms.json."""
    cases = [
        mechanism_case(wire_id, eps, metric, params, seed)
        for seed, (wire_id, eps, metric, params) in enumerate(_case_grid())
    ]
    covered = {case["mechanism"] for case in cases}
    missing = sorted(set(registry.registered_ids()) - covered)
    if missing:
        raise AssertionError(f"mechanisms without conformance vectors: {missing}")
    charges = [charge_case(*case) for case in _charge_grid()]
    grids = [grid_case(*case) for case in _default_grids()]
    return {
        "format": "fedldp.conformance.mechanisms.v1",
        "cases": cases,
        "charges": charges,
        "grids": grids,
    }
