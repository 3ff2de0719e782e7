"""The frozen, layer-truncated encoder: loading, tokenisation (the private engine modules), embedding."""

from __future__ import annotations

import logging
import numbers
from collections.abc import Callable, Sequence
from functools import cached_property
from itertools import chain
from typing import Any, Literal

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from ._loading import (
    count_layers,
    cpu_has_native_bf16,
    load_pretrained,
    resolve_device,
    resolve_dtype,
    truncate_layers,
    warn,
)
from ._packed import PackedEmbeddings, normalize_tokens
from ._tokens import Tokenization, Tokenized, _is_byte_level, length_order, window_plan
from .cache import EmbeddingCache
from .presets import BUNDLED_NAME, default_layer

__all__ = ["FrozenEncoder", "PackedEmbeddings", "Tokenization", "Tokenized"]

logger = logging.getLogger(__name__)


class FrozenEncoder(Tokenization, nn.Module):
    """A Hugging Face encoder truncated at ``layer``, frozen and locked in eval mode.

    ``model``: HF hub name (looked up in the local cache only unless ``allow_download``) or a local
    folder; None = the bundled all-MiniLM-L6-v2. ``layer``: None = preset for known models, else the
    last layer (with a warning). ``long_inputs``: texts longer than the model's maximum are cut
    (``"truncate"``, as ``bert-score``, with a warning) or encoded in overlapping windows (``"window"``,
    every ``window_stride`` text tokens; None = half a window). Tokenisation comes from :class:`Tokenization`
    (:meth:`Tokenization.tokenize`, :meth:`Tokenization.padded_batches`, :attr:`Tokenization.framing`,
    :attr:`Tokenization.window_body`).
    """

    # Declared for type checkers (nn.Module's __getattr__ would type them as Tensor | Module).
    tokenizer: Any
    model: Any
    cache: EmbeddingCache
    special_ids: frozenset[int]
    name: str
    path: str
    is_bundled: bool
    layer: int
    num_layers: int
    max_length: int
    long_inputs: str
    window_stride: int | None
    _call_kwargs: dict[str, Any]

    def __init__(
        self,
        model: str | None = None,
        layer: int | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "float32",
        allow_download: bool = False,
        long_inputs: Literal["truncate", "window"] = "truncate",
        window_stride: int | None = None,
    ) -> None:
        super().__init__()
        if long_inputs not in ("truncate", "window"):
            raise ValueError(f"long_inputs must be 'truncate' or 'window', got {long_inputs!r}")
        dev = resolve_device(device)
        tokenizer, hf_model, self.path, self.is_bundled = load_pretrained(model, allow_download)
        self.name = BUNDLED_NAME if self.is_bundled else str(model)
        self.num_layers = count_layers(hf_model)
        if layer is None:
            layer = default_layer(self.name)
            if layer is None:
                layer = self.num_layers
                warn(
                    f"no default layer is known for {self.name!r}: using its last layer ({layer}); "
                    "pass layer=... (see `bertscore-loss tune-layers`)"
                )
        if isinstance(layer, bool) or not isinstance(layer, numbers.Integral):
            raise ValueError(f"layer must be an int, got {layer!r}")
        self.layer = int(layer)
        truncate_layers(hf_model, self.layer)
        self.tokenizer = tokenizer
        # bert-score encodes byte-level BPE text (GPT-2, RoBERTa) with a prefix space, as after a word.
        self._call_kwargs = {"add_prefix_space": True} if _is_byte_level(tokenizer) else {}
        self.model = hf_model
        torch_dtype = resolve_dtype(dtype)
        self.model.to(device=dev, dtype=torch_dtype)
        if torch_dtype == torch.bfloat16 and self.device.type == "cpu" and not cpu_has_native_bf16():
            warn(
                "bfloat16 was asked on a CPU without native bf16 (no AMX / AVX512-BF16): PyTorch emulates it, "
                "which is slower than float32 here"
            )
        self.model.requires_grad_(False)
        self.eval()
        self.special_ids = self._framing_ids()
        self.max_length = self._max_length()
        self.long_inputs = long_inputs
        self.window_stride = self._check_stride(window_stride) if long_inputs == "window" else window_stride
        self.cache = EmbeddingCache(0)

    def enable_cache(self, max_bytes: int) -> EmbeddingCache:
        """Keep up to ``max_bytes`` of text embeddings (LRU), shared by everything using this encoder.

        Grows only: several users asking different sizes get the largest (one never shrinks another's).
        """
        if max_bytes > self.cache.max_bytes:
            old = self.cache
            self.cache = EmbeddingCache(max_bytes)
            for text, (emb, ids) in old._data.items():
                self.cache.put(text, emb, ids)
        return self.cache

    # --- frozen discipline -------------------------------------------------------------------
    def train(self, mode: bool = True) -> FrozenEncoder:
        """The encoder stays in eval mode whatever the parent asks (no dropout)."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @cached_property
    def vocab_size(self) -> int:
        return max(len(self.tokenizer), int(getattr(self.model.config, "vocab_size", 0) or 0))

    @property
    def input_embeddings(self) -> Tensor:
        """The frozen input word-embedding table ``[V, d]``."""
        return self.model.get_input_embeddings().weight

    def embed_texts(
        self,
        texts: Sequence[str],
        *,
        batch_tokens: int | None = None,
        progress: bool = False,
        cacheable: Sequence[bool] | None = None,
        cache: EmbeddingCache | None = None,
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Embeddings of ``texts`` (in order), their token ids, and how many texts were truncated.

        With a cache (``cache``, default the encoder's own :attr:`cache` when :meth:`enable_cache` turned it
        on), texts in it are not re-encoded and newly encoded ones are added to it; ``cacheable`` ``[N]``
        (default all) limits both to some texts (e.g. references, whose embeddings recur across epochs,
        but not predictions). Entries are kept per autocast dtype, so embeddings computed under a
        caller's ``torch.autocast`` never stand in for exact ones.
        """
        if cacheable is not None and len(cacheable) != len(texts):
            raise ValueError(f"cacheable has {len(cacheable)} entries for {len(texts)} texts")
        cache = self.cache if cache is None else cache
        if cache.max_bytes == 0 or (cacheable is not None and not any(cacheable)):
            tok = self.tokenize(texts)
            return self.embed_ids(tok.ids, batch_tokens=batch_tokens, progress=progress), tok.ids, tok.truncated
        keys = [t.strip() for t in texts]
        return self._embed_cached(keys, self.tokenize, batch_tokens, progress, cacheable, cache)

    def embed_token_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int | None = None, cache: EmbeddingCache | None = None
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Like :meth:`embed_texts` for texts given as framed token ids (as :meth:`Tokenization.tokenize` gives)."""
        rows = [[int(t) for t in r] for r in ids]
        cache = self.cache if cache is None else cache
        if cache.max_bytes == 0:
            return self.embed_ids(rows, batch_tokens=batch_tokens), rows, 0
        keys = ["\x00ids:" + ",".join(map(str, r)) for r in rows]
        by_key = dict(zip(keys, rows))
        tokenize = lambda ks: Tokenized([by_key[k] for k in ks], 0)  # noqa: E731
        return self._embed_cached(keys, tokenize, batch_tokens, False, None, cache)

    def _embed_cached(
        self,
        keys: list[str],
        tokenize: Callable[[list[str]], Tokenized],
        batch_tokens: int | None,
        progress: bool,
        cacheable: Sequence[bool] | None,
        cache: EmbeddingCache,
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        keep = [True] * len(keys) if cacheable is None else [bool(c) for c in cacheable]
        kind = self.device.type
        tag = f"{torch.get_autocast_dtype(kind)}\x00" if torch.is_autocast_enabled(kind) else ""
        found = [cache.get(tag + k) if c else None for k, c in zip(keys, keep)]
        wanted = {k for k, c in zip(keys, keep) if c}
        missing = sorted({k for k, f in zip(keys, found) if f is None})
        truncated = 0
        fresh: dict[str, tuple[Tensor, list[int]]] = {}
        if missing:
            tok = tokenize(missing)
            truncated = tok.truncated
            packed = self.embed_ids(tok.ids, batch_tokens=batch_tokens, progress=progress)
            for i, k in enumerate(missing):
                if k in wanted:
                    fresh[k] = (packed.row(i).clone(), tok.ids[i])  # a copy, not a view of the whole batch
                    cache.put(tag + k, *fresh[k])
                else:
                    fresh[k] = (packed.row(i), tok.ids[i])
        items = [f if f is not None else fresh[k] for k, f in zip(keys, found)]
        ids = [i for _, i in items]
        return PackedEmbeddings.from_list([e for e, _ in items], ids), ids, truncated

    # --- forward -----------------------------------------------------------------------------
    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        inputs_embeds: Tensor | None = None,
    ) -> Tensor:
        """Hidden states of the kept top layer ``[B, L, d]`` for ids ``[B, L]`` or embeddings ``[B, L, d]``."""
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds)
        return out[0]

    def forward_windowed(self, inputs_embeds: Tensor, lengths: Tensor) -> Tensor:
        """Hidden states ``[B, L, d]`` of framed embedding rows ``[B, L, d]`` (``lengths`` ``[B]``: framed
        tokens of each row, padding after) of which some are longer than ``max_length``: long rows are
        encoded in the windows of ``long_inputs="window"`` (as :meth:`embed_ids` encodes long token lists,
        each token from the window where it has the most context), short rows as they are. Differentiable
        in ``inputs_embeds``; positions past a row's length hold zeros."""
        if self.long_inputs != "window" or self.window_stride is None:
            raise ValueError("forward_windowed needs long_inputs='window'")
        pre, post = (len(x) for x in self.framing)
        body, stride, width = self.window_body, self.window_stride, self.max_length
        b, length, d = inputs_embeds.shape
        device = inputs_embeds.device
        windows: list[Tensor] = []
        masks: list[int] = []
        plans: list[tuple[int, int, list[int], Tensor]] = []  # (row, first slot, starts, best window)
        for i, n_framed in enumerate(lengths.tolist()):
            row = inputs_embeds[i]
            n = n_framed - pre - post
            if n_framed <= width:
                windows.append(
                    row[:width] if length >= width else torch.nn.functional.pad(row, (0, 0, 0, width - length))
                )
                masks.append(n_framed)
                plans.append((i, len(windows) - 1, [], torch.zeros(0, dtype=torch.long)))
                continue
            starts, best = window_plan(n, body, stride)
            first = len(windows)
            for s in starts:
                windows.append(torch.cat((row[:pre], row[pre + s : pre + s + body], row[pre + n : pre + n + post])))
                masks.append(width)
            plans.append((i, first, starts, best))
        mask = torch.arange(width, device=device).unsqueeze(0) < torch.tensor(masks, device=device).unsqueeze(1)
        hidden = self(inputs_embeds=torch.stack(windows), attention_mask=mask.long())  # [W, width, d']
        flat = hidden.reshape(-1, hidden.shape[-1])
        index = torch.zeros((b, length), dtype=torch.long)
        keep = torch.zeros((b, length), dtype=torch.bool)
        for i, first, starts, best in plans:
            n_framed = int(lengths[i])
            if not starts:
                index[i, :n_framed] = first * width + torch.arange(n_framed)
            else:
                n = n_framed - pre - post
                start_t = torch.tensor(starts)
                head = first * width + torch.arange(pre)
                text = (first + best) * width + pre + (torch.arange(n) - start_t[best])
                tail = (first + len(starts) - 1) * width + pre + body + torch.arange(post)
                index[i, :n_framed] = torch.cat((head, text, tail))
            keep[i, :n_framed] = True
        out = flat[index.to(device).reshape(-1)].reshape(b, length, -1)
        return out * keep.to(device).unsqueeze(-1).to(out.dtype)

    @torch.inference_mode()
    def embed_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int | None = None, progress: bool = False
    ) -> PackedEmbeddings:
        """Encode token-id lists once each, in length-sorted batches of at most ``batch_tokens`` padded tokens.

        Returns unit-normalised float32 embeddings packed without padding (see :class:`PackedEmbeddings`).
        Lists longer than ``max_length`` are encoded in overlapping windows (``long_inputs="window"``).
        """
        if any(len(r) > self.max_length for r in ids):
            if self.long_inputs != "window":
                raise ValueError(f"token lists longer than max_length={self.max_length}: tokenize() cuts them")
            return self._embed_windowed(ids, batch_tokens, progress)
        n = len(ids)
        order, offsets, lengths = length_order(ids)
        chunks: list[Tensor] = []
        device = self.device
        bar = tqdm(total=n, desc="encoding", unit="sent", disable=not progress, leave=False)
        pin = device.type == "cuda"  # page-locked host batches make the copies asynchronous
        for members, batch, mask in self.padded_batches(ids, order, batch_tokens):
            if pin:
                batch, mask = batch.pin_memory(), mask.pin_memory()
            batch, mask = batch.to(device, non_blocking=True), mask.to(device, non_blocking=True)
            hidden = self(batch, mask)
            chunks.append(normalize_tokens(hidden[mask.bool()]))
            bar.update(len(members))
        bar.close()
        flat = torch.cat(chunks) if chunks else torch.zeros((0, self.hidden_size), device=device)
        token_ids = torch.tensor(list(chain.from_iterable(ids[i] for i in order)), dtype=torch.long)
        return PackedEmbeddings(flat, offsets.to(device), lengths.to(device), token_ids.to(device))

    def _embed_windowed(
        self, ids: Sequence[Sequence[int]], batch_tokens: int | None, progress: bool
    ) -> PackedEmbeddings:
        """Texts longer than ``max_length``: text tokens in windows of :attr:`window_body` tokens every
        :attr:`window_stride` (the last one flush with the end), each window framed with the special
        tokens; each token keeps the embedding of the window where it has the most context on its
        shorter side (the first such window on ties); the leading special tokens come from the first
        window, the trailing ones from the last."""
        pre, post = (len(x) for x in self.framing)
        body, stride = self.window_body, self.window_stride
        assert stride is not None, "long_inputs='window' sets window_stride in __init__"
        work = [list(r) for r in ids]  # a long text's slot holds its first window, further windows go last
        plans: list[tuple[int, list[int], list[int], Tensor]] = []  # (text, window slots, starts, best window)
        for i, row in enumerate(ids):
            if len(row) <= self.max_length:
                continue
            text = list(row[pre : len(row) - post])
            n = len(text)
            starts, best = window_plan(n, body, stride)
            slots = [i]
            for k, s in enumerate(starts):
                window = [*row[:pre], *text[s : s + body], *row[len(row) - post :]]
                if k == 0:
                    work[i] = window
                else:
                    slots.append(len(work))
                    work.append(window)
            plans.append((i, slots, starts, best))
        packed = self.embed_ids(work, batch_tokens=batch_tokens, progress=progress)
        lengths = torch.tensor([len(r) for r in ids], dtype=torch.long)
        offsets = torch.cumsum(lengths, 0) - lengths
        total = int(lengths.sum())
        owner = torch.repeat_interleave(torch.arange(len(ids)), lengths)
        src_off = packed.offsets.cpu()
        rows = src_off[owner] + torch.arange(total) - offsets[owner]  # short texts: their own rows
        for i, slots, starts, best in plans:
            n = len(ids[i]) - pre - post
            start_t = torch.tensor(starts)
            win_off = src_off[torch.tensor(slots)]
            text_rows = win_off[best] + pre + (torch.arange(n) - start_t[best])
            head = win_off[0] + torch.arange(pre)
            tail = win_off[-1] + pre + body + torch.arange(post)
            rows[int(offsets[i]) : int(offsets[i]) + len(ids[i])] = torch.cat((head, text_rows, tail))
        device = packed.flat.device
        token_ids = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.long, device=device)
        return PackedEmbeddings(packed.flat[rows.to(device)], offsets.to(device), lengths.to(device), token_ids)
