"""The ``bert-score`` 0.3.13 API on this library's engine: switch with one changed import.

``from bertscore_loss.compat import score, BERTScorer`` takes the arguments, defaults and return types of
``bert_score.score`` and ``bert_score.BERTScorer`` and gives their numbers (fp32, to 1e-6) and their hash
string (with this library's version in the ``version=`` field), offline: ``model_type`` is a local folder, a
hub name in the local Hugging Face cache, or a packaged encoder (``"sentence-transformers/all-MiniLM-L6-v2"``,
``"mpnet"``). The deliberate differences are listed in docs/migration.md. :func:`evaluate_module_path` is the
path of the ``evaluate`` metric module built on it (``evaluate.load(evaluate_module_path())``).
"""

from __future__ import annotations

import logging
import numbers
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from . import BaselineNotFoundError, ModelNotFoundError, __version__
from .baseline import packaged_baseline, read_baseline
from .presets import BUNDLED_NAME, default_layer
from .quality import load_full_encoder, plot_similarity, score_all_layers
from .scorer import BERTScorer as NativeScorer

__all__ = ["LANG2MODEL", "BERTScorer", "evaluate_module_path", "get_hash", "plot_example", "resolve_model", "score"]

logger = logging.getLogger(__name__)

#: ``bert-score``'s default model per language (``lang``); any other language gets
#: ``bert-base-multilingual-cased``. Loaded offline: the model must be a local folder or in the HF cache.
LANG2MODEL: dict[str, str] = {
    "en": "roberta-large",
    "zh": "bert-base-chinese",
    "tr": "dbmdz/bert-base-turkish-cased",
    "en-sci": "allenai/scibert_scivocab_uncased",
}
MULTILINGUAL_DEFAULT = "bert-base-multilingual-cased"

_BUNDLED_NAMES = frozenset({BUNDLED_NAME, "all-MiniLM-L6-v2"})
_OFFLINE_CHOICES = (
    "model_type=<a local model folder>, a hub name already in the local Hugging Face cache, "
    f"model_type={BUNDLED_NAME!r} (the bundled encoder) or model_type='mpnet' (extra `accurate`)"
)

# The encoder of the latest call stays loaded (one model), so repeated score() calls do not reload it.
_LAST_ENCODER: list[Any] = []

Triple = tuple[Tensor, Tensor, Tensor]


def evaluate_module_path() -> str:
    """Path of the ``evaluate`` metric module (``evaluate.load(evaluate_module_path())``; extra ``evaluate``)."""
    return str(Path(__file__).with_name("evaluate_metric") / "bertscore_loss_metric.py")


def resolve_model(model_type: str | None, lang: str | None) -> tuple[str, str | None]:
    """``(name, model)``: the model name as ``bert-score`` names it (in the hash) and what to load
    (None = the bundled encoder). ``model_type`` wins; else ``lang``'s ``bert-score`` default."""
    if model_type is None:
        if lang is None:
            raise ValueError("either lang (e.g. 'en') or model_type (a model folder or name) must be given")
        if not isinstance(lang, str):
            raise TypeError(f"lang must be a str, got {type(lang).__name__}")
        model_type = LANG2MODEL.get(lang.lower(), MULTILINGUAL_DEFAULT)
    if not isinstance(model_type, str) or not model_type:
        raise TypeError(f"model_type must be a non-empty str (a model folder or name), got {model_type!r}")
    if model_type in _BUNDLED_NAMES and not os.path.isdir(model_type):
        return model_type, None
    return model_type, model_type


def get_hash(
    model: str,
    num_layers: int,
    idf: object,
    rescale_with_baseline: bool,
    use_custom_baseline: bool,
    use_fast_tokenizer: bool,
) -> str:
    """``bert-score``'s hash string of a setting; the ``version=`` field names this library."""
    import transformers

    msg = f"{model}_L{num_layers}{'_idf' if idf else '_no-idf'}"
    msg += f"_version=bertscore-loss-{__version__}(hug_trans={transformers.__version__})"
    if rescale_with_baseline:
        msg += "-custom-rescaled" if use_custom_baseline else "-rescaled"
    if use_fast_tokenizer:
        msg += "_fast-tokenizer"
    return msg


