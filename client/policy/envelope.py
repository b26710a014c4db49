"""The signed envelope: DSSE v1 pre-authentication encoding, key ids and digests.

Signatures cover PAE(payload_type, payload) over the exact payload bytes, as in
DSSE v1 (secure-systems-lab/dsse, "protocol.md"):

    PAE(type, body) = "DSSEv1" SP LEN(type) SP type SP LEN(body) SP body

where SP is one ASCII space and LEN is the byte length in ASCII decimal with no
leading zeros. Binding the payload type means a root cannot be replayed as a
policy, nor a policy of one schema version as another. Nothing here parses the
payload: signatures are checked on the bytes as received and are never
re-computed over a re-serialized message (serialization is not canonical).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fedldp.client.policy.errors import InvalidPolicyError, PayloadTypeError
from fedldp.v1 import policy_pb2

#: Payload type of a signed `fedldp.v1.Policy`.
POLICY_PAYLOAD_TYPE = "application/vnd.fedldp.policy.v1+proto"
#: Payload type of a signed `fedldp.v1.Root`.
ROOT_PAYLOAD_TYPE = "application/vnd.fedldp.root.v1+proto"

#: Largest payload accepted for verification at all (checked before any crypto):
#: the largest valid domain (65536 labels of <= 256 bytes, at most 4 MiB of label
#: bytes in total) with room for the rest of the message.
MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
#: Most signatures looked at in one envelope (bounds the verification work).
MAX_SIGNATURES = 16

_DOMAIN_LENGTH_BYTES = 4

#: Most successful verifications remembered per process (least recently used dropped).
VERIFIED_CACHE_ENTRIES = 64
#: Largest signed message whose successful verification is remembered (bigger ones,
#: e.g. huge domains, are verified afresh each time rather than kept in memory).
VERIFIED_CACHE_MAX_MESSAGE_BYTES = 64 * 1024


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of (payload_type, payload).

    The signed message is this encoding, never the payload alone, so the type is
    authenticated together with the bytes.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte encoding of an Ed25519 public key."""
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id_of(public_key: Ed25519PublicKey) -> str:
    """Lowercase hex SHA-256 of the raw 32-byte public key (the wire `key_id`)."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()


def policy_digest(payload: bytes) -> bytes:
    """SHA-256 of the exact signed payload bytes (32 bytes).

    This is the policy's identity on the wire: reports name (policy id, version,
    digest), and the collector accepts a report only for an active triple.
    """
    return hashlib.sha256(payload).digest()


def domain_digest(values: Sequence[str]) -> bytes:
    """The categorical domain digest defined in policy.proto (CategoricalDomain).

    SHA-256 over, for each value in index order, its UTF-8 byte length as a 4-byte
    big-endian unsigned integer followed by its UTF-8 bytes. Length prefixes make
    the encoding injective (["ab"] and ["a", "b"] differ).
    """
    digest = hashlib.sha256()
    for value in values:
        encoded = value.encode("utf-8")
        digest.update(len(encoded).to_bytes(_DOMAIN_LENGTH_BYTES, "big"))
        digest.update(encoded)
    return digest.digest()


def check_payload_type(envelope: policy_pb2.SignedEnvelope, expected: str) -> None:
    """PayloadTypeError unless the envelope carries `expected`; InvalidPolicyError if oversized."""
    if envelope.payload_type != expected:
        raise PayloadTypeError(
            f"envelope payload type is {envelope.payload_type!r}, expected {expected!r}; "
            "pass a policy envelope where a policy is expected and a root envelope where "
            "a root is expected"
        )
    if len(envelope.payload) > MAX_PAYLOAD_BYTES:
        raise InvalidPolicyError(
            [
                f"payload is {len(envelope.payload)} bytes, more than the {MAX_PAYLOAD_BYTES} "
                "accepted; split the domain or shorten the labels"
            ],
            subject="envelope",
        )


class _VerifiedCache:
    """Successful Ed25519 verifications, keyed by the exact (key, signature, message) bytes.

    Ed25519 verification is a deterministic function of (public key, signature,
    message), so a remembered success is exactly as strong as verifying again:
    a hit needs the same 32 raw key bytes, the same signature bytes and the same
    message bytes, compared in full (dict keys compare by equality after the hash;
    nothing is reduced to a digest). Only successes are kept; a failure is
    re-checked every time. Bounded in entries and message size; thread-safe.
    """

    def __init__(self, entries: int, max_message_bytes: int) -> None:
        self._entries = entries
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._ok: OrderedDict[tuple[bytes, bytes, bytes], None] = OrderedDict()

    def verify(self, key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
        """True when `signature` is a valid Ed25519 signature by `key` over `message`."""
        entry = None
        if len(message) <= self._max_message_bytes:
            entry = (raw_public_bytes(key), bytes(signature), bytes(message))
            with self._lock:
                if entry in self._ok:
                    self._ok.move_to_end(entry)
                    return True
        try:
            key.verify(signature, message)
        except InvalidSignature:
            return False
        if entry is not None:
            with self._lock:
                self._ok[entry] = None
                if len(self._ok) > self._entries:
                    self._ok.popitem(last=False)
        return True

    def clear(self) -> None:
        """Forget every remembered verification (tests; never needed for safety)."""
        with self._lock:
            self._ok.clear()


_VERIFIED = _VerifiedCache(VERIFIED_CACHE_ENTRIES, VERIFIED_CACHE_MAX_MESSAGE_BYTES)


def verify_signature(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """True when `signature` is a valid Ed25519 signature by `key` over the exact `message`.

    A process verifies the same (key, signature, message) bytes once: the result
    of a successful check is remembered, keyed by all three byte strings in full,
    so a repeated check (a root re-read from the state file, the same policy
    fetched by a second client in one process) costs a dictionary lookup and is
    exactly as strong as a fresh verification. Failures are never remembered.
    """
    return _VERIFIED.verify(key, signature, message)


def clear_verification_cache() -> None:
    """Forget remembered verifications (for tests and benchmarks that time a cold check)."""
    _VERIFIED.clear()


def valid_signers(
    envelope: policy_pb2.SignedEnvelope, keys: Mapping[str, Ed25519PublicKey]
) -> set[str]:
    """Key ids in `keys` with a valid signature over PAE(type, exact payload).

    Signatures by keys not in `keys` and invalid signatures are ignored (TUF's
    threshold counting); each key id counts once. The caller decides the
    threshold and which error to raise. At most MAX_SIGNATURES are examined.
    """
    message = pae(envelope.payload_type, envelope.payload)
    signers: set[str] = set()
    for signature in list(envelope.signatures)[:MAX_SIGNATURES]:
        key = keys.get(signature.key_id)
        if key is None or signature.key_id in signers:
            continue
        if verify_signature(key, signature.sig, message):
            signers.add(signature.key_id)
    return signers


def signature_key_ids(envelope: policy_pb2.SignedEnvelope) -> list[str]:
    """The key ids named by the envelope's signatures, in order (unverified)."""
    return [signature.key_id for signature in envelope.signatures]


def keys_by_id(public_keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """Index public keys by their key id."""
    return {key_id_of(key): key for key in public_keys}
