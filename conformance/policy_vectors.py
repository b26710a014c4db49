"""Policy-envelope vectors (policies.json): a pinned root and envelopes with their verdicts.

Keys are fixed (Ed25519 private keys from SHA-256 of fixed labels; Ed25519
signatures are deterministic), so the file is reproducible. Each case gives the
SignedEnvelope bytes, the verification inputs (now, the highest versions
already accepted, the device's maximum epsilon, the audience) and the verdict:
"ok" with the policy's identity and charge, or the name of the
`fedldp.client.policy` error class raised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.authoring import Authority
from fedldp.authoring.signing import make_root, sign_envelope
from fedldp.client.policy import (
    POLICY_PAYLOAD_TYPE,
    PolicyError,
    TrustStore,
    key_id_of,
    verify_policy,
)
from fedldp.client.policy.envelope import raw_public_bytes
from fedldp.v1 import policy_pb2

NOW = 1_700_000_000
KEY_EXPIRES = NOW + 365 * 86400
AUDIENCE = "conformance"


def fixed_key(label: str) -> Ed25519PrivateKey:
    """The Ed25519 key whose 32-byte seed is SHA-256 of `label`."""
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(label.encode()).digest())


def authority() -> Authority:
    """Root v1 (root key, one policy key, both expiring at KEY_EXPIRES), from fixed keys."""
    root_key = fixed_key("fedldp/conformance/root")
    policy_key = fixed_key("fedldp/conformance/policy")
    envelope = make_root(
        version=1,
        root_keys=[root_key],
        policy_keys=[(policy_key.public_key(), KEY_EXPIRES)],
        expires_at=KEY_EXPIRES,
        signers=[root_key],
    )
    return Authority(root_key, policy_key, envelope, [root_key.public_key()])


def _policy(auth: Authority, **overrides: Any) -> policy_pb2.Policy:
    """A categorical grr policy (4 labels), with `overrides` applied to the fields."""
    fields: dict[str, Any] = {
        "policy_id": "conformance.browser",
        "metric": "browser.name",
        "labels": ["chrome", "firefox", "safari", "other"],
        "epsilon": "1",
        "epsilon_cap": "4",
        "window_seconds": 86400,
        "now": NOW - 3600,
        "mechanism": "grr",
        "version": 2,
        "lifetime_seconds": 30 * 86400,
        "min_reports": 10,
        "audience": (AUDIENCE,),
    }
    fields.update(overrides)
    return auth.categorical_policy(**fields)


def _tampered(envelope: policy_pb2.SignedEnvelope, edit: Callable[[Any], None]) -> bytes:
    copy = policy_pb2.SignedEnvelope()
    copy.CopyFrom(envelope)
    edit(copy)
    return copy.SerializeToString(deterministic=True)


def _flip_last(data: bytes) -> bytes:
    return data[:-1] + bytes([data[-1] ^ 1])


def _flip_payload(envelope: Any) -> None:
    envelope.payload = _flip_last(envelope.payload)


def _flip_signature(envelope: Any) -> None:
    envelope.signatures[0].sig = _flip_last(envelope.signatures[0].sig)


def _unknown_key_id(envelope: Any) -> None:
    envelope.signatures[0].key_id = "00" * 32


def _envelopes(auth: Authority) -> list[tuple[str, bytes, dict[str, Any]]]:
    """(name, envelope bytes, verification inputs) of every case."""
    valid = auth.sign(_policy(auth))
    stranger = fixed_key("fedldp/conformance/stranger")
    invalid = _policy(auth)
    invalid.mechanism.epsilon = "-1"
    memo = _policy(
        auth, mechanism="rappor-grr", epsilon="1", params={"epsilon_permanent": "2"}, version=5
    )

    def set_type(e: Any) -> None:
        e.payload_type = "application/vnd.fedldp.root.v1+proto"

    def stranger_sig(e: Any) -> None:
        del e.signatures[:]
        e.signatures.add(key_id=key_id_of(stranger.public_key()), sig=stranger.sign(b"x" * 64))

    ok = valid.SerializeToString()
    invalid_env = sign_envelope(POLICY_PAYLOAD_TYPE, invalid.SerializeToString(), [auth.policy_key])
    memo_env = auth.sign(memo).SerializeToString()
    long_lived = auth.sign(_policy(auth, lifetime_seconds=800 * 86400)).SerializeToString()
    memo_bad = _memo_tampered_contents(auth, memo)
    kinds = _other_metric_kinds(auth)
    browser = "conformance.browser"
    cases: list[tuple[str, bytes, dict[str, Any]]] = [
        ("valid", ok, {}),
        ("valid, same version already accepted", ok, {"highest_versions": {browser: 2}}),
        ("payload tampered", _tampered(valid, _flip_payload), {}),
        ("signature tampered", _tampered(valid, _flip_signature), {}),
        ("payload type changed", _tampered(valid, set_type), {}),
        ("key id unknown", _tampered(valid, _unknown_key_id), {}),
        ("signatures removed", _tampered(valid, lambda e: e.ClearField("signatures")), {}),
        ("signed by an untrusted key", _tampered(valid, stranger_sig), {}),
        ("invalid content, validly signed", invalid_env.SerializeToString(), {}),
        ("expired", ok, {"now": NOW - 3600 + 30 * 86400}),
        ("not yet valid", ok, {"now": NOW - 7200}),
        ("rolled back", ok, {"highest_versions": {browser: 3}}),
        ("wrong audience", ok, {"audience": "elsewhere"}),
        ("right audience", ok, {"audience": AUDIENCE}),
        ("epsilon above device max", ok, {"max_epsilon": "0.5"}),
        ("epsilon at device max", ok, {"max_epsilon": "1"}),
        ("memoized charge above device max", memo_env, {"max_epsilon": "1"}),
        ("memoized, valid", memo_env, {}),
        ("signing key expired", long_lived, {"now": KEY_EXPIRES + 1}),
        ("memoized, permanent epsilon above device max", memo_env, {"max_epsilon": "1.9"}),
        *((name, env, {}) for name, env in memo_bad),
        *((name, env, {}) for name, env in kinds),
    ]
    return cases


def _memo_tampered_contents(auth: Authority, memo: policy_pb2.Policy) -> list[tuple[str, bytes]]:
    """Validly signed memoized policies whose content is invalid (the signer skipped
    validation): ε1 above ε∞, memoized charging without ε∞, ε∞ without memoized charging."""

    def edited(edit: Callable[[policy_pb2.Policy], None]) -> bytes:
        copy = policy_pb2.Policy()
        copy.CopyFrom(memo)
        edit(copy)
        payload = copy.SerializeToString(deterministic=True)
        return sign_envelope(POLICY_PAYLOAD_TYPE, payload, [auth.policy_key]).SerializeToString()

    def above(p: policy_pb2.Policy) -> None:
        p.mechanism.epsilon = "3"

    def no_permanent(p: policy_pb2.Policy) -> None:
        del p.mechanism.params["epsilon_permanent"]

    def not_charged(p: policy_pb2.Policy) -> None:
        p.mechanism.memo_charging = policy_pb2.MEMO_CHARGING_NONE

    return [
        ("memoized, epsilon above epsilon_permanent", edited(above)),
        ("memoized charging without epsilon_permanent", edited(no_permanent)),
        ("epsilon_permanent without memoized charging", edited(not_charged)),
    ]


def _other_metric_kinds(auth: Authority) -> list[tuple[str, bytes]]:
    """Valid policies of the other metric kinds: numeric, open domain, multi-attribute."""
    common: dict[str, Any] = {
        "epsilon_cap": "8",
        "window_seconds": 86400,
        "now": NOW - 3600,
        "version": 1,
        "min_reports": 10,
        "audience": (AUDIENCE,),
    }
    numeric = auth.numeric_policy(
        policy_id="conformance.load", metric="page.load", lo="-2.5", hi="7.5",
        mechanism="hybrid", epsilon="1.5", params={"levels": "16"}, **common,
    )  # fmt: skip
    open_domain = auth.open_policy(
        policy_id="conformance.word", metric="typed.word", max_bytes=6, mechanism="pem",
        epsilon="4", **common,
    )  # fmt: skip
    multi = auth.multi_policy(
        policy_id="conformance.multi", metric="page.multi", mechanism="multi-sample",
        epsilon="2", attributes=[
            {"name": "browser", "values": ["a", "b", "c"], "mechanism": "oue"},
            {"name": "load", "lo": "0", "hi": "10", "mechanism": "piecewise"},
        ], **common,
    )  # fmt: skip

    def signed(policy: policy_pb2.Policy) -> bytes:  # map fields in a fixed order
        payload = policy.SerializeToString(deterministic=True)
        return sign_envelope(POLICY_PAYLOAD_TYPE, payload, [auth.policy_key]).SerializeToString()

    return [
        ("numeric, valid", signed(numeric)),
        ("open domain, valid", signed(open_domain)),
        ("multi-attribute, valid", signed(multi)),
    ]


def _verdict(envelope_bytes: bytes, trust: TrustStore, inputs: dict[str, Any]) -> dict[str, Any]:
    """The verdict of `verify_policy` on one case."""
    envelope = policy_pb2.SignedEnvelope.FromString(envelope_bytes)
    max_epsilon = inputs.get("max_epsilon")
    try:
        verified = verify_policy(
            envelope,
            trust,
            now=inputs.get("now", NOW),
            highest_versions=inputs.get("highest_versions"),
            max_epsilon=None if max_epsilon is None else Decimal(max_epsilon),
            audience=inputs.get("audience"),
        )
    except PolicyError as exc:
        return {"verdict": type(exc).__name__}
    return {
        "verdict": "ok",
        "policy_id": verified.policy_id,
        "version": verified.version,
        "digest": verified.digest.hex(),
        "key_id": verified.key_id,
        "mechanism": verified.mechanism_id,
        "epsilon": str(verified.epsilon),
        "report_charge": str(verified.charge),
    }


def policy_vectors() -> dict[str, Any]:
    """The whole of policies.json."""
    auth = authority()
    trust = auth.trust_store(now=NOW)
    cases = []
    for name, envelope_bytes, inputs in _envelopes(auth):
        cases.append(
            {
                "name": name,
                "envelope": envelope_bytes.hex(),
                "now": inputs.get("now", NOW),
                "highest_versions": inputs.get("highest_versions", {}),
                "max_epsilon": inputs.get("max_epsilon"),
                "audience": inputs.get("audience"),
                **_verdict(envelope_bytes, trust, inputs),
            }
        )
    return {
        "format": "fedldp.conformance.policies.v1",
        "trust": {
            "pinned_root_keys": [raw_public_bytes(k).hex() for k in auth.root_public_keys],
            "root_envelope": auth.root_envelope.SerializeToString().hex(),
            "trusted_at": NOW,
        },
        "cases": cases,
    }
