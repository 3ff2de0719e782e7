"""Optimising token sequences against references: Adam on free logits, and a discrete coordinate search.

First-order search (Adam on logits, or ranking swaps by the gradient as HotFlip/GCG do) finds content
words but not function words: the encoder's output for "a", "is" or "." comes mostly from context, so
at a point where they are absent the gradient ranks the right function word thousands of places down
although swapping it in raises the exact F. Two remedies, usable alone or in turn:

- :func:`optimise_logits` (Adam alone) starts the logits from a unigram prior of a corpus
  (:func:`token_log_prior`), so function words carry mass from the first step and the relaxation
  values them in context; several restarts at different prior scales run in one batch, and the argmax
  ids are scored exactly along the way, keeping the best.
- :func:`coordinate_search` proposes substitutions from two pools, the gradient's top-k per position
  and a fixed ``vocabulary`` (typically :func:`frequent_tokens` of a corpus), and transpositions of two
  tokens (right words, wrong order), scores every proposal exactly (hard max, the evaluation mode's
  value) and keeps the best one that improves.

Gradients and exact values all come from :class:`~bertscore_loss.BERTScoreLoss`, so both use the same
matching code as evaluation.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import check_number
from .encoder import FrozenEncoder
from .loss import BERTScoreLoss
from .validation import references_are_text

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
    top_k: int = 128
    proposals: int = 512
    transpositions: bool = True
    patience: int | None = 15
    batch_size: int = 512
    seed: int = 0
    progress: bool | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "top_k"):  # top_k 0: every token is proposed
            check_number(getattr(self, name), name, integer=True, at_least=0)
        for name in ("proposals", "batch_size"):
            check_number(getattr(self, name), name, integer=True, at_least=1)
        check_number(self.patience, "patience", integer=True, at_least=1, allow_none=True)
        check_number(self.seed, "seed", integer=True)


class SearchResult(NamedTuple):
    """Ids ``[B, T]``, their exact measure ``[B]`` (the value at the start in ``start``) and rounds/steps run."""

    ids: Tensor
    value: Tensor
    start: Tensor
    steps: int


def _token_counts(encoder: FrozenEncoder, corpus: Sequence[str], what: str) -> Counter[int]:
    if not len(corpus):
        raise ValueError(f"{what} needs a non-empty corpus")
    special = encoder.special_ids
    return Counter(i for row in encoder.tokenize(list(corpus)).ids for i in row if i not in special)


def frequent_tokens(encoder: FrozenEncoder, corpus: Sequence[str], n: int = 200) -> Tensor:
    """The ``n`` most frequent non-special encoder token ids of ``corpus`` (most frequent first) ``[n]``."""
    counts = _token_counts(encoder, corpus, "frequent_tokens")
    return torch.tensor([i for i, _ in counts.most_common(n)], dtype=torch.long)


def token_log_prior(encoder: FrozenEncoder, corpus: Sequence[str], smoothing: float = 0.1) -> Tensor:
    """Unigram log-frequencies of ``corpus`` over the encoder vocabulary ``[V]``, the most frequent token at 0.

    ``log((count + smoothing) / (total + V * smoothing))`` shifted so its maximum is 0; special tokens
    are ``-inf``. The starting logits of :func:`optimise_logits` (scaled by its ``prior_scales``).
    """
    if smoothing <= 0:
        raise ValueError(f"smoothing must be > 0, got {smoothing}")
    counts = _token_counts(encoder, corpus, "token_log_prior")
    freq = torch.full((encoder.vocab_size,), float(smoothing), dtype=torch.float64)
    freq[list(counts)] += torch.tensor(list(counts.values()), dtype=torch.float64)
    prior = (freq / freq.sum()).log()
    prior = (prior - prior.max()).float()
    prior[sorted(encoder.special_ids)] = float("-inf")
    return prior


@dataclass
class LogitConfig:
    """Settings of :func:`optimise_logits`.

    ``steps``: Adam steps; ``restarts``: logit rows per reference, optimised in one batch (the result is
    the best exact value over rows and checks); ``prior_scales``: restart ``r`` starts from
    ``prior_scales[r % len(prior_scales)] * prior``; ``lr``/``eps``: Adam's; ``temperature``: τ of the
    soft max in the relaxation; ``beta_start``: F_beta of the relaxation, annealed linearly from this
    value to the loss's own ``beta`` (recall first; ignored for ``measure`` precision or recall);
    ``gumbel_temperature``: soft Gumbel-softmax temperature, annealed geometrically from the first value
    to the second; ``check_every``: steps between exact scorings of the argmax ids (the last step is
    always scored); ``batch_size``: references per Adam run; ``seed``: initial noise (the global RNG is
    left as it was); ``progress``: a bar over steps (``None``: when stderr is a terminal).
    """

    steps: int = 150
    restarts: int = 8
    prior_scales: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0)
    lr: float = 0.3
    eps: float = 1e-6
    temperature: float = 0.1
    beta_start: float = 2.0
    gumbel_temperature: tuple[float, float] = (2.0, 0.3)
    check_every: int = 5
    batch_size: int = 8
    seed: int = 0
    progress: bool | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "restarts", "check_every", "batch_size"):
            check_number(getattr(self, name), name, integer=True, at_least=1)
        for name in ("lr", "eps", "temperature", "beta_start"):
            check_number(getattr(self, name), name, positive=True)
        for name in ("prior_scales", "gumbel_temperature"):
            values = getattr(self, name)
            if not isinstance(values, (tuple, list)) or not values:
                raise ValueError(f"{name} must be a non-empty tuple of numbers, got {values!r}")
            for v in values:
                check_number(v, name, positive=True)
        check_number(self.seed, "seed", integer=True)


def optimise_logits(
    loss: BERTScoreLoss,
    references: Sequence[str],
    lengths: int | Sequence[int] | None = None,
    *,
    prior: Tensor | None = None,
    config: LogitConfig | None = None,
) -> SearchResult:
    """Adam on free logits ``[restarts, T, V]`` per reference; the best argmax ids by exact value.

    ``references``: one string (or framed encoder ids) per output row; ``lengths``: candidate tokens per
    row (an int for all; ``None``: each reference's own token count); ``prior``: starting logits ``[V]``
    (typically :func:`token_log_prior`; ``None``: zeros), special tokens are never chosen. The
    relaxation is ``loss``'s encoder, IDF and measure with the soft max, soft Gumbel-softmax inputs and
    the schedules of ``config``; every ``check_every`` steps the argmax ids of all restarts are scored
    with the hard max (:func:`exact_values`, the evaluation mode's value of the loss's measure) and
    the best per reference is kept. Returns ids ``[B, max(lengths)]`` (positions past a row's length
    hold the pad id), their exact value ``[B]``, the best exact value at the start ``[B]``, and the
    steps run. Memory: about ``4 × batch_size × restarts × T × V`` floats (logits, gradient, Adam).
    """
    cfg = config or LogitConfig()
    if loss.bridge is not None:
        raise ValueError("optimise_logits works on the encoder's vocabulary: use a BERTScoreLoss without a bridge")
    if cfg.steps < 1 or cfg.restarts < 1 or cfg.check_every < 1 or cfg.batch_size < 1:
        raise ValueError("steps, restarts, check_every and batch_size must be >= 1")
    if not cfg.prior_scales or min(cfg.prior_scales) < 0 or cfg.lr <= 0 or min(cfg.gumbel_temperature) <= 0:
        raise ValueError("prior_scales must be a non-empty tuple of values >= 0, lr and gumbel_temperature > 0")
    enc = loss.encoder
    vocab, device = enc.vocab_size, enc.device
    refs = list(references)
    text = references_are_text(refs)
    if lengths is None:
        framed = enc.tokenize(refs).ids if text else refs
        lengths = [len(r) - sum(len(x) for x in enc.framing) for r in framed]
    elif isinstance(lengths, int):
        lengths = [lengths] * len(refs)
    lengths = list(lengths)
    if len(lengths) != len(refs):
        raise ValueError(f"got {len(lengths)} lengths but {len(refs)} references: the lengths must match")
    if any(n < 1 for n in lengths):
        raise ValueError(f"every length must be >= 1, got {min(lengths)} (an empty reference needs an explicit length)")
    special = sorted(enc.special_ids)
    if prior is None:
        prior = torch.zeros(vocab)
    elif prior.shape != (vocab,):
        raise ValueError(f"prior must have shape [{vocab}] (the encoder vocabulary), got {tuple(prior.shape)}")
    dtype = torch.promote_types(torch.float32, enc.input_embeddings.dtype)
    prior = prior.detach().to(device, dtype).clone()
    prior[special] = 0.0  # -inf is put back after scaling (0 * -inf would be nan)
    lc = loss.loss_config
    relaxed_config = dataclasses.replace(
        lc,
        max_mode="soft",
        temperature=cfg.temperature,
        inputs="logits",
        gumbel="soft",
        top_k=None,
        reduction="sum",
    )
    relaxed = BERTScoreLoss(scorer=loss.scorer, loss=relaxed_config)
    beta_end = lc.beta
    g0, g1 = cfg.gumbel_temperature
    scales = torch.tensor([cfg.prior_scales[r % len(cfg.prior_scales)] for r in range(cfg.restarts)], dtype=dtype)
    pad = enc.tokenizer.pad_token_id if enc.tokenizer.pad_token_id is not None else 0
    t_max = max(lengths, default=0)
    out_ids = torch.full((len(refs), t_max), pad, dtype=torch.long, device=device)
    out_val = torch.zeros(len(refs), device=device)
    out_start = torch.zeros(len(refs), device=device)
    hide = None if cfg.progress is None else not cfg.progress
    forked = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=forked):
        torch.manual_seed(cfg.seed)
        for lo in range(0, len(refs), cfg.batch_size):
            part = range(lo, min(lo + cfg.batch_size, len(refs)))
            rows = [b for b in part for _ in range(cfg.restarts)]  # row k: reference rows[k], restart k % R
            row_refs = [refs[b] for b in rows]
            t = max(lengths[b] for b in part)
            mask = torch.arange(t, device=device) < torch.tensor([lengths[b] for b in rows], device=device)[:, None]
            init = scales.to(device).repeat(len(part))[:, None, None] * prior.expand(len(rows), t, vocab)
            init[..., special] = float("-inf")
            logits = init.requires_grad_(True)
            opt = torch.optim.Adam([logits], lr=cfg.lr, eps=cfg.eps)

            best_ids, best_val = _argmax_values(loss, logits, row_refs, mask, pad)
            start = best_val.clone()
            desc = f"optimise logits {lo // cfg.batch_size + 1}/{-(-len(refs) // cfg.batch_size)}"
            for step in tqdm(range(cfg.steps), desc=desc, disable=hide):
                frac = step / max(cfg.steps - 1, 1)
                relaxed.loss_config = dataclasses.replace(
                    relaxed.loss_config,
                    beta=cfg.beta_start + (beta_end - cfg.beta_start) * frac,
                    logit_temperature=g0 * (g1 / g0) ** frac,
                )
                opt.zero_grad()
                with torch.enable_grad():
                    relaxed(logits, row_refs, mask).loss.backward()
                opt.step()
                if (step + 1) % cfg.check_every == 0 or step == cfg.steps - 1:
                    ids, val = _argmax_values(loss, logits, row_refs, mask, pad)
                    better = val > best_val
                    best_ids[better], best_val[better] = ids[better], val[better]
            per_ref = best_val.view(len(part), cfg.restarts)
            pick = per_ref.argmax(1) + torch.arange(len(part), device=device) * cfg.restarts
            out_ids[part.start : part.stop, :t] = best_ids[pick]
            out_val[part.start : part.stop] = best_val[pick]
            out_start[part.start : part.stop] = start.view(len(part), cfg.restarts).max(1).values
    logger.info("optimise_logits: %d steps, mean exact value %.4f -> %.4f", cfg.steps, out_start.mean(), out_val.mean())
    return SearchResult(out_ids, out_val, out_start, cfg.steps)


def _argmax_values(
    loss: BERTScoreLoss, logits: Tensor, references: Sequence[str], mask: Tensor, pad: int
) -> tuple[Tensor, Tensor]:
    """Argmax ids ``[N, T]`` of logits ``[N, T, V]`` (pad outside ``mask``) and their exact values ``[N]``."""
    ids = logits.detach().argmax(-1).masked_fill(~mask, pad)
    return ids, exact_values(loss, ids, references, mask)


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
