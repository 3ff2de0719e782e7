"""The one resident scorer an integration object keeps (built from fields, or given and cached)."""

from __future__ import annotations

from typing import Any

from bertscore_loss import BERTScorer


def resident_scorer(scorer: BERTScorer | None, cache_bytes: int, fields: dict[str, Any]) -> BERTScorer:
    """``scorer`` (its encoder's embedding cache raised to ``cache_bytes``), or a new one from ``fields``."""
    if scorer is None:
        return BERTScorer(cache_bytes=cache_bytes, **fields)
    if fields:
        raise ValueError("pass scorer fields or a scorer, not both")
    if cache_bytes and scorer.encoder.cache.max_bytes < cache_bytes:
        scorer.encoder.enable_cache(cache_bytes)
    return scorer
