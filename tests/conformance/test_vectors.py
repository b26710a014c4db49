"""The Python SDK against the conformance vectors (conformance/v1/*.json), not against itself.

* drift: a fresh generation equals the committed files byte for byte;
* laws: every case's law is recomputed here from the built mechanism's realized
  thresholds with the closed forms of docs/mechanisms.md (not with the
  mechanism's own `exact_probability`) and must equal the file's rationals; the
  file's thresholds and charge equal the mechanism's;
* hashes, wire bytes, report ids and policy verdicts equal the files';
* sealed payloads: every ciphertext opens with the reference's own HPKE (cryptography) to
  the case's output, and the info, padding, key id and sealed Report are the reference's.
"""

from __future__ import annotations

import json
import math
import random
import secrets
import struct
import sys
from decimal import Decimal
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from fedldp.client import report_ids
from fedldp.client.mechanisms import registry
from fedldp.client.mechanisms.base import (
    AttributeSpec,
    MetricArg,
    MultiMetric,
    OpenDomain,
    Output,
)
from fedldp.client.mechanisms.memo import MemoState
from fedldp.client.mechanisms.olh import hash_value
from fedldp.client.mechanisms.pem import hash_key, prefix_chunks
from fedldp.client.mechanisms.sketch import sketch_hash
from fedldp.client.policy import PolicyError, TrustStore, verify_policy
from fedldp.client.wire import fill_payload, kind_of_json, output_from_report
from fedldp.v1 import collector_pb2, policy_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # conformance/ is a top-level folder, not a package of fedldp
    sys.path.append(str(REPO_ROOT))

from conformance.generate import drift  # noqa: E402
from conformance.mechanism_vectors import output_json, thresholds  # noqa: E402

VECTORS = REPO_ROOT / "conformance" / "v1"
ONE = 1 << 53


@cache
def vectors(name: str) -> dict[str, Any]:
    """A vector file, parsed."""
    data: dict[str, Any] = json.loads((VECTORS / name).read_text(encoding="utf-8"))
    return data


def fraction(text: str) -> Fraction:
    """A "num/den" string as a Fraction."""
    num, den = text.split("/")
    return Fraction(int(num), int(den))


def dyadic(entry: dict[str, str]) -> Fraction:
    """A {"dyadic53": numerator} threshold as its probability."""
    return Fraction(int(entry["dyadic53"]), ONE)


def output_of(data: dict[str, Any]) -> Output:
    """An output from its vector JSON (the stored form plus "kind")."""
    body = {key: value for key, value in data.items() if key not in ("kind", "double")}
    if "seed" in body:
        body["seed"] = int(body["seed"])
    return kind_of_json(data["kind"]).from_json(body)


def build(case: dict[str, Any]) -> Any:
    """The mechanism a case describes, built through the registry."""
    metric_json = case["metric"]
    metric: MetricArg
    if "k" in metric_json:
        metric = int(metric_json["k"])
    elif "max_bytes" in metric_json:
        metric = OpenDomain(int(metric_json["max_bytes"]))
    elif "attributes" in metric_json:
        metric = MultiMetric(
            tuple(
                AttributeSpec(
                    a["name"],
                    tuple(f"v{i}" for i in range(a["k"])) if "k" in a else None,
                    (Decimal(a["lo"]), Decimal(a["hi"])) if "lo" in a else None,
                    a["mechanism"],
                )
                for a in metric_json["attributes"]
            )
        )
    else:
        metric = (Decimal(metric_json["lo"]), Decimal(metric_json["hi"]))
    return registry.create(case["mechanism"], Decimal(case["epsilon"]), metric, case["params"])


def _bits(output: dict[str, Any]) -> int:
    return int.from_bytes(bytes.fromhex(output["bits"]), "little")


def _bernoulli_product(bits: int, length: int, one: list[Fraction]) -> Fraction:
    prob = Fraction(1)
    for i in range(length):
        prob *= one[i] if (bits >> i) & 1 else 1 - one[i]
    return prob


