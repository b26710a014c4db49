"""The release service and training keep central caps and reservations on shard 0
of a sharded ledger only (collector/ledger/shards.py `open_central_ledger`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from fedldp.aggregator.training.config import TrainConfig
from fedldp.aggregator.training.errors import BudgetRefusedError
from fedldp.aggregator.training.lifecycle import run_ledger
from fedldp.collector.ledger.shards import ShardMapError, open_sharded


def _two_shards(tmp_path: Path) -> tuple[str, str]:
    a, b = f"sqlite:///{tmp_path / 'sh0.db'}", f"sqlite:///{tmp_path / 'sh1.db'}"
    open_sharded([a, b]).close()
    return a, b


def test_release_service_refuses_shard_1(tmp_path: Path, make_service: Callable[..., Any]) -> None:
    _, shard1 = _two_shards(tmp_path)
    with pytest.raises(ShardMapError, match="shard 1 of 2"):
        make_service(ledger_url=shard1)


def test_release_service_serves_on_shard_0(
    tmp_path: Path, make_service: Callable[..., Any]
) -> None:
    shard0, _ = _two_shards(tmp_path)
    make_service(ledger_url=shard0)


def test_training_refuses_shard_1(tmp_path: Path) -> None:
    """run_ledger only reads config.budget.ledger: a stand-in config suffices."""
    _, shard1 = _two_shards(tmp_path)
    config = cast(TrainConfig, SimpleNamespace(budget=SimpleNamespace(ledger=shard1)))
    with pytest.raises(BudgetRefusedError, match="live on shard 0"), run_ledger(config, None):
        pass
