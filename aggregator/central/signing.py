"""Signed receipts: DSSE v1 JSON envelopes over canonical JSON, Ed25519.

A receipt (training or central release) is signed by the service that ran it,
with an Ed25519 key managed like the policy keys (`fedldp keys generate --name
receipts`: PEM PKCS#8, mode 0600, optionally encrypted with a passphrase read
from an environment variable). The file on disk is a DSSE JSON envelope
(secure-systems-lab/dsse, "envelope.md")::

    {"payloadType": "application/vnd.fedldp.training-receipt.v1+json",
     "payload": BASE64(canonical JSON of the receipt),
     "signatures": [{"keyid": SHA-256 hex of the raw public key, "sig": BASE64}]}

The signature covers PAE(payloadType, payload) over the exact payload bytes
(`fedldp.client.policy.envelope.pae`, shared with the policies), so a receipt
of one kind cannot be replayed as another and nothing is re-serialized before
checking. Canonical JSON: keys sorted, separators "," and ":", UTF-8.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from fedldp.client.policy.envelope import key_id_of, pae, verify_signature

TRAINING_RECEIPT_TYPE = "application/vnd.fedldp.training-receipt.v1+json"
RELEASE_RECEIPT_TYPE = "application/vnd.fedldp.release-receipt.v1+json"
#: Largest envelope read (a receipt is a few kilobytes).
MAX_ENVELOPE_BYTES = 1 << 20


class SignatureError(ValueError):
    """The envelope is unsigned, of another type, signed by an untrusted key, or altered."""


def canonical_json(value: Mapping[str, Any]) -> bytes:
    """The exact bytes that are signed: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(payload_type: str, receipt: Mapping[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    """The DSSE JSON envelope of `receipt` signed by `key` (module docstring)."""
    payload = canonical_json(receipt)
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode("ascii"),
        "signatures": [
            {
                "keyid": key_id_of(key.public_key()),
                "sig": base64.b64encode(key.sign(pae(payload_type, payload))).decode("ascii"),
            }
        ],
    }


def is_envelope(document: object) -> bool:
    """True when `document` (parsed JSON) has the shape of a DSSE envelope."""
    return isinstance(document, dict) and "payloadType" in document and "payload" in document


def payload_of(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The receipt inside an envelope, UNVERIFIED (for display and the audit command)."""
    try:
        receipt = json.loads(base64.b64decode(envelope["payload"], validate=True))
    except (binascii.Error, ValueError, TypeError) as exc:
        raise SignatureError(f"the envelope's payload is not base64 JSON ({exc})") from None
    if not isinstance(receipt, dict):
        raise SignatureError("the envelope's payload is not a JSON object")
    return receipt


def verify(
    envelope: Mapping[str, Any],
    payload_type: str,
    trusted: Mapping[str, Ed25519PublicKey],
    *,
    what: str = "receipt",
    key_hint: str = "pass the service's receipt key with --trusted-key",
) -> tuple[dict[str, Any], str]:
    """(payload, signer key id) when a key in `trusted` (by key id) signed the exact payload.

    Raises SignatureError naming what is wrong: no signature, another payload
    type, only untrusted signers, or a signature that does not verify (the
    payload was altered after signing). `what` names the document in those
    messages and `key_hint` says how to trust its signer.
    """
    if envelope.get("payloadType") != payload_type:
        raise SignatureError(
            f"payload type is {envelope.get('payloadType')!r}, expected {payload_type!r}"
        )
    signatures = envelope.get("signatures") or []
    if not isinstance(signatures, list) or not signatures:
        raise SignatureError(f"the {what} is not signed")
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
    except (binascii.Error, ValueError, TypeError):
        raise SignatureError("the envelope's payload is not base64") from None
    message = pae(payload_type, payload)
    named = []
    for entry in signatures[:16]:
        if not isinstance(entry, dict):
            continue
        key_id = str(entry.get("keyid", ""))
        named.append(key_id)
        key = trusted.get(key_id)
        if key is None:
            continue
        try:
            sig = base64.b64decode(str(entry.get("sig", "")), validate=True)
        except (binascii.Error, ValueError):
            sig = b""  # a trusted key's mangled signature: altered, not untrusted
        if verify_signature(key, sig, message):
            return payload_of(envelope), key_id
        raise SignatureError(
            f"the signature by trusted key {key_id[:16]}… does not verify: "
            f"the {what} was altered after it was signed"
        )
    raise SignatureError(
        f"signed only by untrusted key(s) {', '.join(k[:16] + '…' for k in named)}; {key_hint}"
    )


def read_json(path: Path) -> Any:
    """Parse a JSON file of at most MAX_ENVELOPE_BYTES."""
    data = path.read_bytes()
    if len(data) > MAX_ENVELOPE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_ENVELOPE_BYTES} bytes: not a receipt")
    return json.loads(data)


def trusted_keys(keys: list[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """Index public keys by key id."""
    return {key_id_of(k): k for k in keys}
