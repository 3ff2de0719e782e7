"""Turning a generator's token distribution into encoder input embeddings and token weights."""

from __future__ import annotations

from typing import Literal, NamedTuple

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


class TopK(NamedTuple):
    """The ``k`` most probable tokens of every position: ``ids`` ``[B, T, k]`` (long), ``probs`` ``[B, T, k]``
    (their probabilities renormalised to sum 1; differentiable) and ``best`` ``[B, T]`` (the most
    probable token, as ``argmax(-1)`` of the full distribution)."""

    ids: Tensor
    probs: Tensor
    best: Tensor

    def select(self, positions: Tensor) -> TopK:
        """The entries at ``positions`` ``[B, P]`` of every row: ``[B, P, k]``, ``[B, P, k]``, ``[B, P]``."""
        wide = positions.unsqueeze(-1).expand(-1, -1, self.ids.shape[-1])
        return TopK(self.ids.gather(1, wide), self.probs.gather(1, wide), self.best.gather(1, positions))


def gumbel_noise(shape: torch.Size | tuple[int, ...], *, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """Standard Gumbel noise ``-log(E)``, ``E = -log(U)`` ~ Exp(1), ``U`` uniform: the distribution
    ``F.gumbel_softmax`` samples, at 0.52 s against its 0.87 s for 17.5 M numbers on one CPU thread (its
    ``Tensor.exponential_`` is slow there).

    ``torch.rand`` gives multiples of 2⁻²⁴; where ``U`` is within 2⁻¹⁰ of 0 or 1 (the smallest and the
    largest noise) it gets a fresh float64 fraction below that step, so ``U`` is uniform at float64
    resolution there and the noise shows no grid in either tail (the top values decide a top-k).
    """
    u = torch.rand(shape, device=device)
    e = u.log().neg_()
    idx = ((u < 2.0**-10) | (u >= 1 - 2.0**-10)).nonzero(as_tuple=True)
    if idx[0].numel():
        k = u[idx].double() * 2.0**24
        fine = (k + torch.rand(k.shape, dtype=torch.float64, device=k.device)) * 2.0**-24
        e[idx] = fine.log().neg_().to(e.dtype)
    return e.clamp_min_(torch.finfo(e.dtype).tiny).log_().neg_().to(dtype)


def top_k_probs(
    logits: Tensor,
    k: int,
    *,
    temperature: float = 1.0,
    gumbel: Gumbel = None,
    mask: Tensor | None = None,
) -> TopK:
    """:func:`to_probs` of ``logits`` ``[B, T, V]`` renormalised over its ``k`` most probable tokens, without the
    dense softmax: the renormalised top-k of ``softmax(y)`` is ``softmax`` of the top-k of ``y`` (the
    normaliser cancels), with ``y = logits / temperature`` or, for ``gumbel="soft"``, ``(logits + g) /
    temperature`` with standard Gumbel noise ``g`` from :func:`gumbel_noise` (the distribution
    ``F.gumbel_softmax`` draws from, at under half its cost on CPU; other random numbers than it for the
    same seed). For the same ``g``, values and gradients equal ``to_probs`` followed by
    :func:`expected_rows`' renormalisation (the gradient of the dropped entries is 0 in both).

    Low-precision (bf16) logits are read as they are and computed with in float32, as ``logits.float()`` would.
    ``mask`` ``[B, T]`` (True = real): only real positions are computed (and get noise); the others get token
    0..k-1 uniformly and no gradient, whatever they hold (NaN or infinite logits included). At a real
    position, NaN, ``+inf`` or all ``-inf`` logits give NaN probabilities (as the dense softmax does).
    """
    if gumbel not in (None, "soft"):
        raise ValueError(f"top_k_probs takes gumbel=None or 'soft', got {gumbel!r}")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    k = min(k, logits.shape[-1])
    if mask is None:
        return _top_k(logits, k, temperature, gumbel)
    rows = mask.reshape(-1).nonzero().squeeze(1)
    flat = logits.reshape(-1, logits.shape[-1])
    real = _top_k(flat.index_select(0, rows), k, temperature, gumbel)  # [n, k]: masked steps cost nothing
    n, dev = flat.shape[0], logits.device
    ids = torch.arange(k, device=dev).expand(n, k).clone().index_copy(0, rows, real.ids)
    probs = torch.full((n, k), 1.0 / k, dtype=real.probs.dtype, device=dev).index_copy(0, rows, real.probs)
    best = torch.zeros(n, dtype=torch.long, device=dev).index_copy(0, rows, real.best)
    return TopK(ids.view(*mask.shape, k), probs.view(*mask.shape, k), best.view(mask.shape))


def _top_k(logits: Tensor, k: int, temperature: float, gumbel: Gumbel) -> TopK:
    """:func:`top_k_probs` of every row of ``logits`` ``[..., V]``."""
    wide = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits: float32 noise and arithmetic
    if gumbel == "soft":
        y = logits + gumbel_noise(logits.shape, dtype=wide, device=logits.device)
    else:
        y = logits.to(wide)
    if temperature != 1.0:  # one [n, V] pass (and its backward) less at the default temperature
        y = y / temperature
    values, ids = y.topk(k, dim=-1)
    # With continuous noise the largest entry is the first of the top k (a tie has probability 0); without it
    # ties are common (bf16 logits) and argmax's first-index rule is kept.
    best = ids[..., 0] if gumbel == "soft" else y.detach().argmax(dim=-1)
    return TopK(ids, torch.softmax(values, dim=-1), best)


def expected_top_k(top: TopK, table: Tensor) -> Tensor:
    """Expected rows ``Σ_j probs_j · table[index_j]``: ``[B, T, k]`` over ``[V, *feat]`` → ``[B, T, *feat]``.

    Equals :func:`expected_rows` with ``top_k`` on the distribution ``top`` came from; an embedding bag, so
    the ``[B, T, k, d]`` rows are never materialised (forward or backward).
    """
    probs = top.probs
    if table.dim() == 1:
        return (probs * table[top.ids].to(probs.dtype)).sum(dim=-1)
    b, t, k = top.ids.shape
    out = F.embedding_bag(
        top.ids.reshape(-1, k), table.to(probs.dtype), per_sample_weights=probs.reshape(-1, k), mode="sum"
    )
    return out.view(b, t, table.shape[-1])
