"""Content validation of policies and roots, collecting every problem at once.

`policy_problems` returns the full list of problems of a parsed Policy (empty when
valid); `InvalidPolicyError` carries that list. Validation never raises on the
first problem: an author fixing a policy sees everything wrong in one pass.
Problems name fields and indices, never label contents, so they are safe to log.

Limits (module constants) bound what a device must hold and what a verifier
must hash before acting; they are part of the policy contract.
"""

from __future__ import annotations

import re
from decimal import Decimal

from fedldp.client.decimals import parse_decimal as parse_decimal  # re-exported
from fedldp.client.mechanisms import (
    AttributeSpec,
    Mechanism,
    MetricArg,
    MultiMetric,
    OpenDomain,
    UnknownMechanismError,
    create,
)
from fedldp.client.mechanisms.multi import MAX_ATTRIBUTES, MIN_ATTRIBUTES, MULTI_IDS
from fedldp.client.policy.envelope import domain_digest, key_id_of
from fedldp.v1 import policy_pb2

#: Most labels in a categorical domain.
MAX_DOMAIN_VALUES = 65536
#: Longest label, in UTF-8 bytes.
MAX_LABEL_BYTES = 256
#: Most label bytes in one domain in total.
MAX_DOMAIN_BYTES = 4 * 1024 * 1024
#: Longest policy id / metric name / audience entry, in characters.
MAX_NAME_CHARS = 128
#: Longest purpose text, in characters.
MAX_PURPOSE_CHARS = 4096
#: Longest validity interval of one policy (about five years): a policy is
#: re-signed at least this often, so a device never trusts a stale one for ever.
MAX_VALIDITY_SECONDS = 5 * 366 * 86400
#: Longest budget window (one leap year).
MAX_WINDOW_SECONDS = 366 * 86400
#: Most mechanism parameters.
MAX_PARAMS = 32
#: Most keys in a root (root keys and policy keys each).
MAX_ROOT_KEYS = 64

_POLICY_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_METRIC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
#: An attribute name of a multi-attribute metric (a key of the dict passed to `record`).
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_AUDIENCE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]*")


def _positive_decimal(text: str, field: str, problems: list[str]) -> Decimal | None:
    try:
        value = parse_decimal(text)
    except ValueError as exc:
        problems.append(f"{field} {exc}")
        return None
    if value <= 0:
        problems.append(f"{field} must be positive, got {text!r}")
        return None
    return value


def _check_name(value: str, field: str, pattern: re.Pattern[str], problems: list[str]) -> bool:
    if not value:
        problems.append(f"{field} is empty; set it")
        return False
    if len(value) > MAX_NAME_CHARS or not pattern.fullmatch(value):
        problems.append(
            f"{field} must match {pattern.pattern} and be at most {MAX_NAME_CHARS} characters"
        )
        return False
    return True


def _domain_problems(
    domain: policy_pb2.CategoricalDomain, problems: list[str], where: str = "metric.categorical"
) -> bool:
    values = list(domain.values)
    ok = True
    if len(values) < 2:
        problems.append(f"{where}.values has {len(values)} value(s); a domain needs at least 2")
        ok = False
    if len(values) > MAX_DOMAIN_VALUES:
        problems.append(
            f"{where}.values has {len(values)} values; at most {MAX_DOMAIN_VALUES} are allowed"
        )
        ok = False
    first_index: dict[str, int] = {}
    duplicates: list[str] = []
    empty: list[int] = []
    too_long: list[int] = []
    total = 0
    for index, value in enumerate(values):
        size = len(value.encode("utf-8"))
        total += size
        if size == 0:
            empty.append(index)
        elif size > MAX_LABEL_BYTES:
            too_long.append(index)
        if value in first_index:
            duplicates.append(f"{first_index[value]}={index}")
        else:
            first_index[value] = index
    limit = 10
    if duplicates:
        problems.append(
            f"{where}.values must be unique; equal values at indices "
            + ", ".join(duplicates[:limit])
            + (" ..." if len(duplicates) > limit else "")
        )
        ok = False
    if empty:
        problems.append(
            f"{where}.values must not be empty strings; empty at indices "
            + ", ".join(map(str, empty[:limit]))
        )
        ok = False
    if too_long:
        problems.append(
            f"{where}.values must be at most {MAX_LABEL_BYTES} UTF-8 bytes each; "
            "too long at indices " + ", ".join(map(str, too_long[:limit]))
        )
        ok = False
    if total > MAX_DOMAIN_BYTES:
        problems.append(f"{where}.values total {total} bytes; at most {MAX_DOMAIN_BYTES}")
        ok = False
    if domain.digest != domain_digest(values):
        problems.append(
            f"{where}.digest does not match the values (SHA-256 of length-prefixed "
            "UTF-8 labels, see policy.proto); recompute it with the authoring tool"
        )
        ok = False
    return ok


