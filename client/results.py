"""The SDK's public result and error types: what `fedldp.Client` returns and raises.

Plain, frozen values with no behaviour: a result carries bookkeeping only (ids,
versions, window starts, exact epsilon), never a recorded value, and an error's
message never contains the value either. Every refusal of `Client.record` is a
`RecordRefusedError` (defined with the outbox, which raises `OutboxFullError`)
with a stable upper-case `reason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from fedldp.client.outbox import RecordRefusedError

# --- errors -------------------------------------------------------------------------------


class NoPolicyError(RecordRefusedError):
    """No verified, active policy covers the metric; the message says why.

    `reason` is "NO_POLICY" (no policy for this metric was fetched: check the
    metric name; policies rejected for *other* metrics do not change this),
    "POLICY_REJECTED" (a policy for this metric was fetched but failed
    verification), "POLICY_INACTIVE" (expired, not yet valid, or its key
    expired), "AMBIGUOUS_POLICY" (several policies cover the metric: pass
    `policy_id`) or "UNSUPPORTED_POLICY" (this SDK cannot run the policy's
    mechanism).
    """

    reason = "NO_POLICY"


class BudgetGuardError(RecordRefusedError):
    """Recording would pass the policy's epsilon cap in this window (device's own ledger)."""

    reason = "BUDGET_EXHAUSTED"


class BadValueError(RecordRefusedError, ValueError):
    """The value does not fit the metric (wrong type, unknown label, not finite).

    The message never contains the value itself.
    """

    reason = "BAD_VALUE"


class ClientClosedError(RuntimeError):
    """The client was closed; create a new one."""


# --- results ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecordResult:
    """What `record()` stored. Contains no value, only bookkeeping."""

    report_id: bytes
    policy_id: str
    policy_version: int
    window_start: int
    epsilon_charged: Decimal
    epsilon_spent: Decimal
    epsilon_remaining: Decimal
    #: True when a numeric value was outside the policy's range and was clipped to it.
    clipped: bool = False


#: `FlushResult.stopped` values: why a flush returned.
FLUSH_STOPPED = ("DONE", "PAUSED", "SENDER_BUSY", "NOT_DUE", "TIMEOUT", "CLOSED")


@dataclass(frozen=True)
class FlushResult:
    """What one `flush()` achieved: reports acknowledged (duplicates among them),
    refused for good, failed calls, reports still pending, the last error, and
    why it stopped.

    `stopped` is one of `FLUSH_STOPPED`:

    * ``DONE``: nothing is left to send (the outbox is empty);
    * ``PAUSED``: sending is paused (the device's backoff after a failed call,
      or the collector's retry hint) past the flush's timeout;
      `paused_until` says until when (Unix seconds);
    * ``SENDER_BUSY``: another sender on the same state folder (another
      process or `Client`) had a Submit call in flight when the timeout ran out;
    * ``NOT_DUE``: the reports left wait for their own retry time (an outcome
      this SDK did not know) past the timeout; `paused_until` is the earliest;
    * ``TIMEOUT``: reports were still being sent when the timeout ran out;
    * ``CLOSED``: the client was closed meanwhile.

    A flush waits for a pause or a busy sender up to its timeout before it
    stops for that reason, so ``while c.pending(): c.flush(timeout=t)`` makes
    one call per `t` seconds while sending is paused, not a busy loop.
    """

    acknowledged: int = 0
    duplicates: int = 0
    refused: int = 0
    failed_attempts: int = 0
    pending: int = 0
    last_error: str | None = None
    stopped: str = "DONE"
    #: When sending may resume (Unix seconds) if `stopped` is PAUSED or NOT_DUE, else None.
    paused_until: float | None = None


@dataclass(frozen=True)
class PolicyRefresh:
    """Outcome of `refresh_policies()`: policy ids accepted, rejections with reasons."""

    accepted: tuple[str, ...]
    rejected: Mapping[str, str]
    root_version: int


@dataclass(frozen=True)
class BudgetStatus:
    """The device ledger's view of one policy's current window."""

    policy_id: str
    policy_version: int
    window_start: int
    window_end: int
    epsilon_cap: Decimal
    epsilon_spent: Decimal
    epsilon_remaining: Decimal
    #: What one report costs: the mechanism's `report_charge` (its epsilon, or a
    #: memoized mechanism's exact joint-loss rate).
    epsilon_per_report: Decimal


__all__ = [
    "FLUSH_STOPPED",
    "BadValueError",
    "BudgetGuardError",
    "BudgetStatus",
    "ClientClosedError",
    "FlushResult",
    "NoPolicyError",
    "PolicyRefresh",
    "RecordRefusedError",
    "RecordResult",
]
