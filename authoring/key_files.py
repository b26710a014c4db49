"""Key and envelope files on the authoring side: private keys, public keys, envelopes.

Formats (see docs/policies.md):

* private key: PEM PKCS#8 Ed25519, optionally encrypted with a passphrase
  (BestAvailableEncryption), created with mode 0600 and never overwritten;
* public key: PEM SubjectPublicKeyInfo Ed25519 (exclusive create);
* envelope (``*.policy``, ``*.root``): the serialized `fedldp.v1.SignedEnvelope`
  bytes, exactly as signed (atomic replace).

Devices only read public keys and envelopes (`fedldp.client.policy.files`).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from fedldp.client.policy.files import KeyFileError
from fedldp.v1 import policy_pb2

#: Mode of a private key file (owner read/write only).
PRIVATE_KEY_MODE = 0o600


def write_private_key(
    key: Ed25519PrivateKey, path: str | Path, *, passphrase: bytes | None = None
) -> Path:
    """Write `key` as PEM PKCS#8 with mode 0600 (created exclusively; never overwrites).

    With `passphrase`, the PEM is encrypted (cryptography's BestAvailableEncryption).
    Raises FileExistsError if `path` exists.
    """
    path = Path(path)
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_KEY_MODE)
    try:
        os.fchmod(fd, PRIVATE_KEY_MODE)  # the umask may have narrowed it; never widened
        os.write(fd, data)
    finally:
        os.close(fd)
    return path


def write_public_key(key: Ed25519PublicKey, path: str | Path) -> Path:
    """Write `key` as PEM SubjectPublicKeyInfo (exclusive create)."""
    path = Path(path)
    data = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    with path.open("xb") as handle:
        handle.write(data)
    return path


def load_private_key(path: str | Path, *, passphrase: bytes | None = None) -> Ed25519PrivateKey:
    """Read a PEM PKCS#8 Ed25519 private key (decrypting with `passphrase` if given)."""
    path = Path(path)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=passphrase)
    except TypeError as exc:  # encrypted without a passphrase, or vice versa
        raise KeyFileError(
            f"{path}: {exc}; pass the passphrase (--passphrase-env VAR) if the key is encrypted"
        ) from None
    except ValueError as exc:
        raise KeyFileError(
            f"{path} is not a readable PEM private key or the passphrase is wrong ({exc})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 private key; generate one with fedldp keys")
    return key


def write_envelope(envelope: policy_pb2.SignedEnvelope, path: str | Path) -> Path:
    """Write a SignedEnvelope's serialized bytes to `path` (atomic replace; creates folders)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(envelope.SerializeToString())
    os.replace(tmp, path)
    return path


__all__ = [
    "PRIVATE_KEY_MODE",
    "KeyFileError",
    "load_private_key",
    "write_envelope",
    "write_private_key",
    "write_public_key",
]
