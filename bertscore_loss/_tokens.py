"""Tokenisation as the evaluation mode does it: framing, the maximum length, truncation, windows, batches."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain
from typing import Any

import torch
from torch import Tensor

from ._chunking import budget_runs
from .config import batch_tokens_for

__all__ = ["length_order", "Tokenization", "Tokenized", "window_plan"]

# tokenizer(...) switches a fast tokenizer's shared truncation/padding state per call: one call at a time
_HF_CALL_LOCK = threading.Lock()


@dataclass(frozen=True)
class Tokenized:
    """Token ids of a list of texts; ``truncated`` counts the texts cut to the maximum length."""

    ids: list[list[int]]
    truncated: int


class Tokenization:
    """The tokenisation half of :class:`~bertscore_loss.FrozenEncoder` (which mixes it in).

    Needs ``tokenizer``, ``model`` (for its config), ``long_inputs``, ``_call_kwargs`` and ``device``.
    """

    tokenizer: Any
    model: Any
    long_inputs: str
    _call_kwargs: dict[str, Any]
    max_length: int

    @property
    def device(self) -> torch.device:  # the encoder's
        raise NotImplementedError

    def _framing_ids(self) -> frozenset[int]:
        """Ids of the special tokens the tokenizer adds around a text (weight 0 in the score)."""
        ids = set(self.tokenizer("", add_special_tokens=True)["input_ids"])
        ids.update(i for i in (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id) if i is not None)
        return frozenset(ids)

    @cached_property
    def framing(self) -> tuple[list[int], list[int]]:
        """Special-token ids the tokenizer puts before and after a text's tokens (e.g. [CLS], [SEP])."""
        full = self.tokenizer("a", add_special_tokens=True, **self._call_kwargs)["input_ids"]
        body = self.tokenizer("a", add_special_tokens=False, **self._call_kwargs)["input_ids"]
        for i in range(len(full) - len(body) + 1):
            if full[i : i + len(body)] == body:
                return list(full[:i]), list(full[i + len(body) :])
        raise ValueError("cannot locate a text's tokens between the tokenizer's special tokens")

    def _max_length(self) -> int:
        tok_max = int(getattr(self.tokenizer, "model_max_length", 0) or 0)
        pos = getattr(self.model.config, "max_position_embeddings", None)
        if pos is not None and getattr(self.model.config, "model_type", "") in {
            "roberta",
            "xlm-roberta",
            "camembert",
            "longformer",
            "bart",
            "mbart",
        }:
            pos -= 2  # these models offset positions by padding_idx + 1
        if tok_max <= 0 or tok_max > 1_000_000:
            return int(pos) if pos else 512
        return min(tok_max, int(pos)) if pos else tok_max

    @property
    def window_body(self) -> int:
        """Text tokens per window in ``long_inputs="window"`` mode (``max_length`` minus the framing)."""
        pre, post = self.framing
        return self.max_length - len(pre) - len(post)

    def _check_stride(self, stride: int | None) -> int:
        body = self.window_body
        if stride is None:
            return max(1, body // 2)
        if not 1 <= int(stride) <= body:
            raise ValueError(f"window_stride must be in 1..{body} (the text tokens of one window), got {stride}")
        return int(stride)

    # --- tokenisation ------------------------------------------------------------------------
    def _own_backend(self) -> Any:
        """A private copy of a fast tokenizer's Rust backend with truncation and padding off, or None.

        The copy is never changed after it is made, so tokenising is safe from any thread whatever the
        shared tokenizer's state (a data collator may have switched its truncation on). None for a slow
        tokenizer or one that needs call arguments (those go through ``tokenizer(...)`` under a lock).
        """
        backend = getattr(self.tokenizer, "_tokenizer", None) if getattr(self.tokenizer, "is_fast", False) else None
        if backend is None or self._call_kwargs or not hasattr(backend, "to_str"):
            return None
        from tokenizers import Tokenizer

        own = Tokenizer.from_str(backend.to_str())
        own.no_truncation()
        own.no_padding()
        return own

    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Ids of ``texts`` with special tokens, uncut: one batched call of the Rust tokenizer.

        A fast tokenizer without call arguments is called through the encoder's private copy of its backend
        (``encode_batch``), which skips transformers' per-text output conversion and never touches the shared
        tokenizer's state; others go through ``tokenizer(...)`` (which switches the shared tokenizer's
        truncation per call) under a lock. Both give the same ids (tests/test_encoder.py).
        """
        if "_backend" not in self.__dict__:  # made once (a race makes two equal copies, harmlessly)
            self.__dict__["_backend"] = self._own_backend()
        own = self.__dict__["_backend"]
        if own is None:
            kw = self._call_kwargs
            with _HF_CALL_LOCK:
                out = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False, **kw)
            return out["input_ids"]
        return [e.ids for e in own.encode_batch(texts, add_special_tokens=True)]

    def _cut(self, row: list[int]) -> list[int]:
        """``row`` (framing + text tokens) cut to ``max_length``: text tokens dropped on the tokenizer's
        ``truncation_side``, the framing kept, as ``tokenizer(..., truncation=True)`` cuts a single text."""
        pre, post = self.framing
        body = row[len(pre) : len(row) - len(post)]
        keep = self.max_length - len(pre) - len(post)
        body = (
            body[len(body) - keep :] if getattr(self.tokenizer, "truncation_side", "right") == "left" else body[:keep]
        )
        return list(row[: len(pre)]) + body + list(row[len(row) - len(post) :])

    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Token ids of each text, stripped, with the tokenizer's special tokens, cut to ``max_length``.

        Same ids as ``bert-score``'s ``sent_encode``; empty text gives just the special tokens. With
        ``long_inputs="window"`` long texts keep all their tokens (they are encoded in windows).
        """
        stripped = [t.strip() for t in texts]
        if not stripped:
            return Tokenized([], 0)
        ids = [list(r) for r in self._encode(stripped)]
        if self.long_inputs == "window":
            return Tokenized(ids, 0)
        long = [i for i, row in enumerate(ids) if len(row) > self.max_length]
        for i in long:
            ids[i] = self._cut(ids[i])
        return Tokenized(ids, len(long))

    def padded_batches(
        self, ids: Sequence[Sequence[int]], order: Sequence[int], batch_tokens: int | None = None
    ) -> Iterator[tuple[list[int], Tensor, Tensor]]:
        """Batches of ``ids`` in ``order`` within a padded-token budget: ``(members, ids [b, L], mask [b, L])``.

        ``batch_tokens``: None = :func:`~bertscore_loss.config.batch_tokens_for` of the encoder's device.
        """
        budget = batch_tokens_for(self.device, batch_tokens)
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        lengths = torch.tensor([len(r) for r in ids], dtype=torch.long)
        flat = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.long)
        offsets = torch.cumsum(lengths, 0) - lengths
        order_t = torch.as_tensor(list(order), dtype=torch.long)
        for start, stop in budget_runs([(n,) for n in lengths[order_t].tolist()], budget):
            members = order_t[start:stop]
            steps = torch.arange(int(lengths[members].max()))
            mask = steps.unsqueeze(0) < lengths[members].unsqueeze(1)
            rows = (offsets[members].unsqueeze(1) + steps).masked_fill(~mask, 0)
            batch = flat[rows].masked_fill(~mask, pad_id) if flat.numel() else torch.full(mask.shape, pad_id)
            yield members.tolist(), batch, mask.long()


