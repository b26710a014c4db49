"""The ingestion path's per-report shortcuts give exactly what the plain path gives.

The service works out a request's policies once and reuses category outputs a
policy's mechanism accepted before, computes content digests from a per-policy
SHA-256 state and builds the common response from its wire bytes; the ledger
passes BLOBs to SQLite as bytearrays and looks up shared values once per run of
one policy's reports. Each test pins what such a shortcut must not change: the
validation order, the digest encoding, the response, the stored values, the
outcomes and charges.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
import struct
from collections.abc import Iterator
from decimal import Decimal
from typing import cast

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment, checked_report, coarse, make_report
from fedldp.client.mechanisms import (
    BitVectorOutput,
    CategoryOutput,
    HashedOutput,
    IndexBitOutput,
    NumericOutput,
    Output,
)
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.ledger import (
    ACCEPTED,
    BUDGET_EXHAUSTED,
    CONFLICT,
    DUPLICATE,
    CheckedReport,
    Ledger,
    SubmitBatch,
    ingest,
    open_ledger,
)
from fedldp.collector.ledger.schema import reports as reports_table
from fedldp.collector.ledger.schema import statistics
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.service import CollectorService, Limits, _ledger_response
from fedldp.collector.wire import content_digest, digest_from_state, digest_state, output_to_json
from fedldp.v1 import collector_pb2 as pb
from google.protobuf.message import DecodeError

# --- content digests -------------------------------------------------------------------


def _reference_digest(
    policy: VerifiedPolicy, coarse_time: int, kind: bytes, encoded: bytes
) -> bytes:
    """The stored digest encoding (collector/wire.py), written out independently."""
    pid = policy.policy_id.encode()
    return hashlib.sha256(
        b"fedldp.report.v1\x00"
        + struct.pack("<I", len(pid))
        + pid
        + struct.pack("<QI", policy.version, len(policy.digest))
        + policy.digest
        + struct.pack("<q", coarse_time)
        + kind
        + encoded
    ).digest()


@pytest.mark.parametrize(
    ("output", "kind", "encoded"),
    [
        (CategoryOutput(3), b"C", struct.pack("<Q", 3)),
        (CategoryOutput(2**40), b"C", struct.pack("<Q", 2**40)),
        (BitVectorOutput(b"\x05\x01", 9), b"B", struct.pack("<Q", 9) + b"\x05\x01"),
        (HashedOutput(7, 11), b"H", struct.pack("<QQ", 7, 11)),
        (NumericOutput(-0.25), b"N", struct.pack("<d", -0.25)),
        (IndexBitOutput(5, True), b"I", struct.pack("<Q?", 5, True)),
    ],
)
def test_content_digest_encoding_is_unchanged(
    deployment: Deployment, now: int, output: Output, kind: bytes, encoded: bytes
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    ct = coarse(now)
    expected = _reference_digest(policy, ct, kind, encoded)
    assert (
        content_digest(
            policy_id=policy.policy_id,
            policy_version=policy.version,
            policy_digest=policy.digest,
            coarse_time=ct,
            output=output,
        )
        == expected
    )
    # One state serves every report of its policy: finishing a digest leaves it as it was.
    state = digest_state(policy.policy_id, policy.version, policy.digest)
    assert digest_from_state(state, ct - 3600, output) == _reference_digest(
        policy, ct - 3600, kind, encoded
    )
    assert digest_from_state(state, ct, output) == expected


# --- the response ----------------------------------------------------------------------


def test_response_from_wire_bytes_is_the_built_message() -> None:
    values = [v for v in pb.Outcome.values()]
    ids = [secrets.token_bytes(16) for _ in values]
    built = pb.SubmitResponse()
    for rid, outcome in zip(ids, values, strict=True):
        built.outcomes.add(report_id=rid, outcome=outcome)
    fast = _ledger_response(iter(ids), values)
    assert fast == built
    assert fast.SerializeToString() == built.SerializeToString()
    assert _ledger_response(iter([]), []) == pb.SubmitResponse()


# --- the service: validation order and reused outputs ----------------------------------


@pytest.fixture(scope="module")
def extra(deployment: Deployment) -> dict[str, VerifiedPolicy]:
    """Two more policies, signed once for the module (before any registry is built)."""
    return {
        "wide": deployment.verified(  # grr over 8 labels
            deployment.add_categorical("wide", labels=tuple("abcdefgh"), epsilon="0.01")
        ),
        "tenth": deployment.verified(  # ε 0.1, cap 1: ten reports fit exactly
            deployment.add_categorical("tenth", epsilon="0.1", epsilon_cap="1")
        ),
    }


@pytest.fixture
def service(
    deployment: Deployment, extra: dict[str, VerifiedPolicy], sqlite_url: str, now: int
) -> Iterator[CollectorService]:
    ledger = open_ledger(sqlite_url, shard="svc")
    metrics = CollectorMetrics()
    committer = GroupCommitter(ledger, metrics, max_reports=1000, delay_seconds=0.0)
    yield CollectorService(deployment.registry(), ledger, committer, metrics, Limits(), lambda: now)
    committer.close()
    ledger.close()


def _outcomes(response: pb.SubmitResponse) -> list[tuple[int, int]]:
    return [(o.outcome, o.reason) for o in response.outcomes]


def test_the_first_failing_check_is_the_reported_one(
    service: CollectorService, deployment: Deployment, now: int
) -> None:
    """Reports failing two checks: the earlier one (module docstring order) is reported."""
    policy = deployment.verified(deployment.envelopes[0])
    ct = coarse(now)
    dup_id = secrets.token_bytes(16)
    unknown = make_report(policy, CategoryOutput(0), report_id=b"short", coarse_time=ct)
    unknown.policy_id = "no-such-policy"
    dup = make_report(policy, CategoryOutput(0), report_id=dup_id, coarse_time=ct, digest=b"x")
    unknown_late = make_report(policy, CategoryOutput(0), coarse_time=ct + 1)
    unknown_late.policy_id = "no-such-policy"
    mismatch = make_report(policy, CategoryOutput(99), coarse_time=ct, digest=b"\x00" * 32)
    late_missing = make_report(policy, CategoryOutput(0), coarse_time=ct + 1)
    late_missing.ClearField("category")
    tiny = make_report(policy, CategoryOutput(0), report_id=b"tiny", coarse_time=ct)
    cases = [
        (unknown, pb.OUTCOME_INVALID, pb.REJECT_REASON_MALFORMED_REPORT_ID),
        (tiny, pb.OUTCOME_INVALID, pb.REJECT_REASON_MALFORMED_REPORT_ID),
        (tiny, pb.OUTCOME_INVALID, pb.REJECT_REASON_MALFORMED_REPORT_ID),
        (dup, pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
        (dup, pb.OUTCOME_INVALID, pb.REJECT_REASON_DUPLICATE_IN_BATCH),
        (unknown_late, pb.OUTCOME_UNKNOWN_POLICY, 0),
        (mismatch, pb.OUTCOME_INVALID, pb.REJECT_REASON_DIGEST_MISMATCH),
        (late_missing, pb.OUTCOME_INVALID, pb.REJECT_REASON_BAD_COARSE_TIME),
        (
            make_report(policy, CategoryOutput(1), coarse_time=-3600),
            pb.OUTCOME_INVALID,
            pb.REJECT_REASON_BAD_COARSE_TIME,
        ),
        (make_report(policy, CategoryOutput(1), coarse_time=ct), pb.OUTCOME_ACCEPTED, 0),
    ]
    response = service.submit("alice", pb.SubmitRequest(reports=[c[0] for c in cases]))
    assert _outcomes(response) == [(c[1], c[2]) for c in cases]
    assert [o.report_id for o in response.outcomes] == [c[0].report_id for c in cases]


def test_reused_outputs_are_checked_per_policy(
    service: CollectorService, deployment: Deployment, extra: dict[str, VerifiedPolicy], now: int
) -> None:
    """A category accepted before is reused; other indices and kinds are still checked;
    content digests remembered per policy and coarse time are the computed ones."""
    color = deployment.verified(deployment.envelopes[0])  # grr over 4 labels, ε 0.5, cap 2
    wide = extra["wide"]
    ct = coarse(now)
    first = pb.SubmitRequest(
        reports=[make_report(color, CategoryOutput(i % 4), coarse_time=ct) for i in range(8)]
    )
    assert (
        _outcomes(service.submit("bob", first))
        == [(pb.OUTCOME_ACCEPTED, 0)] * 4 + [(pb.OUTCOME_BUDGET_EXHAUSTED, 0)] * 4
    )
    mixed = [
        make_report(color, CategoryOutput(4), coarse_time=ct),  # outside color's 4 labels
        make_report(wide, CategoryOutput(4), coarse_time=ct),  # inside wide's 8
        make_report(color, BitVectorOutput(b"\x01", 4), coarse_time=ct),
        make_report(color, NumericOutput(math.inf), coarse_time=ct),
        make_report(wide, CategoryOutput(4), coarse_time=ct - 3600),
        make_report(wide, CategoryOutput(8), coarse_time=ct),
        make_report(color, CategoryOutput(3), coarse_time=ct),
        make_report(wide, CategoryOutput(3), coarse_time=ct),  # same content, other policy
    ]
    for _ in range(2):  # the second time, every valid category (and digest) was seen before
        prepared = service.prepare("carol", pb.SubmitRequest(reports=mixed))
        assert [o.reason if o is not None else None for o in prepared.outcomes] == [
            pb.REJECT_REASON_OUT_OF_DOMAIN,
            None,
            pb.REJECT_REASON_WRONG_PAYLOAD_TYPE,
            pb.REJECT_REASON_NON_FINITE,
            None,
            pb.REJECT_REASON_OUT_OF_DOMAIN,
            None,
            None,
        ]
        assert prepared.positions == [1, 4, 6, 7]
        for pos, checked in zip(prepared.positions, prepared.batch.reports, strict=True):
            report = mixed[pos]
            assert checked.report_id == report.report_id
            assert checked.policy.digest == report.policy_digest
            assert checked.output == CategoryOutput(report.category.index)
            assert checked.coarse_time == report.coarse_time
            assert checked.content_digest == content_digest(
                policy_id=report.policy_id,
                policy_version=report.policy_version,
                policy_digest=report.policy_digest,
                coarse_time=report.coarse_time,
                output=CategoryOutput(report.category.index),
            )


# --- a request's bytes -------------------------------------------------------------------


def _entry(report_bytes: bytes) -> bytes:
    """One `reports` entry of a SubmitRequest's encoding (field 1, its length, then it)."""
    return b"\x0a" + _varint(len(report_bytes)) + report_bytes


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _prepared_alike(service: CollectorService, body: bytes) -> None:
    """`prepare` from the bytes gives exactly what it gives from the parsed message."""
    request = pb.SubmitRequest.FromString(body)
    plain = service.prepare("erin", request)
    fast = service.prepare("erin", request, body)
    assert fast.batch == plain.batch
    assert fast.positions == plain.positions
    assert fast.outcomes == plain.outcomes


