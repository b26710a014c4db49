"""Policy verification as a pure state machine (python-tuf style).

`verify_policy` takes (envelope bytes, trust store, stored versions, now) and
returns a `VerifiedPolicy` or raises one specific `PolicyError`. Order:

1. payload type is the policy type (PayloadTypeError) and the payload is at most
   MAX_PAYLOAD_BYTES (InvalidPolicyError);
2. a valid Ed25519 signature over PAE(type, exact payload bytes) by a policy key
   the trusted root lists and that has not expired (UnknownKeyError,
   ExpiredKeyError, BadSignatureError) — before the payload is parsed;
3. parse, then validate the content, collecting every problem
   (InvalidPolicyError);
4. validity interval against `now` (NotYetValidPolicyError, ExpiredPolicyError);
5. rollback against the highest version stored per policy id (RollbackError);
6. the device's own epsilon maximum, whatever the signature says
   (EpsilonAboveMaximumError);
7. the collector's audience (AudienceMismatchError).

Nothing is re-serialized: the digest and the signatures are over the bytes as
received.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from fedldp.client.mechanisms import AttributeSpec, Mechanism, OpenDomain
from fedldp.client.policy.envelope import (
    MAX_SIGNATURES,
    POLICY_PAYLOAD_TYPE,
    check_payload_type,
    pae,
    policy_digest,
    verify_signature,
)
from fedldp.client.policy.errors import (
    AudienceMismatchError,
    BadSignatureError,
    EpsilonAboveMaximumError,
    ExpiredKeyError,
    ExpiredPolicyError,
    InvalidPolicyError,
    NotYetValidPolicyError,
    PolicyError,
    RollbackError,
    UnknownKeyError,
)
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.validation import parse_decimal, permanent_epsilon, policy_problems
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError


@dataclass(frozen=True, eq=False)
class VerifiedPolicy:
    """A policy whose signature, content and validity were checked.

    `payload` is the exact signed bytes; `digest` = SHA-256(payload) is the
    policy's identity on the wire. `epsilon` is one report's loss (the
    mechanism's epsilon); `charge` is what the ledger and the device guard
    charge per report (the mechanism's `report_charge`: `epsilon`, or the exact
    joint-loss rate of a memoized mechanism). `key_id` names the key whose signature
    was accepted. Instances compare by identity; treat `envelope` and `message`
    as read-only.
    """

    envelope: policy_pb2.SignedEnvelope
    payload: bytes
    digest: bytes
    message: policy_pb2.Policy
    policy_id: str
    version: int
    metric_name: str
    labels: tuple[str, ...] | None
    numeric_range: tuple[Decimal, Decimal] | None
    epsilon: Decimal
    epsilon_cap: Decimal
    window_seconds: int
    not_before: int
    expires_at: int
    min_reports_for_release: int
    mechanism: Mechanism  # type: ignore[type-arg]
    key_id: str = ""
    #: The open string domain of an open-domain metric (None for other metrics).
    open_domain: OpenDomain | None = None
    #: The attributes of a multi-attribute metric, in policy order (None for other metrics).
    attributes: tuple[AttributeSpec, ...] | None = None
    _label_index: dict[str, int] = field(init=False, repr=False, compare=False)
    _attribute_index: tuple[dict[str, int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "_label_index", {label: i for i, label in enumerate(self.labels or ())}
        )
        object.__setattr__(
            self,
            "_attribute_index",
            tuple(
                {label: i for i, label in enumerate(a.labels or ())} for a in self.attributes or ()
            ),
        )

    @property
    def audience(self) -> tuple[str, ...]:
        """The collector deployments that may accept this policy."""
        return tuple(self.message.audience)

    @property
    def analyzer_public_key(self) -> bytes | None:
        """The analyzer's raw X25519 key of a shuffle-model policy (docs/shuffle.md), or None.

        Set: every report's payload is sealed to this key (`fedldp.client.sealed`), and the
        collector accepts only sealed payloads for the policy.
        """
        if not self.message.HasField("shuffle"):
            return None
        return bytes(self.message.shuffle.analyzer_public_key)

    @property
    def mechanism_id(self) -> str:
        """The mechanism's stable wire id."""
        return str(self.message.mechanism.id)

    @property
    def charge(self) -> Decimal:
        """What every report costs in the ledgers: the mechanism's `report_charge`."""
        return self.mechanism.report_charge

    @property
    def memo_charging(self) -> int:
        """The policy's `fedldp.v1.MemoCharging` value."""
        return int(self.message.mechanism.memo_charging)

    def is_active(self, now: int) -> bool:
        """True when not_before <= now < expires_at."""
        return self.not_before <= now < self.expires_at

    def window_start(self, now: int) -> int:
        """Start of the budget window containing `now` (windows aligned to the Unix epoch)."""
        return now - now % self.window_seconds

    def attribute_label_index(self, attribute: int, label: str) -> int:
        """Index of `label` in categorical attribute `attribute`'s domain (multi-attribute
        metrics). Raises ValueError without echoing the label."""
        if self.attributes is None or self.attributes[attribute].labels is None:
            raise ValueError(f"policy {self.policy_id}: attribute {attribute} is not categorical")
        index = self._attribute_index[attribute].get(label)
        if index is None:
            spec = self.attributes[attribute]
            raise ValueError(
                f"attribute {spec.name!r}: value is not in its domain in policy "
                f"{self.policy_id} v{self.version} ({len(spec.labels or ())} labels); check "
                "the attribute's allowed values"
            )
        return index

    def label_index(self, label: str) -> int:
        """Index of `label` in the categorical domain.

        Raises ValueError (without echoing the label, which may be a user's value)
        if the label is not in the domain or the metric is numeric.
        """
        if self.labels is None:
            raise ValueError(f"policy {self.policy_id} has a numeric metric, not labels")
        index = self._label_index.get(label)
        if index is None:
            raise ValueError(
                f"value is not in the domain of policy {self.policy_id} v{self.version} "
                f"({len(self.labels)} labels); check the metric's allowed values"
            )
        return index


def _verify_signature(envelope: policy_pb2.SignedEnvelope, trust: TrustStore, now: int) -> str:
    """Return the key id of a valid signature by a trusted, unexpired policy key."""
    signatures = list(envelope.signatures)[:MAX_SIGNATURES]
    if not signatures:
        raise BadSignatureError("envelope has no signatures; sign the policy (fedldp policy sign)")
    message = pae(envelope.payload_type, envelope.payload)
    first_error: PolicyError | None = None
    bad_signature = False
    for signature in signatures:
        try:
            key = trust.policy_key(signature.key_id, now=now)
        except (UnknownKeyError, ExpiredKeyError) as exc:
            if first_error is None or isinstance(first_error, UnknownKeyError):
                first_error = exc
            continue
        if not verify_signature(key, signature.sig, message):
            bad_signature = True
            continue
        return str(signature.key_id)
    if bad_signature:
        raise BadSignatureError(
            "signature does not verify over the payload type and payload; the envelope was "
            "altered or signed over other bytes: re-sign the exact payload"
        )
    if first_error is None:  # unreachable: every signature set one of the outcomes
        raise BadSignatureError("no signature could be checked; re-sign the policy")
    raise first_error


#: Most valid policy payloads whose content check is remembered per process.
_CHECKED_POLICIES = 32
#: Largest payload whose content check is remembered.
_CHECKED_MAX_PAYLOAD_BYTES = 64 * 1024
_checked_lock = threading.Lock()
_checked: OrderedDict[bytes, Mechanism] = OrderedDict()  # type: ignore[type-arg]


def _content_check(payload: bytes, policy: policy_pb2.Policy) -> tuple[list[str], Mechanism | None]:  # type: ignore[type-arg]
    """`policy_problems(policy)` for `policy` parsed from the exact bytes `payload`.

    A pure function of those bytes: a valid payload's mechanism is remembered by
    the payload (compared in full, at most `_CHECKED_MAX_PAYLOAD_BYTES`) and
    shared, which is safe because mechanisms are immutable. Payloads with
    problems are checked afresh every time, so their message lists every problem.
    """
    with _checked_lock:
        known = _checked.get(payload)
        if known is not None:
            _checked.move_to_end(payload)
            return [], known
    problems, mechanism = policy_problems(policy)
    if not problems and mechanism is not None and len(payload) <= _CHECKED_MAX_PAYLOAD_BYTES:
        with _checked_lock:
            _checked[payload] = mechanism
            if len(_checked) > _CHECKED_POLICIES:
                _checked.popitem(last=False)
    return problems, mechanism


def _parse_policy(payload: bytes) -> policy_pb2.Policy:
    try:
        return policy_pb2.Policy.FromString(payload)
    except DecodeError as exc:
        raise InvalidPolicyError([f"payload is not a fedldp.v1.Policy message ({exc})"]) from None


def _check_validity(
    name: str, policy: policy_pb2.Policy, now: int, highest_versions: Mapping[str, int] | None
) -> None:
    """NotYetValidPolicyError before not_before, ExpiredPolicyError from expires_at on,
    RollbackError below the highest version already accepted."""
    if now < policy.not_before:
        raise NotYetValidPolicyError(
            f"{name} is valid from {policy.not_before}, now is {now}; wait, or check the "
            "device clock"
        )
    if now >= policy.expires_at:
        raise ExpiredPolicyError(
            f"{name} expired at {policy.expires_at} (now {now}); sign a new version with a "
            "later expires_at"
        )
    if highest_versions is not None:
        highest = highest_versions.get(policy.policy_id)
        if highest is not None and policy.version < highest:
            raise RollbackError(
                f"{name} is older than version {highest} already accepted; deliver version "
                f"{highest} or later (versions only increase)"
            )


def _check_device_limits(
    name: str,
    policy: policy_pb2.Policy,
    mechanism: Mechanism,  # type: ignore[type-arg]
    cap: Decimal,
    max_epsilon: Decimal | None,
    max_epsilon_cap: Decimal | None,
) -> None:
    """EpsilonAboveMaximumError when the per-report charge or the permanent (memoized)
    epsilon exceeds `max_epsilon`, or the window cap exceeds `max_epsilon_cap`."""
    charge = mechanism.report_charge
    if max_epsilon is not None and charge > max_epsilon:
        raise EpsilonAboveMaximumError(
            f"{name} costs epsilon {charge} per report (mechanism.epsilon "
            f"{mechanism.epsilon}), above this device's maximum {max_epsilon}; lower "
            "mechanism.epsilon or raise the device's configured maximum"
        )
    permanent = permanent_epsilon(policy.mechanism)
    if max_epsilon is not None and permanent is not None and permanent > max_epsilon:
        raise EpsilonAboveMaximumError(
            f"{name} asks a permanent (memoized) epsilon of {permanent}, above this device's "
            f"maximum {max_epsilon}; lower mechanism.params.epsilon_permanent or raise the "
            "device's configured maximum"
        )
    if max_epsilon_cap is not None and cap > max_epsilon_cap:
        raise EpsilonAboveMaximumError(
            f"{name} asks an epsilon cap of {cap} per window, above this device's maximum "
            f"{max_epsilon_cap}; lower budget.epsilon_cap or raise the device's maximum"
        )


def verify_policy(
    envelope: policy_pb2.SignedEnvelope,
    trust: TrustStore,
    *,
    now: int,
    highest_versions: Mapping[str, int] | None = None,
    max_epsilon: Decimal | None = None,
    audience: str | None = None,
    max_epsilon_cap: Decimal | None = None,
) -> VerifiedPolicy:
    """Verify a signed policy; a pure function of its arguments (no I/O, no clock).

    `highest_versions` maps policy id -> the highest version already accepted
    (a lower version raises RollbackError; the same version is accepted again).
    `max_epsilon` is the device's own maximum for any one epsilon the policy names
    (the per-report charge, i.e. the real cost of a report, and the permanent
    epsilon of a memoized mechanism) and
    `max_epsilon_cap` its maximum per window: a policy above either is refused
    whatever the signature says. `audience` is the collector deployment name (devices pass None).
    See the module docstring for the order of checks.
    """
    check_payload_type(envelope, POLICY_PAYLOAD_TYPE)
    key_id = _verify_signature(envelope, trust, now)
    payload = bytes(envelope.payload)
    policy = _parse_policy(payload)
    problems, mechanism = _content_check(payload, policy)
    if problems or mechanism is None:
        raise InvalidPolicyError(
            problems or ["mechanism could not be built"],
            subject=f"policy {policy.policy_id or '?'} v{policy.version}",
        )
    name = f"policy {policy.policy_id} v{policy.version}"
    _check_validity(name, policy, now, highest_versions)
    cap = parse_decimal(policy.budget.epsilon_cap)
    _check_device_limits(name, policy, mechanism, cap, max_epsilon, max_epsilon_cap)
    if audience is not None and audience not in policy.audience:
        raise AudienceMismatchError(
            f"{name} is addressed to {list(policy.audience)}, not to deployment {audience!r}; "
            "add it to the policy's audience and re-sign, or deploy it elsewhere"
        )
    metric = policy.metric
    labels: tuple[str, ...] | None = None
    numeric_range: tuple[Decimal, Decimal] | None = None
    open_domain: OpenDomain | None = None
    attributes: tuple[AttributeSpec, ...] | None = None
    kind = metric.WhichOneof("kind")
    if kind == "categorical":
        labels = tuple(metric.categorical.values)
    elif kind == "open":
        open_domain = OpenDomain(int(metric.open.max_bytes))
    elif kind == "multi":
        from fedldp.client.mechanisms.multi import MultiAttribute

        assert isinstance(mechanism, MultiAttribute)  # built over this metric by validation
        attributes = mechanism.attributes
    elif kind == "numeric":
        numeric_range = (
            parse_decimal(metric.numeric.lo, allow_negative=True),
            parse_decimal(metric.numeric.hi, allow_negative=True),
        )
    return VerifiedPolicy(
        envelope=envelope,
        payload=payload,
        digest=policy_digest(payload),
        message=policy,
        policy_id=policy.policy_id,
        version=int(policy.version),
        metric_name=metric.name,
        labels=labels,
        numeric_range=numeric_range,
        epsilon=mechanism.epsilon,
        epsilon_cap=cap,
        window_seconds=int(policy.budget.window_seconds),
        not_before=int(policy.not_before),
        expires_at=int(policy.expires_at),
        min_reports_for_release=int(policy.min_reports_for_release),
        mechanism=mechanism,
        key_id=key_id,
        open_domain=open_domain,
        attributes=attributes,
    )
