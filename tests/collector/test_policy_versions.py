"""The cap in force comes from the LEDGER's recorded policy versions (docs/policies.md,
"Versions and budgets", rule 3).

Regression tests for an attacker's finding: the smallest cap in force was computed
from the versions the charging collector knew, so (A) a collector that lacked v2
(cap 2, in force) let a subject spend 2 more after spending 2 under v2 elsewhere,
and (B) a lower cap published mid-window reached back to no spend (the window held
4 while v2 promised 2) and reconcile was clean. Now every activated version is
recorded in the ledger, charges check the smallest recorded cap in force (read
inside the charge transaction when the versions changed), a version that lowers the
cap of a window already begun is refused, and reconcile checks spend against the
smallest cap. Real collectors over real gRPC, on a SQLite file and on PostgreSQL;
each defence is shown to fail on a deliberately broken variant, kept as a test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from collector_testkit import Deployment, coarse, make_report
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector import server as server_module
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import Ledger, PolicyVersion
from fedldp.collector.ledger.schema import policy_version_generation, policy_versions
from fedldp.collector.ledger.store import lowered_window, smallest_cap
from fedldp.collector.policies import Lookup, PolicyRegistry
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc, policy_pb2

HOUR = 3600
DAY = 86400
NOW = DAY * 20000 + 2 * HOUR  # 02:00 of a day: the attacker's clock


class Clock:
    """A settable collector clock (Unix seconds)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def start() -> Iterator[Callable[..., RunningCollector]]:
    """start(deployment, ledger_url, clock, envelopes, **config): a collector, stopped after."""
    running: list[RunningCollector] = []

    def _start(
        d: Deployment,
        ledger_url: str,
        clock: Clock,
        envelopes: list[policy_pb2.SignedEnvelope],
        **config: Any,
    ) -> RunningCollector:
        registry = PolicyRegistry.from_envelopes(
            envelopes, d.trust(), now=clock(), audience=d.audience
        )
        collector = start_collector(d.config(ledger_url, **config), registry=registry, clock=clock)
        running.append(collector)
        return collector

    yield _start
    for collector in running:
        collector.stop(1.0)


def _submit(
    collector: RunningCollector, d: Deployment, subject: str, policy: VerifiedPolicy, count: int
) -> list[int]:
    """Outcomes of `count` fresh reports of `subject` under `policy` at the collector's now."""
    at = coarse(collector.clock())
    request = pb.SubmitRequest(
        reports=[make_report(policy, CategoryOutput(i % 4), coarse_time=at) for i in range(count)]
    )
    with grpc.insecure_channel(collector.address) as channel:
        stub = collector_pb2_grpc.CollectorStub(channel)
        auth = bearer_metadata(d.token(subject, ttl=30 * DAY))
        return [o.outcome for o in stub.Submit(request, metadata=auth).outcomes]


def _accepted(outcomes: list[int]) -> int:
    return outcomes.count(pb.OUTCOME_ACCEPTED)


def _refusals(collector: RunningCollector, reason: str) -> float:
    value = collector.metrics.registry.get_sample_value(
        "fedldp_collector_policy_refusals_total", {"reason": reason}
    )
    return 0.0 if value is None else value


def _version(
    version: int, cap: str, not_before: int, expires_at: int, *, window: int = DAY
) -> PolicyVersion:
    return PolicyVersion(
        "web", version, Decimal(cap), window, not_before, expires_at, bytes([version]) * 32
    )


def _no_ledger_min(monkeypatch: pytest.MonkeyPatch) -> None:
    """The broken variant: charge each report against what its collector knows only."""
    monkeypatch.setattr(
        Ledger, "_cap_in_force", lambda self, policy, window, versions=None: policy.epsilon_cap
    )


# --- the ledger's record of versions ------------------------------------------------------