def _layer(name: str, num_layers: int | None) -> int:
    if num_layers is None:
        layer = default_layer(name)
        if layer is None:
            raise ValueError(
                f"no default layer is known for {name!r} (bert-score's table has none either): pass num_layers=..."
            )
        return layer
    if isinstance(num_layers, bool) or not isinstance(num_layers, numbers.Integral) or num_layers < 0:
        raise ValueError(f"num_layers must be an int >= 0, got {num_layers!r}")
    return int(num_layers)


def _check_batch_size(batch_size: object) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")


def _not_found(name: str, lang: str | None, model_type: str | None, exc: Exception) -> ModelNotFoundError:
    if model_type is None:
        return ModelNotFoundError(
            f"lang={lang!r} means bert-score's default model {name!r}, which is not available offline here "
            f"(not a local folder, not in the local Hugging Face cache). Pass {_OFFLINE_CHOICES}. ({exc})"
        )
    return ModelNotFoundError(f"{exc} Offline choices: {_OFFLINE_CHOICES}.")


def _idf_table(idf: Mapping[int, float], vocab_size: int) -> Tensor:
    """A ``bert-score`` IDF dict (token id -> weight) as a table ``[vocab_size]``: a defaultdict's default for
    ids it lacks (0 for a plain dict)."""
    factory = getattr(idf, "default_factory", None)
    default = float(factory()) if factory is not None else 0.0
    table = torch.full((vocab_size,), default, dtype=torch.float32)
    for key, value in dict(idf).items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or not 0 <= int(key) < vocab_size:
            raise ValueError(f"an IDF dict maps token ids in [0, {vocab_size}) to weights, got the key {key!r}")
        table[int(key)] = float(value)
    return table


def _flatten(cands: Sequence[str], refs: Sequence[Any]) -> tuple[list[str], list[str], list[int] | None]:
    """Candidates repeated per reference, the references flat and each candidate's reference count (None for
    one str reference each), as ``bert-score`` flattens multi-reference input."""
    if len(cands) != len(refs):
        raise ValueError(f"got {len(cands)} candidates but {len(refs)} references: the lengths must match")
    if not refs or isinstance(refs[0], str):
        return list(cands), list(refs), None
    flat_c: list[str] = []
    flat_r: list[str] = []
    sizes = []
    for i, (c, group) in enumerate(zip(cands, refs)):
        if isinstance(group, str) or not len(group):
            raise ValueError(f"references[{i}] must be a non-empty list of str, like references[0]")
        flat_c += [c] * len(group)
        flat_r += list(group)
        sizes.append(len(group))
    return flat_c, flat_r, sizes


