"""Data parallelism for sampling and RL: ``accelerate launch -m ctrls stage ...`` (or ``torchrun``).

Under a launcher (``WORLD_SIZE`` > 1 in the environment) every process joins one
``torch.distributed`` group (NCCL on GPUs, gloo on CPUs) and works on its contiguous shard of the
questions (exploration, evaluation, Table 2) or of a step's trajectory slots (RL). Because a sample
is a function of its seed and index alone (``ctrls.generate.sampling``), the shards together are exactly the
samples a single process draws. Results are gathered in rank order, so they come back in the
single-process order; RL gradients are summed over ranks (``all_reduce``) after each rank divides
its share of the loss by the global trajectory count, which gives the single-process gradient.

Without a launcher everything here is the identity: one process, rank 0 of 1.
All processes must see the same run directory (one machine, or a shared filesystem).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence, TypeVar

import torch

T = TypeVar("T")
log = logging.getLogger(__name__)

ONE_PROCESS = ("launched by accelerate as a single process (WORLD_SIZE is 1): `accelerate launch --cpu` starts one process "
               "whatever --num_processes says; for several CPU processes use `torchrun --nproc_per_node N -m ctrls stage ...`, "
               "for several GPUs `accelerate launch --multi_gpu --num_processes N -m ctrls stage ...`")


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.size > 1

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's contiguous block of ``items`` (blocks differ in length by at most one)."""
        lo, hi = self.bounds(len(items))
        return list(items[lo:hi])

    def bounds(self, n: int) -> tuple[int, int]:
        return n * self.rank // self.size, n * (self.rank + 1) // self.size

    def device(self, requested: str = "auto") -> str:
        """The device of this rank: ``auto`` and ``cuda`` become ``cuda:<local rank>`` when launched."""
        if requested in ("auto", "cuda") and torch.cuda.is_available():
            return f"cuda:{self.local_rank}" if self.active else "cuda"
        return requested

    # ---- collectives (no-ops in a single process) ----------------------------------------
    def barrier(self) -> None:
        if self.active:
            torch.distributed.barrier()

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``t`` over ranks (a new tensor; gradients do not flow)."""
        if not self.active:
            return t
        t = t.detach().clone()
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (picklable objects)."""
        if not self.active:
            return [obj]
        out: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(out, obj)
        return out

    def gather_list(self, items: list[T]) -> list[T]:
        """The concatenation, in rank order, of every rank's list: with ``shard``, the original order."""
        return [x for part in self.gather(items) for x in part]

    def sum_gradients(self, params) -> None:
        """Sum every parameter's gradient over ranks in place (the loss is pre-divided)."""
        if not self.active:
            return
        for p in params:  # every rank reduces every parameter, in the same order
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)


_WORLD: World | None = None


def world() -> World:
    """This process's place in the launch; joins the process group on first use."""
    global _WORLD
    if _WORLD is None:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        if size > 1:
            rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
            if not torch.distributed.is_initialized():
                cuda = torch.cuda.is_available()
                if cuda:
                    torch.cuda.set_device(local)
                # sampling a shard can take long: a generous timeout for ranks waiting on others
                torch.distributed.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(hours=6))
            _WORLD = World(rank, size, local)
        else:
            if any(k.startswith("ACCELERATE_") for k in os.environ):  # accelerate launched this as its only process
                log.warning(ONE_PROCESS)
            _WORLD = World()
    return _WORLD


def shutdown() -> None:
    global _WORLD
    if _WORLD is not None and _WORLD.active and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    _WORLD = None
