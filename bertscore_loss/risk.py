"""Minimum-risk training with BERTScore: expected ``1 − F`` under the model's renormalised sample distribution.

Shen et al. (2016), "Minimum Risk Training for Neural Machine Translation"; Edunov et al. (2018),
"Classical Structured Prediction Losses for Sequence to Sequence Learning". For each source, ``k``
candidates are sampled (or taken from a beam); their risks come from the exact evaluation mode
(:class:`BERTScorer`, hard max, one scoring call for the whole batch of candidate lists) and the
loss is the expected risk under ``q = softmax(α · log p(candidate))`` over the distinct candidates of
the source. Its gradient reaches the generator through ``log_probs`` only:
``∂L/∂ log p_i = α q_i (r_i − E_q[r])``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from .config import Measure, check_measure
from .machine import budget_groups
from .scorer import BERTScorer, ScorerConfig, scorer_from


class RiskOutput(NamedTuple):
    """``loss``: the expected risk (scalar, or ``[B]`` with ``reduction="none"``); ``risk`` ``[B, k]``:
    ``1 − utility`` of each candidate (NaN where a row has no candidate); ``weights`` ``[B, k]``: the
    renormalised distribution ``q`` (0 at padding and at repeated candidates); ``utility`` ``[B, k]``."""

    loss: Tensor
    risk: Tensor
    weights: Tensor
    utility: Tensor


def sequence_log_probs(logits: Tensor, labels: Tensor, *, ignore_index: int = -100, normalize: bool = False) -> Tensor:
    """Log-probability ``[N]`` of each label sequence under teacher-forced ``logits`` ``[N, T, V]``.

    ``labels`` ``[N, T]`` (long; ``ignore_index`` marks padding) are the tokens the logits predict,
    position by position (for a Hugging Face encoder-decoder: the generated ids without the decoder
    start token, as passed in ``labels=``). ``normalize``: divide by the number of real tokens (the
    mean log-probability per token). Computed in float32; differentiable in ``logits``.
    """
    if logits.dim() != 3 or labels.dim() != 2 or logits.shape[:2] != labels.shape:
        raise ValueError(
            f"logits must be [N, T, V] and labels [N, T] with the same N, T; got {tuple(logits.shape)} and "
            f"{tuple(labels.shape)}"
        )
    keep = labels != ignore_index
    safe = labels.masked_fill(~keep, 0)
    if bool(((safe < 0) | (safe >= logits.shape[-1])).any()):
        raise ValueError(f"labels must lie in [0, {logits.shape[-1]}) or equal ignore_index={ignore_index}")
    token = torch.log_softmax(logits.float(), dim=-1).gather(-1, safe.unsqueeze(-1)).squeeze(-1)
    total = (token * keep).sum(dim=1)
    return total / keep.sum(dim=1).clamp_min(1) if normalize else total


class _LabelLogProbs(torch.autograd.Function):
    """``log softmax(hidden @ weight.T + bias)[label]`` per row, in row chunks, without keeping the logits."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor, chunk: int, dtype: torch.dtype
    ) -> Tensor:
        h, w = hidden.to(dtype), weight.to(dtype)
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(out)
        for s in range(0, hidden.shape[0], chunk):
            z = _logits(h[s : s + chunk], w, bias)
            lse[s : s + chunk] = torch.logsumexp(z, dim=-1)
            out[s : s + chunk] = z.gather(1, labels[s : s + chunk].unsqueeze(1)).squeeze(1) - lse[s : s + chunk]
        ctx.save_for_backward(hidden, weight, bias if bias is not None else torch.empty(0), labels, lse)
        ctx.chunk, ctx.dtype, ctx.has_bias = chunk, dtype, bias is not None
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        hidden, weight, bias, labels, lse = ctx.saved_tensors
        h, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device) if need_b else None
        for s in range(0, hidden.shape[0], ctx.chunk):
            e = s + ctx.chunk
            z = _logits(h[s:e], w, bias if ctx.has_bias else None)
            g = grad[s:e].float().unsqueeze(1)
            lab = labels[s:e].unsqueeze(1)
            p = torch.exp(z.sub_(lse[s:e].unsqueeze(1)))  # softmax
            gz = p.mul_(-g)  # d/dz of log p(label) = onehot - softmax, times the incoming gradient
            gz.scatter_add_(1, lab, g)
            low = gz.to(ctx.dtype)  # rounded once per entry, as the output layer's backward would
            if grad_h is not None:
                grad_h[s:e] = (low @ w).to(hidden.dtype)
            if grad_w is not None:
                grad_w += (low.t() @ h[s:e]).float()
            if grad_b is not None:
                grad_b += gz.sum(dim=0)
        return (
            grad_h,
            grad_w.to(weight.dtype) if grad_w is not None else None,
            grad_b.to(bias.dtype) if grad_b is not None else None,
            None,
            None,
            None,
        )