class BERTScorer:
    """``bert_score.BERTScorer`` on this library's engine: same arguments, defaults, scores and hash.

    ``model_type``: a local folder, a hub name in the local HF cache, or a packaged encoder; None = ``lang``'s
    ``bert-score`` default (``"en"``: ``roberta-large``). ``num_layers``: None = the tuned layer of a known model.
    ``idf=True`` weighs tokens by IDF over ``idf_sents`` (or :meth:`compute_idf`). ``batch_size`` and
    ``nthreads`` are accepted and do not change a score (batches are sized in tokens). ``all_layers``: P, R, F
    of every layer ``[L + 1, N]``, as ``bert-score`` returns them.
    """

    def __init__(
        self,
        model_type: str | None = None,
        num_layers: int | None = None,
        batch_size: int = 64,
        nthreads: int = 4,
        all_layers: bool = False,
        idf: bool = False,
        idf_sents: Sequence[str] | None = None,
        device: str | torch.device | None = None,
        lang: str | None = None,
        rescale_with_baseline: bool = False,
        baseline_path: str | os.PathLike | None = None,
        use_fast_tokenizer: bool = False,
    ) -> None:
        _check_batch_size(batch_size)
        name, model = resolve_model(model_type, lang)
        self._model_type = name
        self._lang = lang
        self._num_layers = _layer(name, num_layers)
        self._idf = idf
        self._rescale_with_baseline = bool(rescale_with_baseline)
        self._use_fast_tokenizer = bool(use_fast_tokenizer)
        self.batch_size = batch_size
        self.nthreads = nthreads
        self.all_layers = bool(all_layers)
        self.baseline_path = None if baseline_path is None else str(baseline_path)
        self.use_custom_baseline = baseline_path is not None
        self.device = device
        self._idf_given = False
        self._full: Any = None  # the untruncated encoder with all_layers
        self._scorer: NativeScorer | None = None
        try:
            if self.all_layers:
                self._full = load_full_encoder(model, device=None if device is None else str(device))
            else:
                self._scorer = NativeScorer(
                    model=model,
                    layer=self._num_layers,
                    idf=bool(idf),
                    device=None if device is None else str(device),
                    progress=False,
                )
        except ModelNotFoundError as exc:
            raise _not_found(name, lang, model_type, exc) from exc
        self._baseline: Tensor | None = None
        if self._rescale_with_baseline:
            self._baseline = self._load_baseline()
        if idf_sents is not None:
            self.compute_idf(idf_sents)

    # --- bert-score's properties ----------------------------------------------------------------
    @property
    def lang(self) -> str | None:
        return self._lang

    @property
    def idf(self) -> bool:
        return self._idf

    @property
    def model_type(self) -> str:
        return self._model_type

    @property
    def num_layers(self) -> int:
        return self._num_layers

    @property
    def rescale_with_baseline(self) -> bool:
        return self._rescale_with_baseline

    @property
    def use_fast_tokenizer(self) -> bool:
        return self._use_fast_tokenizer

    @property
    def baseline_vals(self) -> Tensor:
        """The baseline ``[3]`` (P, R, F) of the layer, or ``[L + 1, 1, 3]`` with ``all_layers``."""
        if self._baseline is None:
            self._baseline = self._load_baseline()
        return self._baseline

    @property
    def hash(self) -> str:
        """``bert-score``'s hash string of this setting (``version=bertscore-loss-<version>``)."""
        return get_hash(
            self._model_type,
            self._num_layers,
            self._idf,
            self._rescale_with_baseline,
            self.use_custom_baseline,
            self._use_fast_tokenizer,
        )

    @property
    def scorer(self) -> NativeScorer | None:
        """The native :class:`bertscore_loss.BERTScorer` behind this one (None with ``all_layers``)."""
        return self._scorer

    def _encoder(self) -> Any:
        return self._full if self._scorer is None else self._scorer.encoder

    def _load_baseline(self) -> Tensor:
        enc = self._encoder()
        path = self.baseline_path or packaged_baseline(enc.name)
        if path is None:
            raise BaselineNotFoundError(
                f"no rescaling baseline is shipped for {self._model_type!r} (bert-score's files are not used): pass "
                "baseline_path=FILE (LAYER,P,R,F), e.g. bert-score's rescale_baseline/<lang>/<model>.tsv or one made "
                "offline by `bertscore-loss baseline`"
            )
        if not os.path.isfile(path):
            raise BaselineNotFoundError(f"baseline_path {str(path)!r} is not a file")
        rows = read_baseline(path)
        if self.all_layers:
            missing = [k for k in range(enc.layer + 1) if k not in rows]
            if missing:
                raise BaselineNotFoundError(f"baseline file {str(path)!r} has no row for layer(s) {missing}")
            return torch.tensor([rows[k] for k in range(enc.layer + 1)], dtype=torch.float32).unsqueeze(1)
        if self._num_layers not in rows:
            raise BaselineNotFoundError(
                f"baseline file {str(path)!r} has no row for layer {self._num_layers} (has {sorted(rows)})"
            )
        return torch.tensor(rows[self._num_layers], dtype=torch.float32)

    # --- IDF -----------------------------------------------------------------------------------
    def compute_idf(self, sents: Sequence[str]) -> None:
        """Fix the IDF weights over ``sents`` (as ``bert-score``: M sentences, duplicates counted)."""
        if self._idf_given:
            warnings.warn("Overwriting the previous importance weights.", stacklevel=2)
        if self._scorer is None:
            raise NotImplementedError(
                "all_layers=True with a fixed IDF table (idf_sents, compute_idf) is not supported: "
                "score one layer at a time with num_layers=k"
            )
        if not self._idf:
            logger.warning("compute_idf with idf=False: the weights are kept but not used (as bert-score)")
            NativeScorer(encoder=self._scorer.encoder, idf=True).set_idf_corpus(sents)  # checks the sentences
            self._idf_given = True
            return
        self._scorer.set_idf_corpus(sents)
        self._idf_given = True

    # --- scoring -------------------------------------------------------------------------------
    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str] | Sequence[Sequence[str]],
        verbose: bool = False,
        batch_size: int = 64,
        return_hash: bool = False,
    ) -> Triple | tuple[Triple, str]:
        """``(P, R, F)`` float32 tensors ``[N]`` (``[L + 1, N]`` with ``all_layers``), ``((P, R, F), hash)`` with
        ``return_hash``. ``refs``: one str per candidate, or a list of str per candidate (max per measure)."""
        _check_batch_size(batch_size)
        if self._idf and not self._idf_given:
            raise ValueError("IDF weights are not computed: pass idf_sents=... or call compute_idf(sents) first")
        start = time.perf_counter()
        out = self._score(cands, refs, verbose)
        if verbose:
            took = time.perf_counter() - start
            logger.info("done in %.2f seconds, %.2f sentences/sec", took, len(cands) / max(took, 1e-9))
        return (out, self.hash) if return_hash else out

    def _score(self, cands: Sequence[str], refs: Sequence[Any], verbose: bool) -> Triple:
        if self._scorer is not None:
            scorer = self._scorer
            if verbose:
                import dataclasses

                scorer = NativeScorer(encoder=scorer.encoder, config=dataclasses.replace(scorer.config, progress=True))
                scorer.idf, scorer.idf_description = self._scorer.idf, self._scorer.idf_description
            p, r, f = scorer.score(cands, refs)
            if self._rescale_with_baseline:
                b = self.baseline_vals
                p, r, f = ((x - b[k]) / (1 - b[k]) for k, x in enumerate((p, r, f)))
            return p, r, f
        return _score_all_layers(self._full, cands, refs, bool(self._idf), self._baseline, verbose)

    def plot_example(self, candidate: str, reference: str, fname: str = "") -> Any:
        """Heatmap of token similarities of ``candidate`` against ``reference`` (extra ``plot``), saved as PNG to
        ``fname`` when given; returns the matplotlib figure (nothing is shown)."""
        if not isinstance(candidate, str) or not isinstance(reference, str):
            raise TypeError("candidate and reference must be str")
        if self._scorer is None:
            raise NotImplementedError("plot_example needs one layer: build the scorer with all_layers=False")
        return plot_similarity(candidate, reference, fname or None, NativeScorer(encoder=self._scorer.encoder))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(hash={self.hash}, batch_size={self.batch_size}, nthreads={self.nthreads})"

    __str__ = __repr__


