"""`fedldp release-service`: serve the trusted release service, and query it.

`serve` is the operator's command (catalog, release policy, ledger, receipt
key, token secret: all inside the trusted boundary). `query` and `datasets` are
the analyst's: they hold a bearer token and the service's address, nothing
else. Tokens are minted with `fedldp collector mint-token SUBJECT --audience
release-service --secret-file FILE` against the service's token secret (the
collector's token scheme, under the release service's own audience).
Heavy imports happen inside the commands.
"""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any

import click

from fedldp.cli_release_client import (
    KINDS,
    MECHANISMS,
    SERVICE_OPTIONS,
    bearer,
    build_request,
    channel,
    release_remote,
    rpc,
    token_from_env,
    with_options,
)


@click.group("release-service")
def release_service() -> None:
    """The trusted release service: analysts query registered datasets over gRPC."""


@release_service.command("serve")
@click.option(
    "--catalog",
    "catalog_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="dataset catalog (TOML)",
)
@click.option(
    "--policy",
    "policy_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="signed release policy with the caps (fedldp release-service sign-policy)",
)
@click.option(
    "--policy-key",
    "policy_keys",
    required=True,
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="public key trusted to sign the release policy (repeatable)",
)
@click.option("--ledger", "ledger_url", required=True, help="the service's ledger URL")
@click.option(
    "--signing-key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Ed25519 receipt key (fedldp keys generate)",
)
@click.option("--passphrase-env", metavar="VAR", help="passphrase of an encrypted --signing-key")
@click.option(
    "--data-key",
    "data_key_path",
    type=click.Path(exists=True, dir_okay=False),
    help="secret data-digest key (fedldp keys data-key): receipts bind the data by an HMAC "
    "under it; without it nothing about the data is recorded",
)
@click.option(
    "--token-secret-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="hex token secret (bearer tokens)",
)
@click.option(
    "--listen", default="127.0.0.1:50061", show_default=True, help="host:port to serve on"
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="server TLS certificate (PEM)",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="server TLS key (PEM)",
)
@click.option(
    "--tls-client-ca",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="CA of analysts' client certificates (mTLS)",
)
@click.option(
    "--mtls",
    is_flag=True,
    help="authenticate analysts by client certificate CN (needs --tls-cert, --tls-key, "
    "--tls-client-ca)",
)
@click.option(
    "--insecure",
    is_flag=True,
    help="UNSAFE: serve plaintext on a non-loopback --listen (bearer tokens in clear text)",
)
@click.option("--metrics-listen", help="host:port of the Prometheus endpoint")
@click.option(
    "--jobs-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="folder of the DP-SGD training jobs (enables training; the catalog needs [training])",
)
@click.option(
    "--training-queue",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="training jobs that may wait; more are refused (RESOURCE_EXHAUSTED)",
)
@click.option(
    "--training-workers",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="training jobs run at once",
)
def serve_cmd(**options: Any) -> None:
    """Register the catalog, apply the release policy's caps, serve until SIGTERM."""
    from fedldp.aggregator.service.addresses import check_plaintext, check_tls

    try:
        check_tls(
            options["tls_cert"],
            options["tls_key"],
            options["tls_client_ca"],
            mtls=options["mtls"],
        )
        check_plaintext(
            options["listen"], tls=options["tls_cert"] is not None, insecure=options["insecure"]
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    # The usage checks above import nothing heavy; the service's modules load after them.
    from fedldp.aggregator.central.datakey import load_data_key
    from fedldp.aggregator.central.signing import trusted_keys
    from fedldp.aggregator.service.catalog import CatalogError, load_catalog
    from fedldp.aggregator.service.jobs import JobsFolderBusyError
    from fedldp.aggregator.service.policy import load_release_policy
    from fedldp.aggregator.service.server import ServiceConfig, start_release_service
    from fedldp.authoring import KeyFileError, load_private_key
    from fedldp.cli_collector import secret_from_file
    from fedldp.cli_keys import passphrase_from_env
    from fedldp.client.policy import load_public_key
    from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, Authenticator, TokenAuthority
    from fedldp.collector.daemon import configure_logging

    configure_logging()
    # Handlers first: a SIGTERM arriving as soon as the port is announced still drains.
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        secret_file = options["token_secret_file"]
        secret = secret_from_file(str(secret_file), "--token-secret-file") if secret_file else None
        config = ServiceConfig(
            catalog=load_catalog(options["catalog_path"]),
            policy=load_release_policy(
                options["policy_path"],
                trusted_keys([load_public_key(p) for p in options["policy_keys"]]),
            ),
            ledger_url=options["ledger_url"],
            signing_key=load_private_key(
                options["signing_key"], passphrase=passphrase_from_env(options["passphrase_env"])
            ),
            authenticator=Authenticator(
                TokenAuthority(secret, audience=RELEASE_SERVICE_AUDIENCE) if secret else None,
                mtls=options["mtls"],
            ),
            data_key=(
                load_data_key(options["data_key_path"]) if options["data_key_path"] else None
            ),
            listen=options["listen"],
            tls_cert=options["tls_cert"],
            tls_key=options["tls_key"],
            tls_client_ca=options["tls_client_ca"],
            training=_training_setup(options),
            insecure=options["insecure"],
        )
        running = start_release_service(config)
    except (CatalogError, KeyFileError, ValueError, OSError, JobsFolderBusyError) as exc:
        raise click.ClickException(str(exc)) from None
    metrics_server = None
    if options["metrics_listen"]:
        from prometheus_client import start_http_server

        host, _, port = options["metrics_listen"].rpartition(":")
        metrics_server, _t = start_http_server(
            int(port), addr=host or "127.0.0.1", registry=running.metrics.registry
        )
    click.echo(f"release service on port {running.port}", err=True)
    stop.wait()
    running.stop()
    if metrics_server is not None:
        metrics_server.shutdown()


def _training_setup(options: dict[str, Any]) -> Any:
    """The training jobs' settings (None without --jobs-dir: training disabled)."""
    if options["jobs_dir"] is None:
        return None
    from fedldp.aggregator.service.training import TrainingSetup

    return TrainingSetup(
        jobs_dir=options["jobs_dir"],
        signing_key_path=Path(options["signing_key"]),
        passphrase_env=options["passphrase_env"],
        queue_size=options["training_queue"],
        workers=options["training_workers"],
    )


_client = [
    click.option("--service", required=True, help="host:port of the release service"),
    *SERVICE_OPTIONS,
]


@release_service.command("datasets")
@with_options(_client)
def datasets_cmd(service: str, token_env: str, tls_ca: Path | None, insecure: bool) -> None:
    """List the datasets and purposes open to you (JSON)."""
    from google.protobuf.json_format import MessageToDict

    from fedldp.v1 import release_pb2 as pb
    from fedldp.v1 import release_pb2_grpc

    with channel(service, tls_ca, insecure=insecure) as ch:
        metadata = bearer(token_from_env(token_env))
        stub = release_pb2_grpc.ReleaseServiceStub(ch)
        reply = rpc(lambda: stub.ListDatasets(pb.ListDatasetsRequest(), metadata=metadata))
    click.echo(json.dumps(MessageToDict(reply), indent=2))


@release_service.command("query")
@click.argument("kind", type=click.Choice(list(KINDS)))
@with_options(_client)
@click.option("--dataset", required=True, help="dataset id of the catalog")
@click.option("--purpose", required=True, help="a purpose granted to you")
@click.option("--epsilon", required=True, help="plain decimal, e.g. 0.5")
@click.option("--delta", default="0", show_default=True, help="delta (plain decimal)")
@click.option(
    "--mechanism",
    type=click.Choice(sorted(MECHANISMS)),
    default="laplace",
    show_default=True,
    help="ignored for choice and quantile",
)
@click.option("--column", help="the declared column (all kinds but count)")
@click.option("--quantile", help="q in (0, 1) of a quantile query, e.g. 0.5")
@click.option(
    "--key",
    "idempotency_key",
    required=True,
    help="idempotency key (a retry returns the same release)",
)
@click.option(
    "--receipt",
    "receipt_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="write the signed receipt here",
)
def query_cmd(kind: str, **o: Any) -> None:
    """Ask the service for one release; prints the noised value(s) with error bars (JSON)."""
    from fedldp.cli_common import decimal_option

    for option in ("epsilon", "delta", "quantile"):  # a usage error before anything is dialed
        decimal_option(o[option], f"--{option}")
    request = build_request(
        kind,
        dataset=o["dataset"],
        purpose=o["purpose"],
        epsilon=o["epsilon"],
        delta=o["delta"],
        mechanism=o["mechanism"],
        column=o["column"],
        quantile=o["quantile"],
        idempotency_key=o["idempotency_key"],
    )
    release_remote(
        request,
        o["service"],
        o["token_env"],
        o["tls_ca"],
        o["receipt_path"],
        insecure=o["insecure"],
    )


@release_service.command("sign-policy")
@click.argument("policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--key",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="the operator's release-policy private key (fedldp keys generate)",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="signed policy to write (JSON envelope); never overwritten",
)
@click.option("--passphrase-env", metavar="VAR", help="passphrase of an encrypted --key")
def sign_policy_cmd(policy_file: Path, key: str, out: Path, passphrase_env: str | None) -> None:
    """Validate a release policy (TOML) and write it signed, for `serve --policy`."""
    from fedldp.aggregator.central.signing import canonical_json
    from fedldp.aggregator.service.policy import ReleasePolicyError, sign_release_policy
    from fedldp.authoring import load_private_key
    from fedldp.cli_keys import passphrase_from_env
    from fedldp.client.policy import KeyFileError, key_id_of

    if out.exists():
        raise click.ClickException(f"{out} exists; a signed policy is never overwritten")
    if not out.parent.is_dir():
        raise click.BadParameter(f"folder {out.parent} does not exist", param_hint="--out")
    try:
        private = load_private_key(key, passphrase=passphrase_from_env(passphrase_env))
        envelope = sign_release_policy(policy_file, private)
    except (ReleasePolicyError, KeyFileError) as exc:
        raise click.ClickException(str(exc)) from None
    with out.open("xb") as fh:
        fh.write(canonical_json(envelope) + b"\n")
    click.echo(f"wrote {out}, signed by key id {key_id_of(private.public_key())}")


@release_service.command("consolidate")
@click.option("--ledger", "ledger_url", help="the collector's ledger URL (read-only)")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="the collector's collector.toml: its ledger_url, or every shard of its ledger_shards",
)
@click.option(
    "--policies",
    "policy_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="the collector's policy folder",
)
@click.option(
    "--trust",
    "trust_dir",
    required=True,
    type=click.Path(exists=True, file_okay=False),
    help="the collector's trust folder",
)
@click.option("--policy", "policy_id", required=True, help="policy id")
@click.option(
    "--version", type=click.IntRange(min=1), help="policy version (default: the highest valid)"
)
@click.option("--audience", default="default", show_default=True, help="policy audience")
@click.option("--out", "out_url", required=True, help="SQL URL of the consolidated database")
@click.option("--table", default="ldp_estimates", show_default=True, help="table name")
@click.option(
    "--at",
    type=click.IntRange(min=0),
    help="verify the policy as of this Unix time (default: now)",
)
def consolidate_cmd(**o: Any) -> None:
    """Write per-window debiased LDP estimates and variances as a table (no budget spent).

    The ledger is read as `fedldp report` reads it: read-only, and whole (every
    shard of a config's ledger_shards; one shard's URL alone is refused)."""
    import time

    from fedldp.aggregator.service.consolidate import estimate_rows, write_table
    from fedldp.cli_report import _lists_shards, _open_sources, _settings, load_verified_policy

    ledger_url, config_path = o["ledger_url"], o["config_path"]
    urls = _settings(config_path, (ledger_url,) if ledger_url else (), None, None, None)[0]
    if not urls:
        raise click.UsageError("pass --ledger URL or --config FILE")
    policy = load_verified_policy(
        o["policy_dir"],
        o["trust_dir"],
        o["policy_id"],
        version=o["version"],
        at=o["at"] or int(time.time()),
        audience=o["audience"],
    )
    (ledger,) = _open_sources(urls, sharded=not ledger_url and _lists_shards(config_path))
    try:
        rows = estimate_rows(ledger, policy)
    finally:
        ledger.close()
    written = write_table(o["out_url"], o["table"], rows)
    windows = len({r.window_start for r in rows})
    click.echo(
        f"{written} rows ({windows} windows) of {policy.policy_id} v{policy.version} "
        f"in table {o['table']}; post-processing of LDP reports: no budget spent"
    )
