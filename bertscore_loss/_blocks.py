"""All-pairs matching of text blocks on packed embeddings: the one block matcher of the engine.

:meth:`BERTScorer.score_groups` with ``reduce=False`` (reranking, MBR utility matrices) and the MBR
utilities of :mod:`rerank` call :func:`match_blocks`; the math is :mod:`bertscore_loss.matching`'s.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._packed import PackedEmbeddings
from .config import max_elements_for
from .matching import cosine_matrix, greedy_match, precision_recall_f

__all__ = ["match_blocks"]


def _tile(hyp: tuple[Tensor, Tensor, Tensor], ref: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """P, R, F ``[3, a, b]`` (float32, CPU) of ``a`` gathered texts (embeddings ``[a, Lc, d]``, mask, weights)
    against ``b`` others, from one cosine matrix ``[a·Lc, b·Lr]`` viewed as ``[a·b, Lc, Lr]``."""
    (ce, cm, cw), (re, rm, rw) = hyp, ref
    a, lc, d = ce.shape
    b, lr = re.shape[:2]
    sim = cosine_matrix(
        ce.reshape(1, a * lc, d), re.reshape(1, b * lr, d), cm.reshape(1, -1), rm.reshape(1, -1), normalized=True
    )
    sim = sim.view(a, lc, b, lr).transpose(1, 2).reshape(a * b, lc, lr)
    matches = greedy_match(
        sim, cm.unsqueeze(1).expand(a, b, lc).reshape(-1, lc), rm.unsqueeze(0).expand(a, b, lr).reshape(-1, lr)
    )
    p, r, f = precision_recall_f(
        matches.cand_sim,
        matches.ref_sim,
        cw.unsqueeze(1).expand(a, b, lc).reshape(-1, lc),
        rw.unsqueeze(0).expand(a, b, lr).reshape(-1, lr),
    )
    return torch.stack((p, r, f)).view(3, a, b).float().cpu()


def match_blocks(
    packed: PackedEmbeddings,
    weight: Tensor,
    rows: Tensor,
    cols: Tensor,
    max_elements: int | None = None,
    symmetric: bool | None = None,
) -> Tensor:
    """P, R, F ``[3, n, m]`` (float32, CPU) of texts ``rows`` ``[n]`` against texts ``cols`` ``[m]`` of ``packed``.

    ``weight`` ``[T]``: the token weights aligned with ``packed.flat``. Rows and columns are sorted by length
    (longest first) and tiled so that a tile holds at most ``max_elements`` cosine entries (None:
    :func:`~bertscore_loss.config.max_elements_for` of blocks), each tile padded only to its own longest
    texts. ``symmetric`` (default: whether ``rows`` equals ``cols``): only the tiles on and above the
    diagonal are matched; P of (j, i) is R of (i, j), R of (j, i) is P of (i, j), and F is symmetric.
    """
    max_elements = max_elements_for(packed.flat.device, max_elements, blocks=True)
    if symmetric is None:
        symmetric = rows.shape == cols.shape and bool(torch.equal(rows, cols))
    n, m = len(rows), len(cols)
    out = torch.zeros((3, n, m))
    if not n or not m:
        return out
    device = packed.flat.device
    lengths = packed.lengths.cpu()
    r_order = torch.argsort(lengths[rows], descending=True, stable=True)  # longest first: a tile's first
    c_order = torch.argsort(lengths[cols], descending=True, stable=True)  # text sets its padded length
    r_len, c_len = lengths[rows][r_order], lengths[cols][c_order]

    def gather(texts: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
        return packed.gather(texts.to(device), weight, width)

    if symmetric:
        if not torch.equal(rows, cols):
            raise ValueError("symmetric matching needs the same rows and columns")
        longest = int(r_len[0])
        size = max(1, min(n, math.isqrt(max(1, max_elements // max(1, longest * longest)))))
        starts = list(range(0, n, size))
        for x, i0 in enumerate(starts):
            ri = r_order[i0 : i0 + size]
            hyp = gather(rows[ri], int(r_len[i0]))
            for j0 in starts[x:]:
                cj = r_order[j0 : j0 + size]
                tile = _tile(hyp, hyp if j0 == i0 else gather(rows[cj], int(r_len[j0])))
                out[:, ri.unsqueeze(1), cj.unsqueeze(0)] = tile
                if j0 != i0:
                    out[:, cj.unsqueeze(1), ri.unsqueeze(0)] = tile[[1, 0, 2]].transpose(1, 2)
        return out
    # columns in tiles of about the square root of the budget (in pairs of the longest texts), each padded
    # to its own longest; rows tiled to fill the budget
    mb = max(1, min(m, math.isqrt(max(1, max_elements // max(1, int(r_len[0]) * int(c_len[0]))))))
    for j0 in range(0, m, mb):
        cj = c_order[j0 : j0 + mb]
        lr = int(c_len[j0])
        ref = gather(cols[cj], lr)
        i0 = 0
        while i0 < n:
            a = max(1, min(n - i0, max_elements // max(1, int(r_len[i0]) * lr * len(cj))))
            ri = r_order[i0 : i0 + a]
            out[:, ri.unsqueeze(1), cj.unsqueeze(0)] = _tile(gather(rows[ri], int(r_len[i0])), ref)
            i0 += a
    return out
