"""N-best reranking with BERTScore (reference-based and MBR) and Hugging Face ``generate`` integration."""

from __future__ import annotations

from .generate import GenerateRerankOutput, generate_and_rerank, sequence_scores
from .reranker import NBestReranker, RerankResult, expected_utility

__all__ = [
    "GenerateRerankOutput",
    "NBestReranker",
    "RerankResult",
    "expected_utility",
    "generate_and_rerank",
    "sequence_scores",
]
