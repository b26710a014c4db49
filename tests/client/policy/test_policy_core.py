"""Envelope primitives and the happy path of verification."""

from __future__ import annotations

import hashlib
from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fedldp.authoring import Authority, sign_envelope
from fedldp.client.policy import (
    POLICY_PAYLOAD_TYPE,
    TrustStore,
    domain_digest,
    key_id_of,
    pae,
    policy_digest,
    verify_policy,
)
from fedldp.v1 import policy_pb2


def test_pae_matches_the_dsse_v1_example() -> None:
    # DSSE v1 protocol.md test vector shape: "DSSEv1 <len> <type> <len> <body>".
    assert pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )
    assert pae("", b"") == b"DSSEv1 0  0 "
    assert pae("é", b"x") == "DSSEv1 2 é 1 x".encode()  # byte length, not characters


def test_key_id_is_sha256_of_raw_public_key() -> None:
    key = Ed25519PrivateKey.generate().public_key()
    raw = key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert key_id_of(key) == hashlib.sha256(raw).hexdigest()


def test_domain_digest_is_length_prefixed() -> None:
    expected = hashlib.sha256(b"\x00\x00\x00\x02ab").digest()
    assert domain_digest(["ab"]) == expected
    assert domain_digest(["ab"]) != domain_digest(["a", "b"])
    assert domain_digest([]) == hashlib.sha256(b"").digest()


def test_sign_envelope_signs_pae_once_per_key() -> None:
    key = Ed25519PrivateKey.generate()
    envelope = sign_envelope("t", b"payload", [key, key])
    assert len(envelope.signatures) == 1
    key.public_key().verify(envelope.signatures[0].sig, pae("t", b"payload"))
    with pytest.raises(ValueError):
        sign_envelope("t", b"payload", [])


def test_verify_returns_the_policy_as_signed(
    authority: Authority, trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    verified = verify_policy(envelope, trust, now=now, audience="prod-eu")
    assert envelope.payload_type == POLICY_PAYLOAD_TYPE
    assert verified.payload == envelope.payload
    assert verified.digest == policy_digest(envelope.payload)
    assert verified.policy_id == "browser-homepage"
    assert verified.version == 1
    assert verified.labels == ("news", "search", "social", "video")
    assert verified.numeric_range is None
    assert verified.epsilon == Decimal("1.5")
    assert verified.epsilon_cap == Decimal("6")
    assert verified.mechanism.epsilon == Decimal("1.5")
    assert verified.mechanism.wire_id == "grr"
    assert verified.key_id == authority.policy_key_id
    assert verified.window_seconds == 86400
    assert verified.is_active(now)
    assert not verified.is_active(verified.expires_at)
    assert verified.window_start(now + 5) == now - now % 86400
    assert verified.label_index("social") == 2


def test_label_index_does_not_echo_the_value(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    verified = verify_policy(envelope, trust, now=now)
    with pytest.raises(ValueError) as info:
        verified.label_index("my-secret-answer")
    assert "my-secret-answer" not in str(info.value)


def test_trust_store_round_trips(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    restored = TrustStore.from_bytes(trust.to_bytes())
    assert restored.root_version == trust.root_version == 1
    assert restored.policy_key_ids() == trust.policy_key_ids()
    verify_policy(envelope, restored, now=now)
