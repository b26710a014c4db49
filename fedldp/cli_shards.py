"""`fedldp ledger shards` (show, add) and the sharded forms of `ledger reconcile` and
`ledger show` (collector/ledger/shards.py; docs/operations.md, "Ledger shards")."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

import click

from fedldp.cli_common import config_option, resolve_ledger_url

if TYPE_CHECKING:
    from fedldp.collector.ledger.shards import ShardedLedger


def shard_urls(config_path: str | None) -> list[str]:
    """The `ledger_shards` of --config (or FEDLDP_COLLECTOR_* variables); [] when the
    config names one ledger (or none is given)."""
    import os

    from fedldp.collector.config import env_name, load_config

    if config_path is None and env_name("ledger_shards") not in os.environ:
        return []
    return list(load_config(config_path).ledger_shards)


def open_cli_shards(urls: list[str]) -> ShardedLedger:
    """The sharded ledger at `urls`, read-only (never creates or writes a map)."""
    from fedldp.collector.ledger.shards import open_sharded

    return open_sharded(urls, access="read", pool_size=2)


def reconcile_shards(urls: list[str]) -> None:
    """`ledger reconcile` over every shard, reporting each; exit 1 on any mismatch."""
    with open_cli_shards(urls) as sharded:
        results = sharded.reconcile_shards()
    total = 0
    for index, mismatches in results:
        name = f"shard {index}" if index >= 0 else "placement"
        for m in mismatches:
            click.echo(f"MISMATCH {name}: {m}")
        click.echo(
            f"{name}: {'consistent' if not mismatches else f'{len(mismatches)} mismatch(es)'}"
        )
        total += len(mismatches)
    if total:
        click.echo(f"{total} mismatch(es)", err=True)
        sys.exit(1)
    click.echo(f"ledger consistent: {len(urls)} shard(s), every running total matches the raw rows")


@click.group("shards")
def shards() -> None:
    """Inspect and grow a ledger spread over several databases (ledger_shards)."""


_config = config_option("collector.toml listing ledger_shards (or one ledger_url)")


@shards.command("show")
@_config
def show_cmd(config_path: str | None) -> None:
    """Each shard's database and ledger id, and the slots it owns now (read-only)."""
    from fedldp.collector.ledger.shards import SLOTS

    urls = shard_urls(config_path)
    if not urls:
        if config_path is None:
            raise click.UsageError("pass --config FILE (a collector.toml with ledger_shards)")
        from fedldp.cli_errors import mask_password

        one = resolve_ledger_url(None, config_path)
        click.echo(
            f"1 ledger, not sharded: {mask_password(one)} ({config_path} sets ledger_url; "
            "`fedldp ledger shards add --new URL` makes it shard 0 of 2)"
        )
        return
    with open_cli_shards(urls) as sharded:
        current = sharded.map.epochs[-1]
        click.echo(f"{len(urls)} shard(s), {SLOTS} slots, {len(sharded.map.epochs)} epoch(s)")
        for i, ledger_id in enumerate(sharded.map.ledger_ids):
            click.echo(f"shard {i}: ledger {ledger_id}, {current.count(i)} slots now")


@shards.command("add")
@_config
@click.option("--new", "new_url", required=True, help="URL of the empty database to add")
def add_cmd(config_path: str | None, new_url: str) -> None:
    """Add an empty database as the next shard (stop every collector first).

    New subjects of the slots that move go to it; every subject seen before stays
    where it is. Then append the URL to ledger_shards and start the collectors.
    """
    from fedldp.collector.ledger.shards import add_shard

    urls = shard_urls(config_path)
    if not urls:  # growing a single ledger into two shards
        urls = [resolve_ledger_url(None, config_path)]
    added = add_shard(urls, new_url, now=int(time.time()))
    moved = added.epochs[-1].count(len(urls))
    click.echo(
        f"shard {len(urls)} added ({moved} slots move to it for new subjects); "
        f"now list {len(urls) + 1} URLs in ledger_shards, the new one last, and start "
        "the collectors"
    )
