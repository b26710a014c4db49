"""Keyed digests of protected data (confidential data bindings).

A plain SHA-256 of a protected data file is not private: an adversary who
knows every record but one hashes each candidate completion and recovers the
last record exactly, whatever ε the release spent. Every digest of protected
data that fedldp publishes (release receipts, training receipts, ledger
events) is therefore an HMAC-SHA256 (RFC 2104) under a secret *data-digest
key* held by the service or operator that runs releases and never published:

    mac = HMAC-SHA256(key, b"fedldp-data-digest-v1\\n" + label + b"\\n" + sha256_hex)

where `sha256_hex` is the plain digest the reader computed while reading and
`label` names what is digested ("file", "dataset"). Without the key a MAC
says nothing about the data (HMAC is a PRF); with it, a verifier re-reads
the data and checks the binding. `key_id` (a MAC of a fixed label, 16 hex) is
published so that a verifier holding the wrong key is told so; it reveals
nothing about the data.

The key file holds 64 hex characters (32 random bytes from the OS CSPRNG),
written by `fedldp keys data-key --out PATH` with mode 0600. Treat it like
the receipt signing key: whoever holds it can test guesses of the data.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

PREFIX = b"fedldp-data-digest-v1\n"
KEY_BYTES = 32
ALGORITHM = "hmac-sha256"


class DataKeyError(ValueError):
    """The data-digest key file is missing, malformed or too short."""


@dataclass(frozen=True)
class KeyedDigest:
    """A published data binding: the MAC and the id of the key that made it."""

    mac: str
    key_id: str


@dataclass(frozen=True)
class DataKey:
    """A secret data-digest key (never logged, never published; `repr` hides it)."""

    secret: bytes

    def __repr__(self) -> str:
        return f"DataKey(id={self.key_id})"

    @property
    def key_id(self) -> str:
        """Public identifier of this key (16 hex), independent of any data."""
        return hmac.new(self.secret, PREFIX + b"key-id", hashlib.sha256).hexdigest()[:16]

    def digest(self, label: str, sha256_hex: str) -> KeyedDigest:
        """The keyed digest of data whose plain SHA-256 is `sha256_hex` (module docstring)."""
        message = PREFIX + label.encode() + b"\n" + sha256_hex.encode()
        return KeyedDigest(hmac.new(self.secret, message, hashlib.sha256).hexdigest(), self.key_id)

    def matches(self, label: str, sha256_hex: str, mac: object) -> bool:
        """Whether `mac` is this key's digest of that data (constant-time comparison)."""
        return isinstance(mac, str) and hmac.compare_digest(self.digest(label, sha256_hex).mac, mac)


def load_data_key(path: str | Path) -> DataKey:
    """Read a data-digest key file (64 hex characters); DataKeyError when unusable."""
    try:
        text = Path(path).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataKeyError(f"cannot read the data-digest key {path}: {exc}") from None
    try:
        secret = bytes.fromhex(text)
    except ValueError:
        raise DataKeyError(f"{path}: a data-digest key is {2 * KEY_BYTES} hex characters") from None
    if len(secret) < KEY_BYTES:
        raise DataKeyError(f"{path}: a data-digest key is at least {KEY_BYTES} bytes")
    return DataKey(secret)


def generate_data_key(path: str | Path) -> DataKey:
    """Write a new random key to `path` (never overwrites; mode 0600) and return it."""
    secret = secrets.token_bytes(KEY_BYTES)
    fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(secret.hex() + "\n")
    return DataKey(secret)
