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

from fedldp.client.mechanisms.base import Output, OutputDomainError
from fedldp.client.wire import fill_payload, output_from_report
from fedldp.v1 import collector_pb2

_INFO_DOMAIN = b"fedldp.sealed.v1\x00"
#: X25519 raw public keys are 32 bytes.
PUBLIC_KEY_BYTES = 32
#: Largest sealed ciphertext accepted anywhere (enc + payload + tag); a report payload is small.
MAX_CIPHERTEXT_BYTES = 64 * 1024


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

    inner = collector_pb2.Report()
    fill_payload(inner, output)
    public_key = X25519PublicKey.from_public_bytes(public_key_raw)
    ciphertext = _suite().encrypt(inner.SerializeToString(), public_key, info=info)
    return collector_pb2.SealedPayload(ciphertext=ciphertext, key_id=key_id(public_key_raw))


def seal_report(report: collector_pb2.Report, public_key_raw: bytes) -> None:
    """Replace `report`'s plain payload, in place, by the same payload sealed to the analyzer.

    `info` is the report's own policy (id, version, digest). Setting the `sealed` member of
    the payload oneof clears the plain one, so the plain output leaves nothing on the wire.
    """
    output = output_from_report(report)
    info = seal_info(report.policy_id, report.policy_version, report.policy_digest)
    report.sealed.CopyFrom(seal_output(output, public_key_raw, info=info))


def open_sealed(ciphertext: bytes, private_key: Any, *, info: bytes) -> Output:
    """The output inside `ciphertext` (the analyzer's side).

    Raises OutputDomainError("MALFORMED_SEALED") when the ciphertext does not open with this
    key and `info`, or when its plaintext is not a payload-only `Report`; the mechanism's own
    `check_output` is the caller's next step.
    """
    from cryptography.exceptions import InvalidTag
    from google.protobuf.message import DecodeError

    if not 0 < len(ciphertext) <= MAX_CIPHERTEXT_BYTES:
        raise OutputDomainError("MALFORMED_SEALED", "sealed payload has an invalid length")
    try:
        plaintext = _suite().decrypt(ciphertext, private_key, info=info)
    except (InvalidTag, ValueError) as exc:
        raise OutputDomainError("MALFORMED_SEALED", "sealed payload does not open") from exc
    inner = collector_pb2.Report()
    try:
        inner.ParseFromString(plaintext)
    except DecodeError as exc:
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext is not a report") from exc
    if inner.report_id or inner.policy_id or inner.coarse_time or inner.HasField("sealed"):
        raise OutputDomainError("MALFORMED_SEALED", "sealed plaintext carries more than a payload")
    return output_from_report(inner)
