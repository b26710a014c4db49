"""Record: check, randomize once, and store the report with its charge in one transaction.

The device's side of the privacy contract, in order (see `Recorder.record`):

1. **Value check.** `_mechanism_input` maps the value to the mechanism's input
   (a label's index, or a finite number clipped to the policy's range) and
   refuses a value that does not fit with `BadValueError`, never echoing it.
2. **Budget guard.** In the transaction that will store the report, the
   device's own spend in the policy's window plus the policy's `charge` (the
   mechanism's `report_charge`, what the collector's ledger charges) must stay
   within the cap, else `BudgetGuardError`; the outbox must have room, else
   `OutboxFullError`. Every check runs before randomizing.
3. **Randomize once.** The mechanism randomizes with the client's `rng` (None:
   the OS CSPRNG); a memoized policy reuses its stored permanent response. The
   report gets 16 random bytes as its id, the hour-truncated time, and the
   payload; its exact serialized bytes, the charge and the counter are written
   in the same SQLite transaction, so there is no charge without its report.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from fedldp.client.device_store import EXACT, DeviceStore, Event
from fedldp.client.events import EventSink
from fedldp.client.mechanisms.base import Output
from fedldp.client.mechanisms.memo import Memoized
from fedldp.client.outbox import Outbox, OutboxFullError, RecordRefusedError
from fedldp.client.policy import VerifiedPolicy
from fedldp.client.policy.validation import MEMOIZED_CHARGING
from fedldp.client.report_ids import ReportIds
from fedldp.client.results import BadValueError, BudgetGuardError, NoPolicyError, RecordResult
from fedldp.client.wire import fill_payload
from fedldp.v1 import collector_pb2

#: Reports carry their creation time truncated to this many seconds (one hour).
COARSE_TIME_SECONDS = 3600


class Recorder:
    """Randomizes values under verified policies and stores the reports (thread-safe).

    Owns the report-id generator; shares the client's state file, outbox and
    event sink. `rng` None is the OS CSPRNG (pass a seeded `random.Random` only
    in tests and simulations).
    """

    def __init__(
        self,
        store: DeviceStore,
        outbox: Outbox,
        events: EventSink,
        *,
        rng: random.Random | None,
    ) -> None:
        """A recorder writing to `store` and `outbox`; refusals go to `events`."""
        self._store = store
        self._outbox = outbox
        self._events = events
        self._rng = rng
        self._report_ids = ReportIds()

    def record(self, policy: VerifiedPolicy, value: object, now: int) -> RecordResult:
        """Randomize `value` under `policy` at Unix time `now` and store the report.

        Raises `BadValueError`, `NoPolicyError` (UNSUPPORTED_POLICY),
        `BudgetGuardError` or `OutboxFullError` having changed nothing but the
        refusal's counter and event (see `refused`, which the caller runs).
        """
        mechanism_input, clipped = _mechanism_input(policy, value)
        memo = _memo_adapter(policy)
        return self._randomize_and_store(policy, mechanism_input, clipped, memo, now)

    def _randomize_and_store(
        self,
        policy: VerifiedPolicy,
        mechanism_input: Any,
        clipped: bool,
        memo: Memoized | None,
        now: int,
    ) -> RecordResult:
        window = policy.window_start(now)
        with self._store.transaction() as conn:
            # Every check before randomizing: a refused value is never randomized.
            self._outbox.ensure_room(conn)
            spent = DeviceStore.spent(conn, policy.policy_id, window)
            charge = policy.charge  # the mechanism's report_charge: what a report costs
            if EXACT.compare(EXACT.add(spent, charge), policy.epsilon_cap) > 0:
                raise BudgetGuardError(
                    f"policy {policy.policy_id}: this device has spent {spent} of its epsilon "
                    f"cap {policy.epsilon_cap} in the window starting {window}; one more "
                    f"report costs {charge}. Recording resumes at "
                    f"{window + policy.window_seconds}"
                )
            if memo is None:
                output = policy.mechanism.perturb(mechanism_input, rng=self._rng)
            else:
                output = self._perturb_memoized(conn, policy, memo, mechanism_input)
            report_id = self._report_ids.next()
            report = collector_pb2.Report(
                report_id=report_id,
                policy_id=policy.policy_id,
                policy_version=policy.version,
                policy_digest=policy.digest,
                coarse_time=now - now % COARSE_TIME_SECONDS,
            )
            fill_payload(report, output)
            analyzer_key = policy.analyzer_public_key
            if analyzer_key is not None:  # a shuffle-model policy: only the analyzer reads it
                from fedldp.client.sealed import seal_report

                seal_report(report, analyzer_key)
            Outbox.add(
                conn,
                report_id=report_id,
                policy_id=policy.policy_id,
                policy_version=policy.version,
                window_start=window,
                epsilon=charge,
                report=report.SerializeToString(),
                created_at=now,
            )
            total = DeviceStore.charge(
                conn, policy.policy_id, window, policy.window_seconds, charge, spent=spent
            )
            DeviceStore.bump(conn, "recorded")
        return RecordResult(
            report_id=report_id,
            policy_id=policy.policy_id,
            policy_version=policy.version,
            window_start=window,
            epsilon_charged=charge,
            epsilon_spent=total,
            epsilon_remaining=EXACT.subtract(policy.epsilon_cap, total),
            clipped=clipped,
        )

    def _perturb_memoized(
        self,
        conn: sqlite3.Connection,
        policy: VerifiedPolicy,
        memo: Memoized,
        value: Any,
    ) -> Output:
        """A memoized report: the stored permanent responses, randomized again.

        Erlingsson et al., CCS 2014, Section 3. The slots the mechanism names
        (`Memoized.memo_slots`: the value's permanent response; for loloha and
        dbitflip first their seed) are loaded for (metric, mechanism parameters);
        whatever the mechanism draws for the first time is saved in this same
        transaction (with the report and its charge) and reused by every later
        report, under any policy version with the same parameters.
        """
        state = memo.new_memo()
        loaded: set[int] = set()
        while True:
            wanted = [s for s in memo.memo_slots(value, state) if s not in loaded]
            if not wanted:
                break
            for slot in wanted:
                loaded.add(slot)
                stored = DeviceStore.load_memo(
                    conn, policy.metric_name, memo.memo_key, self._slot_key(conn, policy, slot)
                )
                if stored is not None:
                    state.responses[slot] = stored
        before = set(state.responses)
        # Every concrete Memoized mechanism takes memo= (memo.py); the base type does not.
        memoized: Any = memo
        output: Output = memoized.perturb(value, rng=self._rng, memo=state)
        for slot in sorted(set(state.responses) - before):
            DeviceStore.save_memo(
                conn,
                policy.metric_name,
                memo.memo_key,
                self._slot_key(conn, policy, slot),
                state.responses[slot],
            )
        return output

    def _slot_key(self, conn: sqlite3.Connection, policy: VerifiedPolicy, slot: int) -> bytes:
        """The stored key of a memo slot: the keyed hash of its 4-byte big-endian number
        (a value index, as before; negative slots, e.g. a seed, in two's complement)."""
        return self._store.memo_key(conn, policy.metric_name, slot.to_bytes(4, "big", signed=True))

    def refused(self, exc: RecordRefusedError, now: int, metric: str) -> None:
        """Count a refusal of `record()` for `metric` and emit its event (never the value)."""
        event = Event(now, "record_refused", exc.reason, f"metric {metric!r}: {exc}")
        try:
            with self._store.transaction() as conn:
                DeviceStore.bump(conn, f"record_refused_{exc.reason.lower()}")
                if isinstance(exc, OutboxFullError):
                    DeviceStore.bump(conn, "dropped_outbox_full")
                DeviceStore.add_event(conn, event)
        finally:
            self._events.emit(event)


def _mechanism_input(policy: VerifiedPolicy, value: object) -> tuple[Any, bool]:
    """The mechanism's input for `value`, and whether it was clipped. Never echoes it."""
    where = f"metric {policy.metric_name!r}"
    if policy.labels is not None:
        if not isinstance(value, str):
            raise BadValueError(
                f"{where} is categorical: pass the value's label as a str, not "
                f"{type(value).__name__}"
            )
        try:
            return policy.label_index(value), False
        except ValueError as exc:
            raise BadValueError(str(exc)) from None
    if policy.open_domain is not None:
        try:
            policy.open_domain.encode(value)  # type: ignore[arg-type]  # checked inside
        except ValueError as exc:
            raise BadValueError(f"{where}: {exc}") from None
        return value, False
    if policy.attributes is not None:
        return _multi_input(policy, value)
    assert policy.numeric_range is not None
    return _numeric_input(policy.numeric_range, where, value)


def _numeric_input(
    numeric_range: tuple[Decimal, Decimal], where: str, value: object
) -> tuple[float, bool]:
    """A finite number clipped to `numeric_range` (as a float), and whether it was clipped."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise BadValueError(
            f"{where} is numeric: pass an int, float or Decimal, not {type(value).__name__}"
        )
    try:
        exact = value if isinstance(value, Decimal) else Decimal(value)
    except (InvalidOperation, ValueError, OverflowError):
        raise BadValueError(f"{where}: value is not a number") from None
    if not exact.is_finite() or (isinstance(value, float) and not math.isfinite(value)):
        raise BadValueError(f"{where}: value must be finite")
    lo, hi = numeric_range
    clipped = min(max(exact, lo), hi)
    return float(clipped), clipped != exact


def _multi_input(policy: VerifiedPolicy, value: object) -> tuple[tuple[Any, ...], bool]:
    """A multi-attribute metric's input: a dict naming every attribute exactly once, each
    value checked like a single metric's (labels mapped, numbers clipped). Errors name
    attributes and types, never values (nor unknown keys, which the app may have filled
    with user data)."""
    attributes = policy.attributes
    assert attributes is not None
    names = [a.name for a in attributes]
    if not isinstance(value, Mapping):
        raise BadValueError(
            f"metric {policy.metric_name!r} has attributes {names}: pass a dict of them, "
            f"not {type(value).__name__}"
        )
    missing = [name for name in names if name not in value]
    if missing:
        raise BadValueError(f"metric {policy.metric_name!r}: missing attribute(s) {missing}")
    if len(value) != len(names):
        raise BadValueError(
            f"metric {policy.metric_name!r}: {len(value) - len(names)} key(s) that are not "
            f"attributes; pass exactly {names}"
        )
    inputs: list[Any] = []
    clipped = False
    for index, spec in enumerate(attributes):
        item = value[spec.name]
        where = f"metric {policy.metric_name!r} attribute {spec.name!r}"
        if spec.labels is not None:
            if not isinstance(item, str):
                raise BadValueError(
                    f"{where} is categorical: pass the value's label as a str, not "
                    f"{type(item).__name__}"
                )
            try:
                inputs.append(policy.attribute_label_index(index, item))
            except ValueError as exc:
                raise BadValueError(f"metric {policy.metric_name!r} {exc}") from None
        else:
            assert spec.numeric_range is not None
            number, was_clipped = _numeric_input(spec.numeric_range, where, item)
            inputs.append(number)
            clipped = clipped or was_clipped
    return tuple(inputs), clipped


def _memo_adapter(policy: VerifiedPolicy) -> Memoized | None:
    """The memoized mechanism of a memoized policy (None: not memoized).

    A policy charged as memoized whose mechanism this SDK cannot memoize is
    refused rather than run without its permanent responses.
    """
    if policy.memo_charging not in MEMOIZED_CHARGING:
        return None
    if isinstance(policy.mechanism, Memoized):
        return policy.mechanism
    raise NoPolicyError(
        f"policy {policy.policy_id} v{policy.version} is charged as memoized but mechanism "
        f"{policy.mechanism_id!r} has no permanent responses in this SDK; upgrade the SDK",
        reason="UNSUPPORTED_POLICY",
    )


__all__ = ["COARSE_TIME_SECONDS", "Recorder"]
