"""Sealed-payload vectors (sealed.json): the shuffle model's sealing, byte for byte.

For fixed analyzer keys and fixed HPKE ephemeral key material (RFC 9180 DeriveKeyPair's
`ikmE`), each case gives the policy (id, version, digest), HPKE's `info`
(`fedldp.client.sealed.seal_info`), the plaintext (a payload-only `Report`, framed by a
4-byte length and zero-padded to 256-byte blocks: `sealed._pad`), the key id, the
ciphertext (enc || ChaCha20-Poly1305 output) and the whole sealed wire `Report`.

`cryptography`'s HPKE draws its ephemeral key itself, so the ciphertexts here come from
`_seal_with_ikm`, base-mode HPKE (RFC 9180 Sections 4.1, 5.1, 5.2, 7.1.3) written out over
cryptography's X25519, HKDF and ChaCha20-Poly1305 with the ephemeral key derived from
`ikmE`; every ciphertext is then opened by the SDK's own `open_sealed` (cryptography's
HPKE) before it is written, so a vector that the reference cannot open is never produced.
An SDK that seals with the same `ikmE` must produce the same bytes.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from fedldp.client.mechanisms.base import BitVectorOutput, Output
from fedldp.client.sealed import _pad, key_id, open_sealed, seal_info
from fedldp.client.wire import fill_payload
from fedldp.v1 import collector_pb2

from conformance.contract_vectors import WIRE_OUTPUTS, wire_report
from conformance.mechanism_vectors import output_json

_KEM_SUITE = b"KEM" + (0x0020).to_bytes(2, "big")  # DHKEM(X25519, HKDF-SHA256)
#: "HPKE" || KEM id 0x0020 || KDF id 0x0001 (HKDF-SHA256) || AEAD id 0x0003 (ChaCha20Poly1305).
_HPKE_SUITE = b"HPKE" + bytes([0x00, 0x20, 0x00, 0x01, 0x00, 0x03])
#: The analyzer's fixed private key of the vectors (X25519, raw).
ANALYZER_PRIVATE = hashlib.sha256(b"fedldp/conformance/analyzer").digest()


def _extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    """LabeledExtract (RFC 9180 Section 4): HKDF-Extract with the "HPKE-v1" label."""
    return hmac.new(salt, b"HPKE-v1" + suite + label + ikm, hashlib.sha256).digest()


def _expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    """LabeledExpand (RFC 9180 Section 4): HKDF-Expand of I2OSP(L, 2) || "HPKE-v1" || ..."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDFExpand

    labeled = length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info
    return HKDFExpand(hashes.SHA256(), length, labeled).derive(prk)


def _seal_with_ikm(public_raw: bytes, info: bytes, plaintext: bytes, ikm_e: bytes) -> bytes:
    """Base-mode single-shot HPKE seal with the ephemeral key DeriveKeyPair(ikm_e): enc || ct."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    sk_e = _expand(_KEM_SUITE, _extract(_KEM_SUITE, b"", b"dkp_prk", ikm_e), b"sk", b"", 32)
    ephemeral = X25519PrivateKey.from_private_bytes(sk_e)
    enc = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    dh = ephemeral.exchange(X25519PublicKey.from_public_bytes(public_raw))
    eae_prk = _extract(_KEM_SUITE, b"", b"eae_prk", dh)
    shared = _expand(_KEM_SUITE, eae_prk, b"shared_secret", enc + public_raw, 32)
    context = (
        b"\x00"
        + _extract(_HPKE_SUITE, b"", b"psk_id_hash", b"")
        + _extract(_HPKE_SUITE, b"", b"info_hash", info)
    )
    secret = _extract(_HPKE_SUITE, shared, b"secret", b"")
    key = _expand(_HPKE_SUITE, secret, b"key", context, 32)
    nonce = _expand(_HPKE_SUITE, secret, b"base_nonce", context, 12)
    return enc + ChaCha20Poly1305(key).encrypt(nonce, plaintext, b"")


def _case(output: Output, index: int) -> dict[str, Any]:
    """One vector: `output` in the wire vectors' fixed report `index`, sealed."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    private = X25519PrivateKey.from_private_bytes(ANALYZER_PRIVATE)
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    report = wire_report(output, index)
    info = seal_info(report.policy_id, report.policy_version, report.policy_digest)
    inner = collector_pb2.Report()
    fill_payload(inner, output)
    plaintext = _pad(inner.SerializeToString(deterministic=True))
    ikm_e = hashlib.sha256(b"fedldp/conformance/ikmE/%d" % index).digest()
    ciphertext = _seal_with_ikm(public, info, plaintext, ikm_e)
    if output_json(open_sealed(ciphertext, private, info=info)) != output_json(output):
        raise AssertionError("the reference does not open its own vector")  # pragma: no cover
    report.sealed.ciphertext = ciphertext
    report.sealed.key_id = key_id(public)
    return {
        "output": output_json(output),
        "policy_id": report.policy_id,
        "policy_version": report.policy_version,
        "policy_digest": report.policy_digest.hex(),
        "report_id": report.report_id.hex(),
        "coarse_time": report.coarse_time,
        "info": info.hex(),
        "plaintext": plaintext.hex(),
        "ikm_e": ikm_e.hex(),
        "ciphertext": ciphertext.hex(),
        "key_id": key_id(public),
        "report": report.SerializeToString(deterministic=True).hex(),
    }


def sealed_vectors() -> dict[str, Any]:
    """The whole of sealed.json: every wire-vector output sealed, and one that needs two blocks."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    public = (
        X25519PrivateKey.from_private_bytes(ANALYZER_PRIVATE)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )
    outputs = [*WIRE_OUTPUTS, BitVectorOutput(bytes(range(256)) + bytes(range(7)), 2100)]
    return {
        "format": "fedldp.conformance.sealed.v1",
        "analyzer_private_key": ANALYZER_PRIVATE.hex(),
        "analyzer_public_key": public.hex(),
        "cases": [_case(output, i) for i, output in enumerate(outputs)],
    }
