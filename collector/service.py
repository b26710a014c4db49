"""The service layer: what each RPC means, independent of gRPC.

handler (server.py) -> `CollectorService` method -> unit of work (the ledger,
through the group committer) -> tables. Per-report problems become Outcomes and
RejectReasons; request-level problems raise `fedldp.collector.errors` errors.

Validation order per report (the first failure is the one reported):
report id (16 bytes) -> duplicate id within the request -> policy (id, version,
digest) active -> coarse time (on the hour, not in the future beyond the clock
skew, not older than the maximum age) -> payload kind, finiteness and output
domain (the mechanism's own `check_output`; for a shuffle-model policy, a sealed
payload of a possible length sealed to its analyzer key, which is all the
collector can check: docs/shuffle.md). Only reports passing all of them
reach the ledger, which decides ACCEPTED / DUPLICATE / BUDGET_EXHAUSTED /
CONFLICT in one transaction.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence, Set
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, NamedTuple

from fedldp.client.mechanisms.base import (
    CategoryOutput,
    Output,
    OutputDomainError,
    SealedOutput,
)
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.committer import GroupCommitter
from fedldp.collector.errors import BatchTooLargeError
from fedldp.collector.ledger import CheckedReport, Ledger, SubmitBatch
from fedldp.collector.ledger.restore import refused_by
from fedldp.collector.ledger.shards import ShardedLedger
from fedldp.collector.ledger.store import EXACT, OutcomeValue
from fedldp.collector.metrics import CollectorMetrics
from fedldp.collector.policies import Lookup, PolicyRegistry
from fedldp.collector.routing import ShardedCommitter, ledger_for
from fedldp.collector.wire import (
    REPORT_ID_BYTES,
    digest_from_state,
    digest_state,
    output_from_report,
)
from fedldp.v1 import collector_pb2 as pb
from google.protobuf.message import DecodeError

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


_NO_REASON: pb.RejectReason.ValueType = pb.REJECT_REASON_UNSPECIFIED
_REPORT_ID = itemgetter(0)  # CheckedReport.report_id, without a Python-level call


#: Bounds of what the service remembers per policy (`_Active`): at most this many
#: policies, each with at most this many checked category outputs and content
#: digests (≈ 300 KB per policy at most).
_MAX_ACTIVE = 256
_MAX_CATEGORIES = 512
_MAX_DIGESTS = 1024


class _Active(NamedTuple):
    """An active policy, as a request's reports use it."""

    policy: VerifiedPolicy
    digest_state: hashlib._Hash  # `digest_state` of its (id, version, digest)
    check_output: Callable[[Output], None]  # its mechanism's output-domain check
    # Category index -> that output, checked already (see `prepare`), at most
    # _MAX_CATEGORIES of them.
    categories: dict[int, Output]
    # (coarse time, category index) -> that report content's digest, at most
    # _MAX_DIGESTS of them (see `prepare`).
    digests: dict[tuple[int, int], bytes]
    sealed: bool  # a shuffle-model policy: it takes sealed payloads only (docs/shuffle.md)


def _sealed_check(policy: VerifiedPolicy) -> Callable[[Output], None]:
    """The output check of a shuffle-model policy: a sealed payload of a possible length,
    sealed to this policy's analyzer key. The collector cannot read more than that."""
    from fedldp.client.sealed import check_sealed_shape, key_id

    assert policy.analyzer_public_key is not None
    expected = key_id(policy.analyzer_public_key)

    def check(output: Output) -> None:
        if type(output) is not SealedOutput:
            raise OutputDomainError(
                "SEALED_REQUIRED",
                "this is a shuffle-model policy: seal the payload to its analyzer key",
            )
        check_sealed_shape(output.ciphertext)
        if output.key_id != expected:
            raise OutputDomainError(
                "MALFORMED_SEALED", "the payload is sealed to another key than the policy's"
            )

    return check


