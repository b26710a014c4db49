"""The device's own budget guard: refuses at the policy cap whatever the collector would accept."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from fedldp.client.policy import policy_digest
from fedldp.client.sdk import BudgetGuardError, RecordRefusedError
from fedldp.client.transport import Credentials, Transport
from fedldp.v1 import collector_pb2
from sdk_testkit import LABELS, Deployment, ledger_rows, running_deployment


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with running_deployment(tmp_path) as d:
        yield d


def test_refuses_at_cap_while_a_fresh_collector_would_accept(
    deployment: Deployment, tmp_path: Path
) -> None:
    envelope = deployment.categorical(epsilon="1", epsilon_cap="3")
    first = deployment.start(name="first")
    with deployment.client(first.address, tmp_path / "d") as c:
        for label in LABELS[:3]:
            c.record("browser.homepage", label)
        with pytest.raises(BudgetGuardError, match="spent 3 of its epsilon cap 3") as info:
            c.record("browser.homepage", LABELS[3])
        assert info.value.reason == "BUDGET_EXHAUSTED"
        assert c.pending() == 3  # nothing randomized or stored for the refused value
        assert c.flush(timeout=10).acknowledged == 3
    assert len(ledger_rows(first)) == 3

    # A second collector with an empty ledger (lost state, or a collector that does not
    # enforce): its cap is untouched and it would accept this subject's reports.
    second = deployment.start(name="second")
    token = deployment.token("device-1")
    transport = Transport(second.address, Credentials.insecure_bearer(token))
    try:
        (budget,) = transport.get_budget("homepage").budgets
        assert Decimal(budget.epsilon_remaining) == Decimal(3)
        now = int(time.time())
        probe = collector_pb2.Report(
            report_id=secrets.token_bytes(16),
            policy_id="homepage",
            policy_version=1,
            policy_digest=policy_digest(envelope.payload),
            coarse_time=now - now % 3600,
        )
        probe.category.index = 0
        (outcome,) = transport.submit_raw([probe.SerializeToString()]).outcomes
        assert outcome.outcome == collector_pb2.OUTCOME_ACCEPTED
    finally:
        transport.close()

    # The device, restarted and pointed at that collector, still refuses: its own
    # ledger survived the restart.
    with deployment.client(second.address, tmp_path / "d") as c:
        with pytest.raises(BudgetGuardError):
            c.record("browser.homepage", LABELS[0])
        (status,) = c.budget()
        assert (status.epsilon_spent, status.epsilon_remaining) == (Decimal(3), Decimal(0))
        assert c.counters()["record_refused_budget_exhausted"] == 2
        assert c.pending() == 0
    assert len(ledger_rows(second)) == 1  # only the probe


def test_concurrent_records_never_pass_the_cap(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="0.1", epsilon_cap="0.5")
    collector = deployment.start()
    ok: list[Decimal] = []
    refused: list[str] = []
    clients = [deployment.client(collector.address, tmp_path / "shared") for _ in range(2)]

    def worker(i: int) -> None:
        for _ in range(3):
            try:
                ok.append(clients[i % 2].record("browser.homepage", LABELS[i % 4]).epsilon_spent)
            except RecordRefusedError as exc:
                refused.append(exc.reason)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Exact decimals: five reports of 0.1 fit a cap of 0.5, never a sixth.
    assert sorted(ok) == [
        Decimal("0.1"),
        Decimal("0.2"),
        Decimal("0.3"),
        Decimal("0.4"),
        Decimal("0.5"),
    ]
    assert refused == ["BUDGET_EXHAUSTED"] * 13
    assert clients[0].pending() == 5
    for c in clients:
        c.close()


def test_next_window_reopens_the_budget(deployment: Deployment, tmp_path: Path) -> None:
    deployment.categorical(epsilon="1", epsilon_cap="1", window_seconds=3600)
    collector = deployment.start()
    now = [float(int(time.time()))]
    with deployment.client(collector.address, tmp_path / "d", clock=lambda: now[0]) as c:
        first = c.record("browser.homepage", LABELS[0])
        with pytest.raises(BudgetGuardError, match="Recording resumes at"):
            c.record("browser.homepage", LABELS[0])
        now[0] = first.window_start + 3600
        second = c.record("browser.homepage", LABELS[0])
        assert second.window_start == first.window_start + 3600
        assert second.epsilon_spent == Decimal(1)


def test_memoized_policy_guard_and_collector_refuse_at_the_same_report(
    deployment: Deployment, tmp_path: Path
) -> None:
    # rappor-grr, k = 64, ε1 = 0.5, ε∞ = 2: every report costs ε_I = 2.192184 on the
    # device and in the collector's ledger, so a cap of 9 holds floor(9 / ε_I) = 4.
    labels = [f"site{i}.example" for i in range(64)]
    policy = deployment.authority.categorical_policy(
        policy_id="memo",
        metric="browser.homepage",
        labels=labels,
        epsilon="0.5",
        epsilon_cap="9",
        window_seconds=86400,
        now=deployment.now - 60,
        min_reports=1,
        audience=("default",),
        mechanism="rappor-grr",
        params={"epsilon_permanent": "2"},
    )
    envelope = deployment.authority.sign(policy)
    deployment.envelopes.append(envelope)
    collector = deployment.start()
    charge, spent = Decimal("2.192184"), Decimal("8.768736")
    with deployment.client(collector.address, tmp_path / "d") as c:
        results = [c.record("browser.homepage", labels[i % 2]) for i in range(4)]
        assert [r.epsilon_charged for r in results] == [charge] * 4
        with pytest.raises(BudgetGuardError, match=r"one more report costs 2\.192184"):
            c.record("browser.homepage", labels[0])
        (status,) = c.budget()
        assert (status.epsilon_per_report, status.epsilon_spent) == (charge, spent)
        assert c.flush(timeout=10).acknowledged == 4
    window = int(time.time()) - int(time.time()) % 86400
    assert collector.ledger.spent("device-1", "memo", window) == spent
    assert collector.ledger.reconcile() == []

    # The collector agrees: GetBudget shows the same spend, and a fifth report sent
    # around the device's guard is refused there too.
    transport = Transport(collector.address, Credentials.insecure_bearer(deployment.token()))
    try:
        (budget,) = transport.get_budget("memo").budgets
        assert (budget.epsilon_spent, budget.epsilon_remaining) == (str(spent), "0.231264")
        assert budget.charge_per_report == str(charge)
        now = int(time.time())
        probe = collector_pb2.Report(
            report_id=secrets.token_bytes(16),
            policy_id="memo",
            policy_version=1,
            policy_digest=policy_digest(envelope.payload),
            coarse_time=now - now % 3600,
        )
        probe.category.index = 0
        (outcome,) = transport.submit_raw([probe.SerializeToString()]).outcomes
        assert outcome.outcome == collector_pb2.OUTCOME_BUDGET_EXHAUSTED
    finally:
        transport.close()
