"""Remembered verifications: a hit needs the same key, signature and message bytes.

`verify_signature` remembers successful Ed25519 checks per process, so a root or
policy seen again (a second client, a restart from the state file) is not
verified twice. These tests pin down that a remembered success is exactly as
strong as a fresh check, and that `TrustStore` serializes once per change.
"""

from __future__ import annotations

import pytest
from fedldp.authoring import Authority, generate_key, next_root
from fedldp.client.policy import TrustStore, verify_policy
from fedldp.client.policy import envelope as envelope_module
from fedldp.client.policy.envelope import (
    VERIFIED_CACHE_ENTRIES,
    VERIFIED_CACHE_MAX_MESSAGE_BYTES,
    clear_verification_cache,
    raw_public_bytes,
    verify_signature,
)
from fedldp.client.policy.errors import BadSignatureError
from fedldp.v1 import policy_pb2

YEAR = 365 * 86400


def _remembered(key: object, signature: bytes, message: bytes) -> bool:
    entry = (raw_public_bytes(key), signature, message)  # type: ignore[arg-type]
    return entry in envelope_module._VERIFIED._ok


def test_a_success_is_remembered_by_its_exact_bytes() -> None:
    clear_verification_cache()
    key = generate_key()
    message = b"DSSEv1 exact bytes"
    signature = key.sign(message)
    assert not _remembered(key.public_key(), signature, message)
    assert verify_signature(key.public_key(), signature, message)
    assert _remembered(key.public_key(), signature, message)
    assert verify_signature(key.public_key(), signature, message)  # the remembered hit


def test_a_remembered_success_does_not_cover_other_bytes_or_keys() -> None:
    clear_verification_cache()
    key, other_key = generate_key(), generate_key()
    message = b"DSSEv1 exact bytes"
    signature = key.sign(message)
    assert verify_signature(key.public_key(), signature, message)
    # Same signature, one byte more or one byte changed: verified afresh, refused.
    assert not verify_signature(key.public_key(), signature, message + b"\x00")
    assert not verify_signature(key.public_key(), signature, b"D" + message[1:].upper())
    # Same signature and message under another key: refused.
    assert not verify_signature(other_key.public_key(), signature, message)
    # A flipped signature bit: refused, and never remembered.
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert not verify_signature(key.public_key(), flipped, message)
    assert not _remembered(key.public_key(), flipped, message)


def test_failures_are_never_remembered() -> None:
    clear_verification_cache()
    key = generate_key()
    message = b"m"
    bad = bytes(64)
    for _ in range(2):
        assert not verify_signature(key.public_key(), bad, message)
    assert len(envelope_module._VERIFIED._ok) == 0


def test_the_memory_is_bounded() -> None:
    clear_verification_cache()
    key = generate_key()
    big = b"x" * (VERIFIED_CACHE_MAX_MESSAGE_BYTES + 1)
    assert verify_signature(key.public_key(), key.sign(big), big)
    assert not _remembered(key.public_key(), key.sign(big), big)  # too big to keep
    messages = [b"m%d" % i for i in range(VERIFIED_CACHE_ENTRIES + 3)]
    signatures = [key.sign(m) for m in messages]
    for m, s in zip(messages, signatures, strict=True):
        assert verify_signature(key.public_key(), s, m)
    assert len(envelope_module._VERIFIED._ok) == VERIFIED_CACHE_ENTRIES
    assert not _remembered(key.public_key(), signatures[0], messages[0])  # least recent out
    assert _remembered(key.public_key(), signatures[-1], messages[-1])


def test_a_policy_verified_before_is_refused_once_altered(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    verify_policy(envelope, trust, now=now)  # remembered
    altered = policy_pb2.SignedEnvelope()
    altered.CopyFrom(envelope)
    altered.payload = envelope.payload + b"\x08\x01"  # same signature, other bytes
    with pytest.raises(BadSignatureError):
        verify_policy(altered, trust, now=now)
    assert verify_policy(envelope, trust, now=now).payload == envelope.payload


def test_trust_store_serializes_once_per_change(authority: Authority, now: int) -> None:
    trust = authority.trust_store(now=now)
    first = trust.to_bytes()
    assert trust.to_bytes() is first  # made once
    twin = trust.copy()
    v2 = next_root(
        policy_pb2.Root.FromString(authority.root_envelope.payload),
        signers=[authority.root_key],
        add_policy_keys=[(generate_key().public_key(), now + YEAR)],
    )
    twin.update_root(v2, now=now)
    # The copy rotated; the original did not, and each serializes its own state.
    assert (trust.root_version, twin.root_version) == (1, 2)
    assert trust.to_bytes() == first
    assert twin.to_bytes() != first
    assert TrustStore.from_bytes(twin.to_bytes()).root_version == 2
    assert TrustStore.from_bytes(first).root_version == 1
