"""Listen and dial addresses of the release service: which are loopback, when
plaintext gRPC is refused, and which TLS options make a whole.

Kept apart from the server (fedldp.aggregator.service.server) so that the analyst's
client (`fedldp release ... --service`, `fedldp release-service query`) can check an
address without importing the service, its ledger or the training stack.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path


def is_loopback(address: str) -> bool:
    """Whether a host:port (or [v6]:port) address names this machine's loopback interface
    ("localhost", 127.0.0.0/8, ::1); anything else, unparseable included, is not."""
    host, sep, _port = address.rpartition(":")
    host = (host if sep else address).strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_plaintext(
    address: str, *, tls: bool, insecure: bool, remedy: str = "give --tls-cert and --tls-key"
) -> None:
    """ValueError for plaintext gRPC (bearer tokens in clear text) to or on a non-loopback
    `address` unless `insecure` says so explicitly; `remedy` names the TLS option(s)."""
    if not tls and not insecure and not is_loopback(address):
        raise ValueError(
            f"{address} is not a loopback address and no TLS is configured: bearer tokens "
            f"would cross the network in clear text; {remedy} (or --insecure, unsafe)"
        )


def check_tls(cert: Path | None, key: Path | None, client_ca: Path | None, *, mtls: bool) -> None:
    """ValueError when TLS options do not make a whole: a certificate without its key (or
    the reverse), or mutual TLS (`mtls`, a client CA) without a server certificate, or a
    client CA without `mtls` (it would be silently unused), or `mtls` without a client CA."""
    if (cert is None) != (key is None):
        raise ValueError("--tls-cert and --tls-key go together")
    if mtls and (cert is None or client_ca is None):
        raise ValueError("--mtls needs --tls-cert, --tls-key and --tls-client-ca")
    if client_ca is not None and not mtls:
        raise ValueError("--tls-client-ca is only used with --mtls")