def _score_all_layers(
    encoder: Any, cands: Sequence[str], refs: Sequence[Any], idf: bool, baseline: Tensor | None, verbose: bool
) -> Triple:
    """P, R, F ``[L + 1, N]`` of every layer (IDF over the flat references of the call)."""
    flat_c, flat_r, sizes = _flatten(cands, refs)
    prf = score_all_layers(encoder, flat_c, flat_r, idf=idf, progress=verbose)  # [L + 1, 3, pairs]
    if sizes is not None:
        owner = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        out = torch.full((prf.shape[0], 3, len(sizes)), -torch.inf)
        prf = out.scatter_reduce(2, owner.expand(prf.shape[0], 3, -1), prf, reduce="amax")
    prf = prf.transpose(1, 2)  # [L + 1, N, 3]
    if baseline is not None:
        prf = (prf - baseline) / (1 - baseline)
    return prf[..., 0], prf[..., 1], prf[..., 2]


def score(
    cands: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    model_type: str | None = None,
    num_layers: int | None = None,
    verbose: bool = False,
    idf: bool | Mapping[int, float] = False,
    device: str | torch.device | None = None,
    batch_size: int = 64,
    nthreads: int = 4,
    all_layers: bool = False,
    lang: str | None = None,
    return_hash: bool = False,
    rescale_with_baseline: bool = False,
    baseline_path: str | os.PathLike | None = None,
    use_fast_tokenizer: bool = False,
) -> Triple | tuple[Triple, str]:
    """``bert_score.score``: P, R, F float32 tensors ``[N]`` of each candidate against its reference(s).

    ``refs``: one str per candidate, or a list of str per candidate (the best of each measure). ``idf``: True
    = IDF over the references of the call (every reference, duplicates counted), or a precomputed
    ``bert-score`` IDF dict (token id -> weight). ``all_layers``: ``[L + 1, N]`` per measure. ``return_hash``:
    ``((P, R, F), hash)``. ``batch_size`` and ``nthreads`` do not change a score. The encoder of the latest call
    stays loaded for the next one.
    """
    _check_batch_size(batch_size)
    if rescale_with_baseline and lang is None and baseline_path is None:
        logger.info("rescale_with_baseline without lang: using the packaged baseline of the model, if any")
    custom_idf = isinstance(idf, Mapping)
    scorer = BERTScorer(
        model_type,
        num_layers,
        batch_size=batch_size,
        nthreads=nthreads,
        all_layers=all_layers,
        idf=bool(idf),
        device=device,
        lang=lang,
        rescale_with_baseline=rescale_with_baseline,
        baseline_path=baseline_path,
        use_fast_tokenizer=use_fast_tokenizer,
    )
    _LAST_ENCODER[:] = [scorer._encoder()]
    if custom_idf and idf:
        if scorer.scorer is None:
            raise NotImplementedError("all_layers=True with an IDF dict is not supported: score one layer at a time")
        scorer.scorer.idf = _idf_table(idf, scorer.scorer.encoder.vocab_size)  # type: ignore[arg-type]
        scorer.scorer.idf_description = f"dict:{len(idf)}"  # type: ignore[arg-type]
        scorer._idf_given = True
    elif idf:
        scorer._idf_given = True  # IDF over the references of the call (the engine's rule, as bert-score)
    if not len(cands):
        z = torch.zeros(0)
        out: Triple = (z, z.clone(), z.clone())
    else:
        start = time.perf_counter()
        out = scorer._score(cands, refs, verbose)
        if verbose:
            took = time.perf_counter() - start
            logger.info("done in %.2f seconds, %.2f sentences/sec", took, len(cands) / max(took, 1e-9))
    if return_hash:
        hashed = get_hash(
            scorer.model_type,
            scorer.num_layers,
            idf,
            rescale_with_baseline,
            baseline_path is not None,
            use_fast_tokenizer,
        )
        return out, hashed
    return out


def plot_example(
    candidate: str,
    reference: str,
    model_type: str | None = None,
    num_layers: int | None = None,
    lang: str | None = None,
    rescale_with_baseline: bool = False,
    baseline_path: str | os.PathLike | None = None,
    use_fast_tokenizer: bool = False,
    fname: str = "",
) -> Any:
    """``bert_score.plot_example``: the token-similarity heatmap of one pair (see :meth:`BERTScorer.plot_example`)."""
    scorer = BERTScorer(
        model_type,
        num_layers,
        lang=lang,
        rescale_with_baseline=rescale_with_baseline,
        baseline_path=baseline_path,
        use_fast_tokenizer=use_fast_tokenizer,
    )
    return scorer.plot_example(candidate, reference, fname)
