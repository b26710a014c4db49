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

With `nproc` > 1 (distributed.py) this process is rank 0: it alone does all of
the above; the other ranks, started before the data is opened, only train
their shards of each step under the same plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import torch
from fedldp.aggregator.central.reservations import CentralLedger, Reservation
from fedldp.aggregator.training.accounting import AccountantError, within
from fedldp.aggregator.training.config import DataConfig, TrainConfig
from fedldp.aggregator.training.data import DataError, Dataset, load_dataset
from fedldp.aggregator.training.distributed import ProcessGroup, WorkerSpec, launch
from fedldp.aggregator.training.errors import (
    BudgetRefusedError,
    DistributedError,
    OutputExistsError,
    PoissonSamplingError,
    ReservationTakenError,
    TrainingAbortedError,
)
from fedldp.aggregator.training.lifecycle import (
    TRAIN_LEASE_SECONDS,
    claim_run,
    close_failed_run,
    publish,
    remove_files,
    run_ledger,
)
from fedldp.aggregator.training.models import build_mlp, validate_model
from fedldp.aggregator.training.plan import (
    SPEND_QUANTUM,
    Plan,
    other_epsilons,
    plan_with_fallback,
    spend_of,
)
from fedldp.aggregator.training.publish import (
    EVENT_KIND,
    MODEL_FILE,
    RECEIPT_FILE,
    RECEIPT_SCHEMA,
    TrainedRun,
    build_receipt,
    library_versions,
    training_event,
    write_model,
    write_receipt,
)
from fedldp.aggregator.training.randomness import StepRandomness
from fedldp.aggregator.training.request import (
    TrainingRequest,
    load_data_key,
    load_signing_key,
)
from fedldp.aggregator.training.step import (
    PROBE,
    PROBE_MODES,
    LoopOutcome,
    PrivateStep,
    _BatchTensorDataset,
    _take_batch,
    build_private_step,
    poisson_loader,
    probe_grad_sample_mode,
    require_poisson_loader,
    run_steps,
)
from fedldp.client.policy.envelope import key_id_of
from opacus.accountants import PRVAccountant, RDPAccountant
from torch import nn
from torch.utils.data import DataLoader

__all__ = [
    "EVENT_KIND",
    "MODEL_FILE",
    "PROBE_MODES",
    "RECEIPT_FILE",
    "RECEIPT_SCHEMA",
    "SPEND_QUANTUM",
    "TRAIN_LEASE_SECONDS",
    "BudgetRefusedError",
    "DistributedError",
    "OutputExistsError",
    "PoissonSamplingError",
    "PrivateStep",
    "ReservationTakenError",
    "TrainingAbortedError",
    "TrainingRequest",
    "TrainingResult",
    "build_private_step",
    "library_versions",
    "load_data_key",
    "load_signing_key",
    "plan_with_fallback",
    "poisson_loader",
    "probe_grad_sample_mode",
    "require_poisson_loader",
    "run_request",
    "train_nonprivate_baseline",
    "train_private",
    "training_event",
]


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


def train_private(
    config: TrainConfig,
    *,
    ledger: CentralLedger | None = None,
    model: nn.Module | None = None,
    load: Callable[[DataConfig], Dataset] = load_dataset,
    clock: Callable[[], int] = _now,
    log: Callable[[str], None] = lambda _msg: None,
    nproc: int = 1,
) -> TrainingResult:
    """Run one central DP-SGD release (module docstring) and return its result.

    `model` replaces the built-in MLP (any nn.Module taking a (batch, features)
    float tensor and returning class logits; picklable when nproc > 1). `ledger`
    defaults to open_ledger(config.budget.ledger). `load` reads the data (tests
    count calls; only this process calls it). `nproc` > 1 trains across that many
    processes (distributed.py) under the same plan, reservation and receipt.
    Raises TrainingConfigError/UnsupportedModelError/OutputExistsError/
    DistributedError before reserving, BudgetRefusedError when the ledger refuses,
    TrainingAbortedError after a cancelled run.
    """
    request = TrainingRequest.prepare(
        config, model=model, load=load, clock=clock, log=log, nproc=nproc
    )
    return run_request(request, ledger=ledger)


