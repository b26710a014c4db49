"""Signing: keys, roots and policy envelopes (the authoring side; devices only verify).

`sign_envelope` signs exact payload bytes under DSSE v1's pre-authentication
encoding (`fedldp.client.policy.envelope.pae`), the bytes devices verify.
`make_root` / `next_root` build roots that the TUF rotation rule devices
enforce (`fedldp.client.policy.trust.TrustStore.update_root`) accepts: every
structural problem and a missing signer threshold are refused here, so an
envelope devices would refuse is never produced. `sign_policy` signs a policy
only after the same content validation devices run.
"""

from __future__ import annotations

from collections.abc import Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from fedldp.client.policy.envelope import (
    POLICY_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    key_id_of,
    pae,
    raw_public_bytes,
)
from fedldp.client.policy.errors import InvalidPolicyError
from fedldp.client.policy.validation import policy_problems, root_problems
from fedldp.v1 import policy_pb2


def sign_envelope(
    payload_type: str, payload: bytes, keys: Sequence[Ed25519PrivateKey]
) -> policy_pb2.SignedEnvelope:
    """Sign `payload` (exact bytes) with each key; one Signature per distinct key.

    Raises ValueError when `keys` is empty.
    """
    if not keys:
        raise ValueError("sign_envelope needs at least one private key")
    envelope = policy_pb2.SignedEnvelope(payload_type=payload_type, payload=payload)
    message = pae(payload_type, payload)
    seen: set[str] = set()
    for key in keys:
        key_id = key_id_of(key.public_key())
        if key_id in seen:
            continue
        seen.add(key_id)
        envelope.signatures.append(policy_pb2.Signature(key_id=key_id, sig=key.sign(message)))
    return envelope


def generate_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key from the OS CSPRNG."""
    return Ed25519PrivateKey.generate()


def public_key_entry(key: Ed25519PublicKey, *, expires_at: int = 0) -> policy_pb2.PublicKey:
    """The wire `PublicKey` of `key` (key id, raw bytes, expiry; 0 = never)."""
    return policy_pb2.PublicKey(
        key_id=key_id_of(key), ed25519=raw_public_bytes(key), expires_at=expires_at
    )


def make_root(
    *,
    version: int,
    root_keys: Sequence[Ed25519PrivateKey | Ed25519PublicKey],
    policy_keys: Sequence[tuple[Ed25519PublicKey, int]],
    expires_at: int,
    threshold: int = 1,
    signers: Sequence[Ed25519PrivateKey],
) -> policy_pb2.SignedEnvelope:
    """Build and sign a Root.

    `root_keys` are the root keys this version lists (private keys are accepted
    and only their public parts are written); `policy_keys` are (public key,
    expires_at) pairs (0 = never). For version > 1, `signers` must include a
    threshold of the previous root's keys as well as a threshold of this one's
    (TUF rotation rule); `TrustStore.update_root` enforces it.
    Raises InvalidPolicyError listing every structural problem.
    """
    publics = [key.public_key() if isinstance(key, Ed25519PrivateKey) else key for key in root_keys]
    root = policy_pb2.Root(
        version=version,
        root_keys=[public_key_entry(key) for key in publics],
        root_threshold=threshold,
        policy_keys=[public_key_entry(key, expires_at=exp) for key, exp in policy_keys],
        expires_at=expires_at,
    )
    return sign_root(root, signers)


def sign_root(
    root: policy_pb2.Root, signers: Sequence[Ed25519PrivateKey]
) -> policy_pb2.SignedEnvelope:
    """Validate `root` and sign its serialization with every key in `signers`."""
    problems = root_problems(root)
    if problems:
        raise InvalidPolicyError(problems, subject=f"root v{root.version}")
    return sign_envelope(ROOT_PAYLOAD_TYPE, root.SerializeToString(), signers)


def next_root(
    current: policy_pb2.Root,
    *,
    signers: Sequence[Ed25519PrivateKey],
    expires_at: int | None = None,
    add_root_keys: Sequence[Ed25519PublicKey] = (),
    remove_root_keys: Sequence[str] = (),
    threshold: int | None = None,
    add_policy_keys: Sequence[tuple[Ed25519PublicKey, int]] = (),
    remove_policy_keys: Sequence[str] = (),
) -> policy_pb2.SignedEnvelope:
    """Root version current + 1 with the given changes, signed by `signers`.

    `signers` must hold a threshold of the current root keys *and* a threshold of
    the new root's keys (the TUF rule devices enforce); this is checked here too,
    so an envelope devices would refuse is never produced. Key ids in
    `remove_*` must exist. An added policy key already listed gets the new
    expiry (how a key's life is extended). Raises InvalidPolicyError listing
    every problem.
    """
    problems: list[str] = []
    root = policy_pb2.Root()
    root.CopyFrom(current)
    root.version = current.version + 1
    if expires_at is not None:
        root.expires_at = expires_at
    for role, entries, removals in (
        ("root", root.root_keys, remove_root_keys),
        ("policy", root.policy_keys, remove_policy_keys),
    ):
        listed = {entry.key_id for entry in entries}
        for key_id in removals:
            if key_id not in listed:
                problems.append(f"cannot remove {role} key {key_id[:16]}…: it is not listed")
        kept = [entry for entry in entries if entry.key_id not in set(removals)]
        del entries[:]
        entries.extend(kept)
    for key in add_root_keys:
        if key_id_of(key) not in {entry.key_id for entry in root.root_keys}:
            root.root_keys.append(public_key_entry(key))
    for key, key_expires_at in add_policy_keys:
        key_id = key_id_of(key)
        existing = [entry for entry in root.policy_keys if entry.key_id == key_id]
        if existing:
            existing[0].expires_at = key_expires_at
        else:
            root.policy_keys.append(public_key_entry(key, expires_at=key_expires_at))
    if threshold is not None:
        root.root_threshold = threshold
    problems.extend(root_problems(root))
    signer_ids = {key_id_of(key.public_key()) for key in signers}
    for label, old_or_new in (("current", current), ("new", root)):
        have = len(signer_ids & {entry.key_id for entry in old_or_new.root_keys})
        if have < old_or_new.root_threshold:
            problems.append(
                f"signers include {have} of the {label} root keys, the {label} root needs "
                f"{old_or_new.root_threshold}; sign with the {label} root private keys too"
            )
    if problems:
        raise InvalidPolicyError(problems, subject=f"root v{root.version}")
    return sign_envelope(ROOT_PAYLOAD_TYPE, root.SerializeToString(), signers)


def sign_policy(policy: policy_pb2.Policy, key: Ed25519PrivateKey) -> policy_pb2.SignedEnvelope:
    """Validate `policy` (every problem at once) and sign its serialized bytes."""
    problems, _ = policy_problems(policy)
    if problems:
        raise InvalidPolicyError(
            problems, subject=f"policy {policy.policy_id or '?'} v{policy.version}"
        )
    return sign_envelope(POLICY_PAYLOAD_TYPE, policy.SerializeToString(), [key])


__all__ = [
    "generate_key",
    "make_root",
    "next_root",
    "public_key_entry",
    "sign_envelope",
    "sign_policy",
    "sign_root",
]
