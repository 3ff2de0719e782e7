"""Discrete refinement of token sequences: gradient-guided coordinate search on the exact BERTScore.

First-order search (Adam on logits, or ranking swaps by the gradient as HotFlip/GCG do) finds content
words but not function words: the encoder's output for "a", "is" or "." comes mostly from context, so
the gradient ranks the right function word thousands of places down while swapping it in raises the
exact F. :func:`coordinate_search` therefore proposes substitutions from two pools, the gradient's
top-k per position and a fixed ``vocabulary`` (typically :func:`frequent_tokens` of a corpus), and
transpositions of two tokens (right words, wrong order), scores every proposal exactly (hard max, the
evaluation mode's value) and keeps the best one that improves. The gradient and the exact value both
come from :class:`~bertscore_loss.BERTScoreLoss`, so the search uses the same matching code as
evaluation.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .encoder import FrozenEncoder
from .loss import BERTScoreLoss

logger = logging.getLogger(__name__)


@dataclass
class SearchConfig:
    """Settings of :func:`coordinate_search`.

    ``steps``: most rounds (one move kept per sequence and round); ``top_k``: gradient-ranked tokens
    proposed per position; ``proposals``: swaps scored exactly per sequence and round (when the pool
    has at most this many swaps all are scored, so small pools give exact best-improvement search);
    ``transpositions``: also score exchanges of two tokens (up to ``proposals`` of them per round);
    ``patience``: stop a sequence after this many rounds without gain (``None``: never early);
    ``batch_size``: proposals per encoder forward; ``seed``: sampling of proposals; ``progress``: a
    bar per round (``None``: when stderr is a terminal).
    """

    steps: int = 100
    top_k: int = 32
    proposals: int = 128
    transpositions: bool = True
    patience: int | None = 15
    batch_size: int = 512
    seed: int = 0
    progress: bool | None = None


class SearchResult(NamedTuple):
    """Refined ids ``[B, T]``, their exact measure ``[B]`` (start value in ``start``) and rounds run."""

    ids: Tensor
    value: Tensor
    start: Tensor
    steps: int


def frequent_tokens(encoder: FrozenEncoder, corpus: Sequence[str], n: int = 200) -> Tensor:
    """The ``n`` most frequent non-special encoder token ids of ``corpus`` (most frequent first) ``[n]``."""
    if not len(corpus):
        raise ValueError("frequent_tokens needs a non-empty corpus")
    special = encoder.special_ids
    counts = Counter(i for row in encoder.tokenize(list(corpus)).ids for i in row if i not in special)
    return torch.tensor([i for i, _ in counts.most_common(n)], dtype=torch.long)


def _gains(loss: BERTScoreLoss, ids: Tensor, mask: Tensor, references: Sequence[str]) -> Tensor:
    """First-order gain of every swap ``[B, T, V]``: d measure / d one-hot, from the loss's relaxation."""
    emb, weight, content = loss.candidate_inputs(ids, mask)
    emb = emb.detach().requires_grad_(True)
    weight = weight.detach().to(emb.dtype).requires_grad_(True)
    with torch.enable_grad():
        value = loss.score_rows(emb, weight, content, references)[3]
        g_emb, g_w = torch.autograd.grad(value.sum(), (emb, weight))
    table = loss.encoder.input_embeddings.to(g_emb.dtype)
    return g_emb @ table.T + g_w.unsqueeze(-1) * loss.vocab_weight.to(g_w.dtype)


@torch.no_grad()
def exact_values(
    loss: BERTScoreLoss, ids: Tensor, references: Sequence[str], mask: Tensor | None = None, batch_size: int = 512
) -> Tensor:
    """The loss's measure with the hard max (the evaluation mode's value) of token ids ``[N, T]`` → ``[N]``."""
    if mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    out = []
    for i in range(0, len(ids), batch_size):
        part, m = ids[i : i + batch_size], mask[i : i + batch_size]
        emb, weight, content = loss.candidate_inputs(part, m)
        out.append(loss.score_rows(emb, weight, content, references[i : i + batch_size], max_mode="hard")[3])
    return torch.cat(out) if out else ids.new_zeros(0, dtype=torch.float)