def law_from_thresholds(case: dict[str, Any], value: int, out: dict[str, Any]) -> Fraction:
    """P[output | value] from the case's thresholds with the documented closed forms."""
    t, k, wire_id = case["thresholds"], int(case["thresholds"].get("k", 0)), case["mechanism"]
    if wire_id == "grr":
        p = dyadic(t["keep"])
        return p if out["index"] == value else (1 - p) / (k - 1)
    if wire_id in ("oue", "sue"):
        p, q = dyadic(t["bit_p"]), dyadic(t["bit_q"])
        return _bernoulli_product(_bits(out), k, [p if i == value else q for i in range(k)])
    if wire_id == "hr":
        p, size = dyadic(t["inside"]), int(t["K"])
        inside = bin((value + 1) & out["index"]).count("1") % 2 == 0
        return 2 * (p if inside else 1 - p) / size
    if wire_id in ("olh", "loloha"):
        g, m, space = int(t["g"]), int(t["m"]), int(t["seed_space"])
        p = dyadic(t["keep"]) if wire_id == "olh" else fraction(t["p1_exact"])
        hit = hash_value(int(out["seed"]), value, g, m) == out["value"]
        return (p if hit else (1 - p) / (g - 1)) / space
    if wire_id == "ss":
        p, d, bits = dyadic(t["include"]), int(t["d"]), _bits(out)
        if bin(bits).count("1") != d:
            return Fraction(0)
        if (bits >> value) & 1:
            return p / math.comb(k - 1, d - 1)
        return (1 - p) / math.comb(k - 1, d)
    if wire_id == "rappor-grr":
        perm_p = dyadic(t["permanent"]["keep"])
        p_r = fraction(t["p_r_exact"])
        return sum(
            (perm_p if z == value else (1 - perm_p) / (k - 1))
            * (p_r if out["index"] == z else (1 - p_r) / (k - 1))
            for z in range(k)
        ) or Fraction(0)
    if wire_id in ("rappor-oue", "rappor-sue"):
        pp, pq = dyadic(t["permanent"]["bit_p"]), dyadic(t["permanent"]["bit_q"])
        f = fraction(t["flip_exact"])
        one = [(pp if i == value else pq) * (1 - f) + (1 - (pp if i == value else pq)) * f
               for i in range(k)]  # fmt: skip
        return _bernoulli_product(_bits(out), k, one)
    if wire_id == "dbitflip":
        p1, q1, d = fraction(t["p1_exact"]), fraction(t["q1_exact"]), int(t["d"])
        bits = int.from_bytes(bytes.fromhex(out["bits"]), "little")
        one = [p1 if j == value else q1 for j in out["indices"]]
        return _bernoulli_product(bits, d, one) / math.comb(k, d)
    raise AssertionError(f"no closed form for {wire_id}")


def cases(kind: str) -> list[dict[str, Any]]:
    """The mechanism cases that carry `kind` ("law", "numeric" or "samples")."""
    return [c for c in vectors("mechanisms.json")["cases"] if kind in c]


def case_id(case: dict[str, Any]) -> str:
    """A readable test id."""
    return f"{case['mechanism']}-{case['epsilon']}-{json.dumps(case['metric'], sort_keys=True)}"


def test_no_drift() -> None:
    """Regenerating the vectors from the Python reference reproduces the files exactly."""
    assert drift() == []


def test_every_registered_mechanism_has_vectors() -> None:
    covered = {c["mechanism"] for c in vectors("mechanisms.json")["cases"]}
    assert covered == set(registry.registered_ids())


@pytest.mark.parametrize("case", cases("law"), ids=case_id)
def test_categorical_law(case: dict[str, Any]) -> None:
    """The file's law equals the closed form over the mechanism's realized thresholds."""
    mechanism = build(case)
    assert thresholds(mechanism) == case["thresholds"]
    assert str(mechanism.report_charge) == case["report_charge"]
    for entry in case["law"]:
        total = Fraction(0)
        for out, prob in entry["outputs"]:
            expected = law_from_thresholds(case, entry["value"], out)
            assert fraction(prob) == expected, (entry["value"], out)
            mechanism.check_output(output_of(out))
            total += expected
        assert total == 1


@pytest.mark.parametrize("case", cases("numeric"), ids=case_id)
def test_numeric_law(case: dict[str, Any]) -> None:
    """Table, weights and grid positions equal the mechanism's; the wire law follows."""
    mechanism = build(case)
    section = case["numeric"]
    assert str(mechanism.report_charge) == case["report_charge"]
    table = [struct.unpack(">d", bytes.fromhex(h))[0] for h in section["table"]]
    assert list(mechanism.table) == table
    weights = [[int(w) for w in row] for row in section["weights"]]
    assert [list(mechanism.index_weights(j)) for j in range(mechanism.levels + 1)] == weights
    for sample in section["inputs"]:
        x = struct.unpack(">d", bytes.fromhex(sample["input_double"]))[0]
        position = mechanism._grid_position(mechanism.clip(x)[0])
        assert str(position) == sample["grid_position"]
        low, rest = divmod(position, 1 << 64)
        levels = [(low, Fraction(1))] if rest == 0 else [
            (low, 1 - Fraction(rest, 1 << 64)), (low + 1, Fraction(rest, 1 << 64))]  # fmt: skip
        assert [[j, str(p.numerator) + "/" + str(p.denominator)] for j, p in levels] == (
            sample["level_law"]
        )
        law: dict[str, Fraction] = {}
        for j, p in levels:
            total = sum(weights[j])
            for h, w in zip(section["table"], weights[j], strict=True):
                law[h] = law.get(h, Fraction(0)) + p * Fraction(w, total)
        assert {h: fraction(p) for h, p in sample["law"]} == {h: p for h, p in law.items() if p}