def _request_cases(deployment: Deployment, wide: VerifiedPolicy, now: int) -> list[bytes]:
    """Request bodies in the SDK's layout and in every other one a client may send."""
    color = deployment.verified(deployment.envelopes[0])
    ct = coarse(now)
    rng = random.Random(7)

    def report(policy: VerifiedPolicy, output: Output, **fields: object) -> pb.Report:
        r = make_report(policy, output, report_id=rng.randbytes(16), coarse_time=ct)
        for name, value in fields.items():
            setattr(r, name, value)
        return r

    usual = [report(color, CategoryOutput(i % 4)) for i in range(12)]
    usual += [report(wide, CategoryOutput(i % 8)) for i in range(6)]
    invalid = [
        report(color, CategoryOutput(9)),
        report(color, CategoryOutput(1), coarse_time=ct + 1),
        report(color, CategoryOutput(1), policy_id="nope"),
        report(color, CategoryOutput(1), policy_digest=b"\x00" * 32),
        report(color, BitVectorOutput(b"\x01", 4)),
        report(color, CategoryOutput(2), report_id=b"short"),
        report(color, CategoryOutput(2), report_id=b""),
        usual[3],  # an id twice in the request
    ]
    plain = b"".join(_entry(r.SerializeToString()) for r in usual + invalid)
    first = usual[0].SerializeToString()
    other_id = rng.randbytes(16)
    overridden = [
        first + b"\x0a\x10" + other_id,  # a second id field: the last one counts
        first + b"\x0a\x00",  # an empty second id: the report has none
        first[18:] + first[:18],  # the id after the content
        b"\x0a\x90\x00" + first[2:],  # the id's length as a two-byte varint
    ]
    return [
        plain,
        plain + plain[: len(_entry(first))],  # the first report twice
        b"".join(_entry(b) for b in overridden) + _entry(first),
        # the first entry's length as a two-byte varint
        b"\x0a" + bytes([len(first) | 0x80, 0]) + first + plain[len(_entry(first)) :],
        plain + b"\x12\x03abc",  # an unknown field (parsed, kept aside): read as parsed
        # one content naming an id (the first report's) after the content: both
        # reports have that id, whatever id begins them
        _entry(first + b"\x0a\x10" + first[2:18])
        + _entry(b"\x0a\x10" + other_id + first[18:] + b"\x0a\x10" + first[2:18]),
        _entry(report(color, CategoryOutput(1), policy_id="p" * 200).SerializeToString()),
        b"",
    ]