def _repeated(ids: list[bytes]) -> Set[bytes]:
    """The ids that appear more than once in `ids` (usually none)."""
    if len(set(ids)) == len(ids):
        return frozenset()
    seen: set[bytes] = set()
    twice: set[bytes] = set()
    for rid in ids:
        (twice if rid in seen else seen).add(rid)
    return twice


def _invalid(report_id: bytes, reason: int, detail: str) -> pb.ReportOutcome:
    return pb.ReportOutcome(
        report_id=report_id,
        outcome=pb.OUTCOME_INVALID,
        reason=reason,  # type: ignore[arg-type]
        detail=detail,
    )


def _ledger_response(ids: Iterable[bytes], outcomes: Sequence[OutcomeValue]) -> pb.SubmitResponse:
    """The response with `outcomes[i]` for the i-th id, in order (one outcome per id)."""
    response = pb.SubmitResponse()
    add = response.outcomes.add
    for rid, outcome in zip(ids, outcomes, strict=True):
        add(report_id=rid, outcome=outcome)
    return response


def _bad_id(report_id: bytes) -> pb.ReportOutcome:
    """The outcome of a report whose id is malformed or repeated in its request."""
    if len(report_id) != REPORT_ID_BYTES:
        return _invalid(
            report_id,
            pb.REJECT_REASON_MALFORMED_REPORT_ID,
            f"report_id must be exactly {REPORT_ID_BYTES} bytes",
        )
    return _invalid(
        report_id,
        pb.REJECT_REASON_DUPLICATE_IN_BATCH,
        "this report_id appears more than once in the request",
    )


def _unusable_policy(report_id: bytes, status: Lookup) -> pb.ReportOutcome:
    """The outcome of a report naming a policy that is not active (`status`)."""
    if status is Lookup.UNKNOWN:
        return pb.ReportOutcome(
            report_id=report_id,
            outcome=pb.OUTCOME_UNKNOWN_POLICY,
            detail="no such policy id and version here; fetch policies",
        )
    if status is Lookup.REFUSED:
        return pb.ReportOutcome(
            report_id=report_id,
            outcome=pb.OUTCOME_UNKNOWN_POLICY,
            detail="this policy version was refused activation here: it changes its policy "
            "id's budget window or metric; fetch policies",
        )
    if status is Lookup.DIGEST_MISMATCH:
        return _invalid(
            report_id,
            pb.REJECT_REASON_DIGEST_MISMATCH,
            "policy_digest does not match this policy version's signed bytes",
        )
    return pb.ReportOutcome(
        report_id=report_id,
        outcome=pb.OUTCOME_EXPIRED_POLICY,
        detail="the policy is expired, not yet valid or retired",
    )


class _Refusal(NamedTuple):
    """A report's refusal without its id: `build(report_id, *args)` is its outcome."""

    build: Callable[..., pb.ReportOutcome]
    args: tuple[Any, ...]


#: What a report's content (everything but its id) makes of it: its CheckedReport's
#: (policy, output, content digest, coarse time), or its refusal.
_Verdict = tuple[VerifiedPolicy, Output, bytes, int] | _Refusal

#: A `Report` whose encoding begins with its 16-byte id: field 1, length 16.
_ID_FIELD = b"\x0a\x10"
_ID_END = len(_ID_FIELD) + REPORT_ID_BYTES