@pytest.mark.parametrize("case", cases("samples"), ids=case_id)
def test_sampled_outputs(case: dict[str, Any]) -> None:
    """Each sampled output is accepted and has the file's exact probability."""
    mechanism = build(case)
    assert str(mechanism.report_charge) == case["report_charge"]
    for sample in case["samples"]:
        output = output_of(sample["output"])
        mechanism.check_output(output)
        if case["mechanism"] in ("cms", "hcms"):
            prob = mechanism.exact_probability(mechanism.cells(sample["value"]), output)
        else:
            prob = mechanism.exact_probability(sample["value"], output)
        assert prob == fraction(sample["probability"])


@pytest.mark.parametrize("case", cases("memo"), ids=case_id)
def test_memo_slots(case: dict[str, Any]) -> None:
    """The memo key and state layout are the mechanism's; given the file's state, the
    Python SDK's next report reads only the stored slots (the memo does not change) and
    lands in the file's instantaneous law, whose rows sum to 1 and are accepted."""
    mechanism = build(case)
    section = case["memo"]
    assert mechanism.memo_key == section["key"]
    assert MemoState.from_json(section["state"]).to_json() == section["state"]
    rng = random.Random(7)
    for entry in section["instant"]:
        law = {json.dumps(out, sort_keys=True): fraction(p) for out, p in entry["law"]}
        assert sum(law.values()) == 1
        for out in entry["law"]:
            mechanism.check_output(output_of(out[0]))
        memo = MemoState.from_json(section["state"])
        for _ in range(50):
            report = mechanism.perturb(entry["value"], rng=rng, memo=memo)
            assert json.dumps(output_json(report), sort_keys=True) in law
        assert memo.to_json() == section["state"]


@pytest.mark.parametrize("case", vectors("mechanisms.json")["charges"], ids=case_id)
def test_memo_charges(case: dict[str, Any]) -> None:
    """The wider grid of memoized charges: the file's charge is max(ε1, ε_I) of the built
    mechanism, and at least ε1; its memo key and thresholds are the mechanism's."""
    mechanism = build(case)
    assert str(mechanism.report_charge) == case["report_charge"]
    assert Decimal(case["report_charge"]) >= Decimal(case["epsilon"])
    assert mechanism.memo_key == case["memo_key"]
    assert thresholds(mechanism) == case["thresholds"]


@pytest.mark.parametrize(
    "case",
    vectors("mechanisms.json")["grids"],
    ids=lambda c: f"{c['mechanism']}-{c['epsilon']}-{c['params'].get('levels', 'default')}",
)
def test_default_grids(case: dict[str, Any]) -> None:
    """Grids derived from ε alone: levels, table size, level-0 weights and thresholds."""
    mechanism = build({**case, "metric": {"lo": "0", "hi": "1"}})
    assert mechanism.levels == case["levels"]
    assert len(mechanism.table) == case["cells"]
    first = mechanism.index_weights(0)
    assert [str(w) for w in sorted(set(first))] == case["weight_values"]
    assert str(sum(first)) == case["weight_total"]
    assert thresholds(mechanism) == case["thresholds"]


def test_hash_families() -> None:
    data = vectors("hashes.json")
    for row in data["olh"]:
        for seed, hashes in zip(row["seeds"], row["hashes"], strict=True):
            got = [hash_value(int(seed), v, row["g"], row["m"]) for v in row["values"]]
            assert got == hashes
    for row in data["sketch"]:
        utf8 = bytes.fromhex(row["utf8"])
        assert [sketch_hash(j, utf8, row["columns"]) for j in range(4)] == row["cells"]
    for row in data["pem"]:
        utf8 = bytes.fromhex(row["utf8"])
        padded = utf8 + bytes(row["max_bytes"] - len(utf8))
        chunks = prefix_chunks(padded, row["prefix_bits"])
        assert chunks == row["chunks"]
        key = bytes.fromhex(row["key"])
        assert {str(b): hash_key(key, chunks, b) for b in (1, 3, 8, 31)} == row["hashes"]