def test_prepare_from_bytes_is_prepare_from_the_message(
    service: CollectorService, deployment: Deployment, extra: dict[str, VerifiedPolicy], now: int
) -> None:
    """Reports whose content repeats are checked once per request from their bytes:
    the same batch, outcomes and positions as checking each parsed report, for
    every layout (a repeated or empty id field after the content, the id last,
    non-minimal lengths, unknown fields, long reports)."""
    for body in _request_cases(deployment, extra["wide"], now):
        _prepared_alike(service, body)


def test_prepare_from_mutated_bytes_is_prepare_from_the_message(
    service: CollectorService, deployment: Deployment, extra: dict[str, VerifiedPolicy], now: int
) -> None:
    """The same for 1,500 random mutations of those bodies that still parse (fixed seed)."""
    rng = random.Random(20261207)
    bodies = [b for b in _request_cases(deployment, extra["wide"], now) if b]
    tried = 0
    while tried < 1500:
        body = bytearray(rng.choice(bodies))
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(body))
            op = rng.randrange(3)
            if op == 0:
                body[at] = rng.randrange(256)
            elif op == 1:
                body[at:at] = rng.randbytes(rng.randrange(1, 20))
            else:
                del body[at : at + rng.randrange(1, 20)]
        try:
            pb.SubmitRequest.FromString(bytes(body))
        except DecodeError:
            continue
        tried += 1
        _prepared_alike(service, bytes(body))


