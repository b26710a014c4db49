"""Reports over stored data: partial statistics, merging, the release gate, audit.

The collector keeps, in the same transaction as each accepted report, an
additive sufficient statistic per (policy, version, window, shard)
(`Ledger.statistics`). A report reads those rows, decodes each with the
mechanism's own `statistic_from_json` and adds them with
`mechanism.merge_statistics`: integer counts, so the merge is exact and its
cost does not depend on the number of stored reports. A pem statistic is every
report, kept by the collector as append-only chunk rows
(collector/ledger/statistic_chunks.py): a partial carries them concatenated
(`Partial.chunks`) and `partial_statistic` decodes them in bulk with
`statistic_from_chunks`, merged with the row's JSON part, if any. The same merge combines
partial statistics from several collectors or regions: several ledgers, or
statistics exported to JSON files (`export_statistics` / `load_export`).

Release gate: no report is produced for a (policy, window) whose merged report
count is below the policy's `min_reports_for_release`
(`InsufficientReportsError`). With no window given, the report covers every
window of the policy version and the gate applies to the total it releases.

Audit: `audit_statistics` recomputes the statistic from the raw report rows
(`Ledger.recompute_statistics`) and requires it to equal the merged partial
statistics exactly.

Every partial statistic carries a source name (the ledger or the region it
came from) and its shard; the same (source, shard, window) given twice is
refused (`DuplicatePartialError`), since it would count reports twice.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from fedldp.aggregator.consistency import Consistency
from fedldp.aggregator.estimation import (
    FrequencyReport,
    NumericReport,
    ReportContext,
    frequency_report,
    numeric_report,
)
from fedldp.aggregator.sketches import CONSISTENCY_NEEDS_DOMAIN, candidate_report
from fedldp.client.mechanisms.sketch import Sketch
from fedldp.client.textfiles import not_text

if TYPE_CHECKING:
    from fedldp.aggregator.multi_report import MultiReport
    from fedldp.client.mechanisms.base import Mechanism
    from fedldp.client.policy import VerifiedPolicy

#: Layout of exported partial statistics; bump the suffix only for an incompatible change.
EXPORT_SCHEMA = "fedldp.statistics/v1"


class ReportError(Exception):
    """Base of the aggregator's report errors; messages say what to do."""


class InsufficientReportsError(ReportError):
    """The release gate: fewer reports than the policy's minimum for release."""

    def __init__(self, *, policy_id: str, window_start: int | None, count: int, minimum: int):
        where = "all windows" if window_start is None else f"window {window_start}"
        super().__init__(
            f"policy {policy_id!r}, {where}: {count} reports, fewer than the policy's "
            f"minimum for release ({minimum}); wait for more reports"
        )
        self.count = count
        self.minimum = minimum


class ShuffleModelError(ReportError):
    """The policy is a shuffle-model one: only the analyzer can estimate it."""


class CandidatesRequiredError(ReportError):
    """A sketch policy (open domain) was asked for a report without candidate strings."""


class DuplicatePartialError(ReportError):
    """The same (source, shard, window) partial statistic was given twice."""


class ExportMismatchError(ReportError):
    """An exported statistic is for another policy, version or digest."""


class AuditMismatchError(ReportError):
    """The incremental statistics differ from a full recompute from raw rows."""


class StatisticsSource(Protocol):
    """What the aggregator reads from a ledger (fedldp.collector.ledger.Ledger)."""

    def statistics(
        self, policy_id: str, version: int, window_start: int | None = None
    ) -> Sequence[Any]:
        """See `Ledger.statistics`."""
        ...

    def recompute_statistics(self, policy: VerifiedPolicy, window_start: int | None = None) -> Any:
        """See `Ledger.recompute_statistics`."""
        ...


@dataclass(frozen=True)
class Partial:
    """One additive partial statistic and where it came from.

    Its `n` reports are those of `statistic_json` (None: no JSON part) and those of
    `chunks`, the concatenated chunk rows of a mechanism that keeps its statistic as
    chunks (pem: `Mechanism.chunked_statistic`; b"" otherwise), read in bulk by
    `partial_statistic`.
    """

    source: str
    shard: str
    window_start: int
    n: int
    statistic_json: str | None
    chunks: bytes = b""

    def key(self) -> tuple[str, str, int]:
        """The identity that must not be counted twice."""
        return (self.source, self.shard, self.window_start)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "source": self.source,
            "shard": self.shard,
            "window_start": self.window_start,
            "n": self.n,
            "statistic": self.statistic_json,
        }


