"""Scoring many (candidate, reference) pairs of packed embeddings in padded chunks."""

from __future__ import annotations

import torch
from torch import Tensor

from .chunking import budget_runs
from .encoder import PackedEmbeddings
from .matching import bertscore

# Cosine entries per matching chunk when none is given: on CPU small chunks stay in cache (3,360 WMT16
# pairs: 0.72 s with 2**24, 0.14 s with 2**18; docs/performance.md); accelerators want big ones.
CPU_MAX_ELEMENTS = 1 << 18
ACCEL_MAX_ELEMENTS = 1 << 24


def default_max_elements(device: str | torch.device) -> int:
    """Cosine entries per matching chunk on ``device`` (CPU 2**18, accelerators 2**24)."""
    return CPU_MAX_ELEMENTS if torch.device(device).type == "cpu" else ACCEL_MAX_ELEMENTS


def score_pairs(
    cands: PackedEmbeddings,
    cand_weight: Tensor,
    cand_index: Tensor,
    refs: PackedEmbeddings,
    ref_weight: Tensor,
    ref_index: Tensor,
    *,
    max_elements: int | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """P, R, F ``[n]`` of pairs ``(cand_index[k], ref_index[k])`` (float32, in the given order).

    ``cands``/``refs`` hold the texts' embeddings (they may be the same object), ``*_weight`` ``[T]``
    the per-token weights aligned with their rows. Identical pairs are scored once; pairs are sorted
    by length and matched in chunks of at most ``max_elements`` cosine entries (None: by device, see
    :func:`default_max_elements`).
    """
    device = cands.flat.device
    n = int(cand_index.numel())
    if n == 0:
        empty = torch.zeros(0, device=device)
        return empty, empty, empty
    cand_index = cand_index.to(device)
    ref_index = ref_index.to(device)
    code = cand_index * max(len(refs), 1) + ref_index
    uniq, inverse = torch.unique(code, return_inverse=True)
    u_cand = uniq // max(len(refs), 1)
    u_ref = uniq % max(len(refs), 1)
    lc = cands.lengths[u_cand]
    lr = refs.lengths[u_ref]
    order = torch.argsort(lc * 4096 + lr, stable=True)
    u_cand, u_ref = u_cand[order], u_ref[order]
    out = torch.zeros((3, uniq.numel()), device=device)
    budget = max_elements or default_max_elements(device)
    for start, stop in budget_runs(list(zip(lc[order].tolist(), lr[order].tolist())), budget):
        ce, cm, cw = cands.gather(u_cand[start:stop], cand_weight)
        re, rm, rw = refs.gather(u_ref[start:stop], ref_weight)
        p, r, f = bertscore(ce, re, cm, rm, cw, rw, normalized=True)
        out[:, order[start:stop]] = torch.stack((p, r, f))
    out = out[:, inverse]
    return out[0], out[1], out[2]
