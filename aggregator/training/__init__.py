"""Central DP-SGD on consolidated data (extra `train`: torch, Opacus, scikit-learn).

Public API::

    from fedldp.aggregator.training import load_config, train_private, verify_receipt
    result = train_private(load_config(Path("train.toml")))

Importing this package imports nothing heavy: each public name is loaded from its
module on first use (PEP 562), so `fedldp.aggregator.training.config` and the
`fedldp train` argument checks never import torch or Opacus; the engine does.
See docs/training.md.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedldp.aggregator.central.receipts import Verification
    from fedldp.aggregator.training.accounting import AccountantError, BudgetAccountant, epsilon
    from fedldp.aggregator.training.config import (
        TrainConfig,
        TrainingConfigError,
        config_from_mapping,
        load_config,
    )
    from fedldp.aggregator.training.data import (
        DataError,
        Dataset,
        dataset_from_arrays,
        load_dataset,
    )
    from fedldp.aggregator.training.engine import (
        BudgetRefusedError,
        DistributedError,
        OutputExistsError,
        PoissonSamplingError,
        ReservationTakenError,
        TrainingAbortedError,
        TrainingRequest,
        TrainingResult,
        build_private_step,
        poisson_loader,
        require_poisson_loader,
        run_request,
        train_nonprivate_baseline,
        train_private,
    )
    from fedldp.aggregator.training.models import (
        UnsupportedModelError,
        build_mlp,
        choose_grad_sample_mode,
        validate_model,
    )
    from fedldp.aggregator.training.receipt import ReceiptError, verify_receipt

# Public name -> the module that defines it (imported on first use).
_SOURCES: dict[str, str] = {
    "AccountantError": "fedldp.aggregator.training.accounting",
    "BudgetAccountant": "fedldp.aggregator.training.accounting",
    "BudgetRefusedError": "fedldp.aggregator.training.engine",
    "DataError": "fedldp.aggregator.training.data",
    "Dataset": "fedldp.aggregator.training.data",
    "DistributedError": "fedldp.aggregator.training.engine",
    "OutputExistsError": "fedldp.aggregator.training.engine",
    "PoissonSamplingError": "fedldp.aggregator.training.engine",
    "ReceiptError": "fedldp.aggregator.training.receipt",
    "ReservationTakenError": "fedldp.aggregator.training.engine",
    "TrainConfig": "fedldp.aggregator.training.config",
    "TrainingAbortedError": "fedldp.aggregator.training.engine",
    "TrainingConfigError": "fedldp.aggregator.training.config",
    "TrainingRequest": "fedldp.aggregator.training.engine",
    "TrainingResult": "fedldp.aggregator.training.engine",
    "UnsupportedModelError": "fedldp.aggregator.training.models",
    "Verification": "fedldp.aggregator.central.receipts",
    "build_mlp": "fedldp.aggregator.training.models",
    "build_private_step": "fedldp.aggregator.training.engine",
    "choose_grad_sample_mode": "fedldp.aggregator.training.models",
    "config_from_mapping": "fedldp.aggregator.training.config",
    "dataset_from_arrays": "fedldp.aggregator.training.data",
    "epsilon": "fedldp.aggregator.training.accounting",
    "load_config": "fedldp.aggregator.training.config",
    "load_dataset": "fedldp.aggregator.training.data",
    "poisson_loader": "fedldp.aggregator.training.engine",
    "require_poisson_loader": "fedldp.aggregator.training.engine",
    "run_request": "fedldp.aggregator.training.engine",
    "train_nonprivate_baseline": "fedldp.aggregator.training.engine",
    "train_private": "fedldp.aggregator.training.engine",
    "validate_model": "fedldp.aggregator.training.models",
    "verify_receipt": "fedldp.aggregator.training.receipt",
}

__all__ = [
    "AccountantError",
    "BudgetAccountant",
    "BudgetRefusedError",
    "DataError",
    "Dataset",
    "DistributedError",
    "OutputExistsError",
    "PoissonSamplingError",
    "ReceiptError",
    "ReservationTakenError",
    "TrainConfig",
    "TrainingAbortedError",
    "TrainingConfigError",
    "TrainingRequest",
    "TrainingResult",
    "UnsupportedModelError",
    "Verification",
    "build_mlp",
    "build_private_step",
    "choose_grad_sample_mode",
    "config_from_mapping",
    "dataset_from_arrays",
    "epsilon",
    "load_config",
    "load_dataset",
    "poisson_loader",
    "require_poisson_loader",
    "run_request",
    "train_nonprivate_baseline",
    "train_private",
    "validate_model",
    "verify_receipt",
]


def __getattr__(name: str) -> Any:
    """Import `name`'s module on first use, so importing the package stays light."""
    source = _SOURCES.get(name)
    if source is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(source), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public names (for `dir()` and completion)."""
    return sorted(__all__)
