"""The command line's shared vocabulary: one spelling per option, one ledger opener.

Every command that takes a collector config says ``--config FILE``, a ledger
``--ledger URL``, a trust folder ``--trust DIR``. Earlier spellings (``--url``,
``--trust-dir``) stay as hidden aliases that print a deprecation line on stderr.
Commands open ledgers through `open_cli_ledger`, which refuses to create or
migrate a ledger unless the command is one that may (see `Access`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import click

if TYPE_CHECKING:
    from fedldp.collector.ledger import Ledger
    from fedldp.collector.ledger.store import Access

F = TypeVar("F", bound=Callable[..., Any])

LEDGER_URL_HELP = (
    "ledger URL: sqlite:////ABSOLUTE/PATH/ledger.db or postgresql+psycopg://USER@HOST/DB"
)


def deprecated_alias(old: str, new: str, dest: str) -> Callable[[F], F]:
    """A hidden option `old` that means `new` (stored in parameter `dest`) and says so.

    The alias writes its value to ``ctx.meta``; `fallback_to_alias` (the callback
    of `new`) picks it up when `new` itself was not given.
    """

    def remember(ctx: click.Context, _param: click.Parameter, value: Any) -> None:
        if value is None or value == ():
            return
        click.echo(f"warning: {old} is deprecated; use {new}", err=True)
        ctx.meta[f"fedldp.alias.{dest}"] = value

    return click.option(
        old,
        f"_alias_{dest}",
        hidden=True,
        expose_value=False,
        is_eager=True,
        callback=remember,
        help=f"deprecated spelling of {new}",
    )


def fallback_to_alias(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Callback of an option with a deprecated alias: the alias's value if unset."""
    if value is None or value == ():
        return ctx.meta.get(f"fedldp.alias.{param.name}", value)
    return value


def config_option(
    help_text: str = "collector.toml (see deploy/collector.toml)",
) -> Callable[[F], F]:
    """``--config FILE``: an existing file, parameter `config_path`."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(exists=True, dir_okay=False),
        help=help_text,
    )


def ledger_option(
    *, required: bool = False, envvar: str | None = None, dest: str = "ledger_url"
) -> Callable[[F], F]:
    """``--ledger URL`` (parameter `dest`), with ``--url`` as a deprecated alias."""

    def wrap(fn: F) -> F:
        fn = click.option(
            "--ledger",
            dest,
            envvar=envvar,
            required=False,
            callback=_required_after_alias("--ledger") if required else fallback_to_alias,
            help=LEDGER_URL_HELP
            + (" (default: from --config, or FEDLDP_COLLECTOR_LEDGER_URL)" if envvar else ""),
        )(fn)
        return deprecated_alias("--url", "--ledger", dest)(fn)

    return wrap


def trust_option(**kwargs: Any) -> Callable[[F], F]:
    """``--trust DIR`` (parameter `trust_dir`), with ``--trust-dir`` as a deprecated alias."""

    def wrap(fn: F) -> F:
        fn = click.option(
            "--trust",
            "trust_dir",
            type=click.Path(file_okay=False),
            callback=fallback_to_alias,
            help=kwargs.pop("help", "trust folder (pinned/*.pem root keys and *.root files)"),
            **kwargs,
        )(fn)
        return deprecated_alias("--trust-dir", "--trust", "trust_dir")(fn)

    return wrap


def _required_after_alias(name: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def check(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        value = fallback_to_alias(ctx, param, value)
        if value is None:
            raise click.MissingParameter(ctx=ctx, param=param)
        return value

    return check


def resolve_ledger_url(ledger_url: str | None, config_path: str | None) -> str:
    """--ledger, else the ledger_url of --config (or FEDLDP_COLLECTOR_* variables; of
    `ledger_shards`, shard 0); a usage error when there is neither."""
    if ledger_url:
        return ledger_url
    if config_path is None and not os.environ.get("FEDLDP_COLLECTOR_LEDGER_URL"):
        raise click.UsageError("pass --ledger URL or --config FILE (with ledger_url)")
    from fedldp.collector.config import load_config

    config = load_config(config_path)
    # A sharded ledger's global state (central caps, reservations, its identity)
    # lives on shard 0 (collector/ledger/shards.py).
    return config.ledger_url or config.ledger_shards[0]


Scope = Literal["whole", "central", "any"]


def open_cli_ledger(url: str, access: Access, *, scope: Scope) -> Ledger:
    """The ledger at `url` for a command: "read" for commands that only read (never
    creates, migrates or writes), "write" for writers of an existing ledger,
    "create" only for `collector serve` and `ledger init`/`migrate`.

    `scope` says which ledgers the command may be given (collector/ledger/shards.py):
    "whole" (reads subjects' charges or reports: refused on one shard of a sharded
    ledger, `refuse_if_shard`), "central" (central caps and reservations: a plain
    ledger or shard 0, `refuse_unless_central`), "any" (schema commands). The checks
    only read."""
    from fedldp.collector.ledger import open_ledger
    from fedldp.collector.ledger.shards import (
        open_checked,
        refuse_if_shard,
        refuse_unless_central,
    )

    if scope == "any":
        return open_ledger(url, access=access, pool_size=2)
    check = refuse_if_shard if scope == "whole" else refuse_unless_central
    return open_checked(url, check, access=access, pool_size=2)


@overload
def decimal_option(text: str, name: str, *, allow_negative: bool = False) -> Decimal: ...
@overload
def decimal_option(text: None, name: str, *, allow_negative: bool = False) -> None: ...
def decimal_option(text: str | None, name: str, *, allow_negative: bool = False) -> Decimal | None:
    """`text` (the value of option `name`) as an exact Decimal, or None when not given.

    The one decimal rule (fedldp.client.decimals: plain notation, no exponent); a
    violation is a usage error (exit 2) naming the option.
    """
    if text is None:
        return None
    from fedldp.client.decimals import parse_decimal

    return parse_decimal(text.strip(), allow_negative=allow_negative, name=name)


def iso_utc(epoch_seconds: float | int | None) -> str:
    """A time for people: ISO 8601 in UTC ("2026-12-01T14:05:00Z"); "-" when unset."""
    if epoch_seconds is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch_seconds)))


class TimeParam(click.ParamType):  # type: ignore[type-arg]
    """A point in time typed by a person: ISO 8601 ("2026-12-01", "2026-12-01T06:00:00Z",
    an offset such as "+02:00"; no offset means UTC) or epoch seconds; the value is
    epoch seconds (int)."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """Epoch seconds of `value`; a usage error (exit 2) naming the format otherwise."""
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.isdigit():
            return int(text)
        import datetime

        try:
            when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            self.fail(
                f"{text!r} is not a time: use ISO 8601 UTC such as 2026-12-01T00:00:00Z, "
                "or epoch seconds",
                param,
                ctx,
            )
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        return int(when.timestamp())
