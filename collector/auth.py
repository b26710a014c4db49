"""Device authentication: bearer tokens verifiable without a database, or mTLS.

Token format (version 1), all parts URL-safe base64 without padding except
`expiry` (decimal Unix seconds)::

    v1.<b64(subject)>.<expiry>.<b64(mac)>
    mac = HMAC-SHA256(secret, domain + subject + "\\0" + expiry)

`domain` names the token's audience: "fedldp-token-v1\\0" for the collector
(devices), "fedldp-token-v1/release-service\\0" for the release service
(analysts). A token minted for one audience never verifies at the other, even
when an operator gives both the same secret.

Exactly one spelling of a token verifies: each base64 part must be the
canonical encoding of its bytes (no padding, no characters a lenient decoder
skips, unused low bits zero) and `expiry` the canonical decimal of a positive
integer (ASCII digits, no sign, no leading zero), checked before the MAC. So a
token cannot be re-spelled into many strings that verify (each would take a
place in the verified-token cache).

The collector verifies a token with one HMAC and a constant-time comparison: no
database round trip. Tokens are minted by an operator (or an enrollment service)
holding the same secret (`fedldp collector mint-token`). The ledger's subject is
the token's subject, or the client certificate's common name under mutual TLS;
never a request field.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from fedldp.collector.errors import UnauthenticatedError

TOKEN_VERSION = "v1"
#: Token audiences and the MAC domain of each.
COLLECTOR_AUDIENCE = "collector"
RELEASE_SERVICE_AUDIENCE = "release-service"
_DOMAINS = {
    COLLECTOR_AUDIENCE: b"fedldp-token-v1\x00",
    RELEASE_SERVICE_AUDIENCE: b"fedldp-token-v1/release-service\x00",
}
#: Subjects: printable, no whitespace, at most 256 characters.
_SUBJECT_RE = re.compile(r"[\x21-\x7e]{1,256}")
MIN_SECRET_BYTES = 32


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


#: The canonical decimal of a positive expiry (at most 18 digits: int64 range).
_EXPIRY_RE = re.compile(r"[1-9][0-9]{0,17}")


def _unb64_canonical(text: str) -> bytes:
    """The bytes `text` encodes, if `text` is their canonical unpadded URL-safe
    base64 encoding; ValueError otherwise."""
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise ValueError("not the canonical base64 encoding")
    return data


def check_subject(subject: str) -> str:
    """Return `subject` if it is a valid ledger subject, else raise ValueError."""
    if not _SUBJECT_RE.fullmatch(subject):
        raise ValueError("a subject is 1-256 printable ASCII characters without spaces")
    return subject


class TokenAuthority:
    """Mints and verifies HMAC-SHA256 bearer tokens with one shared secret."""

    #: Verified tokens remembered (token -> (subject, expiry)); beyond this many the
    #: oldest are forgotten (and verified again if they come back).
    CACHE_SIZE = 65536

    def __init__(self, secret: bytes, *, audience: str = COLLECTOR_AUDIENCE) -> None:
        """`audience`: COLLECTOR_AUDIENCE or RELEASE_SERVICE_AUDIENCE (module docstring)."""
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError(f"the token secret must be at least {MIN_SECRET_BYTES} bytes")
        if audience not in _DOMAINS:
            raise ValueError(f"token audience must be one of {sorted(_DOMAINS)}")
        self._secret, self._domain = bytes(secret), _DOMAINS[audience]
        self._verified: dict[str, tuple[str, int]] = {}
        self._lock = threading.Lock()

    def _mac(self, subject: str, expiry: int) -> bytes:
        msg = self._domain + subject.encode("ascii") + b"\x00" + str(expiry).encode("ascii")
        return hmac.new(self._secret, msg, hashlib.sha256).digest()

    def mint(self, subject: str, *, expires_at: int) -> str:
        """A token for `subject`, valid until `expires_at` (Unix seconds, exclusive)."""
        check_subject(subject)
        if expires_at <= 0:
            raise ValueError("expires_at must be a positive Unix time")
        mac = self._mac(subject, expires_at)
        return f"{TOKEN_VERSION}.{_b64(subject.encode('ascii'))}.{expires_at}.{_b64(mac)}"

    def verify(self, token: str, *, now: int) -> str:
        """The subject of a valid, unexpired token; UnauthenticatedError otherwise.

        The error never echoes the token. A token whose signature verified once
        is remembered (the exact string, with its subject and expiry), so a device
        sending the same token on every call costs one dict lookup, not one HMAC;
        the expiry is checked on every call.
        """
        known = self._verified.get(token)
        if known is not None:
            if now >= known[1]:
                raise UnauthenticatedError("bearer token expired; mint a new one")
            return known[0]
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != TOKEN_VERSION or not _EXPIRY_RE.fullmatch(parts[2]):
            raise UnauthenticatedError("malformed bearer token")
        try:
            subject = _unb64_canonical(parts[1]).decode("ascii")
            mac = _unb64_canonical(parts[3])
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise UnauthenticatedError("malformed bearer token") from None
        expiry = int(parts[2])
        if not _SUBJECT_RE.fullmatch(subject):
            raise UnauthenticatedError("malformed bearer token")
        if not hmac.compare_digest(mac, self._mac(subject, expiry)):
            raise UnauthenticatedError("bearer token signature does not verify")
        if now >= expiry:
            raise UnauthenticatedError("bearer token expired; mint a new one")
        with self._lock:
            if len(self._verified) >= self.CACHE_SIZE:
                del self._verified[next(iter(self._verified))]
            self._verified[token] = (subject, expiry)
        return subject


class Authenticator:
    """Derives the ledger subject of a call from its credentials.

    Accepts, in order: a client certificate's common name when mutual TLS is on
    (`mtls=True`), else an ``authorization: Bearer <token>`` metadata entry. A
    certificate without a common name (grpcio reports an empty one) falls back
    to the token; a certificate whose common name is not a valid subject is
    refused (its holder is not given a token's subject instead).
    """

    def __init__(self, tokens: TokenAuthority | None, *, mtls: bool = False) -> None:
        if tokens is None and not mtls:
            raise ValueError("configure a token secret, mutual TLS, or both")
        self.tokens = tokens
        self.mtls = mtls

    def subject_from(
        self,
        metadata: Sequence[tuple[str, str | bytes]],
        auth_context: Mapping[str, Any],
        *,
        now: int,
    ) -> str:
        """The authenticated subject; UnauthenticatedError when there is none."""
        if self.mtls:
            names = [n for n in auth_context.get("x509_common_name") or () if n]
            if names:
                try:
                    return check_subject(names[0].decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    raise UnauthenticatedError(
                        "client certificate common name is not a valid subject"
                    ) from None
        if self.tokens is not None:
            for key, value in metadata:
                if key == "authorization":
                    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
                    scheme, _, token = text.partition(" ")
                    if scheme.lower() != "bearer" or not token:
                        raise UnauthenticatedError("authorization must be 'Bearer <token>'")
                    return self.tokens.verify(token.strip(), now=now)
        raise UnauthenticatedError(
            "missing credentials: send 'authorization: Bearer <token>'"
            + (" or a client certificate" if self.mtls else "")
        )


def bearer_metadata(token: str) -> tuple[tuple[str, str]]:
    """Call metadata carrying `token` (for clients and tests)."""
    return (("authorization", f"Bearer {token}"),)
