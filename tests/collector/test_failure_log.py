"""A ledger (shard) outage does not flood the log (issue 34, item 5): failed group
transactions are counted, at most 10 ERROR lines per 10 s are written, each
naming the shard (index and database, password hidden) and the error class, and
one summary line reports how many were left out."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import sqlalchemy as sa
from collector_testkit import Deployment, checked_report
from fedldp.collector.committer import FailureLog, GroupCommitter
from fedldp.collector.errors import LedgerUnavailableError
from fedldp.collector.ledger import SubmitBatch, open_ledger
from fedldp.collector.metrics import CollectorMetrics


def test_a_shard_outage_writes_a_bounded_number_of_lines_naming_the_shard(
    deployment: Deployment, sqlite_url: str, now: int, caplog: pytest.LogCaptureFixture
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    clock = [0.0]
    ledger = open_ledger(sqlite_url)
    metrics = CollectorMetrics()

    def down(_batches: object) -> list[list[Any]]:
        raise sa.exc.OperationalError("COMMIT", {}, Exception("connection refused"))

    ledger.submit_many = down  # type: ignore[method-assign,assignment]  # the shard is down
    committer = GroupCommitter(
        ledger, metrics, shard_index=1, failure_log=FailureLog(clock=lambda: clock[0])
    )
    caplog.set_level(logging.ERROR, logger="fedldp.collector.committer")
    try:
        for i in range(60):
            with pytest.raises(LedgerUnavailableError):
                committer.submit(SubmitBatch(f"s{i}", [checked_report(policy)], now))
        clock[0] = 10.0  # the next interval: the summary, then one more line
        with pytest.raises(LedgerUnavailableError):
            committer.submit(SubmitBatch("late", [checked_report(policy)], now))
    finally:
        committer.close()
        ledger.close()
    failed = [r for r in caplog.records if r.getMessage() == "ledger transaction failed"]
    summaries = [r for r in caplog.records if r.getMessage() == "ledger failures not logged"]
    assert len(failed) == 11  # 10 in the first interval, 1 in the next
    for record in failed:
        fields = record.fields  # type: ignore[attr-defined]
        assert fields["shard"] == 1 and fields["error"] == "OperationalError"
        assert fields["database"].endswith("ledger.db")
    assert [r.fields["count"] for r in summaries] == [50]  # type: ignore[attr-defined]
    errors = metrics.registry.get_sample_value("fedldp_collector_ledger_errors_total")
    assert errors == 61  # every failure counted
