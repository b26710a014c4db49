"""A one-root-key, one-policy-key authority for demos and tests.

Production deployments keep the root key offline and author with `fedldp keys`
and `fedldp policy` instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from fedldp.authoring.policies import (
    attributes_from_tables,
    require_valid,
    resolve_auto_mechanism,
    state_numeric_grid,
    state_open_params,
    state_sketch_params,
)
from fedldp.authoring.signing import generate_key, make_root, sign_policy
from fedldp.client.policy.envelope import domain_digest, key_id_of
from fedldp.client.policy.errors import InvalidPolicyError
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.validation import EPSILON_PERMANENT
from fedldp.v1 import policy_pb2

if TYPE_CHECKING:  # annotations only (postponed): no runtime dependency on Python 3.11+
    from typing_extensions import NotRequired, Unpack

_DAY = 86400


class PolicyFields(TypedDict):
    """Keyword arguments shared by `Authority.categorical_policy` and `numeric_policy`.

    Required: policy_id, metric, epsilon (per report, decimal text), epsilon_cap
    (per window), window_seconds, now (the policy is valid from `now`).
    Optional, with defaults: version 1, lifetime_seconds 30 days, min_reports 100,
    audience ("default",), params {} (mechanism parameters), purpose
    "collect METRIC under local differential privacy", memo_charging JOINT when
    params names epsilon_permanent (a memoized mechanism), else NONE.
    """

    policy_id: str
    metric: str
    epsilon: str
    epsilon_cap: str
    window_seconds: int
    now: int
    version: NotRequired[int]
    lifetime_seconds: NotRequired[int]
    min_reports: NotRequired[int]
    audience: NotRequired[Sequence[str]]
    params: NotRequired[Mapping[str, str] | None]
    purpose: NotRequired[str | None]
    memo_charging: NotRequired[policy_pb2.MemoCharging.ValueType]


_REQUIRED_FIELDS = ("policy_id", "metric", "epsilon", "epsilon_cap", "window_seconds", "now")


@dataclass
class Authority:
    """One root key, one policy key, and root v1 listing them (demos and tests).

    Production deployments keep the root key offline and use `fedldp keys` instead.
    """

    root_key: Ed25519PrivateKey
    policy_key: Ed25519PrivateKey
    root_envelope: policy_pb2.SignedEnvelope
    root_public_keys: list[Ed25519PublicKey] = field(default_factory=list)

    @classmethod
    def generate(cls, *, now: int, lifetime_seconds: int = 365 * _DAY) -> Authority:
        """Fresh keys and root v1, valid from `now` for `lifetime_seconds`."""
        root_key = generate_key()
        policy_key = generate_key()
        expires_at = now + lifetime_seconds
        envelope = make_root(
            version=1,
            root_keys=[root_key],
            policy_keys=[(policy_key.public_key(), expires_at)],
            expires_at=expires_at,
            signers=[root_key],
        )
        return cls(root_key, policy_key, envelope, [root_key.public_key()])

    @property
    def policy_key_id(self) -> str:
        """Key id of the policy-signing key."""
        return key_id_of(self.policy_key.public_key())

    def trust_store(self, *, now: int) -> TrustStore:
        """A trust store pinned to this authority's root key."""
        return TrustStore.from_pinned_root(self.root_envelope, self.root_public_keys, now=now)

    def sign(self, policy: policy_pb2.Policy) -> policy_pb2.SignedEnvelope:
        """Validate and sign `policy` with the policy key."""
        return sign_policy(policy, self.policy_key)

    def _base_policy(self, *, mechanism: str, **fields: Unpack[PolicyFields]) -> policy_pb2.Policy:
        """The policy without its metric's domain; defaults as documented on PolicyFields.

        Raises TypeError, as a plain signature would, on an unknown or a missing
        required keyword (typing checks them statically; this is for untyped callers).
        """
        unknown = sorted(set(fields) - set(PolicyFields.__annotations__))
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
        missing = [name for name in _REQUIRED_FIELDS if name not in fields]
        if missing:
            raise TypeError(f"missing required keyword argument(s): {', '.join(missing)}")
        metric = fields["metric"]
        now = fields["now"]
        purpose = fields.get("purpose")
        params = dict(fields.get("params") or {})
        memoized = EPSILON_PERMANENT in params
        default_memo = policy_pb2.MEMO_CHARGING_JOINT if memoized else policy_pb2.MEMO_CHARGING_NONE
        return policy_pb2.Policy(
            policy_id=fields["policy_id"],
            version=fields.get("version", 1),
            purpose=purpose or f"collect {metric} under local differential privacy",
            audience=list(fields.get("audience", ("default",))),
            metric=policy_pb2.Metric(name=metric),
            mechanism=policy_pb2.MechanismSpec(
                id=mechanism,
                epsilon=fields["epsilon"],
                params=params,
                memo_charging=fields.get("memo_charging", default_memo),
            ),
            budget=policy_pb2.Budget(
                epsilon_cap=fields["epsilon_cap"], window_seconds=fields["window_seconds"]
            ),
            not_before=now,
            expires_at=now + fields.get("lifetime_seconds", 30 * _DAY),
            min_reports_for_release=fields.get("min_reports", 100),
        )

    def categorical_policy(
        self, *, labels: Sequence[str], mechanism: str = "grr", **fields: Unpack[PolicyFields]
    ) -> policy_pb2.Policy:
        """A validated categorical policy valid from `now` (not signed; see `sign`)."""
        policy = self._base_policy(mechanism=mechanism, **fields)
        policy.metric.categorical.values.extend(labels)
        policy.metric.categorical.digest = domain_digest(labels)
        resolve_auto_mechanism(policy)
        require_valid(policy)
        return policy

    def numeric_policy(
        self, *, lo: str, hi: str, mechanism: str = "piecewise", **fields: Unpack[PolicyFields]
    ) -> policy_pb2.Policy:
        """A validated numeric-range policy valid from `now` (not signed; see `sign`)."""
        policy = self._base_policy(mechanism=mechanism, **fields)
        policy.metric.numeric.lo = lo
        policy.metric.numeric.hi = hi
        state_numeric_grid(policy)
        require_valid(policy)
        return policy

    def multi_policy(
        self,
        *,
        attributes: Sequence[Mapping[str, Any]],
        mechanism: str = "auto",
        **fields: Unpack[PolicyFields],
    ) -> policy_pb2.Policy:
        """A validated multi-attribute policy valid from `now` (not signed; see `sign`).

        `attributes` are tables of the TOML schema's [[metric.attributes]] (name,
        values or lo and hi, mechanism, optional params; docs/policies.md);
        "auto" (policy or attribute mechanism) is resolved and numeric grids stated.
        """
        policy = self._base_policy(mechanism=mechanism, **fields)
        problems: list[str] = []
        attributes_from_tables(attributes, policy.metric.multi, problems)
        if problems:
            raise InvalidPolicyError(problems, subject=f"policy {policy.policy_id}")
        resolve_auto_mechanism(policy)
        state_numeric_grid(policy)
        require_valid(policy)
        return policy

    def open_policy(
        self, *, max_bytes: int, mechanism: str = "pem", **fields: Unpack[PolicyFields]
    ) -> policy_pb2.Policy:
        """A validated open-domain policy (strings of 1..max_bytes UTF-8 bytes) valid
        from `now`, its derived mechanism params stated (not signed; see `sign`): pem's
        (step_bits, start_bits, groups, g) or a sketch's size (cms, hcms: rows, columns)."""
        policy = self._base_policy(mechanism=mechanism, **fields)
        policy.metric.open.max_bytes = max_bytes
        state_open_params(policy)
        state_sketch_params(policy)
        require_valid(policy)
        return policy


__all__ = ["Authority", "PolicyFields"]
