"""``BERTScoreMetric``: a torchmetrics metric for ``validation_step`` whose states are scores, never token ids."""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from ..cache import EmbeddingCache
from ..config import ScorerConfig
from ..encoder import ACCEL_BATCH_TOKENS
from ..registry import encoder_on
from ..scorer import BERTScorer
from ..textio import read_corpus
from ..validation import check_pairs, check_texts

logger = logging.getLogger(__name__)

_MEASURES = ("precision", "recall", "f1")

#: Default padded-token budget of one encoder batch on CPU *for validation batches* (the core's general
#: CPU default is ``encoder.CPU_BATCH_TOKENS`` = 2048). A validation batch is encoded in one call, so
#: the budget decides how many length-sorted sub-batches it is split into: with 8192 a batch of 64 WMT16
#: pairs is one batch padded to its longest text (2.7x the real tokens), with 1024 about 1.4x; an epoch over
#: 512 WMT16 dev pairs at MiniLM layer 4 on one CPU thread took 24.6 s with 8192 and 13.3 s with 1024.
#: On accelerators the core's ``ACCEL_BATCH_TOKENS`` (8192) applies.
METRIC_CPU_BATCH_TOKENS = 1024


def idf_sentences(corpus: str | os.PathLike | Sequence[str]) -> list[str]:
    """An IDF corpus given as a list of sentences or as a UTF-8 file (one sentence per line, duplicates kept)."""
    if isinstance(corpus, (str, os.PathLike)):
        return read_corpus(corpus, distinct=False, what="idf_corpus")
    return check_texts(corpus, "idf_corpus")


def _cat(state: Tensor | list[Tensor]) -> Tensor | None:
    """A list state concatenated (it is already a tensor after a DDP sync); None when nothing was added."""
    if isinstance(state, Tensor):
        return state
    return dim_zero_cat(state) if state else None


