"""The one budget chunker: consecutive runs of items whose padded size fits a budget."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["budget_runs", "padded_cost"]


def padded_cost(count: int, size: tuple[int, ...]) -> int:
    """Elements of ``count`` items padded to ``size`` (the element-wise max of their sizes)."""
    return count * math.prod(size)


def budget_runs(
    sizes: Sequence[tuple[int, ...]],
    budget: int,
    cost: Callable[[int, tuple[int, ...]], int] = padded_cost,
) -> list[tuple[int, int]]:
    """Split items (in the given order) into consecutive runs ``[start, stop)`` with
    ``cost(count, element-wise max of their sizes) <= budget``; an item alone always forms a run.

    Used for encoder batches (sizes ``(length,)``: count × longest ≤ padded tokens), matching chunks of
    pairs (``(cand_len, ref_len)``: count × longest × longest ≤ cosine entries) and the reranker's tiles.
    Sorting the items by size first (callers do) keeps the padding small.
    """
    runs: list[tuple[int, int]] = []
    start = 0
    top: tuple[int, ...] = ()
    for i, size in enumerate(sizes):
        new = tuple(max(a, b) for a, b in zip(top, size)) if top else tuple(size)
        if i > start and cost(i - start + 1, new) > budget:
            runs.append((start, i))
            start, new = i, tuple(size)
        top = new
    if start < len(sizes):
        runs.append((start, len(sizes)))
    return runs
