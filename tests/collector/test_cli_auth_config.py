"""`fedldp ledger` / `fedldp collector` commands, tokens, rate limiter, config, and TLS/mTLS."""

from __future__ import annotations

import datetime
import hashlib
import secrets
from decimal import Decimal
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from collector_testkit import Deployment, coarse, make_report
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fedldp.client.mechanisms import CategoryOutput
from fedldp.collector.auth import TokenAuthority
from fedldp.collector.config import ConfigError, load_config
from fedldp.collector.errors import UnauthenticatedError
from fedldp.collector.ledger import CheckedReport, open_ledger
from fedldp.collector.ledger.schema import spend
from fedldp.collector.ratelimit import RateLimiter
from fedldp.collector.server import start_collector
from fedldp.v1 import collector_pb2 as pb
from fedldp.v1 import collector_pb2_grpc

from fedldp.cli import main
from fedldp.cli_collector import collector


def test_ledger_show_reconcile_and_set_cap(
    deployment: Deployment, sqlite_url: str, now: int
) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    with open_ledger(sqlite_url) as led:
        led.submit(
            "alice",
            [
                CheckedReport(
                    secrets.token_bytes(16),
                    policy,
                    CategoryOutput(0),
                    hashlib.sha256(b"x").digest(),
                    0,
                )
            ],
            now=now,
        )
    runner = CliRunner()
    shown = runner.invoke(main, ["ledger", "show", "alice", "--ledger", sqlite_url])
    assert shown.exit_code == 0, shown.output
    assert "color" in shown.output and "0.5" in shown.output and "1.5" in shown.output
    assert (
        "nothing charged"
        in runner.invoke(main, ["ledger", "show", "zed", "--ledger", sqlite_url]).output
    )
    ok = runner.invoke(main, ["ledger", "reconcile", "--ledger", sqlite_url])
    assert ok.exit_code == 0 and "consistent" in ok.output
    capped = runner.invoke(
        main,
        [
            "ledger",
            "set-cap",
            "model",
            "train",
            "--epsilon",
            "2",
            "--delta",
            "0.000001",
            "--ledger",
            sqlite_url,
        ],
    )
    assert capped.exit_code == 0, capped.output
    with open_ledger(sqlite_url) as led:
        assert led.central_cap("model", "train") == (Decimal("2"), Decimal("0.000001"))
        led.transaction(lambda c: c.execute(spend.update().values(epsilon_spent="0.25")))
    bad = runner.invoke(main, ["ledger", "reconcile", "--ledger", sqlite_url])
    assert bad.exit_code == 1
    assert "MISMATCH spend: subject=alice" in bad.output
    refused = runner.invoke(
        main,
        ["ledger", "set-cap", "m", "p", "--epsilon", "x", "--delta", "0", "--ledger", sqlite_url],
    )
    assert refused.exit_code != 0 and "decimal" in refused.output


def test_mint_token_cli(tmp_path: Path) -> None:
    secret = secrets.token_bytes(32)
    path = tmp_path / "secret"
    path.write_text(secret.hex())
    result = CliRunner().invoke(
        collector, ["mint-token", "device-1", "--secret-file", str(path), "--ttl", "600"]
    )
    assert result.exit_code == 0, result.output
    import time

    assert TokenAuthority(secret).verify(result.output.strip(), now=int(time.time())) == "device-1"


def test_tokens() -> None:
    auth = TokenAuthority(b"s" * 32)
    token = auth.mint("dev-9", expires_at=100)
    assert auth.verify(token, now=99) == "dev-9"
    with pytest.raises(UnauthenticatedError, match="expired"):
        auth.verify(token, now=100)
    with pytest.raises(UnauthenticatedError, match="signature"):
        TokenAuthority(b"t" * 32).verify(token, now=0)
    for bad in ("", "v1.a.b", "v2" + token[2:], token + "x", token.replace(".100.", ".101.")):
        with pytest.raises(UnauthenticatedError):
            auth.verify(bad, now=0)
    with pytest.raises(ValueError):
        TokenAuthority(b"short")
    with pytest.raises(ValueError):
        auth.mint("has space", expires_at=10)


