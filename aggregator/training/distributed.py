"""Multi-process DP-SGD on one machine: rank 0 is the calling process, ranks 1..N-1
are spawned workers, all in one torch.distributed gloo group (CPU).

The division of labour (docs/training.md, Distributed training):

- **rank 0 alone** touches the ledger and the files: it reserves, starts the
  workers (`launch`) and meets them in the group *before* it marks the data
  opened, reads the data, plans, and only then hands each worker its `WorkerSpec`
  (model, data, plan) over the group (`ProcessGroup.share`). It certifies every
  interval and sends the certified end to the workers (`ProcessGroup.lead`), and
  it writes, settles and publishes.
- **workers** never see the ledger, the keys or the data path: they receive the
  rows, train their shard and exit.

Each step is Opacus's distributed DP-SGD (step.build_private_step with
distributed=True): every row joins a step's global batch independently with the
configured q (its rank samples it), per-sample clipping on each rank, the
Gaussian noise N(0, σ²C²) added **once**, by rank 0, then the gradients
all-reduced — the single-process mechanism, so the plan, the accountant and the
receipt are those of a single-process run.

A worker that fails makes rank 0's next collective fail (gloo sees the closed
connection), so the run aborts and the reservation is settled as spent; rank 0
terminates the other workers whenever it leaves the group abnormally.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import socket
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fedldp.aggregator.training.errors import DistributedError
from fedldp.aggregator.training.randomness import StepRandomness
from fedldp.aggregator.training.step import (
    build_private_step,
    poisson_loader,
    require_poisson_loader,
    run_steps,
)
from torch import nn

#: Seconds a collective (and the rendezvous) may wait for the other ranks.
GROUP_TIMEOUT_SECONDS = 600
#: Seconds rank 0 waits for the workers to exit after the last step.
JOIN_SECONDS = 60
#: Environment variable naming the interface gloo listens on (read at group start).
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to train its shard; sent by rank 0 after the data is read.

    Holds no ledger URL, key or data path. `seed` is the configured test seed (None:
    fresh OS entropy before every step, randomness.py).
    """

    model: nn.Module
    features: torch.Tensor
    labels: torch.Tensor
    mode: str
    expected_batch_size: int
    max_grad_norm: float
    noise_multiplier: float
    optimizer: str
    learning_rate: float
    momentum: float
    sample_rate: float
    limit: int
    planned: int
    check_every: int
    seed: int | None


def rank_seed(seed: int, rank: int) -> int:
    """The seeded (tests only) randomness of `rank`: rank 0 keeps the configured seed,
    so a one-process run is unchanged; other ranks get distinct sampling streams."""
    return seed + 1_000_003 * rank


class ProcessGroup:
    """Rank 0's side of a running group of `world_size` processes."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size

    def share(self, spec: WorkerSpec) -> None:
        """Send the workers their spec (rank 0 only; pickled over the group)."""
        dist.broadcast_object_list([spec], src=0)

    def lead(self, certify: Callable[[int, int], int]) -> Callable[[int, int], int]:
        """`certify`, followed by sending its answer (the certified interval end) to the
        workers, which wait for it before the interval (follow_leader)."""

        def certify_and_send(steps: int, target: int) -> int:
            granted = certify(steps, target)
            dist.broadcast(torch.tensor([granted], dtype=torch.long), src=0)
            return granted

        return certify_and_send


def follow_leader(_steps: int, _target: int) -> int:
    """A worker's `certify`: the interval end rank 0 certified (sent by ProcessGroup.lead)."""
    answer = torch.zeros(1, dtype=torch.long)
    dist.broadcast(answer, src=0)
    return int(answer.item())


def _init_group(store: Path, rank: int, world_size: int) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_SECONDS),
    )


