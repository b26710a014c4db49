"""`fedldp collector` (serve, mint-token) and `fedldp ledger` (reconcile, show, set-cap).

Heavy imports (SQLAlchemy, grpc server code) happen inside the commands so
`fedldp --help` stays fast.
"""

from __future__ import annotations

import json
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fedldp.cli_common import (
    config_option,
    decimal_option,
    iso_utc,
    ledger_option,
    open_cli_ledger,
    resolve_ledger_url,
)
from fedldp.cli_shards import open_cli_shards, reconcile_shards, shard_urls, shards

if TYPE_CHECKING:
    from fedldp.collector.ledger.charge_audit import ChargeGroup


def _collector_epilog() -> str:
    from fedldp.collector.config import describe

    return (
        "\b\nSettings (TOML [collector] table, or environment variables; the environment "
        "wins):\n" + describe()
    )


@click.group("collector")
def collector() -> None:
    """Run the collector daemon and manage device credentials."""


class _LazyEpilogCommand(click.Command):
    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self.epilog = _collector_epilog()
        super().format_epilog(ctx, formatter)


@collector.command("serve", cls=_LazyEpilogCommand)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml (settings may also come from FEDLDP_COLLECTOR_* variables)",
)
@click.option(
    "--port-file",
    type=click.Path(dir_okay=False),
    help="write the bound port here once serving (useful with listen port 0)",
)
def serve_cmd(config_path: str | None, port_file: str | None) -> None:
    """Serve the Collector gRPC API until SIGTERM, then drain and exit."""
    from fedldp.collector.config import ConfigError, load_config

    _require_modules("sqlalchemy", "alembic", "prometheus_client")  # the collector extra
    if port_file is not None and not Path(port_file).parent.is_dir():
        raise click.BadParameter(
            f"folder {Path(port_file).parent} does not exist: create it first, or name a "
            "file in an existing folder",
            param_hint="--port-file",
        )
    try:
        config = load_config(config_path)
        config.validate()
        config.token_secret_bytes()  # read now: a bad secret file costs no server start-up
    except ConfigError as exc:
        where = f"{config_path}: " if config_path and config_path not in str(exc) else ""
        raise click.ClickException(f"config: {where}{exc}") from None
    # The server stack (grpc, SQLAlchemy, the ledger) only after the config is known to be
    # good: a config error is refused in a fraction of the start-up's CPU.
    from fedldp.collector.daemon import serve

    try:
        status = serve(config, port_file=port_file, config_path=config_path)
    except RuntimeError as exc:  # grpc's bind failure is a bare RuntimeError
        if not str(exc).startswith("Failed to bind"):
            raise
        raise click.ClickException(
            f"cannot listen on {config.listen!r} (set by `listen` in {config_path or 'the config'}"
            " or FEDLDP_COLLECTOR_LISTEN): use HOST:PORT with an address of this machine "
            "and a free port"
        ) from None
    sys.exit(status)


def _require_modules(*names: str) -> None:
    """Raise ModuleNotFoundError (named: fedldp.cli_errors turns it into the extra to
    install) for the first of `names` that cannot be imported, without importing any."""
    import importlib.util

    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None  # None also when blocked
        except ValueError:  # imported, without a spec
            found = True
        if not found:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


@collector.command("mint-token")
@click.argument("subject")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml holding token_secret / token_secret_file",
)
@click.option(
    "--secret-file",
    type=click.Path(exists=True, dir_okay=False),
    help="file with the hex token secret (overrides --config)",
)
@click.option(
    "--ttl",
    default=30 * 86400,
    show_default=True,
    type=click.IntRange(min=1),
    help="lifetime in seconds (at least 1)",
)
@click.option(
    "--audience",
    type=click.Choice(["collector", "release-service"]),
    default="collector",
    show_default=True,
    help="who accepts the token: the collector (devices) or the release service (analysts)",
)
def mint_token_cmd(
    subject: str, config_path: str | None, secret_file: str | None, ttl: int, audience: str
) -> None:
    """Print a bearer token for SUBJECT, signed with the collector's token secret."""
    from fedldp.collector.auth import TokenAuthority
    from fedldp.collector.config import ConfigError, load_config

    try:
        if secret_file:
            secret = secret_from_file(secret_file)
        else:
            cfg = load_config(config_path, overrides={"ledger_url": "unused"})
            maybe = cfg.token_secret_bytes()
            if maybe is None:
                raise click.ClickException(
                    "no token secret: pass --secret-file or set token_secret_file"
                )
            secret = maybe
        authority = TokenAuthority(secret, audience=audience)
        token = authority.mint(subject, expires_at=int(time.time()) + ttl)
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(token)


