"""The device SDK: record values under local differential privacy, send them reliably.

A few lines to use::

    import fedldp
    from decimal import Decimal

    with fedldp.Client(
        collector="collector.example:443",
        trust_root="/app/trust",                 # pinned root keys + root envelopes
        state_dir="/data/app/fedldp",            # the on-device state (one SQLite file)
        credentials="device-token",              # bearer token over TLS
        max_epsilon=Decimal("2"),                # this device's own per-report maximum
    ) as client:
        client.record("browser.homepage", "news.example")   # randomized now, sent later
        client.record("session.minutes", 42.5)               # numbers for numeric metrics
        client.flush()                                       # or background=True

What happens, in order (see docs/sdk.md for the full contract):

1. **Policy.** `record(metric, value)` looks up the cached, verified policy for
   `metric` (fetched with GetPolicies, verified by `verify_policy` against the
   pinned trust root, the stored highest versions and this device's maximum
   epsilon). Without one it raises `NoPolicyError`, saying why.
2. **Budget guard.** The device keeps its own ledger of epsilon per policy and
   window, and refuses (`BudgetGuardError`) before randomizing when the charge
   would pass the policy's cap, whatever the collector would accept. A report
   costs the policy's `charge` (the mechanism's `report_charge`), exactly what
   the collector's ledger charges.
3. **Randomize once.** The value is randomized now (OS CSPRNG), the report gets
   16 random bytes as its id, and its exact serialized bytes are written to the
   outbox together with the budget charge in one SQLite transaction (WAL,
   synchronous FULL). Nothing is sent before that transaction commits.
4. **Send.** `flush()` (or the background sender) submits the stored bytes,
   unchanged, until the collector acknowledges them. A failed call (no answer,
   or a refusal with a ``retry-after-ms`` hint) pauses *all* sending to that
   collector (one backoff per device: exponential with full jitter, never
   shorter than the hint); then one batch goes first as a probe, and the rest
   follow once it succeeded. `wake()` (e.g. from a network-change callback) and
   `flush(retry_now=True)` retry at once. Permanent refusals are not retried and
   leave an event.

The wire carries only the randomizer's output and the policy's identity: the
report's fields are the id, the policy (id, version, digest), the hour-truncated
time and the payload, serialized the same way whatever the true value was; sends
happen on the sender's schedule, never inside `record()`.

Thread-safe: every method may be called from any thread. For asyncio see
`fedldp.client.aio.AsyncClient`. Base install only: grpcio, protobuf,
cryptography and the standard library.
"""

from __future__ import annotations

import logging
import math
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.client.device_store import EXACT, DeviceStore, Event, StoredPolicy
from fedldp.client.mechanisms.base import Output
from fedldp.client.mechanisms.memo import Memoized
from fedldp.client.outbox import (
    DEFAULT_MAX_REPORTS,
    SLOT_MARGIN_SECONDS,
    Outbox,
    OutboxEntry,
    OutboxFullError,
    RecordRefusedError,
    SendGate,
)
from fedldp.client.policy import (
    PolicyError,
    TrustStore,
    VerifiedPolicy,
    WindowChangeError,
    verify_policy,
)
from fedldp.client.policy.validation import MEMOIZED_CHARGING
from fedldp.client.report_ids import ReportIds
from fedldp.client.transport import Backoff, Credentials, Transport, TransportError, jitter_rng
from fedldp.client.wire import fill_payload
from fedldp.v1 import collector_pb2, policy_pb2
from google.protobuf.message import DecodeError

logger = logging.getLogger("fedldp.client")

#: Reports carry their creation time truncated to this many seconds (one hour).
COARSE_TIME_SECONDS = 3600

#: Outcomes that acknowledge a report (the collector committed it, now or before).
_ACKNOWLEDGED = frozenset({collector_pb2.OUTCOME_ACCEPTED, collector_pb2.OUTCOME_DUPLICATE})
#: Outcomes that refuse a report for good: retrying the same bytes cannot succeed.
_PERMANENT = frozenset(
    {
        collector_pb2.OUTCOME_BUDGET_EXHAUSTED,
        collector_pb2.OUTCOME_INVALID,
        collector_pb2.OUTCOME_UNKNOWN_POLICY,
        collector_pb2.OUTCOME_EXPIRED_POLICY,
        collector_pb2.OUTCOME_CONFLICT,
    }
)


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


# --- configuration and results --------------------------------------------------------------


@dataclass(frozen=True)
class TrustRoot:
    """Pinned root public keys and the root envelope they signed (shipped with the app).

    `pinned_keys` are Ed25519 public keys (objects or raw 32 bytes); `root_envelope`
    a `fedldp.v1.SignedEnvelope` (object or serialized bytes). Later roots arrive
    from the collector and are accepted only by the TUF rotation rule.
    """

    root_envelope: policy_pb2.SignedEnvelope | bytes
    pinned_keys: Sequence[Ed25519PublicKey | bytes]

    def trust_store(self, *, now: int) -> TrustStore:
        """Verify the root against the pinned keys."""
        envelope = (
            policy_pb2.SignedEnvelope.FromString(self.root_envelope)
            if isinstance(self.root_envelope, bytes)
            else self.root_envelope
        )
        keys = [
            Ed25519PublicKey.from_public_bytes(k) if isinstance(k, bytes) else k
            for k in self.pinned_keys
        ]
        return TrustStore.from_pinned_root(envelope, keys, now=now)


