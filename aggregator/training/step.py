"""The Opacus side of DP-SGD: Poisson loaders, one private step, the certified loop.

Nothing here touches the ledger or writes a file: engine.py hands the loop a
`certify` callback (the accountant's check before each interval) and publishes
what the loop trained. With `distributed=True` the same objects run on every
rank of a torch.distributed group (distributed.py): Opacus's
DifferentiallyPrivateDistributedDataParallel (DPDDP) and DistributedDPOptimizer,
and a Poisson sampler over each rank's shard of the rows.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from fedldp.aggregator.training.errors import PoissonSamplingError
from opacus.data_loader import DPDataLoader
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel
from opacus.grad_sample import prepare_module
from opacus.optimizers import DPOptimizer, get_optimizer_class
from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping
from opacus.utils.uniform_sampler import (
    DistributedUniformWithReplacementSampler,
    UniformWithReplacementSampler,
)
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Modes the timing probe compares. ew and functorch are never candidates: both fail
# on the empty batches Poisson sampling produces (see docs/training.md).
PROBE_MODES = ("ghost", "hooks")
PROBE_STEPS = 3  # timed steps per mode, after one warm-up step each
#: Marker for "auto, to be decided by the probe once the feature shape is known".
PROBE = "auto-probe"


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


class ShardPoissonSampler(DistributedUniformWithReplacementSampler):  # type: ignore[misc]
    """Opacus's distributed Poisson sampler, but every step yields a batch, empty or not.

    Opacus 1.6's `DistributedUniformWithReplacementSampler` splits the rows among the
    ranks (a fixed, data-independent permutation) and samples each row of a rank's
    shard with probability q, so every row joins a step's global batch independently
    with probability q, as the accountant assumes. But it *skips* a step whose local
    batch is empty, so the ranks would fall out of step (one rank's step k meets
    another's step k+1 in the all-reduce). Here an empty local batch is yielded like
    any other and the rank takes part in the step with zero rows.
    """

    def __iter__(self) -> Iterator[list[int]]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.shuffle_seed + self.epoch)
            indices = torch.randperm(self.total_size, generator=g)
        else:
            indices = torch.arange(self.total_size)
        shard = indices[self.rank : self.total_size : self.num_replicas]
        for _ in range(self.num_batches):
            mask = torch.rand(self.num_samples, generator=self.generator) < self.sample_rate
            yield shard[mask.nonzero(as_tuple=False).reshape(-1)].tolist()


class ShardPoissonLoader(DPDataLoader):  # type: ignore[misc]
    """A DPDataLoader over this rank's shard with ShardPoissonSampler (see there)."""

    def __init__(
        self, dataset: _BatchTensorDataset, *, sample_rate: float, generator: torch.Generator
    ) -> None:
        self.sample_rate = sample_rate
        self.distributed = True
        DataLoader.__init__(
            self,
            dataset,
            batch_sampler=ShardPoissonSampler(
                total_size=len(dataset), sample_rate=sample_rate, generator=generator
            ),
            collate_fn=_take_batch,
        )


def poisson_loader(
    features: torch.Tensor,
    labels: torch.Tensor,
    *,
    sample_rate: float,
    generator: torch.Generator,
    distributed: bool = False,
) -> DPDataLoader:
    """Opacus's DPDataLoader over the tensors: each row joins each batch independently
    with probability `sample_rate` (the sampled Gaussian mechanism's sampling). With
    `distributed`, this rank's share of that batch (ShardPoissonLoader)."""
    dataset = _BatchTensorDataset(features, labels)
    if distributed:
        return ShardPoissonLoader(dataset, sample_rate=sample_rate, generator=generator)
    return DPDataLoader(
        dataset, sample_rate=sample_rate, collate_fn=_take_batch, generator=generator
    )


def require_poisson_loader(loader: DataLoader[Any], sample_rate: float) -> None:
    """Refuse any loader whose batches are not Poisson samples at `sample_rate`.

    A fixed-batch or shuffled DataLoader makes the accountant's assumption false
    (its ε would not bound the run), and Opacus's own distributed sampler skips
    empty local batches (ShardPoissonSampler), so each raises PoissonSamplingError.
    """
    sampler = getattr(loader, "batch_sampler", None)
    if not isinstance(loader, DPDataLoader) or not isinstance(
        sampler, (UniformWithReplacementSampler, ShardPoissonSampler)
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
    distributed: bool = False,
) -> PrivateStep:
    """Wrap `model` for DP-SGD in grad-sample `mode` ('hooks', 'ghost', 'functorch', 'ew').

    The optimizer is Opacus's flat-clipping DPOptimizer for the mode, with mean
    loss reduction over `expected_batch_size` (a constant, as post-processing of
    the noised sum requires), noise from `noise_generator`, and Opacus's
    secure_mode noise formula (randomness.py). Ghost clipping also wraps the loss
    (Opacus's DPLossFastGradientClipping: two backward passes).

    With `distributed` (inside a torch.distributed group of W ranks) the model is
    wrapped in Opacus's DPDDP (rank 0's parameters are broadcast) and the optimizer
    is Opacus's DistributedDPOptimizer for the mode: each rank clips its own rows,
    **only rank 0 adds the noise N(0, σ²C²)**, each rank scales by the per-rank
    expected batch `expected_batch_size / W`, and the all-reduced sum is divided by
    W — so the update is (Σ clipped + one noise draw) / expected_batch_size, the
    single-process step (Opacus's `make_private` sets the per-worker batch the same
    way).
    """
    model.train()
    world = torch.distributed.get_world_size() if distributed else 1
    target: nn.Module = (
        DifferentiallyPrivateDistributedDataParallel(model) if distributed else model
    )
    gsm_kwargs: dict[str, Any] = {"batch_first": True, "loss_reduction": "mean"}
    if mode == "ghost":
        gsm_kwargs["max_grad_norm"] = max_grad_norm
    gsm = prepare_module(target, grad_sample_mode=mode, **gsm_kwargs)
    base: torch.optim.Optimizer
    if optimizer == "adam":
        base = torch.optim.Adam(model.parameters(), lr=learning_rate)
    else:
        base = torch.optim.SGD(model.parameters(), lr=learning_rate, momentum=momentum)
    opt_cls = get_optimizer_class(clipping="flat", distributed=distributed, grad_sample_mode=mode)
    dp_opt: DPOptimizer = opt_cls(
        optimizer=base,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=expected_batch_size / world if distributed else expected_batch_size,
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


@dataclass(frozen=True)
class LoopOutcome:
    """How far the loop got and where its time went (accountant checks apart)."""

    steps: int
    stop_reason: str  # "completed" (all planned steps) or "budget" (stopped at the limit)
    train_seconds: float
    check_seconds: float


def run_steps(
    step: PrivateStep,
    loader: DPDataLoader,
    *,
    limit: int,
    planned: int,
    check_every: int,
    certify: Callable[[int, int], int],
    reseed: Callable[[], None],
) -> LoopOutcome:
    """Run DP-SGD steps over `loader`'s Poisson batches up to the step `limit`.

    Before each policy interval `certify(steps_done, interval_end)` is called and
    returns the end it certifies: `interval_end`, or less when the accountant says
    the budget ends earlier (the limit shrinks to it, stop reason "budget").
    `reseed()` runs before every step (fresh sampling and noise seeds). Every rank
    of a multi-process run calls this with the same limit and interval, so the
    ranks stay in step.
    """
    steps, certified = 0, 0
    stop_reason = "completed" if limit == planned else "budget"
    check_seconds = 0.0
    started = time.perf_counter()
    while steps < limit:
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(loader)
        for _ in range(len(loader)):
            if steps >= limit:
                break
            if steps == certified:
                t0 = time.perf_counter()
                target = min(steps + check_every, limit)
                certified = certify(steps, target)
                if certified < target:
                    limit, stop_reason = certified, "budget"
                check_seconds += time.perf_counter() - t0
                if steps >= limit:
                    break
            reseed()
            xb, yb = next(batches)
            step(xb, yb)
            steps += 1
    return LoopOutcome(
        steps, stop_reason, time.perf_counter() - started - check_seconds, check_seconds
    )