@dataclass
class MergedStatistic:
    """The sum of partial statistics, with its provenance."""

    statistic: Any
    n: int
    partials: int
    sources: tuple[str, ...]


def partials_from_ledger(
    ledger: StatisticsSource,
    policy: VerifiedPolicy,
    window_start: int | None = None,
    *,
    source: str = "ledger",
) -> list[Partial]:
    """The ledger's partial statistic rows for the policy version (and window)."""
    rows = ledger.statistics(policy.policy_id, policy.version, window_start)
    return [
        Partial(
            source=source,
            shard=str(row.shard),
            window_start=int(row.window_start),
            n=int(row.n),
            statistic_json=row.statistic_json,
            chunks=bytes(getattr(row, "chunks", b"")),
        )
        for row in rows
    ]


def partial_statistic(
    mechanism: Mechanism,  # type: ignore[type-arg]
    part: Partial,
) -> Any:
    """The statistic of one partial: its JSON part merged with its chunks (either may
    be empty). ReportError when they do not count the partial's n or the mechanism
    keeps no chunks; ValueError (the mechanism's, naming no value) when a part is
    malformed."""
    stat = mechanism.new_statistic()
    count = 0
    if part.statistic_json is not None:
        stat = mechanism.statistic_from_json(part.statistic_json)
        count = int(getattr(stat, "n", part.n))
    if part.chunks:
        if not mechanism.chunked_statistic:
            raise ReportError(
                f"partial statistic of shard {part.shard!r} has chunk rows, but "
                f"{mechanism.wire_id!r} keeps its statistic as JSON; run `fedldp ledger reconcile`"
            )
        mechanism.merge_statistics(stat, mechanism.statistic_from_chunks(part.chunks))
        count += mechanism.chunk_count(part.chunks)
    if count != part.n:
        raise ReportError(
            f"partial statistic of shard {part.shard!r} counts {count} reports but its "
            f"row says {part.n}; run `fedldp report --audit` against its ledger"
        )
    return stat


def merge_partials(
    mechanism: Mechanism,  # type: ignore[type-arg]
    partials: Iterable[Partial],
) -> MergedStatistic:
    """Add partial statistics exactly with the mechanism's own merge.

    Raises DuplicatePartialError if one (source, shard, window) appears twice,
    and ReportError if a row's n disagrees with its statistic's count.
    """
    total = mechanism.new_statistic()
    seen: set[tuple[str, str, int]] = set()
    n = 0
    count = 0
    sources: list[str] = []
    for part in partials:
        if part.key() in seen:
            raise DuplicatePartialError(
                f"partial statistic of source {part.source!r}, shard {part.shard!r}, window "
                f"{part.window_start} given twice; each collector's statistics may be merged once"
            )
        seen.add(part.key())
        if part.source not in sources:
            sources.append(part.source)
        count += 1
        if part.n == 0:
            continue
        mechanism.merge_statistics(total, partial_statistic(mechanism, part))
        n += part.n
    return MergedStatistic(statistic=total, n=n, partials=count, sources=tuple(sources))


def check_release_gate(policy: VerifiedPolicy, window_start: int | None, count: int) -> None:
    """Raise InsufficientReportsError below the policy's minimum report count."""
    minimum = int(policy.min_reports_for_release)
    if count < minimum or count <= 0:
        raise InsufficientReportsError(
            policy_id=policy.policy_id, window_start=window_start, count=count, minimum=minimum
        )