TrustRootLike = TrustStore | TrustRoot | str | os.PathLike[str]


def _trust_from(trust_root: TrustRootLike, *, now: int) -> TrustStore:
    """Build the configured trust store (see `Client`'s `trust_root`)."""
    if isinstance(trust_root, TrustStore):
        return trust_root.copy()  # a private copy
    if isinstance(trust_root, TrustRoot):
        return trust_root.trust_store(now=now)
    from fedldp.client.policy.files import load_trust_folder, read_envelope

    path = Path(trust_root)
    if path.is_dir():
        return load_trust_folder(path, now=now)
    envelope = read_envelope(path)
    try:
        root = policy_pb2.Root.FromString(envelope.payload)
    except DecodeError as exc:
        raise PolicyError(f"{path.name} does not hold a root envelope ({exc})") from None
    # A lone root file ships inside the app: its own root keys are the pins.
    pins = [Ed25519PublicKey.from_public_bytes(k.ed25519) for k in root.root_keys]
    return TrustStore.from_pinned_root(envelope, pins, now=now)


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


@dataclass(frozen=True)
class FlushResult:
    """What one `flush()` achieved."""

    acknowledged: int = 0
    duplicates: int = 0
    refused: int = 0
    failed_attempts: int = 0
    pending: int = 0
    last_error: str | None = None


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


EventCallback = Callable[[Event], None]


# --- the client -----------------------------------------------------------------------------


