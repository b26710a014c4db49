"""Property: flipping any single bit of a signed envelope makes verification fail.

"Verification" is what a receiver does with the bytes: parse the SignedEnvelope,
then `verify_policy` (or `TrustStore.from_pinned_root` for a root). A flip that
breaks the protobuf framing fails at the first step; any other flip changes the
payload type, the payload, a key id or a signature, and must be refused.
"""

from __future__ import annotations

import pytest
from fedldp.authoring import Authority
from fedldp.client.policy import PolicyError, TrustStore, verify_policy
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

NOW = 1_796_083_200
DAY = 86400

_AUTHORITY = Authority.generate(now=NOW)
_TRUST = _AUTHORITY.trust_store(now=NOW)
_ENVELOPE = _AUTHORITY.sign(
    _AUTHORITY.categorical_policy(
        policy_id="browser-homepage",
        metric="browser.homepage",
        labels=["news", "search", "social", "video"],
        epsilon="1.5",
        epsilon_cap="6",
        window_seconds=DAY,
        now=NOW,
    )
)
_WIRE = _ENVELOPE.SerializeToString()
_ROOT_WIRE = _AUTHORITY.root_envelope.SerializeToString()


def _flip(data: bytes, bit: int) -> bytes:
    flipped = bytearray(data)
    flipped[bit // 8] ^= 1 << (bit % 8)
    return bytes(flipped)


def _policy_verifies(wire: bytes) -> bool:
    try:
        envelope = policy_pb2.SignedEnvelope.FromString(wire)
        verify_policy(envelope, _TRUST, now=NOW)
    except (DecodeError, PolicyError):
        return False
    return True


def _root_verifies(wire: bytes) -> bool:
    try:
        envelope = policy_pb2.SignedEnvelope.FromString(wire)
        TrustStore.from_pinned_root(envelope, _AUTHORITY.root_public_keys, now=NOW)
    except (DecodeError, PolicyError):
        return False
    return True


def test_the_unflipped_envelopes_verify() -> None:
    assert _policy_verifies(_WIRE)
    assert _root_verifies(_ROOT_WIRE)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(bit=st.integers(min_value=0, max_value=len(_WIRE) * 8 - 1))
def test_any_bit_flip_of_a_policy_envelope_fails(bit: int) -> None:
    assert not _policy_verifies(_flip(_WIRE, bit))


@settings(max_examples=200, deadline=None)
@given(bit=st.integers(min_value=0, max_value=len(_ROOT_WIRE) * 8 - 1))
def test_any_bit_flip_of_a_root_envelope_fails(bit: int) -> None:
    assert not _root_verifies(_flip(_ROOT_WIRE, bit))


@pytest.mark.parametrize("field", ["payload_type", "payload", "key_id", "sig"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_bit_flip_in_each_field_fails(field: str, data: st.DataObject) -> None:
    envelope = policy_pb2.SignedEnvelope()
    envelope.CopyFrom(_ENVELOPE)
    signature = envelope.signatures[0]
    if field in ("payload_type", "key_id"):
        text = envelope.payload_type if field == "payload_type" else signature.key_id
        raw = text.encode("utf-8")
        bit = data.draw(st.integers(0, len(raw) * 8 - 1))
        try:
            flipped = _flip(raw, bit).decode("utf-8")
        except UnicodeDecodeError:
            return  # cannot even be put on the wire as a proto3 string
        if field == "payload_type":
            envelope.payload_type = flipped
        else:
            signature.key_id = flipped
    elif field == "payload":
        bit = data.draw(st.integers(0, len(envelope.payload) * 8 - 1))
        envelope.payload = _flip(envelope.payload, bit)
    else:
        bit = data.draw(st.integers(0, len(signature.sig) * 8 - 1))
        signature.sig = _flip(signature.sig, bit)
    with pytest.raises(PolicyError):
        verify_policy(envelope, _TRUST, now=NOW)


def test_an_exhaustive_sweep_of_every_bit() -> None:
    # The envelope is small: check every single bit once, deterministically.
    failures = [bit for bit in range(len(_WIRE) * 8) if _policy_verifies(_flip(_WIRE, bit))]
    assert failures == []
