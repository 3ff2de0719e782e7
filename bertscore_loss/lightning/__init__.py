"""Lightning integration: a validation metric and distributed corpus scoring (DDP) built on the core scorer.

The command line imports this package only for distributed scoring, so ``bertscore-loss score`` in one
process does not pull in torchmetrics and pytorch_lightning.
"""

from __future__ import annotations

from .distributed import score_distributed
from .metric import BERTScoreMetric
from .registry import get_encoder

__all__ = ["BERTScoreMetric", "get_encoder", "score_distributed"]