def test_record_versions_records_once_refuses_conflicts_and_bumps_the_generation(
    ledger: Ledger,
) -> None:
    def generation() -> int:
        return ledger.transaction(
            lambda c: int(
                c.execute(sa.select(policy_version_generation.c.generation)).scalar_one()
            ),
            write=False,
        )

    g0 = generation()
    v1 = _version(1, "4", 0, NOW + 30 * DAY)
    v2 = _version(2, "2", 0, NOW + 30 * DAY)
    # Recorded together on a ledger that has none: no charge can fall between them.
    assert ledger.record_versions([v1, v2], clock=lambda: NOW) == {}
    assert generation() == g0 + 1
    recorded = ledger.policy_versions()
    assert [(v.version, v.epsilon_cap, v.recorded_at) for v in recorded] == [
        (1, Decimal(4), NOW),
        (2, Decimal(2), NOW),
    ]
    # Again (a restart, another collector): nothing new, the generation stays.
    assert ledger.record_versions([v1, v2], clock=lambda: NOW + 5) == {}
    assert generation() == g0 + 1
    forged = PolicyVersion("web", 2, Decimal(9), DAY, 0, NOW + 30 * DAY, b"\xee" * 32)
    refused = ledger.record_versions([forged], clock=lambda: NOW)
    assert list(refused) == [("web", 2)] and refused[("web", 2)].startswith("version_conflict: ")
    assert ledger.policy_versions() == recorded and generation() == g0 + 1


def test_record_versions_refuses_a_cap_lowered_in_a_window_already_begun(ledger: Ledger) -> None:
    today = NOW - NOW % DAY
    assert ledger.record_versions([_version(1, "4", 0, NOW + 30 * DAY)], clock=lambda: NOW) == {}
    # Valid from a minute ago: today's window has begun and may hold 4.
    late = _version(2, "2", NOW - 60, NOW + 30 * DAY)
    refused = ledger.record_versions([late], clock=lambda: NOW)
    assert refused[("web", 2)].startswith("cap_lowered: ")
    assert f"window starting at {today}" in refused[("web", 2)]
    # Valid from the next window (or any instant in it): nothing charged there yet.
    for not_before in (today + DAY, today + DAY + 7 * HOUR):
        ahead = _version(3, "2", not_before, NOW + 30 * DAY)
        assert ledger.record_versions([ahead], clock=lambda: NOW) == {}
    # Raising a cap, or an equal cap, lowers nothing.
    assert ledger.record_versions([_version(4, "6", NOW - 60, NOW + DAY)], clock=lambda: NOW) == {}
    assert ledger.record_versions([_version(5, "4", 0, NOW + DAY)], clock=lambda: NOW) == {}
    assert [v.version for v in ledger.policy_versions()] == [1, 3, 4, 5]


def test_lowered_window_checks_every_window_where_the_smallest_cap_changes() -> None:
    w = DAY
    v1 = _version(1, "4", 0, 10 * w)  # days 0-9
    v2 = _version(2, "2", 3 * w, 6 * w)  # days 3-5
    # A cap of 2 over days 3-5 lowers nothing (v2 already holds them at 2) ...
    assert lowered_window(_version(3, "2", 3 * w, 6 * w), [v1, v2], now=20 * w) is None
    # ... over days 3-6 it lowers day 6 (only v1 there), found at v2's end.
    assert lowered_window(_version(3, "2", 3 * w, 7 * w), [v1, v2], now=20 * w) == 6 * w
    # ... unless day 6 has not begun.
    assert lowered_window(_version(3, "2", 3 * w, 7 * w), [v1, v2], now=6 * w - 1) is None
    # Windows no recorded version covers had no charge: nothing to lower there.
    assert lowered_window(_version(3, "1", 12 * w, 14 * w), [v1, v2], now=20 * w) is None
    assert smallest_cap([v1, v2], 5 * w, w) == Decimal(2)
    assert smallest_cap([v1, v2], 11 * w, w) is None
    # A version ending exactly at a window start is not in force during that window.
    assert smallest_cap([v2], 6 * w, w) is None and smallest_cap([v2], 5 * w, w) == Decimal(2)


