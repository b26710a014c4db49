"""A model may keep no state besides its trainable parameters (models.require_parameters_only),
and the artefact holds exactly those parameters (publish.published_state).

The attack module (tests/aggregator/service/attack_zoo_models.py) copies a raw training
row into a buffer during forward; DP-SGD never clips or noises it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the train extra: pip install 'fedldp[train]'")
pytest.importorskip("opacus", reason="needs the train extra: pip install 'fedldp[train]'")

import torch
from click.testing import CliRunner
from fedldp.aggregator.training import (
    TrainingAbortedError,
    UnsupportedModelError,
    engine,
    load_dataset,
    models,
    publish,
    request,
    train_private,
)
from fedldp.aggregator.training.config import DataConfig
from fedldp.aggregator.training.data import Dataset
from fedldp.collector.ledger import Ledger
from torch import nn

from fedldp.cli import main
from tests.aggregator.service.attack_zoo_models import memorizer

from .conftest import PURPOSE, SUBJECT, write_table
from .test_cli_and_audit import _toml

pytestmark = [
    pytest.mark.train,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
warnings.filterwarnings("ignore", module="opacus")

ConfigFactory = Callable[..., Any]


class _Counting:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, config: DataConfig) -> Dataset:
        self.calls += 1
        return load_dataset(config)


class _Scratch(nn.Module):
    """A non-persistent buffer: not in state_dict, still writable in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.register_buffer("scratch", torch.zeros(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(x)
        return out


def _frozen() -> nn.Module:
    net = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    net[0].weight.requires_grad_(False)
    return net


def _nothing_in(folder: Path) -> bool:
    return not folder.exists() or not any(folder.iterdir())


def _opacus_only(module: nn.Module, *, fix: bool) -> models.ValidatedModel:
    """The broken variant: Opacus's ModuleValidator alone (layer types such as BatchNorm)."""
    return models._opacus_validate(module, fix=fix)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: memorizer(4, 2), "seen (buffer)"),
        (_Scratch, "scratch (buffer)"),
        (_frozen, "0.weight (frozen parameter)"),
    ],
)
def test_a_module_with_non_parameter_state_is_refused_before_reserving(
    make_config: ConfigFactory, ledger: Ledger, build: Callable[[], nn.Module], named: str
) -> None:
    counter = _Counting()
    cfg = make_config()
    with pytest.raises(UnsupportedModelError, match=r"state besides its trainable") as info:
        train_private(cfg, ledger=ledger, model=build(), load=counter)
    assert named in str(info.value) and "GroupNorm" in str(info.value)
    assert counter.calls == 0 and ledger.reservations(SUBJECT) == []
    assert _nothing_in(cfg.output_dir)


def test_the_broken_variant_checking_layer_types_only_misses_the_attack_module() -> None:
    attack = memorizer(4, 2)
    assert _opacus_only(attack, fix=False).module is attack  # Opacus sees nothing wrong
    with pytest.raises(UnsupportedModelError, match=r"seen \(buffer\)"):
        models.validate_model(attack, fix=False)
    # a BatchNorm that --fix-model replaces leaves no buffer behind
    bn = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    fixed = models.validate_model(bn, fix=True)
    assert models.non_parameter_state(fixed.module) == []


def test_publication_refuses_state_the_check_before_reserving_missed(
    make_config: ConfigFactory, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the check before reserving broken, publication still refuses: the run fails
    after the data was opened (charged in full) and nothing is written. With both broken,
    the artefact carries a raw training row: what the checks exist to stop."""
    monkeypatch.setattr(request, "validate_model", _opacus_only)
    cfg = make_config()
    with pytest.raises(TrainingAbortedError, match=r"refusing to publish.*seen"):
        train_private(cfg, ledger=ledger, model=memorizer(4, 2))
    (res,) = ledger.reservations(SUBJECT, PURPOSE)
    assert res.status == "settled" and res.epsilon_spent == cfg.budget.epsilon
    assert _nothing_in(cfg.output_dir)

    monkeypatch.setattr(publish, "published_state", lambda m: m.state_dict())
    leaky = make_config(output={"dir": str(cfg.output_dir.parent / "leaky")})
    result = train_private(leaky, ledger=ledger, model=memorizer(4, 2))
    state = torch.load(result.model_path, weights_only=True)
    rows = torch.from_numpy(load_dataset(leaky.data).features).to(torch.float32)
    assert any(torch.equal(state["seen"], row) for row in rows)  # a raw row, published


def test_fedldp_train_refuses_a_model_with_a_buffer_before_reserving(
    tmp_path: Path,
    ledger: Ledger,
    ledger_url: str,
    receipt_key: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`fedldp train --config` whose model (here the MLP builder, replaced) keeps a buffer:
    refused with a one-line error naming it, nothing reserved, read or written."""

    def with_buffer(_config: Any, num_features: int, num_classes: int) -> nn.Module:
        return memorizer(num_features, num_classes)

    monkeypatch.setattr(request, "build_mlp", with_buffer)
    monkeypatch.setattr(engine, "build_mlp", with_buffer)
    write_table(tmp_path / "train.csv")
    out = CliRunner().invoke(
        main, ["train", "--config", str(_toml(tmp_path, ledger_url, key=receipt_key[0]))]
    )
    assert out.exit_code == 1, out.output
    assert "Error: the model keeps state besides" in out.output
    assert "seen (buffer)" in out.output
    assert ledger.reservations(SUBJECT) == []
    assert ledger.central_spend(SUBJECT, PURPOSE) == (Decimal(0), Decimal(0))
    assert not (tmp_path / "out").exists()
