"""The operator's model zoo and training limits: the catalog's `[training]` section.

Parsed with the catalog (catalog.py) and imports neither torch nor Opacus.
Format (docs/release-service.md, "Training jobs")::

    [training]
    max_epochs = 20                  # each limit bounds what a job may ask
    max_steps = 20000                # epochs x floor(1/q), the planned DP-SGD steps
    max_expected_batch_size = 1024
    max_learning_rate = "10"         # plain decimal strings
    max_grad_norm = "10"
    [training.models.mlp-small]      # a built-in MLP
    hidden = [32]
    activation = "relu"              # relu | tanh
    norm = "none"                    # none | group | layer
    [training.models.my-net]         # an operator-allowed factory
    module = "my_models:build"       # callable(num_features, num_classes) -> torch.nn.Module

An analyst names a model of the zoo; it never sends code or a module path. A
`module` entry is imported only when a job that names it starts (before any
reservation). Limits bound resources (time, memory), not privacy: the privacy
of every job is bounded by its (ε, δ) and the release policy's cap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_DECIMAL_RE = re.compile(r"[0-9]+(\.[0-9]+)?")
#: Built-in MLP norms a zoo entry may use (BatchNorm mixes the samples of a batch:
#: Opacus refuses it, so it is not offered).
NORMS = ("none", "group", "layer")
ACTIVATIONS = ("relu", "tanh")


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: a built-in MLP (`hidden`, ...) or an allowed `module` factory."""

    name: str
    hidden: tuple[int, ...] = (64,)
    activation: str = "relu"
    norm: str = "none"
    module: str | None = None


@dataclass(frozen=True)
class TrainingLimits:
    """The largest hyper-parameters a job may ask for."""

    max_epochs: int = 20
    max_steps: int = 20_000
    max_expected_batch_size: int = 1024
    max_learning_rate: Decimal = Decimal(10)
    max_grad_norm: Decimal = Decimal(10)


@dataclass(frozen=True)
class TrainingCatalog:
    """The zoo by name and the limits."""

    models: dict[str, ZooModel]
    limits: TrainingLimits


def _positive_int(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"[training] {key} must be a positive integer")
    return value


def _positive_decimal(key: str, value: object) -> Decimal:
    if not isinstance(value, str) or not _DECIMAL_RE.fullmatch(value) or Decimal(value) <= 0:
        raise ValueError(f'[training] {key} must be a positive plain decimal string such as "10"')
    return Decimal(value)


def _model(name: str, spec: dict[str, Any]) -> ZooModel:
    where = f"[training.models.{name}]"
    if not _NAME_RE.fullmatch(name):
        raise ValueError(f"{where}: a model name is 1-64 of [A-Za-z0-9_.-]")
    if "module" in spec:
        if set(spec) != {"module"}:
            raise ValueError(f"{where}: a module entry has only `module`")
        module = spec["module"]
        if not isinstance(module, str) or not _MODULE_RE.fullmatch(module):
            raise ValueError(f'{where}: module must read "package.module:callable"')
        return ZooModel(name, module=module)
    unknown = set(spec) - {"hidden", "activation", "norm"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}")
    hidden = spec.get("hidden", [64])
    if not isinstance(hidden, list) or not all(
        isinstance(w, int) and not isinstance(w, bool) and 1 <= w <= 65_536 for w in hidden
    ):
        raise ValueError(f"{where}: hidden must be a list of layer widths in 1..65536")
    activation = spec.get("activation", "relu")
    norm = spec.get("norm", "none")
    if activation not in ACTIVATIONS or norm not in NORMS:
        raise ValueError(
            f"{where}: activation is one of {ACTIVATIONS}, norm one of {NORMS} "
            "(BatchNorm mixes a batch's samples: DP-SGD cannot train it)"
        )
    return ZooModel(name, tuple(hidden), str(activation), str(norm))


def parse_training(spec: dict[str, Any]) -> TrainingCatalog:
    """The `[training]` section (module docstring); ValueError naming the key at fault."""
    known = {
        "models",
        "max_epochs",
        "max_steps",
        "max_expected_batch_size",
        "max_learning_rate",
        "max_grad_norm",
    }
    unknown = set(spec) - known
    if unknown:
        raise ValueError(f"[training] unknown key(s) {sorted(unknown)}")
    default = TrainingLimits()
    limits = TrainingLimits(
        max_epochs=_positive_int("max_epochs", spec.get("max_epochs", default.max_epochs)),
        max_steps=_positive_int("max_steps", spec.get("max_steps", default.max_steps)),
        max_expected_batch_size=_positive_int(
            "max_expected_batch_size",
            spec.get("max_expected_batch_size", default.max_expected_batch_size),
        ),
        max_learning_rate=_positive_decimal(
            "max_learning_rate", spec.get("max_learning_rate", str(default.max_learning_rate))
        ),
        max_grad_norm=_positive_decimal(
            "max_grad_norm", spec.get("max_grad_norm", str(default.max_grad_norm))
        ),
    )
    models = {str(n): _model(str(n), dict(m)) for n, m in dict(spec.get("models", {})).items()}
    if not models:
        raise ValueError("[training] declares no model: add at least one [training.models.NAME]")
    return TrainingCatalog(models, limits)
