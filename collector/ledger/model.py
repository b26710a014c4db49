"""The ledger's public value types, outcomes and errors (no database access).

Amounts of privacy are `decimal.Decimal`, summed and compared in `EXACT`, a
context in which any rounding raises; the types here are immutable and carry
what a caller of `Ledger` passes in or gets back.
"""

from __future__ import annotations

import decimal
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    NamedTuple,
    Protocol,
    TypeAlias,
)

from fedldp.v1 import collector_pb2

if TYPE_CHECKING:
    from fedldp.client.mechanisms.base import Mechanism, Output

#: Decimal context for every sum and comparison: any rounding raises (never silent).
EXACT = decimal.Context(
    prec=200,
    traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow, decimal.DivisionByZero],
)

OutcomeValue: TypeAlias = collector_pb2.Outcome.ValueType
ACCEPTED: OutcomeValue = collector_pb2.OUTCOME_ACCEPTED
DUPLICATE: OutcomeValue = collector_pb2.OUTCOME_DUPLICATE
BUDGET_EXHAUSTED: OutcomeValue = collector_pb2.OUTCOME_BUDGET_EXHAUSTED
CONFLICT: OutcomeValue = collector_pb2.OUTCOME_CONFLICT


# --- public types --------------------------------------------------------------------


class LedgerPolicy(Protocol):
    """What the ledger needs of a verified policy (fedldp.client.policy.VerifiedPolicy)."""

    @property
    def policy_id(self) -> str:
        """The policy id: spend is keyed by (subject, policy id, window)."""
        ...

    @property
    def version(self) -> int:
        """The policy version (statistics are kept per version)."""
        ...

    @property
    def digest(self) -> bytes:
        """SHA-256 of the signed policy payload."""
        ...

    @property
    def charge(self) -> Decimal:
        """ε charged per report (exact, positive)."""
        ...

    @property
    def epsilon_cap(self) -> Decimal:
        """The signed per-window cap (the ledger may lower it: `Ledger.cap_in_force`)."""
        ...

    @property
    def window_seconds(self) -> int:
        """Length of a budget window, seconds (positive)."""
        ...

    @property
    def mechanism(self) -> Mechanism[Any, Any]:
        """The mechanism whose statistics the ledger accumulates."""
        ...

    def window_start(self, now: int) -> int:
        """Start of the budget window that contains `now` (epoch seconds)."""
        ...


class CheckedReport(tuple[bytes, "LedgerPolicy", "Output", bytes, int]):
    """A report that passed the policy and output-domain checks (immutable).

    `content_digest` is `fedldp.collector.wire.content_digest` of the report
    (everything but its id); it decides DUPLICATE versus CONFLICT. Built only
    through this constructor, which refuses an id that is not 16 bytes or a
    digest that is not 32; a tuple rather than a frozen dataclass because the
    ledger's hot path unpacks it by position (docs/performance.md).
    """

    __slots__ = ()

    def __new__(
        cls,
        report_id: bytes,
        policy: LedgerPolicy,
        output: Output,
        content_digest: bytes,
        coarse_time: int,
    ) -> CheckedReport:
        if len(report_id) != 16:
            raise ValueError("report_id must be exactly 16 bytes")
        if len(content_digest) != 32:
            raise ValueError("content_digest must be a 32-byte SHA-256")
        return tuple.__new__(cls, (report_id, policy, output, content_digest, coarse_time))

    def __getnewargs__(self) -> tuple[bytes, LedgerPolicy, Output, bytes, int]:
        return (self[0], self[1], self[2], self[3], self[4])

    def __repr__(self) -> str:
        return (
            f"CheckedReport(report_id={self[0]!r}, policy={self[1]!r}, output={self[2]!r}, "
            f"content_digest={self[3]!r}, coarse_time={self[4]!r})"
        )

    @property
    def report_id(self) -> bytes:
        """The 16-byte report id (idempotency key of the report)."""
        return self[0]

    @property
    def policy(self) -> LedgerPolicy:
        """The verified policy the report is charged under."""
        return self[1]

    @property
    def output(self) -> Output:
        """The randomized output, checked against the mechanism's domain."""
        return self[2]

    @property
    def content_digest(self) -> bytes:
        """SHA-256 of everything but the id (`wire.content_digest`)."""
        return self[3]

    @property
    def coarse_time(self) -> int:
        """The report's coarse time (epoch seconds, on the hour)."""
        return self[4]