# --- the ledger ------------------------------------------------------------------------


def test_sqlite_stores_blobs_as_blobs(sqlite_url: str, deployment: Deployment, now: int) -> None:
    """bytearray parameters store the same BLOB values a bytes parameter would."""
    policy = deployment.verified(deployment.envelopes[0])
    report = checked_report(policy, 2)
    with open_ledger(sqlite_url, shard="s") as ledger:
        assert ledger.submit("dana", [report], now=now) == [ACCEPTED]
        assert ledger.submit("dana", [report], now=now) == [DUPLICATE]
        assert ledger.has_report(report.report_id)
    engine = sa.create_engine(sqlite_url)
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT typeof(report_id), typeof(policy_digest), typeof(content_digest),"
            " report_id, policy_digest, content_digest FROM reports"
        ).one()
    engine.dispose()
    assert tuple(row[:3]) == ("blob", "blob", "blob")
    assert (bytes(row[3]), bytes(row[4]), bytes(row[5])) == (
        report.report_id,
        policy.digest,
        report.content_digest,
    )


def test_ids_repeated_across_a_groups_requests(
    ledger: Ledger, deployment: Deployment, now: int
) -> None:
    """An id in two requests of one group (a retry racing its original) is charged once."""
    policy = deployment.verified(deployment.envelopes[0])  # ε 0.5, cap 2
    window = policy.window_start(now)

    def other_content(report: CheckedReport) -> CheckedReport:
        digest = hashlib.sha256(b"other" + report.content_digest).digest()
        return CheckedReport(report.report_id, policy, CategoryOutput(2), digest, 0)

    # No id stored before: the repeats are within the group only.
    first = checked_report(policy, 1)
    outcomes = ledger.submit_many(
        [
            SubmitBatch("erin", [first], now),
            SubmitBatch("erin", [first, checked_report(policy, 3)], now),
            SubmitBatch("fred", [other_content(first)], now),
        ]
    )
    assert outcomes == [[ACCEPTED], [DUPLICATE, ACCEPTED], [CONFLICT]]
    assert ledger.spent("erin", policy.policy_id, window) == Decimal("1.0")
    # With an id stored before, too.
    shared = checked_report(policy, 2)
    outcomes = ledger.submit_many(
        [
            SubmitBatch("erin", [shared], now),
            SubmitBatch("erin", [shared, first], now),
            SubmitBatch("fred", [other_content(shared), checked_report(policy, 2)], now),
        ]
    )
    assert outcomes == [[ACCEPTED], [DUPLICATE, DUPLICATE], [CONFLICT, ACCEPTED]]
    assert ledger.spent("erin", policy.policy_id, window) == Decimal("1.5")
    assert ledger.spent("fred", policy.policy_id, window) == Decimal("0.5")
    assert ledger.conflict_count("fred") == 2
    assert ledger.report_count(policy.policy_id, policy.version) == 4
    assert ledger.reconcile() == []


