"""Authoring: keys, roots and policies, from a human-writable TOML file to a signed envelope.

The TOML schema (documented with an example in deploy/policies/example-policy.toml
and docs/policies.md) maps one-to-one onto `fedldp.v1.Policy`; `policy_from_dict`
checks types and then runs the same content validation as devices do, listing
every problem at once. Exact quantities are decimal strings ("0.5"): a TOML
float is refused, because it is binary and would be rounded.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from fedldp.client.mechanisms.auto import choose_frequency_oracle
from fedldp.client.mechanisms.numeric import grid_params
from fedldp.client.policy.envelope import (
    POLICY_PAYLOAD_TYPE,
    ROOT_PAYLOAD_TYPE,
    domain_digest,
    key_id_of,
    raw_public_bytes,
    sign_envelope,
)
from fedldp.client.policy.errors import InvalidPolicyError
from fedldp.client.policy.trust import TrustStore
from fedldp.client.policy.validation import (
    EPSILON_PERMANENT,
    parse_decimal,
    policy_problems,
    root_problems,
)
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


_DURATION = re.compile(r"^([1-9][0-9]*)([smhdw])$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": _DAY, "w": 7 * _DAY}
#: memo_charging spellings. "instantaneous" (the older spelling) is written as
#: MEMO_CHARGING_JOINT too: the charge of every memoized policy is the joint rate.
_MEMO = {
    "none": policy_pb2.MEMO_CHARGING_NONE,
    "joint": policy_pb2.MEMO_CHARGING_JOINT,
    "instantaneous": policy_pb2.MEMO_CHARGING_JOINT,
}

_TOP_KEYS = {
    "policy_id",
    "version",
    "purpose",
    "audience",
    "not_before",
    "expires_at",
    "min_reports_for_release",
    "metric",
    "mechanism",
    "budget",
}
_METRIC_KEYS = {"name", "values", "lo", "hi"}
_MECHANISM_KEYS = {"id", "epsilon", "params", "memo_charging"}
_BUDGET_KEYS = {"epsilon_cap", "window_seconds", "window"}


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


# --- the TOML schema ---


def successor_problems(previous: policy_pb2.Policy, policy: policy_pb2.Policy) -> list[str]:
    """Why `policy` cannot be the next version after `previous` (empty: it can).

    Versions of one policy id share one budget per user: spend is keyed by
    (user, policy id, window start) on the device and in the collector's ledger,
    and every version's window starts are aligned to the Unix epoch by its
    window length. So a next version keeps the policy id's metric name and
    window length (collectors and devices refuse one that does not; this is the
    same rule, at signing time) and has a higher version number.
    """
    name = f"policy {policy.policy_id!r} v{policy.version}"
    if policy.policy_id != previous.policy_id:
        return [
            f"{name} does not follow policy {previous.policy_id!r}: the previous version must "
            "be the last signed version of the same policy id"
        ]
    problems = []
    if policy.version <= previous.version:
        problems.append(f"{name} must have a version above the previous version {previous.version}")
    if policy.metric.name != previous.metric.name:
        problems.append(
            f"{name} measures metric {policy.metric.name!r}, the previous version "
            f"{previous.metric.name!r}; a new metric needs a new policy id"
        )
    if policy.budget.window_seconds != previous.budget.window_seconds:
        problems.append(
            f"{name} has a {policy.budget.window_seconds} s budget window, the previous version "
            f"{previous.budget.window_seconds} s; versions of one policy id share one budget, "
            "so the window cannot change (collectors and devices refuse such a version): keep "
            "the window, or collect under a new policy id with a new metric name"
        )
    return problems


def _time(value: object, name: str, problems: list[str]) -> int:
    if isinstance(value, bool):
        problems.append(f"{name} must be a Unix time (integer) or a TOML date-time with offset")
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            problems.append(f"{name} has no UTC offset; write it like 2027-01-01T00:00:00Z")
            return 0
        return int(value.timestamp())
    problems.append(f"{name} must be a Unix time (integer) or a TOML date-time with offset")
    return 0


def _decimal_text(value: object, name: str, problems: list[str]) -> str:
    if isinstance(value, bool):
        problems.append(f'{name} must be a decimal string like "0.5"')
        return ""
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        problems.append(
            f'{name} is a TOML float; write it as a string (e.g. "{value!r}") so it stays exact'
        )
        return ""
    problems.append(f'{name} must be a decimal string like "0.5"')
    return ""


def _int(value: object, name: str, problems: list[str], *, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            problems.append(f"{name} must not be negative")
            return 0
        return value
    problems.append(f"{name} must be an integer")
    return 0


def _str(value: object, name: str, problems: list[str]) -> str:
    if isinstance(value, str):
        return value
    problems.append(f"{name} must be a string")
    return ""


def _table(
    data: Mapping[str, Any], name: str, keys: set[str], problems: list[str]
) -> Mapping[str, Any]:
    value = data.get(name)
    if value is None:
        problems.append(f"[{name}] table is missing")
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{name} must be a table ([{name}])")
        return {}
    unknown = sorted(set(value) - keys)
    if unknown:
        problems.append(f"[{name}] has unknown keys {unknown}; allowed: {sorted(keys)}")
    return value


def parse_duration(text: str) -> int:
    """Seconds in a duration like "30s", "15m", "12h", "1d", "2w". Raises ValueError."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"duration must look like 30s, 15m, 12h, 1d or 2w, got {text!r}")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def policy_from_dict(data: Mapping[str, Any]) -> policy_pb2.Policy:
    """Build a Policy from the TOML schema (a parsed mapping), validated.

    Raises InvalidPolicyError listing every problem (schema and content).
    See docs/policies.md for the schema.
    """
    problems: list[str] = []
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        problems.append(f"unknown top-level keys {unknown}; allowed: {sorted(_TOP_KEYS)}")
    policy = policy_pb2.Policy(
        policy_id=_str(data.get("policy_id", ""), "policy_id", problems),
        version=_int(data.get("version"), "version", problems),
        purpose=_str(data.get("purpose", ""), "purpose", problems),
        min_reports_for_release=_int(
            data.get("min_reports_for_release"), "min_reports_for_release", problems
        ),
    )
    audience = data.get("audience")
    if isinstance(audience, str):
        audience = [audience]
    if not isinstance(audience, list) or not all(isinstance(a, str) for a in audience):
        problems.append('audience must be a list of deployment names, e.g. ["prod-eu"]')
    else:
        policy.audience.extend(audience)
    for name in ("not_before", "expires_at"):
        if name not in data:
            problems.append(f"{name} is missing")
        else:
            setattr(policy, name, _time(data[name], name, problems))

    metric = _table(data, "metric", _METRIC_KEYS, problems)
    if metric:
        policy.metric.name = _str(metric.get("name", ""), "metric.name", problems)
        has_values = "values" in metric
        has_range = "lo" in metric or "hi" in metric
        if has_values == has_range:
            problems.append(
                "[metric] needs either values = [...] (categorical) or lo and hi (numeric)"
            )
        elif has_values:
            values = metric["values"]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                problems.append("metric.values must be a list of strings")
            else:
                policy.metric.categorical.values.extend(values)
                policy.metric.categorical.digest = domain_digest(values)
        else:
            policy.metric.numeric.lo = _decimal_text(metric.get("lo"), "metric.lo", problems)
            policy.metric.numeric.hi = _decimal_text(metric.get("hi"), "metric.hi", problems)

    mechanism = _table(data, "mechanism", _MECHANISM_KEYS, problems)
    if mechanism:
        policy.mechanism.id = _str(mechanism.get("id", ""), "mechanism.id", problems)
        policy.mechanism.epsilon = _decimal_text(
            mechanism.get("epsilon"), "mechanism.epsilon", problems
        )
        params = mechanism.get("params", {})
        if not isinstance(params, Mapping):
            problems.append("mechanism.params must be a table ([mechanism.params])")
        else:
            for key, value in params.items():
                policy.mechanism.params[key] = _decimal_text(
                    value, f"mechanism.params.{key}", problems
                )
        memoized = EPSILON_PERMANENT in policy.mechanism.params
        memo = mechanism.get("memo_charging", "joint" if memoized else "none")
        if memo not in _MEMO:
            problems.append(f"mechanism.memo_charging must be one of {sorted(_MEMO)}")
        else:
            policy.mechanism.memo_charging = _MEMO[memo]

    budget = _table(data, "budget", _BUDGET_KEYS, problems)
    if budget:
        policy.budget.epsilon_cap = _decimal_text(
            budget.get("epsilon_cap"), "budget.epsilon_cap", problems
        )
        if ("window_seconds" in budget) == ("window" in budget):
            problems.append('[budget] needs exactly one of window_seconds = 86400 or window = "1d"')
        elif "window" in budget:
            try:
                policy.budget.window_seconds = parse_duration(
                    _str(budget["window"], "budget.window", problems)
                )
            except ValueError as exc:
                problems.append(f"budget.window: {exc}")
        else:
            policy.budget.window_seconds = _int(
                budget["window_seconds"], "budget.window_seconds", problems
            )

    resolve_auto_mechanism(policy)
    state_numeric_grid(policy)
    content_problems, _ = policy_problems(policy)
    for problem in content_problems:
        if problem not in problems:
            problems.append(problem)
    if problems:
        raise InvalidPolicyError(
            problems, subject=f"policy {policy.policy_id or '?'} v{policy.version}"
        )
    return policy


