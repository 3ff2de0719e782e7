"""The one resident scorer an integration object keeps (built from fields, or given and cached)."""

from __future__ import annotations

from typing import Any

from bertscore_loss import BERTScorer, scorer_from


def resident_scorer(
    scorer: BERTScorer | None, cache_bytes: int, fields: dict[str, Any], owner: str = "this object"
) -> BERTScorer:
    """``scorer`` (its encoder's embedding cache raised to ``cache_bytes``), or a new one from ``fields``."""
    if scorer is None:
        return BERTScorer(**{"cache_bytes": cache_bytes, **fields})
    scorer = scorer_from(scorer, owner=owner, **fields)
    if cache_bytes and scorer.encoder.cache.max_bytes < cache_bytes:
        scorer.encoder.enable_cache(cache_bytes)
    return scorer
