"""Multi-attribute policies: the TOML schema, authoring (auto, stated grids) and every
validation problem, each named by field and index without echoing a label."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import pytest
from fedldp.authoring import Authority, policy_from_dict
from fedldp.client.mechanisms import AttributeSpec, MultiMetric
from fedldp.client.mechanisms.auto import choose_frequency_oracle
from fedldp.client.mechanisms.multi import mode_scores, split_epsilon
from fedldp.client.mechanisms.numeric import grid_params
from fedldp.client.policy import InvalidPolicyError, verify_policy
from fedldp.client.policy.validation import policy_problems
from fedldp.v1 import policy_pb2

from tests.client.policy.conftest import DAY, NOW

SECRET_LABEL = "secret-label-do-not-echo"


def document(mechanism: str = "multi-split", epsilon: str = "2") -> dict[str, Any]:
    return {
        "policy_id": "app-profile",
        "version": 1,
        "purpose": "Which OS and language people use, and their session length.",
        "audience": ["prod-eu"],
        "not_before": NOW,
        "expires_at": NOW + 30 * DAY,
        "min_reports_for_release": 10,
        "metric": {
            "name": "app.profile",
            "attributes": [
                {"name": "os", "values": ["android", "ios", SECRET_LABEL], "mechanism": "grr"},
                {"name": "lang", "values": ["en", "de", "fr", "es"], "mechanism": "oue"},
                {"name": "minutes", "lo": "0", "hi": "120", "mechanism": "piecewise"},
            ],
        },
        "mechanism": {"id": mechanism, "epsilon": epsilon},
        "budget": {"epsilon_cap": "8", "window": "1d"},
    }


def problems_of(data: dict[str, Any]) -> list[str]:
    with pytest.raises(InvalidPolicyError) as info:
        policy_from_dict(data)
    assert all(SECRET_LABEL not in p for p in info.value.problems)
    return info.value.problems


def test_toml_schema_builds_a_valid_policy_with_grids_stated_at_the_attribute_epsilon() -> None:
    for mode, share in (
        ("multi-split", split_epsilon(Decimal(2), 3)),
        ("multi-sample", Decimal(2)),
    ):
        policy = policy_from_dict(document(mode))
        assert policy.metric.WhichOneof("kind") == "multi"
        attributes = policy.metric.multi.attributes
        assert [a.name for a in attributes] == ["os", "lang", "minutes"]
        assert all(a.mechanism.epsilon == "" for a in attributes)
        assert dict(attributes[2].mechanism.params) == grid_params("piecewise", share, {})
        problems, mechanism = policy_problems(policy)
        assert problems == [] and mechanism is not None
        assert mechanism.report_charge == Decimal(2)


def test_verified_policy_describes_the_attributes(authority: Authority) -> None:
    policy = policy_from_dict(document())
    envelope = authority.sign(policy)
    verified = verify_policy(envelope, authority.trust_store(now=NOW), now=NOW + 1)
    assert verified.attributes is not None
    assert [a.name for a in verified.attributes] == ["os", "lang", "minutes"]
    assert verified.attributes[0].labels == ("android", "ios", SECRET_LABEL)
    assert verified.attributes[2].numeric_range == (Decimal(0), Decimal(120))
    assert verified.labels is None and verified.numeric_range is None
    assert verified.charge == verified.epsilon == Decimal(2)
    assert verified.attribute_label_index(1, "fr") == 2
    with pytest.raises(ValueError) as info:
        verified.attribute_label_index(0, "nope-value")
    assert "nope-value" not in str(info.value)


@pytest.mark.parametrize("eps", ["0.5", "1", "4", "8"])
def test_auto_is_resolved_to_the_lower_variance_mode(eps: str) -> None:
    data = document("auto", eps)
    data["metric"]["attributes"][1]["mechanism"] = "auto"
    policy = policy_from_dict(data)
    assert policy.mechanism.id in ("multi-split", "multi-sample")
    problems, mechanism = policy_problems(policy)
    assert problems == [] and mechanism is not None
    as_written = MultiMetric(
        (
            AttributeSpec("os", ("android", "ios", SECRET_LABEL), None, "grr"),
            AttributeSpec("lang", ("en", "de", "fr", "es"), None, "auto"),
            AttributeSpec("minutes", None, (Decimal(0), Decimal(120)), "piecewise"),
        )
    )
    assert policy.mechanism.id == mode_scores(as_written, Decimal(eps)).choice
    share = mechanism.attribute_epsilon  # type: ignore[attr-defined]
    assert policy.metric.multi.attributes[1].mechanism.id == choose_frequency_oracle(4, share)


def test_attribute_auto_is_resolved_at_the_modes_epsilon() -> None:
    data = document("multi-split", "3")
    data["metric"]["attributes"][0]["mechanism"] = "auto"
    policy = policy_from_dict(data)
    share = split_epsilon(Decimal(3), 3)
    assert policy.metric.multi.attributes[0].mechanism.id == choose_frequency_oracle(3, share)


def test_numeric_auto_attribute_is_refused() -> None:
    data = document()
    data["metric"]["attributes"][2]["mechanism"] = "auto"
    assert any("attributes[2].mechanism.id is 'auto'" in p for p in problems_of(data))


def edit(change: Any) -> list[str]:
    data = copy.deepcopy(document())
    change(data)
    return problems_of(data)


ATTRS = "metric.multi.attributes"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda d: d["metric"]["attributes"].__delitem__(slice(1, 3)), "needs 2..16"),
        (
            lambda d: d["metric"]["attributes"].extend(
                [{"name": f"a{i}", "values": ["x", "y"], "mechanism": "grr"} for i in range(14)]
            ),
            "has 17 attribute(s)",
        ),
        (lambda d: d["metric"]["attributes"][1].update(name="os"), f"{ATTRS}[1].name repeats"),
        (lambda d: d["metric"]["attributes"][1].update(name="bad name"), f"{ATTRS}[1].name must"),
        (lambda d: d["metric"]["attributes"][1].update(name=""), f"{ATTRS}[1].name is empty"),
        (
            lambda d: d["metric"]["attributes"][0].update(values=["a", SECRET_LABEL, SECRET_LABEL]),
            f"{ATTRS}[0].categorical.values must be unique",
        ),
        (
            lambda d: d["metric"]["attributes"][0].update(values=["only"]),
            f"{ATTRS}[0].categorical.values has 1 value(s)",
        ),
        (
            lambda d: d["metric"]["attributes"][2].update(lo="5", hi="1"),
            f"{ATTRS}[2].numeric.lo (5) must be below",
        ),
        (lambda d: d["metric"]["attributes"][2].update(lo="x"), f"{ATTRS}[2].numeric.lo must"),
        (lambda d: d["metric"]["attributes"][2].update(mechanism=""), f"{ATTRS}[2].mechanism.id"),
        (lambda d: d["metric"]["attributes"][2].update(mechanism="grr"), "categorical metric"),
        (lambda d: d["metric"]["attributes"][0].update(mechanism="piecewise"), "numeric metric"),
        (
            lambda d: d["metric"]["attributes"][0].update(mechanism="nope"),
            "attribute 'os': unknown mechanism",
        ),
        (
            lambda d: d["metric"]["attributes"][0].update(
                mechanism="rappor-grr", params={"epsilon_permanent": "4"}
            ),
            "memoized",
        ),
        (
            lambda d: d["metric"]["attributes"][0].update(mechanism="multi-split"),
            "cannot be nested",
        ),
        (
            lambda d: d["metric"]["attributes"][1].update(params={"g": "5"}),
            "attribute 'lang': oue takes no parameters",
        ),
        (lambda d: d["metric"]["attributes"][0].update(epsilon="1"), "unknown keys ['epsilon']"),
        (lambda d: d["metric"]["attributes"][0].pop("values"), "exactly one of values"),
        (lambda d: d["metric"].update(values=["a", "b"]), "exactly one of values"),
        (lambda d: d["mechanism"].update(id="grr"), "categorical metric"),
        (lambda d: d["mechanism"].update(params={"x": "1"}), "takes no parameters"),
    ],
)
def test_every_problem_is_named(change: Any, expected: str) -> None:
    problems = edit(change)
    assert any(expected in p for p in problems), problems


def test_a_multi_mechanism_on_a_single_metric_is_refused() -> None:
    data = document()
    data["metric"] = {"name": "app.os", "values": ["a", "b"]}
    assert any("multi-attribute metric" in p for p in problems_of(data))


def _valid_proto() -> policy_pb2.Policy:
    return policy_from_dict(document())


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda p: setattr(p.metric.multi.attributes[0].mechanism, "epsilon", "1"),
            f"{ATTRS}[0].mechanism.epsilon must be empty",
        ),
        (
            lambda p: setattr(
                p.metric.multi.attributes[1].mechanism,
                "memo_charging",
                policy_pb2.MEMO_CHARGING_JOINT,
            ),
            f"{ATTRS}[1].mechanism.memo_charging must be none",
        ),
        (lambda p: p.metric.multi.attributes[2].ClearField("numeric"), f"{ATTRS}[2] has no domain"),
        (
            lambda p: setattr(p.metric.multi.attributes[0].categorical, "digest", b"x" * 32),
            f"{ATTRS}[0].categorical.digest does not match",
        ),
    ],
)
def test_proto_level_problems(change: Any, expected: str) -> None:
    policy = _valid_proto()
    change(policy)
    problems, mechanism = policy_problems(policy)
    assert mechanism is None
    assert any(expected in p for p in problems), problems
