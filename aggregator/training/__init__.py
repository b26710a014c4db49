"""Central DP-SGD on consolidated data (extra `train`: torch, Opacus, scikit-learn).

Public API::

    from fedldp.aggregator.training import load_config, train_private, verify_receipt
    result = train_private(load_config(Path("train.toml")))

Importing this package imports torch and Opacus; `fedldp.aggregator.training.config`
alone does not. See docs/training.md.
"""

from fedldp.aggregator.central.receipts import Verification
from fedldp.aggregator.training.accounting import AccountantError, BudgetAccountant, epsilon
from fedldp.aggregator.training.config import (
    TrainConfig,
    TrainingConfigError,
    config_from_mapping,
    load_config,
)
from fedldp.aggregator.training.data import DataError, Dataset, dataset_from_arrays, load_dataset
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
