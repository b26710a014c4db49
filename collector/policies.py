"""The policies a collector accepts reports for, and the root chain it serves.

A report is accepted only for an active (policy id, version, digest): the
registry answers `lookup` with the verified policy or the precise reason it is
not usable. Policies whose signature verified but that are not served — their
validity interval does not contain `now`, or the operator retired them (the
policy folder's ``retired`` list, or a ``*.policy.retired`` file) — are
remembered as inactive, so a report for them is EXPIRED_POLICY (collector.proto:
"expired, not yet valid or retired") rather than UNKNOWN_POLICY.

One budget per (subject, metric) across versions (DESIGN.md, "Ledger"). The
ledger keys spend by (subject, policy id, window start), so:

* activation (`enforce_lineage`, at start and on every reload) checks each
  version against its policy id's lineage in the ledger (metric name and window
  length, recorded by the first version activated): a version with another
  window or metric name, or a policy id claiming a metric another policy id
  holds, is refused (not served, its reports UNKNOWN_POLICY) and the other
  versions keep being served;
* activation then records every version it lets in, in the ledger
  (`Ledger.record_versions`), and refuses a version whose digest differs from
  the recorded one for its (id, version) (``version_conflict``) or whose cap is
  below the cap in force of a window of its validity that has already begun
  (``cap_lowered``: spend made there before could exceed it);
* the cap (`charged`): every report is charged against the smallest cap of
  the versions of its policy id known here whose validity interval meets the
  current window, and the ledger lowers that to the smallest cap of the versions
  any collector recorded (`Ledger._cap_in_force`). Versions in force at once
  share one spend row, and a version retired in mid-window shares it with its
  successor, so no window holds more than any version in force during it
  promises.

Loading the folders is all or nothing: a policy file refused for any reason
other than its validity interval or another deployment's audience, or a
malformed ``retired`` list, fails the load (`PolicyFolderError`), so a collector
never starts with, and a reload never swaps in, a set its operator did not
intend; a reload that fails keeps the set already served (server.py).
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import NamedTuple, Protocol

from fedldp.client.policy import (
    AudienceMismatchError,
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
from fedldp.client.policy.validation import parse_decimal
from fedldp.collector.ledger import PolicyLineage, PolicyVersion
from fedldp.v1 import policy_pb2

log = logging.getLogger(__name__)

#: Refusals of a policy file that do not fail loading the folder: the policy is
#: outside its validity interval (remembered as inactive) or addressed to another
#: deployment sharing the folder.
_NOT_OURS_NOW = (ExpiredPolicyError, NotYetValidPolicyError, AudienceMismatchError)
_RETIRED_SUFFIX = ".policy.retired"


class PolicyFolderError(PolicyError):
    """The policy folder cannot be loaded as a whole; the message names every file."""


class Lookup(enum.Enum):
    """Why a report's (policy id, version, digest) is or is not usable."""

    ACTIVE = "active"
    UNKNOWN = "unknown"  # no such (id, version) here
    DIGEST_MISMATCH = "digest_mismatch"  # (id, version) known, other bytes
    INACTIVE = "inactive"  # expired, not yet valid, or (id, version) known only as expired
    REFUSED = "refused"  # refused activation: it breaks its policy id's lineage


class LineageLedger(Protocol):
    """What activation needs of the ledger (fedldp.collector.ledger.Ledger)."""

    def claim_lineage(
        self, policy_id: str, metric_name: str, window_seconds: int, version: int, *, now: int
    ) -> PolicyLineage:
        """See `Ledger.claim_lineage`."""
        ...

    def record_versions(
        self, versions: Sequence[PolicyVersion], *, clock: Callable[[], int]
    ) -> dict[tuple[str, int], str]:
        """See `Ledger.record_versions`."""
        ...


class Refusal(NamedTuple):
    """A version refused activation: `reason` is its stable word (metrics label)."""

    policy_id: str
    version: int
    #: "window_changed" | "metric_changed" | "metric_taken" | "version_conflict" | "cap_lowered"
    reason: str
    detail: str


class _Term(NamedTuple):
    """A known version's cap and validity interval [not_before, expires_at)."""

    epsilon_cap: Decimal
    not_before: int
    expires_at: int


#: Most (policy id, version, window) copies `charged` keeps (a few per policy).
_MAX_CHARGED = 4096


