"""Every `record()` refusal reason, each from the cause it names (real collector).

NO_POLICY must not be hidden by rejections of *other* metrics' policies: it
says "check the metric name"; POLICY_REJECTED is only for a metric whose own
policy was rejected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from fedldp.client.outbox import OutboxFullError
from fedldp.client.recorder import _memo_adapter
from fedldp.client.sdk import BadValueError, BudgetGuardError, NoPolicyError
from fedldp.v1 import collector_pb2, policy_pb2
from sdk_testkit import LABELS, Deployment, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_no_policy_despite_unrelated_rejections(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()  # browser.homepage, epsilon 1
    deployment.categorical("greedy", metric="app.greedy", epsilon="2", epsilon_cap="4")
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", max_epsilon=Decimal("1")) as c:
        assert [p.policy_id for p in c.policies()] == ["homepage"]
        with pytest.raises(NoPolicyError) as info:
            c.record("browser.homepag", LABELS[0])  # a typo
        assert info.value.reason == "NO_POLICY"
        assert "check the metric name" in str(info.value)
        assert "greedy" not in str(info.value)  # the unrelated rejection is not listed
        assert "1 policies for other or unknown metrics were rejected" in str(info.value)
        assert c.counters()["record_refused_no_policy"] == 1


def test_policy_rejected_only_for_its_own_metric(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    deployment.categorical("greedy", metric="app.greedy", epsilon="2", epsilon_cap="4")
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", max_epsilon=Decimal("1")) as c:
        with pytest.raises(NoPolicyError) as info:
            c.record("app.greedy", LABELS[0])
        assert info.value.reason == "POLICY_REJECTED"
        assert "greedy" in str(info.value) and "above this device's maximum" in str(info.value)
        assert c.record("browser.homepage", LABELS[0]).policy_id == "homepage"


def test_no_policy_when_nothing_was_fetched(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", fetch_policies=False) as c:
        with pytest.raises(NoPolicyError, match="last fetch: never") as info:
            c.record("browser.homepage", LABELS[0])
        assert info.value.reason == "NO_POLICY"
        assert "rejected" not in str(info.value)


def test_policy_inactive(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical()
    collector = deployment.start()
    now = [float(deployment.now)]
    with deployment.client(collector.address, tmp_path / "d", clock=lambda: now[0]) as c:
        (policy,) = c.policies()
        now[0] = float(policy.expires_at + 1)
        with pytest.raises(NoPolicyError, match="is valid from") as info:
            c.record("browser.homepage", LABELS[0])
        assert info.value.reason == "POLICY_INACTIVE"


class PolicyServer:
    """A real gRPC server answering GetPolicies with the given envelopes, nothing else.

    The collector refuses to serve two policies for one metric, so a device can
    only meet that from a deployment that is misconfigured in another way; this
    stands in for it, signed by the real authority.
    """

    def __init__(self, envelopes: list[policy_pb2.SignedEnvelope]) -> None:
        answer = collector_pb2.GetPoliciesResponse(policies=envelopes).SerializeToString()
        handler = grpc.method_handlers_generic_handler(
            "fedldp.v1.Collector",
            {"GetPolicies": grpc.unary_unary_rpc_method_handler(lambda request, context: answer)},
        )
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((handler,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def close(self) -> None:
        self.server.stop(None)


def test_ambiguous_policy(deployment: Deployment, tmp_path: Path) -> None:
    server = PolicyServer([deployment.categorical("a"), deployment.categorical("b")])
    try:
        with deployment.client(f"127.0.0.1:{server.port}", tmp_path / "d") as c:
            with pytest.raises(NoPolicyError, match="pass policy_id=") as info:
                c.record("browser.homepage", LABELS[0])
            assert info.value.reason == "AMBIGUOUS_POLICY"
            assert c.record("browser.homepage", LABELS[0], policy_id="b").policy_id == "b"
    finally:
        server.close()


def test_unsupported_policy(deployment: Deployment, tmp_path: Path) -> None:
    """A policy charged as memoized whose mechanism has no permanent responses here.

    Validation refuses such a policy when it is authored or fetched, so this is
    the SDK's second line: the check `record()` runs on the verified policy.
    """
    deployment.categorical()
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d") as c:
        (policy,) = c.policies()
    message = policy_pb2.Policy()
    message.CopyFrom(policy.message)
    message.mechanism.memo_charging = policy_pb2.MEMO_CHARGING_INSTANTANEOUS
    charged_as_memo = dataclasses.replace(policy, message=message)
    with pytest.raises(NoPolicyError, match="upgrade the SDK") as info:
        _memo_adapter(charged_as_memo)
    assert info.value.reason == "UNSUPPORTED_POLICY"


def test_bad_value_budget_and_outbox_full(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="2")
    collector = deployment.start()
    with deployment.client(collector.address, tmp_path / "d", max_outbox=1) as c:
        with pytest.raises(BadValueError) as bad:
            c.record("browser.homepage", "not-a-label.example")
        assert bad.value.reason == "BAD_VALUE"
        c.record("browser.homepage", LABELS[0])
        with pytest.raises(OutboxFullError) as full:
            c.record("browser.homepage", LABELS[1])
        assert full.value.reason == "OUTBOX_FULL"
        assert c.flush(timeout=10).pending == 0
        c.record("browser.homepage", LABELS[1])
        assert c.flush(timeout=10).pending == 0
        with pytest.raises(BudgetGuardError) as guard:
            c.record("browser.homepage", LABELS[2])
        assert guard.value.reason == "BUDGET_EXHAUSTED"
