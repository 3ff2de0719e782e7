"""The process-wide encoder registry (it lives in the core: :mod:`bertscore_loss.registry`)."""

from __future__ import annotations

from ..registry import encoder_for, get_encoder, loaded_encoders, normalize_device

__all__ = ["encoder_for", "get_encoder", "loaded_encoders", "normalize_device"]
