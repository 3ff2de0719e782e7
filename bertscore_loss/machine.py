"""The machine a run is on, and fitting work to it: native bf16, the CPU label, token-budget batches.

One home for what every part asks of the machine:

* :func:`cpu_flags`, :func:`cpu_model`, :func:`cpu_bf16_flags`: ``/proc/cpuinfo`` read once;
* :func:`cpu_has_native_bf16` / :func:`native_bf16`: whether bfloat16 is computed natively (a CPU with
  ``amx_bf16`` or ``avx512_bf16``, a CUDA device that supports it). Where ``/proc/cpuinfo`` cannot be read
  (not Linux) the answer is False: emulated bf16 is slow and rounds differently, so it is never assumed;
* :func:`cpu_label`: the CPU model and its bf16 flags, ``"<model> (amx_bf16, avx512_bf16)"`` or
  ``"<model> (no native bf16)"``, which labels every recorded figure;
* :func:`budget_groups`: row indices in groups, longest first, each within a padded-token budget.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from functools import cache

import torch

from ._chunking import budget_runs

__all__ = [
    "NATIVE_BF16_FLAGS",
    "budget_groups",
    "cpu_bf16_flags",
    "cpu_flags",
    "cpu_has_native_bf16",
    "cpu_label",
    "cpu_model",
    "native_bf16",
]

CPUINFO = "/proc/cpuinfo"
NATIVE_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})


@cache
def _cpuinfo() -> str | None:
    """The text of ``/proc/cpuinfo`` (read once), None where it cannot be read."""
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


@cache
def _parse(text: str) -> tuple[str | None, frozenset[str]]:
    """``(first "model name", union of the "flags" lines)`` of a ``/proc/cpuinfo`` text."""
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip() or None
        elif key == "flags":
            flags.update(value.split())
    return model, frozenset(flags)


def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags (the ``flags`` lines of ``/proc/cpuinfo``); None where it cannot be read."""
    text = _cpuinfo()
    return None if text is None else _parse(text)[1]


def cpu_model() -> str:
    """This CPU's model name (``/proc/cpuinfo``; else the platform's processor or machine name)."""
    text = _cpuinfo()
    model = None if text is None else _parse(text)[0]
    return model or platform.processor() or platform.machine() or "unknown CPU"


def cpu_bf16_flags() -> list[str]:
    """This CPU's native bf16 flags, sorted: a sub-list of ``["amx_bf16", "avx512_bf16"]`` (empty where
    there are none or ``/proc/cpuinfo`` cannot be read)."""
    return sorted(NATIVE_BF16_FLAGS & (cpu_flags() or frozenset()))


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AMX or AVX512-BF16); else PyTorch emulates them.
    False where ``/proc/cpuinfo`` cannot be read: native bf16 is never assumed."""
    return bool(cpu_bf16_flags())


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether ``device`` computes bfloat16 natively: a CPU per :func:`cpu_has_native_bf16`, a CUDA device
    where ``torch.cuda.is_bf16_supported()``; any other device: False."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type == "cpu":
        return cpu_has_native_bf16()
    return False


def cpu_label() -> str:
    """The CPU model and its native bf16 flags, to label every recorded figure:
    ``"<model> (amx_bf16, avx512_bf16)"``, ``"<model> (avx512_bf16)"`` or ``"<model> (no native bf16)"``."""
    flags = cpu_bf16_flags()
    return f"{cpu_model()} ({', '.join(flags) if flags else 'no native bf16'})"


def budget_groups(lengths: Sequence[int], budget: int, per_row: int = 1) -> list[list[int]]:
    """Indices of ``lengths`` in groups, longest first (ties in index order), each padded to its longest
    within ``budget``: ``rows × longest × per_row <= budget`` (``per_row``: e.g. beams per source). A row
    alone always forms a group, even over the budget."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    runs = budget_runs([(lengths[i], per_row) for i in order], budget)
    return [order[start:stop] for start, stop in runs]
