"""The BERTScore math as pure tensor functions: cosine matrix, greedy matching, P/R/F, rescaling.

Every front end (evaluation, loss, reranker, metric) calls these functions; nothing else in the
package computes a cosine matrix or a token match.

Shapes: ``B`` pairs, ``Lc`` candidate tokens, ``Lr`` reference tokens, ``d`` hidden size.
Masks are boolean, True on real tokens (special tokens included), False on padding.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor


class Matches(NamedTuple):
    """Greedy matches of one batch of pairs.

    ``cand_sim``/``cand_index`` ``[B, Lc]``: for each candidate token its best cosine similarity over
    the reference tokens and the index of that token; ``ref_sim``/``ref_index`` ``[B, Lr]``: the same
    for each reference token over the candidate tokens. Padded positions hold similarity 0, index -1.
    """

    cand_sim: Tensor
    cand_index: Tensor
    ref_sim: Tensor
    ref_index: Tensor


def normalize(emb: Tensor, eps: float = 0.0) -> Tensor:
    """Unit-normalise the last dimension of ``emb`` ``[..., d]`` (computed in float32 or wider)."""
    if emb.dtype in (torch.float16, torch.bfloat16):
        emb = emb.float()
    norm = emb.norm(dim=-1, keepdim=True)
    if eps:
        norm = norm.clamp_min(eps)
    return emb / norm


def cosine_matrix(
    cand: Tensor,
    ref: Tensor,
    cand_mask: Tensor | None = None,
    ref_mask: Tensor | None = None,
    *,
    normalized: bool = False,
) -> Tensor:
    """Cosine similarities ``[B, Lc, Lr]`` of candidate ``[B, Lc, d]`` and reference ``[B, Lr, d]`` tokens.

    Pairs where either side is padding are set to ``-inf`` so that padding can never be chosen as a
    match (``bert-score`` sets them to 0, which a padding token wins when all real similarities are
    negative; this is the one documented divergence).
    """
    if not normalized:
        cand, ref = normalize(cand), normalize(ref)
    sim = torch.bmm(cand, ref.transpose(1, 2))
    if cand_mask is not None or ref_mask is not None:
        sim = sim.masked_fill(~pair_mask(sim, cand_mask, ref_mask), float("-inf"))
    return sim


def pair_mask(sim: Tensor, cand_mask: Tensor | None, ref_mask: Tensor | None) -> Tensor:
    """Boolean ``[B, Lc, Lr]`` mask of token pairs where both tokens are real."""
    b, lc, lr = sim.shape
    cm = cand_mask if cand_mask is not None else sim.new_ones((b, lc), dtype=torch.bool)
    rm = ref_mask if ref_mask is not None else sim.new_ones((b, lr), dtype=torch.bool)
    return cm.bool().unsqueeze(2) & rm.bool().unsqueeze(1)


def greedy_match(sim: Tensor, cand_mask: Tensor | None = None, ref_mask: Tensor | None = None) -> Matches:
    """Match each token greedily to its most similar counterpart in ``sim`` ``[B, Lc, Lr]``.

    ``sim`` is expected to hold ``-inf`` on padding (as :func:`cosine_matrix` returns it).
    Ties go to the lowest index.
    """
    cand_sim, cand_index = sim.max(dim=2)
    ref_sim, ref_index = sim.max(dim=1)
    if cand_mask is not None:
        cand_sim = cand_sim.masked_fill(~cand_mask.bool(), 0.0)
        cand_index = cand_index.masked_fill(~cand_mask.bool(), -1)
    if ref_mask is not None:
        ref_sim = ref_sim.masked_fill(~ref_mask.bool(), 0.0)
        ref_index = ref_index.masked_fill(~ref_mask.bool(), -1)
    return Matches(cand_sim, cand_index, ref_sim, ref_index)


MaxMode = Literal["hard", "soft", "straight_through"]


def soft_max(sim: Tensor, dim: int, valid: Tensor, temperature: float) -> Tensor:
    """Smooth max ``Σ softmax(s/τ)·s`` of ``sim`` along ``dim`` over the ``valid`` entries only.

    Rows without any valid entry give 0. Tends to the hard max as ``temperature`` → 0.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    filled = sim.masked_fill(~valid, 0.0)
    logits = (filled / temperature).masked_fill(~valid, float("-inf"))
    any_valid = valid.any(dim=dim, keepdim=True)
    logits = torch.where(any_valid, logits, torch.zeros_like(logits))
    return (torch.softmax(logits, dim=dim) * filled).sum(dim=dim).masked_fill(~any_valid.squeeze(dim), 0.0)


