"""One budget per (subject, metric) across policy versions (DESIGN.md, "Ledger").

Spend is keyed by (subject, policy id, window start). A version that changed its
policy id's window would charge other windows than its predecessor (v1 daily and
v2 hourly, both active, gave one subject 2 + 2 in one hour), so activation
refuses it; versions in force at once share the smallest cap. Everything runs
through the real collector (gRPC on port 0) on a SQLite file and on PostgreSQL.
Each property is also shown to fail on a deliberately broken collector (the
lineage check or the min-cap rule switched off), kept here as a test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector import server as server_module
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import Ledger, PolicyLineage, open_ledger
from fedldp.collector.ledger.schema import policy_lineage, reports
from fedldp.collector.policies import Lookup, PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc, policy_pb2

HOUR = 3600
DAY = 86400


class Clock:
    """A settable collector clock (Unix seconds)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def start() -> Iterator[Callable[..., RunningCollector]]:
    """Start collectors (stopped afterwards): start(deployment, ledger_url, clock, ...)."""
    running: list[RunningCollector] = []

    def _start(
        deployment: Deployment,
        ledger_url: str,
        clock: Clock,
        envelopes: list[policy_pb2.SignedEnvelope] | None = None,
        **config: Any,
    ) -> RunningCollector:
        registry = PolicyRegistry.from_envelopes(
            deployment.envelopes if envelopes is None else envelopes,
            deployment.trust(),
            now=clock(),
            audience=deployment.audience,
        )
        collector = start_collector(
            deployment.config(ledger_url, **config), registry=registry, clock=clock
        )
        running.append(collector)
        return collector

    yield _start
    for collector in running:
        collector.stop(1.0)


