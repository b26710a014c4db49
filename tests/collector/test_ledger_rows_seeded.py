"""A seeded ingestion run leaves exactly the ledger rows the reference code left.

The run goes through `Ledger.submit_many` (the group commit's entry point) with
every case the hot path distinguishes: many subjects and policies per group,
one subject's reports in two requests of one group, runs of one policy broken
by another, a cap reached in the middle of a run and of a group, two windows,
reports under a recorded version with a lower cap, DUPLICATE and CONFLICT
resubmissions (the same id with the same content, with other content, by
another subject), an id repeated inside a group, and a stored id met by a group
that was decided without reading its ids (the rerun path).

Every table's rows are dumped in a canonical text form (rows sorted, columns by
name; the per-deployment policy digests, which depend on freshly generated signing
keys, replaced by their policy id and version, and the ledger's random id left out)
and hashed. `REFERENCE` is that hash as the per-report ingestion path of
commit 4475dbf computed it (before the batched ledger work of branch `ingest`),
together with every outcome: a change to the hot path that changes any stored
byte, any charge, any outcome or the order of anything observable fails here.
Both stores give the same rows, so one reference serves SQLite and PostgreSQL.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import cast

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment
from fedldp.client.mechanisms import CategoryOutput, NumericOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import (
    ACCEPTED,
    BUDGET_EXHAUSTED,
    CONFLICT,
    DUPLICATE,
    CheckedReport,
    Ledger,
    PolicyVersion,
    SubmitBatch,
    open_ledger,
)

OUTCOMES = {
    "accepted": ACCEPTED,
    "duplicate": DUPLICATE,
    "budget_exhausted": BUDGET_EXHAUSTED,
    "conflict": CONFLICT,
}

#: The run's clock: fixed, so every stored time is the same on every run.
NOW = 1_800_000_000 - 1_800_000_000 % 86400 + 7200
#: sha256 of the canonical dump (`_dump`) and of the outcomes, as the reference
#: code computed them (see the module docstring).
REFERENCE = {
    "rows": "accbfe6b0a9f24909014d31370b9ec2d72d7a10a6371cdf925f2e04a1bc00ac1",
    "outcomes": "8b13337137100773ffd199e832eadf4f9a731522c4133ff4aa9e8e7383de9cc2",
}


@pytest.fixture(scope="module")
def policies() -> dict[str, VerifiedPolicy]:
    """Three policies: two categorical (ε 0.25 cap 5, ε 0.001 cap 1), one numeric."""
    d = Deployment.create(now=NOW)
    out = {
        "color": d.add_categorical("color", epsilon="0.25", epsilon_cap="5"),
        "small": d.add_categorical("small", epsilon="0.001", epsilon_cap="1"),
        "level": d.add_numeric("level", epsilon="0.5", epsilon_cap="2"),
    }
    return {name: d.verified(env) for name, env in out.items()}


def _report(
    rng: random.Random, policy: VerifiedPolicy, *, rid: bytes | None = None, content: int = -1
) -> CheckedReport:
    """A report under `policy` with a seeded id, output and content digest."""
    rid = rng.randbytes(16) if rid is None else rid
    if policy.policy_id == "level":
        value = rng.choice(policy.mechanism.table)  # type: ignore[attr-defined]
        output: CategoryOutput | NumericOutput = NumericOutput(value)
        key = repr(value)
    else:
        index = rng.randrange(4)
        output = CategoryOutput(index)
        key = str(index)
    content = rng.randrange(1 << 30) if content < 0 else content
    digest = hashlib.sha256(f"{policy.policy_id}:{key}:{content}".encode()).digest()
    return CheckedReport(rid, policy, output, digest, NOW - NOW % 3600)


def _groups(policies: dict[str, VerifiedPolicy]) -> Iterator[list[SubmitBatch]]:
    """The seeded run's groups, in order (each one `submit_many` call).

    Groups 0-5 are new reports only, so the ledger decides them without reading
    their ids; group 6 resubmits one stored report (the primary key refuses it and
    the group reruns reading its ids); from group 7 on, reports are resubmitted at
    random (never one id twice in a group, except group 17's)."""
    rng = random.Random(20261207)
    names = sorted(policies)
    stored: list[tuple[str, CheckedReport]] = []
    for g in range(26):
        now = NOW + g * 3000  # crosses a day window after group 12 (the windows are days)
        batches: list[SubmitBatch] = []
        added: list[tuple[str, CheckedReport]] = []  # resubmitted from the next group on
        used: set[bytes] = set()
        for _ in range(rng.randrange(1, 9)):
            subject = f"device-{rng.randrange(12)}"
            reports: list[CheckedReport] = []
            for _ in range(rng.choice((1, 1, 2, 5, 40))):
                roll = rng.random() if g > 6 else 1.0
                other, prior = rng.choice(stored) if stored else (subject, None)
                if prior is None or prior[0] in used or roll >= 0.11:
                    reports.append(_report(rng, policies[rng.choice(names)]))
                elif roll < 0.06:  # resubmitted: same id, same content
                    reports.append(prior)
                elif roll < 0.09:  # same id, other content
                    reports.append(_report(rng, cast(VerifiedPolicy, prior[1]), rid=prior[0]))
                elif other != subject:  # an id another subject used
                    reports.append(prior)
                used.add(reports[-1][0] if reports else b"")
            if g == 6 and not batches:
                reports.append(stored[0][1])
            batches.append(SubmitBatch(subject, reports, now))
            added.extend((subject, r) for r in reports)
        if g == 17:  # one subject in two requests of one group, and an id repeated
            first = [_report(rng, policies["small"]) for _ in range(3)]
            batches.append(SubmitBatch("device-3", first, now))
            batches.append(
                SubmitBatch("device-3", [first[1], _report(rng, policies["small"])], now)
            )
        stored.extend(added)
        yield batches


def _canonical(value: object, digests: dict[bytes, str]) -> str:
    """One stored value as text: policy digests by name, other bytes in hex."""
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, bytes):
        return digests.get(value, value.hex())
    return repr(value)


