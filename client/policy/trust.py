"""The trust store: pinned root keys, the current verified Root, and its rotation.

Modelled on python-tuf's TrustedMetadataSet (tuf/ngclient/_internal/
trusted_metadata_set.py) scaled down to two roles: the root (which names the
root keys, their threshold, and the policy-signing keys) and the policies.

Rules (TUF specification, section 5.3 "Update the root role"):

* A device pins one or more root public keys in its configuration. The first
  root it trusts must carry valid signatures from at least `root_threshold`
  distinct pinned keys (at least one is checked before the payload is parsed),
  and be signed by a threshold of its own root keys.
* A new root must carry a threshold of valid signatures from the *current*
  root's keys (checked before parsing), have version exactly current + 1, and
  a threshold of valid signatures from its *own* root keys. A device that
  missed versions applies each in order (`update_roots`).
* Expiry is checked when a key is used (`policy_key`), not when a root is
  accepted: a device that was offline may walk through roots that have since
  expired, as TUF allows for intermediate roots; only the final one must be
  fresh to sign anything.

Everything here is a pure function of (bytes, stored state, now): no I/O and no
clock reads.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from fedldp.client.policy.envelope import (
    ROOT_PAYLOAD_TYPE,
    check_payload_type,
    keys_by_id,
    policy_digest,
    raw_public_bytes,
    signature_key_ids,
    valid_signers,
)
from fedldp.client.policy.errors import (
    ExpiredKeyError,
    PolicyError,
    RootRotationError,
    UnknownKeyError,
)
from fedldp.client.policy.validation import root_problems
from fedldp.v1 import policy_pb2
from google.protobuf.message import DecodeError

_STATE_FORMAT = "fedldp.truststore.v1"


@dataclass(frozen=True)
class _VerifiedRoot:
    envelope_bytes: bytes
    payload: bytes
    message: policy_pb2.Root
    root_keys: dict[str, Ed25519PublicKey]
    policy_keys: dict[str, tuple[Ed25519PublicKey, int]]


def _keys_of(entries: Iterable[policy_pb2.PublicKey]) -> dict[str, Ed25519PublicKey]:
    return {entry.key_id: Ed25519PublicKey.from_public_bytes(entry.ed25519) for entry in entries}


#: Most parsed roots remembered per process (a fleet simulation parses the same root
#: once per simulated device; a device parses it at each start).
_PARSED_ROOTS = 16
_parsed_lock = threading.Lock()
_parsed: OrderedDict[bytes, _VerifiedRoot] = OrderedDict()


def _parse_root(envelope: policy_pb2.SignedEnvelope) -> _VerifiedRoot:
    """Parse and structurally validate a root whose signatures were already checked.

    A pure function of the envelope's exact bytes: a valid result is remembered
    by those bytes (compared in full) and shared, which is safe because a
    `_VerifiedRoot` is never changed (`TrustStore.root` hands out copies).
    Invalid roots are never remembered.
    """
    key = envelope.SerializeToString()
    with _parsed_lock:
        known = _parsed.get(key)
        if known is not None:
            _parsed.move_to_end(key)
            return known
    parsed = _parse_root_uncached(envelope, key)
    with _parsed_lock:
        _parsed[key] = parsed
        if len(_parsed) > _PARSED_ROOTS:
            _parsed.popitem(last=False)
    return parsed


def _parse_root_uncached(
    envelope: policy_pb2.SignedEnvelope, envelope_bytes: bytes
) -> _VerifiedRoot:
    try:
        root = policy_pb2.Root.FromString(envelope.payload)
    except DecodeError as exc:
        raise RootRotationError(
            f"root payload is not a fedldp.v1.Root message ({exc}); re-create the root"
        ) from None
    problems = root_problems(root)
    if problems:
        raise RootRotationError(
            f"root v{root.version} is invalid: " + "; ".join(problems) + "; re-create the root"
        )
    return _VerifiedRoot(
        envelope_bytes=envelope_bytes,
        payload=envelope.payload,
        message=root,
        root_keys=_keys_of(root.root_keys),
        policy_keys={
            entry.key_id: (Ed25519PublicKey.from_public_bytes(entry.ed25519), entry.expires_at)
            for entry in root.policy_keys
        },
    )


def _require_self_signed(envelope: policy_pb2.SignedEnvelope, root: _VerifiedRoot) -> None:
    signers = valid_signers(envelope, root.root_keys)
    if len(signers) < root.message.root_threshold:
        raise RootRotationError(
            f"root v{root.message.version} has {len(signers)} valid signature(s) by its own root "
            f"keys, needs {root.message.root_threshold}; sign it with the new root keys too"
        )


class TrustStore:
    """What a device or collector trusts: pinned root keys and the current verified Root.

    Build with `from_pinned_root`; advance with `update_root` / `update_roots`;
    persist with `to_bytes` / `from_bytes`. Policy keys are looked up with
    `policy_key`, which enforces key and root expiry at `now`.
    """

    def __init__(
        self,
        pinned: dict[str, Ed25519PublicKey],
        root: _VerifiedRoot,
        seen: frozenset[bytes],
    ) -> None:
        self._pinned = dict(pinned)
        self._root = root
        self._seen = set(seen)
        self._serialized: bytes | None = None  # `to_bytes`, made once per change

    # --- construction and rotation ---

    @classmethod
    def from_pinned_root(
        cls,
        root_envelope: policy_pb2.SignedEnvelope,
        pinned_root_keys: Sequence[Ed25519PublicKey],
        *,
        now: int,
    ) -> TrustStore:
        """Trust `root_envelope` because pinned root keys signed it.

        Requires: payload type ROOT; at least one valid signature by a pinned key
        (checked before parsing); a structurally valid Root; valid signatures by at
        least `root_threshold` distinct pinned keys and by `root_threshold` of its
        own root keys. `now` is accepted for the uniform `(…, now)` signature; root
        expiry is enforced when keys are used (see the module docstring).
        """
        del now  # expiry is checked at use; see module docstring
        if not pinned_root_keys:
            raise RootRotationError("no pinned root keys; configure at least one root public key")
        check_payload_type(root_envelope, ROOT_PAYLOAD_TYPE)
        pinned = keys_by_id(pinned_root_keys)
        signers = valid_signers(root_envelope, pinned)
        if not signers:
            named = signature_key_ids(root_envelope)
            raise RootRotationError(
                "the root is not signed by any pinned root key (signed by "
                f"{', '.join(k[:16] for k in named) or 'nobody'}); pin the right root public "
                "key or fetch the root signed by it"
            )
        root = _parse_root(root_envelope)
        if len(signers) < root.message.root_threshold:
            raise RootRotationError(
                f"root v{root.message.version} has {len(signers)} valid signature(s) by pinned "
                f"keys, needs {root.message.root_threshold}; pin more root keys or sign with them"
            )
        _require_self_signed(root_envelope, root)
        return cls(pinned, root, frozenset({policy_digest(root.payload)}))

    def update_root(self, envelope: policy_pb2.SignedEnvelope, *, now: int) -> None:
        """Advance to the next root version (TUF 5.3.4-5.3.5); on error nothing changes.

        The new root must be signed by a threshold of the current root keys
        (checked before parsing), have version exactly current + 1, and be signed
        by a threshold of its own keys. `now` is accepted for the uniform
        signature; expiry is enforced when keys are used.
        """
        del now
        check_payload_type(envelope, ROOT_PAYLOAD_TYPE)
        current = self._root.message
        old_signers = valid_signers(envelope, self._root.root_keys)
        if len(old_signers) < current.root_threshold:
            raise RootRotationError(
                f"new root has {len(old_signers)} valid signature(s) by the current root "
                f"v{current.version} keys, needs {current.root_threshold}; sign the new root "
                "with the current root keys as well as the new ones"
            )
        new_root = _parse_root(envelope)
        if new_root.message.version != current.version + 1:
            raise RootRotationError(
                f"new root has version {new_root.message.version}, expected exactly "
                f"{current.version + 1}; apply the missing root versions in order"
            )
        _require_self_signed(envelope, new_root)
        self._root = new_root
        self._seen.add(policy_digest(new_root.payload))
        self._serialized = None

    def update_roots(self, envelopes: Sequence[policy_pb2.SignedEnvelope], *, now: int) -> int:
        """Apply a chain of root envelopes (as GetPolicies serves them); returns how many applied.

        Envelopes whose exact payload was already accepted, or whose version is at
        or below the current one, are skipped (re-delivery, or a chain starting
        before this device's pinned root); the rest are applied in version order,
        each by `update_root`. The version is read from the unverified payload only
        to order and skip: skipping grants no trust, and every envelope applied is
        verified in full. Stops at the first failure, raising it; the versions
        applied before it stay.
        """
        by_version: dict[int, list[policy_pb2.SignedEnvelope]] = {}
        for envelope in envelopes:
            if policy_digest(envelope.payload) in self._seen:
                continue
            try:
                version = int(policy_pb2.Root.FromString(envelope.payload).version)
            except DecodeError:
                version = self.root_version + 1  # let update_root refuse it with its reason
            by_version.setdefault(version, []).append(envelope)
        applied = 0
        for version in sorted(by_version):
            if version <= self.root_version:
                continue
            errors: list[PolicyError] = []
            for envelope in by_version[version]:  # a forged candidate cannot hide the real one
                try:
                    self.update_root(envelope, now=now)
                except PolicyError as exc:
                    errors.append(exc)
                    continue
                applied += 1
                break
            else:
                raise errors[0]
        return applied

    # --- queries ---

    @property
    def root_version(self) -> int:
        """The version of the current trusted root."""
        return int(self._root.message.version)

    @property
    def root(self) -> policy_pb2.Root:
        """A copy of the current trusted Root message."""
        copy = policy_pb2.Root()
        copy.CopyFrom(self._root.message)
        return copy

    @property
    def root_envelope(self) -> policy_pb2.SignedEnvelope:
        """The envelope of the current trusted root, as received."""
        return policy_pb2.SignedEnvelope.FromString(self._root.envelope_bytes)

    @property
    def pinned_key_ids(self) -> list[str]:
        """Key ids of the pinned root keys, sorted."""
        return sorted(self._pinned)

    def policy_key_ids(self) -> list[str]:
        """Key ids of the policy-signing keys the current root delegates to, sorted."""
        return sorted(self._root.policy_keys)

    def policy_key(self, key_id: str, *, now: int) -> Ed25519PublicKey:
        """The policy-signing key `key_id`, if the current root trusts it at `now`.

        Raises UnknownKeyError if the root does not list it, ExpiredKeyError if the
        key or the root itself has expired (now >= expires_at).
        """
        entry = self._root.policy_keys.get(key_id)
        if entry is None:
            raise UnknownKeyError(
                f"policy key {key_id[:16]}… is not listed by trusted root "
                f"v{self.root_version}; sign with a listed key, or rotate the root to add it "
                "(fedldp keys rotate) and deliver the new root first"
            )
        self.check_root_fresh(now=now)
        key, expires_at = entry
        if expires_at and now >= expires_at:
            raise ExpiredKeyError(
                f"policy key {key_id[:16]}… expired at {expires_at} (now {now}); sign with a "
                "current key, or extend it with a new root version (fedldp keys rotate)"
            )
        return key

    def check_root_fresh(self, *, now: int) -> None:
        """Raise ExpiredKeyError if the current root has expired at `now`."""
        expires_at = self._root.message.expires_at
        if now >= expires_at:
            raise ExpiredKeyError(
                f"trusted root v{self.root_version} expired at {expires_at} (now {now}); "
                "deliver a newer root version (fedldp keys rotate)"
            )

    # --- persistence (device state) ---

    def copy(self) -> TrustStore:
        """An independent copy (rotating it leaves this one unchanged).

        Shares only immutable parts; nothing is re-verified, since this store's
        root was verified when it was accepted and has not left memory since
        (`from_bytes` is the path that re-checks stored bytes).
        """
        twin = TrustStore(self._pinned, self._root, frozenset(self._seen))
        twin._serialized = self._serialized
        return twin

    def to_bytes(self) -> bytes:
        """Serialize the pinned keys, the current root envelope and the accepted root digests.

        Serialized once per change of the store (root rotation); later calls return
        the same bytes.
        """
        if self._serialized is None:
            self._serialized = self._serialize()
        return self._serialized

    def _serialize(self) -> bytes:
        state = {
            "format": _STATE_FORMAT,
            "pinned": sorted(raw_public_bytes(k).hex() for k in self._pinned.values()),
            "root": base64.b64encode(self._root.envelope_bytes).decode("ascii"),
            "seen": sorted(digest.hex() for digest in self._seen),
        }
        # Compact separators keep json on its C encoder; from_bytes reads any layout.
        return json.dumps(state, sort_keys=True, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> TrustStore:
        """Inverse of `to_bytes`; re-checks the stored root's own signatures.

        Raises RootRotationError when the state is malformed or the stored root no
        longer verifies (corrupted or tampered storage): re-provision the device.
        """
        try:
            state = json.loads(data.decode("utf-8"))
            if state.get("format") != _STATE_FORMAT:
                raise ValueError(f"format is {state.get('format')!r}, expected {_STATE_FORMAT!r}")
            pinned = keys_by_id(
                Ed25519PublicKey.from_public_bytes(bytes.fromhex(h)) for h in state["pinned"]
            )
            envelope = policy_pb2.SignedEnvelope.FromString(base64.b64decode(state["root"]))
            seen = frozenset(bytes.fromhex(h) for h in state["seen"])
        except (ValueError, KeyError, TypeError, AttributeError, DecodeError) as exc:
            raise RootRotationError(
                f"stored trust state is malformed ({exc}); re-provision the trust root"
            ) from None
        check_payload_type(envelope, ROOT_PAYLOAD_TYPE)
        root = _parse_root(envelope)
        _require_self_signed(envelope, root)
        if not pinned:
            raise RootRotationError("stored trust state has no pinned keys; re-provision it")
        return cls(pinned, root, seen | {policy_digest(root.payload)})