def coordinate_search(
    loss: BERTScoreLoss,
    ids: Tensor,
    references: Sequence[str],
    mask: Tensor | None = None,
    *,
    vocabulary: Tensor | Sequence[int] | None = None,
    config: SearchConfig | None = None,
) -> SearchResult:
    """Raise the exact BERTScore of encoder token ids ``[B, T]`` against ``references`` by local moves.

    Each round, per sequence: substitutions (at every real position, the ``top_k`` tokens the loss's
    gradient at the current one-hot input ranks best, and every token of ``vocabulary``) and, with
    ``transpositions``, exchanges of two tokens; up to ``proposals`` of each kind are scored exactly and
    the best is kept if it beats the current value. Values never decrease; padded positions (``mask``
    False) never change; rows are independent and stay in input order. ``references``: one per row,
    strings or framed encoder ids. The measure is the loss's (``measure``/``beta``) with the hard max,
    i.e. the evaluation mode's value (F with ``beta=1``).
    """
    cfg = config or SearchConfig()
    if loss.bridge is not None:
        raise ValueError(
            "coordinate_search works on encoder token ids: decode the generator's ids and tokenise them with "
            "the encoder instead of using a VocabBridge"
        )
    if torch.is_floating_point(ids) or ids.dim() != 2:
        raise ValueError(f"ids must be encoder token ids [batch, length], got {ids.dtype} {tuple(ids.shape)}")
    if len(references) != ids.shape[0]:
        raise ValueError(f"got {ids.shape[0]} sequences but {len(references)} references: the lengths must match")
    if cfg.steps < 0 or cfg.top_k < 0 or cfg.proposals < 1:
        raise ValueError("steps and top_k must be >= 0 and proposals >= 1")
    enc = loss.encoder
    device, vocab = enc.device, enc.vocab_size
    ids = ids.to(device).clone()
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab})")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(device).bool()
    if mask.shape != ids.shape:
        raise ValueError(f"mask must have shape {tuple(ids.shape)}, got {tuple(mask.shape)}")
    special = torch.tensor(sorted(enc.special_ids), dtype=torch.long, device=device)
    extra = torch.as_tensor([] if vocabulary is None else vocabulary, dtype=torch.long, device=device).unique()
    if extra.numel() and (extra.min() < 0 or extra.max() >= vocab or torch.isin(extra, special).any()):
        raise ValueError(f"vocabulary must hold non-special token ids in [0, {vocab})")
    refs = list(references)
    gen = torch.Generator().manual_seed(cfg.seed)
    start = exact_values(loss, ids, refs, mask, cfg.batch_size)
    value, idle = start.clone(), torch.zeros(len(ids), dtype=torch.long)
    steps = 0
    hide = None if cfg.progress is None else not cfg.progress  # None: a bar when stderr is a terminal
    for _ in tqdm(range(cfg.steps), desc="coordinate search", disable=hide):
        active = [b for b in range(len(ids)) if mask[b].any() and (cfg.patience is None or idle[b] < cfg.patience)]
        if not active:
            break
        steps += 1
        act = torch.tensor(active, device=device)
        pools = _pools(loss, ids[act], mask[act], [refs[b] for b in active], special, extra, cfg.top_k)
        props, owner = [], []
        for j, b in enumerate(active):
            cand = torch.cat(
                [_substitutions(ids[b], pools[j], mask[b], cfg.proposals, gen)]
                + ([_transpositions(ids[b], mask[b], cfg.proposals, gen)] if cfg.transpositions else [])
            )
            props.append(cand)
            owner += [b] * len(cand)
        cand = torch.cat(props)
        owner_t = torch.tensor(owner, device=device)
        vals = exact_values(loss, cand, [refs[b] for b in owner], mask[owner_t], cfg.batch_size)
        for b in active:
            sel = (owner_t == b).nonzero().squeeze(1)
            if not sel.numel():
                idle[b] += 1
                continue
            best = sel[vals[sel].argmax()]
            if vals[best] > value[b]:
                ids[b], value[b], idle[b] = cand[best], vals[best], 0
            else:
                idle[b] += 1
    logger.info("coordinate search: %d rounds, mean value %.4f -> %.4f", steps, start.mean(), value.mean())
    return SearchResult(ids, value, start, steps)


def _pools(
    loss: BERTScoreLoss,
    ids: Tensor,
    mask: Tensor,
    references: Sequence[str],
    special: Tensor,
    extra: Tensor,
    top_k: int,
) -> list[list[Tensor]]:
    """Per sequence and position the candidate tokens: gradient top-k ∪ ``extra``, minus specials and the current."""
    t = ids.shape[1]
    if top_k:
        gains = _gains(loss, ids, mask, references)  # [B, T, V]
        gains[..., special] = float("-inf")
        gains.scatter_(-1, ids.unsqueeze(-1), float("-inf"))
        top = gains.topk(min(top_k, gains.shape[-1]), dim=-1).indices  # [B, T, k]
    else:
        top = ids.new_zeros((len(ids), t, 0))
    pools = []
    for b in range(len(ids)):
        rows = []
        for i in range(t):
            pool = torch.cat([top[b, i], extra]).unique()
            rows.append(pool[pool != ids[b, i]])
        pools.append(rows)
    return pools


def _substitutions(ids: Tensor, pool: list[Tensor], mask: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """Sequences ``[P, T]``, one real position replaced by a pool token: all if at most ``n``, else ``n`` at random."""
    swaps = torch.cat(
        [torch.stack([torch.full_like(p, i), p], dim=1) for i, p in enumerate(pool) if mask[i] and p.numel()]
        or [ids.new_zeros((0, 2))]
    )  # [S, 2] (position, token)
    if len(swaps) > n:
        swaps = swaps[torch.randperm(len(swaps), generator=gen)[:n].to(swaps.device)]
    cand = ids.repeat(len(swaps), 1)
    cand[torch.arange(len(swaps), device=ids.device), swaps[:, 0]] = swaps[:, 1]
    return cand


def _transpositions(ids: Tensor, mask: Tensor, n: int, gen: torch.Generator) -> Tensor:
    """Sequences ``[P, T]`` with two real positions holding different tokens exchanged (at most ``n``, at random)."""
    real = mask.nonzero().squeeze(1)
    i, j = torch.combinations(real, 2).unbind(1) if len(real) > 1 else (real[:0], real[:0])
    keep = ids[i] != ids[j]
    i, j = i[keep], j[keep]
    if len(i) > n:
        pick = torch.randperm(len(i), generator=gen)[:n].to(i.device)
        i, j = i[pick], j[pick]
    cand = ids.repeat(len(i), 1)
    rows = torch.arange(len(i), device=ids.device)
    cand[rows, i], cand[rows, j] = ids[j], ids[i]
    return cand
