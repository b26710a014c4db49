"""Helpers for the deployment tests: throwaway TLS material (a CA, a server
certificate for localhost, a client certificate; cryptography, EC P-256), and a
check that a command line in a deployment file is one the `fedldp` CLI accepts."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

import click
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fedldp.cli import main


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(
    common_name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


@dataclass(frozen=True)
class TlsMaterial:
    """PEM paths: ca.pem, server.pem/server.key (localhost), client.pem/client.key
    (common name `client_name`), and other-ca.pem (a CA that signed nothing here)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path

    @classmethod
    def create(cls, folder: Path, *, client_name: str = "health-probe") -> TlsMaterial:
        folder.mkdir(parents=True, exist_ok=True)
        ca_key, other_key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        server_key, client_key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        return cls(
            ca=_write_cert(_sign("test-ca", ca_key, "test-ca", ca_key, ca=True), folder / "ca.pem"),
            server_cert=_write_cert(
                _sign("localhost", server_key, "test-ca", ca_key, ca=False), folder / "server.pem"
            ),
            server_key=_write_key(server_key, folder / "server.key"),
            client_cert=_write_cert(
                _sign(client_name, client_key, "test-ca", ca_key, ca=False), folder / "client.pem"
            ),
            client_key=_write_key(client_key, folder / "client.key"),
            other_ca=_write_cert(
                _sign("other-ca", other_key, "other-ca", other_key, ca=True),
                folder / "other-ca.pem",
            ),
        )


def cli_accepts(argv: list[str]) -> None:
    """`fedldp ARGV` names a real command and uses only options it declares."""
    command: click.Command = main
    rest = list(argv)
    while isinstance(command, click.Group) and rest and not rest[0].startswith("-"):
        sub = command.get_command(click.Context(command), rest.pop(0))
        assert sub is not None, f"no such command in {argv}"
        command = sub
    assert not isinstance(command, click.Group), f"{argv} names a group, not a command"
    declared = {o for p in command.params for o in getattr(p, "opts", [])}
    used = {a for a in rest if a.startswith("--")}
    assert used <= declared, f"{argv}: unknown options {sorted(used - declared)}"