def _metric_problems(metric: policy_pb2.Metric, problems: list[str]) -> MetricArg | None:
    """Validate the metric; return the mechanism's metric argument when valid."""
    _check_name(metric.name, "metric.name", _METRIC_NAME, problems)
    kind = metric.WhichOneof("kind")
    if kind == "categorical":
        if _domain_problems(metric.categorical, problems):
            return len(metric.categorical.values)
        return None
    if kind == "numeric":
        return _range_problems(metric.numeric, "metric.numeric", problems)
    if kind == "open":
        try:
            return OpenDomain(int(metric.open.max_bytes))
        except ValueError as exc:
            problems.append(f"metric.open.max_bytes: {exc}")
            return None
    if kind == "multi":
        return _multi_problems(metric.multi, problems)
    problems.append(
        "metric has no domain; set a categorical domain, a numeric range or an open domain"
    )
    return None


def metric_argument(policy: policy_pb2.Policy) -> MetricArg | None:
    """The mechanism's metric argument of `policy` (k, (lo, hi), ...), None when invalid.

    For readers that rebuild a policy's mechanism outside `policy_problems` (the
    ledger's retired-rule audit).
    """
    if not policy.HasField("metric"):
        return None
    problems: list[str] = []
    metric = _metric_problems(policy.metric, problems)
    return None if problems else metric


def _range_problems(
    numeric: policy_pb2.NumericRange, where: str, problems: list[str]
) -> tuple[Decimal, Decimal] | None:
    """Validate a numeric range (plain decimals, lo < hi); return (lo, hi) when valid."""
    bounds: list[Decimal] = []
    for name in ("lo", "hi"):
        text = getattr(numeric, name)
        try:
            bounds.append(parse_decimal(text, allow_negative=True))
        except ValueError as exc:
            problems.append(f"{where}.{name} {exc}")
    if len(bounds) == 2:
        if bounds[0] >= bounds[1]:
            problems.append(f"{where}.lo ({numeric.lo}) must be below {where}.hi ({numeric.hi})")
            return None
        return (bounds[0], bounds[1])
    return None


def _unresolved_auto_causes(epsilon: Decimal, metric: MultiMetric) -> list[str]:
    """Why "auto" on a valid multi-attribute metric was left unresolved at authoring:
    the problem each mode reports at `epsilon`, or, when both modes build, that
    their variances cannot be compared at this ε."""
    causes = []
    for mode in MULTI_IDS:
        try:
            create(mode, epsilon, metric, {})
        except (ValueError, TypeError) as exc:
            causes.append(f"mechanism 'auto' cannot become {mode!r}: {exc}")
    if causes:
        return causes
    return [
        f"mechanism 'auto' cannot choose between {' and '.join(MULTI_IDS)} at epsilon "
        f"{epsilon} (their variances cannot be compared); name one of them"
    ]


