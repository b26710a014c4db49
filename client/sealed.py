"""Seal a randomized payload to the analyzer's public key (shuffle model, docs/shuffle.md).

HPKE (RFC 9180) base mode, single shot, suite DHKEM(X25519, HKDF-SHA256) / HKDF-SHA256 /
ChaCha20-Poly1305, through `cryptography.hazmat.primitives.hpke` (part of the SDK's base
dependency `cryptography`; the module exists from cryptography 46 on, and this raises a clear
error on an older one). The plaintext is a `Report` holding only its payload oneof; the HPKE
`info` binds the policy (id, version, digest), so the analyzer opens a ciphertext only for the
policy it is estimating, and a shuffler or collector that moves a ciphertext to another policy
makes it fail to open. No time is bound: the shuffled batch carries none. Nothing here logs or
keeps the output.

`seal_output` (or `seal_report`, on a built wire report) is the device's one call;
`open_sealed` (the analyzer's) is here too because both sides must agree byte for byte on the
plaintext and `info`.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

from fedldp.client.mechanisms.base import Output, OutputDomainError, SealedOutput
from fedldp.client.wire import fill_payload, output_from_report
from fedldp.v1 import collector_pb2

_INFO_DOMAIN = b"fedldp.sealed.v2\x00"  # v2: the plaintext is framed and padded (_pad)
#: X25519 raw public keys are 32 bytes.
PUBLIC_KEY_BYTES = 32
#: The padded plaintext's length is a multiple of this: the ciphertext's length reveals
#: only ceil((4 + encoded payload) / PAD_BUCKET), and every payload of a category, bit
#: vector or numeric mechanism (at most a few hundred bits of randomized output) fits one
#: bucket, so for those the length reveals nothing about the output (docs/shuffle.md).
PAD_BUCKET = 256
#: HPKE's 32-byte encapsulated key plus the 16-byte ChaCha20-Poly1305 tag.
_OVERHEAD = 32 + 16
_FRAME = struct.Struct(">I")
#: Largest sealed ciphertext accepted anywhere (enc + 255 padded buckets + tag).
MAX_CIPHERTEXT_BYTES = _OVERHEAD + 255 * PAD_BUCKET
#: Smallest possible one: one padded bucket.
MIN_CIPHERTEXT_BYTES = _OVERHEAD + PAD_BUCKET


class SealingUnavailableError(RuntimeError):
    """The installed `cryptography` has no HPKE (needs cryptography >= 46)."""


def _suite() -> Any:
    """The one HPKE suite both sides use."""
    try:
        from cryptography.hazmat.primitives import hpke
    except ImportError as exc:  # pragma: no cover - depends on the installed version
        raise SealingUnavailableError(
            "sealed payloads need HPKE from cryptography >= 46: pip install -U cryptography"
        ) from exc
    return hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


def key_id(public_key_raw: bytes) -> str:
    """The id of an analyzer public key: the first 8 bytes of its SHA-256, hex."""
    if len(public_key_raw) != PUBLIC_KEY_BYTES:
        raise ValueError(f"an X25519 public key is {PUBLIC_KEY_BYTES} bytes")
    return hashlib.sha256(public_key_raw).digest()[:8].hex()


def seal_info(policy_id: str, policy_version: int, policy_digest: bytes) -> bytes:
    """HPKE `info`: a length-prefixed encoding of the policy (id, version, digest)."""
    pid = policy_id.encode("utf-8")
    return (
        _INFO_DOMAIN
        + struct.pack("<I", len(pid))
        + pid
        + struct.pack("<QI", policy_version, len(policy_digest))
        + policy_digest
    )


def seal_output(
    output: Output, public_key_raw: bytes, *, info: bytes
) -> collector_pb2.SealedPayload:
    """The `SealedPayload` carrying `output` readable only with the analyzer's private key.

    Each call draws a fresh ephemeral key from the OS CSPRNG (inside HPKE), so sealing the
    same output twice gives unrelated ciphertexts.
    """
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    if isinstance(output, SealedOutput):
        raise TypeError("the output is sealed already")
    inner = collector_pb2.Report()
    fill_payload(inner, output)
    public_key = X25519PublicKey.from_public_bytes(public_key_raw)
    plaintext = _pad(inner.SerializeToString(deterministic=True))
    ciphertext = _suite().encrypt(plaintext, public_key, info=info)
    return collector_pb2.SealedPayload(ciphertext=ciphertext, key_id=key_id(public_key_raw))


def seal_report(report: collector_pb2.Report, public_key_raw: bytes) -> None:
    """Replace `report`'s plain payload, in place, by the same payload sealed to the analyzer.

    `info` is the report's own policy (id, version, digest). Setting the `sealed` member of
    the payload oneof clears the plain one, so the plain output leaves nothing on the wire.
    """
    output = output_from_report(report)
    info = seal_info(report.policy_id, report.policy_version, report.policy_digest)
    report.sealed.CopyFrom(seal_output(output, public_key_raw, info=info))


def _pad(encoded: bytes) -> bytes:
    """The plaintext sealed for an encoded payload: a 4-byte big-endian length, the payload,
    zero bytes up to the next multiple of PAD_BUCKET (so the ciphertext's length does not
    depend on the randomized output within a bucket)."""
    framed = _FRAME.pack(len(encoded)) + encoded
    if len(framed) > MAX_CIPHERTEXT_BYTES - _OVERHEAD:
        raise ValueError("the encoded payload is too large to seal")
    return framed + bytes(-len(framed) % PAD_BUCKET)


def _unpad(plaintext: bytes) -> bytes:
    """The encoded payload inside a padded plaintext; OutputDomainError("MALFORMED_SEALED")
    unless the length prefix fits, the padding is all zero and as short as `_pad` makes it."""
    if len(plaintext) < _FRAME.size or len(plaintext) % PAD_BUCKET:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext is not padded")
    (length,) = _FRAME.unpack_from(plaintext)
    end = _FRAME.size + length
    if end > len(plaintext) or -end % PAD_BUCKET != len(plaintext) - end:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext has a bad length prefix")
    if any(plaintext[end:]):
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext padding is not zero")
    return plaintext[_FRAME.size : end]


def check_sealed_shape(ciphertext: bytes) -> None:
    """Raise OutputDomainError("MALFORMED_SEALED") unless the length is a possible one:
    HPKE's enc and tag around a whole number (1 to 255) of PAD_BUCKET-byte padded blocks.

    All that anyone without the analyzer's key can check (the collector runs it).
    """
    size = len(ciphertext)
    if not MIN_CIPHERTEXT_BYTES <= size <= MAX_CIPHERTEXT_BYTES or (size - _OVERHEAD) % PAD_BUCKET:
        raise OutputDomainError("MALFORMED_SEALED", "sealed payload has an invalid length")


def open_sealed(ciphertext: bytes, private_key: Any, *, info: bytes) -> Output:
    """The output inside `ciphertext` (the analyzer's side).

    Raises OutputDomainError("MALFORMED_SEALED") when the ciphertext does not open with this
    key and `info`, or when its plaintext is not a payload-only `Report`; the mechanism's own
    `check_output` is the caller's next step.
    """
    from cryptography.exceptions import InvalidTag
    from google.protobuf.message import DecodeError

    check_sealed_shape(ciphertext)
    try:
        plaintext = _suite().decrypt(ciphertext, private_key, info=info)
    except (InvalidTag, ValueError) as exc:
        raise OutputDomainError("MALFORMED_SEALED", "sealed payload does not open") from exc
    plaintext = _unpad(plaintext)
    inner = collector_pb2.Report()
    try:
        inner.ParseFromString(plaintext)
    except DecodeError as exc:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext is not a report") from exc
    return _payload_only(inner, plaintext)


def _payload_only(inner: collector_pb2.Report, plaintext: bytes) -> Output:
    """The output of a plaintext `Report` that holds its payload and nothing else.

    Refused (OutputDomainError "MALFORMED_SEALED"): any set field besides one plain payload
    (report id, policy id, version, digest, time, a nested sealed payload...), and any bytes
    the canonical encoding of that payload alone does not have (an unknown field, top-level
    or nested, could carry a device identifier past the shuffler).
    """
    kind = inner.WhichOneof("payload")
    if kind is None or kind == "sealed" or len(inner.ListFields()) != 1:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext carries more than a payload")
    output = output_from_report(inner)
    canonical = collector_pb2.Report()
    fill_payload(canonical, output)
    if canonical.SerializeToString(deterministic=True) != plaintext:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext carries more than a payload")
    return output
