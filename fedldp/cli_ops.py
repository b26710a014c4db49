"""Operator commands for deployments: `fedldp collector health`, `fedldp ledger migrate`.

`health` is the container and Kubernetes health check: it asks a collector's
standard gRPC health service (grpc.health.v1.Health/Check, the protocol that
`grpc_health_probe` and Kubernetes' native `grpc:` probes speak) and exits 0 only
when the answer is SERVING, 1 on anything else (NOT_SERVING, an unknown service,
a refused connection, a failed TLS handshake, a deadline), with one line saying
why. TLS-aware: `--tls` with `--ca` (and `--cert`/`--key` when the collector
requires client certificates), which a native `grpc:` probe cannot do.

Heavy imports (grpc) happen inside the command so `fedldp --help` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

#: The collector's own service name in its health service ("" is the whole server).
COLLECTOR_SERVICE = "fedldp.v1.Collector"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS health check: the CA that signed the server's certificate,
    and optionally this client's certificate and key (mutual TLS)."""

    ca: Path | None
    cert: Path | None
    key: Path | None
    server_name: str | None


class HealthCheckError(Exception):
    """The health check got no answer (the message is one line, safe to print)."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def check_health(addr: str, *, service: str, timeout: float, tls: TlsFiles | None) -> str:
    """Ask `addr`'s gRPC health service about `service`; return the status name
    (SERVING, NOT_SERVING, ...). Raises HealthCheckError when no status came back."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    options: list[tuple[str, str | int]] = []
    if tls is None:
        channel = grpc.insecure_channel(addr, options=options)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls.ca.read_bytes() if tls.ca else None,
            private_key=tls.key.read_bytes() if tls.key else None,
            certificate_chain=tls.cert.read_bytes() if tls.cert else None,
        )
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        channel = grpc.secure_channel(addr, creds, options=options)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            name = code.name if code is not None else "ERROR"
            raise HealthCheckError(f"{addr}: {name}: {_one_line(details or '')}") from None
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def _tls_files(
    tls: bool, ca: str | None, cert: str | None, key: str | None, server_name: str | None
) -> TlsFiles | None:
    if not tls:
        if ca or cert or key or server_name:
            raise click.UsageError("--ca, --cert, --key and --server-name need --tls")
        return None
    if bool(cert) != bool(key):
        raise click.UsageError("--cert and --key go together (mutual TLS)")
    return TlsFiles(
        Path(ca) if ca else None,
        Path(cert) if cert else None,
        Path(key) if key else None,
        server_name,
    )


_pem = click.Path(exists=True, dir_okay=False)


@click.command("health")
@click.option(
    "--addr",
    required=True,
    envvar="FEDLDP_HEALTH_ADDR",
    help="HOST:PORT of the collector's gRPC endpoint",
)
@click.option(
    "--tls",
    is_flag=True,
    envvar="FEDLDP_HEALTH_TLS",
    help="connect with TLS (needed when the collector has tls_cert)",
)
@click.option(
    "--ca",
    type=_pem,
    envvar="FEDLDP_HEALTH_CA",
    help="CA certificate (PEM) that signed the server's certificate",
)
@click.option(
    "--cert",
    type=_pem,
    envvar="FEDLDP_HEALTH_CERT",
    help="client certificate (PEM), when the collector has mtls",
)
@click.option(
    "--key", type=_pem, envvar="FEDLDP_HEALTH_KEY", help="client private key (PEM), with --cert"
)
@click.option(
    "--server-name",
    envvar="FEDLDP_HEALTH_SERVER_NAME",
    help="name to verify in the server's certificate (default: HOST of --addr)",
)
@click.option(
    "--service",
    default=COLLECTOR_SERVICE,
    show_default=True,
    help="service to ask about ('' for the whole server)",
)
@click.option("--timeout", default=5.0, show_default=True, help="seconds to wait for the answer")
def health_cmd(
    addr: str,
    tls: bool,
    ca: str | None,
    cert: str | None,
    key: str | None,
    server_name: str | None,
    service: str,
    timeout: float,
) -> None:
    """Exit 0 if the collector at --addr answers SERVING on the standard gRPC health
    service, 1 otherwise (for container HEALTHCHECKs and Kubernetes exec probes).

    Each option except --service and --timeout can also come from
    FEDLDP_HEALTH_<OPTION> (ADDR, TLS, CA, CERT, KEY, SERVER_NAME), so one image
    HEALTHCHECK serves plaintext and TLS deployments."""
    if timeout <= 0:
        raise click.UsageError("--timeout must be positive")
    files = _tls_files(tls, ca, cert, key, server_name)
    try:
        status = check_health(addr, service=service, timeout=timeout, tls=files)
    except HealthCheckError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:  # a PEM file vanished or is unreadable between parse and read
        raise click.ClickException(_one_line(str(exc))) from None
    if status != "SERVING":
        raise click.ClickException(f"{addr}: {service or '(server)'} is {status}")
    click.echo("SERVING")


def _ledger_url(url: str | None, config_path: str | None) -> str:
    """--url, else the config's ledger_url (FEDLDP_COLLECTOR_* variables apply)."""
    if url:
        return url
    from fedldp.collector.config import ConfigError, load_config

    try:
        return load_config(config_path).ledger_url
    except ConfigError as exc:
        raise click.ClickException(f"pass --url or a config with ledger_url ({exc})") from None


_url_option = click.option(
    "--url",
    envvar="FEDLDP_COLLECTOR_LEDGER_URL",
    help="ledger URL (default: from --config / FEDLDP_COLLECTOR_LEDGER_URL)",
)
_config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml to read ledger_url from",
)


@click.command("migrate")
@_url_option
@_config_option
def migrate_cmd(url: str | None, config_path: str | None) -> None:
    """Bring the ledger's schema to the newest migration (a no-op when it is there).

    Run it once before collectors of a new version serve (the compose file's and the
    Kubernetes manifests' migration job). Collectors also migrate on start; several
    at once are serialized (an advisory lock on PostgreSQL, BEGIN IMMEDIATE on SQLite).
    """
    import sqlalchemy as sa

    from fedldp.collector.ledger.migrate import current_revision, head_revision, upgrade

    engine = sa.create_engine(_ledger_url(url, config_path))
    try:
        with engine.connect() as connection:
            before = current_revision(connection)
        upgrade(engine)
        with engine.connect() as connection:
            after = current_revision(connection)
    except sa.exc.SQLAlchemyError as exc:
        cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        detail = _one_line(str(cause))
        raise click.ClickException(f"cannot migrate the ledger: {detail}") from None
    finally:
        engine.dispose()
    if after != head_revision():
        raise click.ClickException(f"ledger at {after}, expected head {head_revision()}")
    click.echo(f"ledger schema at {after} (head); was {before or 'empty'}")
