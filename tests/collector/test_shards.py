"""Ledger shards (collector/ledger/shards.py, collector/routing.py): the placement
rule, adding a shard, and, on TWO real PostgreSQL servers, exact caps under
concurrent load through several collectors, nothing lost when a collector or a
shard's server is killed, reconcile, and merged estimates equal to one ledger's."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

import grpc
import pytest
from click.testing import CliRunner
from collector_testkit import (
    Deployment,
    checked_report,
    coarse,
    make_report,
    spawn,
    write_config,
)
from fedldp.aggregator.estimation import FrequencyReport
from fedldp.aggregator.reports import report_from_ledgers
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import bearer_metadata
from fedldp.collector.ledger import PolicyVersion, SubmitBatch, open_ledger
from fedldp.collector.ledger.shards import (
    SLOTS,
    ShardedLedger,
    ShardMap,
    ShardMapError,
    SubjectSplitError,
    add_shard,
    open_sharded,
    read_map,
    refuse_if_shard,
    slot_of,
    write_map,
)
from fedldp.collector.server import RunningCollector, start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

from fedldp.cli import main

SUBMIT_OK = {pb.OUTCOME_ACCEPTED, pb.OUTCOME_DUPLICATE}


# --- the placement rule (no database) ---


def test_slot_is_the_documented_hash() -> None:
    digest = hashlib.sha256(b"device-42").digest()
    assert slot_of("device-42") == int.from_bytes(digest[:8], "big") % SLOTS
    assert slot_of("device-42") == 3280  # pinned: a stored placement never changes


def test_adding_a_shard_moves_slots_only_to_the_new_shard() -> None:
    one = ShardMap.initial(["a"])
    two = one.add_shard("b")
    three = two.add_shard("c")
    assert two.epochs[-1].count(1) == SLOTS // 2
    assert 1300 <= three.epochs[-1].count(2) <= 1400  # about a third
    for slot in range(SLOTS):
        before, after = two.epochs[-1][slot], three.epochs[-1][slot]
        assert after in (before, 2)  # no slot moves between old shards
        assert three.owners(slot)[-1] == after
    assert ShardMap.from_json(three.to_json()) == three
    with pytest.raises(ShardMapError):
        three.add_shard("b")  # a database already a shard


# --- adding a shard, splits and misconfiguration (SQLite files: fast) ---


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"


def _charge(ledger: Any, policy: Any, subject: str, count: int, *, now: int) -> list[Any]:
    reports = [checked_report(policy) for _ in range(count)]
    return list(ledger.submit_many([SubmitBatch(subject, reports, now)])[0])


def test_add_shard_keeps_every_seen_subject_where_it_is(
    deployment: Deployment, two_files: tuple[str, str], tmp_path: Path, now: int
) -> None:
    a, b = two_files
    policy = deployment.verified(deployment.envelopes[0])  # "color": 4 reports fit
    old = [f"old-{i}" for i in range(60)]
    with open_ledger(a) as single:  # a plain ledger, grown into two shards below
        for subject in old:
            _charge(single, policy, subject, 2, now=now)
    grown = add_shard([a], b, now=now)
    assert add_shard([a], b, now=now) == grown  # a rerun finishes nothing twice
    with open_sharded([a, b]) as sharded:
        moved = [s for s in old if len(sharded.map.owners(slot_of(s))) == 2]
        assert moved  # about half of them
        assert {sharded.route(s) for s in old} == {0}  # seen: they stay on shard 0
        # Their cap holds across the add: 2 more fit, not 4.
        outcomes = _charge(sharded.for_subject(moved[0]), policy, moved[0], 4, now=now)
        assert outcomes.count(pb.OUTCOME_ACCEPTED) == 2
        new = [f"new-{i}" for i in range(60)]
        placed = Counter(sharded.route(s) for s in new)
        assert placed[1] > 0 and placed[0] > 0  # new subjects of moved slots go to 1
        for subject in new:
            _charge(sharded.for_subject(subject), policy, subject, 1, now=now)
        assert all(m == [] for _, m in sharded.reconcile_shards())
        assert sharded.shards[1].report_count("color", 1) == placed[1]
    # The shard map refuses configurations that would split a subject.
    with pytest.raises(ShardMapError, match="2 shards"):
        open_sharded([a])
    with pytest.raises(ShardMapError, match="order"):
        open_sharded([b, a])
    with open_ledger(b) as plain, pytest.raises(ShardMapError, match="shard 1 of 2"):
        refuse_if_shard(plain)  # a collector given one shard's URL alone
    config = write_config(deployment, tmp_path, "", "c", ledger_shards=[a, b])
    result = CliRunner().invoke(main, ["ledger", "reconcile", "--config", str(config)])
    assert result.exit_code == 0, result.output
    assert "shard 0: consistent" in result.output and "placement: consistent" in result.output
    result = CliRunner().invoke(main, ["ledger", "shards", "show", "--config", str(config)])
    assert f"shard 1: ledger {grown.ledger_ids[1]}, {SLOTS // 2} slots now" in result.output


def test_a_subject_charged_on_two_shards_is_refused_and_reported(
    deployment: Deployment, two_files: tuple[str, str], tmp_path: Path, now: int
) -> None:
    a, b = two_files
    policy = deployment.verified(deployment.envelopes[0])
    with open_ledger(a) as single:
        _charge(single, policy, "early", 1, now=now)
    grown = add_shard([a], b, now=now)
    early_moved = len(grown.owners(slot_of("early"))) == 2
    subject = (
        "early"
        if early_moved
        else next(f"s{i}" for i in range(100) if len(grown.owners(slot_of(f"s{i}"))) == 2)
    )
    with open_ledger(a) as first, open_ledger(b) as second:  # bypassing the router
        _charge(first, policy, subject, 1, now=now)
        _charge(second, policy, subject, 1, now=now)
        stay = next(f"t{i}" for i in range(100) if grown.owners(slot_of(f"t{i}")) == [0])
        _charge(second, policy, stay, 1, now=now)  # on a shard that never owned its slot
    with open_sharded([a, b], access="read") as sharded:
        with pytest.raises(SubjectSplitError):
            sharded.route(subject)
        placement = dict(sharded.reconcile_shards())[-1]
        assert {(m.kind, m.subject) for m in placement} == {
            ("split", subject),
            ("misplaced", stay),
        }
    config = write_config(deployment, tmp_path, "", "c", ledger_shards=[a, b])
    result = CliRunner().invoke(main, ["ledger", "reconcile", "--config", str(config)])
    assert result.exit_code == 1 and "MISMATCH placement: split" in result.output
    # A collector refuses the split subject's reports, and charges nothing.
    running = start_collector(
        deployment.config("", ledger_shards=(a, b)), registry=deployment.registry()
    )
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            report = make_report(policy, CategoryOutput(1), coarse_time=coarse(now))
            auth = bearer_metadata(deployment.token(subject))
            with pytest.raises(grpc.RpcError) as refused:
                stub.Submit(pb.SubmitRequest(reports=[report]), metadata=auth)
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "charges on shards [0, 1]" in str(refused.value.details())
    finally:
        running.stop(1.0)
    with open_sharded([a, b], access="read") as sharded:
        assert not any(s.has_report(report.report_id) for s in sharded.shards)


def test_shard_0_arbitrates_lineage_and_versions(
    deployment: Deployment, two_files: tuple[str, str], now: int
) -> None:
    a, b = two_files
    with open_ledger(a) as first:  # another collector won shard 0 first
        first.claim_lineage("p", "metric.m", 86400, 1, now=now)
    with open_sharded([a, b]) as sharded:  # epoch 0 completed on both
        lost = sharded.claim_lineage("q", "metric.m", 86400, 1, now=now)
        assert lost.policy_id == "p"  # refused: q is not recorded on shard 1 either
        assert sharded.shards[1].lineages() == []
        won = sharded.claim_lineage("p", "metric.m", 86400, 1, now=now)
        assert won.policy_id == "p" and sharded.shards[1].lineages() == [won]
        versions = [
            PolicyVersion("p", 1, Decimal(1), 86400, now, now + 86400, bytes([i]) * 32)
            for i in (1, 2)
        ]
        # Another collector recorded other bytes for p v1 on shard 0 first: refused,
        # and not recorded on shard 1 either.
        assert sharded.shards[0].record_versions(versions[1:], clock=lambda: now) == {}
        refused = sharded.record_versions(versions[:1], clock=lambda: now)
        assert list(refused) == [("p", 1)] and refused[("p", 1)].startswith("version_conflict")
        assert sharded.shards[1].policy_versions() == []
        assert sharded.record_versions(versions[1:], clock=lambda: now) == {}
        assert [v.digest for s in sharded.shards for v in s.policy_versions()] == [
            versions[1].digest
        ] * 2
    with open_ledger(b) as second:
        assert read_map(second) is not None  # the first start wrote the map to both


def test_a_concurrent_first_start_completes_the_initial_map(two_files: tuple[str, str]) -> None:
    a, b = two_files
    with open_ledger(a) as first, open_ledger(b) as second:
        initial = ShardMap.initial([first.ledger_id(), second.ledger_id()])
        write_map(first, initial, None)  # another collector got this far
    with open_sharded([a, b]) as sharded:
        assert [read_map(s) for s in sharded.shards] == [initial, initial]


# --- two PostgreSQL servers ---


@pytest.fixture
def shard_urls(postgresql_url: str, postgresql_url_b: str) -> tuple[str, str]:
    """A fresh database on each of the two PostgreSQL servers."""
    return postgresql_url, postgresql_url_b


def _subjects_on_both(sharded_map: ShardMap, count: int, prefix: str) -> list[str]:
    subjects = [f"{prefix}-{i}" for i in range(count)]
    assert {sharded_map.owners(slot_of(s))[-1] for s in subjects} == {0, 1}
    return subjects


@pytest.fixture
def tight(deployment: Deployment) -> Any:
    """ε 0.05 per report, cap 1: 20 reports fit per subject and window."""
    return deployment.verified(deployment.add_categorical("tight", epsilon="0.05", epsilon_cap="1"))


@pytest.fixture
def two_collectors(
    deployment: Deployment, shard_urls: tuple[str, str], tight: Any
) -> Iterator[list[RunningCollector]]:
    running: list[RunningCollector] = []
    try:
        for name in ("c0", "c1"):
            config = deployment.config("", ledger_shards=shard_urls, instance_id=name)
            running.append(start_collector(config, registry=deployment.registry()))
        yield running
    finally:
        for r in running:
            r.stop(1.0)


def test_caps_are_exact_under_concurrent_load_through_two_collectors(
    deployment: Deployment, two_collectors: list[RunningCollector], tight: Any, now: int
) -> None:
    policy = tight
    sharded = two_collectors[0].shards
    assert sharded is not None
    subjects = _subjects_on_both(sharded.map, 24, "load")
    requests = [
        (
            subject,
            i % 2,
            [make_report(policy, CategoryOutput(j % 4), coarse_time=coarse(now)) for j in range(6)],
        )
        for subject in subjects
        for i in range(5)  # 30 reports each; 20 fit under ε 0.05, cap 1
    ]
    channels = [grpc.insecure_channel(c.address) for c in two_collectors]
    stubs = [collector_pb2_grpc.CollectorStub(ch) for ch in channels]

    def send(item: tuple[str, int, list[pb.Report]]) -> tuple[str, list[int]]:
        subject, which, reports = item
        auth = bearer_metadata(deployment.token(subject))
        response = stubs[which].Submit(pb.SubmitRequest(reports=reports), metadata=auth)
        return subject, [o.outcome for o in response.outcomes]

    try:
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(send, requests))
    finally:
        for ch in channels:
            ch.close()
    accepted: Counter[str] = Counter()
    for subject, outcomes in results:
        accepted[subject] += outcomes.count(pb.OUTCOME_ACCEPTED)
        assert set(outcomes) <= {pb.OUTCOME_ACCEPTED, pb.OUTCOME_BUDGET_EXHAUSTED}
    assert accepted == {s: 20 for s in subjects}
    for subject in subjects:
        assert sharded.for_subject(subject).spent(
            subject, "tight", policy.window_start(now)
        ) == Decimal("1.00")
    per_shard = [s.report_count("tight", 1) for s in sharded.shards]
    assert sum(per_shard) == 20 * len(subjects) and min(per_shard) > 0
    assert all(m == [] for _, m in sharded.reconcile_shards())
    on_1 = next(s for s in subjects if sharded.route(s) == 1)
    with grpc.insecure_channel(two_collectors[1].address) as channel:
        budget = collector_pb2_grpc.CollectorStub(channel).GetBudget(
            pb.GetBudgetRequest(policy_id="tight"),
            metadata=bearer_metadata(deployment.token(on_1)),
        )
    assert [(b.epsilon_spent, b.epsilon_remaining) for b in budget.budgets] == [("1.00", "0.00")]
    recorded = [{(v.policy_id, v.version) for v in s.policy_versions()} for s in sharded.shards]
    assert recorded[0] == recorded[1] and ("tight", 1) in recorded[0]  # on every shard
    text = two_collectors[0].metrics.text().decode()
    assert 'fedldp_collector_shard_requests_total{result="ok",shard="1"}' in text
    assert "load-" not in text  # no subject in any label


def test_nothing_is_lost_when_a_collector_or_a_shard_server_is_killed(
    deployment: Deployment,
    shard_urls: tuple[str, str],
    postgresql_server_b: Any,
    tmp_path: Path,
    now: int,
) -> None:
    policy = deployment.verified(deployment.add_categorical("roomy", epsilon="0.01"))
    procs = [
        spawn(write_config(deployment, tmp_path, "", name, ledger_shards=list(shard_urls)), name)
        for name in ("p0", "p1")
    ]
    with open_sharded(list(shard_urls), access="read") as sharded:
        subjects = _subjects_on_both(sharded.map, 12, "dev")
        on_b = {s for s in subjects if sharded.route(s) == 1}
    # Each device's requests: fixed report ids, resent unchanged until answered.
    pending = {
        (subject, k): [
            make_report(policy, CategoryOutput(k % 4), coarse_time=coarse(now)) for _ in range(10)
        ]
        for subject in subjects
        for k in range(6)
    }
    channels = [grpc.insecure_channel(p.address) for p in procs]
    stubs = [collector_pb2_grpc.CollectorStub(ch) for ch in channels]

    def send(key: tuple[str, int], which: int) -> tuple[tuple[str, int], bool]:
        auth = bearer_metadata(deployment.token(key[0]))
        try:
            response = stubs[which].Submit(
                pb.SubmitRequest(reports=pending[key]), metadata=auth, timeout=20
            )
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
            return key, False
        assert {o.outcome for o in response.outcomes} <= SUBMIT_OK
        return key, True

    def round_(keys: list[tuple[str, int]], which: Any) -> set[tuple[str, int]]:
        with ThreadPoolExecutor(8) as pool:
            done = pool.map(lambda kv: send(kv[1], which(kv[0])), enumerate(keys))
            return {key for key, ok in done if ok}

    keys = sorted(pending)
    try:
        # Phase 1: load over both collectors; collector p1 is killed while it runs.
        first, rest = keys[: len(keys) // 2], keys[len(keys) // 2 :]
        with ThreadPoolExecutor(1) as killer:
            answered = round_(first[:8], lambda i: i % 2)
            killer.submit(os.kill, procs[1].proc.pid, signal.SIGKILL)
            answered |= round_(first[8:], lambda i: i % 2)
        procs[1].proc.wait()
        # Phase 2: shard B's server is killed; shard A's devices go on being served.
        postgresql_server_b.kill()
        during = round_(rest, lambda _i: 0)
        assert {k for k in rest if k[0] not in on_b} <= during  # shard A: all served
        assert not {k for k in rest if k[0] in on_b} & during  # shard B: none
        answered |= during
        # Phase 3: B restarts; every device resends what was not answered, once.
        postgresql_server_b.restart()
        missing = [k for k in keys if k not in answered]
        assert missing
        assert round_(missing, lambda _i: 0) == set(missing)
    finally:
        for ch in channels:
            ch.close()
        for p in procs:
            if p.proc.poll() is None:
                p.proc.terminate()
                p.proc.wait(30)
    with open_sharded(list(shard_urls), access="read") as sharded:
        stored = [s.report_count("roomy", 1) for s in sharded.shards]
        assert sum(stored) == 10 * len(keys)  # every report exactly once
        assert stored[1] == 10 * 6 * len(on_b)
        for key, reports in pending.items():
            ledger = sharded.for_subject(key[0])
            assert all(ledger.has_report(r.report_id) for r in reports)
        assert all(m == [] for _, m in sharded.reconcile_shards())


def test_merged_shard_estimates_equal_one_ledgers(
    deployment: Deployment, shard_urls: tuple[str, str], postgresql_server: Any, now: int
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    single_url = postgresql_server.create_database()
    outputs = [(f"e{i % 50}", (i * 7) % 4) for i in range(200)]
    batches: dict[str, list[Any]] = {}
    for subject, index in outputs:
        batches.setdefault(subject, []).append(checked_report(policy, index))
    with (
        open_ledger(single_url, shard="c0") as single,
        open_sharded(list(shard_urls), shard="c0") as sharded,
    ):
        for subject, reports in batches.items():
            single.submit(subject, reports, now=now)
            sharded.for_subject(subject).submit(subject, reports, now=now)
        assert min(s.report_count("color", 1) for s in sharded.shards) > 0
        one = report_from_ledgers([("ledger", single)], policy)
        merged = report_from_ledgers(
            [(f"shard{i}", s) for i, s in enumerate(sharded.shards)], policy
        )
        whole = report_from_ledgers([("ledger", sharded)], policy)
        mech = policy.mechanism
        assert mech.statistic_to_json(sharded.recompute_statistics(policy)) == (
            mech.statistic_to_json(single.recompute_statistics(policy))
        )
    assert merged.n == one.n == whole.n == 200
    assert isinstance(one, FrequencyReport) and isinstance(merged, FrequencyReport)
    assert isinstance(whole, FrequencyReport)
    assert merged.estimates == one.estimates == whole.estimates  # values and errors


def test_sharded_ledger_is_a_statistics_source(
    deployment: Deployment, two_files: tuple[str, str], tmp_path: Path, now: int
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    with open_sharded(list(two_files), shard="c9") as sharded:
        assert isinstance(sharded, ShardedLedger)
        subjects = _subjects_on_both(sharded.map, 20, "st")
        for subject in subjects:
            _charge(sharded.for_subject(subject), policy, subject, 1, now=now)
        names = {p.shard for p in sharded.statistics("color", 1)}
        on_1 = next(s for s in subjects if sharded.route(s) == 1)
    assert names == {"0/c9", "1/c9"}
    # The CLI reads every shard of a config's ledger_shards.
    config = write_config(deployment, tmp_path, "", "c", ledger_shards=list(two_files))
    result = CliRunner().invoke(
        main, ["report", "--config", str(config), "--policy", "color", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["n"] == 20
    shown = CliRunner().invoke(main, ["ledger", "show", on_1, "--config", str(config)])
    assert shown.exit_code == 0 and "color" in shown.output, shown.output