def run_request(request: TrainingRequest, *, ledger: CentralLedger | None = None) -> TrainingResult:
    """Carry out a prepared request: reserve, train, write, settle, publish (module
    docstring); `ledger` defaults to the configured one, opened and closed here."""
    with run_ledger(request.config, ledger) as led:
        return _reserved_run(request, led)


def _reserved_run(request: TrainingRequest, ledger: CentralLedger) -> TrainingResult:
    """Reserve, then train and write under the claim; settle and publish, or close the
    claim by the refund rule on any failure."""
    config, log = request.config, request.log
    # The plan depends on the configuration alone: an impossible one (PRV out of
    # memory, not one step within the budget) is refused before anything is reserved.
    schedule = _Schedule.of(config)
    t0 = time.perf_counter()
    plan = _make_plan(request, schedule)
    plan_seconds = time.perf_counter() - t0
    t0 = time.perf_counter()
    key_id = "" if request.signing_key is None else key_id_of(request.signing_key.public_key())
    claim = claim_run(config, ledger, request.clock, receipt_key_id=key_id)
    reserve_seconds = time.perf_counter() - t0
    log(
        f"reserved eps={config.budget.epsilon} delta={config.budget.delta} "
        f"(reservation {claim.reservation_id})"
    )
    suffix = f".tmp-{claim.reservation_id}"
    tmp_model = config.output_dir / (MODEL_FILE + suffix)
    tmp_receipt = config.output_dir / (RECEIPT_FILE + suffix)
    settled = False
    try:
        with _ranks(request.nproc) as group:
            result = _train_and_write(
                request, claim, group, tmp_model, tmp_receipt, (schedule, plan, plan_seconds)
            )
        t0 = time.perf_counter()
        claim.settle(
            result.epsilon_spent,
            Decimal(result.receipt["privacy"]["delta_spent"]),
            [training_event(result.receipt)],
        )
        settled = True
        result.timings["reserve"] = reserve_seconds
        result.timings["settle"] = time.perf_counter() - t0
        result = dataclasses.replace(
            result,
            overhead_seconds=time.perf_counter() - request.started - result.training_seconds,
        )
        publish(tmp_model, result.model_path)
        publish(tmp_receipt, result.receipt_path)
        log(
            f"settled eps={result.epsilon_spent} (reservation {claim.reservation_id}); "
            f"wrote {result.model_path}"
        )
        return result
    except BaseException as exc:
        # The refund rule first: a failed cleanup must never leave the claim open.
        outcome = None if settled else close_failed_run(claim, exc, log)
        _remove_temporaries([tmp_model, tmp_receipt], log)
        if outcome is None:
            raise  # spent and nothing released: safe, but say so through the exception
        if isinstance(exc, Exception):
            raise TrainingAbortedError(
                f"training aborted ({type(exc).__name__}: {exc}); reservation "
                f"{claim.reservation_id} {outcome}, no model written"
            ) from exc
        raise


def _remove_temporaries(paths: list[Path], log: Callable[[str], None]) -> None:
    """Remove a failed run's temporary files; a removal that fails (EISDIR, EROFS,
    EIO, EACCES) is logged and never hides the run's own failure."""
    try:
        remove_files(paths)
    except OSError as exc:
        log(f"removing the run's temporary files failed ({type(exc).__name__}: {exc})")


@contextlib.contextmanager
def _ranks(nproc: int) -> Any:
    """No group for one process; else the started group of `nproc` (distributed.launch)."""
    if nproc == 1:
        yield None
        return
    with launch(nproc) as group:
        yield group


def _read(request: TrainingRequest, claim: Reservation) -> Dataset:
    """Mark the data opened (durable, before the first read), read it, check its schema."""
    claim.open_data()  # from here on nothing is refunded
    dataset = request.load(request.config.data)
    check_schema(dataset, request.config.data)
    return dataset


def check_schema(dataset: Dataset, data: DataConfig) -> None:
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


@dataclass(frozen=True)
class _Schedule:
    """The sampling schedule, from the configuration alone (never the data's row count)."""

    sample_rate: float
    planned: int
    check_every: int

    @classmethod
    def of(cls, config: TrainConfig) -> _Schedule:
        q = config.sample_rate
        steps_per_epoch = int(1 / q)  # DPDataLoader's epoch length (UniformWithReplacementSampler)
        return cls(
            q,
            config.training.epochs * steps_per_epoch,
            config.training.check_every_steps or steps_per_epoch,
        )


