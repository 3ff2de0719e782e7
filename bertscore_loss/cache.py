"""A byte-bounded LRU cache of token embeddings keyed by text."""

from __future__ import annotations

import threading
from collections import OrderedDict

from torch import Tensor


class EmbeddingCache:
    """Text → (unit-normalised embeddings ``[L, d]``, token ids) of one encoder, at most ``max_bytes``.

    ``max_bytes=0`` disables it. Least recently used entries are evicted first. Safe to share between
    threads (one lock around each operation).
    """

    def __init__(self, max_bytes: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_bytes = int(max_bytes)
        self._data: OrderedDict[str, tuple[Tensor, list[int]]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, text: str) -> bool:
        return text in self._data

    def get(self, text: str) -> tuple[Tensor, list[int]] | None:
        with self._lock:
            item = self._data.get(text)
            if item is None:
                self.misses += 1
                return None
            self._data.move_to_end(text)
            self.hits += 1
            return item

    def put(self, text: str, emb: Tensor, ids: list[int]) -> None:
        size = emb.numel() * emb.element_size()
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._data.pop(text, None)
            if old is not None:
                self.nbytes -= old[0].numel() * old[0].element_size()
            self._data[text] = (emb, ids)
            self.nbytes += size
            while self.nbytes > self.max_bytes:
                _, (e, _) = self._data.popitem(last=False)
                self.nbytes -= e.numel() * e.element_size()

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.nbytes = 0
