"""`fedldp dashboard`: serve the read-only analyst dashboard (docs/dashboard.md)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fedldp.cli_common import open_cli_ledger
from fedldp.cli_report import _lists_shards, _open_sources, _settings

if TYPE_CHECKING:
    from fedldp.aggregator.dashboard.model import Dashboard
    from fedldp.aggregator.dashboard.source import ReadOnlyLedger

#: Environment variable holding the bearer token (alternative to --token-file).
TOKEN_ENV = "FEDLDP_DASHBOARD_TOKEN"


def load_dashboard(
    ledger: str | list[str],
    policy_dir: str | Path,
    trust_dir: str | Path,
    audience: str | None,
    central: Sequence[str] = (),
    shuffle_reports: str | Path | None = None,
) -> Dashboard:
    """A Dashboard over a whole ledger, opened read-only as `fedldp report` opens it
    (`_open_sources`), and the policies of `policy_dir` that verify now against
    `trust_dir` (click or ledger errors say what is wrong).

    `ledger`: one ledger's URL (refused when it is one shard of a sharded ledger),
    or a list: the `ledger_shards` of a sharded ledger, every shard in map order.
    `central`: URLs of further ledgers whose central reservations the budget page
    shows (a release service's own ledger; shard 0 of a sharded one), each opened
    read-only and labelled with its URL, password hidden. `shuffle_reports`: the folder
    of the analyzer's JSON reports on shuffled batches (`fedldp report --batch`) the
    shuffle page shows."""
    from fedldp.aggregator.dashboard.model import Dashboard
    from fedldp.aggregator.dashboard.source import ReadOnlyLedger
    from fedldp.client.policy import PolicyError
    from fedldp.client.policy.files import load_policy_folder, load_trust_folder

    now = int(time.time())
    try:
        trust = load_trust_folder(trust_dir, now=now)
    except PolicyError as exc:
        raise click.ClickException(f"trust folder {trust_dir}: {exc}") from None
    policies, _refused = load_policy_folder(policy_dir, trust, now=now, audience=audience)
    sharded = not isinstance(ledger, str)
    (source,) = _open_sources([ledger] if isinstance(ledger, str) else ledger, sharded=sharded)
    extra: list[tuple[str, ReadOnlyLedger]] = []
    try:
        for url in central:
            more = open_cli_ledger(url, "read", scope="central")  # shard 0 holds central
            extra.append((_label(url), ReadOnlyLedger(more)))
    except BaseException:
        for led in [source, *(e[1] for e in extra)]:
            led.close()
        raise
    folder = None if shuffle_reports is None else Path(shuffle_reports)
    return Dashboard(ReadOnlyLedger(source), policies, central=extra, shuffle_reports=folder)


def _label(url: str) -> str:
    """A ledger URL as the budget page names it: its password hidden."""
    import sqlalchemy as sa

    return sa.engine.make_url(url).render_as_string(hide_password=True)


def _token(token_file: str | None) -> str | None:
    if token_file is not None:
        from fedldp.client.textfiles import read_utf8

        fix = "--token-file holds the bearer token `fedldp collector mint-token` printed"
        text = read_utf8(token_file, fix, click.ClickException).strip()
        if not text:
            raise click.ClickException(f"{token_file} is empty; it must hold the bearer token")
        return text
    return os.environ.get(TOKEN_ENV) or None


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port_text = listen.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise click.BadParameter("--listen must be HOST:PORT, e.g. 127.0.0.1:8080")
    return host, int(port_text)


@click.command("dashboard")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="collector.toml supplying ledger_url, policy_dir, trust_dir, audience",
)
@click.option("--ledger", "ledger_url", help="ledger URL (opened read-only)")
@click.option(
    "--policies",
    "policy_dir",
    type=click.Path(file_okay=False),
    help="folder of signed *.policy envelopes",
)
@click.option(
    "--trust",
    "trust_dir",
    type=click.Path(file_okay=False),
    help="trust folder (pinned/*.pem root keys and *.root files)",
)
@click.option("--audience", help="deployment name the policies must list (default: 'default')")
@click.option(
    "--listen", default="127.0.0.1:8050", show_default=True, help="HOST:PORT (port 0: any free)"
)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False),
    help=f"file holding the bearer token (or set {TOKEN_ENV}); required off loopback",
)
@click.option(
    "--central-ledger",
    "central_urls",
    multiple=True,
    help="a further ledger whose central reservations the budget page shows (a release "
    "service's own ledger), opened read-only; repeat for several",
)
@click.option(
    "--shuffle-reports",
    "shuffle_reports",
    type=click.Path(exists=True, file_okay=False),
    help="folder of the analyzer's JSON reports on shuffled batches (fedldp report --batch "
    "... --format json --out DIR/NAME.json): the /shuffle page shows them",
)
def dashboard(
    config_path: str | None,
    ledger_url: str | None,
    policy_dir: str | None,
    trust_dir: str | None,
    audience: str | None,
    listen: str,
    token_file: str | None,
    central_urls: tuple[str, ...],
    shuffle_reports: str | None = None,
) -> None:
    """Serve a read-only web dashboard of the policies' estimates and budgets."""
    urls, policy_dir, trust_dir, aud = _settings(
        config_path, (ledger_url,) if ledger_url else (), policy_dir, trust_dir, audience
    )
    if not urls or not policy_dir or not trust_dir:
        raise click.UsageError("pass --config, or --ledger, --policies and --trust")
    host, port = _split_listen(listen)
    # A config's ledger_shards: every shard (a reader never reads part of a ledger).
    ledger = urls if not ledger_url and _lists_shards(config_path) else urls[0]
    serve_dashboard(
        ledger,
        policy_dir,
        trust_dir,
        aud,
        host=host,
        port=port,
        token=_token(token_file),
        central=central_urls,
        shuffle_reports=shuffle_reports,
    )


def serve_dashboard(
    ledger: str | list[str],
    policy_dir: str | Path,
    trust_dir: str | Path,
    audience: str | None,
    *,
    host: str,
    port: int,
    token: str | None,
    central: Sequence[str] = (),
    shuffle_reports: str | Path | None = None,
) -> None:
    """Serve the dashboard until interrupted; print its URL first (click errors on refusal).

    `ledger`, `central`, `shuffle_reports`: as `load_dashboard`'s."""
    try:
        from fedldp.aggregator.dashboard.app import (
            DashboardConfigError,
            DashboardServer,
            check_bind,
        )
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"the dashboard needs {exc.name!r}: pip install 'fedldp[dashboard]'"
        ) from None
    try:
        check_bind(host, token)
    except DashboardConfigError as exc:
        raise click.ClickException(str(exc)) from None
    view = load_dashboard(ledger, policy_dir, trust_dir, audience, central, shuffle_reports)
    view.budget()  # reads the spend aggregates once, so no analyst's first view waits for it
    try:
        server = DashboardServer(view, host=host, port=port, token=token)
    except OSError as exc:
        view.close()
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    click.echo(f"fedldp dashboard on {server.url} (read-only; Ctrl-C to stop)")
    try:
        server.serve_forever()
    finally:
        view.close()
