"""BERTScore inside training and decoding: an exact evaluation mode and a differentiable loss."""

from __future__ import annotations

__version__ = "0.1.0"

from .baseline import BaselineNotFoundError, load_baseline, read_baseline, write_baseline
from .encoder import BERTScoreWarning, FrozenEncoder, ModelNotFoundError, PackedEmbeddings
from .idf import idf_table, token_weights
from .matching import (
    Matches,
    bertscore,
    cosine_matrix,
    f_score,
    greedy_match,
    precision_recall_f,
    rescale,
)
from .scorer import BERTScorer, ScorerConfig, Scores, reduce_references

__all__ = [
    "BERTScoreWarning",
    "BERTScorer",
    "BaselineNotFoundError",
    "FrozenEncoder",
    "Matches",
    "ModelNotFoundError",
    "PackedEmbeddings",
    "Scores",
    "ScorerConfig",
    "__version__",
    "bertscore",
    "cosine_matrix",
    "f_score",
    "greedy_match",
    "idf_table",
    "load_baseline",
    "precision_recall_f",
    "read_baseline",
    "reduce_references",
    "rescale",
    "token_weights",
    "write_baseline",
]