def _load_toml(path: Path) -> dict[str, Any]:
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"
    try:
        toml = importlib.import_module(name)
    except ModuleNotFoundError as exc:  # pragma: no cover - Python 3.10 without tomli
        raise ModuleNotFoundError(
            "reading TOML on Python 3.10 needs tomli: pip install 'fedldp[cli]'", name=name
        ) from exc
    with path.open("rb") as handle:
        data: dict[str, Any] = toml.load(handle)
    return data


def load_policy_toml(path: str | Path) -> policy_pb2.Policy:
    """Read a policy TOML file and build the validated Policy (see `policy_from_dict`).

    A TOML syntax error is reported as InvalidPolicyError with its line and column.
    """
    path = Path(path)
    try:
        data = _load_toml(path)
    except ValueError as exc:  # tomllib.TOMLDecodeError subclasses ValueError
        raise InvalidPolicyError([f"{path.name} is not valid TOML: {exc}"]) from None
    return policy_from_dict(data)


# --- a one-root-key, one-policy-key authority for demos and tests ---


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
        _raise_problems(policy)
        return policy

    def numeric_policy(
        self, *, lo: str, hi: str, mechanism: str = "piecewise", **fields: Unpack[PolicyFields]
    ) -> policy_pb2.Policy:
        """A validated numeric-range policy valid from `now` (not signed; see `sign`)."""
        policy = self._base_policy(mechanism=mechanism, **fields)
        policy.metric.numeric.lo = lo
        policy.metric.numeric.hi = hi
        state_numeric_grid(policy)
        _raise_problems(policy)
        return policy


