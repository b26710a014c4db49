"""Signed, versioned collection policies on the device: envelopes, trust roots, verification.

A device randomizes only under a policy that a key its owner trusts signed. The
model is The Update Framework (python-tuf) and DSSE, scaled down: a pinned root
delegates to policy-signing keys; policies are signed envelopes over exact
bytes, verified before parsing by a pure function of (bytes, trusted keys,
stored versions, now). See docs/policies.md for usage and the threat model.

Verification only: signing, root rotation and key files are authoring, in
`fedldp.authoring` (the tooling side), which nothing here imports. Base install
only: cryptography and protobuf.
"""

from fedldp.client.policy.envelope import (
    POLICY_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    domain_digest,
    key_id_of,
    pae,
    policy_digest,
)
from fedldp.client.policy.errors import (
    AudienceMismatchError,
    BadSignatureError,
    ConflictingPolicyError,
    EpsilonAboveMaximumError,
    ExpiredKeyError,
    ExpiredPolicyError,
    InvalidPolicyError,
    NotYetValidPolicyError,
    PayloadTypeError,
    PolicyError,
    RollbackError,
    RootRotationError,
    UnknownKeyError,
    WindowChangeError,
)
from fedldp.client.policy.files import (
    KeyFileError,
    load_policy_folder,
    load_public_key,
    load_trust,
    load_trust_folder,
    read_envelope,
)
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.validation import parse_decimal, policy_problems
from fedldp.client.policy.verify import VerifiedPolicy, verify_policy

__all__ = [
    "POLICY_PAYLOAD_TYPE",
    "ROOT_PAYLOAD_TYPE",
    "AudienceMismatchError",
    "BadSignatureError",
    "ConflictingPolicyError",
    "EpsilonAboveMaximumError",
    "ExpiredKeyError",
    "ExpiredPolicyError",
    "InvalidPolicyError",
    "KeyFileError",
    "NotYetValidPolicyError",
    "PayloadTypeError",
    "PolicyError",
    "RollbackError",
    "RootRotationError",
    "TrustStore",
    "UnknownKeyError",
    "VerifiedPolicy",
    "WindowChangeError",
    "domain_digest",
    "key_id_of",
    "load_policy_folder",
    "load_public_key",
    "load_trust",
    "load_trust_folder",
    "pae",
    "parse_decimal",
    "policy_digest",
    "policy_problems",
    "read_envelope",
    "verify_policy",
]
