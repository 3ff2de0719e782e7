"""The one resident scorer an integration object keeps (built from fields, or given and cached)."""

from __future__ import annotations

from typing import Any

from bertscore_loss import BERTScorer
from bertscore_loss.scorer import scorer_from


def resident_scorer(
    scorer: BERTScorer | None, cache_bytes: int, fields: dict[str, Any], owner: str = "this object"
) -> BERTScorer:
    """``scorer`` (its encoder's embedding cache raised to ``cache_bytes``), or a new one from ``fields``.

    ``idf=True`` needs a fixed IDF table (``idf_corpus``), as in the Lightning metric: IDF recomputed over
    each batch (or each rank's shard) would make the same pair score differently by batch.
    """
    if scorer is None:
        scorer = BERTScorer(**{"cache_bytes": cache_bytes, **fields})
    else:
        scorer = scorer_from(scorer, owner=owner, **fields)
        if cache_bytes and scorer.encoder.cache.max_bytes < cache_bytes:
            scorer.encoder.enable_cache(cache_bytes)
    if scorer.config.idf and scorer.idf is None:
        raise ValueError(
            f"{owner}: idf=True needs idf_corpus (a fixed IDF table, e.g. the training references): IDF over "
            "each batch would score the same pair differently by batch"
        )
    return scorer
