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

`Client` is the one entry point; each step has its own module:
`fedldp.client.policy_cache` (step 1: trust, verified policies, refresh),
`fedldp.client.recorder` (steps 2 and 3), `fedldp.client.sender` (step 4),
`fedldp.client.results` (the result and error types) and `fedldp.client.events`.

Thread-safe: every method may be called from any thread. For asyncio see
`fedldp.client.aio.AsyncClient`. Base install only: grpcio, protobuf,
cryptography and the standard library.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from pathlib import Path
from types import TracebackType

import grpc
from fedldp.client import send_slot
from fedldp.client.device_store import EXACT, DeviceStore, Event
from fedldp.client.events import EventCallback, EventSink
from fedldp.client.outbox import (
    DEFAULT_MAX_REPORTS,
    SLOT_MARGIN_SECONDS,
    Outbox,
    OutboxFullError,
    RecordRefusedError,
    SendGate,
)
from fedldp.client.policy import VerifiedPolicy
from fedldp.client.policy_cache import PolicyCache, TrustRoot, TrustRootLike
from fedldp.client.recorder import COARSE_TIME_SECONDS, Recorder
from fedldp.client.results import (
    BadValueError,
    BudgetGuardError,
    BudgetStatus,
    ClientClosedError,
    FlushResult,
    NoPolicyError,
    PolicyRefresh,
    RecordResult,
)
from fedldp.client.send_slot import SendSlot
from fedldp.client.sender import Sender
from fedldp.client.transport import Backoff, Credentials, Transport, TransportError, jitter_rng

logger = logging.getLogger("fedldp.client")


def _check_arguments(
    max_epsilon: Decimal | None,
    max_epsilon_cap: Decimal | None,
    batch_size: int,
    send_interval_seconds: float,
    policy_refresh_seconds: float,
) -> None:
    """`Client`'s argument checks, before anything is opened: TypeError for a limit that
    is not a positive, finite Decimal; ValueError for a batch size that is not a
    positive int or a non-positive interval."""
    for name, limit in (("max_epsilon", max_epsilon), ("max_epsilon_cap", max_epsilon_cap)):
        if limit is not None and (
            not isinstance(limit, Decimal) or not limit.is_finite() or limit <= 0
        ):
            raise TypeError(f"{name} must be a positive, finite decimal.Decimal (exact)")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError("batch_size must be a positive integer")
    if send_interval_seconds <= 0 or policy_refresh_seconds <= 0:
        raise ValueError("send_interval_seconds and policy_refresh_seconds must be positive")


