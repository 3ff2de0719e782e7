"""N-best reranking and minimum-Bayes-risk decoding: a utility registry (BERTScore, chrF, BLEU, any callable),
exact and approximate MBR methods, fast sampling and Hugging Face ``generate`` integration."""

from __future__ import annotations

from .bertscore_utility import BERTScoreUtility
from .generate import GenerateRerankOutput, generate_and_rerank, sequence_scores
from .mbr import (
    METHODS,
    Aggregate,
    AggregateExact,
    Agreement,
    Exact,
    MBRResult,
    Method,
    Prune,
    agreement,
    gain_share,
    get_method,
    mbr,
)
from .ngram_utility import BLEU, BLEUConfig, ChrF, ChrFConfig
from .preference_data import MBRExample, PreferencePair, read_mbr_examples, select_pairs
from .registry import UTILITIES, UtilityLike, get_utility, register_utility
from .reranker import NBestReranker, RerankResult, expected_utility
from .sampling import Samples, SamplingConfig, filter_logits, native_bf16, sample_ids
from .significance import PairedBootstrapResult, paired_bootstrap, paired_bootstrap_scores
from .utility import CallableUtility, Session, Utility

_TRAINER = ("MBRDataset", "MBRTrainer", "MBRTrainingConfig")  # rerank.trainer: imported on first use (Trainer)


def __getattr__(name: str) -> object:
    if name in _TRAINER:
        from . import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rerank' has no attribute {name!r}")


__all__ = [
    "BLEU",
    "BLEUConfig",
    "BERTScoreUtility",
    "CallableUtility",
    "ChrF",
    "ChrFConfig",
    "Aggregate",
    "AggregateExact",
    "Agreement",
    "Exact",
    "GenerateRerankOutput",
    "MBRDataset",
    "MBRExample",
    "MBRTrainer",
    "MBRTrainingConfig",
    "METHODS",
    "MBRResult",
    "Method",
    "NBestReranker",
    "PairedBootstrapResult",
    "PreferencePair",
    "Prune",
    "RerankResult",
    "Samples",
    "SamplingConfig",
    "Session",
    "UTILITIES",
    "Utility",
    "UtilityLike",
    "agreement",
    "expected_utility",
    "filter_logits",
    "gain_share",
    "generate_and_rerank",
    "get_method",
    "get_utility",
    "mbr",
    "native_bf16",
    "paired_bootstrap",
    "paired_bootstrap_scores",
    "read_mbr_examples",
    "register_utility",
    "sample_ids",
    "select_pairs",
    "sequence_scores",
]
