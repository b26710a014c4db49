"""The ledger contract, run against every store (SQLite file and PostgreSQL)."""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import (
    ACCEPTED,
    BUDGET_EXHAUSTED,
    CONFLICT,
    DUPLICATE,
    CentralBudgetExhaustedError,
    CheckedReport,
    DataOpenedError,
    IdempotencyConflictError,
    Ledger,
    NoCentralCapError,
    ReservationNotFoundError,
    ReservationStateError,
    open_ledger,
)
from fedldp.collector.ledger.schema import spend
from fedldp.v1 import policy_pb2


def _report(policy: VerifiedPolicy, index: int = 0, rid: bytes | None = None) -> CheckedReport:
    rid = secrets.token_bytes(16) if rid is None else rid
    return CheckedReport(
        rid, policy, CategoryOutput(index), hashlib.sha256(b"content" + bytes([index])).digest(), 0
    )


@pytest.fixture
def policy(deployment: Deployment) -> VerifiedPolicy:
    return deployment.verified(deployment.envelopes[0])  # epsilon 0.5, cap 2


@pytest.fixture
def tenth_policy(deployment: Deployment) -> VerifiedPolicy:
    """ε = 0.1 and cap 1: ten reports fit exactly, which floating point gets wrong."""
    env = deployment.add_categorical("tenth", epsilon="0.1", epsilon_cap="1")
    return deployment.verified(env)


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    led = open_ledger(ledger_url, shard="test")
    yield led
    led.close()


def test_accepts_until_cap_then_refuses(ledger: Ledger, policy: VerifiedPolicy, now: int) -> None:
    reports = [_report(policy, i % 4) for i in range(6)]
    outcomes = ledger.submit("alice", reports, now=now)
    assert outcomes == [ACCEPTED] * 4 + [BUDGET_EXHAUSTED] * 2
    window = policy.window_start(now)
    assert ledger.spent("alice", "color", window) == Decimal("2")
    assert ledger.spent("bob", "color", window) == Decimal("0")
    assert ledger.report_count("color", 1, window) == 4
    for refused in reports[4:]:
        assert not ledger.has_report(refused.report_id)
    assert ledger.reconcile() == []


def test_exact_decimals_reach_the_cap_exactly(
    ledger: Ledger, tenth_policy: VerifiedPolicy, now: int
) -> None:
    # 0.1 added ten times is 0.9999999999999999 in binary floating point.
    outcomes = ledger.submit("carol", [_report(tenth_policy) for _ in range(11)], now=now)
    assert outcomes == [ACCEPTED] * 10 + [BUDGET_EXHAUSTED]
    assert ledger.spent("carol", "tenth", tenth_policy.window_start(now)) == Decimal("1.0")


@pytest.fixture(scope="module")
def memo_policies(deployment: Deployment) -> tuple[VerifiedPolicy, VerifiedPolicy]:
    """rappor-grr, k = 64, ε1 = 0.5, ε∞ = 2, cap 9: signed JOINT, and the older INSTANTANEOUS."""
    labels = [f"v{i}" for i in range(64)]
    out = []
    for policy_id, memo in (
        ("memo-joint", policy_pb2.MEMO_CHARGING_JOINT),
        ("memo-legacy", policy_pb2.MEMO_CHARGING_INSTANTANEOUS),
    ):
        env = deployment.add_categorical(
            policy_id,
            labels=labels,
            epsilon="0.5",
            epsilon_cap="9",
            mechanism="rappor-grr",
            params={"epsilon_permanent": "2"},
            memo_charging=memo,
        )
        out.append(deployment.verified(env))
    return out[0], out[1]


