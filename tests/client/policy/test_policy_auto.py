"""`auto` is resolved to the least-variance oracle when a policy is authored, never signed."""

from __future__ import annotations

import copy
import importlib
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.authoring import Authority, policy_from_dict
from fedldp.client.mechanisms.auto import choose_frequency_oracle
from fedldp.client.policy import InvalidPolicyError

# tomllib from Python 3.11; the collector extra's backport, tomli, on 3.10.
tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "policies" / "example-policy.toml"


@pytest.mark.parametrize(("k", "epsilon"), [(3, "1"), (64, "0.5"), (4096, "1"), (16, "4")])
def test_authority_resolves_auto(k: int, epsilon: str) -> None:
    now = int(time.time())
    authority = Authority.generate(now=now)
    policy = authority.categorical_policy(
        policy_id="p",
        metric="m",
        labels=[f"v{i}" for i in range(k)],
        epsilon=epsilon,
        epsilon_cap=epsilon,
        window_seconds=86_400,
        now=now,
        mechanism="auto",
    )
    assert policy.mechanism.id == choose_frequency_oracle(k, Decimal(epsilon))
    assert policy.mechanism.id != "auto"
    authority.sign(policy)  # signs the concrete id


def test_toml_auto_is_resolved_and_numeric_auto_is_refused() -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    data["mechanism"]["id"] = "auto"
    policy = policy_from_dict(data)
    k = len(data["metric"]["values"])
    assert policy.mechanism.id == choose_frequency_oracle(k, Decimal("1.0"))

    numeric = copy.deepcopy(data)
    del numeric["metric"]["values"]
    numeric["metric"].update(lo="0", hi="10")
    with pytest.raises(InvalidPolicyError, match="auto"):
        policy_from_dict(numeric)
