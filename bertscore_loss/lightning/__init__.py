"""Lightning integration: a validation metric and distributed corpus scoring (DDP) built on the core scorer.

Imports are lazy so that ``bertscore-loss score`` (``bertscore_loss.cli.score``) does not pull in
torchmetrics and pytorch_lightning until they are needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .distributed import score_distributed
    from .metric import BERTScoreMetric
    from .registry import get_encoder

__all__ = ["BERTScoreMetric", "get_encoder", "score_distributed"]

_WHERE = {"BERTScoreMetric": "metric", "get_encoder": "registry", "score_distributed": "distributed"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
