"""Shared fixtures: a fixed clock and a fresh authority (keys generated per test)."""

from __future__ import annotations

import pytest
from fedldp.authoring import Authority
from fedldp.client.policy import TrustStore
from fedldp.v1 import policy_pb2

#: A fixed "now" (2026-12-01T00:00:00Z); time is always injected.
NOW = 1_796_083_200
DAY = 86400


@pytest.fixture
def now() -> int:
    return NOW


@pytest.fixture
def authority() -> Authority:
    return Authority.generate(now=NOW)


@pytest.fixture
def trust(authority: Authority) -> TrustStore:
    return authority.trust_store(now=NOW)


@pytest.fixture
def policy(authority: Authority) -> policy_pb2.Policy:
    return authority.categorical_policy(
        policy_id="browser-homepage",
        metric="browser.homepage",
        labels=["news", "search", "social", "video"],
        epsilon="1.5",
        epsilon_cap="6",
        window_seconds=DAY,
        now=NOW,
        audience=["prod-eu"],
    )


@pytest.fixture
def envelope(authority: Authority, policy: policy_pb2.Policy) -> policy_pb2.SignedEnvelope:
    return authority.sign(policy)
