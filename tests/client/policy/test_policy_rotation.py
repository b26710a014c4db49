"""Key rotation end to end (TUF rule: version + 1, signed by old and new root thresholds)."""

from __future__ import annotations

import random

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.authoring import (
    Authority,
    generate_key,
    make_root,
    next_root,
    sign_envelope,
    sign_policy,
)
from fedldp.client.policy import (
    InvalidPolicyError,
    RootRotationError,
    TrustStore,
    UnknownKeyError,
    key_id_of,
    load_trust,
    verify_policy,
)
from fedldp.client.policy.envelope import ROOT_PAYLOAD_TYPE
from fedldp.v1 import policy_pb2

DAY = 86400
YEAR = 365 * DAY


def _policy(authority: Authority, now: int, version: int = 1) -> policy_pb2.Policy:
    return authority.categorical_policy(
        policy_id="p",
        metric="m",
        labels=["a", "b", "c"],
        epsilon="1",
        epsilon_cap="2",
        window_seconds=DAY,
        now=now,
        version=version,
    )


def _root(envelope: policy_pb2.SignedEnvelope) -> policy_pb2.Root:
    return policy_pb2.Root.FromString(envelope.payload)


def test_rotate_root_and_policy_keys(authority: Authority, now: int) -> None:
    device = authority.trust_store(now=now)
    new_root_key, new_policy_key = generate_key(), generate_key()
    v2 = next_root(
        _root(authority.root_envelope),
        signers=[authority.root_key, new_root_key],
        add_root_keys=[new_root_key.public_key()],
        remove_root_keys=[key_id_of(authority.root_key.public_key())],
        add_policy_keys=[(new_policy_key.public_key(), now + YEAR)],
        remove_policy_keys=[authority.policy_key_id],
    )
    new_policy = sign_policy(_policy(authority, now, version=2), new_policy_key)
    old_policy = authority.sign(_policy(authority, now))

    # Before the device has the new root, the new key is unknown.
    with pytest.raises(UnknownKeyError):
        verify_policy(new_policy, device, now=now)
    verify_policy(old_policy, device, now=now)

    device.update_root(v2, now=now)
    assert device.root_version == 2
    assert verify_policy(new_policy, device, now=now).version == 2
    # The retired policy key is no longer trusted.
    with pytest.raises(UnknownKeyError):
        verify_policy(old_policy, device, now=now)
    # The state survives a restart.
    assert TrustStore.from_bytes(device.to_bytes()).root_version == 2


def test_new_root_needs_the_old_root_signature(authority: Authority, now: int) -> None:
    device = authority.trust_store(now=now)
    new_root_key = generate_key()
    # A rogue root signed only by the new key (the attacker's).
    rogue = make_root(
        version=2,
        root_keys=[new_root_key],
        policy_keys=[(generate_key().public_key(), 0)],
        expires_at=now + YEAR,
        signers=[new_root_key],
    )
    with pytest.raises(RootRotationError, match="current root"):
        device.update_root(rogue, now=now)
    assert device.root_version == 1  # nothing changed


def test_new_root_needs_its_own_signature(authority: Authority, now: int) -> None:
    device = authority.trust_store(now=now)
    new_root_key = generate_key()
    unsigned_by_new = make_root(
        version=2,
        root_keys=[new_root_key],
        policy_keys=[(authority.policy_key.public_key(), 0)],
        expires_at=now + YEAR,
        signers=[authority.root_key],
    )
    with pytest.raises(RootRotationError, match="own root"):
        device.update_root(unsigned_by_new, now=now)
    assert device.root_version == 1


def test_version_must_be_exactly_one_higher(authority: Authority, now: int) -> None:
    device = authority.trust_store(now=now)
    for version in (1, 3):
        root = make_root(
            version=version,
            root_keys=[authority.root_key],
            policy_keys=[(authority.policy_key.public_key(), 0)],
            expires_at=now + YEAR,
            signers=[authority.root_key],
        )
        with pytest.raises(RootRotationError, match="expected exactly 2"):
            device.update_root(root, now=now)
    assert device.root_version == 1


def test_next_root_refuses_to_produce_a_root_devices_would_refuse(
    authority: Authority,
) -> None:
    new_root_key = generate_key()
    with pytest.raises(InvalidPolicyError, match="current root"):
        next_root(
            _root(authority.root_envelope),
            signers=[new_root_key],
            add_root_keys=[new_root_key.public_key()],
        )
    with pytest.raises(InvalidPolicyError, match="not listed"):
        next_root(
            _root(authority.root_envelope),
            signers=[authority.root_key],
            remove_policy_keys=["00" * 32],
        )