def test_rate_limiter_refills() -> None:
    t = [0.0]
    limiter = RateLimiter(2.0, 2, clock=lambda: t[0], max_subjects=2)
    assert limiter.acquire("a") == 0 and limiter.acquire("a") == 0
    assert limiter.acquire("a") == pytest.approx(0.5)
    t[0] = 0.5
    assert limiter.acquire("a") == 0
    limiter.acquire("b")
    limiter.acquire("c")  # evicts "a": memory stays bounded
    assert len(limiter._buckets) == 2


def test_config_file_env_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[collector]\nledger_url = "sqlite:////x.db"\nworkers = 8\nmtls = false\n')
    cfg = load_config(
        path,
        env={"FEDLDP_COLLECTOR_WORKERS": "12", "FEDLDP_COLLECTOR_RATE_LIMIT_PER_SECOND": "2.5"},
    )
    assert (cfg.ledger_url, cfg.workers, cfg.rate_limit_per_second) == ("sqlite:////x.db", 12, 2.5)
    with pytest.raises(ConfigError, match="ledger_url is required"):
        load_config(None, env={})
    path.write_text('[collector]\nledger_url = "x"\nwrokers = 8\n')
    with pytest.raises(ConfigError, match="unknown setting 'wrokers'"):
        load_config(path, env={})
    with pytest.raises(ConfigError, match="workers"):
        load_config(
            None, env={"FEDLDP_COLLECTOR_LEDGER_URL": "x", "FEDLDP_COLLECTOR_WORKERS": "many"}
        )
    with pytest.raises(ConfigError, match="mtls needs"):
        load_config(None, env={"FEDLDP_COLLECTOR_LEDGER_URL": "x", "FEDLDP_COLLECTOR_MTLS": "1"})


# --- TLS and mutual TLS ---


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
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


def _pem(obj: object) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    assert isinstance(obj, ec.EllipticCurvePrivateKey)
    return obj.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def test_mutual_tls_subject_comes_from_the_certificate(
    deployment: Deployment, tmp_path: Path, sqlite_url: str, now: int
) -> None:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    ca = _cert("test-ca", ca_key, ca_name, ca_key, ca=True)
    server_key, client_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    server = _cert("localhost", server_key, ca_name, ca_key, ca=False)
    client = _cert("device-42", client_key, ca_name, ca_key, ca=False)
    files = {"ca.pem": _pem(ca), "server.pem": _pem(server), "server.key": _pem(server_key)}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    config = deployment.config(
        sqlite_url,
        tls_cert=str(tmp_path / "server.pem"),
        tls_key=str(tmp_path / "server.key"),
        tls_client_ca=str(tmp_path / "ca.pem"),
        mtls=True,
        token_secret="",
    )
    running = start_collector(config, registry=deployment.registry())
    policy = deployment.verified(deployment.envelopes[0])
    request = pb.SubmitRequest(
        reports=[make_report(policy, CategoryOutput(2), coarse_time=coarse(now))]
    )
    target = f"localhost:{running.port}"
    try:
        creds = grpc.ssl_channel_credentials(
            root_certificates=_pem(ca), private_key=_pem(client_key), certificate_chain=_pem(client)
        )
        with grpc.secure_channel(target, creds) as channel:
            response = collector_pb2_grpc.CollectorStub(channel).Submit(request, timeout=10)
        assert response.outcomes[0].outcome == pb.OUTCOME_ACCEPTED
        window = policy.window_start(now)
        assert running.ledger.spent("device-42", "color", window) == Decimal("0.5")
        # TLS without a client certificate: the handshake is refused, nothing is stored.
        plain_tls = grpc.ssl_channel_credentials(_pem(ca))
        with grpc.secure_channel(target, plain_tls) as channel, pytest.raises(grpc.RpcError) as err:
            collector_pb2_grpc.CollectorStub(channel).Submit(request, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert running.ledger.report_count("color", 1) == 1
    finally:
        running.stop(1.0)


def test_example_config_in_deploy_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "deploy" / "collector.toml"
    cfg = load_config(example, env={})
    assert cfg.ledger_url.startswith("sqlite:////") and cfg.server == "asyncio"
