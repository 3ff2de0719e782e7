"""The settings of a scorer: :class:`ScorerConfig` (shared by the scorer, loss, reranker, metric and CLI)."""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")

#: The one spelling of a BERTScore measure everywhere (scorer outputs, loss, risk, reranker, rewards, CLI).
Measure = Literal["precision", "recall", "f1"]
MEASURES: tuple[str, ...] = ("precision", "recall", "f1")

# --- the one place of every size default ---------------------------------------------------------
#: Padded tokens per encoder batch when none is given. On CPU small batches waste less padding and stay
#: in cache (3,360 WMT16 pairs, MiniLM layer 4: docs/performance.md); accelerators want big ones.
CPU_BATCH_TOKENS = 2048
ACCEL_BATCH_TOKENS = 8192
#: Cosine-matrix entries per matching chunk of pairs when none is given (CPU: small chunks stay in cache).
CPU_MAX_ELEMENTS = 1 << 18
ACCEL_MAX_ELEMENTS = 1 << 24
#: Cosine entries per tile of all-pairs blocks (reranking, MBR, all-layer scoring) when none is given.
BLOCK_MAX_ELEMENTS = 1 << 22


def _is_cpu(device: str | torch.device) -> bool:
    import torch

    return torch.device(device).type == "cpu"


def batch_tokens_for(device: str | torch.device, value: int | None = None) -> int:
    """``value``, or the padded-token budget of one encoder batch on ``device`` (CPU 2048, accelerators 8192)."""
    return value or (CPU_BATCH_TOKENS if _is_cpu(device) else ACCEL_BATCH_TOKENS)


def max_elements_for(device: str | torch.device, value: int | None = None, *, blocks: bool = False) -> int:
    """``value``, or the cosine entries per matching chunk on ``device`` (pairs: CPU 2**18, accelerators
    2**24; all-pairs ``blocks``: 2**22 per tile)."""
    if value:
        return value
    if blocks:
        return BLOCK_MAX_ELEMENTS
    return CPU_MAX_ELEMENTS if _is_cpu(device) else ACCEL_MAX_ELEMENTS


def check_number(
    value: object,
    what: str,
    *,
    positive: bool = False,
    at_least: float | None = None,
    integer: bool = False,
    allow_none: bool = False,
) -> None:
    """ValueError naming ``what`` unless ``value`` is a finite real number (not a bool; an int with
    ``integer``), > 0 with ``positive``, >= ``at_least`` when given; None passes with ``allow_none``."""
    if value is None and allow_none:
        return
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(float(value))  # type: ignore[arg-type]
    if ok and positive:
        ok = float(value) > 0  # type: ignore[arg-type]
    if ok and at_least is not None:
        ok = float(value) >= at_least  # type: ignore[arg-type]
    if not ok:
        need = "an int" if integer else "a finite number"
        if positive:
            need += " > 0"
        if at_least is not None:
            need += f" >= {at_least:g}"
        if allow_none:
            need += " or None"
        raise ValueError(f"{what} must be {need}, got {value!r}")


def check_measure(value: object, what: str = "measure") -> Measure:
    """``value`` if it is one of ``"precision"``, ``"recall"``, ``"f1"``; else a ValueError suggesting the spelling."""
    if value in MEASURES:
        return value  # type: ignore[return-value]
    aliases = {"p": "precision", "r": "recall", "f": "f1", "F": "f1", "P": "precision", "R": "recall", "F1": "f1"}
    hint = aliases.get(value) if isinstance(value, str) else None
    if hint is None and isinstance(value, str):
        close = difflib.get_close_matches(value.lower(), MEASURES, n=1)
        hint = close[0] if close else None
    suggestion = f" (did you mean {hint!r}?)" if hint else ""
    raise ValueError(f"{what} must be 'precision', 'recall' or 'f1', got {value!r}{suggestion}")


