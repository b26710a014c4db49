"""Policies from a human-writable TOML file, and the rules a next version must follow.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedldp.client.mechanisms.auto import choose_frequency_oracle, choose_longitudinal
from fedldp.client.mechanisms.base import MAX_OPEN_DOMAIN_BYTES, AttributeSpec, MultiMetric
from fedldp.client.mechanisms.multi import (
    MAX_ATTRIBUTES,
    MIN_ATTRIBUTES,
    MULTI_IDS,
    SPLIT_ID,
    attribute_epsilon,
    mode_scores,
)
from fedldp.client.mechanisms.numeric import grid_params
from fedldp.client.mechanisms.pem import derive_params
from fedldp.client.mechanisms.sketch import sketch_params
from fedldp.client.policy.envelope import domain_digest
from fedldp.client.policy.errors import InvalidPolicyError
from fedldp.client.policy.validation import EPSILON_PERMANENT, parse_decimal, policy_problems
from fedldp.v1 import policy_pb2

_DAY = 86400

_DURATION = re.compile(r"([1-9][0-9]*)([smhdw])")
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
    "shuffle",
}
#: Keys of the optional [shuffle] table (a shuffle-model policy, docs/shuffle.md).
_SHUFFLE_KEYS = {"analyzer_public_key", "min_batch"}
_METRIC_KEYS = {"name", "values", "lo", "hi", "max_bytes", "attributes"}
#: Keys of one [[metric.attributes]] table (a multi-attribute metric).
_ATTRIBUTE_KEYS = {"name", "values", "lo", "hi", "mechanism", "params"}
_MECHANISM_KEYS = {"id", "epsilon", "params", "memo_charging", "sizing"}
_BUDGET_KEYS = {"epsilon_cap", "window_seconds", "window"}


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


def attributes_from_tables(
    tables: object, multi: policy_pb2.MultiAttribute, problems: list[str]
) -> None:
    """[[metric.attributes]] tables -> MultiAttribute (see docs/policies.md)."""
    multi.SetInParent()
    if not isinstance(tables, list) or not all(isinstance(t, Mapping) for t in tables):
        problems.append("metric.attributes must be [[metric.attributes]] tables")
        return
    for index, table in enumerate(tables):
        where = f"metric.attributes[{index}]"
        unknown = sorted(set(table) - _ATTRIBUTE_KEYS)
        if unknown:
            problems.append(
                f"{where} has unknown keys {unknown}; allowed: {sorted(_ATTRIBUTE_KEYS)}"
            )
        attribute = multi.attributes.add()
        attribute.name = _str(table.get("name", ""), f"{where}.name", problems)
        attribute.mechanism.id = _str(table.get("mechanism", ""), f"{where}.mechanism", problems)
        params = table.get("params", {})
        if not isinstance(params, Mapping):
            problems.append(f"{where}.params must be a table")
        else:
            for key, value in params.items():
                attribute.mechanism.params[key] = _decimal_text(
                    value, f"{where}.params.{key}", problems
                )
        has_values = "values" in table
        if has_values == ("lo" in table or "hi" in table):
            problems.append(f"{where} needs exactly one of values = [...] or lo and hi")
        elif has_values:
            values = table["values"]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                problems.append(f"{where}.values must be a list of strings")
            else:
                attribute.categorical.values.extend(values)
                attribute.categorical.digest = domain_digest(values)
        else:
            attribute.numeric.lo = _decimal_text(table.get("lo"), f"{where}.lo", problems)
            attribute.numeric.hi = _decimal_text(table.get("hi"), f"{where}.hi", problems)


def parse_duration(text: str) -> int:
    """Seconds in a duration like "30s", "15m", "12h", "1d", "2w". Raises ValueError."""
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"duration must look like 30s, 15m, 12h, 1d or 2w, got {text!r}")
    return int(match.group(1)) * _DURATION_UNITS[match.group(2)]


def _fill_metric(policy: policy_pb2.Policy, metric: Mapping[str, Any], problems: list[str]) -> None:
    """Set `policy.metric` from the [metric] table: a name and exactly one of categorical
    values (with their domain digest), a numeric [lo, hi], an open domain's max_bytes
    (at most MAX_OPEN_DOMAIN_BYTES) or [[metric.attributes]] tables; each problem is
    appended."""
    policy.metric.name = _str(metric.get("name", ""), "metric.name", problems)
    has_values = "values" in metric
    has_range = "lo" in metric or "hi" in metric
    is_open = "max_bytes" in metric
    is_multi = "attributes" in metric
    if has_values + has_range + is_open + is_multi != 1:
        problems.append(
            "[metric] needs exactly one of values = [...] (categorical), lo and hi "
            "(numeric), max_bytes (an open domain of strings) or [[metric.attributes]] "
            "tables (several attributes)"
        )
    elif is_multi:
        attributes_from_tables(metric["attributes"], policy.metric.multi, problems)
    elif is_open:
        max_bytes = _int(metric["max_bytes"], "metric.max_bytes", problems)
        if max_bytes > MAX_OPEN_DOMAIN_BYTES:
            problems.append(f"metric.max_bytes must be at most {MAX_OPEN_DOMAIN_BYTES}")
        else:
            policy.metric.open.max_bytes = max_bytes
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


def _fill_mechanism(
    policy: policy_pb2.Policy, mechanism: Mapping[str, Any], problems: list[str]
) -> None:
    """Set `policy.mechanism` from the [mechanism] table: id, epsilon, exact-decimal
    params and memo charging (joint by default when memoized); each problem is appended."""
    policy.mechanism.id = _str(mechanism.get("id", ""), "mechanism.id", problems)
    policy.mechanism.epsilon = _decimal_text(
        mechanism.get("epsilon"), "mechanism.epsilon", problems
    )
    params = mechanism.get("params", {})
    if not isinstance(params, Mapping):
        problems.append("mechanism.params must be a table ([mechanism.params])")
    else:
        for key, value in params.items():
            policy.mechanism.params[key] = _decimal_text(value, f"mechanism.params.{key}", problems)
    memoized = EPSILON_PERMANENT in policy.mechanism.params
    memo = mechanism.get("memo_charging", "joint" if memoized else "none")
    if memo not in _MEMO:
        problems.append(f"mechanism.memo_charging must be one of {sorted(_MEMO)}")
    else:
        policy.mechanism.memo_charging = _MEMO[memo]


def _fill_budget(policy: policy_pb2.Policy, budget: Mapping[str, Any], problems: list[str]) -> None:
    """Set `policy.budget` from the [budget] table: the ε cap and exactly one of
    window_seconds or a duration `window`; each problem is appended."""
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


def _fill_shuffle(
    policy: policy_pb2.Policy, shuffle: Mapping[str, Any], problems: list[str]
) -> None:
    """Set `policy.shuffle` from the [shuffle] table: the analyzer's raw X25519 public key
    in hex (the content of analyzer.pub from `fedldp shuffler keygen`) and min_batch."""
    text = _str(shuffle.get("analyzer_public_key", ""), "shuffle.analyzer_public_key", problems)
    try:
        key = bytes.fromhex(text.strip())
    except ValueError:
        problems.append("shuffle.analyzer_public_key is not hex (the content of analyzer.pub)")
        key = b""
    policy.shuffle.analyzer_public_key = key
    policy.shuffle.min_batch = _int(shuffle.get("min_batch"), "shuffle.min_batch", problems)


def policy_from_dict(
    data: Mapping[str, Any], *, notes: list[str] | None = None
) -> policy_pb2.Policy:
    """Build a Policy from the TOML schema (a parsed mapping), validated.

    Raises InvalidPolicyError listing every problem (schema and content).
    See docs/policies.md for the schema. What authoring decided for the author
    (a sketch's `auto` size and why: authoring/sizing.py) is appended to `notes`.
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
        _fill_metric(policy, metric, problems)

    mechanism = _table(data, "mechanism", _MECHANISM_KEYS, problems)
    if mechanism:
        _fill_mechanism(policy, mechanism, problems)

    budget = _table(data, "budget", _BUDGET_KEYS, problems)
    if budget:
        _fill_budget(policy, budget, problems)

    if "shuffle" in data:
        _fill_shuffle(policy, _table(data, "shuffle", _SHUFFLE_KEYS, problems), problems)

    resolve_auto_mechanism(policy)
    state_numeric_grid(policy)
    state_open_params(policy)
    if mechanism and "sizing" in mechanism:
        _auto_size_sketch(policy, mechanism["sizing"], problems, notes)
    state_sketch_params(policy)
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


def load_policy_toml(path: str | Path, *, notes: list[str] | None = None) -> policy_pb2.Policy:
    """Read a policy TOML file and build the validated Policy (see `policy_from_dict`,
    which appends what it decided for the author to `notes`).

    A TOML syntax error is reported as InvalidPolicyError with its line and column.
    """
    path = Path(path)
    try:
        data = _load_toml(path)
    except ValueError as exc:  # tomllib.TOMLDecodeError subclasses ValueError
        raise InvalidPolicyError([f"{path.name} is not valid TOML: {exc}"]) from None
    return policy_from_dict(data, notes=notes)


def _auto_size_sketch(
    policy: policy_pb2.Policy, table: object, problems: list[str], notes: list[str] | None
) -> None:
    """[mechanism.sizing]: choose a cms/hcms sketch's rows and columns (authoring/sizing.py)
    and write them into its params; each problem is appended, the reason to `notes`."""
    from fedldp.authoring.sizing import auto_size, sizing_inputs
    from fedldp.client.mechanisms.base import OpenDomain

    spec = policy.mechanism
    if spec.id not in ("cms", "hcms") or policy.metric.WhichOneof("kind") != "open":
        problems.append("[mechanism.sizing] sizes a cms or hcms sketch of an open-domain metric")
        return
    if "rows" in spec.params or "columns" in spec.params:
        problems.append("give [mechanism.sizing] or params rows/columns, not both")
        return
    if not isinstance(table, Mapping):
        problems.append("mechanism.sizing must be a table ([mechanism.sizing])")
        return
    inputs = sizing_inputs(table, problems)
    try:
        epsilon = parse_decimal(spec.epsilon)
        domain = OpenDomain(int(policy.metric.open.max_bytes))
    except (ValueError, TypeError):
        return  # reported by the content validation
    if inputs is None or epsilon <= 0:
        return
    try:
        size = auto_size(spec.id, epsilon, domain, **inputs)  # type: ignore[arg-type]
    except ValueError as exc:
        problems.append(f"mechanism.sizing: {exc}")
        return
    spec.params["rows"], spec.params["columns"] = str(size.rows), str(size.columns)
    if notes is not None:
        notes.extend(size.explain(spec.id, epsilon))


def resolve_auto_mechanism(policy: policy_pb2.Policy) -> None:
    """Replace mechanism id "auto" by the least-variance frequency oracle, in place.

    "auto" is resolved when a policy is authored and never signed (DESIGN.md):
    for a categorical metric of k values and a valid per-report ε it becomes
    `fedldp.client.mechanisms.auto.choose_frequency_oracle(k, ε)` with that
    oracle's default parameters; with the single param "epsilon_permanent" ε∞,
    `choose_longitudinal(k, ε, ε∞)` (memoized, kept with its ε∞). Anything else
    (numeric metric, bad ε, other parameters) is left as "auto", which validation
    then reports as a problem.
    """
    spec = policy.mechanism
    values = policy.metric.categorical.values
    if policy.metric.WhichOneof("kind") == "multi":
        _resolve_multi(policy)
        return
    longitudinal = set(spec.params) == {EPSILON_PERMANENT}
    if spec.id != "auto" or (spec.params and not longitudinal):
        return
    if policy.metric.WhichOneof("kind") != "categorical":
        return
    try:
        epsilon = parse_decimal(spec.epsilon)
        if longitudinal:  # memoized: least variance per unit of lifetime loss
            permanent = parse_decimal(spec.params[EPSILON_PERMANENT])
            spec.id = choose_longitudinal(len(values), epsilon, permanent)
        else:
            spec.id = choose_frequency_oracle(len(values), epsilon)
    except ValueError:
        return


def _authoring_metric(policy: policy_pb2.Policy) -> MultiMetric | None:
    """The multi-attribute metric with its ids as written ("auto" allowed), or None when
    a domain is not valid yet (validation then reports it)."""
    specs = []
    for attribute in policy.metric.multi.attributes:
        kind = attribute.WhichOneof("kind")
        try:
            if kind == "categorical":
                labels: tuple[str, ...] | None = tuple(attribute.categorical.values)
                bounds = None
            elif kind == "numeric":
                labels = None
                lo = parse_decimal(attribute.numeric.lo, allow_negative=True)
                bounds = (lo, parse_decimal(attribute.numeric.hi, allow_negative=True))
            else:
                return None
        except ValueError:
            return None
        specs.append(
            AttributeSpec(
                attribute.name,
                labels,
                bounds,
                attribute.mechanism.id,
                tuple(sorted(attribute.mechanism.params.items())),
            )
        )
    return MultiMetric(tuple(specs))


def _resolve_multi(policy: policy_pb2.Policy) -> None:
    """ "auto" for a multi-attribute metric: the mode with the lower total variance
    (`multi.mode_scores`), and each attribute's "auto" resolved at that mode's ε;
    with a concrete mode, each attribute's "auto" resolved at the mode's ε."""
    spec = policy.mechanism
    metric = _authoring_metric(policy)
    if metric is None or spec.params:
        return
    if not MIN_ATTRIBUTES <= len(metric.attributes) <= MAX_ATTRIBUTES:
        return  # validation names the attribute count; nothing is built
    try:
        epsilon = parse_decimal(spec.epsilon)
        if spec.id == "auto":
            scores = mode_scores(metric, epsilon)
            spec.id = scores.choice
            ids = scores.split_ids if spec.id == SPLIT_ID else scores.sample_ids
        elif spec.id in MULTI_IDS:
            share = attribute_epsilon(spec.id, epsilon, len(metric.attributes))
            ids = tuple(
                choose_frequency_oracle(len(a.labels), share)
                if a.mechanism_id == "auto" and a.labels is not None and not a.params
                else a.mechanism_id
                for a in metric.attributes
            )
        else:
            return
    except (ValueError, KeyError):
        return  # left as written; validation reports the problem
    for attribute, wire_id in zip(policy.metric.multi.attributes, ids, strict=True):
        attribute.mechanism.id = wire_id


def state_numeric_grid(policy: policy_pb2.Policy) -> None:
    """Write the grid a numeric mechanism derives ("levels", "cells") into its params, in place.

    piecewise, hybrid and sw randomize onto a grid fixed by the policy
    (`fedldp.client.mechanisms.numeric`); stating it in the signed params means
    every device, collector and aggregator builds the same table even if the
    defaults change later. Parameters already given are kept; invalid input is
    left for validation to report.
    """
    spec = policy.mechanism
    kind = policy.metric.WhichOneof("kind")
    if kind == "multi":
        _state_attribute_grids(policy)
        return
    if kind != "numeric":
        return
    try:
        epsilon = parse_decimal(spec.epsilon)
    except ValueError:
        return
    stated = grid_params(spec.id, epsilon, dict(spec.params))
    for key, value in stated.items():
        spec.params[key] = value


def state_sketch_params(policy: policy_pb2.Policy) -> None:
    """Write the sketch size a "cms"/"hcms" mechanism uses ("rows", "columns") into its
    params, in place, so the signed policy states it (`fedldp.client.mechanisms.sketch`).

    Only for open-domain metrics; parameters already given are kept; invalid
    input is left for validation to report.
    """
    if policy.metric.WhichOneof("kind") != "open":
        return
    spec = policy.mechanism
    for key, value in sketch_params(spec.id, dict(spec.params)).items():
        spec.params[key] = value


def _state_attribute_grids(policy: policy_pb2.Policy) -> None:
    """`state_numeric_grid` per numeric attribute, at the ε its mechanism runs at
    (multi-split: ε/d rounded down; multi-sample: ε)."""
    attributes = policy.metric.multi.attributes
    try:
        epsilon = parse_decimal(policy.mechanism.epsilon)
        share = attribute_epsilon(policy.mechanism.id, epsilon, len(attributes))
    except ValueError:
        return
    for attribute in attributes:
        if attribute.WhichOneof("kind") != "numeric":
            continue
        spec = attribute.mechanism
        for key, value in grid_params(spec.id, share, dict(spec.params)).items():
            spec.params[key] = value


def state_open_params(policy: policy_pb2.Policy) -> None:
    """Write the parameters pem derives ("step_bits", "start_bits", "groups", "g") into
    its params, in place, so the signed policy states them (`pem.derive_params`).
    Parameters already given are kept; invalid input is left for validation."""
    spec = policy.mechanism
    if policy.metric.WhichOneof("kind") != "open" or spec.id != "pem":
        return
    try:
        epsilon = parse_decimal(spec.epsilon)
    except ValueError:
        return
    stated = derive_params(int(policy.metric.open.max_bytes), epsilon, dict(spec.params))
    for key, value in stated.items():
        spec.params[key] = value


def require_valid(policy: policy_pb2.Policy) -> None:
    """Raise InvalidPolicyError listing every content problem of `policy` (devices' rules)."""
    problems, _ = policy_problems(policy)
    if problems:
        raise InvalidPolicyError(
            problems, subject=f"policy {policy.policy_id or '?'} v{policy.version}"
        )


__all__ = [
    "attributes_from_tables",
    "load_policy_toml",
    "parse_duration",
    "policy_from_dict",
    "require_valid",
    "resolve_auto_mechanism",
    "state_numeric_grid",
    "state_open_params",
    "state_sketch_params",
    "successor_problems",
]