class SubmitBatch(NamedTuple):
    """One request's reports for one authenticated subject, charged at `now` (immutable)."""

    subject: str
    reports: Sequence[CheckedReport]
    now: int


@dataclass(frozen=True)
class PartialStatistic:
    """One collector shard's additive statistic for (policy, version, window).

    `n` reports in all: those of `statistic_json` (None when the row has no JSON
    part) and, for a mechanism that keeps chunks (`Mechanism.chunked_statistic`,
    pem), those of `chunks`, its chunk rows' data concatenated in order
    (collector/ledger/statistic_chunks.py); `chunk_n` is what the chunk rows say
    they hold. The reader merges both parts and checks that they count `n`
    (aggregator/reports.py).
    """

    policy_id: str
    version: int
    window_start: int
    shard: str
    n: int
    statistic_json: str | None
    chunks: bytes = b""
    chunk_n: int = 0


@dataclass(frozen=True)
class SpendRow:
    """What a subject spent in one window of one policy."""

    subject: str
    policy_id: str
    window_start: int
    epsilon_spent: Decimal
    report_count: int
    epsilon_cap: Decimal  # the cap of the last charge, from the verified policy


@dataclass(frozen=True)
class PolicyLineage:
    """A policy id's metric name and budget window as the ledger recorded them.

    Recorded once, by the first version of the policy id a collector activated
    (`Ledger.claim_lineage`), and never changed: every later version must have
    the same window length (spend rows are keyed by the window start) and the
    same metric name, and no other policy id may claim that metric name.
    """

    policy_id: str
    metric_name: str
    window_seconds: int
    first_version: int
    recorded_at: int

    def refusal(self, policy_id: str, metric_name: str, window_seconds: int) -> str | None:
        """Why a version (policy id, metric name, window) breaks this lineage; None if it fits.

        The answer starts with a stable reason word: ``metric_taken`` (this
        lineage is another policy id's, for the same metric name),
        ``metric_changed`` or ``window_changed``.
        """
        if self.policy_id != policy_id:
            return (
                f"metric_taken: metric {metric_name!r} already has its budget under policy "
                f"{self.policy_id!r} (recorded by v{self.first_version}); one metric has one "
                f"budget: publish a new version of {self.policy_id!r} instead"
            )
        if self.metric_name != metric_name:
            return (
                f"metric_changed: policy {policy_id!r} measures metric {self.metric_name!r} "
                f"(recorded by v{self.first_version}), not {metric_name!r}; a new metric "
                "needs a new policy id"
            )
        if self.window_seconds != window_seconds:
            return (
                f"window_changed: policy {policy_id!r} has a {self.window_seconds} s budget "
                f"window (recorded by v{self.first_version}), this version asks "
                f"{window_seconds} s; versions of one policy id share one budget, so its "
                "window cannot change: keep the window, or use a new policy id for a new "
                "metric name"
            )
        return None


@dataclass(frozen=True)
class PolicyVersion:
    """One policy version as the ledger records it when a collector activates it.

    Its validity is [not_before, expires_at); it is *in force during* a window
    [w, w + window_seconds) when the two intervals overlap. `recorded_at` is the
    recording collector's clock when the version was first recorded (0 on a
    version not recorded yet).
    """

    policy_id: str
    version: int
    epsilon_cap: Decimal
    window_seconds: int
    not_before: int
    expires_at: int
    digest: bytes
    recorded_at: int = 0

    def overlaps(self, window_start: int, window_seconds: int) -> bool:
        """Whether this version is in force during [window_start, window_start + window_seconds)."""
        return self.not_before < window_start + window_seconds and self.expires_at > window_start