class Client:
    """The device SDK. See the module docstring for the lifecycle of a value.

    Parameters:
        collector: the collector's ``host:port``.
        trust_root: what this device trusts to sign policies: a folder with
            ``pinned/*.pem`` and ``*.root`` files, a single root envelope file
            (its own root keys are pinned: ship it inside the app), a `TrustRoot`
            or a `TrustStore`. On later starts the stored trust (which may have
            followed root rotations) is used as long as its pins match.
        state_dir: directory of the device state file (created, mode 0700).
        credentials: a bearer token (TLS with system roots) or `Credentials`.
        max_epsilon: this device's per-report maximum; policies above it are refused.
        max_epsilon_cap: this device's maximum cap per window; policies above it are
            refused.
        audience: the collector deployment this device talks to; policies not
            addressed to it are refused (None: no check).
        max_outbox: bound on unsent reports; when full, `record()` refuses (see
            `fedldp.client.outbox` for why refuse-new rather than drop-oldest).
        batch_size: reports per Submit call.
        backoff: retry timing (`Backoff`), one backoff state per device and
            collector (`fedldp.client.outbox.SendGate`); gRPC's reconnect backoff
            is configured from it (`fedldp.client.transport.channel_options`).
        timeout_seconds: a call's deadline, enforced on the device.
        background: start a sender thread that flushes every
            `send_interval_seconds` (or when a backoff ends, or on `wake()`) and
            refreshes policies every `policy_refresh_seconds`.
        fetch_policies: fetch policies in the constructor when the cache is older
            than `policy_refresh_seconds` (a failure is logged, not raised: an
            offline device still records under cached policies).
        on_event: called with each `Event` (drops, refusals, rejected policies,
            transport errors); exceptions in it are logged and swallowed.
        rng: randomness for the mechanisms. None (default) is the OS CSPRNG; pass a
            seeded `random.Random` only in tests and simulations. Report ids
            (`fedldp.client.report_ids`) and backoff jitter always come from the
            OS CSPRNG.
        clock: Unix time in seconds for policy validity, budget windows and report
            times (tests pass a fake clock). Retry scheduling uses the real clock.
        channel: an existing gRPC channel to share instead of dialing `collector`
            (fleet simulations; see `Transport`). Not closed by `close()`.
    """

    def __init__(
        self,
        collector: str,
        *,
        trust_root: TrustRootLike,
        state_dir: str | os.PathLike[str],
        credentials: Credentials | str,
        max_epsilon: Decimal | None = None,
        max_epsilon_cap: Decimal | None = None,
        audience: str | None = None,
        max_outbox: int = DEFAULT_MAX_REPORTS,
        batch_size: int = 100,
        backoff: Backoff | None = None,
        timeout_seconds: float = 30.0,
        background: bool = False,
        send_interval_seconds: float = 60.0,
        policy_refresh_seconds: float = 3600.0,
        fetch_policies: bool = True,
        on_event: EventCallback | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
        channel: grpc.Channel | None = None,
    ) -> None:
        for name, limit in (("max_epsilon", max_epsilon), ("max_epsilon_cap", max_epsilon_cap)):
            if limit is not None and (
                not isinstance(limit, Decimal) or not limit.is_finite() or limit <= 0
            ):
                raise TypeError(f"{name} must be a positive, finite decimal.Decimal (exact)")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError("batch_size must be a positive integer")
        if send_interval_seconds <= 0 or policy_refresh_seconds <= 0:
            raise ValueError("send_interval_seconds and policy_refresh_seconds must be positive")
        if isinstance(credentials, str):
            credentials = Credentials.bearer(credentials)
        self._clock = clock
        self._rng = rng
        self._report_ids = ReportIds()
        self._jitter = jitter_rng()
        self._max_epsilon = max_epsilon
        self._max_epsilon_cap = max_epsilon_cap
        self._audience = audience
        self._batch_size = batch_size
        self._backoff = backoff or Backoff()
        self._send_interval = send_interval_seconds
        self._policy_refresh = policy_refresh_seconds
        self._on_event = on_event
        self._lock = threading.RLock()  # policy cache and trust store
        self._send_lock = threading.Lock()  # one sender at a time; guards the gate
        self._closing = threading.Event()
        self._signal = _Signal()  # wakes a waiting flush() or sender thread
        self._retry_requested = threading.Event()  # set by wake(), applied by the sender
        self._gate = SendGate(
            collector,
            self._backoff,
            self._jitter,
            lease_seconds=timeout_seconds + SLOT_MARGIN_SECONDS,
        )
        self._closed = False
        self._thread: threading.Thread | None = None
        self._policies: dict[str, VerifiedPolicy] = {}
        #: Rejected policies: label -> (the metric it claims, unverified, or None; why).
        self._rejections: dict[str, tuple[str | None, str]] = {}

        self._store = DeviceStore(state_dir)
        try:
            self._outbox = Outbox(self._store, max_reports=max_outbox)
            fetched_at = self._load_state(trust_root)
            self._transport = Transport(
                collector,
                credentials,
                timeout_seconds=timeout_seconds,
                channel=channel,
                backoff=self._backoff,
            )
        except BaseException:
            self._store.close()
            raise
        if fetch_policies and (
            fetched_at is None or self._clock() - float(fetched_at) >= self._policy_refresh
        ):
            try:
                self.refresh_policies()
            except TransportError as exc:
                logger.warning("fedldp: policy fetch failed (%s); using cached policies", exc.code)
        if background:
            self.start_background()

    # --- lifecycle ---

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop the background sender, close the channel and the state file (idempotent).

        Unsent reports stay in the outbox and are sent by the next Client on the
        same `state_dir`, which also honours a backoff in progress. The state
        file's write-ahead log is checkpointed into it and removed, so a closed
        client leaves one file in `state_dir` (unless another process still has
        the same state open).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._closing.set()
        self._signal.notify()
        if self._thread is not None:
            self._thread.join()
        with self._send_lock:
            self._transport.close()
            self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this fedldp.Client is closed; create a new one")

    @property
    def state_path(self) -> Path:
        """The device state file."""
        return self._store.path

    # --- trust and policies ---

    def _load_state(self, trust_root: TrustRootLike) -> str | None:
        """Load the trust store and the cached policies; return the last fetch time.

        One transaction reads everything the client starts from (stored trust,
        highest versions, cached envelopes, last fetch time) and saves the
        configured trust when it replaces the stored one. The cached envelopes are
        then re-verified (the state file is not trusted blindly).
        """
        now = int(self._clock())
        configured = _trust_from(trust_root, now=now)
        events: list[Event] = []
        with self._store.transaction() as conn:
            self._trust = self._load_trust(conn, configured, now, events)
            highest = DeviceStore.read_highest_versions(conn)
            cached = DeviceStore.read_policies(conn)
            fetched_at = DeviceStore.read_meta(conn, "policies_fetched_at")
            self._gate.load(conn, now=time.time())
        for event in events:
            self._emit(event)
        loaded: dict[str, VerifiedPolicy] = {}
        for stored in cached:
            try:
                envelope = policy_pb2.SignedEnvelope.FromString(stored.envelope)
                loaded[stored.policy_id] = self._verify(envelope, now, highest)
            except (PolicyError, DecodeError) as exc:
                self._rejections[stored.policy_id] = (
                    stored.metric,
                    f"cached policy no longer verifies: {exc}",
                )
        with self._lock:
            self._policies = loaded
        return fetched_at

    @staticmethod
    def _load_trust(
        conn: sqlite3.Connection, configured: TrustStore, now: int, events: list[Event]
    ) -> TrustStore:
        """The stored trust if it follows the configured pins, else the configured one (saved)."""
        stored = DeviceStore.read_trust(conn)
        if stored is not None:
            try:
                trust = TrustStore.from_bytes(stored)
            except PolicyError as exc:
                events.append(Event(now, "root_rejected", "STORED_TRUST_INVALID", str(exc)))
            else:
                if trust.pinned_key_ids == configured.pinned_key_ids and (
                    trust.root_version >= configured.root_version
                ):
                    return trust
        DeviceStore.save_trust(conn, configured.to_bytes(), configured.root_version)
        if stored is not None:
            # New pins (app update): cached policies were verified under the old
            # ones, so verify everything afresh.
            conn.execute("DELETE FROM policies")
        return configured

    def _verify(
        self, envelope: policy_pb2.SignedEnvelope, now: int, highest: Mapping[str, int]
    ) -> VerifiedPolicy:
        return verify_policy(
            envelope,
            self._trust,
            now=now,
            highest_versions=highest,
            max_epsilon=self._max_epsilon,
            max_epsilon_cap=self._max_epsilon_cap,
            audience=self._audience,
        )

    def refresh_policies(self) -> PolicyRefresh:
        """Fetch roots and policies from the collector, verify them, cache the good ones.

        Newer roots are applied by the TUF rotation rule first; each policy envelope
        is then verified (`verify_policy`: signature over the exact bytes by a key
        the trusted root delegates to, content, validity, rollback against the
        highest version stored for its id, this device's epsilon maximums,
        audience). Rejected envelopes leave an event and are never used. Cached
        policies the collector no longer serves are dropped (their highest
        version stays, so an old version cannot come back).

        Raises `TransportError` when the collector cannot be reached; the cache is
        then unchanged.
        """
        self._check_open()
        with self._lock:
            known_root_version = self._trust.root_version
        # The network call holds no lock: record() keeps working meanwhile.
        response = self._transport.get_policies(known_root_version=known_root_version)
        # One transaction reads the rollback floors and the cache, and writes the
        # result: another process sharing the state file cannot interleave.
        with self._lock:
            with self._store.transaction() as conn:
                now = int(self._clock())
                rejection_events: list[Event] = []
                trust = self._trust.copy()
                loaded_root_version = trust.root_version
                try:
                    trust.update_roots(list(response.roots), now=now)
                except PolicyError as exc:  # the roots applied before the bad one stay
                    rejection_events.append(
                        Event(now, "root_rejected", type(exc).__name__, str(exc))
                    )
                self._trust = trust
                highest = DeviceStore.read_highest_versions(conn)
                cached = {p.policy_id: p for p in DeviceStore.read_policies(conn)}
                accepted: dict[str, VerifiedPolicy] = {}
                rejected: dict[str, tuple[str | None, str]] = {}
                for envelope in response.policies:
                    try:
                        verified = self._verify(envelope, now, highest)
                    except PolicyError as exc:
                        label, claimed_metric = _unverified_claim(envelope)
                        rejected[label] = (claimed_metric, str(exc))
                        rejection_events.append(
                            Event(now, "policy_rejected", type(exc).__name__, str(exc), label)
                        )
                        continue
                    known = cached.get(verified.policy_id)
                    if (
                        known is not None
                        and known.version == verified.version
                        and (known.digest != verified.digest)
                    ):
                        reason = (
                            f"policy {verified.policy_id} v{verified.version} differs from the "
                            "version already accepted under the same number; a changed policy "
                            "needs a higher version"
                        )
                        rejected[verified.policy_id] = (verified.metric_name, reason)
                        rejection_events.append(
                            Event(
                                now,
                                "policy_rejected",
                                "ConflictingPolicyError",
                                reason,
                                verified.policy_id,
                            )
                        )
                        continue
                    change = _window_change(conn, verified)
                    if change is not None:
                        rejected[verified.policy_id] = (verified.metric_name, str(change))
                        rejection_events.append(
                            Event(
                                now,
                                "policy_rejected",
                                type(change).__name__,
                                str(change),
                                verified.policy_id,
                            )
                        )
                        continue
                    previous = accepted.get(verified.policy_id)
                    if previous is None or verified.version > previous.version:
                        accepted[verified.policy_id] = verified
                if trust.root_version != loaded_root_version:
                    # Rotated: persist. Otherwise the stored trust is already this one
                    # (loaded or saved by _load_state) or a newer one another process
                    # sharing the state file saved, which must not be overwritten.
                    DeviceStore.save_trust(conn, trust.to_bytes(), trust.root_version)
                # The collector's list is authoritative for what is active: drop the rest
                # (their highest versions stay, so they cannot come back older).
                if cached:
                    conn.execute("DELETE FROM policies")
                for verified in accepted.values():
                    DeviceStore.save_policy(
                        conn,
                        StoredPolicy(
                            policy_id=verified.policy_id,
                            version=verified.version,
                            metric=verified.metric_name,
                            envelope=verified.envelope.SerializeToString(),
                            digest=verified.digest,
                            epsilon=verified.epsilon,
                            expires_at=verified.expires_at,
                            fetched_at=now,
                        ),
                    )
                for event in rejection_events:
                    DeviceStore.bump(conn, f"{event.kind}s")
                    DeviceStore.add_event(conn, event)
                DeviceStore.set_meta(conn, "policies_fetched_at", str(now))
            self._policies = accepted
            self._rejections = rejected
        for event in rejection_events:
            self._emit(event)
        return PolicyRefresh(
            tuple(sorted(accepted)),
            {label: why for label, (_, why) in rejected.items()},
            trust.root_version,
        )

    def policies(self) -> list[VerifiedPolicy]:
        """The verified policies currently cached (active or not), by policy id."""
        with self._lock:
            return [self._policies[k] for k in sorted(self._policies)]

    def _policy_for(self, metric: str, policy_id: str | None, now: int) -> VerifiedPolicy:
        with self._lock:
            candidates = [
                p
                for p in self._policies.values()
                if p.metric_name == metric and (policy_id is None or p.policy_id == policy_id)
            ]
            rejections = dict(self._rejections)
            trust = self._trust
        active: list[VerifiedPolicy] = []
        inactive: list[str] = []
        for p in candidates:
            if not p.is_active(now):
                inactive.append(
                    f"policy {p.policy_id} v{p.version} is valid from {p.not_before} until "
                    f"{p.expires_at}, now is {now}"
                )
                continue
            try:
                trust.policy_key(p.key_id, now=now)
            except PolicyError as exc:
                inactive.append(f"policy {p.policy_id} v{p.version}: {exc}")
                continue
            active.append(p)
        if len(active) == 1:
            return active[0]
        if len(active) > 1:
            ids = ", ".join(sorted(p.policy_id for p in active))
            raise NoPolicyError(
                f"several policies cover metric {metric!r} ({ids}); pass policy_id= to choose",
                reason="AMBIGUOUS_POLICY",
            )
        if inactive:
            raise NoPolicyError(
                f"no active policy for metric {metric!r}: "
                + "; ".join(inactive)
                + "; refresh_policies() fetches newer versions",
                reason="POLICY_INACTIVE",
            )
        # Only rejections of policies that claim this metric explain its absence; a
        # rejected policy whose metric is unknown (undecodable) or another one's is
        # not the cause, and the app should check the metric name.
        ours = {k: why for k, (m, why) in rejections.items() if m == metric}
        if ours:
            listing = "; ".join(f"{k}: {why}" for k, why in sorted(ours.items()))
            raise NoPolicyError(
                f"no verified policy for metric {metric!r}; its policy was fetched but "
                f"rejected: {listing}",
                reason="POLICY_REJECTED",
            )
        fetched = self._store.get_meta("policies_fetched_at")
        note = (
            f" ({len(rejections)} policies for other or unknown metrics were rejected: "
            "see events())"
            if rejections
            else ""
        )
        raise NoPolicyError(
            f"no policy for metric {metric!r} is cached (last fetch: "
            f"{'never' if fetched is None else fetched}){note}; check the metric name, "
            "or call refresh_policies() while the collector is reachable",
            reason="NO_POLICY",
        )

    # --- recording ---

    def record(
        self, metric: str, value: str | int | float | Decimal, *, policy_id: str | None = None
    ) -> RecordResult:
        """Randomize `value` for `metric` now and store the report for sending.

        Categorical metrics take the value's label (a string in the policy's
        domain); numeric metrics take a finite number, clipped to the policy's
        range (`RecordResult.clipped` says when). Does no network I/O.

        Raises a `RecordRefusedError` subclass, having changed nothing, when
        there is no usable policy (`NoPolicyError`), the value does not fit
        (`BadValueError`), the device budget for this window would be passed
        (`BudgetGuardError`) or the outbox is full (`OutboxFullError`). Every
        refusal is counted and reported as an event (without the value).
        """
        self._check_open()
        now = int(self._clock())
        try:
            policy = self._policy_for(metric, policy_id, now)
            mechanism_input, clipped = _mechanism_input(policy, value)
            memo = _memo_adapter(policy)
            return self._randomize_and_store(policy, mechanism_input, clipped, memo, now)
        except RecordRefusedError as exc:
            self._refused(exc, now, metric)
            raise

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
        index: int,
    ) -> Output:
        """RAPPOR-style report: the stored permanent response, randomized again.

        Erlingsson et al., CCS 2014, Section 3. The permanent response of (metric,
        mechanism parameters, value) is drawn once, saved in this same transaction
        (with the report and its charge), and reused by every later report of the
        same value, under any policy version with the same parameters.
        """
        value_key = self._store.memo_key(conn, policy.metric_name, index.to_bytes(4, "big"))
        stored = DeviceStore.load_memo(conn, policy.metric_name, memo.memo_key, value_key)
        state = memo.new_memo()
        if stored is not None:
            state.responses[index] = stored
        # Every concrete Memoized mechanism takes memo= (memo.py); the base type does not.
        memoized: Any = memo
        output: Output = memoized.perturb(index, rng=self._rng, memo=state)
        if stored is None:
            DeviceStore.save_memo(
                conn, policy.metric_name, memo.memo_key, value_key, state.responses[index]
            )
        return output

    def _refused(self, exc: RecordRefusedError, now: int, metric: str) -> None:
        event = Event(now, "record_refused", exc.reason, f"metric {metric!r}: {exc}")
        try:
            with self._store.transaction() as conn:
                DeviceStore.bump(conn, f"record_refused_{exc.reason.lower()}")
                if isinstance(exc, OutboxFullError):
                    DeviceStore.bump(conn, "dropped_outbox_full")
                DeviceStore.add_event(conn, event)
        finally:
            self._emit(event)

    # --- sending ---

    def flush(self, timeout: float | None = 30.0, *, retry_now: bool = False) -> FlushResult:
        """Send pending reports until the outbox is empty or `timeout` seconds pass.

        Obeys the device's backoff (`SendGate`): while it is paused, waits for it
        to end within the timeout (None: no limit), then sends one batch as a
        probe and the rest only after the probe succeeded. `retry_now=True` does
        what `wake()` does first: every pending report is due now, and a
        backoff of the SDK's own ends now (a server's retry hint still runs to
        its end). Returns counts; reports still pending stay in the outbox.
        Never raises for transport failures (they are counted and logged).
        Ends with a checkpoint of the state file (see `DeviceStore.checkpoint`).
        """
        self._check_open()
        if retry_now:
            self._retry_requested.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        totals = _Totals()
        pending: int | None = None
        with self._send_lock:
            while not self._closing.is_set():
                generation = self._signal.generation()
                self._send_due(totals)
                known, totals.schedule = totals.schedule, None
                next_due, pending = known if known is not None else self._outbox.schedule()
                if next_due is None:
                    break
                wait = max(0.0, max(next_due, self._gate.resume_at) - time.time())
                if deadline is not None and time.monotonic() + wait > deadline:
                    break
                pending = None
                if wait > 0:
                    self._signal.wait(generation, wait)
            self._store.checkpoint()
        return totals.result(self._outbox.pending() if pending is None else pending)

    def wake(self) -> None:
        """Retry now: make every pending report due at once, once (e.g. the network is back).

        Non-blocking and safe from any thread, so it can be called straight from
        a connectivity callback (Android ``ConnectivityManager.NetworkCallback.
        onAvailable``, a desktop network-change notification). The next send (the
        background sender's, woken now, or the next `flush()`) ignores the SDK's
        own backoff and the reports' own delays, and sends one batch as a probe;
        the rest follow once it succeeded, and a failed probe backs off as any
        failure does. A server's ``retry-after-ms`` hint still in force is
        honoured: the probe waits for its end. Several wake() calls before the
        next send make one probe.
        """
        self._retry_requested.set()
        self._signal.notify()

    def _send_due(self, totals: _Totals) -> None:
        """Send every report due now, batch by batch, if the gate is open (caller holds the lock).

        After a failure the first batch is a probe: `_send_batch` resets the gate
        when it succeeds, and the loop goes on to the rest; when it fails the gate
        closes and the loop stops. A batch shorter than `batch_size` was
        everything due when it was read; reports recorded meanwhile are seen by
        the caller's next `schedule()`.
        """
        if self._retry_requested.is_set():
            self._retry_requested.clear()
            self._outbox.retry_now(self._gate, now=time.time())
            totals.schedule = None
        while not self._closing.is_set():
            batch = self._outbox.claim_due(self._gate, time.time(), self._batch_size)
            if not batch:
                return
            if not self._send_batch(batch, totals) or len(batch) < self._batch_size:
                return

    def _send_batch(self, batch: Sequence[OutboxEntry], totals: _Totals) -> bool:
        """Submit one batch; False when the call failed (the gate is then closed)."""
        try:
            response = self._transport.submit_raw([e.report for e in batch])
        except TransportError as exc:
            self._call_failed(batch, f"{exc.code.name}: {exc.detail}", exc.retry_after, totals)
            if not exc.transient:
                # Authentication, permission or configuration: retrying alone will not
                # fix it; the reports stay queued and the app is told.
                self._record_event(
                    Event(int(self._clock()), "transport_error", exc.code.name, exc.detail)
                )
            return False
        outcomes = list(response.outcomes)
        if len(outcomes) != len(batch) or any(
            o.report_id != e.report_id for o, e in zip(outcomes, batch, strict=False)
        ):
            self._call_failed(batch, "PROTOCOL: outcomes do not match the batch", None, totals)
            return False
        acknowledged: list[bytes] = []
        duplicates = 0
        retry: list[OutboxEntry] = []
        now = int(self._clock())
        for entry, outcome in zip(batch, outcomes, strict=True):
            if outcome.outcome in _ACKNOWLEDGED:
                acknowledged.append(entry.report_id)
                duplicates += outcome.outcome == collector_pb2.OUTCOME_DUPLICATE
            elif outcome.outcome in _PERMANENT:
                name = collector_pb2.Outcome.Name(outcome.outcome)
                detail = outcome.detail
                if outcome.outcome == collector_pb2.OUTCOME_INVALID:
                    detail = f"{collector_pb2.RejectReason.Name(outcome.reason)}: {detail}"
                self._emit(self._outbox.refuse(entry, outcome=name, detail=detail, now=now))
                totals.refused += 1
            else:
                retry.append(entry)
        # A short batch was everything due: read the schedule the flush needs next
        # in the same transaction (COUNT(*) scans the outbox, so not per batch).
        # A probe's success reopens the gate in that transaction too.
        totals.schedule = self._outbox.acknowledge(
            acknowledged,
            duplicates=duplicates,
            read_schedule=len(batch) < self._batch_size,
            gate=self._gate,
            now=time.time(),
        )
        totals.acknowledged += len(acknowledged)
        totals.duplicates += duplicates
        if retry:
            self._defer_unknown(retry, totals)
        return True

    def _call_failed(
        self,
        batch: Sequence[OutboxEntry],
        error: str,
        retry_after: float | None,
        totals: _Totals,
    ) -> None:
        """Close the gate after a failed call: nothing is sent until the pause ends."""
        delay = self._outbox.call_failed(
            batch, gate=self._gate, now=time.time(), error=error, retry_after=retry_after
        )
        totals.schedule = None
        totals.failed_attempts += 1
        totals.last_error = error
        logger.info(
            "fedldp: send of %d report(s) failed (%s); sending paused for %.2f s "
            "(%d consecutive failure(s))",
            len(batch),
            error,
            delay,
            self._gate.failures,
        )

    def _defer_unknown(self, entries: Sequence[OutboxEntry], totals: _Totals) -> None:
        """Reports answered with an outcome this SDK does not know: retry each later."""
        error = "PROTOCOL: unknown outcome"
        failures = max(e.attempts for e in entries) + 1
        delay = self._backoff.delay(failures, rng=self._jitter)
        self._outbox.defer([(e, delay) for e in entries], now=time.time(), error=error)
        totals.schedule = None
        totals.last_error = error
        logger.info(
            "fedldp: %d report(s) got an unknown outcome; retry in %.2f s", len(entries), delay
        )

    # --- background sender ---

    def start_background(self) -> None:
        """Start the sender thread (idempotent): flushes and refreshes policies periodically.

        Sends happen on the thread's own schedule (every `send_interval_seconds`
        with ±50 % jitter, when a backoff ends, or on `wake()`), never triggered
        by `record()`, so the timing of sends does not follow the timing of
        values. The thread obeys the same gate as `flush()` (its policy
        refreshes wait for the gate too), and checkpoints the state file after
        each round.
        """
        self._check_open()
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(
                target=self._run_background, name="fedldp-sender", daemon=True
            )
            self._thread.start()

    def _run_background(self) -> None:
        next_refresh = time.monotonic()
        while not self._closing.is_set():
            generation = self._signal.generation()
            # Policy fetches wait for the gate too (as stored: any process may have
            # paused it): a paused device makes no calls.
            if time.monotonic() >= next_refresh:
                self._outbox.read_gate(self._gate, time.time())
            if time.monotonic() >= next_refresh and self._gate.resume_at <= time.time():
                next_refresh = time.monotonic() + self._policy_refresh
                try:
                    self.refresh_policies()
                except TransportError as exc:
                    next_refresh = time.monotonic() + min(self._policy_refresh, 60.0)
                    logger.info("fedldp: policy refresh failed (%s)", exc.code)
                except ClientClosedError:
                    return
            with self._send_lock:
                if self._closing.is_set():
                    return
                self._send_due(_Totals())
                next_due = self._outbox.next_due_at()
                self._store.checkpoint()
            wait = self._send_interval * self._jitter.uniform(0.5, 1.5)
            if next_due is not None:
                wait = min(wait, max(0.05, max(next_due, self._gate.resume_at) - time.time()))
            self._signal.wait(generation, wait)

    # --- inspection ---

    def pending(self) -> int:
        """Reports in the outbox, not yet acknowledged."""
        self._check_open()
        return self._outbox.pending()

    def counters(self) -> dict[str, int]:
        """The device's counters (recorded, acknowledged, refusals, drops, failures)."""
        self._check_open()
        return self._store.counters()

    def events(self, limit: int = 100) -> list[Event]:
        """The most recent events, newest first."""
        self._check_open()
        return self._store.events(limit)

    def budget(self) -> list[BudgetStatus]:
        """The device ledger's spend and what is left, per cached policy, current window."""
        self._check_open()
        now = int(self._clock())
        out: list[BudgetStatus] = []
        policies = self.policies()  # the client's lock is never taken inside a store transaction
        with self._store.transaction() as conn:
            for p in policies:
                window = p.window_start(now)
                spent = DeviceStore.spent(conn, p.policy_id, window)
                out.append(
                    BudgetStatus(
                        policy_id=p.policy_id,
                        policy_version=p.version,
                        window_start=window,
                        window_end=window + p.window_seconds,
                        epsilon_cap=p.epsilon_cap,
                        epsilon_spent=spent,
                        epsilon_remaining=max(Decimal(0), EXACT.subtract(p.epsilon_cap, spent)),
                        epsilon_per_report=p.charge,
                    )
                )
        return out

    # --- events ---

    def _record_event(self, event: Event) -> None:
        """Persist an event (bounded log + counter), then log it and call back."""
        with self._store.transaction() as conn:
            DeviceStore.bump(conn, f"{event.kind}s")
            DeviceStore.add_event(conn, event)
        self._emit(event)

    def _emit(self, event: Event) -> None:
        logger.warning(
            "fedldp event %s/%s%s: %s",
            event.kind,
            event.reason,
            f" policy={event.policy_id}" if event.policy_id else "",
            event.detail,
        )
        if self._on_event is not None:
            try:
                self._on_event(event)
            except Exception:
                logger.exception("fedldp: on_event callback raised; ignored")


