"""Configuration validation: everything refused here happens before any reservation."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fedldp.aggregator.training.config import TrainingConfigError, load_config

ConfigFactory = Callable[..., Any]


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"budget": {"epsilon": "0"}}, "epsilon must be finite and > 0"),
        ({"budget": {"epsilon": "-1"}}, "epsilon must be finite and > 0"),
        ({"budget": {"epsilon": "inf"}}, "plain notation"),
        ({"budget": {"epsilon": "NaN"}}, "plain notation"),
        ({"budget": {"delta": "1e-5"}}, 'e.g. "0.00001" not "1e-5"'),
        ({"budget": {"epsilon": 1.5}}, "TOML float is inexact"),
        ({"budget": {"delta": "0"}}, "0 < delta < 1"),
        ({"budget": {"delta": "1"}}, "0 < delta < 1"),
        ({"training": {"epochs": 0}}, "epochs must be an integer >= 1"),
        ({"training": {"max_grad_norm": 0.0}}, "max_grad_norm must be finite and > 0"),
        ({"training": {"max_grad_norm": float("nan")}}, "max_grad_norm must be finite"),
        ({"training": {"learning_rate": float("inf")}}, "learning_rate must be finite"),
        ({"training": {"batch_size": 32}}, "conflicts with the accountant"),
        ({"training": {"shuffle": True}}, "conflicts with the accountant"),
        ({"training": {"poisson_sampling": False}}, "Poisson"),
        ({"training": {"sample_rate": 0.1}}, "exactly one of expected_batch_size"),
        ({"training": {"sample_rate": 1.5, "expected_batch_size": None}}, "(0, 1]"),
        ({"accountant": {"kind": "gdp"}}, "kind must be one of prv, rdp"),
        ({"accountant": {"fallback_to_rdp": True}}, "applies to kind 'prv' only"),
        ({"randomness": {"source": "os-entropy", "seed": 1}}, "seed is allowed only"),
        ({"randomness": {"source": "seeded", "seed": None}}, "needs seed"),
        ({"data": {"source": "sql"}}, "needs url and table"),
        ({"data": {"features": ["f0", "label"]}}, "label column cannot be a feature"),
        ({"model": {"norm": "instance"}}, "norm must be one of"),
        ({"training": {"grad_sample_mode": "fast"}}, "grad_sample_mode must be one of"),
        ({"training": {"turbo": True}}, "unknown keys: turbo"),
    ],
)
def test_invalid_config_is_refused(
    make_config: ConfigFactory, sections: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainingConfigError, match=re.escape(message)):
        make_config(**sections)


def test_valid_config_builds(make_config: ConfigFactory) -> None:
    cfg = make_config()
    assert cfg.budget.epsilon.as_tuple() == (0, (1,), 0)  # exact, from the string "1"
    assert cfg.training.grad_sample_mode == "auto"


def test_load_config_resolves_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "train.toml").write_text(
        """
[budget]
ledger = "sqlite:////tmp/x.db"
subject = "s"
purpose = "p"
epsilon = "1"
delta = "0.00001"
[data]
source = "csv"
path = "data/train.csv"
label = "y"
features = ["x"]
num_classes = 2
rows = 100
privacy_unit = "one person"
[training]
epochs = 1
max_grad_norm = 1.0
learning_rate = 0.1
expected_batch_size = 10
[output]
dir = "out"
"""
    )
    cfg = load_config(tmp_path / "train.toml")
    assert cfg.data.path == str((tmp_path / "data" / "train.csv").resolve())
    assert cfg.output_dir == (tmp_path / "out").resolve()


def test_bad_toml_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "train.toml").write_text("[budget\n")
    with pytest.raises(TrainingConfigError, match="not valid TOML"):
        load_config(tmp_path / "train.toml")