def _varint(body: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` of `body` and the position after it; (-1, pos) if there
    is none (past the end, or longer than 5 bytes)."""
    value = shift = 0
    for i in range(pos, min(pos + 5, len(body))):
        byte = body[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return -1, pos


def _sets_no_id(content: bytes) -> bool:
    """Whether a report's encoding after its id, parsed alone, has an empty id (and
    parses: it does whenever the whole report did)."""
    try:
        return not pb.Report.FromString(content).report_id
    except DecodeError:
        return False


def _report_ids(
    request: pb.SubmitRequest, body: bytes | None
) -> tuple[list[bytes], list[bytes | None] | None]:
    """Each report's id, and its content's bytes (its encoding after the id) where
    those alone decide everything but its id, else None (all None: None).

    `body` is the bytes `request` was parsed from (None: unknown). They are read
    only when they hold nothing but `reports` entries (field 1, length-delimited),
    one per parsed report. A report's content bytes are used only when its
    encoding begins with its 16-byte id and the rest sets no id of its own: the
    rest alone, parsed, has an empty id, and the report as parsed has the id that
    begins it (together: the rest holds no field 1, which would replace the
    first). Then two reports with the same content bytes parse to the same fields
    but the id.
    """
    reports = request.reports
    count = len(reports)
    if body is None or count < 2:  # (one report: nothing to share)
        return [r.report_id for r in reports], None
    ids: list[bytes] = []
    contents: list[bytes | None] = []
    alone: dict[bytes, bool] = {}  # content bytes -> whether they set no id
    add_id, add_content = ids.append, contents.append
    pos, end, i = 0, len(body), 0
    while pos < end and i < count:
        if body[pos] != 0x0A:
            break
        length = body[pos + 1] if pos + 1 < end else -1
        start = pos + 2
        if length >= 0x80:
            length, start = _varint(body, pos + 1)
        pos = start + length
        if length < 0 or pos > end:
            break
        if body[start : start + 2] == _ID_FIELD and length >= _ID_END:
            key = start + _ID_END
            rid, content = body[start + 2 : key], body[key:pos]
            ok = alone.get(content)
            if ok is None:
                ok = alone[content] = reports[i].report_id == rid and _sets_no_id(content)
            if ok:
                add_id(rid)
                add_content(content)
                i += 1
                continue
        add_id(reports[i].report_id)
        add_content(None)
        i += 1
    else:  # no break: every entry read
        if pos == end and i == count:
            return ids, contents
    return [r.report_id for r in reports], None  # every report as parsed


class CollectorService:
    """Submit, GetPolicies and GetBudget for an authenticated subject."""

    def __init__(
        self,
        registry: PolicyRegistry,
        ledger: Ledger | ShardedLedger,
        committer: GroupCommitter | ShardedCommitter,
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
        self._report_children: dict[tuple[OutcomeValue, pb.RejectReason.ValueType], Any] = {}
        self._active: dict[tuple[str, int, bytes], _Active] = {}  # see `_policy`

    # -- Submit --

    def submit(
        self, subject: str, request: pb.SubmitRequest, body: bytes | None = None
    ) -> pb.SubmitResponse:
        """Validate every report, charge the valid ones in one transaction; one outcome each
        (`body`: as for `prepare`).

        Blocks until the ledger commit (group commit: see committer.py).
        """
        prepared = self.prepare(subject, request, body)
        del body  # not kept while the commit is awaited
        ledger_outcomes = self.committer.submit(prepared.batch) if prepared.batch.reports else []
        return self.finish(prepared, ledger_outcomes)

    def prepare(
        self, subject: str, request: pb.SubmitRequest, body: bytes | None = None
    ) -> Prepared:
        """Validate a request: per-report outcomes for the invalid, a batch for the ledger.

        `body`: the bytes `request` was parsed from, when the caller has them. Then
        each report whose content (everything but its id) repeats an earlier one of
        the request is not read field by field again: its content's checks are
        those of the earlier one (`_report_ids`), and only its id is its own.
        """
        count = len(request.reports)
        limits = self.limits
        if count > limits.max_reports_per_request:
            raise BatchTooLargeError(
                f"{count} reports in one request; the limit is "
                f"{limits.max_reports_per_request}: split the batch",
                metadata=(("max-reports-per-request", str(limits.max_reports_per_request)),),
            )
        self.metrics.request_reports.observe(count)
        now = self.clock()
        ids, contents = _report_ids(request, body)
        repeated = _repeated(ids)
        window = (max(0, now - limits.max_report_age_seconds), now + limits.max_clock_skew_seconds)
        policies: dict[tuple[str, int, bytes], _Active | Lookup] = {}
        verdicts: dict[bytes, _Verdict] = {}  # a content's checks, for this request only
        outcomes: list[pb.ReportOutcome | None] = [None] * count
        checked: list[CheckedReport] = []
        reports = request.reports
        # The checks of the module docstring, in its order: the first failure is the
        # report's outcome. Per-request values are worked out once, above.
        for i, rid in enumerate(ids):
            if len(rid) != REPORT_ID_BYTES or rid in repeated:
                outcomes[i] = _bad_id(rid)
                continue
            content = contents[i] if contents is not None else None
            verdict = verdicts.get(content) if content is not None else None
            if verdict is None:
                verdict = self._check_content(reports[i], now, window, policies)
                if content is not None:
                    verdicts[content] = verdict
            if isinstance(verdict, _Refusal):
                outcomes[i] = verdict.build(rid, *verdict.args)
                continue
            policy, output, digest, ct = verdict
            checked.append(CheckedReport(rid, policy, output, digest, ct))
        if len(checked) == count:  # the common case: every report goes to the ledger
            positions = list(range(count))
        else:
            positions = [i for i, o in enumerate(outcomes) if o is None]
        return Prepared(SubmitBatch(subject, checked, now), outcomes, positions)

    def _check_content(
        self,
        report: pb.Report,
        now: int,
        window: tuple[int, int],
        policies: dict[tuple[str, int, bytes], _Active | Lookup],
    ) -> _Verdict:
        """The checks after the id's, in order, on `report`'s content (its id unread):
        what its CheckedReport holds besides the id, or the first refusal.
        `policies`: the request's lookups so far (filled in)."""
        key = (report.policy_id, report.policy_version, report.policy_digest)
        found = policies.get(key)
        if found is None:
            found = policies[key] = self._policy(key, now)
        if not isinstance(found, _Active):
            return _Refusal(_unusable_policy, (found,))
        policy, state, check_output, categories, digests, sealed = found
        ct = report.coarse_time
        if ct % COARSE_TIME_UNIT != 0 or not window[0] <= ct <= window[1]:
            return _Refusal(
                _invalid,
                (
                    pb.REJECT_REASON_BAD_COARSE_TIME,
                    "coarse_time must be on the hour, not in the future and not older "
                    f"than {self.limits.max_report_age_seconds} s",
                ),
            )
        # A category output this policy's mechanism accepted before is reused
        # as it is (outputs are immutable, the check a function of the mechanism
        # and the output; docs/performance.md).
        output = None
        category: tuple[int, int] | None = None
        if report.WhichOneof("payload") == "category":
            category = (ct, report.category.index)
            output = categories.get(category[1])
        if output is None:
            try:
                output = output_from_report(report)
                if type(output) is SealedOutput and not sealed:
                    raise OutputDomainError(
                        "SEALED_NOT_EXPECTED",
                        "a sealed payload for a policy that is not a shuffle-model one",
                    )
                check_output(output)
            except OutputDomainError as exc:
                reason = pb.RejectReason.Value(f"REJECT_REASON_{exc.reason}")
                return _Refusal(_invalid, (reason, str(exc)))
            if type(output) is CategoryOutput and len(categories) < _MAX_CATEGORIES:
                categories[output.index] = output
        # A category report's content is (policy, coarse time, index): its digest
        # is remembered per policy (a fleet's reports share a few coarse times;
        # docs/performance.md).
        digest = digests.get(category) if category is not None else None
        if digest is None:
            digest = digest_from_state(state, ct, output)
            if category is not None and type(output) is CategoryOutput:
                if len(digests) >= _MAX_DIGESTS:
                    digests.clear()
                digests[category] = digest
        return (policy, output, digest, ct)

    def finish(
        self, prepared: Prepared, ledger_outcomes: Sequence[OutcomeValue]
    ) -> pb.SubmitResponse:
        """The response, once the ledger committed `prepared.batch` with these outcomes."""
        reports = prepared.batch.reports
        if len(ledger_outcomes) != len(reports):
            raise ValueError("one ledger outcome per checked report is required")
        ids = map(_REPORT_ID, reports)
        if len(reports) == len(prepared.outcomes):
            # The common case: every report went to the ledger, in order.
            response = _ledger_response(ids, ledger_outcomes)
            refused: list[pb.ReportOutcome] = []
        else:
            response = pb.SubmitResponse()
            add = response.outcomes.add
            merged: list[pb.ReportOutcome | tuple[bytes, OutcomeValue] | None]
            merged = list(prepared.outcomes)
            for pos, rid, outcome in zip(prepared.positions, ids, ledger_outcomes, strict=True):
                merged[pos] = (rid, outcome)
            for item in merged:
                if isinstance(item, tuple):
                    add(report_id=item[0], outcome=item[1])
                else:
                    assert item is not None
                    response.outcomes.append(item)
            refused = [o for o in prepared.outcomes if o is not None]
        # Counted per distinct outcome (at most four from the ledger): no per-report tally.
        for outcome in set(ledger_outcomes):
            self._count(outcome, _NO_REASON, ledger_outcomes.count(outcome))
        if refused:
            for (outcome, reason), n in Counter((o.outcome, o.reason) for o in refused).items():
                self._count(outcome, reason, n)
        return response

    def _count(self, outcome: OutcomeValue, reason: pb.RejectReason.ValueType, n: int) -> None:
        """Count `n` reports with this outcome (and reason) in the metrics."""
        child = self._report_children.get((outcome, reason))
        if child is None:  # the reports counter's child, bound once
            child = self._report_children[(outcome, reason)] = self.metrics.reports.labels(
                _OUTCOME_NAMES[outcome], _REASON_NAMES[reason]
            )
        child.inc(n)
        if outcome == pb.OUTCOME_BUDGET_EXHAUSTED:
            self.metrics.budget_exhausted.inc(n)

    def _policy(self, key: tuple[str, int, bytes], now: int) -> _Active | Lookup:
        """The policy a report names (id, version, digest), or why it cannot be used at `now`.

        The registry answers every request afresh; what an active policy's reports
        need (`_Active`) is built once per verified policy.
        """
        status, verified = self.registry.lookup(*key, now=now)
        if verified is None:
            return status
        active = self._active.get(key)
        if active is None or active.policy is not verified:
            if len(self._active) >= _MAX_ACTIVE:  # policies come and go with reloads
                self._active.clear()
            sealed = verified.analyzer_public_key is not None
            check = _sealed_check(verified) if sealed else verified.mechanism.check_output
            active = self._active[key] = _Active(
                verified, digest_state(*key), check, {}, {}, sealed
            )
        return active

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
        """What `subject` spent and has left in the current window of each active policy
        (the cap is the one in force: `PolicyRegistry.charged`, lowered by the
        ledger's recorded versions, `Ledger.cap_in_force`)."""
        now = self.clock()
        out = pb.GetBudgetResponse()
        registry = self.registry
        ledger = ledger_for(self.ledger, subject)  # the subject's shard (routing.py)
        for active in registry.active(now=now, policy_id=request.policy_id):
            p = registry.charged(active, now=now)
            start = p.window_start(now)
            # The cap in force, as the ledger checks it (its recorded versions too).
            cap = ledger.cap_in_force(p, start)
            spent = ledger.spent(subject, p.policy_id, start)
            left = max(EXACT.subtract(cap, spent), type(spent)(0))
            if refused_by(ledger.restore_gaps, start, p.window_seconds):
                left = type(spent)(0)  # a restored ledger's gap: nothing is charged here
            out.budgets.add(
                policy_id=p.policy_id,
                policy_version=p.version,
                window_start=start,
                window_end=start + p.window_seconds,
                epsilon_cap=str(cap),
                epsilon_spent=str(spent),
                epsilon_remaining=str(left),
                charge_per_report=str(p.charge),
            )
        return out