def test_memoized_policy_charges_the_joint_rate(
    ledger: Ledger, memo_policies: tuple[VerifiedPolicy, VerifiedPolicy], now: int
) -> None:
    # ε_I = ln p_r/q_r = 2.192184 per report (memo.py: any two value sequences), not
    # ε1 = 0.5: a cap of 9 holds floor(9 / 2.192184) = 4 reports, not 18. The older
    # label is charged the same.
    for pol in memo_policies:
        assert (pol.epsilon, pol.charge) == (Decimal("0.5"), Decimal("2.192184"))
        fits = int(pol.epsilon_cap // pol.charge)
        assert fits == 4
        outcomes = ledger.submit("dora", [_report(pol, i) for i in range(fits + 1)], now=now)
        assert outcomes == [ACCEPTED] * fits + [BUDGET_EXHAUSTED]
        window = pol.window_start(now)
        assert ledger.spent("dora", pol.policy_id, window) == Decimal("8.768736")
    assert ledger.reconcile() == []


def test_next_window_has_a_fresh_budget(ledger: Ledger, policy: VerifiedPolicy, now: int) -> None:
    assert ledger.submit("dan", [_report(policy) for _ in range(5)], now=now).count(ACCEPTED) == 4
    later = now + policy.window_seconds
    assert ledger.submit("dan", [_report(policy)], now=later) == [ACCEPTED]
    assert ledger.spent("dan", "color", policy.window_start(later)) == Decimal("0.5")


def test_idempotent_retry_and_conflicting_reuse(
    ledger: Ledger, policy: VerifiedPolicy, now: int
) -> None:
    first = _report(policy, 1)
    assert ledger.submit("erin", [first], now=now) == [ACCEPTED]
    assert ledger.submit("erin", [first], now=now) == [DUPLICATE]
    # Same id, other content: refused and recorded, nothing charged.
    other = CheckedReport(
        first.report_id, policy, CategoryOutput(2), hashlib.sha256(b"other").digest(), 0
    )
    assert ledger.submit("erin", [other], now=now) == [CONFLICT]
    # Same id and content from another subject is also a conflict.
    assert ledger.submit("frank", [first], now=now) == [CONFLICT]
    window = policy.window_start(now)
    assert ledger.spent("erin", "color", window) == Decimal("0.5")
    assert ledger.spent("frank", "color", window) == Decimal("0")
    assert ledger.conflict_count() == 2
    assert ledger.conflict_count("frank") == 1
    # Within one call the second copy of an id is a duplicate of the first.
    again = _report(policy, 3)
    assert ledger.submit("erin", [again, again], now=now) == [ACCEPTED, DUPLICATE]
    assert ledger.spent("erin", "color", window) == Decimal("1.0")
    assert ledger.reconcile() == []


def test_statistics_move_with_the_reports(ledger: Ledger, policy: VerifiedPolicy, now: int) -> None:
    for subject in ("s1", "s2", "s3"):
        ledger.submit(
            subject, [_report(policy, 0), _report(policy, 2), _report(policy, 2)], now=now
        )
    window = policy.window_start(now)
    parts = ledger.statistics("color", 1, window)
    assert [p.shard for p in parts] == ["test"]
    assert parts[0].n == 9
    stat = policy.mechanism.statistic_from_json(parts[0].statistic_json or "")
    assert stat.counts == [3, 0, 6, 0]
    assert ledger.recompute_statistics(policy, window).counts == stat.counts


def test_statistics_are_sharded_per_collector(
    ledger_url: str, policy: VerifiedPolicy, now: int
) -> None:
    a, b = open_ledger(ledger_url, shard="a"), open_ledger(ledger_url, shard="b")
    try:
        a.submit("u1", [_report(policy, 1)], now=now)
        b.submit("u2", [_report(policy, 3), _report(policy, 3)], now=now)
        parts = a.statistics("color", 1)
        assert {(p.shard, p.n) for p in parts} == {("a", 1), ("b", 2)}
        assert a.reconcile() == []
    finally:
        a.close()
        b.close()


def test_reconcile_finds_a_tampered_running_total(
    ledger: Ledger, policy: VerifiedPolicy, now: int
) -> None:
    ledger.submit("gina", [_report(policy)], now=now)
    assert ledger.reconcile() == []

    def tamper(conn: sa.Connection) -> None:
        conn.execute(sa.update(spend).where(spend.c.subject == "gina").values(epsilon_spent="0"))

    ledger.transaction(tamper)
    mismatches = ledger.reconcile()
    assert [(m.kind, m.subject) for m in mismatches] == [("spend", "gina")]
    assert "0.5" in str(mismatches[0])


def test_concurrent_submits_never_exceed_the_cap(
    ledger: Ledger, policy: VerifiedPolicy, now: int
) -> None:
    """Many threads race one subject near its cap: exactly cap/ε reports get in."""
    results: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        for _ in range(3):
            out = ledger.submit("hot", [_report(policy), _report(policy)], now=now)
            with lock:
                results.extend(out)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(ACCEPTED) == 4
    assert results.count(BUDGET_EXHAUSTED) == 44
    assert ledger.spent("hot", "color", policy.window_start(now)) == Decimal("2")
    assert ledger.reconcile() == []


def test_the_same_reports_raced_by_two_collectors_are_stored_once(
    ledger: Ledger, ledger_url: str, tenth_policy: VerifiedPolicy, now: int
) -> None:
    """Two ledgers (two collectors) race to store the same report ids: each id is
    ACCEPTED exactly once and DUPLICATE everywhere else, charged once (on
    PostgreSQL the losing insert fails with 23505 and its transaction reruns)."""
    other = open_ledger(ledger_url, shard="other")
    reports = [_report(tenth_policy, i % 4) for i in range(6)]
    results: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker(led: Ledger) -> None:
        barrier.wait()
        for _ in range(2):
            out = led.submit("racer", reports, now=now)
            with lock:
                results.extend(out)

    threads = [threading.Thread(target=worker, args=(led,)) for led in (ledger, other) * 3]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(ACCEPTED) == 6
        assert results.count(DUPLICATE) == 6 * 12 - 6
        window = tenth_policy.window_start(now)
        assert ledger.spent("racer", "tenth", window) == Decimal("0.6")
        assert ledger.report_count("tenth", tenth_policy.version) == 6
        assert ledger.reconcile() == []
    finally:
        other.close()


def test_reopen_keeps_everything_and_migrations_are_idempotent(
    ledger_url: str, policy: VerifiedPolicy, now: int
) -> None:
    with open_ledger(ledger_url) as led:
        led.submit("ivy", [_report(policy)], now=now)
    with open_ledger(ledger_url) as led:
        assert led.spent("ivy", "color", policy.window_start(now)) == Decimal("0.5")


# --- central releases ---


def test_central_reserve_settle_cancel(ledger: Ledger, now: int) -> None:
    with pytest.raises(NoCentralCapError):
        ledger.reserve(
            subject="model",
            purpose="train",
            epsilon=Decimal("1"),
            delta=Decimal("1e-6"),
            idempotency_key="k0",
            now=now,
        )
    ledger.set_central_cap("model", "train", epsilon_cap=Decimal("3"), delta_cap=Decimal("1e-5"))
    r1 = ledger.reserve(
        subject="model",
        purpose="train",
        epsilon=Decimal("2"),
        delta=Decimal("1e-6"),
        idempotency_key="k1",
        now=now,
        metadata={"run": "a"},
    )
    assert r1.status == "reserved" and r1.metadata == {"run": "a"}
    # Same key, same content: the original reservation, nothing more reserved.
    again = ledger.reserve(
        subject="model",
        purpose="train",
        epsilon=Decimal("2"),
        delta=Decimal("1e-6"),
        idempotency_key="k1",
        now=now,
    )
    assert again.id == r1.id
    assert ledger.central_spend("model", "train") == (Decimal("2"), Decimal("0.000001"))
    with pytest.raises(IdempotencyConflictError):
        ledger.reserve(
            subject="model",
            purpose="train",
            epsilon=Decimal("1"),
            delta=Decimal("1e-6"),
            idempotency_key="k1",
            now=now,
        )
    with pytest.raises(CentralBudgetExhaustedError):
        ledger.reserve(
            subject="model",
            purpose="train",
            epsilon=Decimal("1.5"),
            delta=Decimal("1e-6"),
            idempotency_key="k2",
            now=now,
        )
    with pytest.raises(ValueError, match="exceeds reserved"):
        ledger.settle(r1.id, epsilon_spent=Decimal("2.5"), delta_spent=Decimal("0"), now=now)
    settled = ledger.settle(
        r1.id,
        epsilon_spent=Decimal("1.25"),
        delta_spent=Decimal("1e-6"),
        events=[{"kind": "gaussian", "noise_multiplier": 1.1, "sample_rate": 0.01, "steps": 100}],
        now=now + 5,
    )
    assert settled.status == "settled" and settled.epsilon_spent == Decimal("1.25")
    assert ledger.central_spend("model", "train") == (Decimal("1.25"), Decimal("0.000001"))
    events = ledger.central_events("model", "train")
    assert [e.event["kind"] for e in events] == ["gaussian"]
    assert events[0].event["steps"] == 100
    with pytest.raises(ReservationStateError):
        ledger.cancel(r1.id, now=now)
    r2 = ledger.reserve(
        subject="model",
        purpose="train",
        epsilon=Decimal("1.75"),
        delta=Decimal("1e-6"),
        idempotency_key="k3",
        now=now + 10,
    )
    assert ledger.central_spend("model", "train")[0] == Decimal("3.00")
    assert ledger.cancel(r2.id, now=now).status == "cancelled"
    assert ledger.central_spend("model", "train")[0] == Decimal("1.25")
    assert [r.status for r in ledger.reservations("model", "train")] == ["settled", "cancelled"]
    assert ledger.reconcile() == []


def test_release_events_read_one_reservation(ledger: Ledger, now: int) -> None:
    """`release_events`: one reservation and its own events (none unless settled), equal
    to what `central_events` holds for it; an unknown id is ReservationNotFoundError."""
    ledger.set_central_cap("model", "train", epsilon_cap=Decimal("9"), delta_cap=Decimal("0"))
    common: dict[str, Any] = {"subject": "model", "purpose": "train", "delta": Decimal(0)}
    rids = []
    for i in range(3):
        r = ledger.reserve(**common, epsilon=Decimal(1), idempotency_key=f"e{i}", now=now + i)
        rids.append(r.id)
        if i < 2:
            ledger.settle(
                r.id,
                epsilon_spent=Decimal(1),
                delta_spent=Decimal(0),
                events=[{"query": "count", "output": str(i)}, {"query": "sum", "output": "7"}],
                now=now + i,
            )
    every = ledger.central_events("model", "train")
    assert [e.reservation_id for e in every] == [rids[0], rids[0], rids[1], rids[1]]
    for rid in rids[:2]:
        res, events = ledger.release_events(rid)
        assert res.id == rid and res.status == "settled"
        assert events == [e for e in every if e.reservation_id == rid]
    open_res, none = ledger.release_events(rids[2])
    assert open_res.status == "reserved" and none == []
    with pytest.raises(ReservationNotFoundError):
        ledger.release_events("no-such-id")


def test_a_claim_can_commit_its_data_opened_mark(ledger: Ledger, now: int) -> None:
    """`reserve(open_data=True)`: claimed and opened in one transaction; the refund rule
    then refuses a cancel; the same key again returns it without a second mark."""
    ledger.set_central_cap("model", "train", epsilon_cap=Decimal("2"), delta_cap=Decimal("0"))
    ask: dict[str, Any] = {
        "subject": "model",
        "purpose": "train",
        "epsilon": Decimal(1),
        "delta": Decimal(0),
        "idempotency_key": "o1",
        "owner": "o" * 32,
    }
    res = ledger.reserve(**ask, now=now, open_data=True)
    assert res.data_opened_at == now and ledger.reservation(res.id).data_opened_at == now
    assert [e["action"] for e in ledger.reservation_log(res.id)] == ["reserved", "data_opened"]
    again = ledger.reserve(**ask, now=now + 1, open_data=True)
    assert again.id == res.id and len(ledger.reservation_log(res.id)) == 2
    with pytest.raises(DataOpenedError):
        ledger.cancel(res.id, now=now, owner="o" * 32)
    assert ledger.central_spend("model", "train") == (Decimal(1), Decimal(0))
    plain = ledger.reserve(**{**ask, "idempotency_key": "o2"}, now=now)
    assert plain.data_opened_at is None  # the default: the claim alone


def test_central_amounts_must_be_exact(ledger: Ledger, now: int) -> None:
    ledger.set_central_cap("m", "p", epsilon_cap=Decimal("1"), delta_cap=Decimal("0"))
    with pytest.raises(TypeError, match="Decimal"):
        ledger.reserve(
            subject="m",
            purpose="p",
            epsilon=0.5,  # type: ignore[arg-type]
            delta=Decimal(0),
            idempotency_key="f",
            now=now,
        )


def test_concurrent_reservations_never_exceed_the_central_cap(ledger: Ledger, now: int) -> None:
    ledger.set_central_cap("m", "race", epsilon_cap=Decimal("1"), delta_cap=Decimal("1e-5"))
    granted: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        for j in range(4):
            try:
                r = ledger.reserve(
                    subject="m",
                    purpose="race",
                    epsilon=Decimal("0.1"),
                    delta=Decimal("0"),
                    idempotency_key=f"{i}-{j}",
                    now=now,
                )
            except CentralBudgetExhaustedError:
                continue
            with lock:
                granted.append(r.id)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(granted) == 10
    assert ledger.central_spend("m", "race")[0] == Decimal("1.0")
    assert ledger.reconcile() == []


@pytest.mark.postgres
def test_serializable_isolation_also_never_over_spends(
    postgresql_url: str, policy: VerifiedPolicy, now: int
) -> None:
    """The optional SERIALIZABLE mode: same race, same exact cap (retries absorb aborts)."""
    ledgers = [
        open_ledger(postgresql_url, shard=f"s{i}", isolation="SERIALIZABLE") for i in range(2)
    ]
    results: list[int] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        for _ in range(3):
            out = ledgers[i % 2].submit("hot", [_report(policy), _report(policy)], now=now)
            with lock:
                results.extend(out)

    try:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(ACCEPTED) == 4
        assert ledgers[0].spent("hot", "color", policy.window_start(now)) == Decimal("2")
        assert ledgers[0].reconcile() == []
    finally:
        for led in ledgers:
            led.close()


def test_sqlite_refuses_an_isolation_setting(sqlite_url: str) -> None:
    with pytest.raises(ValueError, match="PostgreSQL"):
        open_ledger(sqlite_url, isolation="SERIALIZABLE")