def _multi_problems(multi: policy_pb2.MultiAttribute, problems: list[str]) -> MultiMetric | None:
    """Validate a multi-attribute metric (2..MAX_ATTRIBUTES attributes, unique names, each
    attribute's domain as a single metric's, its MechanismSpec with an id and params only);
    return its MultiMetric when valid. Whether each attribute's mechanism accepts its
    domain and params is checked when the policy's mechanism is built."""
    attributes = list(multi.attributes)
    ok = MIN_ATTRIBUTES <= len(attributes) <= MAX_ATTRIBUTES
    if not ok:
        problems.append(
            f"metric.multi has {len(attributes)} attribute(s); a multi-attribute metric needs "
            f"{MIN_ATTRIBUTES}..{MAX_ATTRIBUTES}"
        )
        if len(attributes) > MAX_ATTRIBUTES:  # bound the work before looking at any domain
            return None
    specs: list[AttributeSpec] = []
    seen: dict[str, int] = {}
    for index, attribute in enumerate(attributes):
        where = f"metric.multi.attributes[{index}]"
        if not _check_name(attribute.name, f"{where}.name", _ATTRIBUTE_NAME, problems):
            ok = False
        elif attribute.name in seen:
            problems.append(
                f"{where}.name repeats the name of attribute {seen[attribute.name]}; "
                "attribute names must be unique"
            )
            ok = False
        else:
            seen[attribute.name] = index
        spec = _attribute_problems(attribute, where, problems)
        if spec is None:
            ok = False
        else:
            specs.append(spec)
    return MultiMetric(tuple(specs)) if ok else None


def _attribute_problems(
    attribute: policy_pb2.Attribute, where: str, problems: list[str]
) -> AttributeSpec | None:
    kind = attribute.WhichOneof("kind")
    labels: tuple[str, ...] | None = None
    numeric_range: tuple[Decimal, Decimal] | None = None
    ok = True
    if kind == "categorical":
        if _domain_problems(attribute.categorical, problems, f"{where}.categorical"):
            labels = tuple(attribute.categorical.values)
        else:
            ok = False
    elif kind == "numeric":
        numeric_range = _range_problems(attribute.numeric, f"{where}.numeric", problems)
        ok = numeric_range is not None
    else:
        problems.append(f"{where} has no domain; set a categorical domain or a numeric range")
        ok = False
    spec = attribute.mechanism
    if not attribute.HasField("mechanism") or not spec.id:
        problems.append(f"{where}.mechanism.id is empty; set a registered mechanism id")
        ok = False
    elif spec.id == "auto":
        problems.append(
            f"{where}.mechanism.id is 'auto'; resolve it to a concrete mechanism before signing"
        )
        ok = False
    if spec.epsilon:
        problems.append(
            f"{where}.mechanism.epsilon must be empty: it is derived from the policy's "
            "mechanism (multi-split: epsilon / attributes; multi-sample: epsilon)"
        )
        ok = False
    if spec.memo_charging not in (
        policy_pb2.MEMO_CHARGING_UNSPECIFIED,
        policy_pb2.MEMO_CHARGING_NONE,
    ):
        problems.append(f"{where}.mechanism.memo_charging must be none (no memoized attributes)")
        ok = False
    if len(spec.params) > MAX_PARAMS:
        problems.append(f"{where}.mechanism.params has more than {MAX_PARAMS} entries")
        ok = False
    if not ok:
        return None
    return AttributeSpec(
        name=attribute.name,
        labels=labels,
        numeric_range=numeric_range,
        mechanism_id=spec.id,
        params=tuple(sorted(spec.params.items())),
    )


#: The parameter naming a memoized mechanism's permanent-response epsilon (policy.proto).
EPSILON_PERMANENT = "epsilon_permanent"
#: MemoCharging values of a memoized mechanism; both are charged `report_charge`.
MEMOIZED_CHARGING = (policy_pb2.MEMO_CHARGING_JOINT, policy_pb2.MEMO_CHARGING_INSTANTANEOUS)


def permanent_epsilon(spec: policy_pb2.MechanismSpec) -> Decimal | None:
    """The memoized mechanism's permanent epsilon, if the spec has a valid one."""
    text = spec.params.get(EPSILON_PERMANENT)
    if text is None:
        return None
    try:
        value = parse_decimal(text)
    except ValueError:
        return None
    return value if value > 0 else None


