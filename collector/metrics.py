"""Prometheus metrics of one collector (its own registry; no payload or subject labels).

Labels are bounded enums only: outcome and reject reason names, gRPC method and
status code names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


class CollectorMetrics:
    """Every metric the collector exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._add_request_metrics(r)
        self._add_ledger_metrics(r)
        self._add_policy_metrics(r)

    def _add_request_metrics(self, r: CollectorRegistry) -> None:
        """Reports by outcome, RPCs by code, and the refusals before the service."""
        self.reports = Counter(
            "fedldp_collector_reports",
            "Reports by outcome and reject reason",
            ["outcome", "reason"],
            registry=r,
        )
        self.requests = Counter(
            "fedldp_collector_requests",
            "RPCs by method and gRPC status code",
            ["method", "code"],
            registry=r,
        )
        self.budget_exhausted = Counter(
            "fedldp_collector_budget_exhaustions",
            "Reports refused because the subject's window cap was reached",
            registry=r,
        )
        self.rate_limited = Counter(
            "fedldp_collector_rate_limited",
            "Requests refused by the per-subject rate limit",
            registry=r,
        )
        self.refusals = Counter(
            "fedldp_collector_refusals",
            "Requests refused before the service, by error: UnauthenticatedError, "
            "RateLimitedError, OverloadedError, MalformedRequestError, BatchTooLargeError, "
            "ShuttingDownError, LedgerUnavailableError",
            ["error"],
            registry=r,
        )
        self.shed = Counter(
            "fedldp_collector_shed",
            "Requests refused for overload (RESOURCE_EXHAUSTED with retry-after-ms), by "
            "the limit reached: requests (max_concurrent_rpcs) or request bytes "
            "(max_inflight_bytes, max_connection_inflight_bytes)",
            ["limit"],
            registry=r,
        )

    def _add_ledger_metrics(self, r: CollectorRegistry) -> None:
        """Group commits (latency, sizes), ledger errors, shard routing and reruns."""
        self.commit_seconds = Histogram(
            "fedldp_collector_ledger_commit_seconds",
            "Ledger transaction latency (one group commit), seconds",
            buckets=_COMMIT_BUCKETS,
            registry=r,
        )
        self.commit_reports = Histogram(
            "fedldp_collector_commit_batch_reports",
            "Reports per ledger transaction",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.commit_requests = Histogram(
            "fedldp_collector_commit_batch_requests",
            "Requests per ledger transaction",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.request_reports = Histogram(
            "fedldp_collector_request_reports",
            "Reports per Submit request",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.ledger_errors = Counter(
            "fedldp_collector_ledger_errors", "Ledger transactions that failed", registry=r
        )
        self.shard_requests = Counter(
            "fedldp_collector_shard_requests",
            "Submit requests handed to each ledger shard (ledger_shards; shard is its "
            "index), by result: ok, or unavailable (the shard's transaction or routing "
            "read failed: nothing stored, the device retries)",
            ["shard", "result"],
            registry=r,
        )
        self.ledger_reruns = Counter(
            "fedldp_collector_ledger_reruns",
            "Ledger transactions rerun, by reason: conflict (a serialization failure, "
            "deadlock or changed row) or stored_id (a group decided as new met a stored "
            "report id; it reruns reading them)",
            ["reason"],
            registry=r,
        )

    def _add_policy_metrics(self, r: CollectorRegistry) -> None:
        """Policy activation refusals and reloads, and the commit queue's depth."""
        self.policy_refusals = Counter(
            "fedldp_collector_policy_refusals",
            "Policy versions refused activation (at start or reload), by reason: "
            "window_changed, metric_changed, metric_taken, version_conflict or cap_lowered "
            "(see docs/collector.md)",
            ["reason"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "fedldp_collector_policy_reloads",
            "Policy folder reloads (SIGHUP) by result: ok (the new set is served) or "
            "failed (the set served before is kept)",
            ["result"],
            registry=r,
        )
        self.in_flight = Gauge(
            "fedldp_collector_commit_queue_requests",
            "Requests waiting for the ledger",
            registry=r,
            multiprocess_mode="livesum",  # summed over live processes (supervisor.py)
        )

    def text(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