def _logits(h: Tensor, w: Tensor, bias: Tensor | None) -> Tensor:
    z = (h @ w.t()).float()
    return z + bias.float() if bias is not None else z


def label_log_probs(
    hidden: Tensor, weight: Tensor, labels: Tensor, bias: Tensor | None = None, *, chunk_rows: int = 512
) -> Tensor:
    """Log-probability ``[n]`` of each label under ``softmax(hidden @ weight.T + bias)``, for the rows of
    ``hidden`` ``[n, d]`` (e.g. a decoder's states at real positions), ``weight`` ``[V, d]`` (the output
    layer), ``labels`` ``[n]``, ``bias`` ``[V]`` or ``[1, V]``.

    Equals ``torch.log_softmax((hidden @ weight.T).float() + bias, -1).gather(-1, labels)`` (an output layer
    without bias plus an added bias, as Marian's and BART's ``lm_head`` + ``final_logits_bias``; what
    :func:`sequence_log_probs` does with such a model's logits) in value and gradient (w.r.t. ``hidden``,
    ``weight`` and ``bias``), but works through ``chunk_rows`` rows at a time and recomputes the logits in
    the backward, so the ``[n, V]`` logits, log-softmax and their gradients are never held (nor copied
    between dtypes): with a large vocabulary the output layer dominates a sequence-level loss, and its
    memory traffic dominates that. The product runs in the autocast dtype when ``torch.autocast`` is on
    (as the output layer would), else in ``hidden``'s dtype; the softmax in float32.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or labels.shape != hidden.shape[:1] or hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"hidden must be [n, d], weight [V, d] and labels [n]; got {tuple(hidden.shape)}, {tuple(weight.shape)} "
            f"and {tuple(labels.shape)}"
        )
    if labels.numel() and bool(((labels < 0) | (labels >= weight.shape[0])).any()):
        raise ValueError(f"labels must lie in [0, {weight.shape[0]})")
    kind = hidden.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype
    flat_bias = bias.reshape(-1) if bias is not None else None
    if flat_bias is not None and not flat_bias.requires_grad and not bool(flat_bias.any()):
        flat_bias = None  # a constant zero bias (Marian's final_logits_bias): two [n, V] passes less
    with torch.autocast(kind, enabled=False):
        out = _LabelLogProbs.apply(hidden, weight, flat_bias, labels, max(int(chunk_rows), 1), dtype)
    return out


def _padded(rows: Sequence[Sequence[int]], value: int, device: torch.device) -> Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def _check_ids(name: str, rows: Sequence[Sequence[int]], vocab: int | None) -> None:
    if isinstance(rows, (str, Tensor)):
        raise ValueError(f"{name} must be a list of token-id lists, got a {type(rows).__name__}")
    for i, row in enumerate(rows):
        if isinstance(row, str) or len(row) == 0:
            raise ValueError(f"{name}[{i}] must be a non-empty list of token ids")
        if vocab is not None and any(not 0 <= int(t) < vocab for t in row):
            raise ValueError(f"{name}[{i}] holds a token id outside [0, {vocab})")


def target_log_probs(
    model: Any,
    sources: Sequence[Sequence[int]] | None,
    targets: Sequence[Sequence[int]],
    owners: Sequence[int] | None = None,
    *,
    token_budget: int = 8192,
    grad: bool = True,
    encoder_states: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """Log-probability ``[N]`` (float32) of each target given its source, under a Hugging Face encoder–decoder
    or causal LM: many candidates per source, in groups of at most ``token_budget`` padded target tokens.

    ``sources``: ``B`` token-id lists (an encoder–decoder's encoder input, EOS included where the model
    expects it; a causal LM's prompt). ``targets``: ``N`` label-id lists (EOS included: what
    ``rerank.training_data.Codec.encode_target`` gives), ``owners`` ``[N]``: the source of each target
    (default: target ``i`` of source ``i``). An encoder–decoder encodes each source once and runs its decoder
    on the targets (decoder inputs: the decoder start token, then the labels but the last); a model with
    ``final_logits_bias`` (Marian, BART, Pegasus) goes through :func:`label_log_probs` on the decoder states,
    never holding the ``[N, T, V]`` logits. A causal LM reads ``source + target`` and sums the target
    positions' log-probabilities. The model's mode is used as it is (call ``model.eval()`` for the values
    without dropout). ``grad=False``: no graph (as ``torch.no_grad()``); else differentiable in the weights.

    ``encoder_states``: an encoder–decoder's encoder output ``[B, S, d]`` and attention mask ``[B, S]`` made
    already (say by the pass of another loss term, sharing its dropout draw); the encoder is not run again,
    ``owners`` index their rows, ``sources`` may be None, and the gradient reaches the states.
    """
    if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
        raise ValueError(f"token_budget must be a positive int, got {token_budget!r}")
    cfg = model.config
    vocab = getattr(cfg, "vocab_size", None)
    count = _check_states(cfg, sources, encoder_states) if encoder_states is not None else None
    if sources is not None:
        _check_ids("sources", sources, vocab)
        count = len(sources)
    elif count is None:
        raise ValueError("sources are needed unless encoder_states are given")
    _check_ids("targets", targets, vocab)
    own = list(range(len(targets))) if owners is None else [int(o) for o in owners]
    if len(own) != len(targets):
        raise ValueError(f"owners must hold one source index per target: {len(own)} for {len(targets)} targets")
    if any(not 0 <= o < count for o in own):
        raise ValueError(f"owners must lie in [0, {count}) (one index into sources per target)")
    device = next(model.parameters()).device
    if not targets:
        return torch.zeros(0, device=device)
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else cfg.eos_token_id
    pad = int(pad if pad is not None else 0)
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        if getattr(cfg, "is_encoder_decoder", False):
            parts, rows = _seq2seq_log_probs(model, sources, targets, own, token_budget, pad, device, encoder_states)
        else:
            assert sources is not None  # (encoder_states are refused for a causal LM above)
            parts, rows = _causal_log_probs(model, sources, targets, own, token_budget, pad, device)
        flat = torch.cat(parts)
        order = torch.tensor([i for group in rows for i in group], device=device)
        return flat[torch.argsort(order)]


def _check_states(cfg: Any, sources: Sequence[Sequence[int]] | None, encoder_states: Any) -> int:
    """The number of sources ``encoder_states`` (``([B, S, d], [B, S])``) hold, or a clear error."""
    if not getattr(cfg, "is_encoder_decoder", False):
        raise ValueError("encoder_states are for encoder-decoder models (a causal LM has no encoder)")
    if not (isinstance(encoder_states, tuple) and len(encoder_states) == 2):
        raise TypeError("encoder_states must be a tuple (states [B, S, d], attention mask [B, S])")
    states, mask = encoder_states
    if states.dim() != 3 or tuple(mask.shape) != tuple(states.shape[:2]):
        raise ValueError(
            f"encoder_states: states [B, S, d] and mask [B, S] expected, got {tuple(states.shape)} and "
            f"{tuple(mask.shape)}"
        )
    if sources is not None and len(sources) != states.shape[0]:
        raise ValueError(f"encoder_states hold {states.shape[0]} sources, sources has {len(sources)}")
    return int(states.shape[0])


def _seq2seq_log_probs(
    model: Any,
    sources: Sequence[Sequence[int]] | None,
    targets: Sequence[Sequence[int]],
    owners: list[int],
    budget: int,
    pad: int,
    device: torch.device,
    encoder_states: tuple[Tensor, Tensor] | None = None,
) -> tuple[list[Tensor], list[list[int]]]:
    from transformers.modeling_outputs import BaseModelOutput

    if encoder_states is not None:
        states, mask = encoder_states  # [B, S, d], [B, S]: owners index their rows
        where = {s: s for s in set(owners)}
    else:
        assert sources is not None
        used = sorted(set(owners))
        where = {s: k for k, s in enumerate(used)}
        src = _padded([sources[s] for s in used], pad, device)
        mask = torch.zeros_like(src)
        for k, s in enumerate(used):
            mask[k, : len(sources[s])] = 1
        states = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state  # [B, S, d]
    start = getattr(model.config, "decoder_start_token_id", None)
    start = pad if start is None else int(start)
    own = torch.tensor([where[o] for o in owners], device=device)
    bias = getattr(model, "final_logits_bias", None)
    head = model.get_output_embeddings()
    lean = bias is not None and head is not None and getattr(head, "bias", None) is None
    groups = budget_groups([len(t) for t in targets], budget)
    parts = []
    for rows in groups:
        labels = _padded([targets[i] for i in rows], -100, device)  # [n, T]
        dec = _padded([[start, *targets[i][:-1]] for i in rows], pad, device)
        o = own[rows]
        if lean:
            hidden = model.get_decoder()(
                input_ids=dec, encoder_hidden_states=states[o], encoder_attention_mask=mask[o]
            ).last_hidden_state  # [n, T, d]
            real = labels != -100
            token = label_log_probs(hidden[real], head.weight, labels[real], bias)
            index = torch.arange(len(rows), device=device).repeat_interleave(real.sum(dim=1))
            parts.append(token.new_zeros(len(rows)).index_add(0, index, token))
        else:
            logits = model(
                attention_mask=mask[o],
                encoder_outputs=BaseModelOutput(last_hidden_state=states[o]),
                decoder_input_ids=dec,
                use_cache=False,
            ).logits
            parts.append(sequence_log_probs(logits, labels))
    return parts, groups


def _causal_log_probs(
    model: Any,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    owners: list[int],
    budget: int,
    pad: int,
    device: torch.device,
) -> tuple[list[Tensor], list[list[int]]]:
    whole = [[*sources[o], *t] for o, t in zip(owners, targets)]
    groups = budget_groups([len(w) for w in whole], budget)
    parts = []
    for rows in groups:
        ids = _padded([whole[i] for i in rows], pad, device)  # right padding: positions 0.. of every row
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for r, i in enumerate(rows):
            n, m = len(whole[i]), len(sources[owners[i]])
            mask[r, :n] = 1
            labels[r, m:n] = ids[r, m:n]
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits  # [n, L, V]
        parts.append(sequence_log_probs(logits[:, :-1], labels[:, 1:]))
    return parts, groups


def distinct_candidates(candidates: Sequence[Sequence[str]], k: int) -> Tensor:
    """Bool ``[B, k]`` (CPU): True at the first occurrence of each distinct text of a row (whitespace
    normalised), False at repeats and padding: the candidates :class:`MinimumRiskLoss` counts.

    Only these need a log-probability, and only in rows with two or more of them: a row with one distinct
    candidate has ``q = 1`` and no gradient, and a repeat has weight 0, whatever ``log_probs`` holds there.
    """
    present = torch.zeros(len(candidates), k, dtype=torch.bool)
    for i, row in enumerate(candidates):
        if isinstance(row, str) or len(row) > k:
            raise ValueError(f"candidates[{i}] must be a list of at most k={k} strings")
        seen: set[str] = set()
        for j, text in enumerate(row):
            key = " ".join(text.split())
            if key not in seen:
                seen.add(key)
                present[i, j] = True
    return present


class MinimumRiskLoss(nn.Module):
    """Expected BERTScore risk of candidate lists; differentiable in their sequence log-probabilities.

    ``forward(log_probs, candidates, references, mask=None)``:

    - ``log_probs`` ``[B, k]``: the model's log-probability of each candidate (e.g. from
      :func:`sequence_log_probs`); the only input that carries a gradient.
    - ``candidates``: ``B`` lists of candidate texts (row ``b`` may hold fewer than ``k``; the rest is
      padding), aligned with ``log_probs``; ``mask`` ``[B, k]`` (True = a real candidate) may mask more.
    - ``references``: one string per row, or a list of strings per row (multi-reference: the utility
      is reduced over them as the scorer's ``multi_ref`` says, ``"max"`` by default).

    Utility = the scorer's ``utility`` measure (F1 by default; rescaled when the scorer rescales, with
    IDF when it has ``idf=True`` and a fixed ``idf_corpus``), risk = ``1 − utility``. Repeated
    candidates of a row count once (the first keeps its place; the others get weight 0), as in Shen et
    al.'s sample sets. A row with one distinct candidate has ``q = 1`` and no gradient. ``alpha``
    sharpens (> 1) or flattens (< 1) the renormalised distribution. The frozen encoder is not a
    submodule (not in ``parameters()`` nor ``state_dict()``).
    """

    scorer: BERTScorer  # kept in __dict__ (see __init__); declared for type checkers

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        scorer: BERTScorer | None = None,
        idf_corpus: Sequence[str] | None = None,
        alpha: float = 1.0,
        utility: Measure = "f1",
        reduction: Literal["mean", "sum", "none"] = "mean",
        **fields: Any,
    ) -> None:
        super().__init__()
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < math.inf:
            raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
        check_measure(utility, "utility")
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        scorer = scorer_from(scorer, config, idf_corpus=idf_corpus, owner="MinimumRiskLoss", **fields)
        if scorer.config.idf and scorer.idf is None:
            raise ValueError("idf=True in MinimumRiskLoss needs a fixed IDF corpus: pass idf_corpus=[...]")
        self.__dict__["scorer"] = scorer  # frozen, outside parameters() and state_dict()
        self.alpha, self.utility_name, self.reduction = float(alpha), utility, reduction

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, utility={self.utility_name!r}, reduction={self.reduction!r}"

    @torch.no_grad()
    def utilities(
        self, candidates: Sequence[Sequence[str]], references: Sequence[str] | Sequence[Sequence[str]], k: int
    ) -> Tensor:
        """Utility ``[B, k]`` (float32, CPU) of every candidate, NaN at padding: one
        :meth:`BERTScorer.score_groups` call for all rows (the engine the reranker uses)."""
        scores = self.scorer.score_groups(candidates, references, progress=False)  # a training step: no bar
        values = getattr(scores, self.utility_name).float()
        out = torch.full((len(candidates), k), float("nan"))
        out[:, : values.shape[1]] = values
        return out

    def forward(
        self,
        log_probs: Tensor,
        candidates: Sequence[Sequence[str]],
        references: Sequence[str] | Sequence[Sequence[str]],
        mask: Tensor | None = None,
    ) -> RiskOutput:
        if not isinstance(log_probs, Tensor) or log_probs.dim() != 2 or not torch.is_floating_point(log_probs):
            shape = tuple(log_probs.shape) if isinstance(log_probs, Tensor) else type(log_probs).__name__
            raise ValueError(f"log_probs must be a float tensor [batch, k], got {shape}")
        b, k = log_probs.shape
        if isinstance(candidates, str) or len(candidates) != b:
            raise ValueError(f"candidates must be {b} lists of texts (one per row of log_probs), got {len(candidates)}")
        if isinstance(references, str) or len(references) != b:
            raise ValueError(f"references must hold {b} entries (a string or a list of strings per row)")
        for i, row in enumerate(candidates):
            if isinstance(row, str) or len(row) > k or not all(isinstance(c, str) for c in row):
                raise ValueError(f"candidates[{i}] must be a list of at most {k} strings")
        present = distinct_candidates(candidates, k)
        if mask is not None:
            if mask.shape != (b, k):
                raise ValueError(f"mask must be [batch, k] = {(b, k)}, got {tuple(mask.shape)}")
            present &= mask.bool().cpu()
        present = present.to(log_probs.device)
        if not bool(torch.isfinite(log_probs[present]).all()):
            raise ValueError("log_probs holds NaN or ±inf at a real candidate")
        utility = self.utilities(candidates, references, k).to(
            log_probs.device, torch.promote_types(log_probs.dtype, torch.float32)
        )
        risk = 1.0 - utility
        logits = (self.alpha * log_probs.to(torch.promote_types(log_probs.dtype, torch.float32))).masked_fill(
            ~present, float("-inf")
        )
        has_any = present.any(dim=1)
        q = torch.softmax(logits.masked_fill(~has_any.unsqueeze(1), 0.0), dim=1) * present
        per_row = (q * torch.nan_to_num(risk, nan=0.0)).sum(dim=1)
        if self.reduction == "none":
            loss = per_row
        elif self.reduction == "sum":
            loss = per_row[has_any].sum()
        else:
            loss = per_row[has_any].mean() if bool(has_any.any()) else per_row.sum() * 0.0
        return RiskOutput(loss, risk, q, utility)
