"""Rescaling baselines from random sentence pairs, every layer from one encoder pass.

The baseline of a layer is the mean P, R and F of ``pairs`` random (candidate, reference) pairs of
distinct sentences of a corpus (the BERTScore paper's recipe), written in the ``bert-score`` format
``LAYER,P,R,F``. Scores are computed without IDF (``bert-score`` uses the same file with and without IDF).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from ..all_layers import embed_all_layers, load_full_encoder
from ..baseline import write_baseline
from ..encoder import FrozenEncoder
from ..outputs import atomic_path

logger = logging.getLogger(__name__)


def sample_pairs(n_sentences: int, n_pairs: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n_pairs`` uniform random ordered pairs ``(cand [n_pairs], ref [n_pairs])`` of distinct indices.

    Deterministic for a given ``seed`` (a CPU ``torch.Generator``).
    """
    if n_sentences < 2:
        raise ValueError(f"random pairs of distinct sentences need at least 2 sentences, got {n_sentences}")
    if n_pairs < 1:
        raise ValueError(f"the number of pairs must be positive, got {n_pairs}")
    gen = torch.Generator().manual_seed(seed)
    cand = torch.randint(n_sentences, (n_pairs,), generator=gen)
    ref = torch.randint(n_sentences - 1, (n_pairs,), generator=gen)
    return cand, ref + (ref >= cand).long()


def baseline_from_corpus(
    sentences: Sequence[str],
    model: str | None = None,
    *,
    pairs: int = 100_000,
    seed: int = 0,
    device: str | None = None,
    dtype: str = "float32",
    batch_tokens: int | None = None,
    max_elements: int | None = None,
    progress: bool | None = None,
    encoder: FrozenEncoder | None = None,
) -> dict[int, tuple[float, float, float]]:
    """Baseline ``{layer: (P, R, F)}`` for layers ``0..L`` from random pairs of distinct ``sentences``.

    Pairs are drawn (:func:`sample_pairs` with ``seed``) over the sentences sorted by Unicode code point,
    so the result depends on the set of sentences only. ``sentences`` should already be distinct (see
    :func:`~bertscore_loss.quality.datasets.read_corpus`); duplicates raise an error because a pair of
    equal texts would bias the baseline upwards.
    ``encoder``: an untruncated encoder to use instead of loading ``model``.
    """
    stripped = sorted(s.strip() for s in sentences)  # the pairs depend on the set of sentences, not its order
    if any(not s for s in stripped):
        raise ValueError("the corpus holds an empty sentence; remove it (read_corpus does)")
    if len(set(stripped)) != len(stripped):
        raise ValueError("the corpus holds duplicate sentences; deduplicate it (read_corpus does)")
    cand, ref = sample_pairs(len(stripped), pairs, seed)
    used = torch.unique(torch.cat((cand, ref))).tolist()
    enc = encoder or load_full_encoder(model, device=device, dtype=dtype)
    logger.info("baseline: %d pairs over %d of %d sentences, seed %d", pairs, len(used), len(stripped), seed)
    emb = embed_all_layers(enc, [stripped[i] for i in used], batch_tokens=batch_tokens, progress=progress)
    cands = [stripped[i] for i in cand.tolist()]
    refs = [stripped[i] for i in ref.tolist()]
    scores = emb.score(cands, refs, max_elements=max_elements, progress=progress)  # [L + 1, 3, pairs]
    mean = scores.double().mean(dim=2)
    return {k: (float(mean[k, 0]), float(mean[k, 1]), float(mean[k, 2])) for k in range(mean.shape[0])}


def compute_baseline_file(
    path: str | os.PathLike, sentences: Sequence[str], model: str | None = None, **kwargs: Any
) -> dict[int, tuple[float, float, float]]:
    """:func:`baseline_from_corpus` written to ``path`` in the ``bert-score`` format (atomically); returns the rows."""
    rows = baseline_from_corpus(sentences, model, **kwargs)
    with atomic_path(path, overwrite=True, allow_docs=True) as tmp:
        write_baseline(tmp, rows)
    return rows
