"""The policies a collector accepts reports for, and the root chain it serves.

A report is accepted only for an active (policy id, version, digest): the
registry answers `lookup` with the verified policy or the precise reason it is
not usable. Policies whose signature verified but whose validity interval does
not contain `now` are remembered as inactive, so a report for them is
EXPIRED_POLICY rather than UNKNOWN_POLICY.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fedldp.client.policy import (
    ExpiredPolicyError,
    NotYetValidPolicyError,
    PolicyError,
    TrustStore,
    VerifiedPolicy,
    policy_digest,
    verify_policy,
)
from fedldp.client.policy.files import (
    load_policy_folder,
    load_trust_folder,
    read_envelope,
)
from fedldp.v1 import policy_pb2

log = logging.getLogger(__name__)


class Lookup(enum.Enum):
    """Why a report's (policy id, version, digest) is or is not usable."""

    ACTIVE = "active"
    UNKNOWN = "unknown"  # no such (id, version) here
    DIGEST_MISMATCH = "digest_mismatch"  # (id, version) known, other bytes
    INACTIVE = "inactive"  # expired, not yet valid, or (id, version) known only as expired


@dataclass
class PolicyRegistry:
    """Verified policies by (id, version), inactive ones, and the served roots."""

    policies: dict[tuple[str, int], VerifiedPolicy] = field(default_factory=dict)
    inactive: dict[tuple[str, int], bytes] = field(default_factory=dict)
    roots: list[tuple[int, policy_pb2.SignedEnvelope]] = field(default_factory=list)

    @classmethod
    def from_envelopes(
        cls,
        envelopes: Iterable[policy_pb2.SignedEnvelope],
        trust: TrustStore,
        *,
        now: int,
        audience: str | None,
        roots: Sequence[policy_pb2.SignedEnvelope] = (),
    ) -> PolicyRegistry:
        """Verify each envelope; keep the accepted ones and remember expired ones.

        Raises PolicyError for an envelope refused for any reason other than its
        validity interval (bad signature, wrong audience, ...): a collector must
        not start with a policy set its operator did not intend.
        """
        reg = cls()
        for env in envelopes:
            try:
                verified = verify_policy(env, trust, now=now, audience=audience)
            except (ExpiredPolicyError, NotYetValidPolicyError):
                reg._remember_inactive(env)
                continue
            reg.add(verified)
        reg.set_roots(roots or [trust.root_envelope])
        return reg

    @classmethod
    def from_folders(
        cls,
        trust_dir: str | Path,
        policy_dir: str | Path,
        *,
        now: int,
        audience: str | None,
    ) -> PolicyRegistry:
        """Load the trust folder and the policy folder (formats: fedldp.client.policy.files)."""
        trust = load_trust_folder(trust_dir, now=now)
        accepted, refused = load_policy_folder(policy_dir, trust, now=now, audience=audience)
        reg = cls()
        for verified in accepted:
            reg.add(verified)
        for path, error in refused:
            if isinstance(error, (ExpiredPolicyError, NotYetValidPolicyError)):
                reg._remember_inactive(read_envelope(path))
                log.info("policy file %s is outside its validity interval", path.name)
            else:
                log.error("policy file %s refused: %s", path.name, error)
        roots = [read_envelope(p) for p in sorted(Path(trust_dir).glob("*.root"))]
        reg.set_roots(roots or [trust.root_envelope], max_version=trust.root_version)
        return reg

    def add(self, verified: VerifiedPolicy) -> None:
        """Accept a verified policy."""
        key = (verified.policy_id, verified.version)
        prior = self.policies.get(key)
        if prior is not None and prior.digest != verified.digest:
            raise PolicyError(f"policy {key[0]} v{key[1]} given twice with different contents")
        self.policies[key] = verified

    def _remember_inactive(self, env: policy_pb2.SignedEnvelope) -> None:
        # verify_policy checked the signature before the validity interval.
        msg = policy_pb2.Policy.FromString(env.payload)
        self.inactive[(msg.policy_id, int(msg.version))] = policy_digest(env.payload)

    def set_roots(
        self, roots: Iterable[policy_pb2.SignedEnvelope], *, max_version: int | None = None
    ) -> None:
        """The root envelopes served by GetPolicies, by version."""
        by_version: dict[int, policy_pb2.SignedEnvelope] = {}
        for env in roots:
            version = int(policy_pb2.Root.FromString(env.payload).version)
            if max_version is None or version <= max_version:
                by_version[version] = env
        self.roots = sorted(by_version.items(), key=lambda item: item[0])

    def lookup(
        self, policy_id: str, version: int, digest: bytes, *, now: int
    ) -> tuple[Lookup, VerifiedPolicy | None]:
        """The policy a report names, or why it cannot be used at `now`."""
        key = (policy_id, version)
        verified = self.policies.get(key)
        if verified is None:
            stale = self.inactive.get(key)
            if stale is None:
                return Lookup.UNKNOWN, None
            return (Lookup.INACTIVE if stale == digest else Lookup.DIGEST_MISMATCH), None
        if verified.digest != digest:
            return Lookup.DIGEST_MISMATCH, None
        if not verified.is_active(now):
            return Lookup.INACTIVE, None
        return Lookup.ACTIVE, verified

    def active(self, *, now: int, metric: str = "", policy_id: str = "") -> list[VerifiedPolicy]:
        """Active policies, optionally of one metric or one policy id."""
        return [
            p
            for _, p in sorted(self.policies.items())
            if p.is_active(now)
            and (not metric or p.metric_name == metric)
            and (not policy_id or p.policy_id == policy_id)
        ]

    def roots_after(self, version: int) -> list[policy_pb2.SignedEnvelope]:
        """Root envelopes with version > `version`, in order."""
        return [env for v, env in self.roots if v > version]