def _memo_problems(
    spec: policy_pb2.MechanismSpec, epsilon: Decimal | None, problems: list[str]
) -> None:
    """Memoized charging and the permanent epsilon go together.

    RAPPOR (Erlingsson, Pihur, Korolova, CCS 2014, Section 4): the permanent
    randomized response bounds what any number of reports of one value leak
    (epsilon_permanent), and one report leaks epsilon_1 <= epsilon_permanent, so
    the per-report epsilon may not exceed the permanent one. Both memoized
    values (MEMO_CHARGING_JOINT, and the older MEMO_CHARGING_INSTANTANEOUS) are
    charged the mechanism's `report_charge` (max(ε1, ε_I), memo.py).
    """
    memoized = spec.memo_charging in MEMOIZED_CHARGING
    has_permanent = EPSILON_PERMANENT in spec.params
    if memoized and not has_permanent:
        problems.append(
            f"mechanism.memo_charging is memoized but mechanism.params.{EPSILON_PERMANENT} "
            "is missing; set it, or use memo_charging none"
        )
    if has_permanent and not memoized:
        problems.append(
            f"mechanism.params.{EPSILON_PERMANENT} is set but memo_charging is not "
            "joint; a memoized mechanism must be charged as memoized"
        )
    if has_permanent:
        permanent = _positive_decimal(
            spec.params[EPSILON_PERMANENT], f"mechanism.params.{EPSILON_PERMANENT}", problems
        )
        if permanent is not None and epsilon is not None and epsilon > permanent:
            problems.append(
                f"mechanism.epsilon ({epsilon}) exceeds mechanism.params.{EPSILON_PERMANENT} "
                f"({permanent}); one report cannot leak more than the permanent response"
            )


def policy_problems(
    policy: policy_pb2.Policy,
) -> tuple[list[str], Mechanism | None]:  # type: ignore[type-arg]
    """Every problem of `policy` (empty if valid), and its mechanism when it could be built.

    Checks: ids and names; version >= 1; purpose; audience; the metric (domain
    values unique, non-empty, <= MAX_LABEL_BYTES each, <= MAX_DOMAIN_VALUES, digest
    matches; numeric lo < hi); mechanism id, epsilon (finite, positive, plain
    decimal), parameters (by building the mechanism through the registry, whose
    ValueError becomes a problem), memo charging; budget cap (positive, >= the
    per-report cost) and window (0 < window <= MAX_WINDOW_SECONDS); validity
    interval (0 <= not_before < expires_at, at most MAX_VALIDITY_SECONDS long);
    min_reports_for_release >= 1; a shuffle section's key (32 bytes) and min_batch (>= 2).
    """
    problems: list[str] = []
    _check_name(policy.policy_id, "policy_id", _POLICY_ID, problems)
    if policy.version < 1:
        problems.append("version must be at least 1 (versions start at 1 and only increase)")
    if not policy.purpose.strip():
        problems.append("purpose is empty; say what the data is for (privacy reviewers read it)")
    elif len(policy.purpose) > MAX_PURPOSE_CHARS:
        problems.append(f"purpose is longer than {MAX_PURPOSE_CHARS} characters")
    audience = list(policy.audience)
    if not audience:
        problems.append("audience is empty; name the collector deployment(s) that may accept it")
    for index, entry in enumerate(audience):
        _check_name(entry, f"audience[{index}]", _AUDIENCE, problems)
    if len(set(audience)) != len(audience):
        problems.append("audience entries must be unique")

    metric_arg = _metric_problems(policy.metric, problems) if policy.HasField("metric") else None
    if not policy.HasField("metric"):
        problems.append("metric is missing; set a categorical domain or a numeric range")

    spec = policy.mechanism
    mechanism: Mechanism | None = None  # type: ignore[type-arg]
    epsilon: Decimal | None = None
    if not policy.HasField("mechanism"):
        problems.append("mechanism is missing; set its id and epsilon")
    else:
        if not spec.id:
            problems.append("mechanism.id is empty; set a registered mechanism id")
        elif spec.id == "auto":
            problems.append(
                "mechanism.id is 'auto'; resolve it to a concrete mechanism before signing"
            )
        epsilon = _positive_decimal(spec.epsilon, "mechanism.epsilon", problems)
        if len(spec.params) > MAX_PARAMS:
            problems.append(f"mechanism.params has more than {MAX_PARAMS} entries")
        if spec.memo_charging not in (policy_pb2.MEMO_CHARGING_NONE, *MEMOIZED_CHARGING):
            problems.append(
                "mechanism.memo_charging must be MEMO_CHARGING_NONE, MEMO_CHARGING_JOINT or "
                "MEMO_CHARGING_INSTANTANEOUS"
            )
        _memo_problems(spec, epsilon, problems)
        if spec.id == "auto" and epsilon is not None and isinstance(metric_arg, MultiMetric):
            problems.extend(_unresolved_auto_causes(epsilon, metric_arg))
        if spec.id and spec.id != "auto" and epsilon is not None and metric_arg is not None:
            try:
                mechanism = create(spec.id, epsilon, metric_arg, dict(spec.params))
            except UnknownMechanismError as exc:
                problems.append(f"mechanism.id: {exc.args[0] if exc.args else exc}")
            except (ValueError, TypeError) as exc:
                problems.append(f"mechanism {spec.id!r} parameters are invalid: {exc}")

    budget = policy.budget
    if not policy.HasField("budget"):
        problems.append("budget is missing; set epsilon_cap and window_seconds")
    else:
        cap = _positive_decimal(budget.epsilon_cap, "budget.epsilon_cap", problems)
        per_report = mechanism.report_charge if mechanism is not None else epsilon
        if cap is not None and per_report is not None and cap < per_report:
            problems.append(
                f"budget.epsilon_cap ({budget.epsilon_cap}) is below the per-report cost "
                f"({per_report}); no report could ever be accepted. Raise the cap or lower "
                "mechanism.epsilon"
            )
        if budget.window_seconds <= 0:
            problems.append("budget.window_seconds must be positive")
        elif budget.window_seconds > MAX_WINDOW_SECONDS:
            problems.append(f"budget.window_seconds must be at most {MAX_WINDOW_SECONDS}")

    if policy.not_before < 0:
        problems.append("not_before must be a Unix time >= 0")
    if policy.expires_at <= policy.not_before:
        problems.append("expires_at must be after not_before")
    elif policy.expires_at - policy.not_before > MAX_VALIDITY_SECONDS:
        problems.append(
            f"validity interval is longer than {MAX_VALIDITY_SECONDS} s (about five years); "
            "shorten it and re-sign before it ends"
        )
    if policy.min_reports_for_release < 1:
        problems.append("min_reports_for_release must be at least 1")
    if policy.HasField("shuffle"):
        _shuffle_problems(policy.shuffle, problems)
    return problems, mechanism


