"""Differentiable BERTScore: :class:`BERTScoreLoss`, an ``nn.Module`` over a frozen encoder."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, cast

import torch
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from ._loading import warn
from .bridge import VocabBridge
from .cache import EmbeddingCache
from .config import Measure, ScorerConfig, check_measure, check_number
from .encoder import FrozenEncoder
from .matching import MaxMode, bertscore, f_score, rescale
from .registry import is_registered, private_copy
from .scorer import BERTScorer, scorer_from
from .token_distributions import Gumbel, TopK, expected_rows, expected_top_k, to_probs, top_k_probs
from .validation import references_are_text

__all__ = ["BERTScoreLoss", "LossConfig", "LossOutput", "references_are_text"]


@dataclass(frozen=True)
class LossConfig:
    """Settings of :class:`BERTScoreLoss` beyond the encoder's (those are a :class:`ScorerConfig`).

    ``max_mode``/``temperature``: max over the cosine matrix (``hard``, ``soft``, ``straight_through``);
    ``inputs``: float candidates are ``logits`` or ``probs``; ``logit_temperature``: softmax temperature
    on them; ``top_k``: renormalise over the k most probable tokens (avoids the ``V × d`` product);
    ``gumbel``: ``None``, ``"soft"`` or ``"hard"`` (straight-through) Gumbel-softmax; ``measure``:
    ``"f1"`` (F_beta with ``beta``; F1 at the default ``beta=1``), ``"precision"`` or ``"recall"``;
    the loss is ``1 − measure``, reduced by ``reduction`` (``mean``, ``sum``, ``none``); with a rescaling
    scorer P, R and F are rescaled as the scorer rescales them (the loss is then ``(1 − raw) / (1 − b)``);
    ``ref_cache_bytes``: the loss's own cache of reference embeddings (LRU, by text; 0 = off). It holds
    references only, so that a training set's references are encoded in the first epoch and reused after:
    Multi30k's 29,000 English references take 661 MB with the bundled MiniLM (an LRU smaller than the set
    cycled every epoch keeps almost none of it).

    Frozen and checked when built: NaN, infinite or out-of-range values are a ValueError naming the field
    (change a setting with ``dataclasses.replace``).
    """

    max_mode: MaxMode = "straight_through"
    temperature: float = 0.05
    inputs: Literal["logits", "probs"] = "logits"
    logit_temperature: float = 1.0
    top_k: int | None = None
    gumbel: Gumbel = None
    measure: Measure = "f1"
    beta: float = 1.0
    reduction: Literal["mean", "sum", "none"] = "mean"
    ref_cache_bytes: int = 1 << 30

    def __post_init__(self) -> None:
        if self.max_mode not in ("hard", "soft", "straight_through"):
            raise ValueError(f"max_mode must be 'hard', 'soft' or 'straight_through', got {self.max_mode!r}")
        if self.inputs not in ("logits", "probs"):
            raise ValueError(f"inputs must be 'logits' or 'probs', got {self.inputs!r}")
        if self.gumbel not in (None, "soft", "hard"):
            raise ValueError(f"gumbel must be None, 'soft' or 'hard', got {self.gumbel!r}")
        check_measure(self.measure)
        if self.reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {self.reduction!r}")
        check_number(self.temperature, "temperature", positive=True)
        check_number(self.logit_temperature, "logit_temperature", positive=True)
        check_number(self.beta, "beta", positive=True)
        check_number(self.top_k, "top_k", integer=True, at_least=1, allow_none=True)
        check_number(self.ref_cache_bytes, "ref_cache_bytes", integer=True, at_least=0)


def attention_kernel(inputs: Tensor) -> contextlib.AbstractContextManager[None]:
    """The scaled-dot-product attention kernel for the encoder pass over ``inputs`` ``[B, L, d]``.

    A bf16 pass with gradient on CPU (bf16 weights, or a bf16 ``torch.autocast``) uses SDPA's math kernel:
    PyTorch's fused CPU attention has a slow bf16 backward (MiniLM layer 4, 146 candidates of 22 tokens, one
    thread: 1.56 s against 0.28 s; the values agree to bf16 rounding). Otherwise SDPA chooses, as before.
    """
    cpu_bf16 = inputs.device.type == "cpu" and (
        inputs.dtype == torch.bfloat16
        or (torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16)
    )
    if cpu_bf16 and torch.is_grad_enabled() and inputs.requires_grad:
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


class LossOutput(NamedTuple):
    """``loss`` (scalar, or ``[B]`` with ``reduction="none"``) and per-example P, R, F ``[B]``."""

    loss: Tensor
    precision: Tensor
    recall: Tensor
    f1: Tensor


_LOSS_FIELDS = {f.name for f in dataclasses.fields(LossConfig)}


def _check_distributions(probs: Tensor, mask: Tensor, tol: float = 1e-3) -> None:
    """ValueError naming the first real position (``mask`` ``[B, T]``) whose row of ``probs`` ``[B, T, V]`` is
    not a distribution (a negative entry, or a sum off 1 by more than ``tol``)."""
    total = probs.sum(dim=-1, dtype=torch.float32)
    bad = mask & (((total - 1).abs() > tol) | (probs.amin(dim=-1) < 0))
    if bool(bad.any()):
        b, t = (int(v) for v in bad.nonzero()[0])
        raise ValueError(
            f"inputs='probs' but candidates[{b}, {t}] is not a distribution (sum {float(total[b, t]):.4g}, "
            f"min {float(probs[b, t].min()):.4g}): give probabilities that sum to 1, or logits with inputs='logits'"
        )


class BERTScoreLoss(nn.Module):
    """BERTScore of generated candidates against references, differentiable in the candidates.

    ``forward(candidates, references, candidate_mask=None, reference_mask=None)``:

    - ``candidates``: encoder token ids ``[B, T]`` (long), or logits/probabilities ``[B, T, V]`` over
      the encoder's vocabulary (or the generator's, with ``bridge``); ``candidate_mask`` ``[B, T]``
      (True = a real token) excludes padding and positions after EOS.
    - ``references``: ``B`` strings, or framed encoder token ids (as ``FrozenEncoder.tokenize`` gives;
      a padded ``[B, L]`` tensor with ``reference_mask`` ``[B, L]``, True = a real token: ids holding the
      pad id without a mask are refused); encoded without gradient and cached by content.

    The candidate is framed with the encoder's special tokens as one-hot rows, exactly as the
    evaluation mode tokenises, so one-hot inputs with ``max_mode="hard"`` reproduce
    :meth:`BERTScorer.score`. The encoder is frozen, stays in eval mode, is not a submodule (so it is
    in neither ``parameters()`` nor ``state_dict()``), and follows ``.to()``.
    """

    scorer: BERTScorer  # not a submodule (kept in __dict__), declared for type checkers
    bridge: VocabBridge | None
    vocab_weight: Tensor

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        scorer: BERTScorer | None = None,
        encoder: FrozenEncoder | None = None,
        idf_corpus: Sequence[str] | None = None,
        bridge: VocabBridge | None = None,
        loss: LossConfig | None = None,
        **fields: Any,
    ) -> None:
        super().__init__()
        loss_fields = {k: fields.pop(k) for k in list(fields) if k in _LOSS_FIELDS}
        self.loss_config = dataclasses.replace(loss or LossConfig(), **loss_fields)  # validated when built
        scorer = scorer_from(scorer, config, idf_corpus=idf_corpus, encoder=encoder, owner="BERTScoreLoss", **fields)
        if scorer.baseline is not None and self.loss_config.beta != 1.0:
            raise ValueError("beta != 1 with a rescaling scorer: the baseline has rows for P, R and F1 only")
        if scorer.config.idf and scorer.idf is None:
            raise ValueError(
                "idf=True in the loss needs a fixed IDF corpus: pass idf_corpus=[...] (e.g. the training references)"
            )
        # Not registered as a submodule: outside parameters(), state_dict() and the parent's train().
        self.__dict__["scorer"] = scorer
        enc = scorer.encoder
        vocab_weight = scorer.vocab_weights()  # the scorer's own token weights: one rule for both sides
        self.register_buffer("vocab_weight", vocab_weight.to(enc.device), persistent=False)
        self.bridge = bridge
        prefix, suffix = enc.framing
        self._prefix, self._suffix = prefix, suffix

    # --- frozen-encoder discipline --------------------------------------------------------------
    @property
    def encoder(self) -> FrozenEncoder:
        return self.scorer.encoder

    def _apply(self, fn: Callable[[Tensor], Tensor], *args: object, **kwargs: object) -> BERTScoreLoss:
        """``.to()``, ``.cuda()``, ``.double()`` ... also move the (unregistered) encoder and its cache.

        An encoder taken from the registry is never changed under its other users: a device change
        switches the loss to the registry's copy on the new device; a dtype change (``.double()``)
        gives the loss a private copy (outside the registry) in the new dtype.
        """
        super()._apply(fn, *args, **kwargs)
        enc = self.encoder
        if is_registered(enc):  # shared with other scorers, losses, metrics: never changed under them
            probe = fn(torch.zeros((), dtype=enc.dtype, device=enc.device))
            if probe.dtype == enc.dtype and probe.device == enc.device:
                return self
            if probe.dtype == enc.dtype:
                self.__dict__["scorer"] = self.scorer.on(probe.device)
                self.reference_cache.clear()  # cached rows live on the old device
                return self
            enc = private_copy(enc)
            self.scorer.encoder = enc
        enc._apply(fn, *args, **kwargs)
        enc.cache.clear()
        self.reference_cache.clear()
        return self

    @property
    def reference_cache(self) -> EmbeddingCache:
        """The loss's cache of reference embeddings (``hits``/``misses`` count texts; see ``ref_cache_bytes``).

        Keyed by text (or token ids) and by the autocast dtype the reference was encoded under, so a
        reference encoded inside a ``bf16-mixed`` step is never served to an fp32 call, and the encoder's
        shared cache (which exact evaluation reads) never holds autocast embeddings from the loss.
        """
        cache = self.__dict__.get("_reference_cache")
        if cache is None:
            cache = EmbeddingCache(self.loss_config.ref_cache_bytes)
            self.__dict__["_reference_cache"] = cache
        return cache

    # --- inputs ---------------------------------------------------------------------------------
    def _tables(self, first: bool = False) -> tuple[Tensor, Tensor]:
        """Embedding table ``[V, d]`` and token weights ``[V]`` of the candidate vocabulary.

        With a bridge these are its mean tables over the generator vocabulary (the forward of
        ``mode="mean"``, the straight-through gradient of ``mode="retokenize"``); ``first`` gives the
        tables for a text's first token.
        """
        if self.bridge is not None:
            table = self.bridge.first_embeddings if first else self.bridge.embeddings
            return table, self.bridge.weights(self.vocab_weight, first)
        return self.encoder.input_embeddings, self.vocab_weight

    def candidate_inputs(self, candidates: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Word embeddings ``[B, L, d]``, weights ``[B, L]`` and mask ``[B, L]`` of hard or soft candidates.

        ``candidates``: ids ``[B, T]`` or logits/probabilities ``[B, T, V]``, ``mask`` ``[B, T]``. Without
        a bridge or with ``mode="mean"`` one row per position (``L = T``, the mask is ``mask``); with
        ``mode="retokenize"`` the rows are the encoder pieces of the decoded (argmax) text, ``L`` the most
        pieces of a row, with a straight-through mean-bridge gradient for soft inputs.
        """
        table, _ = self._tables()
        hard = not torch.is_floating_point(candidates)
        rows: Tensor | TopK
        if hard:
            if candidates.dim() != 2:
                raise ValueError(f"token-id candidates must be [batch, length], got shape {tuple(candidates.shape)}")
            if candidates.numel() and (candidates.min() < 0 or candidates.max() >= table.shape[0]):
                raise ValueError(f"candidate token ids must lie in [0, {table.shape[0]})")
            rows = candidates
        else:
            if candidates.dim() != 3:
                shape = tuple(candidates.shape)
                raise ValueError(f"soft candidates must be [batch, length, vocab], got shape {shape}")
            if candidates.shape[-1] != table.shape[0] and self.bridge is not None:
                raise ValueError(
                    f"the generator outputs {candidates.shape[-1]} entries per token but the VocabBridge maps a "
                    f"tokenizer of {table.shape[0]} tokens: build the bridge from the generator's own tokenizer "
                    "(a sentencepiece .model file can be passed directly)"
                )
            if candidates.shape[-1] != table.shape[0]:
                raise ValueError(
                    f"the candidate distribution has {candidates.shape[-1]} entries per token but the embedding "
                    f"table has {table.shape[0]} rows: give probabilities over the encoder's vocabulary or use a "
                    "VocabBridge"
                )
            lc = self.loss_config
            if self.sparse_inputs(candidates):
                top = top_k_probs(
                    candidates, lc.top_k or 0, temperature=lc.logit_temperature, gumbel=lc.gumbel, mask=mask
                )
                rows, probs = top, top.probs
            else:
                probs = to_probs(candidates, inputs=lc.inputs, temperature=lc.logit_temperature, gumbel=lc.gumbel)
                rows = probs
            if torch.isnan(probs.detach()[mask]).any():
                raise ValueError(
                    "the candidate distribution is NaN at a real (unmasked) position: NaN, +inf or all -inf "
                    f"{lc.inputs} there (mask such positions with candidate_mask)"
                )
            if lc.inputs == "probs" and not isinstance(rows, TopK):
                _check_distributions(candidates.detach(), mask)
        if self.bridge is None or self.bridge.mode != "retokenize":
            emb, w = self._position_rows(rows, mask, hard)
            return emb, w, mask
        # Retokenize: the exact pieces of the decoded text; soft inputs score their argmax text.
        if isinstance(rows, TopK):
            best = rows.best
        else:
            best = rows if hard else rows.argmax(dim=-1)
        pieces = self.bridge.retokenize(best, mask, route=not hard)
        emb = self.encoder.input_embeddings[pieces.piece_ids]
        w = self.vocab_weight[pieces.piece_ids] * pieces.mask
        if not hard:
            # Straight-through: exact value forward, the mean bridge's gradient routed to the covering positions.
            s, u = self._position_rows(rows, mask, hard)  # [B, T, d], [B, T]
            route = pieces.route.to(s.dtype)  # [B, L, T]
            emb = emb.to(s.dtype) + route @ (s - s.detach())
            w = w.to(u.dtype) + (route @ (u - u.detach()).unsqueeze(-1)).squeeze(-1)
        return emb, w, pieces.mask

    def sparse_inputs(self, candidates: Tensor) -> bool:
        """Whether soft ``candidates`` take the sparse top-k path (:func:`top_k_probs`, an embedding bag):
        ``top_k`` below the vocabulary, logits inputs, no or soft Gumbel noise. Same values and gradients
        as the dense path (tests/test_fast_objectives.py), without the ``[B, T, V]`` softmax."""
        lc = self.loss_config
        return (
            torch.is_floating_point(candidates)
            and lc.top_k is not None
            and lc.top_k < candidates.shape[-1]
            and lc.inputs == "logits"
            and lc.gumbel in (None, "soft")
        )

    def _position_rows(self, rows: Tensor | TopK, mask: Tensor, hard: bool) -> tuple[Tensor, Tensor]:
        """One embedding ``[B, T, d]`` and weight ``[B, T]`` per position, for ids ``[B, T]``, probs ``[B, T, V]``
        or a :class:`TopK` of them."""
        table, weight = self._tables()
        top_k = self.loss_config.top_k

        def expect(r: Tensor | TopK, tab: Tensor) -> Tensor:
            if isinstance(r, TopK):
                return expected_top_k(r, tab)
            return tab[r] if hard else expected_rows(r, tab, top_k)

        emb, w = expect(rows, table), expect(rows, weight)
        if self.bridge is not None and emb.shape[1]:
            # The first real token of each text starts a word: take it from the bridge's first-token table.
            first = mask.long().argmax(dim=1, keepdim=True)  # [B, 1]
            ftable, fweight = self._tables(first=True)
            picked: Tensor | TopK
            if isinstance(rows, TopK):
                picked = rows.select(first)
            else:
                picked = rows.gather(1, first if hard else first.unsqueeze(-1).expand(-1, 1, rows.shape[-1]))
            femb, fw = expect(picked, ftable), expect(picked, fweight)
            emb = emb.scatter(1, first.unsqueeze(-1).expand(-1, 1, emb.shape[-1]), femb.to(emb.dtype))
            w = w.scatter(1, first, fw.to(w.dtype))
        return emb, w

    def frame(self, emb: Tensor, weight: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Put the special tokens around each candidate's real tokens (cut to the model's maximum, with a
        warning, unless the encoder has ``long_inputs="window"``: then long rows are encoded in windows, as the
        scorer encodes long texts).

        ``emb`` ``[B, T, d]``, ``weight``/``mask`` ``[B, T]`` → framed ``[B, L, d]``, ``[B, L]``, ``[B, L]``
        with ``L = len(prefix) + T + len(suffix)``; real tokens are packed to the front first.
        """
        b, t, _ = emb.shape
        order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
        emb = emb.gather(1, order.unsqueeze(-1).expand_as(emb))
        weight = weight.gather(1, order)
        lengths = mask.sum(dim=1)
        npre, nsuf = len(self._prefix), len(self._suffix)
        limit = self.encoder.max_length - npre - nsuf
        if lengths.numel() and int(lengths.max()) > limit and self.encoder.long_inputs != "window":
            warn(f"{int((lengths > limit).sum())} candidate(s) are longer than the model's maximum and were truncated")
            lengths = lengths.clamp_max(limit)
            t = min(t, limit)
            emb, weight = emb[:, :t], weight[:, :t]
        table = self.encoder.input_embeddings.to(emb.dtype)
        special = torch.tensor(self._prefix + self._suffix, dtype=torch.long, device=emb.device)
        special_rows = table[special] if special.numel() else emb.new_zeros((0, emb.shape[-1]))
        width = npre + t + nsuf
        pos = torch.arange(width, device=emb.device).unsqueeze(0).expand(b, width)
        rel = pos - npre  # position within the content
        in_content = (rel >= 0) & (rel < lengths.unsqueeze(1))
        suf_rel = rel - lengths.unsqueeze(1)
        in_suffix = (suf_rel >= 0) & (suf_rel < nsuf)
        content = emb.gather(1, rel.clamp(0, max(t - 1, 0)).unsqueeze(-1).expand(b, width, emb.shape[-1]))
        special_index = torch.where(pos < npre, pos, npre + suf_rel.clamp(0, max(nsuf - 1, 0)))
        specials = special_rows[special_index.clamp_max(max(len(special) - 1, 0))]
        is_special = (pos < npre) | in_suffix
        framed = torch.where(in_content.unsqueeze(-1), content, torch.where(is_special.unsqueeze(-1), specials, 0.0))
        content_w = weight.gather(1, rel.clamp(0, max(t - 1, 0)))
        framed_w = torch.where(in_content, content_w, torch.zeros_like(content_w))
        return framed, framed_w, in_content | is_special

    # --- references -----------------------------------------------------------------------------
    def reference_inputs(
        self, references: Sequence[str] | Sequence[Sequence[int]] | Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Unit-normalised reference embeddings ``[B, Lr, d]``, mask and weights ``[B, Lr]`` (no gradient).

        Token-id references are framed ids without padding; a padded ``[B, L]`` tensor needs ``mask``
        ``[B, L]`` (True = a real token). Ids that hold the tokenizer's pad id without a mask are refused:
        padding would be scored as a real token.
        """
        # references_are_text checks which of the two kinds ``references`` is; cast() records it for mypy.
        if not references_are_text(references):
            rows = self._reference_rows(cast("Sequence[Sequence[int]] | Tensor", references), mask)
            packed, _, _ = self.encoder.embed_token_ids(
                rows, batch_tokens=self.scorer.config.batch_tokens, cache=self.reference_cache
            )
        else:
            if mask is not None:
                raise ValueError("reference_mask applies to token-id references only, not to text")
            packed, _ = self.scorer.embed(cast("Sequence[str]", references), cache=self.reference_cache)
        weight = self.scorer.weights(packed)
        return packed.gather(torch.arange(len(references), device=packed.flat.device), weight)

    def _reference_rows(self, references: Sequence[Sequence[int]] | Tensor, mask: Tensor | None) -> list[list[int]]:
        """Checked id lists of token-id references (``mask`` drops padding); see :meth:`reference_inputs`."""
        vocab = self.encoder.vocab_size
        pad = self.encoder.tokenizer.pad_token_id
        if mask is not None:
            if not isinstance(references, Tensor) or not isinstance(mask, Tensor):
                raise TypeError("reference_mask goes with references given as one [batch, length] tensor of ids")
            if tuple(mask.shape) != tuple(references.shape):
                raise ValueError(
                    f"reference_mask must have the references' shape {tuple(references.shape)}, got {tuple(mask.shape)}"
                )
        rows = []
        for i, row in enumerate(references):
            ids = row.tolist() if isinstance(row, Tensor) else list(row)
            if mask is not None:
                keep = mask[i].bool().tolist()
                ids = [t for t, k in zip(ids, keep) if k]
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab]
            if bad:
                raise ValueError(
                    f"references[{i}] holds token id {bad[0]!r} outside the encoder vocabulary [0, {vocab})"
                )
            if mask is None and pad is not None and pad in ids:
                raise ValueError(
                    f"references[{i}] holds the pad id {pad}: padding would be scored as a token; pass "
                    "reference_mask=... (True = real token) with a padded tensor, or unpadded id lists"
                )
            rows.append(ids)
        return rows

    # --- forward --------------------------------------------------------------------------------
    def forward(
        self,
        candidates: Tensor,
        references: Sequence[str] | Sequence[Sequence[int]] | Tensor,
        candidate_mask: Tensor | None = None,
        reference_mask: Tensor | None = None,
    ) -> LossOutput:
        """:class:`LossOutput` of ``candidates`` against ``references`` (see the class docstring).

        A batch of 0 rows gives a zero loss (connected to ``candidates``) and empty P/R/F; 0 positions
        (``T = 0``) or a fully masked row is an empty candidate: P = R = F = 0 (loss 1) with a warning.
        Masked positions never matter, whatever they hold (NaN or infinite logits included: their
        gradient is 0); NaN probabilities at a real position (NaN, +inf or all -inf logits) are an error.
        """
        if not isinstance(candidates, Tensor):
            raise TypeError(
                f"candidates must be a torch.Tensor (token ids [B, T] or logits/probabilities [B, T, V]), "
                f"got {type(candidates).__name__}"
            )
        references_are_text(references)  # TypeError naming a str, None or a list of references
        if candidates.dim() not in (2, 3):
            raise ValueError(
                f"candidates must be [batch, length] ids or [batch, length, vocab] scores, "
                f"got shape {tuple(candidates.shape)}"
            )
        if len(references) != candidates.shape[0]:
            raise ValueError(
                f"got {candidates.shape[0]} candidates but {len(references)} references: the lengths must match"
            )
        lc = self.loss_config
        device = self.encoder.device
        candidates = candidates.to(device)
        if candidate_mask is None:
            candidate_mask = torch.ones(candidates.shape[:2], dtype=torch.bool, device=device)
        elif candidate_mask.shape != candidates.shape[:2]:
            shape = tuple(candidate_mask.shape)
            raise ValueError(f"candidate_mask must have shape {tuple(candidates.shape[:2])}, got {shape}")
        candidate_mask = candidate_mask.to(device).bool()
        if candidates.shape[0] == 0:
            zero = candidates.sum() * 0.0 if torch.is_floating_point(candidates) else torch.zeros((), device=device)
            empty = torch.zeros(0, device=device)
            return LossOutput(zero if lc.reduction != "none" else empty, empty, empty, empty)
        if candidates.shape[1] == 0:  # T = 0: one masked position, so every row is an empty candidate
            candidates = torch.cat(
                (candidates, candidates.new_zeros((candidates.shape[0], 1, *candidates.shape[2:]))), 1
            )
            candidate_mask = torch.zeros(candidates.shape[:2], dtype=torch.bool, device=device)
        empty_rows = int((candidate_mask.sum(dim=1) == 0).sum())
        if empty_rows:
            warn(f"{empty_rows} candidate(s) have no real position (T = 0 or fully masked): P = R = F = 0, loss 1")
        if torch.is_floating_point(candidates) and not self.sparse_inputs(candidates):
            # Masked positions are replaced (zero gradient there, whatever they held: NaN/inf never leaks);
            # the sparse top-k path masks its [B, T, k] entries instead (no [B, T, V] copy).
            candidates = candidates.masked_fill(~candidate_mask.unsqueeze(-1), 0.0)
        emb, weight, content_mask = self.candidate_inputs(candidates, candidate_mask)
        p, r, f, value = self.score_rows(emb, weight, content_mask, references, reference_mask=reference_mask)
        loss = 1.0 - value
        if lc.reduction == "mean":
            loss = loss.mean()
        elif lc.reduction == "sum":
            loss = loss.sum()
        return LossOutput(loss, p, r, f)

    def score_rows(
        self,
        emb: Tensor,
        weight: Tensor,
        mask: Tensor,
        references: Sequence[str] | Sequence[Sequence[int]] | Tensor,
        max_mode: MaxMode | None = None,
        reference_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """P, R, F and the configured measure, each ``[B]``, of unframed candidate rows.

        ``emb`` ``[B, T, d]`` word embeddings, ``weight``/``mask`` ``[B, T]`` (as :meth:`candidate_inputs`
        gives); ``max_mode`` overrides the configured one (``"hard"`` = the exact evaluation value).
        """
        lc = self.loss_config
        framed, cand_w, cand_mask = self.frame(emb, weight, mask)
        framed = framed.to(self.encoder.input_embeddings.dtype)
        with attention_kernel(framed):
            if framed.shape[1] > self.encoder.max_length:  # only with long_inputs="window": as the scorer
                hidden = self.encoder.forward_windowed(framed, cand_mask.sum(dim=1))
            else:
                hidden = self.encoder(inputs_embeds=framed, attention_mask=cand_mask.long())
        ref_emb, ref_mask, ref_w = self.reference_inputs(references, reference_mask)
        if not torch.is_autocast_enabled(hidden.device.type):
            ref_emb = ref_emb.to(hidden.dtype)
        mode = max_mode or lc.max_mode
        p, r, f = bertscore(hidden, ref_emb, cand_mask, ref_mask, cand_w, ref_w, mode=mode, temperature=lc.temperature)
        if lc.beta != 1.0:
            f = f_score(p, r, lc.beta)
        base = self.scorer.baseline
        if base is not None:  # a rescaling scorer: the loss's P, R, F (and so 1 - measure) are rescaled too
            base = base.to(device=p.device, dtype=p.dtype)
            p, r, f = rescale(p, base[0]), rescale(r, base[1]), rescale(f, base[2])
        return p, r, f, {"f1": f, "precision": p, "recall": r}[lc.measure]
