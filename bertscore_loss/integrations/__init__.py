"""Glue for the trainers people already use: Hugging Face ``Trainer``/``Seq2SeqTrainer`` and TRL.

- :mod:`bertscore_loss.integrations.hf`: :func:`bertscore_compute_metrics` (``compute_metrics`` for
  ``predict_with_generate=True``) and :class:`SemanticLoss` (``compute_loss_func``: CE + λ·(1 − F)).
- :mod:`bertscore_loss.integrations.trl`: :class:`BERTScoreReward` (references from a dataset column)
  and :class:`MBRConsensusReward` (reference-free: agreement among a prompt's group of completions),
  both with TRL's ``reward_funcs`` contract ``(prompts, completions, **columns) -> list[float]``.

Neither module imports TRL; ``hf`` imports ``transformers`` (a core dependency) only for its callback.
"""

from __future__ import annotations

from .hf import BERTScoreMetrics, SemanticLoss, bertscore_compute_metrics, decode_ids
from .trl import BERTScoreReward, MBRConsensusReward, completion_text

__all__ = [
    "BERTScoreMetrics",
    "BERTScoreReward",
    "MBRConsensusReward",
    "SemanticLoss",
    "bertscore_compute_metrics",
    "completion_text",
    "decode_ids",
]
