"""What a finished run publishes: the model file, the privacy receipt, the ledger event.

Pure description and file writing; the ledger settlement is the shared
reservation lifecycle's (fedldp.aggregator.central.reservations), the final move
into place lifecycle.py's, the order of the two engine.py's. Schema and fields:
docs/training.md (Privacy receipt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.datakey import ALGORITHM, DataKey
from fedldp.aggregator.central.receipts import file_sha256
from fedldp.aggregator.central.receipts import library_versions as central_library_versions
from fedldp.aggregator.central.reservations import Reservation
from fedldp.aggregator.central.signing import TRAINING_RECEIPT_TYPE, sign
from fedldp.aggregator.training.accounting import prv_delta_error
from fedldp.aggregator.training.config import DataConfig, TrainConfig
from fedldp.aggregator.training.data import Dataset, redact_url
from fedldp.aggregator.training.models import UnsupportedModelError
from fedldp.aggregator.training.plan import Plan
from torch import nn

RECEIPT_SCHEMA = "fedldp.training-receipt/v1"
MODEL_FILE = "model.pt"
RECEIPT_FILE = "receipt.json"
EVENT_KIND = "poisson_subsampled_gaussian"


TRAINING_LIBRARIES = ("fedldp", "torch", "opacus", "numpy", "scipy")


def library_versions() -> dict[str, str]:
    """Versions of everything that shapes a trained model (for the receipt)."""
    return central_library_versions(TRAINING_LIBRARIES)


def data_description(
    data: DataConfig, dataset: Dataset | None, key: DataKey | None = None
) -> dict[str, Any]:
    """The receipt's `dataset`: where it came from and, under `key`, its keyed digests
    (the plain digests of protected data are never published: datakey.py)."""
    out: dict[str, Any] = {
        "source": data.source,
        "label": data.label,
        "features": list(dataset.feature_names) if dataset else list(data.features or ()),
        "feature_list_given": data.features is not None,
        "unit_column": data.unit_column,
    }
    if data.source == "sql":
        assert data.url is not None
        out["url"] = redact_url(data.url)
        out["table"] = data.table
    else:
        out["path"] = data.path
    out["num_classes"] = data.num_classes
    out["declared_rows"] = data.rows  # public, from the config: the actual count is never published
    if dataset is not None:
        out["digest_algorithm"] = ALGORITHM
        out["data_key_id"] = key.key_id if key is not None else None
        out["digest"] = key.digest("dataset", dataset.digest).mac if key is not None else None
        out["source_sha256"] = (
            key.digest("file", dataset.source_sha256).mac
            if key is not None and dataset.source_sha256 is not None
            else None
        )
    return out


@dataclass(frozen=True)
class TrainedRun:
    """Everything the receipt states about a run that finished its steps."""

    config: TrainConfig
    dataset: Dataset
    data_key: DataKey | None
    model: nn.Module
    custom: bool
    fixed: tuple[str, ...]
    plan: Plan
    sample_rate: float
    planned_steps: int
    check_every: int
    steps: int
    stop_reason: str
    history: list[tuple[float, float, int]]
    mode: str
    mode_reason: str
    randomness: dict[str, object]
    seeded: bool
    processes: int


def model_description(run: TrainedRun, artifact_sha256: str) -> dict[str, Any]:
    """The receipt's `model`: the architecture (or the custom class) and the artifact."""
    desc: dict[str, Any]
    if not run.custom:
        cfg = run.config.model
        desc = {
            "kind": "mlp",
            "hidden": list(cfg.hidden),
            "activation": cfg.activation,
            "norm": cfg.norm,
            "num_features": run.dataset.num_features,
            "num_classes": run.config.data.num_classes,
        }
    else:
        cls = type(run.model)
        desc = {"kind": "custom", "class": f"{cls.__module__}.{cls.__qualname__}"}
    desc.update(
        {
            "fixed": list(run.fixed),
            "artifact": MODEL_FILE,
            "artifact_sha256": artifact_sha256,
            "format": "torch.save(state_dict)",
        }
    )
    return desc