def window_plan(n: int, body: int, stride: int) -> tuple[list[int], Tensor]:
    """Windows over ``n`` text tokens: their starts (every ``stride``, the last one flush with the end) and,
    per token ``[n]``, the window where it has the most context on its shorter side (first on ties)."""
    starts = list(range(0, n - body, stride)) + [n - body]
    start_t = torch.tensor(starts).unsqueeze(1)
    pos = torch.arange(n).unsqueeze(0)
    context = torch.minimum(pos - start_t, start_t + body - 1 - pos)  # [windows, n]; < 0 outside
    return starts, context.argmax(0)


def length_order(ids: Sequence[Sequence[int]]) -> tuple[list[int], Tensor, Tensor]:
    """Indices of ``ids`` by ascending length (stable), each text's row offset when packed in that
    order ``[N]``, and the lengths ``[N]``."""
    lengths = torch.tensor([len(r) for r in ids], dtype=torch.long)
    order = torch.argsort(lengths, stable=True)
    offsets = torch.zeros_like(lengths)
    offsets[order] = torch.cumsum(lengths[order], 0) - lengths[order]
    return order.tolist(), offsets, lengths


def _is_byte_level(tokenizer: object) -> bool:
    from transformers import GPT2Tokenizer, RobertaTokenizer

    return isinstance(tokenizer, (GPT2Tokenizer, RobertaTokenizer))
