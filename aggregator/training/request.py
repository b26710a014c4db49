"""A private training run as one validated object (`TrainingRequest`).

`TrainingRequest.prepare` does everything that must happen before the ledger is
touched — refuse an existing output, validate (and with fix_model repair) the
model, choose the grad-sample mode, load the receipt signing key and the data
key — and records how the run is to be carried out (loader, clock, log, number
of processes). Nothing is reserved, read or written by it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.datakey import DataKey, DataKeyError
from fedldp.aggregator.central.datakey import load_data_key as read_data_key
from fedldp.aggregator.training.config import (
    DataConfig,
    ModelConfig,
    ReceiptConfig,
    TrainConfig,
    TrainingConfigError,
)
from fedldp.aggregator.training.data import Dataset, load_dataset
from fedldp.aggregator.training.errors import DistributedError, OutputExistsError
from fedldp.aggregator.training.models import build_mlp, choose_grad_sample_mode, validate_model
from fedldp.aggregator.training.publish import MODEL_FILE, RECEIPT_FILE
from fedldp.aggregator.training.step import PROBE
from torch import nn


def load_data_key(receipt: ReceiptConfig) -> DataKey | None:
    """The secret data-digest key of the configuration (None: no data digest recorded)."""
    if receipt.data_digest_key is None:
        return None
    try:
        return read_data_key(receipt.data_digest_key)
    except DataKeyError as exc:
        raise TrainingConfigError(f"[receipt] data_digest_key: {exc}") from exc


def load_signing_key(receipt: ReceiptConfig) -> Ed25519PrivateKey | None:
    """The receipt signing key of the configuration (None: unsigned receipts).

    Read before anything is reserved: a missing or unreadable key is a
    configuration error that changes nothing.
    """
    if receipt.signing_key is None:
        return None
    import os

    from fedldp.authoring import KeyFileError, load_private_key

    passphrase = None
    if receipt.passphrase_env is not None:
        value = os.environ.get(receipt.passphrase_env)
        if not value:
            raise TrainingConfigError(
                f"[receipt] passphrase_env: environment variable {receipt.passphrase_env} "
                "is not set or empty"
            )
        passphrase = value.encode("utf-8")
    try:
        return load_private_key(receipt.signing_key, passphrase=passphrase)
    except (KeyFileError, OSError) as exc:
        raise TrainingConfigError(f"[receipt] signing_key: {exc}") from exc


def _probe_model(config: ModelConfig) -> nn.Module:
    # Layer types do not depend on the data's width: validate before reading anything.
    return build_mlp(config, num_features=1, num_classes=2)


def check_nproc(nproc: int) -> None:
    """`nproc` must be a positive integer, and a multi-process run needs a process
    without a torch.distributed group of its own (the run makes one)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise DistributedError(f"nproc must be a positive integer, not {nproc!r}")
    if nproc > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        raise DistributedError(
            "this process already belongs to a torch.distributed group; a multi-process "
            "run starts its own group"
        )
    if nproc > 1 and not torch.distributed.is_gloo_available():
        raise DistributedError("a multi-process run needs torch.distributed with gloo")


@dataclass(frozen=True)
class TrainingRequest:
    """One private training run, validated; `engine.run_request` carries it out.

    `model` is the caller's validated module, or None for the configured MLP (built
    once the data's width is known). `mode` is a grad-sample mode or step.PROBE
    (auto, decided by the timing probe once the feature shape is known).
    """

    config: TrainConfig
    model: nn.Module | None
    fixed: tuple[str, ...]
    mode: str
    mode_reason: str
    signing_key: Ed25519PrivateKey | None
    data_key: DataKey | None
    load: Callable[[DataConfig], Dataset]
    clock: Callable[[], int]
    log: Callable[[str], None]
    nproc: int = 1
    started: float = field(default_factory=time.perf_counter)

    @property
    def custom(self) -> bool:
        """Whether the caller gave the model (else the configured MLP)."""
        return self.model is not None

    @classmethod
    def prepare(
        cls,
        config: TrainConfig,
        *,
        model: nn.Module | None,
        load: Callable[[DataConfig], Dataset],
        clock: Callable[[], int],
        log: Callable[[str], None],
        nproc: int = 1,
    ) -> TrainingRequest:
        """Validate everything that can be validated before reserving (module docstring).

        Raises OutputExistsError, UnsupportedModelError, TrainingConfigError (keys)
        and DistributedError; nothing is reserved, read or written.
        """
        started = time.perf_counter()
        check_nproc(nproc)
        _check_paths(config, files=load is load_dataset)
        for p in (config.output_dir / MODEL_FILE, config.output_dir / RECEIPT_FILE):
            if p.exists():
                raise OutputExistsError(f"{p} exists; a released model is never overwritten")
        fixed: tuple[str, ...]
        if model is not None:
            checked = validate_model(model, fix=config.model.fix_model)
            model, fixed, probe = checked.module, checked.fixed, checked.module
        else:
            probe_checked = validate_model(_probe_model(config.model), fix=config.model.fix_model)
            probe, fixed = probe_checked.module, probe_checked.fixed
        mode, mode_reason = _grad_sample_mode(config, probe)
        for change in fixed:
            log(f"fixed for DP-SGD: {change}")
        log(f"grad-sample mode: {mode_reason}")
        signing_key = load_signing_key(config.receipt)
        data_key = load_data_key(config.receipt)
        if data_key is None:
            log("no [receipt] data_digest_key: no data digest is recorded")
        if signing_key is None:
            log(
                "WARNING: no [receipt] signing_key: the receipt will be unsigned and nothing "
                "this run writes can be verified (`fedldp verify training` refuses it)"
            )
        return cls(
            config=config,
            model=model,
            fixed=fixed,
            mode=mode,
            mode_reason=mode_reason,
            signing_key=signing_key,
            data_key=data_key,
            load=load,
            clock=clock,
            log=log,
            nproc=nproc,
            started=started,
        )


def _check_paths(config: TrainConfig, *, files: bool) -> None:
    """What the configuration already shows, checked before anything is reserved.

    A file source (`csv`, `parquet`) must name an existing regular file; the output
    folder must be a writable folder or creatable in one (nothing is created here).
    Raises TrainingConfigError naming the option; nothing of the data is read (only
    its path is looked at). `files`: the data is read by the file loader (a caller's
    own loader, e.g. the release service's catalog, names its data otherwise).
    """
    data = config.data
    if files and data.source in ("csv", "parquet") and data.path is not None:
        path = Path(data.path)
        if not path.is_file():
            raise TrainingConfigError(
                f"[data] path {path} is not a file (missing or a folder); fix the path: "
                "nothing was reserved or read"
            )
    out = config.output_dir
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the folder the run would create `out` in
    if not existing.is_dir():
        raise TrainingConfigError(
            f"[output] folder {out} cannot be created ({existing} is not a folder); choose "
            "a writable folder: nothing was reserved or read"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainingConfigError(
            f"[output] folder {out} cannot be created or written ({existing} is not "
            "writable); choose a writable folder: nothing was reserved or read"
        )


def _grad_sample_mode(config: TrainConfig, probe: nn.Module) -> tuple[str, str]:
    """The configured mode, or auto's choice by rule (PROBE when no rule decides)."""
    if config.training.grad_sample_mode != "auto":
        return config.training.grad_sample_mode, "set in the configuration"
    mode, reason = choose_grad_sample_mode(probe)
    if mode == "hooks":  # no rule decides: a timing probe will, once the shape is known
        return PROBE, reason.removeprefix("hooks: ") + ", so a timing probe decides"
    return mode, reason
