"""The SDK's policies: the trust it starts from, the verified cache, refresh and lookup.

A device randomizes only under a policy that `verify_policy` accepted against
its trust store (the pinned root, rotated by the TUF rule), the highest
versions it has stored (rollback), its own epsilon maximums and its audience.
`PolicyCache` holds that trust store and the verified policies of one client:

* `load` starts from the state file (stored trust if it follows the configured
  pins, cached envelopes re-verified: the file is not trusted blindly);
* `refresh` fetches roots and envelopes (GetPolicies), verifies each, and
  replaces the cache and the stored envelopes in one transaction;
* `policy_for` picks the one active policy for a metric, or raises
  `NoPolicyError` saying why there is none.

Verification itself lives in `fedldp.client.policy` (pure functions); this
module only decides what to keep and persists it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.client.device_store import DeviceStore, Event, StoredPolicy
from fedldp.client.events import EventSink
from fedldp.client.outbox import SendGate
from fedldp.client.policy import (
    PolicyError,
    TrustStore,
    VerifiedPolicy,
    WindowChangeError,
    verify_policy,
)
from fedldp.client.results import NoPolicyError, PolicyRefresh
from fedldp.client.transport import Transport
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError


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
        """Verify the root against the pinned keys; raises `PolicyError` if it fails."""
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


#: What `Client(trust_root=...)` accepts (see `Client`).
TrustRootLike = TrustStore | TrustRoot | str | os.PathLike[str]


def trust_from(trust_root: TrustRootLike, *, now: int) -> TrustStore:
    """Build the configured trust store (see `Client`'s `trust_root`).

    A `TrustStore` is copied (the client keeps a private one); a folder is read
    with `load_trust_folder`; a lone root envelope file pins its own root keys
    (it ships inside the app). Raises `PolicyError` when the root does not verify.
    """
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


class PolicyCache:
    """One client's trust store and verified policies (thread-safe under `lock`).

    `lock` is the client's lock: it guards the trust store and the cache, and is
    held across the refresh's store transaction (never the other way round).
    """

    def __init__(
        self,
        store: DeviceStore,
        events: EventSink,
        lock: threading.RLock,
        *,
        clock: Callable[[], float],
        max_epsilon: Decimal | None,
        max_epsilon_cap: Decimal | None,
        audience: str | None,
    ) -> None:
        """An empty cache; `load` fills it from the state file."""
        self._store = store
        self._events = events
        self._lock = lock
        self._clock = clock
        self._max_epsilon = max_epsilon
        self._max_epsilon_cap = max_epsilon_cap
        self._audience = audience
        self._trust: TrustStore | None = None
        #: The trust in use is the configured one and the state file has none yet
        #: (a fresh install): the next `refresh` saves it.
        self._trust_unsaved = False
        self._policies: dict[str, VerifiedPolicy] = {}
        #: Rejected policies: label -> (the metric it claims, unverified, or None; why).
        self._rejections: dict[str, tuple[str | None, str]] = {}

    @property
    def trust(self) -> TrustStore:
        """The current trust store (after `load`)."""
        assert self._trust is not None, "PolicyCache.load() first"
        return self._trust

    def load(self, trust_root: TrustRootLike, gate: SendGate) -> str | None:
        """Load the trust store and the cached policies; return the last fetch time.

        One read transaction reads everything the client starts from (stored
        trust, highest versions, cached envelopes, last fetch time, and `gate`'s
        stored backoff). When the stored trust must be replaced by the configured
        one (new pins: an app update; or it is invalid), a write transaction
        does it all again and saves it; a state file with no trust yet (a fresh
        install) gets the configured trust saved by the first `refresh` (until
        then the configured trust is what a start uses anyway), so a fresh
        install's start commits nothing. The cached envelopes are then
        re-verified (the state file is not trusted blindly); those that fail
        are remembered as rejections, not used.
        """
        now = int(self._clock())
        configured = trust_from(trust_root, now=now)
        events: list[Event] = []
        with self._store.transaction(write=False) as conn:
            stored_trust = DeviceStore.read_trust(conn)
            trust = (
                configured
                if stored_trust is None
                else _stored_trust(stored_trust, configured, now, [])
            )
            if trust is not None:
                highest, cached, fetched_at = _read_start(conn, gate)
        self._trust_unsaved = stored_trust is None
        if trust is None:  # replace the stored trust (and forget policies verified under it)
            with self._store.transaction() as conn:
                trust = _load_trust(conn, configured, now, events)
                highest, cached, fetched_at = _read_start(conn, gate)
        self._trust = trust
        for event in events:
            self._events.emit(event)
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

    def _verify(
        self, envelope: policy_pb2.SignedEnvelope, now: int, highest: Mapping[str, int]
    ) -> VerifiedPolicy:
        return verify_policy(
            envelope,
            self.trust,
            now=now,
            highest_versions=highest,
            max_epsilon=self._max_epsilon,
            max_epsilon_cap=self._max_epsilon_cap,
            audience=self._audience,
        )

    def refresh(self, transport: Transport) -> PolicyRefresh:
        """Fetch roots and policies with `transport`, verify them, cache the good ones.

        See `Client.refresh_policies` for the contract. Raises `TransportError`
        when the collector cannot be reached; the cache is then unchanged.
        """
        with self._lock:
            known_root_version = self.trust.root_version
        # The network call holds no lock: record() keeps working meanwhile.
        response = transport.get_policies(known_root_version=known_root_version)
        # One transaction reads the rollback floors and the cache, and writes the
        # result: another process sharing the state file cannot interleave.
        with self._lock:
            with self._store.transaction() as conn:
                now = int(self._clock())
                rejection_events: list[Event] = []
                trust = self.trust.copy()
                loaded_root_version = trust.root_version
                try:
                    trust.update_roots(list(response.roots), now=now)
                except PolicyError as exc:  # the roots applied before the bad one stay
                    rejection_events.append(
                        Event(now, "root_rejected", type(exc).__name__, str(exc))
                    )
                self._trust = trust
                accepted, rejected = self._accept(conn, response.policies, now, rejection_events)
                if trust.root_version != loaded_root_version or (
                    self._trust_unsaved and DeviceStore.read_trust(conn) is None
                ):
                    # Rotated, or a fresh install's configured trust: persist.
                    # Otherwise the stored trust is already this one (loaded or
                    # saved by load()) or a newer one another process sharing the
                    # state file saved, which must not be overwritten.
                    DeviceStore.save_trust(conn, trust.to_bytes(), trust.root_version)
                self._trust_unsaved = False
                _replace_stored_policies(conn, accepted.values(), now)
                for event in rejection_events:
                    DeviceStore.bump(conn, f"{event.kind}s")
                    DeviceStore.add_event(conn, event)
                DeviceStore.set_meta(conn, "policies_fetched_at", str(now))
            self._policies = accepted
            self._rejections = rejected
        for event in rejection_events:
            self._events.emit(event)
        return PolicyRefresh(
            tuple(sorted(accepted)),
            {label: why for label, (_, why) in rejected.items()},
            trust.root_version,
        )

    def _accept(
        self,
        conn: sqlite3.Connection,
        envelopes: Sequence[policy_pb2.SignedEnvelope],
        now: int,
        rejection_events: list[Event],
    ) -> tuple[dict[str, VerifiedPolicy], dict[str, tuple[str | None, str]]]:
        """The envelopes that verify, highest version per policy id, and the rejections.

        Besides `verify_policy`, a policy is rejected when it differs from the
        cached one of the same id and version (a changed policy needs a higher
        version) or changes its id's budget window (`_window_change`). Each
        rejection appends an event to `rejection_events`.
        """
        highest = DeviceStore.read_highest_versions(conn)
        cached = {p.policy_id: p for p in DeviceStore.read_policies(conn)}
        spent_windows = DeviceStore.spent_windows(conn)
        accepted: dict[str, VerifiedPolicy] = {}
        rejected: dict[str, tuple[str | None, str]] = {}
        for envelope in envelopes:
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
                        now, "policy_rejected", "ConflictingPolicyError", reason, verified.policy_id
                    )
                )
                continue
            change = _window_change(spent_windows, verified)
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
        return accepted, rejected

    def policies(self) -> list[VerifiedPolicy]:
        """The verified policies currently cached (active or not), by policy id."""
        with self._lock:
            return [self._policies[k] for k in sorted(self._policies)]

    def policy_for(self, metric: str, policy_id: str | None, now: int) -> VerifiedPolicy:
        """The one active cached policy for `metric` (and `policy_id`, if given) at `now`.

        Active: within its validity and signed by a policy key the trust store
        still accepts at `now`. Raises `NoPolicyError` with reason
        AMBIGUOUS_POLICY (several), POLICY_INACTIVE (only inactive ones),
        POLICY_REJECTED (this metric's policy failed verification) or NO_POLICY.
        """
        with self._lock:
            candidates = [
                p
                for p in self._policies.values()
                if p.metric_name == metric and (policy_id is None or p.policy_id == policy_id)
            ]
            rejections = dict(self._rejections)
            trust = self.trust
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
        raise self._missing(metric, rejections)

    def _missing(
        self, metric: str, rejections: Mapping[str, tuple[str | None, str]]
    ) -> NoPolicyError:
        """Why no cached policy covers `metric` (POLICY_REJECTED or NO_POLICY)."""
        # Only rejections of policies that claim this metric explain its absence; a
        # rejected policy whose metric is unknown (undecodable) or another one's is
        # not the cause, and the app should check the metric name.
        ours = {k: why for k, (m, why) in rejections.items() if m == metric}
        if ours:
            listing = "; ".join(f"{k}: {why}" for k, why in sorted(ours.items()))
            return NoPolicyError(
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
        return NoPolicyError(
            f"no policy for metric {metric!r} is cached (last fetch: "
            f"{'never' if fetched is None else fetched}){note}; check the metric name, "
            "or call refresh_policies() while the collector is reachable",
            reason="NO_POLICY",
        )


def _read_start(
    conn: sqlite3.Connection, gate: SendGate
) -> tuple[dict[str, int], list[StoredPolicy], str | None]:
    """What a start reads besides the trust (in the caller's transaction): highest
    versions, cached envelopes, last fetch time; and `gate`'s stored state."""
    highest = DeviceStore.read_highest_versions(conn)
    cached = DeviceStore.read_policies(conn)
    fetched_at = DeviceStore.read_meta(conn, "policies_fetched_at")
    gate.load(conn, now=time.time())
    return highest, cached, fetched_at


def _stored_trust(
    stored: bytes, configured: TrustStore, now: int, events: list[Event]
) -> TrustStore | None:
    """The stored trust if it is valid and follows the configured pins, else None
    (an invalid one appends a `root_rejected` event to `events`)."""
    try:
        trust = TrustStore.from_bytes(stored)
    except PolicyError as exc:
        events.append(Event(now, "root_rejected", "STORED_TRUST_INVALID", str(exc)))
        return None
    if trust.pinned_key_ids == configured.pinned_key_ids and (
        trust.root_version >= configured.root_version
    ):
        return trust
    return None


def _load_trust(
    conn: sqlite3.Connection, configured: TrustStore, now: int, events: list[Event]
) -> TrustStore:
    """The stored trust if it follows the configured pins, else the configured one (saved)."""
    stored = DeviceStore.read_trust(conn)
    if stored is not None:
        trust = _stored_trust(stored, configured, now, events)
        if trust is not None:
            return trust
    DeviceStore.save_trust(conn, configured.to_bytes(), configured.root_version)
    if stored is not None:
        # New pins (app update): cached policies were verified under the old
        # ones, so verify everything afresh.
        conn.execute("DELETE FROM policies")
    return configured


def _replace_stored_policies(
    conn: sqlite3.Connection, accepted: Iterable[VerifiedPolicy], now: int
) -> None:
    """Store exactly `accepted` as the cached envelopes.

    The collector's list is authoritative for what is active: the rest is
    dropped (their highest versions stay, so they cannot come back older).
    """
    conn.execute("DELETE FROM policies")
    DeviceStore.save_policies(
        conn,
        [
            StoredPolicy(
                policy_id=verified.policy_id,
                version=verified.version,
                metric=verified.metric_name,
                envelope=verified.envelope.SerializeToString(),
                digest=verified.digest,
                epsilon=verified.epsilon,
                expires_at=verified.expires_at,
                fetched_at=now,
            )
            for verified in accepted
        ],
    )


def _window_change(
    spent_windows: Mapping[str, list[int]], policy: VerifiedPolicy
) -> WindowChangeError | None:
    """Why `policy` cannot be used on this device because it changes its policy id's
    budget window, or None. `spent_windows`: `DeviceStore.spent_windows`.

    The device guard keys spend by (policy id, window start), as the collector's
    ledger does: a version with another window length would start a fresh spend
    row in windows that overlap the ones already charged, and so let one window
    hold more than any version's cap (docs/policies.md, "Versions and budgets").
    """
    windows = spent_windows.get(policy.policy_id, [])
    if not windows or windows == [policy.window_seconds]:
        return None
    spent = ", ".join(f"{w} s" for w in windows)
    return WindowChangeError(
        f"policy {policy.policy_id} v{policy.version} declares a {policy.window_seconds} s "
        f"budget window, but this device has spent under {policy.policy_id} with a {spent} "
        "window; versions of one policy id share one budget, so its window cannot change "
        "(keep the window, or publish a new policy id for a new metric name)"
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
    return f"envelope {hashlib.sha256(envelope.payload).hexdigest()[:16]}", metric


__all__ = ["PolicyCache", "TrustRoot", "TrustRootLike", "trust_from"]
