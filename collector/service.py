"""The service layer: what each RPC means, independent of gRPC.

handler (server.py) -> `CollectorService` method -> unit of work (the ledger,
through the group committer) -> tables. Per-report problems become Outcomes and
RejectReasons; request-level problems raise `fedldp.collector.errors` errors.

Validation order per report (the first failure is the one reported):
report id (16 bytes) -> duplicate id within the request -> policy (id, version,
digest) active -> coarse time (on the hour, not in the future beyond the clock
skew, not older than the maximum age) -> payload kind, finiteness and output
domain (the mechanism's own `check_output`). Only reports passing all of them
reach the ledger, which decides ACCEPTED / DUPLICATE / BUDGET_EXHAUSTED /
CONFLICT in one transaction.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedldp.client.mechanisms.base import OutputDomainError
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.errors import BatchTooLargeError
from fedldp.collector.ledger import CheckedReport, Ledger, SubmitBatch
from fedldp.collector.ledger.store import EXACT, OutcomeValue
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.policies import Lookup, PolicyRegistry
from fedldp.collector.wire import (
    REPORT_ID_BYTES,
    digest_prefix,
    digest_with_prefix,
    output_from_report,
)
from fedldp.v1 import collector_pb2 as pb

log = logging.getLogger(__name__)

COARSE_TIME_UNIT = 3600  # reports carry Unix seconds truncated to the hour (collector.proto)

_OUTCOME_NAMES = {
    v: pb.Outcome.Name(v).removeprefix("OUTCOME_").lower() for v in pb.Outcome.values()
}
_REASON_NAMES = {
    v: pb.RejectReason.Name(v).removeprefix("REJECT_REASON_").lower()
    for v in pb.RejectReason.values()
}


@dataclass
class Prepared:
    """A validated request: the batch for the ledger and the outcomes known already."""

    batch: SubmitBatch
    outcomes: list[pb.ReportOutcome | None]
    positions: list[int]  # index in the request of each report in `batch`


@dataclass(frozen=True)
class Limits:
    """Request limits (see CollectorConfig for their meaning and defaults)."""

    max_reports_per_request: int = 1000
    max_report_age_seconds: int = 30 * 86400
    max_clock_skew_seconds: int = 3600


def _invalid(report_id: bytes, reason: int, detail: str) -> pb.ReportOutcome:
    return pb.ReportOutcome(
        report_id=report_id,
        outcome=pb.OUTCOME_INVALID,
        reason=reason,  # type: ignore[arg-type]
        detail=detail,
    )


class CollectorService:
    """Submit, GetPolicies and GetBudget for an authenticated subject."""

    def __init__(
        self,
        registry: PolicyRegistry,
        ledger: Ledger,
        committer: GroupCommitter,
        metrics: CollectorMetrics,
        limits: Limits,
        clock: Callable[[], int],
    ) -> None:
        self.registry = registry
        self.ledger = ledger
        self.committer = committer
        self.metrics = metrics
        self.limits = limits
        self.clock = clock

    # -- Submit --

    def submit(self, subject: str, request: pb.SubmitRequest) -> pb.SubmitResponse:
        """Validate every report, charge the valid ones in one transaction; one outcome each.

        Blocks until the ledger commit (group commit: see committer.py).
        """
        prepared = self.prepare(subject, request)
        ledger_outcomes = self.committer.submit(prepared.batch) if prepared.batch.reports else []
        return self.finish(prepared, ledger_outcomes)

    def prepare(self, subject: str, request: pb.SubmitRequest) -> Prepared:
        """Validate a request: per-report outcomes for the invalid, a batch for the ledger."""
        count = len(request.reports)
        if count > self.limits.max_reports_per_request:
            raise BatchTooLargeError(
                f"{count} reports in one request; the limit is "
                f"{self.limits.max_reports_per_request}: split the batch",
                metadata=(("max-reports-per-request", str(self.limits.max_reports_per_request)),),
            )
        self.metrics.request_reports.observe(count)
        now = self.clock()
        id_counts = Counter(r.report_id for r in request.reports)
        outcomes: list[pb.ReportOutcome | None] = [None] * count
        checked: list[CheckedReport] = []
        positions: list[int] = []
        cache: dict[tuple[str, int, bytes], tuple[Lookup, VerifiedPolicy | None, bytes]] = {}
        for i, report in enumerate(request.reports):
            result = self._check(report, now, id_counts, cache)
            if isinstance(result, CheckedReport):
                checked.append(result)
                positions.append(i)
            else:
                outcomes[i] = result
        return Prepared(SubmitBatch(subject, checked, now), outcomes, positions)

    def finish(
        self, prepared: Prepared, ledger_outcomes: Sequence[OutcomeValue]
    ) -> pb.SubmitResponse:
        """The response, once the ledger committed `prepared.batch` with these outcomes."""
        outcomes = prepared.outcomes
        for pos, rep, outcome in zip(
            prepared.positions, prepared.batch.reports, ledger_outcomes, strict=True
        ):
            outcomes[pos] = pb.ReportOutcome(report_id=rep.report_id, outcome=outcome)
        response = pb.SubmitResponse(outcomes=[o for o in outcomes if o is not None])
        assert len(response.outcomes) == len(outcomes)
        tally = Counter((o.outcome, o.reason) for o in response.outcomes)
        for (outcome, reason), n in tally.items():
            self.metrics.reports.labels(_OUTCOME_NAMES[outcome], _REASON_NAMES[reason]).inc(n)
            if outcome == pb.OUTCOME_BUDGET_EXHAUSTED:
                self.metrics.budget_exhausted.inc(n)
        return response

    def _check(
        self,
        report: pb.Report,
        now: int,
        id_counts: Counter[bytes],
        cache: dict[tuple[str, int, bytes], tuple[Lookup, VerifiedPolicy | None, bytes]],
    ) -> CheckedReport | pb.ReportOutcome:
        rid = report.report_id
        if len(rid) != REPORT_ID_BYTES:
            return _invalid(
                rid,
                pb.REJECT_REASON_MALFORMED_REPORT_ID,
                f"report_id must be exactly {REPORT_ID_BYTES} bytes",
            )
        if id_counts[rid] > 1:
            return _invalid(
                rid,
                pb.REJECT_REASON_DUPLICATE_IN_BATCH,
                "this report_id appears more than once in the request",
            )
        key = (report.policy_id, report.policy_version, report.policy_digest)
        found = cache.get(key)
        if found is None:
            looked_up = self.registry.lookup(*key, now=now)
            found = cache[key] = (*looked_up, digest_prefix(*key))
        status, policy, prefix = found
        if status is Lookup.UNKNOWN:
            return pb.ReportOutcome(
                report_id=rid,
                outcome=pb.OUTCOME_UNKNOWN_POLICY,
                detail="no such policy id and version here; fetch policies",
            )
        if status is Lookup.DIGEST_MISMATCH:
            return _invalid(
                rid,
                pb.REJECT_REASON_DIGEST_MISMATCH,
                "policy_digest does not match this policy version's signed bytes",
            )
        if status is Lookup.INACTIVE:
            return pb.ReportOutcome(
                report_id=rid,
                outcome=pb.OUTCOME_EXPIRED_POLICY,
                detail="the policy is expired, not yet valid or retired",
            )
        assert policy is not None
        ct = report.coarse_time
        if (
            ct % COARSE_TIME_UNIT != 0
            or ct > now + self.limits.max_clock_skew_seconds
            or ct < now - self.limits.max_report_age_seconds
            or ct < 0
        ):
            return _invalid(
                rid,
                pb.REJECT_REASON_BAD_COARSE_TIME,
                "coarse_time must be on the hour, not in the future and not older "
                f"than {self.limits.max_report_age_seconds} s",
            )
        try:
            output = output_from_report(report)
            policy.mechanism.check_output(output)
        except OutputDomainError as exc:
            reason = pb.RejectReason.Value(f"REJECT_REASON_{exc.reason}")
            return _invalid(rid, reason, str(exc))
        return CheckedReport(rid, policy, output, digest_with_prefix(prefix, ct, output), ct)

    # -- GetPolicies --

    def get_policies(self, request: pb.GetPoliciesRequest) -> pb.GetPoliciesResponse:
        """Roots newer than the device's, and the active policy envelopes."""
        now = self.clock()
        return pb.GetPoliciesResponse(
            roots=self.registry.roots_after(request.known_root_version),
            policies=[p.envelope for p in self.registry.active(now=now, metric=request.metric)],
        )

    # -- GetBudget --

    def get_budget(self, subject: str, request: pb.GetBudgetRequest) -> pb.GetBudgetResponse:
        """What `subject` spent and has left in the current window of each active policy."""
        now = self.clock()
        out = pb.GetBudgetResponse()
        for p in self.registry.active(now=now, policy_id=request.policy_id):
            start = p.window_start(now)
            spent = self.ledger.spent(subject, p.policy_id, start)
            left = max(EXACT.subtract(p.epsilon_cap, spent), type(spent)(0))
            out.budgets.add(
                policy_id=p.policy_id,
                policy_version=p.version,
                window_start=start,
                window_end=start + p.window_seconds,
                epsilon_cap=str(p.epsilon_cap),
                epsilon_spent=str(spent),
                epsilon_remaining=str(left),
            )
        return out