def secret_from_file(path: str, option: str = "--secret-file") -> bytes:
    """The hex token secret in `path` (ConfigError naming `option`, the file and the fix
    otherwise: `mint-token --secret-file`, `release-service serve --token-secret-file`)."""
    from fedldp.collector.config import ConfigError

    try:
        return bytes.fromhex(Path(path).read_text(encoding="ascii").strip())
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(
            f"{option} {path} must hold hex digits (make one with `fedldp collector gen-secret`)"
        ) from None


@collector.command("gen-secret")
def gen_secret_cmd() -> None:
    """Print a fresh random hex token secret (32 bytes)."""
    import secrets

    click.echo(secrets.token_hex(32))


_ledger_option = ledger_option(envvar="FEDLDP_COLLECTOR_LEDGER_URL")
_config_option = config_option("collector.toml to read ledger_url from")


@click.group("ledger")
def ledger() -> None:
    """Create, migrate, inspect and audit the privacy ledger.

    Only `init` and `migrate` (and the collector) create or change the schema;
    `show` and `reconcile` open an existing ledger read-only.
    """


ledger.add_command(shards)


@ledger.command("init")
@_ledger_option
@_config_option
def init_cmd(ledger_url: str | None, config_path: str | None) -> None:
    """Create a new ledger (file mode 0600 on SQLite) with the current schema."""
    from fedldp.collector.ledger import migrate

    url = resolve_ledger_url(ledger_url, config_path)
    with open_cli_ledger(url, "create", scope="any") as led:
        shown = _shown(led.url)
    click.echo(f"ledger {shown} ready at migration {migrate.head_revision()}")


def _shown(url: str) -> str:
    import sqlalchemy as sa

    return sa.make_url(url).render_as_string(hide_password=True)


@ledger.command("reconcile")
@_ledger_option
@_config_option
@click.option(
    "--policies",
    "policy_dir",
    type=click.Path(exists=True, file_okay=False),
    help="Folder of signed *.policy envelopes (default: the policy_dir of --config): "
    "list every subject window charged below the sound rule (RETIRED-RULE lines).",
)
def reconcile_cmd(ledger_url: str | None, config_path: str | None, policy_dir: str | None) -> None:
    """Recompute every spend from the raw rows; exit 1 on any mismatch (read-only).

    With the policies (--policies, or --config's policy_dir) it also reports each
    subject window whose reports were charged under the retired r* rule of a
    memoized mechanism below the sound rule's figure (docs/mechanisms.md): a
    report of what the ledger under-states, never a rewrite and not a mismatch.
    """
    if not ledger_url and (urls := shard_urls(config_path)):
        reconcile_shards(urls)  # every shard, then the placement checks (cli_shards.py)
        return
    url = resolve_ledger_url(ledger_url, config_path)
    folder = policy_dir or _config_policy_dir(config_path)
    with open_cli_ledger(url, "read", scope="whole") as led:
        mismatches = led.reconcile()
        groups = led.charge_groups() if folder else []
    for m in mismatches:
        click.echo(f"MISMATCH {m}")
    if folder:
        _report_retired_rule(groups, folder)
    if mismatches:
        click.echo(f"{len(mismatches)} mismatch(es)", err=True)
        sys.exit(1)
    click.echo("ledger consistent: every running total matches the raw rows")


def _config_policy_dir(config_path: str | None) -> str | None:
    """The policy_dir of --config, if it names one."""
    if config_path is None:
        return None
    from fedldp.collector.config import load_config

    return load_config(config_path).policy_dir or None


def _report_retired_rule(groups: list[ChargeGroup], folder: str) -> None:
    """Print a RETIRED-RULE line per subject window charged below the sound rule."""
    from fedldp.client.policy import PolicyError, read_envelope
    from fedldp.collector.ledger.charge_audit import sound_charges, undercharged, unjudged

    payloads = []
    paths = [*Path(folder).glob("*.policy"), *Path(folder).glob("*.policy.retired")]
    for path in sorted(paths):
        try:
            payloads.append(read_envelope(path).payload)
        except (OSError, PolicyError) as exc:
            raise click.ClickException(f"--policies: cannot read {path}: {exc}") from None
    charges = sound_charges(payloads)
    findings = undercharged(groups, charges)
    for finding in findings:
        click.echo(f"RETIRED-RULE {finding}")
    for (policy_id, version), count in unjudged(groups, charges).items():
        click.echo(
            f"UNJUDGED policy={policy_id} version={version}: {count} report(s) charged under "
            f"a policy not in {folder} (add its envelope, or its .policy.retired file, to "
            "judge them against the sound rule)"
        )
    if findings:
        click.echo(
            f"{len(findings)} subject window(s) were charged under the retired r* rule "
            "below the sound figure; their reports stay as charged (docs/mechanisms.md, "
            "'Migration')",
            err=True,
        )


