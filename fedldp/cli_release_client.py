"""The analyst's client of the release service, shared by `fedldp release KIND` and
`fedldp release-service query`.

Three ways to run `fedldp release count|sum|mean|histogram|quantile|choice`:

* ``--service HOST:PORT``: ask a running release service (the analyst holds a
  bearer token in ``--token-env``, default FEDLDP_TOKEN, and optionally the
  service's CA in ``--tls-ca``; nothing else). Bounds, domains, contribution
  bounds and caps come from the operator's catalog and policy: options that
  would set them locally are refused.
* ``--embedded``: the same service started in this process on 127.0.0.1 (a
  random port and a one-off token secret), from the operator files that
  `release-service serve` takes (``--catalog``, a signed ``--policy`` with its
  ``--policy-key``, ``--ledger``, ``--signing-key``), one request, then
  stopped. The analyst is ``--analyst`` (default: the login name) and must be
  granted the purpose in the catalog. It keeps the one-machine workflow on the
  service's code path (authorization, caps, receipts) and offers NO
  protection against its own user, who holds every one of those files.
* neither: the local commands of issue 15 (``--ledger``, ``--subject``,
  ``--data``), equally without protection against their user.

Heavy imports (grpc, the service) happen inside the functions.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

KINDS = ("count", "sum", "mean", "histogram", "quantile", "choice")
MECHANISMS = {"laplace": "NOISE_MECHANISM_LAPLACE", "gaussian": "NOISE_MECHANISM_GAUSSIAN"}
#: Kinds whose mechanism is fixed (exponential mechanism or Laplace histogram).
_NO_MECHANISM = ("choice", "quantile")


def build_request(
    kind: str,
    *,
    dataset: str,
    purpose: str,
    epsilon: str,
    delta: str,
    mechanism: str,
    column: str | None,
    quantile: str | None,
    idempotency_key: str,
) -> Any:
    """The ReleaseRequest of one query (UsageError when a needed option is missing)."""
    from fedldp.v1 import release_pb2 as pb

    if kind != "count" and not column:
        raise click.UsageError(f"{kind} needs --column")
    name, q = column or "", quantile or ""
    if (kind == "quantile") != (quantile is not None):
        raise click.UsageError(
            "quantile needs --quantile Q" if kind == "quantile" else "--quantile is for quantile"
        )
    queries: dict[str, Callable[[], Any]] = {
        "count": pb.CountQuery,
        "sum": lambda: pb.SumQuery(column=name),
        "mean": lambda: pb.MeanQuery(column=name),
        "histogram": lambda: pb.HistogramQuery(column=name),
        "choice": lambda: pb.ChoiceQuery(column=name),
        "quantile": lambda: pb.QuantileQuery(column=name, quantile=q),
    }
    return pb.ReleaseRequest(
        dataset=dataset,
        purpose=purpose,
        epsilon=epsilon,
        delta=delta,
        mechanism=pb.NoiseMechanism.Value(
            "NOISE_MECHANISM_UNSPECIFIED" if kind in _NO_MECHANISM else MECHANISMS[mechanism]
        ),
        idempotency_key=idempotency_key,
        **{kind: queries[kind]()},
    )


def channel(service: str, tls_ca: Path | None, *, insecure: bool = False) -> Any:
    """A gRPC channel to `service` (TLS when the service's CA is given).

    Plaintext (no `tls_ca`) only to a loopback address, or anywhere with
    `insecure` (--insecure): the bearer token travels in every call's metadata.
    UsageError otherwise, before anything is sent.
    """
    import grpc

    from fedldp.aggregator.service.addresses import check_plaintext

    if tls_ca is None:
        try:
            check_plaintext(service, tls=False, insecure=insecure, remedy="give --tls-ca")
        except ValueError as exc:
            raise click.UsageError(f"--service {exc}") from None
        return grpc.insecure_channel(service)
    return grpc.secure_channel(service, grpc.ssl_channel_credentials(tls_ca.read_bytes()))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    """gRPC metadata carrying a bearer token."""
    return (("authorization", f"Bearer {token}"),)


def token_from_env(token_env: str) -> str:
    """The bearer token held in the environment variable `token_env` (refused when unset)."""
    import os

    token = os.environ.get(token_env, "")
    if not token:
        raise click.ClickException(f"set {token_env} to your bearer token")
    return token


def rpc(call: Callable[[], Any]) -> Any:
    """Run one RPC; a refusal becomes a one-line `Error: CODE: reason` (exit 1)."""
    import grpc

    try:
        return call()
    except grpc.RpcError as exc:
        err: Any = exc
        raise click.ClickException(f"{err.code().name}: {err.details()}") from None


def check_receipt_path(path: Path | None) -> None:
    """Refuse an existing receipt file before anything is asked (receipts are never overwritten)."""
    if path is not None and path.exists():
        raise click.ClickException(f"{path} exists; a receipt is never overwritten")


def emit(reply: Any, receipt_path: Path | None) -> None:
    """Write the signed receipt when asked and print the reply (without it) as JSON."""
    from google.protobuf.json_format import MessageToDict

    if receipt_path is not None:
        with receipt_path.open("xb") as fh:
            fh.write(reply.receipt)
        click.echo(f"receipt: {receipt_path}", err=True)
    shown = MessageToDict(reply)
    shown.pop("receipt", None)
    click.echo(json.dumps(shown, indent=2))


def release_remote(
    request: Any,
    service: str,
    token_env: str,
    tls_ca: Path | None,
    receipt: Path | None,
    *,
    insecure: bool = False,
) -> None:
    """Send `request` to the service at `service` and print its reply."""
    from fedldp.v1 import release_pb2_grpc

    check_receipt_path(receipt)
    with channel(service, tls_ca, insecure=insecure) as ch:
        metadata = bearer(token_from_env(token_env))
        stub = release_pb2_grpc.ReleaseServiceStub(ch)
        reply = rpc(lambda: stub.Release(request, metadata=metadata))
    emit(reply, receipt)


def release_embedded(request: Any, files: dict[str, Any], receipt: Path | None) -> None:
    """Start the service in-process from the operator `files`, send `request`, stop it.

    `files`: catalog, policy, policy_keys, ledger_url, signing_key, passphrase_env, analyst.
    """
    import getpass
    import secrets
    import time

    from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, TokenAuthority
    from fedldp.v1 import release_pb2_grpc

    check_receipt_path(receipt)
    analyst = files.get("analyst")
    if not analyst:
        try:
            analyst = getpass.getuser()
        except (OSError, KeyError):
            raise click.UsageError("--embedded needs --analyst (no login name found)") from None
    secret = secrets.token_bytes(32)
    running = start_embedded(files, secret)
    try:
        authority = TokenAuthority(secret, audience=RELEASE_SERVICE_AUDIENCE)
        token = authority.mint(analyst, expires_at=int(time.time()) + 600)
        with channel(f"127.0.0.1:{running.port}", None) as ch:
            stub = release_pb2_grpc.ReleaseServiceStub(ch)
            reply = rpc(lambda: stub.Release(request, metadata=bearer(token)))
    finally:
        running.stop(0)
    emit(reply, receipt)


def start_embedded(files: dict[str, Any], secret: bytes) -> Any:
    """The release service on 127.0.0.1:0 from operator files (ClickException on bad ones)."""
    from fedldp.aggregator.central.signing import trusted_keys
    from fedldp.aggregator.service.catalog import CatalogError, load_catalog
    from fedldp.aggregator.service.policy import load_release_policy
    from fedldp.aggregator.service.server import ServiceConfig, start_release_service
    from fedldp.authoring import load_private_key
    from fedldp.cli_keys import passphrase_from_env
    from fedldp.client.policy import KeyFileError, load_public_key
    from fedldp.collector.auth import RELEASE_SERVICE_AUDIENCE, Authenticator, TokenAuthority

    try:
        trusted = trusted_keys([load_public_key(p) for p in files["policy_keys"]])
        config = ServiceConfig(
            catalog=load_catalog(Path(files["catalog"])),
            policy=load_release_policy(Path(files["policy"]), trusted),
            ledger_url=files["ledger_url"],
            signing_key=load_private_key(
                files["signing_key"], passphrase=passphrase_from_env(files["passphrase_env"])
            ),
            authenticator=Authenticator(TokenAuthority(secret, audience=RELEASE_SERVICE_AUDIENCE)),
            listen="127.0.0.1:0",
            max_workers=2,
        )
        return start_release_service(config)
    except (CatalogError, KeyFileError, ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def with_options(options: list[Any]) -> Callable[[F], F]:
    """Apply click options in list order."""

    def wrap(fn: F) -> F:
        out: Any = fn
        for option in reversed(options):
            out = option(out)
        return out  # type: ignore[no-any-return]

    return wrap


#: --service and its credentials (also `release-service query` and `datasets`).
SERVICE_OPTIONS = [
    click.option(
        "--token-env",
        default="FEDLDP_TOKEN",
        show_default=True,
        help="variable holding your bearer token (with --service)",
    ),
    click.option(
        "--tls-ca",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="CA of the service's TLS certificate (with --service)",
    ),
    click.option(
        "--insecure",
        is_flag=True,
        help="UNSAFE: plaintext to a non-loopback --service without --tls-ca (your bearer "
        "token crosses the network in clear text)",
    ),
]

#: `fedldp release KIND` options of the service and embedded modes.
MODE_OPTIONS = [
    click.option(
        "--service", help="host:port of a release service: ask it instead of running locally"
    ),
    *SERVICE_OPTIONS,
    click.option(
        "--embedded",
        is_flag=True,
        help="start the release service in this process from --catalog/--policy/--ledger "
        "(single user: no protection against yourself)",
    ),
    click.option("--dataset", help="dataset id of the catalog (--service / --embedded)"),
    click.option(
        "--catalog",
        "catalog_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="dataset catalog (--embedded)",
    ),
    click.option(
        "--policy",
        "policy_path",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="signed release policy (--embedded)",
    ),
    click.option(
        "--policy-key",
        "policy_keys",
        multiple=True,
        type=click.Path(exists=True, dir_okay=False),
        help="trusted release-policy public key (--embedded; repeatable)",
    ),
    click.option("--analyst", help="who asks (--embedded; default: your login name)"),
]

#: Options that only the local commands use (the service takes them from its files).
LOCAL_ONLY = (
    "subject",
    "data_path",
    "data_key_path",
    "config_path",
    "lower_text",
    "upper_text",
    "granularity_text",
    "calibration",
    "candidates",
    "domain",
)
#: Options that only --embedded uses.
EMBEDDED_ONLY = ("catalog_path", "policy_path", "policy_keys", "analyst")
#: Options that only --service uses (beyond their defaults).
SERVICE_ONLY = ("token_env", "tls_ca", "insecure")


_FLAGS = {"ledger_url": "--ledger", "policy_keys": "--policy-key", "idempotency_key": "--key"}


def _given(name: str, value: Any) -> bool:
    """Whether option `name` was given (command line or environment), not defaulted."""
    from click.core import ParameterSource

    source = click.get_current_context().get_parameter_source(name)
    return source not in (None, ParameterSource.DEFAULT) and value not in (None, ())


def flag(name: str) -> str:
    """The command-line spelling of the option whose parameter is `name`."""
    return _FLAGS.get(name) or "--" + name.removesuffix("_text").removesuffix("_path").replace(
        "_", "-"
    )


def _refuse(options: dict[str, Any], names: tuple[str, ...], mode: str) -> None:
    for name in names:
        if name in options and _given(name, options[name]):
            raise click.UsageError(f"{flag(name)} is not used with {mode}")


def run_sql(sql: str, options: dict[str, Any]) -> None:
    """`fedldp release sql`: send the SQL to --service, or to an --embedded service."""
    from fedldp.v1 import release_pb2 as pb

    if not options.get("service") and not options.get("embedded"):
        raise click.UsageError(
            "release sql runs on a release service: give --service ADDR or --embedded"
        )
    request = pb.ReleaseRequest(
        dataset=options.get("dataset") or "",
        purpose=options["purpose"],
        epsilon=options["epsilon_text"],
        delta=options["delta_text"],
        idempotency_key=options["idempotency_key"],
        sql=pb.SqlQuery(sql=sql),
    )
    options["dataset"] = options.get("dataset") or "(from the SQL)"
    run_mode("sql", options, request=request)


def run_mode(kind: str, options: dict[str, Any], *, request: Any = None) -> bool:
    """Run the query through --service or --embedded when asked; False for the local mode.

    Pops the mode options from `options` in every case.
    """
    mode = {name: options.pop(name) for name in ("service", "embedded", "dataset")}
    extra = {name: options.pop(name) for name in (*EMBEDDED_ONLY, *SERVICE_ONLY)}
    if not mode["service"] and not mode["embedded"]:
        if mode["dataset"] is not None:
            raise click.UsageError("--dataset needs --service ADDR or --embedded")
        _refuse(extra, (*EMBEDDED_ONLY, *SERVICE_ONLY), "the local commands")
        return False
    if mode["service"] and mode["embedded"]:
        raise click.UsageError("--service and --embedded exclude each other")
    name = "--service" if mode["service"] else "--embedded"
    _refuse(options, LOCAL_ONLY, name + " (the service's catalog sets it)")
    _refuse(extra, EMBEDDED_ONLY if mode["service"] else SERVICE_ONLY, name)
    if mode["service"]:
        _refuse(options, ("ledger_url", "signing_key", "passphrase_env"), name)
    if mode["dataset"] is None:
        raise click.UsageError(f"{name} needs --dataset")
    request = request or build_request(
        kind,
        dataset=mode["dataset"],
        purpose=options["purpose"],
        epsilon=options["epsilon_text"],
        delta=options.get("delta_text") or "0",
        mechanism=options.get("mechanism") or "laplace",
        column=options.get("column"),
        quantile=options.get("quantile_text"),
        idempotency_key=options["idempotency_key"],
    )
    receipt = Path(options["receipt_path"]) if options.get("receipt_path") else None
    if mode["service"]:
        release_remote(
            request,
            mode["service"],
            extra["token_env"],
            extra["tls_ca"],
            receipt,
            insecure=extra["insecure"],
        )
        return True
    files = {
        "catalog": extra["catalog_path"],
        "policy": extra["policy_path"],
        "policy_keys": extra["policy_keys"],
        "ledger_url": options.get("ledger_url"),
        "signing_key": options.get("signing_key"),
        "passphrase_env": options.get("passphrase_env"),
        "analyst": extra["analyst"],
    }
    for key, flag in (
        ("catalog", "--catalog"),
        ("policy", "--policy"),
        ("policy_keys", "--policy-key"),
        ("ledger_url", "--ledger"),
        ("signing_key", "--signing-key"),
    ):
        if not files[key]:
            raise click.UsageError(f"--embedded needs {flag}")
    release_embedded(request, files, receipt)
    return True
