"""What the dashboard shows, computed from the ledger's additive statistics.

Every estimate comes from `fedldp.aggregator.reports` (`partials_from_ledger`,
`merge_partials`, `report_for_policy`): the same merge, release gate and JSON
layout as `fedldp report`, so the JSON API returns exactly what
`fedldp report --format json` prints for the same ledger, policy and options.
A view reads the statistics rows (one per window and collector shard) and
merges them: its cost does not depend on how many reports are stored.

Budget figures come from the `spend` table (GROUP BY counts, never a subject)
and the central reservations from `central_reservations` (counts and exact
ε sums per purpose and status). Spend rows of a closed window no longer
change, so their aggregates are kept; the open window's are re-read in the
background when older than `budget_ttl_s` seconds, and every budget view says
when its oldest figure was read.
"""

from __future__ import annotations

import decimal
import hashlib
import logging
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from fedldp.aggregator.consistency import Consistency
from fedldp.aggregator.dashboard.source import ReadOnlyLedger, SpendGroup, WindowCount
from fedldp.aggregator.estimation import FrequencyReport, NumericReport, heavy_hitters
from fedldp.aggregator.multi_report import MultiReport
from fedldp.aggregator.reports import (
    Partial,
    ReportError,
    merge_partials,
    partials_from_ledger,
    report_for_policy,
)
from fedldp.client.policy import VerifiedPolicy
from fedldp.collector.ledger import EXACT

log = logging.getLogger(__name__)

#: Window reports kept by `Dashboard.window_reports` (least recently used dropped first).
_REPORT_CACHE = 2048
#: The source name `fedldp report` gives a single ledger (it appears in the JSON).
SOURCE = "ledger"