def _make_plan(request: TrainingRequest, schedule: _Schedule) -> Plan:
    plan = plan_with_fallback(
        request.config, sample_rate=schedule.sample_rate, planned_steps=schedule.planned
    )
    if plan.fallback_reason:
        request.log(f"PRV failed ({plan.fallback_reason}); using RDP as configured")
    if plan.step_limit == 0:
        raise AccountantError(
            f"with noise multiplier {plan.noise_multiplier} not even one step fits in the budget"
        )
    request.log(
        f"q={schedule.sample_rate:.6g} sigma={plan.noise_multiplier:.6g} "
        f"steps planned={schedule.planned} limit={plan.step_limit} ({plan.mechanism})"
    )
    return plan


def _model_and_mode(
    request: TrainingRequest, dataset: Dataset, timings: dict[str, float]
) -> tuple[nn.Module, str, str]:
    """The model to train (the caller's, or the configured MLP at the data's width) and
    the grad-sample mode (the timing probe's choice when auto left it open)."""
    config, tp = request.config, request.config.training
    assert config.data.num_classes is not None  # TrainConfig requires it
    model = request.model
    if model is None:
        built = build_mlp(config.model, len(config.data.features or ()), config.data.num_classes)
        model = validate_model(built, fix=config.model.fix_model).module
    mode, reason = request.mode, request.mode_reason
    if mode == PROBE:
        t0 = time.perf_counter()
        mode, probe_reason, _ = probe_grad_sample_mode(
            model,
            feature_shape=tuple(dataset.features.shape[1:]),
            num_classes=config.data.num_classes,
            expected_batch_size=_batch(config),
            max_grad_norm=tp.max_grad_norm,
            optimizer=tp.optimizer,
            learning_rate=tp.learning_rate,
            momentum=tp.momentum,
        )
        timings["probe"] = time.perf_counter() - t0
        reason = f"{reason}: {probe_reason}"
        request.log(f"grad-sample mode: {reason}")
    return model, mode, reason


def _batch(config: TrainConfig) -> int:
    return max(1, round(config.expected_batch_size))


def _certifier(
    request: TrainingRequest, claim: Reservation, plan: Plan, q: float, recorder: Any
) -> Callable[[int, int], int]:
    """The check before each interval: renew the lease, require the optimizer's own
    accountant history to be the certified plan so far, certify the interval's end."""

    def certify(steps: int, target: int) -> int:
        claim.renew()
        done = [(float(a), float(b), int(c)) for a, b, c in recorder.history]
        if done != ([(plan.noise_multiplier, q, steps)] if steps else []):
            raise AccountantError(
                f"the optimizer's accountant history {done} is not the plan's "
                f"({plan.noise_multiplier}, {q}, {steps})"
            )
        if not within(plan.accountant.certify(target), request.config.budget.epsilon):
            return plan.accountant.step_limit(target)
        return target

    return certify


def _worker_spec(
    request: TrainingRequest,
    plan: Plan,
    schedule: _Schedule,
    model: nn.Module,
    mode: str,
    features: torch.Tensor,
    labels: torch.Tensor,
    rand: StepRandomness,
) -> WorkerSpec:
    """What the other ranks need: the model before wrapping, the rows, the plan."""
    tp = request.config.training
    return WorkerSpec(
        model=model,
        features=features,
        labels=labels,
        mode=mode,
        expected_batch_size=_batch(request.config),
        max_grad_norm=tp.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        optimizer=tp.optimizer,
        learning_rate=tp.learning_rate,
        momentum=tp.momentum,
        sample_rate=schedule.sample_rate,
        limit=plan.step_limit,
        planned=schedule.planned,
        check_every=schedule.check_every,
        seed=request.config.randomness.seed if rand.seeded else None,
    )