def test_interleaved_policies_in_one_request_are_charged_in_order(
    ledger: Ledger, deployment: Deployment, extra: dict[str, VerifiedPolicy], now: int
) -> None:
    """Runs of one policy's reports alternate; each policy's cap cuts in at its own place."""
    half = deployment.verified(deployment.envelopes[0])  # ε 0.5, cap 2: four fit
    tenth = extra["tenth"]  # ten fit exactly
    reports = [checked_report(half if i % 3 == 0 else tenth, i % 4) for i in range(24)]
    outcomes = ledger.submit("gina", reports, now=now)
    expected: list[int] = []
    charged = {half.policy_id: 0, tenth.policy_id: 0}
    fits = {half.policy_id: 4, tenth.policy_id: 10}
    for r in reports:
        ok = charged[r.policy.policy_id] < fits[r.policy.policy_id]
        charged[r.policy.policy_id] += ok
        expected.append(ACCEPTED if ok else BUDGET_EXHAUSTED)
    assert outcomes == expected
    window = half.window_start(now)
    assert ledger.spent("gina", half.policy_id, window) == Decimal("2.0")
    assert ledger.spent("gina", tenth.policy_id, window) == Decimal("1.0")
    assert ledger.report_count(tenth.policy_id, tenth.version) == 10
    assert ledger.reconcile() == []


def test_a_request_refused_entirely_leaves_statistics_alone(
    ledger_url: str, ledger: Ledger, deployment: Deployment, now: int
) -> None:
    """Nothing accepted under a policy in a group: no statistics row is written for it."""
    policy = deployment.verified(deployment.envelopes[0])  # ε 0.5, cap 2
    assert (
        ledger.submit("hana", [checked_report(policy, i) for i in range(4)], now=now)
        == [ACCEPTED] * 4
    )
    with open_ledger(ledger_url, shard="shard-b") as other:
        refused = other.submit(
            "hana", [checked_report(policy, 1), checked_report(policy, 2)], now=now
        )
        assert refused == [BUDGET_EXHAUSTED] * 2
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        shards = conn.execute(
            sa.select(statistics.c.shard).where(statistics.c.policy_id == policy.policy_id)
        ).all()
    engine.dispose()
    assert [row.shard for row in shards] == ["shard-a"]
    assert ledger.reconcile() == []