class BERTScoreMetric(Metric):
    """BERTScore P/R/F for validation loops, exact as :meth:`BERTScorer.score` with the same settings.

    ``update(preds, target)`` encodes and scores the batch at once on this rank; the states are the
    scores only, so under DDP each rank encodes just its own shard and :meth:`compute` syncs numbers.

    * ``per_sample=False`` (default): running sums; ``compute()`` gives ``{"precision", "recall", "f1"}``
      means (0-dim float32 tensors).
    * ``per_sample=True``: per-sample lists (``dist_reduce_fx="cat"``); ``compute()`` gives the per-sample
      tensors ``[N]`` (rank-major order under DDP, or ascending ``index`` when every ``update`` gets one;
      duplicated indices, e.g. from a padding ``DistributedSampler``, are then kept once).

    The encoder comes from the process-wide registry (:func:`bertscore_loss.registry.encoder_for`): metrics with
    the same settings share one copy, it is not a submodule (never in a ``state_dict`` nor in
    ``parameters()``), and it follows the metric's device (``.to("cuda")`` switches to the registry's
    copy on that device; the copy on the old device is freed once no metric holds it).

    ``idf=True`` needs ``idf_corpus`` (a list of sentences or a text file, one per line): the IDF table
    is fixed at construction and never recomputed per batch. ``rescale=True`` uses ``baseline`` (a
    ``LAYER,P,R,F`` file; None = the packaged one of the model). ``target`` may hold several references
    per prediction (a list of str each), reduced by ``multi_ref``. ``batch_tokens``: padded tokens per
    encoder batch (None = 1024 on CPU, 8192 elsewhere: a validation batch is split into length-sorted
    sub-batches, and on CPU less padding wins). ``ref_cache_bytes`` bounds a cache of
    reference embeddings (LRU, 0 = off): references seen in an earlier epoch are not re-encoded, so
    later epochs encode only the predictions. Predictions are never cached.
    Other keyword arguments go to :class:`torchmetrics.Metric` (``sync_on_compute``, ``process_group``, ...).
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    # States added in __init__ (add_state), declared for type checkers; a list state is a tensor after a
    # DDP sync (see _cat). The measures' states are read by name (getattr).
    index: list[Tensor]
    total: Tensor

    def __init__(
        self,
        model: str | None = None,
        layer: int | None = None,
        *,
        idf: bool = False,
        idf_corpus: str | os.PathLike | Sequence[str] | None = None,
        rescale: bool = False,
        baseline: str | None = None,
        multi_ref: Literal["max", "best_f"] = "max",
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        batch_tokens: int | None = None,
        max_elements: int | None = None,
        per_sample: bool = False,
        ref_cache_bytes: int = 256 << 20,
        allow_download: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if idf and idf_corpus is None:
            raise ValueError(
                "idf=True needs idf_corpus (a list of sentences or a file path): the metric fixes its IDF "
                "table at construction instead of recomputing it from each batch's references"
            )
        if idf_corpus is not None and not idf:
            raise ValueError("idf_corpus is given but idf=False: pass idf=True to weight tokens by IDF")
        if ref_cache_bytes < 0:
            raise ValueError(f"ref_cache_bytes must be >= 0, got {ref_cache_bytes}")
        config = ScorerConfig(
            model=model,
            layer=layer,
            idf=idf,
            rescale=rescale,
            baseline=baseline,
            dtype=dtype,
            batch_tokens=batch_tokens or METRIC_CPU_BATCH_TOKENS,
            max_elements=max_elements,
            multi_ref=multi_ref,
            cache_bytes=0,  # the encoder-level cache would also keep predictions; refs use our own cache
            progress=False,
            allow_download=allow_download,
        )
        if batch_tokens is not None and batch_tokens < 1:
            raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
        self.per_sample = bool(per_sample)
        self._batch_tokens = batch_tokens
        self._ref_cache = EmbeddingCache(int(ref_cache_bytes))
        config.validate()
        self._encoder_config = dataclasses.replace(config)  # the layer as asked: the registry key
        encoder = encoder_on(self._encoder_config, self.device)
        corpus = idf_sentences(idf_corpus) if idf_corpus is not None else None
        # A plain attribute (BERTScorer is not an nn.Module): the encoder stays out of the module tree.
        self._scorer = BERTScorer(config, encoder=encoder, idf_corpus=corpus)
        self._scorer.config.batch_tokens = self._budget(encoder.device)
        if self.per_sample:
            for name in _MEASURES:
                self.add_state(name, default=[], dist_reduce_fx="cat")
            self.add_state("index", default=[], dist_reduce_fx="cat")
        else:
            for name in _MEASURES:
                self.add_state(f"sum_{name}", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")

    # --- the shared encoder follows the metric's device ------------------------------------------
    @property
    def scorer(self) -> BERTScorer:
        """The :class:`BERTScorer` (config, IDF table, baseline) bound to the encoder on this metric's device."""
        enc = self._scorer.encoder
        if enc is None or enc.device != self.device:
            self._scorer.encoder = encoder_on(self._encoder_config, self.device)
            self._scorer.config.batch_tokens = self._budget(self.device)
            self._ref_cache.clear()  # cached rows live on the old device
        return self._scorer

    def _budget(self, device: torch.device) -> int:
        """Padded tokens per encoder batch: as given, else by device kind (see ``CPU_BATCH_TOKENS``)."""
        if self._batch_tokens is not None:
            return self._batch_tokens
        return METRIC_CPU_BATCH_TOKENS if device.type == "cpu" else ACCEL_BATCH_TOKENS

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> torch.nn.Module:
        this = super()._apply(fn, *args, **kwargs)
        if self._scorer.encoder is not None and self._scorer.encoder.device != self.device:
            _ = self.scorer  # rebind now, so the encoder on the old device is released
        return this

    def __getstate__(self) -> dict[str, Any]:
        """Pickle (``ddp_spawn``, ``deepcopy``) without the encoder; it is taken from the registry again."""
        state = super().__getstate__()
        light = copy.copy(self._scorer)
        # No encoder in the pickle: None until the ``scorer`` property rebinds one (BERTScorer.encoder is
        # typed FrozenEncoder for every other user, so the attribute is set through __dict__).
        light.__dict__["encoder"] = None
        state["_scorer"] = light
        state["_ref_cache"] = EmbeddingCache(self._ref_cache.max_bytes)
        return state

    @property
    def encoder_device(self) -> torch.device | None:
        enc = self._scorer.encoder
        return None if enc is None else enc.device

    @property
    def ref_cache(self) -> EmbeddingCache:
        """The reference-embedding cache (``hits``/``misses`` count texts)."""
        return self._ref_cache

    # --- update / compute ---------------------------------------------------------------------
    def update(
        self,
        preds: str | Sequence[str],
        target: str | Sequence[str] | Sequence[Sequence[str]],
        index: Tensor | Sequence[int] | None = None,
    ) -> None:
        """Score ``preds`` (``N`` str) against ``target`` (``N`` str, or ``N`` lists of str for multi-reference).

        ``index`` ``[N]`` (optional, ``per_sample=True`` only): dataset indices of the samples, so that
        :meth:`compute` returns them in dataset order with duplicates dropped.
        """
        if isinstance(preds, str):
            cands, groups = check_pairs([preds], [target])
        else:
            cands, groups = check_pairs(preds, target)
        if index is not None:
            if not self.per_sample:
                raise ValueError("index is only kept with per_sample=True (running sums cannot drop duplicates)")
            index = torch.as_tensor(index, dtype=torch.long).flatten()
            if index.numel() != len(cands):
                raise ValueError(f"got {len(cands)} predictions but {index.numel()} indices: the lengths must match")
        if not cands:
            return
        plan = self.scorer.plan()
        cand_rows = plan.rows(cands)
        ref_rows = plan.rows([r for g in groups for r in g])
        plan.embed(ref_rows, cache=self._ref_cache, cacheable=ref_rows, progress=False)
        plan.warn_inputs(cand_rows, ref_rows)
        sizes = [len(g) for g in groups]
        pair_cand = torch.repeat_interleave(cand_rows, torch.tensor(sizes, dtype=torch.long))
        scores = plan.reduce(plan.score_pairs(pair_cand, ref_rows), sizes)[:3]
        if self.per_sample:
            for name, x in zip(_MEASURES, scores):
                getattr(self, name).append(x.to(self.device))
            if index is not None:
                self.index.append(index.to(self.device))
        else:
            for name, x in zip(_MEASURES, scores):
                setattr(self, f"sum_{name}", getattr(self, f"sum_{name}") + x.to(self.device, torch.float64).sum())
            self.total = self.total + len(cands)

    def compute(self) -> dict[str, Tensor]:
        """Means ``{"precision", "recall", "f1"}`` (0-dim), or per-sample tensors ``[N]`` with ``per_sample``."""
        if not self.per_sample:
            n = self.total.to(torch.float64)
            return {name: (getattr(self, f"sum_{name}") / n).float() for name in _MEASURES}
        values: dict[str, Tensor] = {}
        for name in _MEASURES:  # the three lists are appended together: all empty or none
            value = _cat(getattr(self, name))
            if value is None:
                return {m: torch.zeros(0, device=self.device) for m in _MEASURES}
            values[name] = value
        index = _cat(self.index)
        if index is None or (index.numel() == 0 and values["f1"].numel() > 0):
            return values
        index = index.long()
        if index.numel() != values["f1"].numel():
            raise ValueError(
                f"{index.numel()} indices for {values['f1'].numel()} samples: pass index to every update() or to none"
            )
        uniq, inverse = torch.unique(index, sorted=True, return_inverse=True)
        first = torch.full((uniq.numel(),), index.numel(), dtype=torch.long, device=index.device)
        first = first.scatter_reduce(0, inverse, torch.arange(index.numel(), device=index.device), "amin")
        return {name: v[first] for name, v in values.items()}

    # --- conveniences ---------------------------------------------------------------------------
    def signature(self) -> str:
        """The scorer's reproducibility signature (model, layer, IDF, rescaling, multi-ref, dtype, versions)."""
        return self.scorer.signature()