def _dump(ledger: Ledger, policies: dict[str, VerifiedPolicy]) -> str:
    """Every non-empty table's rows, canonical text (sorted), one line per row."""
    digests = {p.digest: f"<digest {p.policy_id} v{p.version}>" for p in policies.values()}
    lines: list[str] = []
    with sa.create_engine(ledger.url).connect() as conn:
        for table in sorted(sa.inspect(conn).get_table_names()):
            if table == "alembic_version":
                continue
            columns = sorted(c["name"] for c in sa.inspect(conn).get_columns(table))
            select = f"SELECT {', '.join(columns)} FROM {table}"
            if table == "ledger_info":
                select += " WHERE key <> 'ledger_id'"
            rows = sorted(
                "|".join(_canonical(v, digests) for v in row)
                for row in conn.exec_driver_sql(select)
            )
            if rows:
                lines.append(f"[{table}] {', '.join(columns)}")
                lines.extend(rows)
    return "\n".join(lines) + "\n"


def _run(ledger: Ledger, policies: dict[str, VerifiedPolicy]) -> list[list[str]]:
    """Record the versions (small's cap lowered to 0.5 by a version 2 recorded
    first), then submit every group; each report's outcome."""
    small = policies["small"]
    lowered = PolicyVersion(
        "small", 2, Decimal("0.5"), small.window_seconds, 0, NOW + 30 * 86400, b"\x07" * 32
    )
    versions = [lowered] + [
        PolicyVersion(
            policy_id=p.policy_id,
            version=p.version,
            epsilon_cap=p.epsilon_cap,
            window_seconds=p.window_seconds,
            not_before=p.not_before,
            expires_at=p.expires_at,
            digest=p.digest,
        )
        for p in policies.values()
    ]
    assert ledger.record_versions(versions, clock=lambda: NOW - 3600) == {}
    return [
        [str(o) for out in ledger.submit_many(batches) for o in out]
        for batches in _groups(policies)
    ]


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def test_seeded_run_leaves_the_reference_rows(
    ledger_url: str, policies: dict[str, VerifiedPolicy], tmp_path: Path
) -> None:
    with open_ledger(ledger_url, shard="shard-a") as ledger:
        outcomes = _run(ledger, policies)
        dump = _dump(ledger, policies)
        reruns = ledger.stored_id_reruns
    (tmp_path / "dump.txt").write_text(dump)  # kept by pytest for a failing run's diff
    flat = [o for group in outcomes for o in group]
    # The run exercises what it claims to (else the reference would pin too little).
    names = {str(o): n for n, o in OUTCOMES.items()}
    assert {names[o] for o in flat} == set(OUTCOMES), sorted(set(flat))
    assert reruns >= 1  # a stored id met by a group decided without reading its ids
    assert _digest(dump) == REFERENCE["rows"], f"rows differ: {tmp_path / 'dump.txt'}"
    assert _digest(repr(outcomes)) == REFERENCE["outcomes"]
    # The dump sees a one-unit change of one cell (a broken variant of the ledger).
    with sa.create_engine(ledger_url).begin() as conn:
        conn.exec_driver_sql(
            "UPDATE spend SET report_count = report_count + 1 WHERE subject = 'device-3'"
        )
    with open_ledger(ledger_url, shard="shard-a") as ledger:
        assert _digest(_dump(ledger, policies)) != REFERENCE["rows"]