class _Signal:
    """Wakes waiting senders (`wake()`, `close()`); nothing is lost between check and wait.

    A waiter reads `generation()` before its work and waits for it to change, so
    a notification that arrives during the work ends the wait at once.
    """

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._generation = 0

    def generation(self) -> int:
        with self._condition:
            return self._generation

    def notify(self) -> None:
        with self._condition:
            self._generation += 1
            self._condition.notify_all()

    def wait(self, generation: int, timeout: float) -> None:
        """Wait up to `timeout` s, or until notified after `generation` was read."""
        with self._condition:
            self._condition.wait_for(lambda: self._generation != generation, timeout)


@dataclass
class _Totals:
    acknowledged: int = 0
    duplicates: int = 0
    refused: int = 0
    failed_attempts: int = 0
    last_error: str | None = None
    #: The outbox's (next due time, pending) as read right after the last change made
    #: by this flush, when that read came for free; None: read it again.
    schedule: tuple[float | None, int] | None = None

    def result(self, pending: int) -> FlushResult:
        return FlushResult(
            acknowledged=self.acknowledged,
            duplicates=self.duplicates,
            refused=self.refused,
            failed_attempts=self.failed_attempts,
            pending=pending,
            last_error=self.last_error,
        )


# --- values ---------------------------------------------------------------------------------


