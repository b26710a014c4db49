"""The ledger's rows after a seeded run are exactly those of the code before pem's
statistic moved to chunk rows (issue #33), on every store.

A fixed authority (Ed25519 keys from fixed bytes: signatures are deterministic),
fixed clocks and a seeded `random.Random` drive `Ledger.submit_many` through a
run of group commits on two collector shards and two windows: grr, olh, a
numeric mechanism and pem, with retried reports (DUPLICATE), reused ids with
other content (CONFLICT) and reports past the cap (BUDGET_EXHAUSTED). The
ledger is then closed and opened again (durability), and a SHA-256 is taken over
every outcome, every `reports`, `spend` and `conflicts` row, every `statistics`
row's key, n and time, and each (policy, window)'s merged statistic in its
canonical JSON (`statistic_to_json`: for pem the sorted multiset of its reports,
whatever form the ledger stores it in). `GOLDEN` is that digest as computed by
the code at commit 4475dbf (main before this change), on SQLite and PostgreSQL
alike: any change to which reports are stored, charged, refused or counted, or
to the statistics they add up to, changes it. The test also reconciles the ledger
(`reconcile() == []`) and audits every statistic against the raw rows.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.reports import merge_partials, partials_from_ledger
from fedldp.authoring import Authority
from fedldp.authoring.signing import make_root
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import CheckedReport, Ledger, SubmitBatch, open_ledger
from fedldp.collector.ledger.schema import conflicts, reports, spend, statistics
from fedldp.collector.wire import content_digest
from fedldp.v1 import collector_pb2 as pb

#: sha256 of the run's outcomes and rows (module docstring), from commit 4475dbf.
GOLDEN = "c5e5dba5bb1765ab08763b02c34e2dc12eababc115f26d82c8ced28308508cef"
NOW = 1_796_000_000  # a fixed clock (2026-11-30)
DAY = 86400


def fixed_authority(now: int) -> Authority:
    """An `Authority` whose keys come from fixed bytes (so its signatures are fixed)."""
    root = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"seeded root").digest())
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"seeded policy").digest())
    expires_at = now + 365 * DAY
    envelope = make_root(
        version=1,
        root_keys=[root],
        policy_keys=[(key.public_key(), expires_at)],
        expires_at=expires_at,
        signers=[root],
    )
    return Authority(root, key, envelope, [root.public_key()])


@pytest.fixture(scope="module")
def policies() -> list[VerifiedPolicy]:
    d = Deployment(NOW, fixed_authority(NOW - 3600), secret=b"\x00" * 32)
    d.add_categorical("color", epsilon="0.5", epsilon_cap="2")
    d.add_categorical("tags", labels=[f"t{i}" for i in range(40)], mechanism="olh", epsilon="1")
    d.add_numeric("load", epsilon="1", epsilon_cap="3")
    d.add_open("words", max_bytes=3, epsilon="4", epsilon_cap="12")
    return [d.verified(env) for env in d.envelopes]


WORDS = ["ok", "hi", "yo", "hey", "ok", "ok", "hi"]


def _report(policy: VerifiedPolicy, rng: random.Random, now: int) -> CheckedReport:
    """A seeded report of `policy` at `now`: a seeded id and a seeded randomized output."""
    mech = policy.mechanism
    if policy.open_domain is not None:
        value: Any = rng.choice(WORDS)
    elif policy.labels is not None:
        value = rng.randrange(len(policy.labels))
    else:
        value = Decimal(rng.randrange(0, 101)) / 100
    output = mech.perturb(value, rng=rng)
    coarse = now - now % 3600
    # The content digest as `wire.content_digest` makes it, but over the policy id in
    # place of the policy's digest: a signed policy's bytes are not the same from one
    # process to the next (protobuf writes its params map in hash order), and the
    # ledger only compares digests.
    digest = content_digest(
        policy_id=policy.policy_id,
        policy_version=policy.version,
        policy_digest=policy.policy_id.encode(),
        coarse_time=coarse,
        output=output,
    )
    return CheckedReport(rng.randbytes(16), policy, output, digest, coarse)


def _other_content(report: CheckedReport, rng: random.Random) -> CheckedReport:
    """The same id with another output (a CONFLICT)."""
    again = _report(report.policy, rng, NOW)  # type: ignore[arg-type]
    return CheckedReport(report.report_id, again.policy, again.output, again.content_digest, 0)


def _run(url: str, policies: Sequence[VerifiedPolicy]) -> list[list[str]]:
    """The seeded run (module docstring) on two shards; every outcome, in order."""
    rng = random.Random(20261207)
    shards = [open_ledger(url, shard="shard-a"), open_ledger(url, shard="shard-b")]
    sent: dict[str, list[CheckedReport]] = {}
    r0 = _report(policies[0], rng, NOW)
    outcomes: list[list[str]] = []
    try:
        for step in range(60):
            now = NOW + (DAY if step >= 40 else 0) + step
            batches = []
            for _ in range(rng.randrange(1, 4)):
                subject = f"user{rng.randrange(12)}"
                chosen: list[CheckedReport] = []
                own = sent.setdefault(subject, [])
                for _ in range(rng.randrange(1, 6)):
                    roll = rng.random()
                    if own and roll < 0.2:  # a retry: the subject's report again
                        chosen.append(rng.choice(own))
                    elif own and roll < 0.25:  # its id reused with other content
                        chosen.append(_other_content(rng.choice(own), rng))
                    elif roll < 0.27 and len(sent) > 1:  # another subject's report
                        chosen.append(rng.choice(sent[rng.choice(sorted(sent))] or [r0]))
                    else:
                        chosen.append(_report(rng.choice(policies), rng, now))
                own.extend(chosen)
                batches.append(SubmitBatch(subject, chosen, now))
            ledger = shards[step % 2]
            outcomes.extend(
                [pb.Outcome.Name(o) for o in out] for out in ledger.submit_many(batches)
            )
    finally:
        for led in shards:
            led.close()
    return outcomes


def _rows(
    conn: sa.Connection,
    table: sa.Table,
    names: dict[bytes, str],
    skip: Sequence[str] = (),
) -> list[list[Any]]:
    """Every row of `table` (columns in table order, less `skip`), sorted; bytes as
    hex, except a policy digest, given as its name in `names` (see `_report`)."""
    columns = [c for c in table.columns if c.name not in skip]
    out = []
    for row in conn.execute(sa.select(*columns)):
        out.append(
            [
                names.get(bytes(v), bytes(v).hex()) if isinstance(v, bytes | memoryview) else v
                for v in row
            ]
        )
    return sorted(out, key=json.dumps)


def _ledger_digest(ledger: Ledger, policies: Sequence[VerifiedPolicy], outcomes: Any) -> str:
    """sha256 over the outcomes, the rows and each (policy, window)'s canonical statistic."""

    names = {p.digest: f"digest of {p.policy_id}" for p in policies}

    def tx(conn: sa.Connection) -> dict[str, Any]:
        return {
            "reports": _rows(conn, reports, names),
            "spend": _rows(conn, spend, names),
            "conflicts": _rows(conn, conflicts, names),
            "statistics": _rows(conn, statistics, names, skip=("statistic_json",)),
        }

    state = ledger.transaction(tx, write=False)
    merged = {}
    for policy in policies:
        for window in (policy.window_start(NOW), policy.window_start(NOW + DAY)):
            parts = partials_from_ledger(ledger, policy, window)
            stat = merge_partials(policy.mechanism, parts).statistic
            merged[f"{policy.policy_id}@{window}"] = policy.mechanism.statistic_to_json(stat)
    state["merged"] = merged
    state["outcomes"] = outcomes
    return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()


@pytest.fixture
def seeded(ledger_url: str, policies: list[VerifiedPolicy]) -> Iterator[tuple[Ledger, Any]]:
    outcomes = _run(ledger_url, policies)
    led = open_ledger(ledger_url, shard="reader")  # opened again: what was committed
    yield led, outcomes
    led.close()


def test_the_seeded_runs_rows_are_those_before_the_change(
    seeded: tuple[Ledger, Any], policies: list[VerifiedPolicy]
) -> None:
    ledger, outcomes = seeded
    flat = [o for out in outcomes for o in out]
    # The run exercises every outcome.
    for kind in ("ACCEPTED", "DUPLICATE", "CONFLICT", "BUDGET_EXHAUSTED"):
        assert f"OUTCOME_{kind}" in flat, kind
    assert ledger.reconcile() == []
    assert _ledger_digest(ledger, policies, outcomes) == GOLDEN