@ledger.command("show")
@click.argument("subject")
@_ledger_option
@_config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON (times in epoch seconds).")
def show_cmd(subject: str, ledger_url: str | None, config_path: str | None, as_json: bool) -> None:
    """What SUBJECT spent and has left, per policy window and central purpose (read-only).

    Window starts are shown in ISO 8601 UTC; --json gives epoch seconds.
    """
    from fedldp.collector.ledger import EXACT

    if not ledger_url and (urls := shard_urls(config_path)):
        with open_cli_shards(urls) as sharded:  # the subject's shard; central: shard 0
            rows = sharded.for_subject(subject).subject_spend(subject)
            central = _central(sharded.shards[0], subject)
    else:
        url = resolve_ledger_url(ledger_url, config_path)
        with open_cli_ledger(url, "read", scope="whole") as led:
            rows = led.subject_spend(subject)
            central = _central(led, subject)
    if as_json:
        click.echo(json.dumps(_show_json(subject, rows, central), indent=2))
        return
    if not rows and not central:
        click.echo(f"{subject}: nothing charged")
        return
    click.echo(
        f"{'policy':<28} {'window start (UTC)':<20} {'reports':>8} {'spent':>10} "
        f"{'cap':>8} {'left':>10}"
    )
    for r in rows:
        left = max(EXACT.subtract(r.epsilon_cap, r.epsilon_spent), Decimal(0))
        click.echo(
            f"{r.policy_id:<28} {iso_utc(r.window_start):<20} {r.report_count:>8} "
            f"{r.epsilon_spent!s:>10} {r.epsilon_cap!s:>8} {left!s:>10}"
        )
    for purpose, ((eps, delta), cap) in central.items():
        cap_text = "no cap" if cap is None else f"cap eps={cap[0]} delta={cap[1]}"
        click.echo(f"central {purpose}: eps={eps} delta={delta} committed; {cap_text}")


def _central(led: Any, subject: str) -> dict[str, Any]:
    """Per purpose of `subject`'s central reservations: (committed spend, cap)."""
    purposes = sorted({r.purpose for r in led.reservations(subject)})
    return {p: (led.central_spend(subject, p), led.central_cap(subject, p)) for p in purposes}


def _show_json(subject: str, rows: Any, central: Any) -> dict[str, Any]:
    return {
        "subject": subject,
        "windows": [
            {
                "policy_id": r.policy_id,
                "window_start_epoch": r.window_start,
                "reports": r.report_count,
                "epsilon_spent": str(r.epsilon_spent),
                "epsilon_cap": str(r.epsilon_cap),
            }
            for r in rows
        ],
        "central": [
            {
                "purpose": purpose,
                "epsilon": str(eps),
                "delta": str(delta),
                "cap": None if cap is None else {"epsilon": str(cap[0]), "delta": str(cap[1])},
            }
            for purpose, ((eps, delta), cap) in central.items()
        ],
    }


@ledger.command("set-cap")
@click.argument("subject")
@click.argument("purpose")
@click.option(
    "--epsilon", "epsilon_text", required=True, help="central epsilon cap (plain decimal)"
)
@click.option("--delta", "delta_text", required=True, help="central delta cap (plain decimal)")
@_ledger_option
@_config_option
def set_cap_cmd(
    subject: str,
    purpose: str,
    epsilon_text: str,
    delta_text: str,
    ledger_url: str | None,
    config_path: str | None,
) -> None:
    """Set the central (epsilon, delta) cap of SUBJECT for PURPOSE (existing ledger)."""
    eps = decimal_option(epsilon_text, "--epsilon")
    delta = decimal_option(delta_text, "--delta")
    url = resolve_ledger_url(ledger_url, config_path)
    with open_cli_ledger(url, "write", scope="central") as led:
        try:
            led.set_central_cap(subject, purpose, epsilon_cap=eps, delta_cap=delta)
        except (TypeError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    click.echo(f"central cap of {subject} for {purpose}: eps={eps} delta={delta}")


def _attach_central_commands() -> None:
    """`ledger reservations` and `ledger settle-stale` live with the central commands."""
    from fedldp.cli_train import ledger_reservations, ledger_settle_stale

    ledger.add_command(ledger_reservations)
    ledger.add_command(ledger_settle_stale)


_attach_central_commands()


def _attach_ops_commands() -> None:
    """Deployment commands (fedldp/cli_ops.py) join these groups."""
    from fedldp import cli_ops

    collector.add_command(cli_ops.health_cmd)
    ledger.add_command(cli_ops.migrate_cmd)
    ledger.add_command(cli_ops.backup_cmd)
    ledger.add_command(cli_ops.restore_cmd)
    ledger.add_command(cli_ops.confirm_central_cmd)


_attach_ops_commands()