@pytest.mark.parametrize("read_after_repeat", [0, 64], ids=["ids-unread", "ids-read"])
def test_groups_match_charging_one_report_at_a_time(
    ledger: Ledger,
    deployment: Deployment,
    extra: dict[str, VerifiedPolicy],
    now: int,
    read_after_repeat: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Random groups (fixed seed) against a model that charges report by report.

    The ledger plans a group before its transaction (rows, and every output
    accumulated per statistics row) and accepts a run of one policy's reports at
    once when it fits under the cap; this pins that the outcomes, the spend and the
    statistics are those of charging each report in order, with runs that fit,
    runs cut by the cap, ids repeated inside a group and ids stored before —
    each group deciding without reading its ids first (and rerun when one was
    stored), or reading them after a repeat.
    """
    monkeypatch.setattr(ingest, "_READ_IDS_AFTER_A_REPEAT", read_after_repeat)
    rng = random.Random(20261130)
    half = deployment.verified(deployment.envelopes[0])  # ε 0.5, cap 2
    policies = [half, extra["tenth"], extra["wide"]]  # caps cut in after 4, 10, 100
    subjects = ["ines", "jon", "kai"]
    known: dict[bytes, tuple[str, bytes]] = {}
    spent: dict[tuple[str, str], Decimal] = {}
    accepted_outputs: dict[str, list[int]] = {p.policy_id: [] for p in policies}
    stored_ids: list[bytes] = []
    for group in range(16):
        reuse = group % 2 == 1  # half the groups have new ids only (the common case)
        batches: list[SubmitBatch] = []
        for _request in range(rng.randint(1, 4)):
            subject = rng.choice(subjects)
            reports: list[CheckedReport] = []
            policy = rng.choice(policies)
            for _ in range(rng.randint(1, 14)):
                if rng.random() < 0.3:  # runs of one policy, sometimes interleaved
                    policy = rng.choice(policies)
                roll = rng.random() if reuse else 1.0
                if roll < 0.1 and stored_ids:  # an id stored before (retry or reuse)
                    rid = rng.choice(stored_ids)
                elif roll < 0.15 and reports:  # an id used earlier in this request
                    rid = reports[rng.randrange(len(reports))].report_id
                else:
                    rid = secrets.token_bytes(16)
                reports.append(checked_report(policy, rng.randrange(2), report_id=rid))
            batches.append(SubmitBatch(subject, reports, now))
        expected: list[list[int]] = []
        for batch in batches:
            out: list[int] = []
            for r in batch.reports:
                prior = known.get(r.report_id)
                if prior is not None:
                    out.append(
                        DUPLICATE if prior == (batch.subject, r.content_digest) else CONFLICT
                    )
                    continue
                key = (batch.subject, r.policy.policy_id)
                total = spent.get(key, Decimal(0)) + r.policy.charge
                if total > r.policy.epsilon_cap:
                    out.append(BUDGET_EXHAUSTED)
                    continue
                spent[key] = total
                known[r.report_id] = (batch.subject, r.content_digest)
                stored_ids.append(r.report_id)
                accepted_outputs[r.policy.policy_id].append(cast(CategoryOutput, r.output).index)
                out.append(ACCEPTED)
            expected.append(out)
        assert ledger.submit_many(batches) == expected
    window = half.window_start(now)
    for (subject, policy_id), total in spent.items():
        assert ledger.spent(subject, policy_id, window) == total
    for policy in policies:
        mech = policy.mechanism
        merged = mech.new_statistic()
        for part in ledger.statistics(policy.policy_id, policy.version):
            mech.merge_statistics(merged, mech.statistic_from_json(part.statistic_json or ""))
        reference = mech.new_statistic()
        for index in accepted_outputs[policy.policy_id]:
            mech.accumulate(reference, CategoryOutput(index))
        assert mech.statistic_to_json(merged) == mech.statistic_to_json(reference)
    assert ledger.reconcile() == []


def test_stored_rows_hold_each_reports_own_and_its_policys_values(
    ledger_url: str,
    ledger: Ledger,
    deployment: Deployment,
    extra: dict[str, VerifiedPolicy],
    now: int,
) -> None:
    """Reports of two policies interleaved across two requests of one group: each
    stored row has its report's values and its own policy's (bound once per policy)."""
    half = deployment.verified(deployment.envelopes[0])
    tenth = extra["tenth"]
    first = [checked_report(half, 1), checked_report(tenth, 2), checked_report(half, 3)]
    second = [replace_time(checked_report(tenth, 0), coarse(now))]
    assert ledger.submit_many(
        [SubmitBatch("lea", first, now), SubmitBatch("max", second, now + 7)]
    ) == [[ACCEPTED] * 3, [ACCEPTED]]
    engine = sa.create_engine(ledger_url)
    with engine.connect() as conn:
        rows = {bytes(r.report_id): r for r in conn.execute(sa.select(reports_table)).all()}
    engine.dispose()
    expected = [("lea", r, now) for r in first] + [("max", r, now + 7) for r in second]
    assert len(rows) == len(expected)
    for subject, report, received in expected:
        row = rows[report.report_id]
        policy = report.policy
        assert (
            row.subject,
            row.policy_id,
            row.policy_version,
            bytes(row.policy_digest),
            row.window_start,
            row.coarse_time,
            row.charge,
            row.epsilon_cap,
            bytes(row.content_digest),
            row.payload,
            row.shard,
            row.received_at,
        ) == (
            subject,
            policy.policy_id,
            policy.version,
            policy.digest,
            policy.window_start(received),
            report.coarse_time,
            str(policy.charge),
            str(policy.epsilon_cap),
            report.content_digest,
            output_to_json(report.output),
            "shard-a",
            received,
        )


def replace_time(report: CheckedReport, coarse_time: int) -> CheckedReport:
    """`report` with another coarse time (as a report made in another hour)."""
    return CheckedReport(
        report.report_id, report.policy, report.output, report.content_digest, coarse_time
    )


def test_stored_ids_are_found_without_reading_them_first(
    ledger_url: str, deployment: Deployment, extra: dict[str, VerifiedPolicy], now: int
) -> None:
    """A group decides its reports as new unless a recent group met a stored id: a
    stored id among its accepted reports fails the insert (primary key), one among
    its refused ones is looked up; either way the group reruns reading its ids, and
    so do the groups after it."""
    tenth = extra["tenth"]  # ε 0.1, cap 1
    first = [checked_report(tenth, i % 2) for i in range(10)]  # fills "olga"'s cap
    with open_ledger(ledger_url, shard="a") as ledger:
        assert ledger.submit("olga", first[:5], now=now) == [ACCEPTED] * 5
        assert ledger.stored_id_reruns == 0
    fresh = checked_report(tenth, 1)
    reused = CheckedReport(first[1].report_id, tenth, CategoryOutput(0), b"\x01" * 32, 0)
    with open_ledger(ledger_url, shard="a") as ledger:  # nothing met yet: ids unread
        # a stored id accepted as new would be inserted: the primary key refuses it
        assert ledger.submit_many(
            [
                SubmitBatch("olga", [first[0], fresh], now),
                SubmitBatch("pia", [reused], now),
            ]
        ) == [[DUPLICATE, ACCEPTED], [CONFLICT]]
        assert ledger.stored_id_reruns == 1
        # the next groups read their ids first: no rerun
        assert ledger.submit("olga", [first[2], *first[5:]], now=now) == [
            DUPLICATE,
            *[ACCEPTED] * 4,
            BUDGET_EXHAUSTED,  # `fresh` took one place
        ]
        assert ledger.stored_id_reruns == 1
    with open_ledger(ledger_url, shard="a") as ledger:  # ids unread again
        # "olga" is at her cap: the stored report is refused for the cap first,
        # not inserted, so it is looked up
        assert ledger.submit("olga", [checked_report(tenth), first[3]], now=now) == [
            BUDGET_EXHAUSTED,
            DUPLICATE,
        ]
        assert ledger.stored_id_reruns == 1
        window = tenth.window_start(now)
        assert ledger.spent("olga", tenth.policy_id, window) == Decimal("1.0")
        assert ledger.spent("pia", tenth.policy_id, window) == Decimal(0)
        assert ledger.conflict_count("pia") == 1
        assert ledger.report_count(tenth.policy_id, tenth.version) == 10
        assert ledger.reconcile() == []