def iso_utc(epoch: int | float) -> str:
    """`epoch` as ISO 8601 UTC, e.g. 2026-12-01T00:00:00Z."""
    return datetime.fromtimestamp(int(epoch), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class UnknownPolicyError(ReportError):
    """No verified policy with that id is loaded."""


@dataclass(frozen=True)
class Options:
    """What a view is computed with (the analyst's choices)."""

    confidence: float = 0.95
    consistency: str = Consistency.NONE.value
    simultaneous: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.confidence < 1.0:
            raise ValueError("confidence must be in (0, 1)")
        Consistency.parse(self.consistency)


@dataclass(frozen=True)
class WindowReport:
    """One window's report, or why it is withheld (the release gate)."""

    window_start: int
    n: int
    report: FrequencyReport | NumericReport | None
    withheld: str | None


@dataclass(frozen=True)
class PolicySummary:
    """One row of the index page."""

    policy: VerifiedPolicy
    latest_window: int | None
    latest_n: int
    windows: int

    @property
    def released(self) -> bool:
        """Whether the latest window passes the release gate."""
        return self.latest_n >= max(1, self.policy.min_reports_for_release)


@dataclass(frozen=True)
class WindowBudget:
    """ε charged and subjects in one window of one policy (counts only)."""

    window_start: int
    reports: int
    subjects: int
    epsilon_charged: Decimal
    at_cap: int


@dataclass(frozen=True)
class PurposeReservations:
    """Central reservations of one purpose: open, settled and cancelled."""

    purpose: str
    open_count: int
    open_epsilon: Decimal
    settled_count: int
    settled_epsilon: Decimal
    cancelled_count: int


@dataclass(frozen=True)
class CentralLedgerView:
    """The central reservations of one more ledger (a release service's own ledger)."""

    label: str
    reservations: list[PurposeReservations]


@dataclass(frozen=True)
class BudgetView:
    """The budget page: the ledger's spend and central reservations, then those of
    each central ledger the dashboard was given (`central`)."""

    policies: dict[str, list[WindowBudget]]
    reservations: list[PurposeReservations]
    #: When the oldest figure shown was read from the ledger.
    read_at: int
    central: list[CentralLedgerView] = field(default_factory=list)


@dataclass
class _SpendCache:
    """Spend aggregates per (policy, window): closed windows for good, open ones with the
    time they were read; `refreshing` while a background re-read runs."""

    closed: dict[tuple[str, int], list[SpendGroup]] = field(default_factory=dict)
    open_rows: dict[tuple[str, int], tuple[float, list[SpendGroup]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    refreshing: bool = False


class Dashboard:
    """The dashboard's data over one read-only ledger and the verified policies.

    `policies`: the verified policies (the highest version per policy id is
    shown, as `fedldp report` picks by default). `trend_windows`: how many of the
    latest windows the trend and budget pages cover; `top_values`: how many
    values the trend follows. `central`: (label, ledger) of each further ledger
    whose central reservations the budget page shows (a release service that
    keeps its own ledger, `fedldp dashboard --central-ledger`). `shuffle_reports`:
    the folder of the analyzer's JSON reports on shuffled batches the shuffle page
    shows (`fedldp dashboard --shuffle-reports`, fedldp.aggregator.dashboard.shuffled).
    """

    def __init__(
        self,
        ledger: ReadOnlyLedger,
        policies: Sequence[VerifiedPolicy],
        *,
        trend_windows: int = 12,
        top_values: int = 5,
        budget_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        central: Sequence[tuple[str, ReadOnlyLedger]] = (),
        shuffle_reports: Path | None = None,
    ) -> None:
        self.ledger = ledger
        self.central = list(central)
        self.shuffle_reports = shuffle_reports
        chosen: dict[str, VerifiedPolicy] = {}
        for p in policies:
            if p.policy_id not in chosen or p.version > chosen[p.policy_id].version:
                chosen[p.policy_id] = p
        self.policies = dict(sorted(chosen.items()))
        self.trend_windows = trend_windows
        self.top_values = top_values
        self.budget_ttl_s = budget_ttl_s
        self.clock = clock
        self._spend = _SpendCache()
        self._reports: OrderedDict[tuple[Any, ...], WindowReport] = OrderedDict()
        self._reports_lock = threading.Lock()

    # -- policies and windows --

    def policy(self, policy_id: str) -> VerifiedPolicy:
        """The shown version of `policy_id` (UnknownPolicyError if none)."""
        try:
            return self.policies[policy_id]
        except KeyError:
            raise UnknownPolicyError("no verified policy with that id is loaded") from None

    def _window_counts(self) -> dict[str, list[WindowCount]]:
        by_policy: dict[str, list[WindowCount]] = defaultdict(list)
        for wc in self.ledger.window_counts():
            shown = self.policies.get(wc.policy_id)
            if shown is not None and shown.version == wc.version:
                by_policy[wc.policy_id].append(wc)
        return by_policy

    def index(self) -> list[PolicySummary]:
        """One summary per policy: its latest window with reports and that count."""
        counts = self._window_counts()
        out = []
        for pid, policy in self.policies.items():
            windows = counts.get(pid, [])
            latest = windows[-1] if windows else None
            out.append(
                PolicySummary(
                    policy=policy,
                    latest_window=None if latest is None else latest.window_start,
                    latest_n=0 if latest is None else latest.n,
                    windows=len(windows),
                )
            )
        return out

    # -- reports --

    def report(
        self,
        policy_id: str,
        window_start: int | None,
        options: Options,
        *,
        with_heavy_hitters: bool = False,
    ) -> dict[str, Any]:
        """The JSON of `fedldp report --format json` for the same arguments.

        Raises InsufficientReportsError below the release gate, ValueError for
        consistency on a numeric policy, UnknownPolicyError for an unknown id.
        """
        policy = self.policy(policy_id)
        partials = partials_from_ledger(self.ledger, policy, window_start, source=SOURCE)
        result = report_for_policy(
            policy,
            merge_partials(policy.mechanism, partials),
            window_start=window_start,
            confidence=options.confidence,
            simultaneous=options.simultaneous,
            consistency=options.consistency,
        )
        data = result.to_dict()
        if with_heavy_hitters and isinstance(result, FrequencyReport):
            data["heavy_hitters"] = [h.to_dict() for h in heavy_hitters(result)]
        return data

    def window_reports(self, policy_id: str, options: Options) -> list[WindowReport]:
        """The latest `trend_windows` windows' reports, oldest first (one statistics read).

        A window's report is kept (LRU, `_REPORT_CACHE` entries) under the exact
        partial statistics it was computed from (each shard's n, statistic text and a
        digest of its chunks), so a view re-estimates only the windows whose statistics changed
        since (in practice the open one); the rows are read on every view.
        """
        policy = self.policy(policy_id)
        by_window: dict[int, list[Partial]] = defaultdict(list)
        for part in partials_from_ledger(self.ledger, policy, None, source=SOURCE):
            by_window[part.window_start].append(part)
        out = []
        for start in sorted(by_window)[-self.trend_windows :]:
            parts = by_window[start]
            key = (
                policy.policy_id,
                policy.version,
                policy.digest,
                start,
                options,
                tuple((p.shard, p.n, p.statistic_json, _digest(p.chunks)) for p in parts),
            )
            with self._reports_lock:
                cached = self._reports.get(key)
                if cached is not None:
                    self._reports.move_to_end(key)
            if cached is None:
                cached = self._window_report(policy, start, parts, options)
                with self._reports_lock:
                    self._reports[key] = cached
                    while len(self._reports) > _REPORT_CACHE:
                        self._reports.popitem(last=False)
            out.append(cached)
        return out

    @staticmethod
    def _window_report(
        policy: VerifiedPolicy, start: int, parts: list[Partial], options: Options
    ) -> WindowReport:
        merged = merge_partials(policy.mechanism, parts)
        try:
            result = report_for_policy(
                policy,
                merged,
                window_start=start,
                confidence=options.confidence,
                simultaneous=options.simultaneous,
                consistency=options.consistency if policy.labels is not None else None,
            )
        except ReportError as exc:
            return WindowReport(start, merged.n, None, str(exc))
        if isinstance(result, MultiReport):  # no single trend: its JSON has every attribute
            return WindowReport(
                start,
                merged.n,
                None,
                "a multi-attribute report: see its JSON or `fedldp report` for each attribute",
            )
        return WindowReport(start, merged.n, result, None)

    # -- budget --

    def budget(self) -> BudgetView:
        """ε charged and subjects at their cap per policy and window; central reservations."""
        with decimal.localcontext(EXACT):  # exact sums of ε (any rounding raises)
            return self._budget(self.clock())

    def _budget(self, now: float) -> BudgetView:
        counts = self._window_counts()
        shown = {pid: counts.get(pid, [])[-self.trend_windows :] for pid in self.policies}
        groups, read_at = self._spend_groups(
            {pid: [w.window_start for w in windows] for pid, windows in shown.items()}, now
        )
        policies: dict[str, list[WindowBudget]] = {}
        for pid, windows in shown.items():
            charge = self.policies[pid].charge
            rows = []
            for w in windows:
                mine = groups.get((pid, w.window_start), [])
                rows.append(
                    WindowBudget(
                        window_start=w.window_start,
                        reports=w.n,
                        subjects=sum(g.subjects for g in mine),
                        epsilon_charged=sum(
                            (g.epsilon_spent * g.subjects for g in mine), Decimal(0)
                        ),
                        at_cap=sum(
                            g.subjects for g in mine if g.epsilon_spent + charge > g.epsilon_cap
                        ),
                    )
                )
            policies[pid] = rows
        return BudgetView(
            policies=policies,
            reservations=_reservations(self.ledger),
            read_at=int(read_at),
            central=[CentralLedgerView(label, _reservations(led)) for label, led in self.central],
        )

    def close(self) -> None:
        """Release every ledger's connections (the main ledger's and each central one's)."""
        self.ledger.close()
        for _label, led in self.central:
            led.close()

    def _spend_groups(
        self, windows: dict[str, list[int]], now: float
    ) -> tuple[dict[tuple[str, int], list[SpendGroup]], float]:
        """Spend aggregates per (policy, window) and when the oldest of them was read.

        A closed window's spend never changes: read once. An open window's is read
        on its first view; afterwards a view gets the kept figures at once, and when
        they are older than `budget_ttl_s` a background thread re-reads them (one
        scan), so no view waits for the spend table after the first.
        """
        out: dict[tuple[str, int], list[SpendGroup]] = {}
        read_at = now
        cache = self._spend
        due: list[tuple[str, int]] = []
        stale: list[tuple[str, int]] = []
        with cache.lock:
            for pid, starts in windows.items():
                for start in starts:
                    key = (pid, start)
                    if key in cache.closed:
                        out[key] = cache.closed[key]
                    elif key in cache.open_rows:
                        when, rows = cache.open_rows[key]
                        out[key] = rows
                        read_at = min(read_at, when)
                        if now - when >= self.budget_ttl_s:
                            stale.append(key)
                    else:
                        due.append(key)
            refresh = bool(stale) and not cache.refreshing
            cache.refreshing = cache.refreshing or refresh
        if due:
            out.update(self._read_spend(due, now))
        if refresh:
            threading.Thread(
                target=self._refresh_spend, args=(stale,), name="dashboard-spend", daemon=True
            ).start()
        return out, read_at

    def _read_spend(
        self, keys: list[tuple[str, int]], now: float
    ) -> dict[tuple[str, int], list[SpendGroup]]:
        """Read the spend aggregates of `keys` (one scan) and keep them."""
        fresh: dict[tuple[str, int], list[SpendGroup]] = {key: [] for key in keys}
        for g in self.ledger.spend_groups(
            sorted({pid for pid, _ in keys}), sorted({start for _, start in keys})
        ):
            if (g.policy_id, g.window_start) in fresh:
                fresh[(g.policy_id, g.window_start)].append(g)
        with self._spend.lock:
            for key, mine in fresh.items():
                if key[1] + self.policies[key[0]].window_seconds <= now:
                    self._spend.closed[key] = mine
                    self._spend.open_rows.pop(key, None)
                else:
                    self._spend.open_rows[key] = (now, mine)
        return fresh

    def _refresh_spend(self, keys: list[tuple[str, int]]) -> None:
        """Background re-read of stale open windows (a failure keeps the old figures)."""
        try:
            self._read_spend(keys, self.clock())
        except Exception:  # the page keeps showing the figures with their older read time
            log.warning("re-reading the spend table failed", exc_info=True)
        finally:
            with self._spend.lock:
                self._spend.refreshing = False


def _reservations(ledger: ReadOnlyLedger) -> list[PurposeReservations]:
    """Central reservations per purpose: counts and exact ε sums by status."""
    acc: dict[str, dict[str, Any]] = {}
    for g in ledger.reservation_groups():
        row = acc.setdefault(
            g.purpose,
            {
                "open": 0,
                "open_eps": Decimal(0),
                "settled": 0,
                "settled_eps": Decimal(0),
                "cancelled": 0,
            },
        )
        if g.status == "reserved":
            row["open"] += g.count
            row["open_eps"] += g.epsilon * g.count
        elif g.status == "settled":
            row["settled"] += g.count
            row["settled_eps"] += (g.epsilon_spent or Decimal(0)) * g.count
        else:
            row["cancelled"] += g.count
    return [
        PurposeReservations(
            purpose=purpose,
            open_count=r["open"],
            open_epsilon=r["open_eps"],
            settled_count=r["settled"],
            settled_epsilon=r["settled_eps"],
            cancelled_count=r["cancelled"],
        )
        for purpose, r in sorted(acc.items())
    ]


def _digest(chunks: bytes) -> bytes:
    """A short digest of a partial's chunks (pem), for the report cache's key: the
    chunks themselves can be tens of MB."""
    return hashlib.blake2b(chunks, digest_size=16).digest() if chunks else b""
