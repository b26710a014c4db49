"""Refusals that keep a sharded ledger whole (collector/ledger/shards.py): a first
start over charged databases, readers over part of the shards, central state on a
shard other than 0. Real SQLite files stand in for the shard servers."""

from __future__ import annotations

from pathlib import Path

import pytest
from collector_testkit import Deployment, checked_report
from fedldp.collector.ledger import SubmitBatch, open_ledger
from fedldp.collector.ledger.shards import (
    ShardMap,
    ShardMapError,
    add_shard,
    open_central_ledger,
    open_sharded,
    read_map,
    refuse_if_shard,
    write_map,
)


@pytest.fixture
def urls(tmp_path: Path) -> tuple[str, str]:
    return f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"


def _charge(deployment: Deployment, url: str, subject: str, now: int) -> None:
    policy = deployment.verified(deployment.envelopes[0])
    with open_ledger(url) as led:
        led.submit_many([SubmitBatch(subject, [checked_report(policy)], now)])


def _maps(*urls: str) -> list[ShardMap | None]:
    out = []
    for url in urls:
        with open_ledger(url, access="read") as led:
            out.append(read_map(led))
    return out


@pytest.mark.parametrize("charged", [0, 1])
def test_first_start_over_a_charged_database_is_refused_and_writes_nothing(
    deployment: Deployment, urls: tuple[str, str], now: int, charged: int
) -> None:
    """Either database holding charges refuses the first start, naming it and
    `shards add`; no map is written anywhere (so `shards add` still works)."""
    _charge(deployment, urls[charged], "old", now)
    open_ledger(urls[1 - charged]).close()
    with pytest.raises(ShardMapError, match=r"already holds charges.*shards add"):
        open_sharded(list(urls))
    assert _maps(*urls) == [None, None]


def test_the_way_in_for_a_charged_ledger_is_shards_add(
    deployment: Deployment, urls: tuple[str, str], now: int
) -> None:
    """After the refusal, `add_shard` grows the charged ledger; every charged subject
    stays on shard 0 (its cap is not granted again)."""
    subjects = [f"old-{i}" for i in range(20)]
    for subject in subjects:
        _charge(deployment, urls[0], subject, now)
    open_ledger(urls[1]).close()
    add_shard([urls[0]], urls[1], now=now)
    with open_sharded(list(urls)) as sharded:
        assert {sharded.route(s) for s in subjects} == {0}


def test_one_charged_database_alone_may_start_sharded(
    deployment: Deployment, urls: tuple[str, str], now: int
) -> None:
    """ledger_shards = [one charged ledger]: epoch 0 gives every slot to it, nothing moves."""
    _charge(deployment, urls[0], "old", now)
    with open_sharded([urls[0]]) as sharded:
        assert sharded.route("old") == 0


def test_finishing_an_interrupted_first_start_refuses_a_charged_shard(
    deployment: Deployment, urls: tuple[str, str], now: int
) -> None:
    """The concurrent/interrupted first start (shard 0 holds the epoch-0 map, shard 1
    none) checks emptiness in the map's insert transaction: a shard charged
    meanwhile is refused and gets no map."""
    a, b = urls
    with open_ledger(a) as led_a, open_ledger(b) as led_b:
        write_map(led_a, ShardMap.initial([led_a.ledger_id(), led_b.ledger_id()]), None)
    _charge(deployment, b, "meanwhile", now)
    with pytest.raises(ShardMapError, match="already holds charges"):
        open_sharded(list(urls))
    assert _maps(b) == [None]


def test_readers_never_write_a_map(urls: tuple[str, str]) -> None:
    for url in urls:
        open_ledger(url).close()
    open_sharded(list(urls), access="read").close()
    assert _maps(*urls) == [None, None]


def test_a_single_shard_url_is_refused_for_readers(urls: tuple[str, str]) -> None:
    open_sharded(list(urls)).close()
    with open_ledger(urls[1], access="read") as led, pytest.raises(ShardMapError, match="shard 1"):
        refuse_if_shard(led)


def test_central_state_opens_only_on_shard_0_or_a_plain_ledger(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    open_sharded(list(urls)).close()
    with pytest.raises(ShardMapError, match=r"shard 1 of 2.*live on shard 0"):
        open_central_ledger(urls[1], access="write")
    open_central_ledger(urls[0], access="write").close()
    open_central_ledger(f"sqlite:///{tmp_path / 'plain.db'}").close()
