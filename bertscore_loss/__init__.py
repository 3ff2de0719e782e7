"""BERTScore inside training and decoding: an exact evaluation mode and a differentiable loss."""

from __future__ import annotations

from ._version import __version__
from .baseline import BaselineNotFoundError, load_baseline, read_baseline, write_baseline
from .blocks import match_blocks
from .bridge import SentencePieceVocab, VocabBridge
from .config import MEASURES, Measure, ScorerConfig, check_measure
from .encoder import FrozenEncoder
from .idf import idf_table, token_weights
from .loading import BERTScoreWarning, ModelNotFoundError, bundled_model_path
from .loss import BERTScoreLoss, LossConfig, LossOutput
from .matching import (
    Matches,
    bertscore,
    cosine_matrix,
    f_score,
    greedy_match,
    matched_similarities,
    precision_recall_f,
    rescale,
    soft_max,
)
from .packed import PackedEmbeddings
from .pipeline import PRF, Scores, reduce_references
from .preference import DPOTerms, PreferenceConfig, PreferenceLoss, PreferenceOutput, dpo_loss
from .registry import encoder_for, get_encoder
from .risk import MinimumRiskLoss, RiskOutput, sequence_log_probs
from .scorer import BERTScorer, scorer_from
from .search import (
    LogitConfig,
    SearchConfig,
    SearchResult,
    coordinate_search,
    frequent_tokens,
    optimise_logits,
    token_log_prior,
)
from .signature import Signature

__all__ = [
    "BERTScoreLoss",
    "BERTScoreWarning",
    "BERTScorer",
    "BaselineNotFoundError",
    "DPOTerms",
    "FrozenEncoder",
    "LogitConfig",
    "LossConfig",
    "LossOutput",
    "MEASURES",
    "Measure",
    "MinimumRiskLoss",
    "Matches",
    "ModelNotFoundError",
    "PRF",
    "PackedEmbeddings",
    "PreferenceConfig",
    "PreferenceLoss",
    "PreferenceOutput",
    "RiskOutput",
    "Scores",
    "ScorerConfig",
    "SearchConfig",
    "SearchResult",
    "SentencePieceVocab",
    "Signature",
    "VocabBridge",
    "__version__",
    "bertscore",
    "bundled_model_path",
    "check_measure",
    "coordinate_search",
    "cosine_matrix",
    "dpo_loss",
    "encoder_for",
    "f_score",
    "frequent_tokens",
    "get_encoder",
    "greedy_match",
    "idf_table",
    "load_baseline",
    "match_blocks",
    "matched_similarities",
    "optimise_logits",
    "precision_recall_f",
    "read_baseline",
    "reduce_references",
    "rescale",
    "scorer_from",
    "sequence_log_probs",
    "soft_max",
    "token_log_prior",
    "token_weights",
    "write_baseline",
]