def _mechanism_input(policy: VerifiedPolicy, value: object) -> tuple[Any, bool]:
    """The mechanism's input for `value`, and whether it was clipped. Never echoes it."""
    if policy.labels is not None:
        if not isinstance(value, str):
            raise BadValueError(
                f"metric {policy.metric_name!r} is categorical: pass the value's label as a "
                f"str, not {type(value).__name__}"
            )
        try:
            return policy.label_index(value), False
        except ValueError as exc:
            raise BadValueError(str(exc)) from None
    assert policy.numeric_range is not None
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        raise BadValueError(
            f"metric {policy.metric_name!r} is numeric: pass an int, float or Decimal, "
            f"not {type(value).__name__}"
        )
    try:
        exact = value if isinstance(value, Decimal) else Decimal(value)
    except (InvalidOperation, ValueError, OverflowError):
        raise BadValueError(f"metric {policy.metric_name!r}: value is not a number") from None
    if not exact.is_finite() or (isinstance(value, float) and not math.isfinite(value)):
        raise BadValueError(f"metric {policy.metric_name!r}: value must be finite")
    lo, hi = policy.numeric_range
    clipped = min(max(exact, lo), hi)
    return float(clipped), clipped != exact


def _window_change(conn: sqlite3.Connection, policy: VerifiedPolicy) -> WindowChangeError | None:
    """Why `policy` cannot be used on this device because it changes its policy id's
    budget window, or None.

    The device guard keys spend by (policy id, window start), as the collector's
    ledger does: a version with another window length would start a fresh spend
    row in windows that overlap the ones already charged, and so let one window
    hold more than any version's cap (docs/policies.md, "Versions and budgets").
    """
    windows = DeviceStore.spent_windows(conn, policy.policy_id)
    if not windows or windows == [policy.window_seconds]:
        return None
    spent = ", ".join(f"{w} s" for w in windows)
    return WindowChangeError(
        f"policy {policy.policy_id} v{policy.version} declares a {policy.window_seconds} s "
        f"budget window, but this device has spent under {policy.policy_id} with a {spent} "
        "window; versions of one policy id share one budget, so its window cannot change "
        "(keep the window, or publish a new policy id for a new metric name)"
    )


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


def _unverified_claim(envelope: policy_pb2.SignedEnvelope) -> tuple[str, str | None]:
    """A rejected envelope's label for messages and the metric it claims (both unverified).

    The label is the claimed policy id and version, or the payload's digest; the
    metric is None when the payload does not decode or names none.
    """
    try:
        claimed = policy_pb2.Policy.FromString(envelope.payload)
    except DecodeError:
        claimed = None
    metric = claimed.metric.name if claimed is not None and claimed.metric.name else None
    if claimed is not None and claimed.policy_id:
        return f"{claimed.policy_id[:64]} v{claimed.version} (unverified)", metric
    import hashlib

    return f"envelope {hashlib.sha256(envelope.payload).hexdigest()[:16]}", metric


__all__ = [
    "COARSE_TIME_SECONDS",
    "Backoff",
    "BadValueError",
    "BudgetGuardError",
    "BudgetStatus",
    "Client",
    "ClientClosedError",
    "Credentials",
    "Event",
    "FlushResult",
    "NoPolicyError",
    "OutboxFullError",
    "PolicyRefresh",
    "RecordRefusedError",
    "RecordResult",
    "TransportError",
    "TrustRoot",
]