@dataclass(frozen=True)
class ScorerConfig:
    """Settings of a :class:`BERTScorer` (and of the reranker and metric built on it).

    ``model``: HF name or local folder (None = bundled all-MiniLM-L6-v2); ``layer``: None = preset;
    ``idf``: weight tokens by IDF over ``idf_corpus`` given to the scorer, else over each call's
    references (as ``bert-score``); ``rescale`` with ``baseline`` (a ``LAYER,P,R,F`` file; None = the
    packaged one of the model, an error if there is none); ``batch_tokens``: padded-token budget of one
    encoder batch (None = 2048 on CPU, 8192 on accelerators); ``max_elements``: cosine entries per
    matching chunk (None = 2**18 on CPU, 2**24 on accelerators); ``multi_ref``: ``"max"`` (max per
    measure, as ``bert-score``) or ``"best_f"`` (the P, R, F of the reference with the highest F);
    ``cache_bytes``: keep up to that many bytes of text embeddings on the encoder (LRU; 0 = off), so
    texts seen in an earlier call are not re-encoded; ``cache_texts``: which texts go through that cache,
    ``"all"`` or only the ``"references"`` (what a validation metric wants: references recur every epoch,
    predictions do not);
    ``long_inputs``: ``"truncate"`` texts longer than the model's maximum (as ``bert-score``, with a
    warning) or encode them in overlapping ``"window"``s every ``window_stride`` tokens (None = half a
    window; each token keeps the embedding of the window where it has the most context; giving a
    stride without ``"window"`` is an error);
    ``progress``: None = a bar on stderr for 1,000 or more texts.

    Frozen: change a setting with ``dataclasses.replace(config, field=value)``. The fields that decide
    the encoder (``model``, ``layer``, ``dtype``, ``device``, ``long_inputs``,
    ``window_stride``) are the key of the process-wide encoder registry (:mod:`bertscore_loss.registry`).
    """

    model: str | None = None
    layer: int | None = None
    idf: bool = False
    rescale: bool = False
    baseline: str | None = None
    device: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_tokens: int | None = None
    max_elements: int | None = None
    multi_ref: Literal["max", "best_f"] = "max"
    cache_bytes: int = 0
    cache_texts: Literal["all", "references"] = "all"
    long_inputs: Literal["truncate", "window"] = "truncate"
    window_stride: int | None = None
    progress: bool | None = None
    allow_download: bool = False

    def __post_init__(self) -> None:
        self.validate()  # checked where it is built: no instance holds an invalid setting

    def validate(self) -> ScorerConfig:
        """Check every field; returns ``self`` (errors name the field and the value)."""
        if self.layer is not None and (
            isinstance(self.layer, bool) or not isinstance(self.layer, numbers.Integral) or self.layer < 0
        ):
            raise ValueError(f"layer must be a non-negative int (or None for the preset), got {self.layer!r}")
        if self.multi_ref not in ("max", "best_f"):
            raise ValueError(f"multi_ref must be 'max' or 'best_f', got {self.multi_ref!r}")
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(f"dtype must be one of {list(DTYPE_NAMES)}, got {self.dtype!r}")
        if self.long_inputs not in ("truncate", "window"):
            raise ValueError(f"long_inputs must be 'truncate' or 'window', got {self.long_inputs!r}")
        if self.window_stride is not None and self.long_inputs != "window":
            raise ValueError("window_stride is only used with long_inputs='window' (--long-inputs window)")
        for name in ("batch_tokens", "max_elements", "window_stride"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if (
            isinstance(self.cache_bytes, bool)
            or not isinstance(self.cache_bytes, numbers.Integral)
            or self.cache_bytes < 0
        ):
            raise ValueError(f"cache_bytes must be an int >= 0, got {self.cache_bytes!r}")
        if self.cache_texts not in ("all", "references"):
            raise ValueError(f"cache_texts must be 'all' or 'references', got {self.cache_texts!r}")
        if self.baseline is not None and not self.rescale:
            raise ValueError("baseline is given but rescale is off: pass rescale=True (--rescale) to use it")
        return self
