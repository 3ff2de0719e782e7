"""N-best reranking and minimum-Bayes-risk decoding: a utility registry (BERTScore, chrF, BLEU, any callable),
exact and approximate MBR methods, fast sampling and Hugging Face ``generate`` integration.

The root exports the entry points; the rest lives in public submodules (:mod:`rerank.mbr` for the MBR
methods, :mod:`rerank.ngram_utility`, :mod:`rerank.sampling`, :mod:`rerank.significance`, ...)."""

from __future__ import annotations

import importlib
import warnings

from .generate import generate_and_rerank
from .mbr import mbr
from .preference_data import read_mbr_examples, select_pairs
from .registry import get_utility, register_utility
from .reranker import NBestReranker
from .sampling import SamplingConfig, sample_ids
from .significance import paired_bootstrap
from .training_data import MBRDataConfig, build_mbr_data
from .utility import Utility

_TRAINER = ("MBRTrainer", "MBRTrainingConfig")  # rerank.trainer: imported on first use (Trainer)

__all__ = [
    "MBRDataConfig",
    "MBRTrainer",
    "MBRTrainingConfig",
    "NBestReranker",
    "SamplingConfig",
    "Utility",
    "build_mbr_data",
    "generate_and_rerank",
    "get_utility",
    "mbr",
    "paired_bootstrap",
    "read_mbr_examples",
    "register_utility",
    "sample_ids",
    "select_pairs",
]

# Names the root exported in 0.1.0, and their public homes: ``rerank.<name>`` still resolves for one release,
# with a DeprecationWarning (``__getattr__``).
_MOVED: dict[str, str] = {
    "BERTScoreUtility": "rerank.bertscore_utility",
    **dict.fromkeys(("GenerateRerankOutput", "sequence_scores"), "rerank.generate"),
    **dict.fromkeys(
        (
            "METHODS",
            "Aggregate",
            "AggregateExact",
            "Agreement",
            "Exact",
            "MBRResult",
            "Method",
            "Prune",
            "agreement",
            "gain_share",
            "get_method",
        ),
        "rerank.mbr",
    ),
    **dict.fromkeys(("BLEU", "BLEUConfig", "ChrF", "ChrFConfig"), "rerank.ngram_utility"),
    **dict.fromkeys(("MBRExample", "PreferencePair"), "rerank.preference_data"),
    **dict.fromkeys(("UTILITIES", "UtilityLike"), "rerank.registry"),
    **dict.fromkeys(("RerankResult", "expected_utility"), "rerank.reranker"),
    **dict.fromkeys(("Samples", "filter_logits", "native_bf16"), "rerank.sampling"),
    **dict.fromkeys(("PairedBootstrapResult", "paired_bootstrap_scores"), "rerank.significance"),
    **dict.fromkeys(("CallableUtility", "Session"), "rerank.utility"),
    "MBRDataset": "rerank.trainer",
}


def __getattr__(name: str) -> object:
    if name in _TRAINER:
        from . import trainer

        return getattr(trainer, name)
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"rerank.{name} is deprecated: import it from {home} (`from {home} import {name}`); "
        "the root alias is removed in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(__all__)
