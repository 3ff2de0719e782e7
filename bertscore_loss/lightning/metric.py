"""``BERTScoreMetric``: a torchmetrics metric for ``validation_step`` whose states are scores, never token ids."""

from __future__ import annotations

import copy
import dataclasses
import functools
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
from ..registry import encoder_on, moved
from ..scorer import BERTScorer, scorer_from
from ..signature import Signature
from ..textio import read_corpus
from ..validation import check_pairs, check_texts

logger = logging.getLogger(__name__)

_MEASURES = ("precision", "recall", "f1")
_SETTINGS = (
    "model",
    "layer",
    "idf",
    "rescale",
    "baseline",
    "multi_ref",
    "dtype",
    "batch_tokens",
    "max_elements",
    "long_inputs",
    "window_stride",
    "allow_download",
)


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

    Settings as :class:`~bertscore_loss.BERTScorer`'s (``model``, ``layer``, ``idf``, ``rescale``,
    ``baseline``, ``multi_ref``, ``dtype``, ``batch_tokens``, ``max_elements``, ``long_inputs``,
    ``window_stride``, ``allow_download``), **or** an existing ``scorer`` (its settings, IDF table and
    baseline; both is an error). ``idf=True`` needs ``idf_corpus`` (a list of sentences or a text file, one
    per line): the IDF table is fixed at construction and never recomputed per batch. ``rescale=True``
    uses ``baseline`` (a ``LAYER,P,R,F`` file; None = the packaged one of the model). ``target`` may hold
    several references per prediction (a list of str each), reduced by ``multi_ref``. ``device``: where the
    metric (and so its encoder) starts; it follows ``.to()`` afterwards. ``ref_cache_bytes`` bounds the
    encoder's embedding cache, used for references only (LRU, 0 = off): references seen in an earlier epoch
    are not re-encoded, so later epochs encode only the predictions. Predictions are never cached.
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
        scorer: BERTScorer | None = None,
        idf: bool = False,
        idf_corpus: str | os.PathLike | Sequence[str] | None = None,
        rescale: bool = False,
        baseline: str | None = None,
        multi_ref: Literal["max", "best_f"] = "max",
        dtype: Literal["float32", "bfloat16", "float16"] = "float32",
        device: str | torch.device | None = None,
        batch_tokens: int | None = None,
        max_elements: int | None = None,
        long_inputs: Literal["truncate", "window"] = "truncate",
        window_stride: int | None = None,
        per_sample: bool = False,
        ref_cache_bytes: int = 256 << 20,
        allow_download: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        values = locals()
        defaults = ScorerConfig()
        given = {k: values[k] for k in _SETTINGS if values[k] != getattr(defaults, k)}
        if isinstance(ref_cache_bytes, bool) or not isinstance(ref_cache_bytes, int) or ref_cache_bytes < 0:
            raise ValueError(f"ref_cache_bytes must be an int >= 0, got {ref_cache_bytes!r}")
        if scorer is not None:
            scorer_from(scorer, owner="BERTScoreMetric", **given)  # both is an error
            if idf_corpus is not None:
                raise ValueError("BERTScoreMetric: pass scorer=... or idf_corpus (a scorer setting), not both")
            config = scorer.config
        else:
            if idf and idf_corpus is None:
                raise ValueError(
                    "idf=True needs idf_corpus (a list of sentences or a file path): the metric fixes its IDF "
                    "table at construction instead of recomputing it from each batch's references"
                )
            config = ScorerConfig(**given)
        config = dataclasses.replace(
            config, cache_bytes=ref_cache_bytes, cache_texts="references", progress=False, device=None
        ).validate()
        if config.idf and scorer is not None and scorer.idf is None:
            raise ValueError("BERTScoreMetric: the scorer has idf=True but no fixed IDF table (idf_corpus)")
        self.per_sample = bool(per_sample)
        # A plain attribute (BERTScorer is not an nn.Module): the encoder stays out of the module tree.
        dev = self.device if device is None else device
        if scorer is not None:  # its encoder (the registry's copy on the metric's device, if registered)
            self._scorer = BERTScorer(config, encoder=moved(scorer.encoder, dev))
            self._scorer.idf, self._scorer.idf_description = scorer.idf, scorer.idf_description
            encoder = self._scorer.encoder
        else:
            encoder = encoder_on(config, dev)
            corpus = idf_sentences(idf_corpus) if idf_corpus is not None else None
            self._scorer = BERTScorer(config, encoder=encoder, idf_corpus=corpus)
        if self.per_sample:
            for name in _MEASURES:
                self.add_state(name, default=[], dist_reduce_fx="cat")
            self.add_state("index", default=[], dist_reduce_fx="cat")
        else:
            for name in _MEASURES:
                self.add_state(f"sum_{name}", default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("total", default=torch.zeros((), dtype=torch.long), dist_reduce_fx="sum")
        if device is not None:
            self.to(encoder.device)

    # --- the shared encoder follows the metric's device ------------------------------------------
    @property
    def scorer(self) -> BERTScorer:
        """The :class:`BERTScorer` (config, IDF table, baseline) bound to the encoder on this metric's device."""
        if self._scorer.encoder is None or self._scorer.encoder.device != self.device:
            self._scorer = self._scorer.on(self.device)
        return self._scorer

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
        return state

    @property
    def encoder_device(self) -> torch.device | None:
        enc = self._scorer.encoder
        return None if enc is None else enc.device

    @property
    def ref_cache(self) -> EmbeddingCache:
        """The encoder's embedding cache, which the metric fills with references only (``hits``/``misses``
        count texts; shared with other users of the same encoder)."""
        return self.scorer.encoder.cache

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
        scores = self.scorer.score(cands, groups)
        if self.per_sample:
            for name, x in zip(_MEASURES, scores):
                getattr(self, name).append(x.to(self.device))
            if index is not None:
                self.index.append(index.to(self.device))
        else:
            for name, x in zip(_MEASURES, scores):
                setattr(self, f"sum_{name}", getattr(self, f"sum_{name}") + x.to(self.device, torch.float64).sum())
            self.total = self.total + len(cands)

    def _wrap_compute(self, compute: Any) -> Any:
        """torchmetrics squeezes one-element results to 0-dim; per-sample results stay ``[N]`` (also N = 1)."""
        wrapped = super()._wrap_compute(compute)

        @functools.wraps(compute)
        def keep_shape(*args: Any, **kwargs: Any) -> Any:
            out = wrapped(*args, **kwargs)
            if self.per_sample and isinstance(out, dict):
                out = {k: v.reshape(-1) for k, v in out.items()}
            return out

        return keep_shape

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
    def signature(self) -> Signature:
        """The scorer's reproducibility signature (model, layer, IDF, rescaling, multi-ref, dtype, versions)."""
        return self.scorer.signature()