@dataclass
class PolicyRegistry:
    """Verified policies by (id, version), inactive and refused ones, and the served roots."""

    policies: dict[tuple[str, int], VerifiedPolicy] = field(default_factory=dict)
    inactive: dict[tuple[str, int], bytes] = field(default_factory=dict)
    roots: list[tuple[int, policy_pb2.SignedEnvelope]] = field(default_factory=list)
    #: versions refused activation (`enforce_lineage`): their digest and why
    refused: dict[tuple[str, int], tuple[bytes, str]] = field(default_factory=dict)
    #: every known version's cap and validity (active and inactive), per policy id
    terms: dict[str, dict[int, _Term]] = field(default_factory=dict)
    #: versions not valid yet (signature and content verified): their metric name and
    #: record, so activation records a cap published ahead of its window
    upcoming: dict[tuple[str, int], tuple[str, PolicyVersion]] = field(default_factory=dict)
    #: (policy id, version, window start) -> the version as charged in that window
    _charged: dict[tuple[str, int, int], VerifiedPolicy] = field(default_factory=dict, repr=False)

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
                reg._remember_inactive(env, now=now)
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
        """Load the trust folder and the policy folder (formats: fedldp.client.policy.files).

        Raises PolicyFolderError when a policy file is refused for a reason other
        than its validity interval or audience, or the ``retired`` list is
        malformed (see the module docstring); OSError when a folder cannot be read.
        Retired policies whose signature verifies are remembered as inactive.
        """
        trust = load_trust_folder(trust_dir, now=now)
        accepted, refused = load_policy_folder(policy_dir, trust, now=now, audience=audience)
        failed = [(path, error) for path, error in refused if not isinstance(error, _NOT_OURS_NOW)]
        if failed:
            raise PolicyFolderError(
                "; ".join(f"policy file {path.name} refused: {error}" for path, error in failed)
            )
        reg = cls()
        for verified in accepted:
            reg.add(verified)
        for path, error in refused:
            if isinstance(error, (ExpiredPolicyError, NotYetValidPolicyError)):
                reg._remember_inactive(read_envelope(path), now=now)
                log.info("policy file %s is outside its validity interval", path.name)
        refused_paths = {path for path, _ in refused}
        reg._remember_retired(
            Path(policy_dir), trust, now=now, audience=audience, skip=refused_paths
        )
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
        self._know(key, _Term(verified.epsilon_cap, verified.not_before, verified.expires_at))

    def _remember_retired(
        self,
        folder: Path,
        trust: TrustStore,
        *,
        now: int,
        audience: str | None,
        skip: set[Path],
    ) -> None:
        """Remember as inactive every policy of `folder` that was left out because it
        is retired: a ``*.policy`` file neither accepted nor refused (the ``retired``
        list names it), or a ``*.policy.retired`` file whose signature verifies."""
        for path in sorted(folder.glob("*.policy")):
            if path in skip:
                continue
            env = read_envelope(path)
            msg = policy_pb2.Policy.FromString(env.payload)
            if (msg.policy_id, int(msg.version)) not in self.policies:
                self._remember_inactive(env)  # verified by load_policy_folder
        for path in sorted(folder.glob("*" + _RETIRED_SUFFIX)):
            try:
                env = read_envelope(path)
                verify_policy(env, trust, now=now, audience=audience)
            except (ExpiredPolicyError, NotYetValidPolicyError):
                pass  # the signature verified before the validity interval
            except PolicyError as exc:
                log.info("retired policy file %s not remembered: %s", path.name, exc)
                continue
            self._remember_inactive(env)

    def _remember_inactive(self, env: policy_pb2.SignedEnvelope, *, now: int | None = None) -> None:
        """Remember a verified envelope outside its validity interval (or retired).

        With `now` (not retired) a version whose validity starts after `now` is
        also kept in `upcoming`, for activation to record it ahead.
        """
        # verify_policy checked the signature and the content before the validity
        # interval: the cap parses.
        msg = policy_pb2.Policy.FromString(env.payload)
        key = (msg.policy_id, int(msg.version))
        digest = policy_digest(env.payload)
        self.inactive[key] = digest
        cap = parse_decimal(msg.budget.epsilon_cap)
        self._know(key, _Term(cap, int(msg.not_before), int(msg.expires_at)))
        if now is not None and int(msg.not_before) > now:
            self.upcoming[key] = (
                msg.metric.name,
                PolicyVersion(
                    key[0],
                    key[1],
                    cap,
                    int(msg.budget.window_seconds),
                    int(msg.not_before),
                    int(msg.expires_at),
                    digest,
                ),
            )

    def _know(self, key: tuple[str, int], term: _Term) -> None:
        self.terms.setdefault(key[0], {})[key[1]] = term
        self._charged.clear()

    def enforce_lineage(
        self, ledger: LineageLedger, *, now: int, clock: Callable[[], int] | None = None
    ) -> list[Refusal]:
        """Activate the verified versions against their lineage in `ledger`; the refusals.

        In (policy id, version) order, each version claims its policy id's lineage
        (`Ledger.claim_lineage`: recorded by the first version ever activated on
        this ledger, by any collector). A version whose window length or metric
        name differs from its policy id's, or whose metric name another policy id
        holds, is refused. The others are recorded in the ledger's policy versions
        in one transaction (`Ledger.record_versions`, deciding at `clock()`,
        default `now`), which refuses a version recorded with other contents or
        one that lowers the cap of a window already begun. A refused version is
        removed from the served set and remembered as refused; the other versions
        are served as before. Raises what the ledger raises (nothing is changed in
        this registry then; build a fresh one to retry).
        """
        refusals: list[Refusal] = []
        verdicts: list[tuple[tuple[str, int], str]] = []
        for key in sorted(self.policies):
            p = self.policies[key]
            lineage = ledger.claim_lineage(
                p.policy_id, p.metric_name, p.window_seconds, p.version, now=now
            )
            detail = lineage.refusal(p.policy_id, p.metric_name, p.window_seconds)
            if detail is not None:
                verdicts.append((key, detail))
        lineage_refused = {key for key, _ in verdicts}
        to_record = [
            PolicyVersion(
                p.policy_id,
                p.version,
                p.epsilon_cap,
                p.window_seconds,
                p.not_before,
                p.expires_at,
                p.digest,
            )
            for key, p in sorted(self.policies.items())
            if key not in lineage_refused
        ]
        # A version published ahead of its validity is recorded too (when it fits its
        # policy id's lineage; otherwise its activation refuses it once it is valid),
        # so its cap applies on every collector from its first window.
        for key in sorted(self.upcoming):
            metric_name, upcoming = self.upcoming[key]
            lineage = ledger.claim_lineage(
                key[0], metric_name, upcoming.window_seconds, key[1], now=now
            )
            if lineage.refusal(key[0], metric_name, upcoming.window_seconds) is None:
                to_record.append(upcoming)
        recorded = ledger.record_versions(to_record, clock=clock or (lambda: now))
        verdicts.extend(sorted(recorded.items()))
        for key, detail in verdicts:
            if key in self.policies:
                digest = self.policies.pop(key).digest
            else:  # an upcoming version
                digest = self.inactive.pop(key)
                del self.upcoming[key]
            self.refused[key] = (digest, detail)
            del self.terms[key[0]][key[1]]
            self._charged.clear()
            reason = detail.split(":", 1)[0]
            refusals.append(Refusal(key[0], key[1], reason, detail))
        return refusals

    def cap_in_force(self, policy_id: str, window_start: int, window_seconds: int) -> Decimal:
        """The smallest cap of the known versions of `policy_id` whose validity
        interval meets the window [window_start, window_start + window_seconds).

        Versions refused activation are not known. Raises KeyError for an unknown
        policy id.
        """
        end = window_start + window_seconds
        return min(
            t.epsilon_cap
            for t in self.terms[policy_id].values()
            if t.not_before < end and t.expires_at > window_start
        )

    def charged(self, verified: VerifiedPolicy, *, now: int) -> VerifiedPolicy:
        """`verified` as the ledger charges it at `now`: its `epsilon_cap` lowered to
        `cap_in_force` of its window (the same object when its own cap is that).

        One copy per (policy id, version, window) is kept, so the ledger and the
        service see one object per window (they cache by identity).
        """
        start = verified.window_start(now)
        key = (verified.policy_id, verified.version, start)
        found = self._charged.get(key)
        if found is not None:
            return found
        cap = self.cap_in_force(verified.policy_id, start, verified.window_seconds)
        if cap < verified.epsilon_cap:
            found = dataclasses.replace(verified, epsilon_cap=cap)
        else:
            found = verified
        if len(self._charged) >= _MAX_CHARGED:
            self._charged.clear()
        self._charged[key] = found
        return found

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
        """The policy a report names, as charged at `now` (`charged`), or why it
        cannot be used at `now`."""
        key = (policy_id, version)
        verified = self.policies.get(key)
        if verified is None:
            refused = self.refused.get(key)
            if refused is not None:
                return (Lookup.REFUSED if refused[0] == digest else Lookup.DIGEST_MISMATCH), None
            stale = self.inactive.get(key)
            if stale is None:
                return Lookup.UNKNOWN, None
            return (Lookup.INACTIVE if stale == digest else Lookup.DIGEST_MISMATCH), None
        if verified.digest != digest:
            return Lookup.DIGEST_MISMATCH, None
        if not verified.is_active(now):
            return Lookup.INACTIVE, None
        return Lookup.ACTIVE, self.charged(verified, now=now)

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