def test_migrated_policy_versions_tables_match_schema(ledger: Ledger) -> None:
    engine = sa.create_engine(ledger.url)
    try:
        inspector = sa.inspect(engine)
        for table in (policy_versions, policy_version_generation):
            columns = {c["name"] for c in inspector.get_columns(table.name)}
            primary = inspector.get_pk_constraint(table.name)["constrained_columns"]
            assert columns == {c.name for c in table.columns}
            assert primary == [c.name for c in table.primary_key.columns]
    finally:
        engine.dispose()


# --- the attacker's finding 02, variant A: two collectors, one knows only v1 -----------------


def _variant_a(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> tuple[RunningCollector, RunningCollector, VerifiedPolicy, VerifiedPolicy, Deployment]:
    clock = Clock(NOW)
    d = Deployment.create(now=NOW)
    e1 = d.add_categorical("web", epsilon="0.5", epsilon_cap="4", version=1)
    e2 = d.add_categorical("web", epsilon="0.5", epsilon_cap="2", version=2)
    a = start(d, ledger_url, clock, [e1, e2], instance_id="a")  # knows v1 and v2
    b = start(d, ledger_url, clock, [e1], instance_id="b")  # mid-rollout: v1 only
    return a, b, d.verified(e1), d.verified(e2), d


def test_variant_a_a_collector_lacking_v2_still_applies_its_cap(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    a, b, v1, v2, d = _variant_a(ledger_url, start)
    assert _accepted(_submit(a, d, "alice", v2, 8)) == 4  # 2.0 under v2
    assert set(_submit(b, d, "alice", v1, 8)) == {pb.OUTCOME_BUDGET_EXHAUSTED}
    assert a.ledger.spent("alice", "web", v1.window_start(NOW)) == Decimal(2)
    assert a.ledger.reconcile() == [] and b.ledger.reconcile() == []
    # B's GetBudget shows the cap in force from the ledger, though B never saw v2.
    with grpc.insecure_channel(b.address) as channel:
        budgets = (
            collector_pb2_grpc.CollectorStub(channel)
            .GetBudget(pb.GetBudgetRequest(), metadata=bearer_metadata(d.token("alice")))
            .budgets
        )
    assert [(x.policy_version, x.epsilon_cap, x.epsilon_remaining) for x in budgets] == [
        (1, "2", "0.0")
    ]


def test_variant_a_broken_without_the_ledgers_versions_spends_four(
    sqlite_url: str, start: Callable[..., RunningCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_ledger_min(monkeypatch)
    a, b, v1, v2, d = _variant_a(sqlite_url, start)
    assert _accepted(_submit(a, d, "alice", v2, 8)) == 4
    assert _accepted(_submit(b, d, "alice", v1, 8)) == 4
    assert a.ledger.spent("alice", "web", v1.window_start(NOW)) == Decimal(4)
    # Reconcile compares with the smallest recorded cap in force: it flags the window.
    assert [(m.kind, m.recorded) for m in a.ledger.reconcile()] == [("over_cap", "cap 2")]


# --- variant B: a lower cap published mid-window cannot reach back --------------------------


def test_variant_b_a_cap_lowered_mid_window_is_refused_and_a_window_ahead_is_not(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    clock = Clock(NOW)
    d = Deployment.create(now=NOW)
    f1 = d.add_categorical("app", epsilon="0.5", epsilon_cap="4", version=1)
    w1 = d.verified(f1)
    c = start(d, ledger_url, clock, [f1])
    assert _accepted(_submit(c, d, "bob", w1, 8)) == 8  # 4.0: v1's cap, the only one
    c.stop(1.0)
    # v2 (cap 2) valid from a minute ago, restart: it would promise 2 in a window holding 4.
    f2 = d.add_categorical("app", epsilon="0.5", epsilon_cap="2", version=2, not_before=NOW - 60)
    w2 = d.verified(f2)
    for _ in range(2):  # refused at every start: its window has begun and holds spend
        c = start(d, ledger_url, clock, [f1, f2])
        assert _refusals(c, "cap_lowered") == 1
        assert c.registry.lookup("app", 2, w2.digest, now=NOW)[0] is Lookup.REFUSED
        assert set(_submit(c, d, "bob", w2, 1)) == {pb.OUTCOME_UNKNOWN_POLICY}
        assert [v.version for v in c.ledger.policy_versions() if v.policy_id == "app"] == [1]
        assert c.ledger.reconcile() == []  # no version in force promises less than 4
        c.stop(1.0)
    # The fix an operator makes: v3 (cap 2) from the next window; accepted now, and the
    # next window holds at most 2 under either version.
    tomorrow = NOW - NOW % DAY + DAY
    f3 = d.add_categorical("app", epsilon="0.5", epsilon_cap="2", version=3, not_before=tomorrow)
    c = start(d, ledger_url, clock, [f1, f3])
    assert _refusals(c, "cap_lowered") == 0
    assert [v.version for v in c.ledger.policy_versions() if v.policy_id == "app"] == [1, 3]
    c.stop(1.0)
    clock.now = tomorrow + HOUR
    c = start(d, ledger_url, clock, [f1, f3])  # v3 valid now (a restart or reload)
    assert _refusals(c, "cap_lowered") == 0
    w3 = d.verified(f3, now=clock.now)
    assert _accepted(_submit(c, d, "bob", w1, 3) + _submit(c, d, "bob", w3, 3)) == 4
    assert c.ledger.spent("bob", "app", tomorrow) == Decimal(2)
    assert c.ledger.reconcile() == []


def test_variant_b_broken_without_the_refusal_lets_v2_promise_two_over_four(
    sqlite_url: str, start: Callable[..., RunningCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant (the finding as reported): with the cap_lowered check off,
    v2 is activated over a window holding 4; reconcile, which compares with the
    smallest recorded cap in force, now flags the window."""
    monkeypatch.setattr("fedldp.collector.ledger.versions.lowered_window", lambda *a, **k: None)
    clock = Clock(NOW)
    d = Deployment.create(now=NOW)
    f1 = d.add_categorical("app", epsilon="0.5", epsilon_cap="4", version=1)
    c = start(d, sqlite_url, clock, [f1])
    assert _accepted(_submit(c, d, "bob", d.verified(f1), 8)) == 8
    c.stop(1.0)
    f2 = d.add_categorical("app", epsilon="0.5", epsilon_cap="2", version=2, not_before=NOW - 60)
    c = start(d, sqlite_url, clock, [f1, f2])
    assert _refusals(c, "cap_lowered") == 0
    assert [(m.kind, m.subject, m.recorded) for m in c.ledger.reconcile()] == [
        ("over_cap", "bob", "cap 2")
    ]


# --- the race: activation of a lower cap on one collector while another charges -------------


def _race(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> tuple[list[int], RunningCollector]:
    """B (knows v1, cap 4, its cache loaded before v2 exists) charges 8 reports in the
    window starting at `w1` while A records v2 (cap 2, valid from `w1`): A's clock,
    read inside its recording transaction, says w1 has not begun (A holds the
    ledger's lock then), and B's request is sent at that moment, so it must wait and
    then see v2."""
    w1 = NOW - NOW % DAY + DAY
    d = Deployment.create(now=NOW)
    e1 = d.add_categorical("web", epsilon="0.5", epsilon_cap="4", version=1)
    e2 = d.add_categorical("web", epsilon="0.5", epsilon_cap="2", version=2, not_before=w1)
    a = start(d, ledger_url, Clock(w1 - 1), [e1], instance_id="a")
    b = start(d, ledger_url, Clock(w1 + 1), [e1], instance_id="b")
    v1 = d.verified(e1, now=w1 + 1)
    outcomes: list[int] = []
    sender = threading.Thread(target=lambda: outcomes.extend(_submit(b, d, "carol", v1, 8)))

    def clock_inside_the_lock() -> int:
        if sender.ident is None:  # (a rerun of the transaction reads the clock again)
            sender.start()
            time.sleep(0.5)  # B's transaction reaches the ledger's lock and waits there
        return w1 - 1

    registry = PolicyRegistry.from_envelopes([e1, e2], d.trust(), now=w1 - 1, audience=d.audience)
    server_module.activate(registry, a.ledger, a.metrics, now=w1 - 1, clock=clock_inside_the_lock)
    sender.join()
    assert [v.version for v in a.ledger.policy_versions()] == [1, 2]  # v2 recorded ahead
    return outcomes, b


def test_race_activation_of_a_lower_cap_while_another_collector_charges(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    outcomes, b = _race(ledger_url, start)
    assert _accepted(outcomes) == 4
    w1 = NOW - NOW % DAY + DAY
    assert b.ledger.spent("carol", "web", w1) == Decimal(2)
    assert b.ledger.reconcile() == []


def test_race_broken_without_the_generation_read_in_the_transaction(
    sqlite_url: str, start: Callable[..., RunningCollector], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken variant: a charge trusts its cached versions (no generation read
    inside the transaction) and spends past the cap A recorded before it."""
    monkeypatch.setattr(
        Ledger, "_read_generation", lambda self, db, charging=False: self._versions.generation
    )
    outcomes, b = _race(sqlite_url, start)
    assert _accepted(outcomes) == 8
    assert [m.kind for m in b.ledger.reconcile()] == ["over_cap"]


# --- reconcile: the smallest cap ------------------------------------------------------------


def test_reconcile_compares_with_the_smallest_cap_of_rows_and_recorded_versions(
    ledger_url: str, start: Callable[..., RunningCollector]
) -> None:
    """Tampering with recorded caps (a legacy or edited ledger): spend of 3 under caps
    stored as 4 and 3 is clean; a recorded version in force with cap 2 makes it
    over_cap; a row charged under cap 2 (stored on the row) does too."""
    clock = Clock(NOW)
    d = Deployment.create(now=NOW)
    e1 = d.add_categorical("web", epsilon="0.5", epsilon_cap="4", version=1)
    c = start(d, ledger_url, clock, [e1])
    assert _accepted(_submit(c, d, "dave", d.verified(e1), 6)) == 6
    assert c.ledger.reconcile() == []
    window = NOW - NOW % DAY

    def add_version(conn: sa.Connection) -> None:
        conn.execute(
            sa.insert(policy_versions).values(
                policy_id="web",
                version=9,
                epsilon_cap="2",
                window_seconds=DAY,
                not_before=window + HOUR,  # in force during part of the window: counts
                expires_at=window + 2 * HOUR,
                digest=b"\x09" * 32,
                recorded_at=NOW,
            )
        )

    c.ledger.transaction(add_version)
    assert [(m.kind, m.subject, m.recomputed, m.recorded) for m in c.ledger.reconcile()] == [
        ("over_cap", "dave", "3.0", "cap 2")
    ]
    c.ledger.transaction(
        lambda conn: conn.execute(sa.delete(policy_versions).where(policy_versions.c.version == 9))
    )
    c.ledger.transaction(
        lambda conn: conn.execute(
            sa.text(
                "UPDATE reports SET epsilon_cap = '2.5' WHERE report_id = "
                "(SELECT report_id FROM reports ORDER BY report_id LIMIT 1)"
            )
        )
    )
    assert [(m.kind, m.recorded) for m in c.ledger.reconcile()] == [("over_cap", "cap 2.5")]