def matched_similarities(
    sim: Tensor,
    cand_mask: Tensor | None = None,
    ref_mask: Tensor | None = None,
    *,
    mode: MaxMode = "hard",
    temperature: float = 0.1,
) -> tuple[Tensor, Tensor]:
    """Each candidate token's ``[B, Lc]`` and reference token's ``[B, Lr]`` matched similarity.

    ``mode``: ``"hard"`` = the exact greedy max (:func:`greedy_match`; gradient to the argmax),
    ``"soft"`` = :func:`soft_max` at ``temperature``, ``"straight_through"`` = the hard value forward
    with the soft gradient backward. Padded positions give 0.
    """
    hard = greedy_match(sim, cand_mask, ref_mask)
    if mode == "hard":
        return hard.cand_sim, hard.ref_sim
    if mode not in ("soft", "straight_through"):
        raise ValueError(f"max_mode must be 'hard', 'soft' or 'straight_through', got {mode!r}")
    valid = pair_mask(sim, cand_mask, ref_mask)
    soft_c = soft_max(sim, 2, valid, temperature)
    soft_r = soft_max(sim, 1, valid, temperature)
    if mode == "soft":
        return soft_c, soft_r
    return (
        hard.cand_sim.detach() + (soft_c - soft_c.detach()),
        hard.ref_sim.detach() + (soft_r - soft_r.detach()),
    )


def normalize_weights(weight: Tensor) -> Tensor:
    """Row-normalise token weights ``[B, L]`` to sum 1; an all-zero row stays all zero."""
    total = weight.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weight / torch.where(total > 0, total, torch.ones_like(total)), 0.0)


def f_score(precision: Tensor, recall: Tensor, beta: float = 1.0) -> Tensor:
    """F_beta = (1 + b²)PR / (b²P + R); 0 where the denominator is 0."""
    b2 = beta * beta
    denom = b2 * precision + recall
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.where(denom == 0, torch.zeros_like(denom), (1 + b2) * precision * recall / safe)


def precision_recall_f(
    cand_sim: Tensor, ref_sim: Tensor, cand_weight: Tensor, ref_weight: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Weighted P ``[B]`` over candidate tokens, R ``[B]`` over reference tokens, and F1.

    ``cand_sim`` ``[B, Lc]`` and ``ref_sim`` ``[B, Lr]`` are the matched similarities; the weights (IDF
    or 1, 0 on special tokens and padding) are normalised per row here. A side whose weights sum to 0
    (an empty text) gives P = R = F = 0, like ``bert-score``.
    """
    cw = normalize_weights(cand_weight.to(cand_sim.dtype))
    rw = normalize_weights(ref_weight.to(ref_sim.dtype))
    precision = (cand_sim * cw).sum(dim=-1)
    recall = (ref_sim * rw).sum(dim=-1)
    empty = (cand_weight.sum(dim=-1) <= 0) | (ref_weight.sum(dim=-1) <= 0)
    precision = precision.masked_fill(empty, 0.0)
    recall = recall.masked_fill(empty, 0.0)
    return precision, recall, f_score(precision, recall)


def bertscore(
    cand: Tensor,
    ref: Tensor,
    cand_mask: Tensor,
    ref_mask: Tensor,
    cand_weight: Tensor,
    ref_weight: Tensor,
    *,
    normalized: bool = False,
    mode: MaxMode = "hard",
    temperature: float = 0.1,
) -> tuple[Tensor, Tensor, Tensor]:
    """P, R, F ``[B]`` of candidate embeddings ``[B, Lc, d]`` against reference embeddings ``[B, Lr, d]``.

    ``mode``/``temperature`` choose the max over the cosine matrix (see :func:`matched_similarities`).
    """
    sim = cosine_matrix(cand, ref, cand_mask, ref_mask, normalized=normalized)
    cand_sim, ref_sim = matched_similarities(sim, cand_mask, ref_mask, mode=mode, temperature=temperature)
    return precision_recall_f(cand_sim, ref_sim, cand_weight, ref_weight)


def rescale(score: Tensor, baseline: Tensor | float) -> Tensor:
    """Baseline rescaling ``(x - b) / (1 - b)``."""
    return (score - baseline) / (1 - baseline)