def resolve_auto_mechanism(policy: policy_pb2.Policy) -> None:
    """Replace mechanism id "auto" by the least-variance frequency oracle, in place.

    "auto" is resolved when a policy is authored and never signed (DESIGN.md):
    for a categorical metric of k values and a valid per-report ε it becomes
    `fedldp.client.mechanisms.auto.choose_frequency_oracle(k, ε)` with that
    oracle's default parameters. Anything else (numeric metric, bad ε, explicit
    parameters) is left as "auto", which validation then reports as a problem.
    """
    spec = policy.mechanism
    values = policy.metric.categorical.values
    if spec.id != "auto" or spec.params or policy.metric.WhichOneof("kind") != "categorical":
        return
    try:
        epsilon = parse_decimal(spec.epsilon)
        spec.id = choose_frequency_oracle(len(values), epsilon)
    except ValueError:
        return


def state_numeric_grid(policy: policy_pb2.Policy) -> None:
    """Write the grid a numeric mechanism derives ("levels", "cells") into its params, in place.

    piecewise and hybrid randomize onto a grid fixed by the policy
    (`fedldp.client.mechanisms.numeric`); stating it in the signed params means
    every device, collector and aggregator builds the same table even if the
    defaults change later. Parameters already given are kept; invalid input is
    left for validation to report.
    """
    spec = policy.mechanism
    if policy.metric.WhichOneof("kind") != "numeric":
        return
    try:
        epsilon = parse_decimal(spec.epsilon)
    except ValueError:
        return
    stated = grid_params(spec.id, epsilon, dict(spec.params))
    for key, value in stated.items():
        spec.params[key] = value


def _raise_problems(policy: policy_pb2.Policy) -> None:
    problems, _ = policy_problems(policy)
    if problems:
        raise InvalidPolicyError(
            problems, subject=f"policy {policy.policy_id or '?'} v{policy.version}"
        )