def test_wire_bytes() -> None:
    for case in vectors("wire.json")["cases"]:
        request = collector_pb2.SubmitRequest()
        for entry in case["reports"]:
            report = request.reports.add(
                report_id=bytes.fromhex(entry["report_id"]),
                policy_id=entry["policy_id"],
                policy_version=entry["policy_version"],
                policy_digest=bytes.fromhex(entry["policy_digest"]),
                coarse_time=entry["coarse_time"],
            )
            fill_payload(report, output_of(entry["output"]))
        assert request.SerializeToString().hex() == case["submit_request"]
        parsed = collector_pb2.SubmitRequest.FromString(bytes.fromhex(case["submit_request"]))
        for report, entry in zip(parsed.reports, case["reports"], strict=True):
            assert output_from_report(report) == output_of(entry["output"])


def test_sealed_vectors_open_with_the_reference() -> None:
    """Each sealed.json ciphertext opens with `open_sealed` (cryptography's HPKE); the info,
    padding and key id are `sealed.py`'s; the same ciphertext under another policy version's
    info, or with one bit flipped, does not open (the broken variants)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from fedldp.client.mechanisms.base import OutputDomainError
    from fedldp.client.sealed import _pad, key_id, open_sealed, seal_info

    data = vectors("sealed.json")
    private = X25519PrivateKey.from_private_bytes(bytes.fromhex(data["analyzer_private_key"]))
    public = bytes.fromhex(data["analyzer_public_key"])
    assert len(data["cases"]) >= 11
    for case in data["cases"]:
        output = output_of(case["output"])
        digest = bytes.fromhex(case["policy_digest"])
        info = seal_info(case["policy_id"], case["policy_version"], digest)
        assert info.hex() == case["info"]
        inner = collector_pb2.Report()
        fill_payload(inner, output)
        assert _pad(inner.SerializeToString(deterministic=True)).hex() == case["plaintext"]
        assert key_id(public) == case["key_id"]
        ciphertext = bytes.fromhex(case["ciphertext"])
        assert open_sealed(ciphertext, private, info=info) == output
        report = collector_pb2.Report.FromString(bytes.fromhex(case["report"]))
        assert report.sealed.ciphertext == ciphertext and report.sealed.key_id == case["key_id"]
        other = seal_info(case["policy_id"], case["policy_version"] + 1, digest)
        flipped = ciphertext[:-1] + bytes([ciphertext[-1] ^ 1])
        for bad, bad_info in ((ciphertext, other), (flipped, info)):
            with pytest.raises(OutputDomainError):
                open_sealed(bad, private, info=bad_info)


def test_report_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    data = vectors("report_ids.json")
    assert data["run_length"] == report_ids.RUN_LENGTH
    for run in data["runs"]:
        prefix, start = bytes.fromhex(run["prefix"]), int(run["start"])
        monkeypatch.setattr(secrets, "token_bytes", lambda n, p=prefix: p)
        monkeypatch.setattr(secrets, "randbits", lambda n, s=start: s)
        ids = report_ids.ReportIds()
        assert [ids.next().hex() for _ in run["ids"]] == run["ids"]


def test_policy_verdicts() -> None:
    data = vectors("policies.json")
    trust_data = data["trust"]
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    trust = TrustStore.from_pinned_root(
        policy_pb2.SignedEnvelope.FromString(bytes.fromhex(trust_data["root_envelope"])),
        [
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(k))
            for k in trust_data["pinned_root_keys"]
        ],
        now=trust_data["trusted_at"],
    )
    for case in data["cases"]:
        envelope = policy_pb2.SignedEnvelope.FromString(bytes.fromhex(case["envelope"]))
        try:
            verified = verify_policy(
                envelope,
                trust,
                now=case["now"],
                highest_versions=case["highest_versions"],
                max_epsilon=None if case["max_epsilon"] is None else Decimal(case["max_epsilon"]),
                audience=case["audience"],
            )
        except PolicyError as exc:
            assert type(exc).__name__ == case["verdict"], case["name"]
            continue
        assert case["verdict"] == "ok", case["name"]
        assert verified.digest.hex() == case["digest"]
        assert str(verified.charge) == case["report_charge"]
        assert (verified.policy_id, verified.version) == (case["policy_id"], case["version"])
