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
from .registry import UTILITIES, UtilityLike, get_utility, register_utility
from .reranker import NBestReranker, RerankResult, expected_utility
from .sampling import Samples, SamplingConfig, filter_logits, native_bf16, sample_ids
from .utility import CallableUtility, Session, Utility

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
    "METHODS",
    "MBRResult",
    "Method",
    "NBestReranker",
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
    "register_utility",
    "sample_ids",
    "sequence_scores",
]
