"""Content validation: every problem collected at once, with the field to fix."""

from __future__ import annotations

import copy
import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from fedldp.authoring import Authority, load_policy_toml, policy_from_dict
from fedldp.client.policy import InvalidPolicyError, domain_digest, parse_decimal, policy_problems
from fedldp.client.policy.validation import MAX_DOMAIN_VALUES, MAX_LABEL_BYTES
from fedldp.v1 import policy_pb2

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "deploy" / "policies" / "example-policy.toml"

BASE: dict[str, Any] = {
    "policy_id": "browser-homepage",
    "version": 1,
    "purpose": "start page choice",
    "audience": ["prod-eu"],
    "not_before": 1_796_083_200,
    "expires_at": 1_796_083_200 + 30 * 86400,
    "min_reports_for_release": 100,
    "metric": {"name": "browser.homepage", "values": ["a", "b", "c"]},
    "mechanism": {"id": "grr", "epsilon": "1"},
    "budget": {"epsilon_cap": "4", "window": "1d"},
}


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        target = data
        *path, last = dotted.split("__")
        for part in path:
            target = target[part]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value
    return data


_DELETE = object()


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidPolicyError) as info:
        policy_from_dict(data)
    return info.value.problems


def test_the_base_and_the_example_file_are_valid() -> None:
    policy = policy_from_dict(BASE)
    assert policy.metric.categorical.digest == domain_digest(["a", "b", "c"])
    assert policy.budget.window_seconds == 86400
    assert policy.mechanism.memo_charging == policy_pb2.MEMO_CHARGING_NONE
    example = load_policy_toml(EXAMPLE)
    assert example.policy_id == "browser-homepage"
    assert policy_problems(example)[0] == []


def test_every_problem_is_reported_at_once() -> None:
    data = _with(
        metric__values=["a", "b", "a"],
        mechanism__epsilon="1e-1",
        budget__epsilon_cap="0",
        budget__window="0d",
        expires_at=1,
        audience=[],
    )
    problems = _problems(data)
    text = "\n".join(problems)
    for expected in (
        "unique",
        "mechanism.epsilon",
        "epsilon_cap",
        "window",
        "expires_at",
        "audience",
    ):
        assert expected in text, expected
    assert len(problems) >= 6


def test_duplicate_labels_are_named_by_index_not_content() -> None:
    problems = _problems(_with(metric__values=["secret-x", "b", "secret-x"]))
    assert any("indices 0=2" in p for p in problems)
    assert not any("secret-x" in p for p in problems)


@pytest.mark.parametrize(
    "epsilon", ["0", "-1", "1e-1", "inf", "nan", "Infinity", " 1", "1.", ".5", "01", "", "1_0"]
)
def test_epsilon_must_be_a_finite_positive_plain_decimal(epsilon: str) -> None:
    problems = _problems(_with(mechanism__epsilon=epsilon))
    assert any("mechanism.epsilon" in p for p in problems)


def test_a_toml_float_is_refused() -> None:
    problems = _problems(_with(mechanism__epsilon=0.5))
    assert any("TOML float" in p for p in problems)


def test_cap_below_per_report_cost() -> None:
    problems = _problems(_with(mechanism__epsilon="2", budget__epsilon_cap="1.5"))
    assert any("below the per-report cost" in p for p in problems)
    # Equal is fine: one report per window.
    policy_from_dict(_with(mechanism__epsilon="2", budget__epsilon_cap="2"))


def test_window_must_be_positive() -> None:
    data = _with(budget__window=_DELETE)
    data["budget"]["window_seconds"] = 0
    assert any("window_seconds must be positive" in p for p in _problems(data))


def test_validity_interval_must_be_sane() -> None:
    assert any("after not_before" in p for p in _problems(_with(expires_at=1_796_083_200)))
    too_long = _with(expires_at=1_796_083_200 + 6 * 366 * 86400)
    assert any("longer than" in p for p in _problems(too_long))
    assert any("offset" in p for p in _problems(_with(not_before=datetime.datetime(2026, 12, 1))))


