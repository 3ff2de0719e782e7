"""Inverse document frequency of tokens over a corpus, as ``bert-score`` defines it."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor


def idf_table(docs: Sequence[Sequence[int]], vocab_size: int) -> Tensor:
    """IDF of every token id ``[vocab_size]`` (float32) over ``docs`` (token-id lists, one per sentence).

    ``idf(t) = log((M + 1) / (df(t) + 1))`` with ``M = len(docs)`` (duplicates count, as in
    ``bert-score``) and ``df(t)`` the number of docs holding ``t``; unseen tokens get ``log(M + 1)``.
    """
    m = len(docs)
    if m == 0:
        raise ValueError("the IDF corpus is empty: IDF needs at least one sentence")
    uniq = [np.unique(np.asarray(d, dtype=np.int64)) for d in docs]
    flat = np.concatenate(uniq) if uniq else np.zeros(0, dtype=np.int64)
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}) for the IDF table")
    df = np.bincount(flat, minlength=vocab_size).astype(np.float64)
    idf = np.log((m + 1) / (df + 1))
    return torch.from_numpy(idf).float()


def token_weights(token_ids: Tensor, special_ids: frozenset[int], idf: Tensor | None = None) -> Tensor:
    """Weight of each token ``[T]``: its IDF (or 1 without IDF), and 0 for the special tokens."""
    if idf is None:
        weight = torch.ones(token_ids.shape, dtype=torch.float32, device=token_ids.device)
    else:
        weight = idf.to(token_ids.device)[token_ids]
    if special_ids:
        special = torch.tensor(sorted(special_ids), dtype=token_ids.dtype, device=token_ids.device)
        weight = weight.masked_fill(torch.isin(token_ids, special), 0.0)
    return weight