def test_device_that_missed_a_root_version_walks_the_chain(authority: Authority, now: int) -> None:
    device = authority.trust_store(now=now)
    k2, k3 = generate_key(), generate_key()
    p3 = generate_key()
    v2 = next_root(
        _root(authority.root_envelope),
        signers=[authority.root_key, k2],
        add_root_keys=[k2.public_key()],
        remove_root_keys=[key_id_of(authority.root_key.public_key())],
    )
    v3 = next_root(
        _root(v2),
        signers=[k2, k3],
        add_root_keys=[k3.public_key()],
        remove_root_keys=[key_id_of(k2.public_key())],
        add_policy_keys=[(p3.public_key(), now + YEAR)],
    )
    # v3 alone is not signed by anything the v1 device trusts.
    with pytest.raises(RootRotationError):
        device.update_root(v3, now=now)
    # The collector serves the chain; the device applies what it missed, in order,
    # skipping what it already has (v1 re-delivered).
    applied = device.update_roots([authority.root_envelope, v2, v3], now=now)
    assert applied == 2
    assert device.root_version == 3
    signed = sign_policy(_policy(authority, now, version=5), p3)
    assert verify_policy(signed, device, now=now).version == 5
    # Re-delivery is harmless.
    assert device.update_roots([v2, v3], now=now) == 0


def test_walk_through_roots_that_have_since_expired(authority: Authority, now: int) -> None:
    # v2 expired while the device was offline; v3 is fresh: the walk still works.
    k2 = generate_key()
    v2 = next_root(
        _root(authority.root_envelope),
        signers=[authority.root_key, k2],
        add_root_keys=[k2.public_key()],
        expires_at=now + DAY,
    )
    v3 = next_root(_root(v2), signers=[authority.root_key, k2], expires_at=now + YEAR)
    device = authority.trust_store(now=now)
    later = now + 30 * DAY
    device.update_roots([v2, v3], now=later)
    assert device.root_version == 3
    device.policy_key(authority.policy_key_id, now=later)


def test_threshold_two_of_three(now: int) -> None:
    roots = [generate_key() for _ in range(3)]
    policy_key = generate_key()
    v1 = make_root(
        version=1,
        root_keys=roots,
        policy_keys=[(policy_key.public_key(), 0)],
        expires_at=now + YEAR,
        threshold=2,
        signers=roots[:2],
    )
    publics = [key.public_key() for key in roots]
    device = TrustStore.from_pinned_root(v1, publics, now=now)
    one_signer = sign_envelope(ROOT_PAYLOAD_TYPE, v1.payload, roots[:1])
    with pytest.raises(RootRotationError, match="needs 2"):
        TrustStore.from_pinned_root(one_signer, publics, now=now)
    # Rotation with one old signature is refused; with two it passes.
    with pytest.raises(InvalidPolicyError):
        next_root(_root(v1), signers=[roots[0]])
    v2 = next_root(_root(v1), signers=[roots[1], roots[2]])
    device.update_root(v2, now=now)
    assert device.root_version == 2


def test_pinned_key_must_sign_the_first_root(authority: Authority, now: int) -> None:
    with pytest.raises(RootRotationError, match="pinned"):
        TrustStore.from_pinned_root(
            authority.root_envelope, [Ed25519PrivateKey.generate().public_key()], now=now
        )
    with pytest.raises(RootRotationError, match="no pinned"):
        TrustStore.from_pinned_root(authority.root_envelope, [], now=now)


def test_tampered_trust_state_is_refused(trust: TrustStore) -> None:
    state = bytearray(trust.to_bytes())
    with pytest.raises(RootRotationError):
        TrustStore.from_bytes(bytes(state[:-20]))
    with pytest.raises(RootRotationError):
        TrustStore.from_bytes(b"{}")


def test_load_trust_takes_roots_in_any_order(authority: Authority, now: int) -> None:
    k2 = generate_key()
    v2 = next_root(
        _root(authority.root_envelope),
        signers=[authority.root_key, k2],
        add_root_keys=[k2.public_key()],
    )
    v3 = next_root(_root(v2), signers=[k2])
    chain = [authority.root_envelope, v2, v3]
    random.Random(4).shuffle(chain)
    trust = load_trust(authority.root_public_keys, chain, now=now)
    assert trust.root_version == 3


def test_update_roots_skips_older_roots_and_survives_a_forged_candidate(
    authority: Authority, now: int
) -> None:
    k2 = generate_key()
    v2 = next_root(
        _root(authority.root_envelope),
        signers=[authority.root_key, k2],
        add_root_keys=[k2.public_key()],
    )
    v3 = next_root(_root(v2), signers=[k2])
    # A device provisioned with v2 directly (never saw v1) gets the whole chain.
    device = TrustStore.from_pinned_root(v2, [k2.public_key()], now=now)
    assert device.update_roots([authority.root_envelope, v2, v3], now=now) == 1
    assert device.root_version == 3
    # A forged v2 listed before the real one does not block the chain.
    attacker = generate_key()
    forged = make_root(
        version=2,
        root_keys=[attacker],
        policy_keys=[(attacker.public_key(), 0)],
        expires_at=now + YEAR,
        signers=[attacker],
    )
    fresh = authority.trust_store(now=now)
    assert fresh.update_roots([forged, v3, v2], now=now) == 2
    assert fresh.root_version == 3
    # Only forged candidates: refused with the reason, nothing applied.
    other = authority.trust_store(now=now)
    with pytest.raises(RootRotationError):
        other.update_roots([forged], now=now)
    assert other.root_version == 1
