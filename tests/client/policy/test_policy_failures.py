"""One test per verification failure mode, each with its own exception type."""

from __future__ import annotations

from decimal import Decimal

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.authoring import Authority, make_root, sign_envelope
from fedldp.client.policy import (
    POLICY_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    AudienceMismatchError,
    BadSignatureError,
    EpsilonAboveMaximumError,
    ExpiredKeyError,
    ExpiredPolicyError,
    InvalidPolicyError,
    NotYetValidPolicyError,
    PayloadTypeError,
    PolicyError,
    RollbackError,
    TrustStore,
    UnknownKeyError,
    verify_policy,
)
from fedldp.v1 import policy_pb2

DAY = 86400


def _copy(envelope: policy_pb2.SignedEnvelope) -> policy_pb2.SignedEnvelope:
    return policy_pb2.SignedEnvelope.FromString(envelope.SerializeToString())


def test_bad_signature(trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int) -> None:
    tampered = _copy(envelope)
    sig = bytearray(tampered.signatures[0].sig)
    sig[10] ^= 0x01
    tampered.signatures[0].sig = bytes(sig)
    with pytest.raises(BadSignatureError, match="re-sign"):
        verify_policy(tampered, trust, now=now)


def test_tampered_payload_fails_the_signature_before_parsing(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    tampered = _copy(envelope)
    tampered.payload = b"\xff\xff not a policy at all"
    with pytest.raises(BadSignatureError):  # not InvalidPolicyError: never parsed
        verify_policy(tampered, trust, now=now)


def test_no_signatures(trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int) -> None:
    unsigned = _copy(envelope)
    del unsigned.signatures[:]
    with pytest.raises(BadSignatureError, match="no signatures"):
        verify_policy(unsigned, trust, now=now)


def test_unknown_key(trust: TrustStore, policy: policy_pb2.Policy, now: int) -> None:
    stranger = Ed25519PrivateKey.generate()
    envelope = sign_envelope(POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [stranger])
    with pytest.raises(UnknownKeyError, match="keys rotate"):
        verify_policy(envelope, trust, now=now)


def test_root_key_is_not_a_policy_key(
    authority: Authority, trust: TrustStore, policy: policy_pb2.Policy, now: int
) -> None:
    envelope = sign_envelope(POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [authority.root_key])
    with pytest.raises(UnknownKeyError):
        verify_policy(envelope, trust, now=now)


def test_one_valid_signature_among_unknown_ones_is_enough(
    authority: Authority, trust: TrustStore, policy: policy_pb2.Policy, now: int
) -> None:
    envelope = sign_envelope(
        POLICY_PAYLOAD_TYPE,
        policy.SerializeToString(),
        [Ed25519PrivateKey.generate(), authority.policy_key],
    )
    assert verify_policy(envelope, trust, now=now).key_id == authority.policy_key_id


def test_expired_key(authority: Authority, policy: policy_pb2.Policy, now: int) -> None:
    # Root valid for a year, but the policy key only for ten days.
    root = make_root(
        version=1,
        root_keys=[authority.root_key],
        policy_keys=[(authority.policy_key.public_key(), now + 10 * DAY)],
        expires_at=now + 365 * DAY,
        signers=[authority.root_key],
    )
    trust = TrustStore.from_pinned_root(root, authority.root_public_keys, now=now)
    envelope = authority.sign(policy)  # policy valid for 30 days
    verify_policy(envelope, trust, now=now + 10 * DAY - 1)
    with pytest.raises(ExpiredKeyError, match="expired"):
        verify_policy(envelope, trust, now=now + 10 * DAY)


def test_expired_root(authority: Authority, policy: policy_pb2.Policy, now: int) -> None:
    root = make_root(
        version=1,
        root_keys=[authority.root_key],
        policy_keys=[(authority.policy_key.public_key(), 0)],
        expires_at=now + 5 * DAY,
        signers=[authority.root_key],
    )
    trust = TrustStore.from_pinned_root(root, authority.root_public_keys, now=now)
    with pytest.raises(ExpiredKeyError, match="root v1 expired"):
        verify_policy(authority.sign(policy), trust, now=now + 5 * DAY)


def test_expired_policy(trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int) -> None:
    expires_at = now + 30 * DAY
    verify_policy(envelope, trust, now=expires_at - 1)
    with pytest.raises(ExpiredPolicyError, match="later expires_at"):
        verify_policy(envelope, trust, now=expires_at)


def test_not_yet_valid_policy(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    with pytest.raises(NotYetValidPolicyError, match="clock"):
        verify_policy(envelope, trust, now=now - 1)


def test_rollback(authority: Authority, trust: TrustStore, now: int) -> None:
    def signed(version: int) -> policy_pb2.SignedEnvelope:
        return authority.sign(
            authority.categorical_policy(
                policy_id="p",
                metric="m",
                labels=["a", "b"],
                epsilon="1",
                epsilon_cap="1",
                window_seconds=DAY,
                now=now,
                version=version,
            )
        )

    stored = {"p": 3}
    with pytest.raises(RollbackError, match="version 3"):
        verify_policy(signed(2), trust, now=now, highest_versions=stored)
    assert verify_policy(signed(3), trust, now=now, highest_versions=stored).version == 3
    assert verify_policy(signed(4), trust, now=now, highest_versions=stored).version == 4
    assert verify_policy(signed(1), trust, now=now, highest_versions={"other": 9}).version == 1
    assert stored == {"p": 3}  # verification never writes the caller's state


def test_epsilon_above_device_maximum(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    # The policy is validly signed with epsilon 1.5; the device's own limit wins.
    verify_policy(envelope, trust, now=now, max_epsilon=Decimal("1.5"))
    with pytest.raises(EpsilonAboveMaximumError, match="maximum"):
        verify_policy(envelope, trust, now=now, max_epsilon=Decimal("1.4999"))
    with pytest.raises(EpsilonAboveMaximumError, match="cap"):
        verify_policy(envelope, trust, now=now, max_epsilon_cap=Decimal("5"))


def test_mixed_up_payload_type(
    authority: Authority, trust: TrustStore, policy: policy_pb2.Policy, now: int
) -> None:
    # A root envelope offered as a policy.
    with pytest.raises(PayloadTypeError, match="expected"):
        verify_policy(authority.root_envelope, trust, now=now)
    # A policy payload signed (by the right key) as some other type.
    other = sign_envelope(ROOT_PAYLOAD_TYPE, policy.SerializeToString(), [authority.policy_key])
    with pytest.raises(PayloadTypeError):
        verify_policy(other, trust, now=now)
    # ... and relabelled as a policy: the signature covers the type, so it fails.
    other.payload_type = POLICY_PAYLOAD_TYPE
    with pytest.raises(BadSignatureError):
        verify_policy(other, trust, now=now)
    # A policy offered as a root.
    with pytest.raises(PayloadTypeError):
        trust.update_root(authority.sign(policy), now=now)


def test_audience_mismatch(
    trust: TrustStore, envelope: policy_pb2.SignedEnvelope, now: int
) -> None:
    verify_policy(envelope, trust, now=now, audience="prod-eu")
    with pytest.raises(AudienceMismatchError, match="prod-us"):
        verify_policy(envelope, trust, now=now, audience="prod-us")


def test_signed_but_invalid_content_lists_every_problem(
    authority: Authority, trust: TrustStore, policy: policy_pb2.Policy, now: int
) -> None:
    policy.metric.categorical.values.append("news")  # duplicate, and the digest is now stale
    policy.mechanism.epsilon = "1e-1"
    policy.budget.window_seconds = 0
    # sign_envelope does not validate: a buggy or malicious signer could do this.
    envelope = sign_envelope(
        POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [authority.policy_key]
    )
    with pytest.raises(InvalidPolicyError) as info:
        verify_policy(envelope, trust, now=now)
    text = " | ".join(info.value.problems)
    assert "unique" in text
    assert "digest" in text
    assert "mechanism.epsilon" in text
    assert "window_seconds" in text
    assert len(info.value.problems) >= 4


def test_signed_garbage_is_invalid_not_a_crash(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    envelope = sign_envelope(POLICY_PAYLOAD_TYPE, b"\xff\xff\xff", [authority.policy_key])
    with pytest.raises(InvalidPolicyError, match=r"not a fedldp\.v1\.Policy"):
        verify_policy(envelope, trust, now=now)


def test_every_failure_is_a_policy_error() -> None:
    for cls in (
        BadSignatureError,
        UnknownKeyError,
        ExpiredKeyError,
        PayloadTypeError,
        InvalidPolicyError,
        ExpiredPolicyError,
        NotYetValidPolicyError,
        RollbackError,
        EpsilonAboveMaximumError,
        AudienceMismatchError,
    ):
        assert issubclass(cls, PolicyError)


def test_oversized_payload_is_refused_before_any_crypto(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    from fedldp.client.policy.envelope import MAX_PAYLOAD_BYTES

    envelope = sign_envelope(
        POLICY_PAYLOAD_TYPE, b"\x00" * (MAX_PAYLOAD_BYTES + 1), [authority.policy_key]
    )
    with pytest.raises(InvalidPolicyError, match="bytes, more than"):
        verify_policy(envelope, trust, now=now)


def test_memoized_permanent_epsilon_is_under_the_device_maximum(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    from fedldp.client.mechanisms import registered_ids

    if "rappor-grr" not in registered_ids():
        pytest.skip("no memoized mechanism registered")
    policy = authority.categorical_policy(
        policy_id="memo",
        metric="m",
        labels=["a", "b", "c"],
        epsilon="0.5",
        epsilon_cap="2",
        window_seconds=DAY,
        now=now,
        mechanism="rappor-grr",
        params={"epsilon_permanent": "3"},
        memo_charging=policy_pb2.MEMO_CHARGING_INSTANTANEOUS,
    )
    envelope = authority.sign(policy)
    verified = verify_policy(envelope, trust, now=now, max_epsilon=Decimal("3"))
    assert verified.epsilon == Decimal("0.5")
    assert verified.charge == verified.mechanism.report_charge >= Decimal("0.5")
    with pytest.raises(EpsilonAboveMaximumError, match="permanent"):
        verify_policy(envelope, trust, now=now, max_epsilon=Decimal("2"))


def test_memoized_charge_not_epsilon_is_held_to_the_device_maximum(
    authority: Authority, trust: TrustStore, now: int
) -> None:
    # rappor-grr, k = 64, ε1 = 0.5, ε∞ = 2: a report really costs ε_I = 2.192184
    # (any two value sequences; memo_loss.py), not ε1.
    # Signed with the older INSTANTANEOUS label it is accepted and charged the same.
    for memo in (policy_pb2.MEMO_CHARGING_JOINT, policy_pb2.MEMO_CHARGING_INSTANTANEOUS):
        policy = authority.categorical_policy(
            policy_id="memo",
            metric="m",
            labels=[f"v{i}" for i in range(64)],
            epsilon="0.5",
            epsilon_cap="3",
            window_seconds=DAY,
            now=now,
            mechanism="rappor-grr",
            params={"epsilon_permanent": "2"},
            memo_charging=memo,
        )
        envelope = authority.sign(policy)
        verified = verify_policy(envelope, trust, now=now, max_epsilon=Decimal("3"))
        assert (verified.epsilon, verified.charge) == (Decimal("0.5"), Decimal("2.192184"))
        with pytest.raises(EpsilonAboveMaximumError, match=r"costs epsilon 2\.192184 per report"):
            verify_policy(envelope, trust, now=now, max_epsilon=Decimal("2"))


def test_cap_below_the_memoized_charge_is_refused_when_authoring(
    authority: Authority, now: int
) -> None:
    with pytest.raises(InvalidPolicyError, match=r"below the per-report cost \(2.192184\)"):
        authority.categorical_policy(
            policy_id="memo",
            metric="m",
            labels=[f"v{i}" for i in range(64)],
            epsilon="0.5",
            epsilon_cap="0.6",
            window_seconds=DAY,
            now=now,
            mechanism="rappor-grr",
            params={"epsilon_permanent": "2"},
        )


def test_authoring_writes_joint_charging_for_memoized_mechanisms(
    authority: Authority, now: int
) -> None:
    policy = authority.categorical_policy(
        policy_id="memo",
        metric="m",
        labels=["a", "b", "c"],
        epsilon="0.5",
        epsilon_cap="3",
        window_seconds=DAY,
        now=now,
        mechanism="rappor-oue",
        params={"epsilon_permanent": "2"},
    )
    assert policy.mechanism.memo_charging == policy_pb2.MEMO_CHARGING_JOINT


def test_numeric_policy(authority: Authority, trust: TrustStore, now: int) -> None:
    from fedldp.client.mechanisms import registered_ids

    if "piecewise" not in registered_ids():
        pytest.skip("no numeric mechanism registered")
    policy = authority.numeric_policy(
        policy_id="latency",
        metric="net.latency_ms",
        lo="-5",
        hi="250.5",
        epsilon="1",
        epsilon_cap="3",
        window_seconds=DAY,
        now=now,
    )
    verified = verify_policy(authority.sign(policy), trust, now=now)
    assert verified.labels is None
    assert verified.numeric_range == (Decimal("-5"), Decimal("250.5"))
    with pytest.raises(ValueError, match="numeric"):
        verified.label_index("a")