def _open_slot(store: DeviceStore) -> SendSlot | None:
    """The send slot's OS lock on `store`'s folder (None without ``flock``: the gate
    then uses the stored claim); closes `store` and re-raises if it cannot be opened."""
    if not send_slot.available():
        return None
    try:
        return SendSlot(store.path.parent)
    except BaseException:
        store.close()
        raise


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
        """Open the state file, load trust and cached policies, and connect (see the class).

        Raises TypeError or ValueError for a bad argument (nothing is opened),
        `PolicyError` when `trust_root` does not verify, `StateError` for an
        unusable state file; the state file is closed again on any failure.
        A failed policy fetch is logged, not raised.
        """
        _check_arguments(
            max_epsilon, max_epsilon_cap, batch_size, send_interval_seconds, policy_refresh_seconds
        )
        if isinstance(credentials, str):
            credentials = Credentials.bearer(credentials)
        self._clock = clock
        jitter = jitter_rng()
        backoff = backoff or Backoff()
        self._send_interval = send_interval_seconds
        self._policy_refresh = policy_refresh_seconds
        self._lock = threading.RLock()  # lifecycle, policy cache and trust store
        self._closing = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

        self._store = DeviceStore(state_dir)
        lease = timeout_seconds + SLOT_MARGIN_SECONDS
        slot = _open_slot(self._store)
        self._gate = SendGate(collector, backoff, jitter, lease_seconds=lease, slot=slot)
        self._events = EventSink(self._store, on_event)
        self._cache = PolicyCache(
            self._store,
            self._events,
            self._lock,
            clock=clock,
            max_epsilon=max_epsilon,
            max_epsilon_cap=max_epsilon_cap,
            audience=audience,
        )
        try:
            self._outbox = Outbox(self._store, max_reports=max_outbox)
            fetched_at = self._cache.load(trust_root, self._gate)
            self._transport = Transport(
                collector,
                credentials,
                timeout_seconds=timeout_seconds,
                channel=channel,
                backoff=backoff,
            )
        except BaseException:
            self._close_files()
            raise
        self._recorder = Recorder(self._store, self._outbox, self._events, rng=rng)
        self._sender = Sender(
            self._store,
            self._outbox,
            self._transport,
            self._gate,
            self._events,
            backoff=backoff,
            jitter=jitter,
            batch_size=batch_size,
            clock=clock,
            closing=self._closing,
        )
        self._signal = self._sender.signal  # wakes a waiting flush() or sender thread
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
        """The client itself; `close()` runs on exit."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client (see `close`); exceptions propagate."""
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
        with self._sender.lock:
            self._transport.close()
            self._close_files()

    def _close_files(self) -> None:
        """Close the send slot's descriptor and the state file."""
        if self._gate.slot is not None:
            self._gate.slot.close()
        self._store.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("this fedldp.Client is closed; create a new one")

    @property
    def state_path(self) -> Path:
        """The device state file."""
        return self._store.path

    # --- policies ---

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
        return self._cache.refresh(self._transport)

    def policies(self) -> list[VerifiedPolicy]:
        """The verified policies currently cached (active or not), by policy id."""
        return self._cache.policies()

    # --- recording ---

    def record(
        self,
        metric: str,
        value: str | int | float | Decimal | Mapping[str, str | int | float | Decimal],
        *,
        policy_id: str | None = None,
    ) -> RecordResult:
        """Randomize `value` for `metric` now and store the report for sending.

        Categorical metrics take the value's label (a string in the policy's
        domain); numeric metrics take a finite number, clipped to the policy's
        range (`RecordResult.clipped` says when); a multi-attribute metric takes
        a dict with exactly its attributes' names, each value checked like a
        single metric's (one report, charged once). Does no network I/O.

        Raises a `RecordRefusedError` subclass, having changed nothing, when
        there is no usable policy (`NoPolicyError`), the value does not fit
        (`BadValueError`), the device budget for this window would be passed
        (`BudgetGuardError`) or the outbox is full (`OutboxFullError`). Every
        refusal is counted and reported as an event (without the value).
        """
        self._check_open()
        now = int(self._clock())
        try:
            policy = self._cache.policy_for(metric, policy_id, now)
            return self._recorder.record(policy, value, now)
        except RecordRefusedError as exc:
            self._recorder.refused(exc, now, metric)
            raise

    # --- sending ---

    def flush(self, timeout: float | None = 30.0, *, retry_now: bool = False) -> FlushResult:
        """Send pending reports until the outbox is empty or `timeout` seconds pass.

        Obeys the device's backoff (`SendGate`): while it is paused, waits for it
        to end within the timeout (None: no limit), then sends one batch as a
        probe and the rest only after the probe succeeded. It likewise waits
        for another sender's call in flight on the same state folder. So it
        returns before `timeout` only when nothing is left to send (or the
        client closed); `FlushResult.stopped` says why it stopped, and
        `FlushResult.paused_until` until when sending is paused.
        `retry_now=True` does what `wake()` does first: every pending report is
        due now, and a backoff of the SDK's own ends now (a server's retry hint
        still runs to its end). Returns counts; reports still pending stay in
        the outbox. Never raises for transport failures (they are counted and
        logged). Ends with a checkpoint of the state file (see
        `DeviceStore.checkpoint`).
        """
        self._check_open()
        return self._sender.flush(timeout, retry_now=retry_now)

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
        self._sender.wake()

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
                target=self._sender.run_background,
                args=(self.refresh_policies,),
                kwargs={
                    "send_interval": self._send_interval,
                    "policy_refresh": self._policy_refresh,
                },
                name="fedldp-sender",
                daemon=True,
            )
            self._thread.start()

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