def build_receipt(
    run: TrainedRun,
    claim: Reservation,
    *,
    spent: Decimal,
    epsilons: dict[str, Any],
    artifact_sha256: str,
) -> dict[str, Any]:
    """The unsigned receipt payload (schema RECEIPT_SCHEMA; docs/training.md)."""
    config, tp, plan = run.config, run.config.training, run.plan
    return {
        "schema": RECEIPT_SCHEMA,
        "libraries": library_versions(),
        "dataset": data_description(config.data, run.dataset, run.data_key),
        "privacy": {
            "unit": config.data.privacy_unit,
            "mechanism": "DP-SGD: Poisson-subsampled Gaussian (Abadi et al. 2016)",
            "epsilon_budget": str(config.budget.epsilon),
            "delta": str(config.budget.delta),
            "epsilon_spent": str(spent),
            "delta_spent": str(config.budget.delta if run.steps else Decimal(0)),
            "accountant": {
                "requested": config.accountant.kind,
                "used": plan.mechanism,
                "fallback_reason": plan.fallback_reason,
                "prv_eps_error": config.accountant.eps_error,
                "prv_delta_error": prv_delta_error(float(config.budget.delta)),
                "rdp_orders": "opacus RDPAccountant.DEFAULT_ALPHAS",
                "state": {"mechanism": plan.mechanism, "history": [list(h) for h in run.history]},
            },
            "epsilon": epsilons,
        },
        "training": {
            "declared_rows": config.data.rows,
            "sample_rate": run.sample_rate,
            "expected_batch_size": config.expected_batch_size,
            "steps": run.steps,
            "planned_steps": run.planned_steps,
            "step_limit": plan.step_limit,
            "stop_reason": run.stop_reason,
            "epochs": tp.epochs,
            "noise_multiplier": plan.noise_multiplier,
            "noise_calibrated": plan.calibrated,
            "max_grad_norm": tp.max_grad_norm,
            "clipping": "flat, per sample",
            "optimizer": tp.optimizer,
            "learning_rate": tp.learning_rate,
            "momentum": tp.momentum,
            "grad_sample_mode": {"mode": run.mode, "reason": run.mode_reason},
            "check_every_steps": run.check_every,
            "accountant_queries": plan.accountant.queries,
            "accountant_cached_checks": plan.accountant.cached_checks,
            "processes": run.processes,
        },
        "randomness": run.randomness,
        "model": model_description(run, artifact_sha256),
        "ledger": {
            "ledger_id": claim.ledger_id(),
            "reservation_id": claim.reservation_id,
            "owner": claim.owner,
            "subject": config.budget.subject,
            "purpose": config.budget.purpose,
            "idempotency_key": claim.idempotency_key,
            "epsilon_reserved": str(config.budget.epsilon),
            "delta_reserved": str(config.budget.delta),
        },
        "for_release": not run.seeded,
    }


def write_model(model: nn.Module, path: Path) -> str:
    """Write `model`'s state_dict to `path` (torch.save); returns the file's sha256.

    The state_dict must hold exactly the trainable parameters DP-SGD updated
    (`published_state`); anything else raises UnsupportedModelError and nothing is
    written (after the data was opened: the run is charged, engine.py)."""
    state = published_state(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return file_sha256(path)


def published_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """`model`'s state_dict, checked to hold its trainable parameters and nothing else.

    Defence in depth behind models.require_parameters_only (checked before
    reserving): a buffer or other state a module acquired during training would be
    published un-noised while the receipt claims (ε, δ)."""
    state = model.state_dict()
    trainable = {n for n, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    if set(state) != trainable:
        extra = sorted(set(state) - trainable)
        missing = sorted(trainable - set(state))
        raise UnsupportedModelError(
            "refusing to publish the model: its state_dict is not exactly the trainable "
            f"parameters DP-SGD updated (extra: {extra}, missing: {missing})"
        )
    return state


def write_receipt(
    receipt: dict[str, Any], path: Path, signing_key: Ed25519PrivateKey | None
) -> None:
    """Write the receipt to `path`: a DSSE envelope signed by `signing_key`, or plain
    JSON without one (which `fedldp verify training` refuses)."""
    document: dict[str, Any] = (
        receipt if signing_key is None else sign(TRAINING_RECEIPT_TYPE, receipt, signing_key)
    )
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def training_event(receipt: dict[str, Any]) -> dict[str, Any]:
    """The ledger event of a finished run: the accountant's inputs and the artefact digests,
    so a receipt can be checked against the ledger (receipt.verify_receipt)."""
    training, privacy = receipt["training"], receipt["privacy"]
    return {
        "kind": EVENT_KIND,
        "noise_multiplier": training["noise_multiplier"],
        "sample_rate": training["sample_rate"],
        "steps": training["steps"],
        "delta": privacy["delta"],
        "accountant": privacy["accountant"]["used"],
        "model_sha256": receipt["model"]["artifact_sha256"],
        "data_digest": receipt["dataset"]["digest"],
        "randomness": receipt["randomness"]["source"],
    }
