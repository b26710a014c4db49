"""Code the distributed training tests run inside spawned processes (importable, picklable).

Not a test module: test_distributed.py imports it after checking that torch and
Opacus are installed.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from fedldp.aggregator.training.step import ShardPoissonSampler, build_private_step
from torch import nn

SIGMA = 1.3
CLIP = 0.7
BATCH = 10  # expected global batch size
WIDTH = 64  # the probe layer is WIDTH x WIDTH: 4,096 noise values per step


def _zero_gradient_step(mode: str, local_rows: int, *, distributed: bool, rank: int) -> float:
    """One private step whose clipped gradient sum is exactly zero (zero inputs, no bias),
    so the applied gradient is noise alone; returns std(gradient) * BATCH / (σ C)."""
    model = nn.Linear(WIDTH, WIDTH, bias=False)
    step = build_private_step(
        model,
        mode=mode,
        # the engine passes the global batch (build_private_step divides it among the
        # ranks); the broken variant scales by its own expected share, as if alone
        expected_batch_size=BATCH if distributed else BATCH // dist.get_world_size(),
        max_grad_norm=CLIP,
        noise_multiplier=SIGMA,
        optimizer="sgd",
        learning_rate=0.0,
        momentum=0.0,
        noise_generator=torch.Generator().manual_seed(1000 + rank),
        distributed=distributed,
    )
    step(torch.zeros(local_rows, WIDTH), torch.zeros(local_rows, dtype=torch.long))
    grad = model.weight.grad
    assert grad is not None
    if not distributed:
        # the broken variant: each rank noised its own gradient as if it were alone
        # (a plain DPOptimizer at the per-rank batch), then the ranks average
        grad = grad.clone()
        dist.all_reduce(grad)
        grad /= dist.get_world_size()
    return float(grad.std()) * BATCH / (SIGMA * CLIP)


def _shard_batches(total: int, sample_rate: float) -> list[list[int]]:
    sampler = ShardPoissonSampler(
        total_size=total, sample_rate=sample_rate, generator=torch.Generator().manual_seed(5)
    )
    return [list(b) for b in sampler]


def noise_probe(rank: int, store: str) -> dict[str, Any]:
    """Rank `rank` of a 2-process group: the noise scale of the engine's distributed step
    (hooks with an empty local batch on rank 1, ghost), of the broken each-rank-noises
    variant, and both ranks' shard-sampler batches (gathered)."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=120),
    )
    try:
        result: dict[str, Any] = {
            "hooks": _zero_gradient_step(
                "hooks", 5 if rank == 0 else 0, distributed=True, rank=rank
            ),
            "ghost": _zero_gradient_step("ghost", 5, distributed=True, rank=rank),
            "broken": _zero_gradient_step("hooks", 5, distributed=False, rank=rank),
        }
        batches = _shard_batches(7, 0.1)
        gathered: list[Any] = [None, None]
        dist.all_gather_object(gathered, batches)
        result["shard_batches"] = gathered
        return result
    finally:
        dist.destroy_process_group()


def noise_probe_rank_one(_index: int, store: str) -> None:
    """The spawned half of `noise_probe` (the test process is rank 0)."""
    noise_probe(1, store)


def noise_probe_two_ranks(store: str) -> dict[str, Any]:
    """Run `noise_probe` as rank 0 here with rank 1 spawned; rank 0's result.

    The global torch RNG of this process is restored afterwards; rank 1 is
    terminated if rank 0 fails, and must exit cleanly otherwise."""
    worker = mp.start_processes(  # type: ignore[attr-defined,no-untyped-call]
        noise_probe_rank_one, args=(store,), nprocs=1, join=False, start_method="spawn"
    )
    threads = torch.get_num_threads()
    try:
        with torch.random.fork_rng(devices=[]):
            result = noise_probe(0, store)
    except BaseException:
        for proc in worker.processes:
            proc.terminate()
        raise
    finally:
        torch.set_num_threads(threads)
        worker.join(60)
    assert [proc.exitcode for proc in worker.processes] == [0]
    return result


class FailsOnRankOne(nn.Module):
    """A small MLP whose forward raises on rank 1 at its third call (a crashing worker)."""

    def __init__(self, num_features: int = 4, num_classes: int = 2) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(num_features, 8), nn.Tanh(), nn.Linear(8, num_classes))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if dist.is_initialized() and dist.get_rank() == 1 and self.calls == 3:
            raise RuntimeError("rank 1 fails on purpose")
        out: torch.Tensor = self.net(x)
        return out
