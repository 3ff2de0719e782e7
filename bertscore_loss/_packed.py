"""Token embeddings of many texts packed without padding: :class:`PackedEmbeddings`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import overload

import torch
from torch import Tensor

from .matching import normalize

__all__ = ["normalize_tokens", "PackedEmbeddings"]


def normalize_tokens(hidden: Tensor) -> Tensor:
    """Unit-normalised float32 token embeddings ``[T, d]``."""
    return normalize(hidden.float())


@dataclass
class PackedEmbeddings:
    """Token embeddings of many texts without padding.

    ``flat`` ``[T, d]`` (unit-normalised float32), text ``i`` owns rows
    ``offsets[i] : offsets[i] + lengths[i]``; ``token_ids`` ``[T]`` are the ids of those rows.
    """

    flat: Tensor
    offsets: Tensor
    lengths: Tensor
    token_ids: Tensor

    def __len__(self) -> int:
        return int(self.offsets.numel())

    def row(self, i: int) -> Tensor:
        """Embeddings ``[L_i, d]`` of text ``i``."""
        start = int(self.offsets[i])
        return self.flat[start : start + int(self.lengths[i])]

    @classmethod
    def from_list(cls, embs: Sequence[Tensor], ids: Sequence[Sequence[int]]) -> PackedEmbeddings:
        """Pack per-text embeddings ``[L_i, d]`` and their token ids."""
        device = embs[0].device if embs else torch.device("cpu")
        lengths = torch.tensor([e.shape[0] for e in embs], dtype=torch.long, device=device)
        offsets = torch.cumsum(lengths, 0) - lengths
        flat = torch.cat(list(embs)) if embs else torch.zeros((0, 0), device=device)
        token_ids = torch.tensor([t for r in ids for t in r], dtype=torch.long, device=device)
        return cls(flat, offsets, lengths, token_ids)

    @overload
    def gather(
        self, index: Tensor, token_weight: Tensor, width: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor]: ...

    @overload
    def gather(
        self, index: Tensor, token_weight: None = None, width: int | None = None
    ) -> tuple[Tensor, Tensor, None]: ...

    def gather(
        self, index: Tensor, token_weight: Tensor | None = None, width: int | None = None
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Padded embeddings ``[*S, L, d]``, mask ``[*S, L]`` and weights ``[*S, L]`` of texts ``index`` ``[*S]``.

        ``index`` may have any shape; ``-1`` marks a missing text (all padding). ``L`` = ``width``, or
        the longest gathered text. ``token_weight`` ``[T]`` is a per-row weight aligned with ``flat``.
        """
        valid = index >= 0
        safe = index.clamp_min(0)
        lengths = torch.where(valid, self.lengths[safe], 0) if index.numel() else self.lengths[safe]
        if width is None:
            width = int(lengths.max()) if index.numel() else 0
        steps = torch.arange(width, device=self.flat.device)
        mask = steps < lengths.unsqueeze(-1)
        rows = (self.offsets[safe].unsqueeze(-1) + steps).masked_fill(~mask, 0)
        emb = self.flat.index_select(0, rows.reshape(-1)).view(*rows.shape, self.flat.shape[-1])  # faster than [rows]
        weight = token_weight[rows].masked_fill(~mask, 0.0) if token_weight is not None else None
        return emb, mask, weight