def report_for_policy(
    policy: VerifiedPolicy,
    merged: MergedStatistic,
    *,
    window_start: int | None = None,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    candidates: Sequence[str] | None = None,
) -> FrequencyReport | NumericReport | MultiReport:
    """The analyst report for a policy from a merged statistic, behind the release gate.

    Categorical policies give a FrequencyReport over the policy's labels,
    numeric policies a NumericReport of the mean over the policy's range,
    multi-attribute policies a MultiReport with one of those per attribute,
    pem policies a FrequencyReport over the strings discovery found
    (`fedldp.aggregator.discovery`, its fixed threshold rule), and sketch
    policies (cms, hcms) a FrequencyReport over `candidates`, the strings the
    analyst asks about (required for them, refused for the others:
    CandidatesRequiredError, ValueError).
    """
    mechanism = policy.mechanism
    sketch = _sketch_of(policy, candidates)
    if sketch is not None and Consistency.parse(consistency) is not Consistency.NONE:
        raise ValueError(CONSISTENCY_NEEDS_DOMAIN)
    check_release_gate(policy, window_start, merged.n)
    context = ReportContext(
        policy_id=policy.policy_id,
        policy_version=policy.version,
        metric=policy.metric_name,
        window_start=window_start,
        epsilon_cap=policy.epsilon_cap,
        epsilon_charged=policy.charge * merged.n,
        shards=merged.partials,
        sources=merged.sources,
        window_seconds=policy.window_seconds,
        purpose=policy.message.purpose or None,
    )
    if sketch is not None:
        assert candidates is not None
        return candidate_report(
            sketch,
            merged.statistic,
            candidates,
            confidence=confidence,
            simultaneous=simultaneous,
            consistency=consistency,
            context=context,
        )
    if policy.attributes is not None:
        from fedldp.aggregator.multi_report import multi_report
        from fedldp.client.mechanisms.multi import MultiAttribute

        assert isinstance(mechanism, MultiAttribute)
        # Each attribute's estimate rests on the reports that carry it (n_j under
        # multi-sample): the release gate applies to each.
        check_release_gate(policy, window_start, min(p.n for p in merged.statistic.parts))
        return multi_report(
            mechanism,
            merged.statistic,
            confidence=confidence,
            simultaneous=simultaneous,
            consistency=consistency,
            context=context,
        )
    if mechanism.wire_id == "pem":
        from fedldp.aggregator.discovery import discovery_report
        from fedldp.client.mechanisms.pem import PEM

        assert isinstance(mechanism, PEM)
        # Each level's candidates are chosen from one group's reports and every string's
        # estimate is the last group's f̂ (about n / G reports): the gate applies to the
        # smallest group, as it applies to min_j n_j under multi-sample.
        stat = merged.statistic
        check_release_gate(
            policy, window_start, min(stat.group_size(j) for j in range(mechanism.groups))
        )
        if Consistency.parse(consistency) is not Consistency.NONE:
            raise ValueError("consistency applies to categorical metrics only")
        return discovery_report(mechanism, merged.statistic, confidence=confidence, context=context)
    if policy.labels is not None:
        return frequency_report(
            mechanism,
            merged.statistic,
            list(policy.labels),
            confidence=confidence,
            simultaneous=simultaneous,
            consistency=consistency,
            context=context,
        )
    if Consistency.parse(consistency) is not Consistency.NONE:
        raise ValueError("consistency applies to categorical metrics only")
    return numeric_report(
        mechanism,
        merged.statistic,
        confidence=confidence,
        value_range=policy.numeric_range,
        context=context,
    )


def _sketch_of(policy: VerifiedPolicy, candidates: Sequence[str] | None) -> Sketch | None:
    """The policy's sketch mechanism when it has one (candidates then required), else None
    (candidates then refused)."""
    mechanism = policy.mechanism
    if not isinstance(mechanism, Sketch):
        if candidates is not None:
            raise ValueError(
                f"candidates apply to sketch policies (cms, hcms); policy {policy.policy_id!r} "
                f"uses {mechanism.wire_id!r}"
            )
        return None
    if candidates is None:
        raise CandidatesRequiredError(
            f"policy {policy.policy_id!r} collects strings with the sketch {mechanism.wire_id!r}: "
            "there is no list of values; name the strings to estimate "
            "(fedldp report --candidates FILE, one per line)"
        )
    return mechanism


def report_from_ledgers(
    ledgers: Sequence[tuple[str, StatisticsSource]],
    policy: VerifiedPolicy,
    *,
    window_start: int | None = None,
    confidence: float = 0.95,
    simultaneous: bool = False,
    consistency: Consistency | str | None = None,
    extra_partials: Iterable[Partial] = (),
    candidates: Sequence[str] | None = None,
) -> FrequencyReport | NumericReport | MultiReport:
    """Merge the partial statistics of one or more (source name, ledger) pairs and report.

    `extra_partials` adds statistics loaded from export files (other regions);
    `candidates` are the strings a sketch policy's report estimates. A shuffle-model
    policy has no statistics in a ledger (its reports are sealed): ShuffleModelError.
    """
    if policy.analyzer_public_key is not None:
        raise ShuffleModelError(
            f"policy {policy.policy_id} is a shuffle-model one: its reports are sealed to the "
            "analyzer; use fedldp shuffler pull / release / analyze (docs/shuffle.md)"
        )
    partials: list[Partial] = []
    for name, ledger in ledgers:
        partials.extend(partials_from_ledger(ledger, policy, window_start, source=name))
    partials.extend(
        p for p in extra_partials if window_start is None or p.window_start == window_start
    )
    merged = merge_partials(policy.mechanism, partials)
    return report_for_policy(
        policy,
        merged,
        window_start=window_start,
        confidence=confidence,
        simultaneous=simultaneous,
        consistency=consistency,
        candidates=candidates,
    )