def test_label_size_limits() -> None:
    long_label = "x" * (MAX_LABEL_BYTES + 1)
    assert any(
        "too long at indices 1" in p for p in _problems(_with(metric__values=["a", long_label]))
    )
    # 256 bytes in UTF-8 counts bytes, not characters: 129 two-byte characters is too long.
    assert _problems(_with(metric__values=["a", "é" * 129]))
    policy_from_dict(_with(metric__values=["a", "é" * 128]))
    assert any("at least 2" in p for p in _problems(_with(metric__values=["only"])))
    assert any("empty strings" in p for p in _problems(_with(metric__values=["a", ""])))


def test_domain_size_limit() -> None:
    values = [str(i) for i in range(MAX_DOMAIN_VALUES + 1)]
    assert any(f"at most {MAX_DOMAIN_VALUES}" in p for p in _problems(_with(metric__values=values)))


def test_mechanism_parameters_are_checked_by_the_mechanism() -> None:
    problems = _problems(_with(mechanism__params={"g": "4"}))
    assert any("mechanism 'grr' parameters are invalid" in p for p in problems)
    problems = _problems(_with(mechanism__id="no-such-mechanism"))
    assert any("mechanism.id" in p and "unknown" in p for p in problems)
    # "auto" with explicit parameters cannot be resolved, so it is never signed.
    auto_with_params = _with(mechanism__id="auto", mechanism__params={"g": "5"})
    assert any("resolve it" in p for p in _problems(auto_with_params))


def test_categorical_mechanism_on_numeric_metric() -> None:
    data = _with(metric={"name": "m", "lo": "0", "hi": "10"})
    assert any("grr" in p for p in _problems(data))
    data = _with(metric={"name": "m", "lo": "10", "hi": "-1"})
    assert any("must be below" in p for p in _problems(data))
    data = _with(metric={"name": "m", "values": ["a", "b"], "lo": "0"})
    assert any("exactly one of values" in p for p in _problems(data))


def test_schema_problems_are_listed() -> None:
    data = _with(colour="blue", version="one", mechanism__memo_charging="sometimes")
    problems = _problems(data)
    assert any("unknown top-level keys ['colour']" in p for p in problems)
    assert any(p == "version must be an integer" for p in problems)
    assert any("memo_charging" in p for p in problems)


def test_digest_mismatch_is_a_problem(authority: Authority, now: int) -> None:
    policy = authority.categorical_policy(
        policy_id="p",
        metric="m",
        labels=["a", "b"],
        epsilon="1",
        epsilon_cap="1",
        window_seconds=60,
        now=now,
    )
    policy.metric.categorical.digest = domain_digest(["a", "c"])
    problems, mechanism = policy_problems(policy)
    assert any("digest does not match" in p for p in problems)
    assert mechanism is None


def test_parse_decimal() -> None:
    assert parse_decimal("0.25") == Decimal("0.25")
    assert parse_decimal("-3.5", allow_negative=True) == Decimal("-3.5")
    with pytest.raises(ValueError, match="plain notation"):
        parse_decimal("-3.5")
    with pytest.raises(ValueError):
        parse_decimal("1" * 41)


def test_bad_toml_reports_line(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("policy_id = \n")
    with pytest.raises(InvalidPolicyError, match="not valid TOML"):
        load_policy_toml(path)


def test_memoized_charging_needs_a_permanent_epsilon() -> None:
    problems = _problems(_with(mechanism__memo_charging="instantaneous"))
    assert any("epsilon_permanent is missing" in p for p in problems)
    problems = _problems(
        _with(mechanism__params={"epsilon_permanent": "4"}, mechanism__memo_charging="none")
    )
    assert any("must be charged as memoized" in p for p in problems)
    problems = _problems(
        _with(
            mechanism__memo_charging="instantaneous",
            mechanism__epsilon="2",
            mechanism__params={"epsilon_permanent": "1"},
        )
    )
    assert any("cannot leak more than the permanent" in p for p in problems)


@pytest.mark.parametrize("spelling", [None, "joint", "instantaneous"])
def test_memoized_policies_are_written_with_joint_charging(spelling: str | None) -> None:
    mechanism: dict[str, Any] = {
        "id": "rappor-grr",
        "epsilon": "0.5",
        "params": {"epsilon_permanent": "2"},
    }
    if spelling is not None:
        mechanism["memo_charging"] = spelling
    policy = policy_from_dict(_with(mechanism=mechanism))
    assert policy.mechanism.memo_charging == policy_pb2.MEMO_CHARGING_JOINT