def _worker(index: int, store: str, world_size: int, threads: int, filters: list[Any]) -> None:
    """Entry point of rank index+1: join the group, receive the spec, train, leave.

    `filters` are rank 0's warning filters (a worker warns, or not, as rank 0 would)."""
    rank = index + 1
    warnings.filters[:] = filters  # type: ignore[index]  # typeshed: Sequence; a list at run time
    torch.set_num_threads(threads)
    _init_group(Path(store), rank, world_size)
    try:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        train_shard(box[0], rank)
    finally:
        dist.destroy_process_group()


def train_shard(spec: WorkerSpec, rank: int) -> None:
    """Run a worker's part of every step (the same loop as rank 0, lockstep)."""
    rand = StepRandomness(None if spec.seed is None else rank_seed(spec.seed, rank))
    private = build_private_step(
        spec.model,
        mode=spec.mode,
        expected_batch_size=spec.expected_batch_size,
        max_grad_norm=spec.max_grad_norm,
        noise_multiplier=spec.noise_multiplier,
        optimizer=spec.optimizer,
        learning_rate=spec.learning_rate,
        momentum=spec.momentum,
        noise_generator=rand.noise,
        distributed=True,
    )
    loader = poisson_loader(
        spec.features,
        spec.labels,
        sample_rate=spec.sample_rate,
        generator=rand.sampling,
        distributed=True,
    )
    require_poisson_loader(loader, spec.sample_rate)
    run_steps(
        private,
        loader,
        limit=spec.limit,
        planned=spec.planned,
        check_every=spec.check_every,
        certify=follow_leader,
        reseed=rand.reseed,
    )


def loopback_interface() -> str | None:
    """The name of the loopback interface ("lo" on Linux, "lo0" on BSD/macOS), if any."""
    names = {name for _, name in socket.if_nameindex()}
    return next((n for n in ("lo", "lo0") if n in names), None)


@contextlib.contextmanager
def _on_loopback() -> Iterator[None]:
    """Pin gloo to the loopback interface while the group starts (all ranks run on this
    machine; torch.distributed connections are not authenticated, so they should not
    listen on the host name's address). An operator's own GLOO_SOCKET_IFNAME is kept;
    the process environment is restored afterwards (workers inherit it at spawn)."""
    name = loopback_interface()
    if GLOO_IFNAME in os.environ or name is None:
        yield
        return
    os.environ[GLOO_IFNAME] = name
    try:
        yield
    finally:
        os.environ.pop(GLOO_IFNAME, None)


@contextlib.contextmanager
def launch(world_size: int) -> Iterator[ProcessGroup]:
    """Start ranks 1..world_size-1 (spawned) and join them as rank 0.

    On a clean exit the group is left and every worker must exit with status 0
    (else DistributedError). On any exception the workers are terminated.
    Torch threads are split evenly among the processes for the duration; the
    workers get this process's warning filters.
    """
    if dist.is_initialized():
        raise DistributedError("this process already belongs to a torch.distributed group")
    threads_before = torch.get_num_threads()
    threads = max(1, threads_before // world_size)
    folder = Path(tempfile.mkdtemp(prefix="fedldp-ddp-"))
    store = folder / "store"
    with _on_loopback():
        context = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
            _worker,
            args=(str(store), world_size, threads, list(warnings.filters)),
            nprocs=world_size - 1,
            join=False,
            start_method="spawn",
            daemon=True,
        )
    joined = False
    torch.set_num_threads(threads)
    try:
        with _on_loopback():
            _init_group(store, 0, world_size)
        joined = True
        yield ProcessGroup(world_size)
        dist.destroy_process_group()
        joined = False
        _join_workers(context)
    finally:
        if joined:
            dist.destroy_process_group()
        for proc in context.processes:
            if proc.is_alive():
                proc.terminate()
                proc.join(JOIN_SECONDS)
        torch.set_num_threads(threads_before)
        shutil.rmtree(folder, ignore_errors=True)


def _join_workers(context: Any) -> None:
    for rank, proc in enumerate(context.processes, start=1):
        proc.join(JOIN_SECONDS)
        if proc.exitcode != 0:
            raise DistributedError(f"rank {rank} exited with status {proc.exitcode}")