def audit_statistics(
    ledger: StatisticsSource, policy: VerifiedPolicy, window_start: int | None = None
) -> MergedStatistic:
    """Recompute from raw rows and require equality with the incremental statistics.

    Returns the merged incremental statistic; raises AuditMismatchError on any
    difference (compared through the mechanism's exact JSON form).
    """
    mechanism = policy.mechanism
    merged = merge_partials(mechanism, partials_from_ledger(ledger, policy, window_start))
    full = ledger.recompute_statistics(policy, window_start)
    if mechanism.statistic_to_json(full) != mechanism.statistic_to_json(merged.statistic):
        raise AuditMismatchError(
            f"policy {policy.policy_id!r} v{policy.version}: the incremental statistics "
            "differ from a full recompute of the raw report rows; do not release, "
            "investigate the collector(s) writing this ledger"
        )
    return merged


# --- export / import for multi-region merging ---


def export_statistics(
    ledger: StatisticsSource,
    policy: VerifiedPolicy,
    window_start: int | None = None,
    *,
    source: str,
) -> dict[str, Any]:
    """The ledger's partial statistics for a policy version as a JSON-ready document.

    Contains only the additive statistics (already randomized counts) and their
    provenance; it is safe to move between regions like the reports themselves.
    `source` names the region or collector fleet and must be unique per export.
    """
    if not source:
        raise ValueError("an export needs a non-empty source name (the region or ledger)")
    # A partial's chunks travel as the mechanism's JSON form (the export's one schema).
    mechanism = policy.mechanism
    partials = [
        dataclasses.replace(
            p,
            statistic_json=mechanism.statistic_to_json(partial_statistic(mechanism, p)),
            chunks=b"",
        )
        if p.chunks
        else p
        for p in partials_from_ledger(ledger, policy, window_start, source=source)
    ]
    return {
        "schema": EXPORT_SCHEMA,
        "policy_id": policy.policy_id,
        "policy_version": policy.version,
        "policy_digest": policy.digest.hex(),
        "mechanism": policy.mechanism.wire_id,
        "epsilon": str(policy.epsilon),
        "window_start": window_start,
        "partials": [p.to_dict() for p in partials],
    }


def load_export(document: dict[str, Any] | str | Path, policy: VerifiedPolicy) -> list[Partial]:
    """Partial statistics from an export (dict, JSON text or a file path), checked against `policy`.

    Raises ExportMismatchError for another schema, policy, version, digest,
    mechanism or ε, and for a malformed partial.
    """
    if isinstance(document, Path):
        try:
            data: Any = json.loads(document.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ExportMismatchError(
                f"{not_text(document, exc)}, so not a statistics export: give the JSON "
                "that `fedldp report --export-statistics` wrote"
            ) from None
    elif isinstance(document, str):
        data = json.loads(document)
    else:
        data = document
    if not isinstance(data, dict) or data.get("schema") != EXPORT_SCHEMA:
        raise ExportMismatchError(f"not a statistics export (expected schema {EXPORT_SCHEMA!r})")
    if (
        data.get("policy_id") != policy.policy_id
        or data.get("policy_version") != policy.version
        or data.get("policy_digest") != policy.digest.hex()
    ):
        raise ExportMismatchError(
            "the export is for another policy, version or policy digest; "
            f"expected {policy.policy_id!r} v{policy.version}"
        )
    if data.get("mechanism") != policy.mechanism.wire_id or Decimal(str(data.get("epsilon"))) != (
        policy.epsilon
    ):
        raise ExportMismatchError("the export's mechanism or epsilon differs from the policy's")
    out = []
    for item in data.get("partials", []):
        try:
            out.append(
                Partial(
                    source=str(item["source"]),
                    shard=str(item["shard"]),
                    window_start=int(item["window_start"]),
                    n=int(item["n"]),
                    statistic_json=item["statistic"],
                )
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportMismatchError(f"malformed partial statistic in export: {exc}") from None
    return out