def _shuffle_problems(shuffle: policy_pb2.ShuffleSpec, problems: list[str]) -> None:
    """A shuffle section's problems: a 32-byte X25519 key, a minimum batch of at least 2."""
    if len(shuffle.analyzer_public_key) != 32:
        problems.append("shuffle.analyzer_public_key must be a raw 32-byte X25519 public key")
    if shuffle.min_batch < 2:
        problems.append("shuffle.min_batch must be at least 2 (one report is not shuffled)")


def root_problems(root: policy_pb2.Root) -> list[str]:
    """Every structural problem of a Root (empty if valid).

    Each PublicKey's key_id must equal the SHA-256 of its 32 raw bytes, ids are
    unique per role, 1 <= root_threshold <= number of root keys, version >= 1,
    expires_at > 0; policy keys may carry expiries (0 = never).
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    problems: list[str] = []
    if root.version < 1:
        problems.append("root version must be at least 1")
    if root.expires_at <= 0:
        problems.append("root expires_at must be a positive Unix time")
    for role, keys in (("root_keys", root.root_keys), ("policy_keys", root.policy_keys)):
        if not keys:
            problems.append(f"{role} is empty")
        if len(keys) > MAX_ROOT_KEYS:
            problems.append(f"{role} has more than {MAX_ROOT_KEYS} keys")
        seen: set[str] = set()
        for index, key in enumerate(keys):
            try:
                public = Ed25519PublicKey.from_public_bytes(key.ed25519)
            except ValueError:
                problems.append(f"{role}[{index}] is not a raw 32-byte Ed25519 public key")
                continue
            if key.key_id != key_id_of(public):
                problems.append(f"{role}[{index}].key_id does not match the key's SHA-256")
            if key.key_id in seen:
                problems.append(f"{role}[{index}] repeats key id {key.key_id}")
            seen.add(key.key_id)
            if key.expires_at < 0:
                problems.append(f"{role}[{index}].expires_at must be >= 0 (0 = never)")
    if not 1 <= root.root_threshold <= max(1, len(root.root_keys)):
        problems.append(
            f"root_threshold is {root.root_threshold}; it must be between 1 and the number "
            f"of root keys ({len(root.root_keys)})"
        )
    return problems