def _train(
    request: TrainingRequest,
    claim: Reservation,
    group: ProcessGroup | None,
    plan: Plan,
    schedule: _Schedule,
    model: nn.Module,
    mode: str,
    dataset: Dataset,
    rand: StepRandomness,
) -> tuple[LoopOutcome, list[tuple[float, float, int]]]:
    """Rank 0's training (the only rank when `group` is None); returns the loop's outcome
    and the optimizer's accountant history (the steps actually taken)."""
    tp, q = request.config.training, schedule.sample_rate
    features = torch.from_numpy(dataset.features)
    labels = torch.from_numpy(dataset.labels)
    if group is not None:
        group.share(_worker_spec(request, plan, schedule, model, mode, features, labels, rand))
    private = build_private_step(
        model,
        mode=mode,
        expected_batch_size=_batch(request.config),
        max_grad_norm=tp.max_grad_norm,
        noise_multiplier=plan.noise_multiplier,
        optimizer=tp.optimizer,
        learning_rate=tp.learning_rate,
        momentum=tp.momentum,
        noise_generator=rand.noise,
        distributed=group is not None,
    )
    recorder = PRVAccountant() if plan.mechanism == "prv" else RDPAccountant()
    private.optimizer.attach_step_hook(recorder.get_optimizer_hook_fn(sample_rate=q))
    loader = poisson_loader(
        features, labels, sample_rate=q, generator=rand.sampling, distributed=group is not None
    )
    require_poisson_loader(loader, q)
    certify = _certifier(request, claim, plan, q, recorder)
    outcome = run_steps(
        private,
        loader,
        limit=plan.step_limit,
        planned=schedule.planned,
        check_every=schedule.check_every,
        certify=certify if group is None else group.lead(certify),
        reseed=rand.reseed,
    )
    history = [(float(s), float(r), int(t)) for s, r, t in recorder.history]
    if history != [(plan.noise_multiplier, q, outcome.steps)]:
        raise AccountantError(
            f"the optimizer's accountant history {history} does not match the plan "
            f"({plan.noise_multiplier}, {q}, {outcome.steps})"
        )
    return outcome, history


def _train_and_write(
    request: TrainingRequest,
    claim: Reservation,
    group: ProcessGroup | None,
    tmp_model: Path,
    tmp_receipt: Path,
    planned: tuple[_Schedule, Plan, float],
) -> TrainingResult:
    """Read, train and write the model and receipt to their temporary names, on the
    plan made before reserving (`planned`: schedule, plan, seconds it took)."""
    config = request.config
    rand = StepRandomness(config.randomness.seed if config.randomness.source == "seeded" else None)
    if rand.seeded:
        assert config.randomness.seed is not None
        torch.manual_seed(config.randomness.seed)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    dataset = _read(request, claim)
    timings["load"] = time.perf_counter() - t0
    schedule, plan, timings["plan"] = planned
    model, mode, mode_reason = _model_and_mode(request, dataset, timings)
    outcome, history = _train(request, claim, group, plan, schedule, model, mode, dataset, rand)
    timings["checks"] = outcome.check_seconds
    t0 = time.perf_counter()
    eps_used = plan.accountant.epsilon_at(outcome.steps)
    if not within(eps_used, config.budget.epsilon):
        raise AccountantError("the final epsilon exceeds the reservation")
    spent = spend_of(eps_used, config.budget.epsilon)
    epsilons = other_epsilons(
        history, float(config.budget.delta), config.accountant.eps_error, skip=plan.mechanism
    )
    epsilons[plan.mechanism] = eps_used
    timings["final"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    run = TrainedRun(
        config=config,
        dataset=dataset,
        data_key=request.data_key,
        model=model,
        custom=request.custom,
        fixed=request.fixed,
        plan=plan,
        sample_rate=schedule.sample_rate,
        planned_steps=schedule.planned,
        check_every=schedule.check_every,
        steps=outcome.steps,
        stop_reason=outcome.stop_reason,
        history=history,
        mode=mode,
        mode_reason=mode_reason,
        randomness=rand.describe(),
        seeded=rand.seeded,
        processes=request.nproc,
    )
    receipt = build_receipt(
        run, claim, spent=spent, epsilons=epsilons, artifact_sha256=write_model(model, tmp_model)
    )
    write_receipt(receipt, tmp_receipt, request.signing_key)
    timings["write"] = time.perf_counter() - t0
    total = time.perf_counter() - request.started
    return TrainingResult(
        model_path=config.output_dir / MODEL_FILE,
        receipt_path=config.output_dir / RECEIPT_FILE,
        receipt=receipt,
        reservation_id=claim.reservation_id,
        steps=outcome.steps,
        stop_reason=outcome.stop_reason,
        epsilon_spent=spent,
        model=model,
        overhead_seconds=max(0.0, total - outcome.train_seconds),
        timings=timings,
        training_seconds=outcome.train_seconds,
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
