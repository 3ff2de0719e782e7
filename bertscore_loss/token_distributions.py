"""Turning a generator's token distribution into encoder input embeddings and token weights."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Gumbel = Literal["soft", "hard"] | None


def to_probs(
    candidates: Tensor,
    *,
    inputs: Literal["logits", "probs"] = "logits",
    temperature: float = 1.0,
    gumbel: Gumbel = None,
) -> Tensor:
    """Token distribution ``[B, T, V]`` from logits (softmax at ``temperature``) or probabilities.

    ``gumbel="soft"`` samples a Gumbel-softmax relaxation, ``"hard"`` its one-hot straight-through
    version (one-hot forward, soft gradient); both need logits.
    """
    if inputs not in ("logits", "probs"):
        raise ValueError(f"inputs must be 'logits' or 'probs', got {inputs!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if gumbel is not None:
        if gumbel not in ("soft", "hard"):
            raise ValueError(f"gumbel must be None, 'soft' or 'hard', got {gumbel!r}")
        logits = candidates if inputs == "logits" else candidates.clamp_min(1e-20).log()
        return F.gumbel_softmax(logits, tau=temperature, hard=gumbel == "hard", dim=-1)
    if inputs == "logits":
        return torch.softmax(candidates / temperature, dim=-1)
    if temperature != 1.0:
        return torch.softmax(candidates.clamp_min(1e-20).log() / temperature, dim=-1)
    return candidates


def expected_rows(probs: Tensor, table: Tensor, top_k: int | None = None) -> Tensor:
    """Expected rows ``Σ_v p_v · table[v]``: ``[B, T, V] × [V, *feat]`` → ``[B, T, *feat]``.

    With ``top_k`` the distribution is renormalised over its k most probable tokens and only those
    rows are gathered, avoiding the dense ``V × d`` product.
    """
    if probs.shape[-1] != table.shape[0]:
        raise ValueError(
            f"the candidate distribution has {probs.shape[-1]} entries per token but the embedding table "
            f"has {table.shape[0]} rows: give probabilities over the encoder's vocabulary or use a VocabBridge"
        )
    if top_k is None or top_k >= probs.shape[-1]:
        return probs @ table.to(probs.dtype)
    values, index = probs.topk(top_k, dim=-1)
    values = values / values.sum(dim=-1, keepdim=True).clamp_min(1e-20)
    rows = F.embedding(index, table.unsqueeze(-1) if table.dim() == 1 else table)  # [B, T, k, feat]
    out = (values.unsqueeze(-1) * rows.to(values.dtype)).sum(dim=-2)
    return out.squeeze(-1) if table.dim() == 1 else out
