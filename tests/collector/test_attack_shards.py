"""Attacks on ledger shards (auditor atk2). Each test FAILS on the code as audited
and passes once the finding it names is fixed. SQLite files stand in for the
shard servers (the placement and refusal logic is the same as on PostgreSQL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from collector_testkit import Deployment, checked_report, write_config
from fedldp.collector.ledger import SubmitBatch, open_ledger
from fedldp.collector.ledger.shards import ShardMap, open_sharded
from fedldp.v1 import collector_pb2 as pb

from fedldp.cli import main


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"


def _one_on_each(shard_map: ShardMap, prefix: str) -> tuple[str, str]:
    first = next(f"{prefix}{i}" for i in range(1000) if _home(shard_map, f"{prefix}{i}") == 0)
    second = next(f"{prefix}{i}" for i in range(1000) if _home(shard_map, f"{prefix}{i}") == 1)
    return first, second


def _home(shard_map: ShardMap, subject: str) -> int:
    from fedldp.collector.ledger.shards import slot_of

    return shard_map.owners(slot_of(subject))[-1]


def _charge(ledger: Any, policy: Any, subject: str, count: int, *, now: int) -> None:
    reports = [checked_report(policy) for _ in range(count)]
    ledger.submit_many([SubmitBatch(subject, reports, now)])


# --- Finding: a report over a subset of the shards silently under-counts ---


def test_attack_report_over_an_incomplete_shard_list_is_refused(
    deployment: Deployment, two_files: tuple[str, str], tmp_path: Path, now: int
) -> None:
    """docs/operations.md: "a collector whose list is incomplete, reordered or names
    another database refuses to start" and "`fedldp report --config ...` reads every
    shard and merges ... the estimates equal those of one ledger". A report job whose
    config still lists the old shards (e.g. not updated after `ledger shards add`), or
    given one shard's URL, silently reports on part of the data: it should refuse like
    a collector does (read the shard map, require every shard)."""
    a, b = two_files
    policy = deployment.verified(deployment.envelopes[0])
    with open_sharded([a, b], shard="c0") as sharded:
        subjects = [f"r{i}" for i in range(40)]
        for subject in subjects:
            _charge(sharded.for_subject(subject), policy, subject, 1, now=now)
        on_1 = sum(1 for s in subjects if sharded.route(s) == 1)
    assert 0 < on_1 < 40
    stale = write_config(deployment, tmp_path, "", "stale", ledger_shards=[a])
    result = CliRunner().invoke(
        main, ["report", "--config", str(stale), "--policy", "color", "--format", "json"]
    )
    shown = result.output
    assert result.exit_code != 0, (
        f"report over shard 0 of 2 succeeded silently: n={json.loads(shown)['n']} of 40"
    )
    alone = write_config(deployment, tmp_path, a, "alone")
    result = CliRunner().invoke(
        main, ["report", "--config", str(alone), "--policy", "color", "--format", "json"]
    )
    assert result.exit_code != 0, "report over one shard's ledger_url succeeded silently"


# --- Finding: central commands accept a shard other than shard 0 ---


def test_attack_central_cap_on_a_non_zero_shard_is_refused(
    deployment: Deployment, two_files: tuple[str, str]
) -> None:
    """docs/operations.md: "Central caps and reservations live on shard 0". Nothing
    enforces it: `fedldp ledger set-cap --ledger <shard 1>` (and the release service,
    `open_ledger(config.ledger_url)`) happily keep a second, independent set of
    central caps and reservations on shard 1, so a release service pointed at shard 1
    grants the whole central cap again. A collector given one shard's URL is refused
    (`refuse_if_shard`); central commands should refuse any shard but shard 0."""
    a, b = two_files
    with open_sharded([a, b]):
        pass  # writes the shard map into both
    result = CliRunner().invoke(
        main,
        ["ledger", "set-cap", "alice", "p", "--epsilon", "1", "--delta", "0.00001", "--ledger", b],
    )
    assert result.exit_code != 0, "a central cap was stored on shard 1 of a sharded ledger"


# --- Finding: a report id reused across shards is accepted twice ---
# Decision (docs/collector.md "Report ids", docs/operations.md "Ledger shards"):
# report ids stay unique per shard. A global claim would put a cross-shard write on
# every report (the hot path is one single-shard transaction), and subject-scoped
# ids would change the single ledger's contract. A second subject reusing an id is
# charged under its own cap only, as any report of that subject would be; the SDK's
# CSPRNG-drawn ids (client/report_ids.py) never collide in practice, and with unique ids the merged
# estimates equal one ledger's (test_shards.py). This test pins that documented
# behaviour (the auditor's version asserted the single-ledger CONFLICT).


def test_attack_report_id_reused_across_shards_charges_each_subject_once(
    deployment: Deployment, two_files: tuple[str, str], tmp_path: Path, now: int
) -> None:
    """Two subjects on different shards reusing one report id (other content): on
    shards both are ACCEPTED, each charged once, to its own spend only; a resend of
    each is DUPLICATE (idempotent, not charged again). One ledger refuses the second
    as CONFLICT: the documented per-shard difference."""
    a, b = two_files
    policy = deployment.verified(deployment.envelopes[0])
    rid = b"\x07" * 16
    single_url = f"sqlite:///{tmp_path / 'single.db'}"
    with open_sharded([a, b], shard="c0") as sharded:
        s0, s1 = _one_on_each(sharded.map, "dup")
        sent = {s: checked_report(policy, i, report_id=rid) for s, i in ((s0, 1), (s1, 2))}
        for _round in ("first", "resend"):
            outcomes = [
                sharded.for_subject(s).submit_many([SubmitBatch(s, [r], now)])[0][0]
                for s, r in sent.items()
            ]
            want = pb.OUTCOME_ACCEPTED if _round == "first" else pb.OUTCOME_DUPLICATE
            assert outcomes == [want, want], (_round, outcomes)
        for subject in (s0, s1):
            rows = sharded.for_subject(subject).subject_spend(subject)
            assert [r.report_count for r in rows] == [1], (subject, rows)
        other = 1 - sharded.route(s0)
        assert sharded.shards[other].subject_spend(s0) == []
    with open_ledger(single_url, shard="c0") as single:
        out_single = [single.submit_many([SubmitBatch(s, [r], now)])[0][0] for s, r in sent.items()]
    assert out_single == [pb.OUTCOME_ACCEPTED, pb.OUTCOME_CONFLICT]


# --- Finding: listing a charged plain ledger in ledger_shards moves its subjects ---


def test_attack_first_start_over_a_charged_ledger_is_refused(
    deployment: Deployment, two_files: tuple[str, str], now: int
) -> None:
    """docs/operations.md: "A subject already charged on an old shard stays there for
    ever" and adding a shard (also "growing one `ledger_url` ledger into two shards")
    goes through `fedldp ledger shards add`, which refuses what would move a subject.
    But a collector started with `ledger_shards = [old, new]` on a ledger that already
    holds charges (the operator skipped `shards add`) writes the epoch-0 map as if the
    ledger were empty: every charged subject whose slot is odd is now routed to the new
    shard, without a look-up (its slot never "moved"), and gets a fresh cap there in
    the same window: its ε cap is spent twice. The first start should refuse shards
    that already hold charges (or hold a map only `shards add` may extend)."""
    a, b = two_files
    policy = deployment.verified(deployment.envelopes[0])  # "color": 4 reports fit
    subjects = [f"old-{i}" for i in range(20)]
    with open_ledger(a) as single:
        for subject in subjects:
            _charge(single, policy, subject, 4, now=now)  # the whole cap
    try:
        sharded = open_sharded([a, b])
    except Exception:
        return  # refused: the fix
    with sharded:
        moved = [s for s in subjects if sharded.route(s) != 0]
        again = 0
        for subject in moved:
            reports = [checked_report(policy) for _ in range(4)]
            outcomes = sharded.for_subject(subject).submit_many(
                [SubmitBatch(subject, reports, now)]
            )
            again += list(outcomes[0]).count(pb.OUTCOME_ACCEPTED)
    assert again == 0, (
        f"{len(moved)} fully charged subjects were routed to shard 1 and {again} more "
        "reports were accepted in the same window: their epsilon cap spent twice"
    )
