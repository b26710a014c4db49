"""Central DP-SGD: reserve, read, train within budget, write model + receipt, settle.

The order of a run is the contract (DESIGN.md, Ledger: central releases):

1. the configuration and the model are validated (nothing else has happened);
2. (ε, δ) is reserved in the ledger for (subject, purpose) with an idempotency
   key; a refusal raises BudgetRefusedError and **no data is read**;
3. the data is read, the sample rate fixed, σ calibrated from the budget (or
   taken from the config), and the step limit that keeps ε within the
   reservation computed up front from the accountant;
4. training runs with Poisson sampling (Opacus DPDataLoader) and Opacus's
   per-sample clipping and noise; before each policy interval (default: one
   epoch) the accountant certifies the steps of that interval; the run stops
   at the step limit, before the budget could be exceeded;
5. model and receipt are written to temporary names, the spend (≤ reserved)
   is settled in the ledger (the rest is released), then the files are
   renamed into place.

The refund rule: the reservation is an atomic claim (a fresh owner token and a
lease, renewed before each interval). Right before the data is read, the run
records in the ledger that it opens the data (`Ledger.open_data`). A failure
before that mark (nothing read) cancels the reservation; any outcome after it -
success, a data or Opacus or accountant error, KeyboardInterrupt - settles it as
spent: what the accountant certifies for the released model on success, the
full reservation otherwise. A crash leaves it open and charged until an operator
settles it as spent. Failures remove the temporary files and raise
TrainingAbortedError: there is no fallback to non-private training and no
artifact. A second run with the same idempotency key never trains: it raises
ReservationTakenError.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
import platform
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from fedldp.aggregator.central.datakey import ALGORITHM, DataKey, DataKeyError
from fedldp.aggregator.central.datakey import load_data_key as read_data_key
from fedldp.aggregator.central.releases import CentralLedger
from fedldp.aggregator.central.signing import TRAINING_RECEIPT_TYPE, sign
from fedldp.aggregator.training.accounting import (
    AccountantError,
    BudgetAccountant,
    calibrate_noise,
    epsilon,
    prv_delta_error,
    within,
)
from fedldp.aggregator.training.config import (
    DataConfig,
    ModelConfig,
    ReceiptConfig,
    TrainConfig,
    TrainingConfigError,
)
from fedldp.aggregator.training.data import DataError, Dataset, load_dataset, redact_url
from fedldp.aggregator.training.models import (
    build_mlp,
    choose_grad_sample_mode,
    validate_model,
)
from fedldp.aggregator.training.randomness import StepRandomness
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.data_loader import DPDataLoader
from opacus.grad_sample import prepare_module
from opacus.optimizers import DPOptimizer, get_optimizer_class
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from opacus.utils.uniform_sampler import UniformWithReplacementSampler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

RECEIPT_SCHEMA = "fedldp.training-receipt/v1"
MODEL_FILE = "model.pt"
RECEIPT_FILE = "receipt.json"
# ε is charged to the ledger rounded up to this quantum (never below the bound).
SPEND_QUANTUM = Decimal("1e-12")
EVENT_KIND = "poisson_subsampled_gaussian"
#: Lease of a training run's claim, renewed before every certified interval.
TRAIN_LEASE_SECONDS = 3600


class BudgetRefusedError(RuntimeError):
    """The ledger refused the reservation: nothing was read, trained or written."""


class TrainingAbortedError(RuntimeError):
    """The run failed after reserving; no artifact was written. The reservation was
    cancelled if no data had been read, else settled as spent."""


class ReservationTakenError(BudgetRefusedError):
    """The idempotency key's reservation belongs to another run (open or closed): this run
    reads nothing and trains nothing."""


class PoissonSamplingError(ValueError):
    """A loader does not do the Poisson sampling the accountant assumes."""


class OutputExistsError(FileExistsError):
    """The output folder already holds a model or receipt; a release is never overwritten."""


@dataclass(frozen=True)
class TrainingResult:
    """A finished private run: where its files are and what it spent."""

    model_path: Path
    receipt_path: Path
    receipt: dict[str, Any]
    reservation_id: str
    steps: int
    stop_reason: str
    epsilon_spent: Decimal
    model: nn.Module
    overhead_seconds: float
    training_seconds: float
    # Seconds per part of the run outside the training loop: "reserve", "load", "probe"
    # (grad-sample timing probe, only when auto could not decide by rule),
    # "plan" (calibration + step limit), "checks" (per-interval accountant),
    # "final" (final ε per accountant), "write" (artifact + receipt), "settle".
    timings: dict[str, float] = field(default_factory=dict)


def _now() -> int:
    return int(time.time())


def library_versions() -> dict[str, str]:
    """Versions of everything that shapes the result (for the receipt)."""
    out = {"python": platform.python_version()}
    for name in ("fedldp", "torch", "opacus", "numpy", "scipy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


class _BatchTensorDataset(TensorDataset):
    """A TensorDataset that hands out a whole batch in one indexing operation.

    `__getitems__` (torch's batched fetch) returns a one-element list holding the
    batch, and `_take_batch` unwraps it; an empty index list yields zero-row
    tensors of the right shape, as Poisson sampling needs.
    """

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, ...]]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        return [tuple(t[idx] for t in self.tensors)]


def _take_batch(batch: list[tuple[torch.Tensor, ...]]) -> tuple[torch.Tensor, ...]:
    return batch[0]


def poisson_loader(
    features: torch.Tensor, labels: torch.Tensor, *, sample_rate: float, generator: torch.Generator
) -> DPDataLoader:
    """Opacus's DPDataLoader over the tensors: each row joins each batch independently
    with probability `sample_rate` (the sampled Gaussian mechanism's sampling)."""
    return DPDataLoader(
        _BatchTensorDataset(features, labels),
        sample_rate=sample_rate,
        collate_fn=_take_batch,
        generator=generator,
    )


def require_poisson_loader(loader: DataLoader[Any], sample_rate: float) -> None:
    """Refuse any loader whose batches are not Poisson samples at `sample_rate`.

    A fixed-batch or shuffled DataLoader makes the accountant's assumption false
    (its ε would not bound the run), so it raises PoissonSamplingError.
    """
    sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(loader, DPDataLoader) or not isinstance(
        sampler, UniformWithReplacementSampler
    ):
        raise PoissonSamplingError(
            "the loader does not do Poisson sampling (fixed-size or shuffled batches); "
            "the accountant assumes Poisson sampling, use opacus DPDataLoader"
        )
    if sampler.sample_rate != sample_rate or loader.sample_rate != sample_rate:
        raise PoissonSamplingError(
            f"the loader samples at rate {sampler.sample_rate}, the accountant at {sample_rate}"
        )


@dataclass
class PrivateStep:
    """One DP-SGD step with Opacus: per-sample clipping, Gaussian noise, update."""

    module: nn.Module
    optimizer: DPOptimizer
    criterion: Callable[[torch.Tensor, torch.Tensor], Any]

    def __call__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        loss = self.criterion(self.module(features), labels)
        loss.backward()
        self.optimizer.step()


def build_private_step(
    model: nn.Module,
    *,
    mode: str,
    expected_batch_size: int,
    max_grad_norm: float,
    noise_multiplier: float,
    optimizer: str,
    learning_rate: float,
    momentum: float,
    noise_generator: torch.Generator,
) -> PrivateStep:
    """Wrap `model` for DP-SGD in grad-sample `mode` ('hooks', 'ghost', 'functorch', 'ew').

    The optimizer is Opacus's flat-clipping DPOptimizer for the mode, with mean
    loss reduction over `expected_batch_size` (a constant, as post-processing of
    the noised sum requires), noise from `noise_generator`, and Opacus's
    secure_mode noise formula (randomness.py). Ghost clipping also wraps the loss
    (Opacus's DPLossFastGradientClipping: two backward passes).
    """
    model.train()
    gsm_kwargs: dict[str, Any] = {"batch_first": True, "loss_reduction": "mean"}
    if mode == "ghost":
        gsm_kwargs["max_grad_norm"] = max_grad_norm
    gsm = prepare_module(model, grad_sample_mode=mode, **gsm_kwargs)
    base: torch.optim.Optimizer
    if optimizer == "adam":
        base = torch.optim.Adam(model.parameters(), lr=learning_rate)
    else:
        base = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    opt_cls = get_optimizer_class(clipping="flat", distributed=False, grad_sample_mode=mode)
    dp_opt: DPOptimizer = opt_cls(
        optimizer=base,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size,
        loss_reduction="mean",
        generator=noise_generator,
        secure_mode=True,  # the floating-point-safe noise formula (randomness.py)
    )
    criterion: Callable[[torch.Tensor, torch.Tensor], Any]
    if mode == "ghost":
        criterion = DPLossFastGradientClipping(gsm, dp_opt, nn.CrossEntropyLoss(), "mean")
    else:
        criterion = nn.CrossEntropyLoss()
    return PrivateStep(gsm, dp_opt, criterion)


# Modes the timing probe compares. ew and functorch are never candidates: both fail
# on the empty batches Poisson sampling produces (see docs/training.md).
PROBE_MODES = ("ghost", "hooks")
PROBE_STEPS = 3  # timed steps per mode, after one warm-up step each
# Marker for "auto, to be decided by the probe once the feature shape is known".
_PROBE = "auto-probe"


def probe_grad_sample_mode(
    model: nn.Module,
    *,
    feature_shape: tuple[int, ...],
    num_classes: int,
    expected_batch_size: int,
    max_grad_norm: float,
    optimizer: str,
    learning_rate: float,
    momentum: float,
    steps: int = PROBE_STEPS,
) -> tuple[str, str, dict[str, float]]:
    """Time a few DP-SGD steps of each PROBE_MODES mode and return the fastest.

    Each mode runs on its own deep copy of `model` (the model itself is not
    touched) with **synthetic** data of the real shape — standard-normal features,
    uniform labels, from a fixed-seed generator — so the probe reads no protected
    data and is outside the privacy accounting. Steps are interleaved across the
    modes and each mode's median step time is compared. Returns (mode, reason,
    {mode: median seconds per step}).
    """
    gen = torch.Generator().manual_seed(0)
    xb = torch.randn((expected_batch_size, *feature_shape), generator=gen)
    yb = torch.randint(0, max(num_classes, 1), (expected_batch_size,), generator=gen)
    runners: dict[str, PrivateStep] = {}
    for mode in PROBE_MODES:
        runners[mode] = build_private_step(
            copy.deepcopy(model),
            mode=mode,
            expected_batch_size=expected_batch_size,
            max_grad_norm=max_grad_norm,
            noise_multiplier=1.0,
            optimizer=optimizer,
            learning_rate=learning_rate,
            momentum=momentum,
            noise_generator=torch.Generator().manual_seed(1),
        )
        runners[mode](xb, yb)  # warm-up
    times: dict[str, list[float]] = {m: [] for m in PROBE_MODES}
    for _ in range(steps):
        for mode, step in runners.items():
            t0 = time.perf_counter()
            step(xb, yb)
            times[mode].append(time.perf_counter() - t0)
    med = {m: float(np.median(v)) for m, v in times.items()}
    best = min(med, key=lambda m: med[m])
    detail = ", ".join(f"{m} {1000 * t:.1f} ms" for m, t in med.items())
    reason = (
        f"timing probe ({steps} synthetic steps per mode at batch {expected_batch_size}, "
        f"median per step: {detail}): {best} fastest"
    )
    return best, reason, med


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _spend(eps: float, budget: Decimal) -> Decimal:
    """ε as charged: rounded up to SPEND_QUANTUM, never above the reservation."""
    exact = Decimal(eps)
    if exact > budget:  # the caller certified eps ≤ budget; refuse to charge otherwise
        raise AccountantError("final epsilon exceeds the reservation")
    return min(exact.quantize(SPEND_QUANTUM, rounding=ROUND_CEILING), budget)


def load_data_key(receipt: ReceiptConfig) -> DataKey | None:
    """The secret data-digest key of the configuration (None: no data digest recorded)."""
    if receipt.data_digest_key is None:
        return None
    try:
        return read_data_key(receipt.data_digest_key)
    except DataKeyError as exc:
        raise TrainingConfigError(f"[receipt] data_digest_key: {exc}") from exc


def _data_description(
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


def _check_schema(dataset: Dataset, data: DataConfig) -> None:
    """The data read must fit the declared schema (features, labels in 0..num_classes-1);
    a mismatch fails the run after the read (charged) and names no value or row."""
    if data.features is not None and tuple(dataset.feature_names) != tuple(data.features):
        raise DataError("the data's feature columns are not [data] features")
    top = int(dataset.labels.max()) if dataset.n_rows else 0
    if data.num_classes is not None and top >= data.num_classes:
        raise DataError(
            f"a label lies outside 0..{data.num_classes - 1} "
            f"([data] num_classes = {data.num_classes}); the run is charged"
        )


def _probe_model(config: ModelConfig) -> nn.Module:
    # Layer types do not depend on the data's width: validate before reading anything.
    return build_mlp(config, num_features=1, num_classes=2)


def _publish(tmp: Path, final: Path) -> None:
    """Move `tmp` to `final` without ever replacing an existing file (hard link, then
    unlink); a concurrent release at the same path makes this raise OutputExistsError."""
    try:
        os.link(tmp, final)
    except FileExistsError as exc:
        raise OutputExistsError(f"{final} appeared during the run; not overwritten") from exc
    except OSError:  # no hard links on this filesystem
        if final.exists():
            raise OutputExistsError(f"{final} appeared during the run; not overwritten") from None
        os.replace(tmp, final)
        return
    tmp.unlink()


def _cleanup(paths: Sequence[Path]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


@dataclass
class _Plan:
    mechanism: str
    noise_multiplier: float
    calibrated: bool
    accountant: BudgetAccountant
    step_limit: int
    fallback_reason: str | None


def _plan(config: TrainConfig, *, sample_rate: float, planned_steps: int, mechanism: str) -> _Plan:
    budget = config.budget
    delta = float(budget.delta)
    sigma = config.training.noise_multiplier
    calibrated = sigma is None
    eps_planned: float | None = None
    if sigma is None:
        sigma, eps_planned = calibrate_noise(
            mechanism,
            target_epsilon=float(budget.epsilon),
            delta=delta,
            sample_rate=sample_rate,
            steps=planned_steps,
            eps_error=config.accountant.eps_error,
        )
    acct = BudgetAccountant(
        mechanism=mechanism,
        delta=delta,
        budget=budget.epsilon,
        sample_rate=sample_rate,
        noise_multiplier=sigma,
        eps_error=config.accountant.eps_error,
    )
    if eps_planned is not None:
        acct.remember(planned_steps, eps_planned)
    limit = acct.step_limit(planned_steps)
    acct.horizon = limit
    return _Plan(mechanism, sigma, calibrated, acct, limit, None)


def plan_with_fallback(config: TrainConfig, *, sample_rate: float, planned_steps: int) -> _Plan:
    """Calibrate and compute the step limit with the configured accountant; if PRV
    fails and fallback_to_rdp is set, redo both with RDP and record why."""
    try:
        return _plan(
            config,
            sample_rate=sample_rate,
            planned_steps=planned_steps,
            mechanism=config.accountant.kind,
        )
    except AccountantError as exc:
        if not config.accountant.fallback_to_rdp:
            raise
        plan = _plan(config, sample_rate=sample_rate, planned_steps=planned_steps, mechanism="rdp")
        plan.fallback_reason = str(exc)
        return plan


def _epsilons(
    history: list[tuple[float, float, int]], delta: float, eps_error: float, skip: str
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mech in ("prv", "rdp"):
        if mech == skip:
            continue
        try:
            out[mech] = epsilon(mech, history, delta, eps_error=eps_error)
        except AccountantError as exc:
            out[mech] = None
            out[f"{mech}_error"] = str(exc)
    return out


def train_private(
    config: TrainConfig,
    *,
    ledger: CentralLedger | None = None,
    model: nn.Module | None = None,
    load: Callable[[DataConfig], Dataset] = load_dataset,
    clock: Callable[[], int] = _now,
    log: Callable[[str], None] = lambda _msg: None,
) -> TrainingResult:
    """Run one central DP-SGD release (module docstring) and return its result.

    `model` replaces the built-in MLP (any nn.Module taking a (batch, features)
    float tensor and returning class logits). `ledger` defaults to
    open_ledger(config.budget.ledger). `load` reads the data (tests count calls).
    Raises TrainingConfigError/UnsupportedModelError/OutputExistsError before
    reserving, BudgetRefusedError when the ledger refuses, TrainingAbortedError
    after a cancelled run.
    """
    started = time.perf_counter()
    out_dir = config.output_dir
    model_path, receipt_path = out_dir / MODEL_FILE, out_dir / RECEIPT_FILE
    for p in (model_path, receipt_path):
        if p.exists():
            raise OutputExistsError(f"{p} exists; a released model is never overwritten")

    # 1. the model, validated before anything is reserved or read.
    fixed: tuple[str, ...] = ()
    custom = model is not None
    if model is not None:
        checked = validate_model(model, fix=config.model.fix_model)
        model, fixed = checked.module, checked.fixed
        probe = model
    else:
        probe_checked = validate_model(_probe_model(config.model), fix=config.model.fix_model)
        probe, fixed = probe_checked.module, probe_checked.fixed
    if config.training.grad_sample_mode == "auto":
        mode, mode_reason = choose_grad_sample_mode(probe)
        if mode == "hooks":  # no rule decides: a timing probe will, once the shape is known
            mode = _PROBE
            mode_reason = mode_reason.removeprefix("hooks: ") + ", so a timing probe decides"
    else:
        mode, mode_reason = config.training.grad_sample_mode, "set in the configuration"
    for change in fixed:
        log(f"fixed for DP-SGD: {change}")
    log(f"grad-sample mode: {mode_reason}")

    signing_key = load_signing_key(config.receipt)
    if load_data_key(config.receipt) is None:
        log("no [receipt] data_digest_key: no data digest is recorded")
    if signing_key is None:
        log("no [receipt] signing_key: the receipt will be unsigned, and verify refuses it")

    # 2. reserve before reading.
    own_ledger = ledger is None
    if ledger is None:
        import sqlalchemy as sa
        from fedldp.collector.ledger import open_ledger

        try:
            ledger = open_ledger(config.budget.ledger)
        except (sa.exc.SQLAlchemyError, OSError, ValueError) as exc:
            raise BudgetRefusedError(
                f"cannot open the ledger at {redact_url(config.budget.ledger)}: "
                f"{type(exc).__name__}"
            ) from exc
    try:
        return _reserved_run(
            config,
            ledger,
            model,
            custom,
            fixed,
            mode,
            mode_reason,
            load,
            clock,
            log,
            started,
            signing_key,
        )
    finally:
        if own_ledger:
            close = getattr(ledger, "close", None)
            if close is not None:
                close()


def load_signing_key(receipt: ReceiptConfig) -> Ed25519PrivateKey | None:
    """The receipt signing key of the configuration (None: unsigned receipts).

    Read before anything is reserved: a missing or unreadable key is a
    configuration error that changes nothing.
    """
    if receipt.signing_key is None:
        return None
    from fedldp.client.policy import KeyFileError, load_private_key

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


def _reserve(
    config: TrainConfig, ledger: CentralLedger, clock: Callable[[], int], owner: str
) -> Any:
    import sqlalchemy as sa
    from fedldp.collector.ledger import LedgerError

    budget = config.budget
    key = budget.idempotency_key or f"train-{uuid.uuid4().hex}"
    try:
        res = ledger.reserve(
            subject=budget.subject,
            purpose=budget.purpose,
            epsilon=budget.epsilon,
            delta=budget.delta,
            idempotency_key=key,
            now=clock(),
            metadata={"kind": "dp-sgd", "data_source": config.data.source},
            owner=owner,
            lease_seconds=TRAIN_LEASE_SECONDS,
        )
    except LedgerError as exc:
        raise BudgetRefusedError(f"the ledger refused the reservation: {exc}") from exc
    except sa.exc.SQLAlchemyError as exc:
        raise BudgetRefusedError(
            f"the ledger is unavailable ({type(exc).__name__}); nothing was reserved"
        ) from exc
    if not res.held_by(owner):
        state = (
            f"held by another run (lease until {res.lease_expires_at})"
            if res.status == "reserved"
            else res.status
        )
        raise ReservationTakenError(
            f"idempotency key {key!r} belongs to reservation {res.id}, which is {state}; "
            "a run never trains twice under one reservation: a new run needs a new key"
        )
    return res


def _reserved_run(
    config: TrainConfig,
    ledger: CentralLedger,
    model: nn.Module | None,
    custom: bool,
    fixed: tuple[str, ...],
    mode: str,
    mode_reason: str,
    load: Callable[[DataConfig], Dataset],
    clock: Callable[[], int],
    log: Callable[[str], None],
    started: float,
    signing_key: Ed25519PrivateKey | None,
) -> TrainingResult:
    t0 = time.perf_counter()
    owner = secrets.token_hex(16)
    reservation = _reserve(config, ledger, clock, owner)
    reserve_seconds = time.perf_counter() - t0
    log(
        f"reserved eps={config.budget.epsilon} delta={config.budget.delta} "
        f"(reservation {reservation.id})"
    )
    out_dir = config.output_dir
    suffix = f".tmp-{reservation.id}"
    tmp_model = out_dir / (MODEL_FILE + suffix)
    tmp_receipt = out_dir / (RECEIPT_FILE + suffix)
    access = _DataAccess(ledger, reservation.id, owner, clock)
    access.ledger_id = str(ledger.ledger_id())
    settled = False
    try:
        result = _train_and_write(
            config,
            reservation,
            model,
            custom,
            fixed,
            mode,
            mode_reason,
            load,
            log,
            tmp_model,
            tmp_receipt,
            started,
            access,
            signing_key,
        )
        spent = result.epsilon_spent
        t0 = time.perf_counter()
        ledger.settle(
            reservation.id,
            epsilon_spent=spent,
            delta_spent=Decimal(result.receipt["privacy"]["delta_spent"]),
            events=[training_event(result.receipt)],
            now=clock(),
            owner=owner,
        )
        settled = True
        result.timings["reserve"] = reserve_seconds
        result.timings["settle"] = time.perf_counter() - t0
        result = dataclasses.replace(
            result, overhead_seconds=time.perf_counter() - started - result.training_seconds
        )
        _publish(tmp_model, result.model_path)
        _publish(tmp_receipt, result.receipt_path)
        log(f"settled eps={spent} (reservation {reservation.id}); wrote {result.model_path}")
        return result
    except BaseException as exc:
        _cleanup([tmp_model, tmp_receipt])
        if settled:
            raise  # spent and nothing released: safe, but say so through the exception
        outcome = _close_failed_run(config, ledger, reservation.id, owner, access, exc, clock, log)
        if isinstance(exc, Exception):
            raise TrainingAbortedError(
                f"training aborted ({type(exc).__name__}: {exc}); reservation "
                f"{reservation.id} {outcome}, no model written"
            ) from exc
        raise


class _DataAccess:
    """The run's side of the refund rule: `open()` records in the ledger, durably and
    BEFORE the first read, that the protected data is being opened; `heartbeat()`
    renews the claim's lease while training runs."""

    def __init__(
        self, ledger: CentralLedger, reservation_id: str, owner: str, clock: Callable[[], int]
    ) -> None:
        self.ledger = ledger
        self.reservation_id = reservation_id
        self.owner = owner
        self.clock = clock
        self.opened = False
        self.ledger_id = ""

    def open(self) -> None:
        self.ledger.open_data(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=TRAIN_LEASE_SECONDS,
        )
        self.opened = True

    def heartbeat(self) -> None:
        self.ledger.renew_lease(
            self.reservation_id,
            owner=self.owner,
            now=self.clock(),
            lease_seconds=TRAIN_LEASE_SECONDS,
        )


def _close_failed_run(
    config: TrainConfig,
    ledger: CentralLedger,
    reservation_id: str,
    owner: str,
    access: _DataAccess,
    exc: BaseException,
    clock: Callable[[], int],
    log: Callable[[str], None],
) -> str:
    """Cancel (nothing read) or settle as spent (data opened); what happened, for messages.

    Whether the data was opened is asked of the ledger when unsure (open_data may have
    committed and then failed to answer): the ledger refuses to cancel an opened one.
    """
    from fedldp.collector.ledger import DataOpenedError

    try:
        if not access.opened:
            try:
                ledger.cancel(reservation_id, now=clock(), owner=owner)
                return "cancelled (no data was read)"
            except DataOpenedError:
                pass
        ledger.settle(
            reservation_id,
            epsilon_spent=config.budget.epsilon,
            delta_spent=config.budget.delta,
            events=(),
            now=clock(),
            owner=owner,
            reason=f"failed after the data was opened ({type(exc).__name__}); nothing released",
        )
        return "settled as spent (the data had been read)"
    except Exception as close_exc:  # the abort must still surface
        log(f"closing reservation {reservation_id} failed: {type(close_exc).__name__}")
        return "left open (charged) for an operator to settle"


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


def _train_and_write(
    config: TrainConfig,
    reservation: Any,
    model: nn.Module | None,
    custom: bool,
    fixed: tuple[str, ...],
    mode: str,
    mode_reason: str,
    load: Callable[[DataConfig], Dataset],
    log: Callable[[str], None],
    tmp_model: Path,
    tmp_receipt: Path,
    started: float,
    access: _DataAccess,
    signing_key: Ed25519PrivateKey | None,
) -> TrainingResult:
    tp = config.training
    delta = float(config.budget.delta)
    rand = StepRandomness(config.randomness.seed if config.randomness.source == "seeded" else None)
    if rand.seeded:
        assert config.randomness.seed is not None
        torch.manual_seed(config.randomness.seed)

    # 3. data, sample rate, noise, step limit.
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    access.open()  # durable BEFORE the first read: from here on nothing is refunded
    dataset = load(config.data)
    timings["load"] = time.perf_counter() - t0
    _check_schema(dataset, config.data)
    assert config.data.num_classes is not None  # TrainConfig requires it
    num_classes = config.data.num_classes
    q = config.sample_rate  # from the configuration alone, never from the data's row count
    steps_per_epoch = int(1 / q)  # DPDataLoader's epoch length (UniformWithReplacementSampler)
    planned = tp.epochs * steps_per_epoch
    t0 = time.perf_counter()
    plan = plan_with_fallback(config, sample_rate=q, planned_steps=planned)
    timings["plan"] = time.perf_counter() - t0
    if plan.fallback_reason:
        log(f"PRV failed ({plan.fallback_reason}); using RDP as configured")
    if plan.step_limit == 0:
        raise AccountantError(
            f"with noise multiplier {plan.noise_multiplier} not even one step fits in the budget"
        )
    log(
        f"q={q:.6g} sigma={plan.noise_multiplier:.6g} "
        f"steps planned={planned} limit={plan.step_limit} ({plan.mechanism})"
    )
    check_every = tp.check_every_steps or steps_per_epoch

    # 4. model and Opacus objects.
    if model is None:
        built = build_mlp(config.model, len(config.data.features or ()), num_classes)
        model = validate_model(built, fix=config.model.fix_model).module
    if mode == _PROBE:
        t0 = time.perf_counter()
        mode, probe_reason, _ = probe_grad_sample_mode(
            model,
            feature_shape=tuple(dataset.features.shape[1:]),
            num_classes=num_classes,
            expected_batch_size=max(1, round(config.expected_batch_size)),
            max_grad_norm=tp.max_grad_norm,
            optimizer=tp.optimizer,
            learning_rate=tp.learning_rate,
            momentum=tp.momentum,
        )
        timings["probe"] = time.perf_counter() - t0
        mode_reason = f"{mode_reason}: {probe_reason}"
        log(f"grad-sample mode: {mode_reason}")
    private = build_private_step(
        model,
        mode=mode,
        expected_batch_size=max(1, round(config.expected_batch_size)),
        max_grad_norm=tp.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        optimizer=tp.optimizer,
        learning_rate=tp.learning_rate,
        momentum=tp.momentum,
        noise_generator=rand.noise,
    )
    recorder = PRVAccountant() if plan.mechanism == "prv" else RDPAccountant()
    private.optimizer.attach_step_hook(recorder.get_optimizer_hook_fn(sample_rate=q))
    loader = poisson_loader(
        torch.from_numpy(dataset.features),
        torch.from_numpy(dataset.labels),
        sample_rate=q,
        generator=rand.sampling,
    )
    require_poisson_loader(loader, q)

    # 5. the loop: certify each interval before running it; stop at the limit.
    # (A worker thread for the next interval's certificate was tried and made runs
    # slower: the accountants' RDP series are pure Python and hold the GIL.)
    limit, steps, certified = plan.step_limit, 0, 0
    stop_reason = "completed" if limit == planned else "budget"
    acct_seconds = 0.0
    train_started = time.perf_counter()
    while steps < limit:
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(loader)
        for _ in range(len(loader)):
            if steps >= limit:
                break
            if steps == certified:
                t0 = time.perf_counter()
                access.heartbeat()
                target = min(steps + check_every, limit)
                # the optimizer's own record must be a prefix of the certified plan
                done = [(float(a), float(b), int(c)) for a, b, c in recorder.history]
                if done != ([(plan.noise_multiplier, q, steps)] if steps else []):
                    raise AccountantError(
                        f"the optimizer's accountant history {done} is not the plan's "
                        f"({plan.noise_multiplier}, {q}, {steps})"
                    )
                if not within(plan.accountant.certify(target), config.budget.epsilon):
                    limit = plan.accountant.step_limit(target)
                    stop_reason = "budget"
                    target = limit
                certified = target
                acct_seconds += time.perf_counter() - t0
                if steps >= limit:
                    break
            rand.reseed()
            xb, yb = next(batches)
            private(xb, yb)
            steps += 1
    train_seconds = time.perf_counter() - train_started - acct_seconds
    history = [(float(s), float(r), int(t)) for s, r, t in recorder.history]
    if history != [(plan.noise_multiplier, q, steps)]:
        raise AccountantError(
            f"the optimizer's accountant history {history} does not match the plan "
            f"({plan.noise_multiplier}, {q}, {steps})"
        )

    # 6. the bound, the artifact, the receipt.
    timings["checks"] = acct_seconds
    t0 = time.perf_counter()
    eps_used = plan.accountant.epsilon_at(steps)
    if not within(eps_used, config.budget.epsilon):
        raise AccountantError("the final epsilon exceeds the reservation")
    spent = _spend(eps_used, config.budget.epsilon)
    per_acct = _epsilons(history, delta, config.accountant.eps_error, skip=plan.mechanism)
    per_acct[plan.mechanism] = eps_used
    trained: nn.Module = getattr(private.module, "_module", model)
    timings["final"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    tmp_model.parent.mkdir(parents=True, exist_ok=True)
    torch.save(trained.state_dict(), tmp_model)
    artifact_digest = _sha256(tmp_model)
    model_desc: dict[str, Any]
    if not custom:
        model_desc = {
            "kind": "mlp",
            "hidden": list(config.model.hidden),
            "activation": config.model.activation,
            "norm": config.model.norm,
            "num_features": dataset.num_features,
            "num_classes": num_classes,
        }
    else:
        model_desc = {
            "kind": "custom",
            "class": f"{type(trained).__module__}.{type(trained).__qualname__}",
        }
    model_desc.update(
        {
            "fixed": list(fixed),
            "artifact": MODEL_FILE,
            "artifact_sha256": artifact_digest,
            "format": "torch.save(state_dict)",
        }
    )
    receipt: dict[str, Any] = {
        "schema": RECEIPT_SCHEMA,
        "libraries": library_versions(),
        "dataset": _data_description(config.data, dataset, load_data_key(config.receipt)),
        "privacy": {
            "unit": config.data.privacy_unit,
            "mechanism": "DP-SGD: Poisson-subsampled Gaussian (Abadi et al. 2016)",
            "epsilon_budget": str(config.budget.epsilon),
            "delta": str(config.budget.delta),
            "epsilon_spent": str(spent),
            "delta_spent": str(config.budget.delta if steps else Decimal(0)),
            "accountant": {
                "requested": config.accountant.kind,
                "used": plan.mechanism,
                "fallback_reason": plan.fallback_reason,
                "prv_eps_error": config.accountant.eps_error,
                "prv_delta_error": prv_delta_error(delta),
                "rdp_orders": "opacus RDPAccountant.DEFAULT_ALPHAS",
                "state": {"mechanism": plan.mechanism, "history": [list(h) for h in history]},
            },
            "epsilon": per_acct,
        },
        "training": {
            "declared_rows": config.data.rows,
            "sample_rate": q,
            "expected_batch_size": config.expected_batch_size,
            "steps": steps,
            "planned_steps": planned,
            "step_limit": plan.step_limit,
            "stop_reason": stop_reason,
            "epochs": tp.epochs,
            "noise_multiplier": plan.noise_multiplier,
            "noise_calibrated": plan.calibrated,
            "max_grad_norm": tp.max_grad_norm,
            "clipping": "flat, per sample",
            "optimizer": tp.optimizer,
            "learning_rate": tp.learning_rate,
            "momentum": tp.momentum,
            "grad_sample_mode": {"mode": mode, "reason": mode_reason},
            "check_every_steps": check_every,
            "accountant_queries": plan.accountant.queries,
            "accountant_cached_checks": plan.accountant.cached_checks,
        },
        "randomness": rand.describe(),
        "model": model_desc,
        "ledger": {
            "ledger_id": access.ledger_id,
            "reservation_id": reservation.id,
            "owner": access.owner,
            "subject": config.budget.subject,
            "purpose": config.budget.purpose,
            "idempotency_key": reservation.idempotency_key,
            "epsilon_reserved": str(config.budget.epsilon),
            "delta_reserved": str(config.budget.delta),
        },
        "for_release": not rand.seeded,
    }
    document: dict[str, Any] = (
        receipt if signing_key is None else sign(TRAINING_RECEIPT_TYPE, receipt, signing_key)
    )
    tmp_receipt.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    timings["write"] = time.perf_counter() - t0
    total = time.perf_counter() - started
    return TrainingResult(
        model_path=config.output_dir / MODEL_FILE,
        receipt_path=config.output_dir / RECEIPT_FILE,
        receipt=receipt,
        reservation_id=reservation.id,
        steps=steps,
        stop_reason=stop_reason,
        epsilon_spent=spent,
        model=trained,
        overhead_seconds=max(0.0, total - train_seconds),
        timings=timings,
        training_seconds=train_seconds,
    )


def train_nonprivate_baseline(
    model: nn.Module,
    features: np.ndarray[Any, Any],
    labels: np.ndarray[Any, Any],
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    generator: torch.Generator | None = None,
) -> nn.Module:
    """Train `model` WITHOUT privacy, in memory, for reference figures only.

    Used by the digits example, the membership audit and the benchmark as the
    non-private comparison; it never writes an artifact and is never a fallback
    of train_private.
    """
    x = torch.as_tensor(features, dtype=torch.float32)
    y = torch.as_tensor(labels, dtype=torch.long)
    loader = DataLoader(
        _BatchTensorDataset(x, y),
        batch_size=batch_size,
        shuffle=True,
        collate_fn=_take_batch,
        generator=generator,
    )
    opt: torch.optim.Optimizer
    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=learning_rate)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    for _ in range(epochs):
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
    return model
