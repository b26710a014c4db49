"""Signed, versioned collection policies: envelopes, trust roots, verification, authoring.

A device randomizes only under a policy that a key its owner trusts signed. The
model is The Update Framework (python-tuf) and DSSE, scaled down: a pinned root
delegates to policy-signing keys; policies are signed envelopes over exact
bytes, verified before parsing by a pure function of (bytes, trusted keys,
stored versions, now). See docs/policies.md for usage and the threat model.

Base install only: cryptography and protobuf (TOML reading in `authoring` uses
tomllib, or tomli on Python 3.10).
"""

from fedldp.client.policy.authoring import (
    Authority,
    generate_key,
    load_policy_toml,
    make_root,
    next_root,
    policy_from_dict,
    sign_policy,
    successor_problems,
)
from fedldp.client.policy.envelope import (
    POLICY_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    domain_digest,
    key_id_of,
    pae,
    policy_digest,
    sign_envelope,
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
    load_private_key,
    load_public_key,
    load_trust,
    load_trust_folder,
    read_envelope,
    write_envelope,
    write_private_key,
    write_public_key,
)
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.validation import parse_decimal, policy_problems
from fedldp.client.policy.verify import VerifiedPolicy, verify_policy

__all__ = [
    "POLICY_PAYLOAD_TYPE",
    "ROOT_PAYLOAD_TYPE",
    "AudienceMismatchError",
    "Authority",
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
    "generate_key",
    "key_id_of",
    "load_policy_folder",
    "load_policy_toml",
    "load_private_key",
    "load_public_key",
    "load_trust",
    "load_trust_folder",
    "make_root",
    "next_root",
    "pae",
    "parse_decimal",
    "policy_digest",
    "policy_from_dict",
    "policy_problems",
    "read_envelope",
    "sign_envelope",
    "sign_policy",
    "successor_problems",
    "verify_policy",
    "write_envelope",
    "write_private_key",
    "write_public_key",
]
