"""The one place that builds encoders: one :class:`FrozenEncoder` per process and full encoder settings.

Keyed by every :class:`ScorerConfig` field that changes the encoder (model, layer, dtype, device,
long_inputs, window_stride), so the scorer, the loss, the reranker, the Lightning metric and the
distributed path share one model when their settings agree, and never share one when they differ.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import threading
import weakref
from typing import Literal

import torch

from .cache import EmbeddingCache
from .config import ScorerConfig
from .encoder import FrozenEncoder, resolve_device, resolve_dtype

logger = logging.getLogger(__name__)

#: (model, layer, dtype, device, long_inputs, window_stride)
EncoderKey = tuple[str, "int | None", str, str, str, "int | None"]

# Weak values: an encoder lives as long as something holds it, and is loaded at most once per key while
# it does. Keys hold the layer and stride as asked (None = preset / half a window) and as resolved.
_REGISTRY: weakref.WeakValueDictionary[EncoderKey, FrozenEncoder] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def normalize_device(device: str | torch.device | None) -> torch.device:
    """``device`` with an explicit index for CUDA; None = cuda if present, else cpu (as the encoder)."""
    return resolve_device(device)


def _model_key(model: str | None) -> str:
    if model is None:
        return "<bundled>"
    return os.path.realpath(model) if os.path.isdir(model) else str(model)


def encoder_key(config: ScorerConfig) -> EncoderKey:
    """The registry key of ``config``'s encoder."""
    dev = normalize_device(config.device)
    return (
        _model_key(config.model),
        config.layer,
        str(resolve_dtype(config.dtype)),
        str(dev),
        config.long_inputs,
        config.window_stride,
    )


def encoder_for(config: ScorerConfig) -> FrozenEncoder:
    """The process-wide :class:`FrozenEncoder` of ``config`` (model, layer, dtype, device, long_inputs,
    window_stride); loaded on first use.

    If the same encoder already lives on another device it is copied there (no second read from disk);
    each device has its own copy, so moving one user never moves the encoder under another one.
    """
    config.validate()
    key = encoder_key(config)
    dev = torch.device(key[3])
    with _LOCK:
        enc = _REGISTRY.get(key)
        if enc is not None:
            return enc
        same = key[:3] + key[4:]
        source = next((e for k, e in list(_REGISTRY.items()) if k[:3] + k[4:] == same), None)
        if source is not None:
            logger.info("copying encoder %s (layer %s) from %s to %s", source.name, source.layer, source.device, dev)
            enc = private_copy(source)
            enc.to(dev)
        else:
            logger.info(
                "loading encoder %s (layer %s, %s) on %s", config.model or "<bundled>", config.layer, key[2], dev
            )
            enc = FrozenEncoder(
                config.model,
                config.layer,
                device=dev,
                dtype=config.dtype,
                allow_download=config.allow_download,
                long_inputs=config.long_inputs,
                window_stride=config.window_stride,
            )
        _REGISTRY[key] = enc
        _REGISTRY[(key[0], enc.layer, key[2], key[3], key[4], enc.window_stride if key[4] == "window" else None)] = enc
        return enc


_DTYPE_NAMES: dict[torch.dtype, Literal["float32", "bfloat16", "float16"]] = {
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}


def get_encoder(
    model: str | None = None,
    layer: int | None = None,
    dtype: Literal["float32", "bfloat16", "float16"] | torch.dtype = "float32",
    device: str | torch.device | None = None,
    *,
    allow_download: bool = False,
    long_inputs: Literal["truncate", "window"] = "truncate",
    window_stride: int | None = None,
) -> FrozenEncoder:
    """:func:`encoder_for` with the settings as arguments (``dtype`` may be a torch dtype)."""
    if isinstance(dtype, torch.dtype):
        dtype = _DTYPE_NAMES[dtype]
    config = ScorerConfig(
        model=model,
        layer=layer,
        dtype=dtype,
        device=None if device is None else str(device),
        allow_download=allow_download,
        long_inputs=long_inputs,
        window_stride=window_stride,
    )
    return encoder_for(config)


def encoder_on(config: ScorerConfig, device: str | torch.device) -> FrozenEncoder:
    """The registry's encoder of ``config`` on ``device`` (other settings unchanged)."""
    return encoder_for(dataclasses.replace(config, device=str(device)))


def moved(encoder: FrozenEncoder, device: str | torch.device) -> FrozenEncoder:
    """``encoder`` on ``device`` without changing it under its other users: the registry's copy there when it
    is the registry's, else a private copy moved there (``encoder`` itself when it is already there)."""
    dev = normalize_device(device)
    if encoder.device == dev:
        return encoder
    with _LOCK:
        key = next((k for k, e in list(_REGISTRY.items()) if e is encoder), None)
    if key is None:
        return private_copy(encoder).to(dev)
    dtype = next(name for dt, name in _DTYPE_NAMES.items() if str(dt) == key[2])
    model = None if key[0] == "<bundled>" else key[0]
    config = ScorerConfig(
        model=model,
        layer=encoder.layer,
        dtype=dtype,
        device=str(dev),
        long_inputs=encoder.long_inputs,  # type: ignore[arg-type]
        window_stride=encoder.window_stride if encoder.long_inputs == "window" else None,
    )
    return encoder_for(config)


def private_copy(encoder: FrozenEncoder) -> FrozenEncoder:
    """A copy of ``encoder`` outside the registry (the tokenizer is shared, the embedding cache is new and empty)."""
    memo = {id(encoder.tokenizer): encoder.tokenizer, id(encoder.cache): EmbeddingCache(0)}
    return copy.deepcopy(encoder, memo)


def is_registered(encoder: FrozenEncoder) -> bool:
    """True when ``encoder`` is the registry's (other scorers, losses and metrics may hold it)."""
    with _LOCK:
        return any(enc is encoder for enc in list(_REGISTRY.values()))


def loaded_encoders() -> list[FrozenEncoder]:
    """The distinct encoders alive in this process (for tests and memory accounting)."""
    seen: dict[int, FrozenEncoder] = {}
    for enc in list(_REGISTRY.values()):
        seen[id(enc)] = enc
    return list(seen.values())
