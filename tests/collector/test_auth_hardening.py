"""Exactly one spelling of a token verifies; a client certificate without a common
name falls back to the bearer token, as the auth docstring says."""

from __future__ import annotations

import datetime
import secrets
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from collector_testkit import Deployment, coarse, make_report
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import Authenticator, TokenAuthority, bearer_metadata
from fedldp.collector.errors import UnauthenticatedError
from fedldp.collector.server import start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

NOW = 1_800_000_000


@pytest.fixture
def authority() -> TokenAuthority:
    return TokenAuthority(secrets.token_bytes(32))


def _respellings(token: str) -> list[str]:
    """Other spellings of the same (subject, expiry, mac)."""
    version, subject, expiry, mac = token.split(".")
    arabic = expiry.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    return [
        f"{version}.{subject}.0{expiry}.{mac}",  # a leading zero
        f"{version}.{subject}.00{expiry}.{mac}",
        f"{version}.{subject}.{arabic}.{mac}",  # other Unicode digits
        f"{version}.{subject}=.{expiry}.{mac}",  # base64 padding
        f"{version}.{subject}.{expiry}.{mac}=",
        f"{version}.{subject[:1]}\n{subject[1:]}.{expiry}.{mac}",  # ignored characters
        f"{version}.{subject}.{expiry}.{mac[:-1]}{_sibling(mac[-1])}",  # unused low bits
        f"{version}.{subject}.+{expiry}.{mac}",
        f"{version}.{subject}.{expiry}.{mac}.",
    ]


def _sibling(last: str) -> str:
    """Another base64 character with the same high bits (the low ones are unused
    when the encoding ends with a partial group)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    return alphabet[alphabet.index(last) ^ 1]


def test_only_the_minted_spelling_verifies(authority: TokenAuthority) -> None:
    token = authority.mint("device-7", expires_at=NOW + 3600)
    assert authority.verify(token, now=NOW) == "device-7"
    for other in _respellings(token):
        assert other != token
        with pytest.raises(UnauthenticatedError):
            authority.verify(other, now=NOW)
    assert list(authority._verified) == [token]  # one cache entry per token


# -- a client certificate without a common name --


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
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


def _pem(obj: x509.Certificate | ec.EllipticCurvePrivateKey) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_a_certificate_without_a_common_name_falls_back_to_the_token(
    deployment: Deployment, tmp_path: Path, sqlite_url: str, now: int
) -> None:
    ca_key, server_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    server = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
        server_key,
        ca_name,
        ca_key,
        ca=False,
    )
    no_cn = _cert(
        x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fleet")]),
        client_key,
        ca_name,
        ca_key,
        ca=False,
    )
    for name, obj in (("ca.pem", ca), ("server.pem", server), ("server.key", server_key)):
        (tmp_path / name).write_bytes(_pem(obj))
    config = deployment.config(
        sqlite_url,
        tls_cert=str(tmp_path / "server.pem"),
        tls_key=str(tmp_path / "server.key"),
        tls_client_ca=str(tmp_path / "ca.pem"),
        mtls=True,
    )
    running = start_collector(config, registry=deployment.registry())
    policy = deployment.verified(deployment.envelopes[0])
    request = pb.SubmitRequest(
        reports=[make_report(policy, CategoryOutput(2), coarse_time=coarse(now))]
    )
    creds = grpc.ssl_channel_credentials(
        root_certificates=_pem(ca), private_key=_pem(client_key), certificate_chain=_pem(no_cn)
    )
    try:
        with grpc.secure_channel(f"localhost:{running.port}", creds) as channel:
            stub = collector_pb2_grpc.CollectorStub(channel)
            with pytest.raises(grpc.RpcError) as err:  # no CN and no token
                stub.Submit(request, timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            response = stub.Submit(
                request, metadata=bearer_metadata(deployment.token("cn-less")), timeout=10
            )
        assert response.outcomes[0].outcome == pb.OUTCOME_ACCEPTED
        window = policy.window_start(now)
        assert running.ledger.spent("cn-less", "color", window) == Decimal("0.5")
    finally:
        running.stop(1.0)


@pytest.mark.parametrize("names", [[], [b""], [b"bad name"]])
def test_the_common_name_decides_only_when_it_is_a_subject(names: list[bytes]) -> None:
    """An empty or missing CN falls back to the token; a CN that is there but not a
    valid subject is refused (never replaced by a token's subject)."""
    tokens = TokenAuthority(secrets.token_bytes(32))
    auth = Authenticator(tokens, mtls=True)
    token = tokens.mint("from-token", expires_at=NOW + 60)
    context = {"x509_common_name": names}
    if names == [b"bad name"]:
        with pytest.raises(UnauthenticatedError, match="common name"):
            auth.subject_from(bearer_metadata(token), context, now=NOW)
    else:
        assert auth.subject_from(bearer_metadata(token), context, now=NOW) == "from-token"
