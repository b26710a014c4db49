"""The ingestion hot path's shortcuts keep the ledger's invariants (every store).

The ledger writes reports with multi-row statements, remembers each statistics
row it committed (and updates it only if nothing else wrote it since), reads
spend rows by primary key, and the collector remembers verified tokens. Each
test here breaks the assumption a shortcut rests on and checks the result.
"""

from __future__ import annotations

import secrets
from decimal import Decimal

import pytest
import sqlalchemy as sa
from collector_testkit import checked_report
from fedldp.client.mechanisms import CategoryOutput
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.auth import TokenAuthority
from fedldp.collector.errors import UnauthenticatedError
from fedldp.collector.ledger import ACCEPTED, CheckedReport, Ledger, SubmitBatch, open_ledger
from fedldp.collector.ledger.store import _in_statement


def _stored_statistic(ledger: Ledger, policy: VerifiedPolicy) -> tuple[int, list[int]]:
    parts = ledger.statistics(policy.policy_id, policy.version)
    assert len(parts) == 1
    stat = policy.mechanism.statistic_from_json(parts[0].statistic_json or "")
    return parts[0].n, list(stat.counts)


def test_batches_across_statement_chunks_are_stored_and_charged_exactly(
    ledger: Ledger, small_policy: VerifiedPolicy, now: int
) -> None:
    """300 + 45 reports (chunks of 256, 32, 8, 4, 1 rows) in one group commit."""
    first = [checked_report(small_policy, i % 4) for i in range(300)]
    second = [checked_report(small_policy, i % 4) for i in range(45)]
    outcomes = ledger.submit_many(
        [SubmitBatch("alice", first, now), SubmitBatch("bob", second, now)]
    )
    assert outcomes == [[ACCEPTED] * 300, [ACCEPTED] * 45]
    window = small_policy.window_start(now)
    assert ledger.spent("alice", small_policy.policy_id, window) == Decimal("0.300")
    assert ledger.spent("bob", small_policy.policy_id, window) == Decimal("0.045")
    assert ledger.report_count(small_policy.policy_id, small_policy.version) == 345
    assert all(ledger.has_report(r.report_id) for r in first + second)
    n, counts = _stored_statistic(ledger, small_policy)
    assert n == 345
    assert counts == ledger.recompute_statistics(small_policy).counts
    assert ledger.reconcile() == []


def test_statistics_row_written_by_another_ledger_is_reread(
    ledger: Ledger, ledger_url: str, small_policy: VerifiedPolicy, now: int
) -> None:
    """A remembered statistics row that someone else changed is detected and reread.

    Two Ledger objects with the same shard name write the same statistics row
    (a misconfiguration, or a restarted collector keeping its instance id):
    each one's memory of the row goes stale, and no report may be lost from it.
    """
    other = open_ledger(ledger_url, shard="shard-a")
    try:
        for round_ in range(3):
            mine = [checked_report(small_policy, round_ % 4) for _ in range(5)]
            assert ledger.submit("alice", mine, now=now) == [ACCEPTED] * 5
            assert (
                other.submit("bob", [checked_report(small_policy, 1) for _ in range(7)], now=now)
                == [ACCEPTED] * 7
            )
        n, counts = _stored_statistic(ledger, small_policy)
        assert n == 36
        assert counts == ledger.recompute_statistics(small_policy).counts
        assert ledger.retries >= 1  # the stale memory forced a rerun
        assert ledger.reconcile() == []
    finally:
        other.close()


def test_spend_rows_are_read_by_primary_key() -> None:
    """The hot path's keyed reads never scan a table (SQLite's query plan)."""
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE TABLE spend (subject TEXT, policy_id TEXT, window_start BIGINT,"
            " epsilon_spent TEXT, report_count BIGINT, epsilon_cap TEXT, updated_at BIGINT,"
            " PRIMARY KEY (subject, policy_id, window_start))"
        )
        conn.exec_driver_sql(
            "CREATE TABLE statistics (policy_id TEXT, policy_version BIGINT,"
            " window_start BIGINT, shard TEXT, n BIGINT, statistic_json TEXT,"
            " updated_at BIGINT, PRIMARY KEY (policy_id, policy_version, window_start, shard))"
        )
        conn.exec_driver_sql(
            "CREATE TABLE reports (report_id BLOB PRIMARY KEY, subject TEXT, content_digest BLOB)"
        )
        for name, size, params in [
            ("select_spend", 4, 12),
            ("select_statistics", 4, 13),
            ("select_ids", 8, 8),
            ("update_spend_values", 4, 32),
        ]:
            sql = _in_statement("sqlite", name, size)
            plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql, tuple([0] * params)).all()
            details = " | ".join(str(row[-1]) for row in plan)
            assert "USING INDEX" in details, (name, details)
            for table in ("spend", "statistics", "reports"):
                assert f"SCAN {table}" not in details, (name, details)


def test_checked_report_cannot_be_built_invalid(small_policy: VerifiedPolicy) -> None:
    good = checked_report(small_policy, 0)
    with pytest.raises(ValueError, match="16 bytes"):
        CheckedReport(b"short", small_policy, CategoryOutput(0), good.content_digest, 0)
    with pytest.raises(ValueError, match="32-byte"):
        CheckedReport(good.report_id, small_policy, CategoryOutput(0), b"x", 0)
    with pytest.raises(AttributeError):
        good.report_id = b"0" * 16  # type: ignore[misc]
    assert CheckedReport(*good) == good
    assert good.policy is small_policy and good.coarse_time == 0


def test_remembered_token_still_expires_and_forgeries_still_fail() -> None:
    authority = TokenAuthority(secrets.token_bytes(32))
    token = authority.mint("device-1", expires_at=1000)
    assert authority.verify(token, now=10) == "device-1"
    assert authority.verify(token, now=999) == "device-1"  # remembered
    with pytest.raises(UnauthenticatedError, match="expired"):
        authority.verify(token, now=1000)
    forged = token[: token.rindex(".") + 1] + "A" * 43
    with pytest.raises(UnauthenticatedError):
        authority.verify(forged, now=10)
    other = TokenAuthority(secrets.token_bytes(32))
    with pytest.raises(UnauthenticatedError):
        other.verify(token, now=10)  # remembered by `authority`, not by another secret
