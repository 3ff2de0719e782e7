"""Scoring many (candidate, reference) pairs of packed embeddings in padded chunks."""

from __future__ import annotations

import torch
from torch import Tensor

from ._chunking import budget_runs
from ._packed import PackedEmbeddings
from .config import max_elements_for
from .matching import bertscore

__all__ = ["score_pairs"]


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
    :func:`~bertscore_loss.config.max_elements_for`).
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
    budget = max_elements_for(device, max_elements)
    for start, stop in budget_runs(list(zip(lc[order].tolist(), lr[order].tolist())), budget):
        ce, cm, cw = cands.gather(u_cand[start:stop], cand_weight)
        re, rm, rw = refs.gather(u_ref[start:stop], ref_weight)
        p, r, f = bertscore(ce, re, cm, rm, cw, rw, normalized=True)
        out[:, order[start:stop]] = torch.stack((p, r, f))
    out = out[:, inverse]
    return out[0], out[1], out[2]
