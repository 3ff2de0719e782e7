"""BERTScore inside training and decoding: an exact evaluation mode and a differentiable loss.

The root exports the names most code needs; everything else lives in a public submodule
(:mod:`bertscore_loss.matching`, :mod:`bertscore_loss.search`, :mod:`bertscore_loss.encoder`, ...). Modules
whose name starts with ``_`` are the engine's and private.
"""

from __future__ import annotations

import importlib
import warnings

from ._loading import BERTScoreWarning, ModelNotFoundError, bundled_model_path
from ._pipeline import Scores
from ._version import __version__
from .baseline import BaselineNotFoundError
from .bridge import VocabBridge
from .config import ScorerConfig
from .loss import BERTScoreLoss, LossConfig
from .matching import bertscore
from .preference import PreferenceConfig, PreferenceLoss
from .risk import MinimumRiskLoss, sequence_log_probs, target_log_probs
from .scorer import BERTScorer
from .signature import Signature

__all__ = [
    "BERTScoreLoss",
    "BERTScoreWarning",
    "BERTScorer",
    "BaselineNotFoundError",
    "LossConfig",
    "MinimumRiskLoss",
    "ModelNotFoundError",
    "PreferenceConfig",
    "PreferenceLoss",
    "Scores",
    "ScorerConfig",
    "Signature",
    "VocabBridge",
    "__version__",
    "bertscore",
    "bundled_model_path",
    "sequence_log_probs",
    "target_log_probs",
]

# Names the root exported in 0.1.0, and their public homes: ``bertscore_loss.<name>`` still resolves for one
# release, with a DeprecationWarning (``__getattr__``).
_MOVED: dict[str, str] = {
    **dict.fromkeys(("load_baseline", "read_baseline", "write_baseline"), "bertscore_loss.baseline"),
    "SentencePieceVocab": "bertscore_loss.bridge",
    **dict.fromkeys(("MEASURES", "Measure", "check_measure"), "bertscore_loss.config"),
    **dict.fromkeys(("FrozenEncoder", "PackedEmbeddings"), "bertscore_loss.encoder"),
    **dict.fromkeys(("idf_table", "token_weights"), "bertscore_loss.idf"),
    "LossOutput": "bertscore_loss.loss",
    **dict.fromkeys(
        (
            "Matches",
            "cosine_matrix",
            "f_score",
            "greedy_match",
            "matched_similarities",
            "precision_recall_f",
            "rescale",
            "soft_max",
        ),
        "bertscore_loss.matching",
    ),
    **dict.fromkeys(("DPOTerms", "PreferenceOutput", "dpo_loss"), "bertscore_loss.preference"),
    **dict.fromkeys(("encoder_for", "get_encoder"), "bertscore_loss.registry"),
    "RiskOutput": "bertscore_loss.risk",
    **dict.fromkeys(("PRF", "match_blocks", "reduce_references", "scorer_from"), "bertscore_loss.scorer"),
    **dict.fromkeys(
        (
            "LogitConfig",
            "SearchConfig",
            "SearchResult",
            "coordinate_search",
            "frequent_tokens",
            "optimise_logits",
            "token_log_prior",
        ),
        "bertscore_loss.search",
    ),
}
# Engine modules made private: ``bertscore_loss.<name>`` is a shim of ``bertscore_loss._<name>`` that warns on
# import, for one release.
_SHIMS = ("blocks", "chunking", "loading", "packed", "pairs", "pipeline", "tokens")


def __getattr__(name: str) -> object:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"bertscore_loss.{name} is deprecated: import it from {home} (`from {home} import {name}`); "
        "the root alias is removed in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted(__all__)
