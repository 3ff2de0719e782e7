"""The few ``torch.distributed`` calls the integrations need (no-ops in a single process)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group; ``(0, 1)`` when none is initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _collective_device() -> torch.device:
    """The device collectives need: the current CUDA device for NCCL, else the CPU (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_sum(values: Sequence[float]) -> list[float]:
    """Sum ``values`` (a short vector, float64) over all processes; returned unchanged in one process."""
    _, size = world()
    if size == 1:
        return [float(v) for v in values]
    t = torch.tensor(list(values), dtype=torch.float64, device=_collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.cpu().tolist()


def all_gather_objects(obj: T) -> list[T]:
    """``obj`` of every process, in rank order (``[obj]`` in one process); every process gives one of a kind."""
    _, size = world()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size  # filled in place with every rank's object
    dist.all_gather_object(out, obj)
    return out