def _submit(
    collector: RunningCollector,
    deployment: Deployment,
    subject: str,
    policy: VerifiedPolicy,
    count: int,
) -> list[pb.ReportOutcome]:
    """`count` fresh reports of `subject` under `policy` at the collector's now."""
    at = coarse(collector.clock())
    request = pb.SubmitRequest(
        reports=[make_report(policy, CategoryOutput(i % 4), coarse_time=at) for i in range(count)]
    )
    with grpc.insecure_channel(collector.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        auth = bearer_metadata(deployment.token(subject, ttl=30 * DAY))
        return list(stub.Submit(request, metadata=auth).outcomes)


def _served(collector: RunningCollector, deployment: Deployment) -> list[tuple[str, int]]:
    """(policy id, version) of every envelope GetPolicies serves."""
    auth = bearer_metadata(deployment.token("alice", ttl=30 * DAY))
    with grpc.insecure_channel(collector.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        response = stub.GetPolicies(pb.GetPoliciesRequest(), metadata=auth)
    out = []
    for env in response.policies:
        msg = policy_pb2.Policy.FromString(env.payload)
        out.append((msg.policy_id, int(msg.version)))
    return sorted(out)


def _max_spend_in_any(ledger: Ledger, subject: str, seconds: int) -> Decimal:
    """The most ε `subject` was charged (raw report rows, all policies and versions)
    within any `seconds`-long interval [t, t + seconds) of receipt times."""
    rows = ledger.transaction(
        lambda conn: conn.execute(
            sa.select(reports.c.received_at, reports.c.charge).where(reports.c.subject == subject)
        ).all(),
        write=False,
    )
    times = sorted((int(t), Decimal(c)) for t, c in rows)
    return max(
        (sum((c for u, c in times if t <= u < t + seconds), Decimal(0)) for t, _ in times),
        default=Decimal(0),
    )


def _refusals(collector: RunningCollector, reason: str) -> float:
    value = collector.metrics.registry.get_sample_value(
        "fedldp_collector_policy_refusals_total", {"reason": reason}
    )
    return 0.0 if value is None else value


def _deployment(clock: Clock) -> Deployment:
    return Deployment.create(now=clock())


# --- the ledger's lineage table ----------------------------------------------------------


def test_claim_lineage_records_once_and_says_what_breaks_it(ledger: Ledger) -> None:
    first = ledger.claim_lineage("web", "metric.web", DAY, 1, now=100)
    assert first == PolicyLineage("web", "metric.web", DAY, 1, 100)
    assert first.refusal("web", "metric.web", DAY) is None
    # A later version with the same window and metric: the recorded row, unchanged.
    assert ledger.claim_lineage("web", "metric.web", DAY, 2, now=200) == first
    hourly = ledger.claim_lineage("web", "metric.web", HOUR, 3, now=300)
    assert hourly == first
    assert (hourly.refusal("web", "metric.web", HOUR) or "").startswith("window_changed: ")
    renamed = ledger.claim_lineage("web", "metric.other", DAY, 4, now=400)
    assert (renamed.refusal("web", "metric.other", DAY) or "").startswith("metric_changed: ")
    # A second policy id for a recorded metric name gets the owner's lineage.
    other = ledger.claim_lineage("web2", "metric.web", DAY, 1, now=500)
    assert other == first
    assert (other.refusal("web2", "metric.web", DAY) or "").startswith("metric_taken: ")
    assert ledger.lineages() == [first]
    with pytest.raises(ValueError, match="window_seconds must be positive"):
        ledger.claim_lineage("x", "metric.x", 0, 1, now=1)
    assert ledger.lineages() == [first]


def test_migrated_lineage_table_matches_schema(ledger: Ledger) -> None:
    engine = sa.create_engine(ledger.url)
    try:
        inspector = sa.inspect(engine)
        columns = {c["name"] for c in inspector.get_columns("policy_lineage")}
        uniques = [u["column_names"] for u in inspector.get_unique_constraints("policy_lineage")]
        primary = inspector.get_pk_constraint("policy_lineage")["constrained_columns"]
    finally:
        engine.dispose()
    assert columns == {c.name for c in policy_lineage.columns}
    assert uniques == [["metric_name"]]
    assert primary == ["policy_id"]


@pytest.mark.parametrize("isolation", ["READ COMMITTED", "SERIALIZABLE"])
def test_concurrent_claims_agree_on_one_window(postgresql_url: str, isolation: str) -> None:
    """Eight ledgers (eight collectors) on one PostgreSQL database claim one metric with
    two policy ids and two windows at once: one lineage is recorded, every claim reads it."""
    ledgers = [open_ledger(postgresql_url, shard=f"s{i}", isolation=isolation) for i in range(8)]
    barrier = threading.Barrier(len(ledgers))
    results: list[PolicyLineage | BaseException] = [ValueError("not run")] * len(ledgers)

    def claim(i: int) -> None:
        barrier.wait()
        try:
            window = DAY if i % 2 else HOUR
            policy_id = "race" if i % 3 else "race-twin"  # two ids claiming one metric
            results[i] = ledgers[i].claim_lineage(policy_id, "metric.race", window, i, now=i)
        except BaseException as exc:  # reported below
            results[i] = exc

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(ledgers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        (recorded,) = ledgers[0].lineages()
        assert all(r == recorded for r in results), results
        assert recorded.window_seconds in (DAY, HOUR)
    finally:
        for led in ledgers:
            led.close()


# --- the rollout case: v1 daily cap 2, v2 hourly cap 2 -----------------------------------


def _rollout(clock: Clock) -> tuple[Deployment, VerifiedPolicy, VerifiedPolicy]:
    d = _deployment(clock)
    v1 = d.verified(d.add_categorical("web", window_seconds=DAY, epsilon_cap="2", version=1))
    v2 = d.verified(d.add_categorical("web", window_seconds=HOUR, epsilon_cap="2", version=2))
    return d, v1, v2


def _drive_rollout(
    collector: RunningCollector,
    d: Deployment,
    clock: Clock,
    v1: VerifiedPolicy,
    v2: VerifiedPolicy,
) -> list[list[pb.ReportOutcome]]:
    """Five hours of one day: each hour, 8 reports (ε 0.5 each) under v1 and under v2."""
    out = []
    for _ in range(5):
        out.append(_submit(collector, d, "alice", v1, 8) + _submit(collector, d, "alice", v2, 8))
        clock.now += HOUR
    return out


def test_rollout_with_a_window_change_never_exceeds_two_in_any_hour(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(86400 * 20000 + 2 * HOUR)  # 02:00, so five hours stay in one day
    d, v1, v2 = _rollout(clock)
    collector = start(d, ledger_url, clock)
    assert _served(collector, d) == [("web", 1)]  # v2 refused activation, v1 still served
    assert _refusals(collector, "window_changed") == 1
    assert collector.registry.lookup("web", 2, v2.digest, now=clock())[0] is Lookup.REFUSED
    hours = _drive_rollout(collector, d, clock, v1, v2)
    first = hours[0]
    assert [o.outcome for o in first[:8]] == [pb.OUTCOME_ACCEPTED] * 4 + [
        pb.OUTCOME_BUDGET_EXHAUSTED
    ] * 4
    assert {o.outcome for o in first[8:]} == {pb.OUTCOME_UNKNOWN_POLICY}
    assert "refused activation" in first[8].detail
    for later in hours[1:]:  # the day's cap is spent: nothing more, under either version
        assert {o.outcome for o in later[:8]} == {pb.OUTCOME_BUDGET_EXHAUSTED}
        assert {o.outcome for o in later[8:]} == {pb.OUTCOME_UNKNOWN_POLICY}
    assert _max_spend_in_any(collector.ledger, "alice", HOUR) == Decimal(2)
    assert _max_spend_in_any(collector.ledger, "alice", DAY) == Decimal(2)
    assert collector.ledger.reconcile() == []
    (recorded,) = collector.ledger.lineages()
    assert (recorded.policy_id, recorded.window_seconds, recorded.first_version) == ("web", DAY, 1)


def test_broken_variant_without_the_lineage_check_spends_four_in_an_hour(
    sqlite_url: str, start: Callable[..., RunningCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the lineage check prevents: with activation switched off, one subject
    spends 2 + 2 in one hour and reconcile stays clean (the defect as reported)."""
    monkeypatch.setattr(server_module, "activate", lambda *args, **kwargs: None)
    clock = Clock(86400 * 20000 + 2 * HOUR)
    d, v1, v2 = _rollout(clock)
    collector = start(d, sqlite_url, clock)
    assert _served(collector, d) == [("web", 1), ("web", 2)]
    _drive_rollout(collector, d, clock, v1, v2)
    assert _max_spend_in_any(collector.ledger, "alice", HOUR) == Decimal(4)
    assert collector.ledger.reconcile() == []  # why reconcile alone could not catch it
    # Once the policy id's lineage is recorded, reconcile flags the hourly spend row.
    collector.ledger.claim_lineage("web", v1.metric_name, DAY, 1, now=clock.now)
    hours = [v2.window_start(clock.now - k * HOUR) for k in range(5, 0, -1)]
    assert [(m.kind, m.subject, m.scope) for m in collector.ledger.reconcile()] == [
        ("window", "alice", f"policy=web window={start}") for start in hours
    ]


# --- sequential versions, restarts, reloads and two collectors -----------------------------


def test_sequential_window_change_is_refused_and_stays_refused_after_restarts(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(86400 * 20000 + 10 * HOUR)
    d = _deployment(clock)
    v1_env = d.add_categorical("web", window_seconds=DAY, version=1, lifetime_seconds=HOUR)
    v1 = d.verified(v1_env)
    first = start(d, ledger_url, clock, [v1_env])
    assert [o.outcome for o in _submit(first, d, "alice", v1, 4)] == [pb.OUTCOME_ACCEPTED] * 4
    first.stop(1.0)
    # v1 retired; v2 is hourly from 10:30: 2 (v1) + 2 (v2) in 10:00-11:00 if it were let in.
    clock.now += HOUR // 2
    v2_env = d.add_categorical(
        "web", window_seconds=HOUR, version=2, not_before=clock.now, epsilon_cap="2"
    )
    v2 = d.verified(v2_env, now=clock.now)
    for _ in range(2):  # a restart reads the recorded lineage again
        again = start(d, ledger_url, clock, [v2_env])
        assert _served(again, d) == []
        assert _refusals(again, "window_changed") == 1
        assert {o.outcome for o in _submit(again, d, "alice", v2, 4)} == {pb.OUTCOME_UNKNOWN_POLICY}
        assert again.ledger.reconcile() == []
        again.stop(1.0)
    ledger = open_ledger(ledger_url)
    try:
        assert _max_spend_in_any(ledger, "alice", HOUR) == Decimal(2)
        assert [(r.policy_id, r.window_seconds) for r in ledger.lineages()] == [("web", DAY)]
    finally:
        ledger.close()


def test_reload_refuses_a_window_change_and_keeps_serving_the_rest(
    ledger_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock(86400 * 20000 + 10 * HOUR)
    d = _deployment(clock)
    v1 = d.verified(d.add_categorical("web", window_seconds=DAY, version=1))
    trust_dir, policy_dir = d.write_folders(tmp_path)
    config = d.config(ledger_url, trust_dir=str(trust_dir), policy_dir=str(policy_dir))
    collector = start_collector(config, clock=clock)
    try:
        assert _served(collector, d) == [("web", 1)]
        v2 = d.verified(d.add_categorical("web", window_seconds=HOUR, version=2))
        d.write_folders(tmp_path)
        registry = collector.reload_policies()
        assert sorted(registry.policies) == [("web", 1)]
        assert registry.refused[("web", 2)][1].startswith("window_changed: ")
        assert _served(collector, d) == [("web", 1)]
        assert _refusals(collector, "window_changed") == 1
        (line,) = [
            r for r in caplog.records if r.getMessage() == "policy version refused activation"
        ]
        fields = line.fields  # type: ignore[attr-defined]
        assert (line.levelname, fields["policy_id"], fields["version"]) == ("ERROR", "web", 2)
        assert fields["reason"] == "window_changed" and "new policy id" in fields["detail"]
        outcomes = _submit(collector, d, "alice", v2, 1) + _submit(collector, d, "alice", v1, 1)
        assert [o.outcome for o in outcomes] == [pb.OUTCOME_UNKNOWN_POLICY, pb.OUTCOME_ACCEPTED]
    finally:
        collector.stop(1.0)


def test_a_second_policy_id_for_a_recorded_metric_is_refused(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(86400 * 20000)
    d = _deployment(clock)
    d.add_categorical("web", window_seconds=DAY)
    d.add_categorical("web-twin", metric="metric.web")  # the metric of policy "web"
    collector = start(d, ledger_url, clock)
    assert _served(collector, d) == [("web", 1)]
    assert _refusals(collector, "metric_taken") == 1
    assert collector.registry.refused[("web-twin", 1)][1].startswith("metric_taken: ")


def test_two_collectors_racing_on_one_postgresql_ledger_record_one_window(
    postgresql_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(86400 * 20000)
    d = _deployment(clock)
    daily = d.add_categorical("web", window_seconds=DAY, version=1)
    hourly = d.add_categorical("web", window_seconds=HOUR, version=2)
    barrier = threading.Barrier(2)
    started: dict[str, RunningCollector] = {}
    errors: list[BaseException] = []

    def run(name: str, env: policy_pb2.SignedEnvelope) -> None:
        barrier.wait()
        try:
            started[name] = start(d, postgresql_url, clock, [env], instance_id=name)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=("a", daily)),
        threading.Thread(target=run, args=("b", hourly)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    (recorded,) = started["a"].ledger.lineages()
    winner = "a" if recorded.window_seconds == DAY else "b"
    loser = "b" if winner == "a" else "a"
    assert _served(started[winner], d) == [("web", 1 if winner == "a" else 2)]
    assert _served(started[loser], d) == []
    assert _refusals(started[loser], "window_changed") == 1


# --- the smallest cap of the versions in force ------------------------------------------


def _caps(clock: Clock) -> tuple[Deployment, VerifiedPolicy, VerifiedPolicy]:
    d = _deployment(clock)
    v1 = d.verified(d.add_categorical("web", epsilon="0.5", epsilon_cap="4", version=1))
    v2 = d.verified(d.add_categorical("web", epsilon="0.5", epsilon_cap="2", version=2))
    return d, v1, v2


def test_versions_in_force_together_share_the_smallest_cap(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(86400 * 20000)
    d, v1, _v2 = _caps(clock)
    collector = start(d, ledger_url, clock)
    outcomes = _submit(collector, d, "alice", v1, 8)  # only ever under v1 (cap 4)
    assert [o.outcome for o in outcomes] == [pb.OUTCOME_ACCEPTED] * 4 + [
        pb.OUTCOME_BUDGET_EXHAUSTED
    ] * 4
    assert collector.ledger.spent("alice", "web", v1.window_start(clock.now)) == Decimal(2)
    with grpc.insecure_channel(collector.address) as channel:
        budgets = (
            collector_pb2_grpc.CollectorStub(channel)
            .GetBudget(pb.GetBudgetRequest(), metadata=bearer_metadata(d.token("alice")))
            .budgets
        )
    assert [(b.policy_version, b.epsilon_cap, b.epsilon_remaining) for b in budgets] == [
        (1, "2", "0.0"),
        (2, "2", "0.0"),
    ]
    assert collector.ledger.reconcile() == []


def test_broken_variant_charging_each_version_its_own_cap_lets_v1_reach_four(
    sqlite_url: str, start: Callable[..., RunningCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both layers switched off: the registry's min over the versions it knows and
    the ledger's min over the recorded versions (either alone stops v1 at 2)."""
    monkeypatch.setattr(PolicyRegistry, "charged", lambda self, verified, *, now: verified)
    monkeypatch.setattr(
        Ledger, "_cap_in_force", lambda self, policy, window, versions=None: policy.epsilon_cap
    )
    clock = Clock(86400 * 20000)
    d, v1, _v2 = _caps(clock)
    collector = start(d, sqlite_url, clock)
    outcomes = _submit(collector, d, "alice", v1, 8)
    assert [o.outcome for o in outcomes] == [pb.OUTCOME_ACCEPTED] * 8
    assert collector.ledger.spent("alice", "web", v1.window_start(clock.now)) == Decimal(4)


def test_reconcile_flags_spend_above_the_cap_in_force(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    """Tampering: a fifth v1 report (2.5 in the window) with consistent running totals
    is over the cap in force (2), though under v1's own cap (4): reconcile says so."""
    clock = Clock(86400 * 20000)
    d, v1, _v2 = _caps(clock)
    collector = start(d, ledger_url, clock)
    _submit(collector, d, "alice", v1, 4)
    window = v1.window_start(clock.now)

    def tamper(conn: sa.Connection) -> None:
        row = conn.execute(sa.select(reports).where(reports.c.subject == "alice")).first()
        assert row is not None and row.epsilon_cap == "2"  # charged under the cap in force
        conn.execute(sa.insert(reports).values({**row._asdict(), "report_id": b"\x01" * 16}))
        conn.execute(
            sa.text(
                "UPDATE spend SET epsilon_spent = '2.5', report_count = 5 "
                "WHERE subject = 'alice' AND policy_id = 'web' AND window_start = :w"
            ),
            {"w": window},
        )
        conn.execute(
            sa.text(
                "UPDATE statistics SET n = n + 1 WHERE policy_id = 'web' AND window_start = :w"
            ),
            {"w": window},
        )

    collector.ledger.transaction(tamper)
    assert [(m.kind, m.subject, m.recorded) for m in collector.ledger.reconcile()] == [
        ("over_cap", "alice", "cap 2")
    ]


def test_cap_in_force_covers_versions_retired_or_starting_within_the_window() -> None:
    """v1 (cap 2) retires at 10:30 and v2 (cap 4) starts then, daily windows: the day of
    the rollout keeps cap 2; the next day, when only v2 is in force, has cap 4."""
    day0 = 86400 * 20000
    d = Deployment.create(now=day0 + 9 * HOUR)
    switch = day0 + 10 * HOUR + HOUR // 2
    d.add_categorical("web", epsilon_cap="2", version=1, lifetime_seconds=switch - d.now + 60)
    v2_env = d.add_categorical("web", epsilon_cap="4", version=2, not_before=switch)
    registry = d.registry(now=switch + 60)  # v1 expired: known only as inactive
    v2 = d.verified(v2_env, now=switch + 60)
    assert registry.cap_in_force("web", day0, DAY) == Decimal(2)
    assert registry.cap_in_force("web", day0 + DAY, DAY) == Decimal(4)
    assert registry.charged(v2, now=switch + 60).epsilon_cap == Decimal(2)
    assert registry.charged(v2, now=day0 + DAY + 1).epsilon_cap == Decimal(4)
    assert registry.charged(v2, now=day0 + DAY + 1) is v2  # its own cap: the same object


def test_reload_when_the_ledger_fails_activates_nothing_and_keeps_the_served_set(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(86400 * 20000)
    d = _deployment(clock)
    d.add_categorical("web")
    trust_dir, policy_dir = d.write_folders(tmp_path)
    config = d.config(sqlite_url, trust_dir=str(trust_dir), policy_dir=str(policy_dir))
    collector = start_collector(config, clock=clock)
    try:
        served = collector.registry
        d.add_categorical("news")
        d.write_folders(tmp_path)

        def down(*args: object, **kwargs: object) -> PolicyLineage:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))

        monkeypatch.setattr(collector.ledger, "claim_lineage", down)
        with pytest.raises(server_module.PolicyActivationError, match="nothing activated"):
            collector.reload_policies()
        assert collector.registry is served and collector.service.registry is served
        assert _served(collector, d) == [("web", 1)]
    finally:
        collector.stop(1.0)