@dataclass(frozen=True)
class Mismatch:
    """A disagreement between a running total and the raw rows it summarizes.

    kind: "spend" (ε or count differs), "over_cap" (raw spend above the cap in
    force: the smallest of the caps its reports were charged under and of the
    recorded versions in force during the window), "statistic_count" (statistics
    n differs from stored reports), "central" (central running totals differ from
    the reservations), "central_over_cap" (a reservation that took the committed
    total above the central cap in force when it was made), "window" (a window
    start that is not one of its policy id's recorded window length: charged
    under another window, see `claim_lineage`).
    """

    kind: str
    subject: str | None
    scope: str
    recomputed: str
    recorded: str

    def __str__(self) -> str:
        who = f" subject={self.subject}" if self.subject is not None else ""
        return (
            f"{self.kind}:{who} {self.scope}: "
            f"recomputed {self.recomputed}, recorded {self.recorded}"
        )


@dataclass(frozen=True)
class Reservation:
    """A central release's (ε, δ) reservation and its history."""

    id: str
    subject: str
    purpose: str
    epsilon: Decimal
    delta: Decimal
    status: str  # 'reserved' | 'settled' | 'cancelled'
    epsilon_spent: Decimal | None
    delta_spent: Decimal | None
    idempotency_key: str
    created_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    closed_at: int | None = None
    owner: str | None = None  # the run that claimed it (None: made before ownership)
    lease_expires_at: int | None = None
    data_opened_at: int | None = None  # set before the first protected byte is read
    close_reason: str | None = None
    #: Key id of the only key that may sign this run's receipt ("" none; None: not recorded).
    receipt_key_id: str | None = None

    def held_by(self, owner: str) -> bool:
        """True when `owner` is the run that claimed this reservation."""
        return self.owner is not None and secrets.compare_digest(self.owner, owner)

    def stale(self, now: int) -> bool:
        """Open, and its owner's lease has run out (or it never had one)."""
        return self.status == "reserved" and (
            self.lease_expires_at is None or self.lease_expires_at <= now
        )


@dataclass(frozen=True)
class CentralEvent:
    """One event of a settled central release, for RDP/PLD recomposition."""

    reservation_id: str
    subject: str
    purpose: str
    epsilon_spent: Decimal
    delta_spent: Decimal
    settled_at: int
    event: Mapping[str, object]


#: How `open_ledger` may touch the database (see there).
Access: TypeAlias = Literal["create", "write", "read"]


class LedgerError(Exception):
    """Base of the ledger's domain errors."""


class LedgerOpenError(LedgerError, ValueError):
    """The ledger cannot be opened as asked: bad URL, missing file or folder, not a
    fedldp ledger, or not at this code's migration (the message says what to do)."""


class NoCentralCapError(LedgerError):
    """No central cap is set for (subject, purpose); an operator must set one first."""


class CentralBudgetExhaustedError(LedgerError):
    """The reservation would take (subject, purpose) above its central cap."""


class CentralSpendUnconfirmedError(LedgerError):
    """The ledger was restored from a backup and the central spend made after the
    backup is unconfirmed: no central reservation until `confirm_central`."""


class NothingToConfirmError(LedgerError):
    """No restore of this ledger awaits confirmation of its central spend."""


class IdempotencyConflictError(LedgerError):
    """The idempotency key was used before for a different reservation."""


class ReservationNotFoundError(LedgerError, KeyError):
    """No reservation has this id."""


class ReservationStateError(LedgerError, ValueError):
    """The reservation is not in a state that allows this transition."""


class ReservationOwnedError(LedgerError):
    """Another run holds this reservation (its owner token differs): never run twice."""


class DataOpenedError(ReservationStateError):
    """The run declared it opened the protected data: the reservation cannot be cancelled."""


class LeaseActiveError(ReservationStateError):
    """The reservation's owner still holds a live lease: an operator may not settle it yet."""


#: A claim's lease when the caller names none: an owner renews it while it works.
DEFAULT_LEASE_SECONDS = 600


# --- helpers ---------------------------------------------------------------------------


def _dec(text: str) -> Decimal:
    return Decimal(text)


def _s(value: Decimal) -> str:
    return str(value)


def _exact_decimal(name: str, value: object, *, positive: bool) -> Decimal:
    if not isinstance(value, Decimal):
        raise TypeError(f"{name} must be a decimal.Decimal (exact), not {type(value).__name__}")
    if not value.is_finite():
        raise ValueError(f"{name} must be finite")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive")
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value
