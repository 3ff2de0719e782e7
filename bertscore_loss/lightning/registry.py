"""One frozen encoder per process, model, layer, dtype and device, shared by every metric that asks for it."""

from __future__ import annotations

import copy
import logging
import os
import threading
import weakref

import torch

from ..cache import EmbeddingCache
from ..encoder import FrozenEncoder, resolve_dtype

logger = logging.getLogger(__name__)

EncoderKey = tuple[str, "int | None", str, str]

# Weak values: an encoder lives as long as some metric (or scorer) holds it, and is loaded at most once
# per key while it does. Keys hold the layer as asked (None = preset) and as resolved.
_REGISTRY: weakref.WeakValueDictionary[EncoderKey, FrozenEncoder] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def normalize_device(device: str | torch.device | None) -> torch.device:
    """``device`` with an explicit index for CUDA (``"cuda"`` → ``cuda:<current>``); None = torch's default."""
    dev = torch.device(device) if device is not None else torch.get_default_device()
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _model_key(model: str | None) -> str:
    if model is None:
        return "<bundled>"
    return os.path.realpath(model) if os.path.isdir(model) else str(model)


def get_encoder(
    model: str | None,
    layer: int | None,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device | None = None,
    *,
    allow_download: bool = False,
) -> FrozenEncoder:
    """The process-wide :class:`FrozenEncoder` for ``(model, layer, dtype, device)``; loaded on first use.

    If the same encoder already lives on another device it is copied there (no second read from disk);
    each device has its own copy, so moving one metric never moves the encoder under another one.
    """
    dev = normalize_device(device)
    dt = resolve_dtype(dtype)
    key: EncoderKey = (_model_key(model), layer, str(dt), str(dev))
    with _LOCK:
        enc = _REGISTRY.get(key)
        if enc is not None:
            return enc
        source = next((e for k, e in list(_REGISTRY.items()) if k[:3] == key[:3]), None)
        if source is not None:
            logger.info("copying encoder %s (layer %s) from %s to %s", source.name, source.layer, source.device, dev)
            # The tokenizer is shared; the copy gets its own (empty) embedding cache.
            memo = {id(source.tokenizer): source.tokenizer, id(source.cache): EmbeddingCache(0)}
            enc = copy.deepcopy(source, memo)
            enc.to(dev)
        else:
            logger.info("loading encoder %s (layer %s, %s) on %s", model or "<bundled>", layer, dt, dev)
            enc = FrozenEncoder(model, layer, device=dev, dtype=dt, allow_download=allow_download)
        _REGISTRY[key] = enc
        _REGISTRY[(key[0], enc.layer, key[2], key[3])] = enc
        return enc


def loaded_encoders() -> list[FrozenEncoder]:
    """The distinct encoders alive in this process (for tests and memory accounting)."""
    seen: dict[int, FrozenEncoder] = {}
    for enc in list(_REGISTRY.values()):
        seen[id(enc)] = enc
    return list(seen.values())
