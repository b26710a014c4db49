"""Spot-check of the conformance laws (conformance/v1/mechanisms.json, which the
TypeScript SDK's thresholds must equal exactly: sdk/js/test/conformance.test.ts)
against the papers' formulas, independent of the Python reference's code:

* GRR / direct encoding (Wang et al., "Locally Differentially Private Protocols for
  Frequency Estimation", USENIX Security 2017, section 4.1):
  p = e^ε / (e^ε + k − 1), q = 1 / (e^ε + k − 1);
* OUE (same paper, section 4.4): each bit kept 1 with p = 1/2, a 0 bit set with
  q = 1 / (e^ε + 1);
* SUE / basic RAPPOR (section 4.3; Erlingsson et al., CCS 2014): p = e^{ε/2} / (e^{ε/2} + 1),
  q = 1 / (e^{ε/2} + 1).

Each law must be within k·2^-52 of the formula per output (the 2^-53 grid) and,
computed exactly, be ε-LDP: for every output, max over inputs / min over inputs ≤ e^ε
(e^ε from a 60-digit Decimal, rounded down). A law rounded the wrong way would break
the second check even where the first holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal, localcontext
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

VECTORS = Path(__file__).resolve().parents[2] / "conformance" / "v1" / "mechanisms.json"


@pytest.fixture(autouse=True)
def _sixty_digits() -> Iterator[None]:
    """60-digit Decimal arithmetic for each test only (a module-level change of the
    thread's context leaked into every later test of the same worker)."""
    with localcontext() as ctx:
        ctx.prec = 60
        yield


def _cases(mechanism: str) -> list[dict[str, Any]]:
    cases = json.loads(VECTORS.read_text())["cases"]
    return [c for c in cases if c["mechanism"] == mechanism]


def _pq(mechanism: str, eps: Decimal, k: int) -> tuple[Decimal, Decimal]:
    if mechanism == "grr":
        e = eps.exp()
        return e / (e + k - 1), 1 / (e + k - 1)
    if mechanism == "oue":
        return Decimal(1) / 2, 1 / (eps.exp() + 1)
    half = (eps / 2).exp()
    return half / (half + 1), 1 / (half + 1)


def _formula(mechanism: str, eps: Decimal, k: int, value: int, output: dict[str, Any]) -> Decimal:
    p, q = _pq(mechanism, eps, k)
    if mechanism == "grr":
        return p if output["index"] == value else q
    bits = int.from_bytes(bytes.fromhex(output["bits"]), "little")
    prob = Decimal(1)
    for i in range(k):
        chance = p if i == value else q
        prob *= chance if bits >> i & 1 else 1 - chance
    return prob


def _frac_to_dec(text: str) -> Decimal:
    f = Fraction(text)
    return Decimal(f.numerator) / Decimal(f.denominator)


@pytest.mark.parametrize("mechanism", ["grr", "oue", "sue"])
def test_laws_match_the_papers_formulas(mechanism: str) -> None:
    cases = _cases(mechanism)
    assert cases
    for case in cases:
        eps, k = Decimal(case["epsilon"]), case["metric"]["k"]
        for law in case["law"]:
            for output, probability in law["outputs"]:
                want = _formula(mechanism, eps, k, law["value"], output)
                got = _frac_to_dec(probability)
                assert abs(got - want) <= Decimal(k) * Decimal(2) ** -52, (
                    case["epsilon"],
                    k,
                    output,
                )


@pytest.mark.parametrize("mechanism", ["grr", "oue", "sue"])
def test_laws_are_exactly_epsilon_ldp(mechanism: str) -> None:
    for case in _cases(mechanism):
        e_eps = Fraction(Decimal(case["epsilon"]).exp().quantize(Decimal(10) ** -55, "ROUND_DOWN"))
        by_output: dict[str, list[Fraction]] = {}
        for law in case["law"]:
            for output, probability in law["outputs"]:
                by_output.setdefault(json.dumps(output, sort_keys=True), []).append(
                    Fraction(probability)
                )
        assert len({len(v) for v in by_output.values()}) == 1
        for output, values in by_output.items():
            assert max(values) <= e_eps * min(values), (case["epsilon"], case["metric"], output)


def test_broken_variant_is_caught() -> None:
    """A GRR law whose keep probability is 2^-50 too high (the rest taken evenly from
    the others) breaks ε-LDP exactly; a GRR law at ε + 0.01 misses the formula."""
    case = _cases("grr")[0]
    k = case["metric"]["k"]
    law = case["law"][0]
    bump = Fraction(1, 2**50)
    probabilities = [Fraction(p) for _, p in law["outputs"]]
    broken = [
        p + bump if o["index"] == law["value"] else p - bump / (k - 1)
        for (o, _), p in zip(law["outputs"], probabilities, strict=True)
    ]
    e_eps = Fraction(Decimal(case["epsilon"]).exp().quantize(Decimal(10) ** -55, "ROUND_DOWN"))
    assert max(broken) > e_eps * min(broken)
    eps = Decimal(case["epsilon"]) + Decimal("0.01")
    output, probability = law["outputs"][0]
    assert (
        abs(_frac_to_dec(probability) - _formula("grr", eps, k, law["value"], output))
        > Decimal(2) ** -40
    )
