"""Rescaling baselines in the ``bert-score`` file format (CSV with header ``LAYER,P,R,F``)."""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

#: Baselines shipped with the package, by model name: ``baselines/<file>.tsv``.
_PACKAGED = {
    "sentence-transformers/all-MiniLM-L6-v2": "all-MiniLM-L6-v2.tsv",
    "sentence-transformers/all-mpnet-base-v2": "all-mpnet-base-v2.tsv",
}


class BaselineNotFoundError(LookupError):
    """Rescaling was asked for but no baseline exists for that model and layer."""


def read_baseline(path: str | os.PathLike) -> dict[int, tuple[float, float, float]]:
    """Rows of a baseline file: ``{layer: (P, R, F)}``.

    ValueError naming the file and line for a layer that is not a whole number or repeats, and for a
    value that is not finite or not below 1 (rescaling divides by ``1 - b``). A UTF-8 BOM is allowed.
    """
    rows: dict[int, tuple[float, float, float]] = {}
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip().upper() for h in next(reader, [])]
            if header[:4] != ["LAYER", "P", "R", "F"]:
                raise ValueError(f"{path}: a baseline file starts with the header LAYER,P,R,F, got {header}")
            for line_no, row in enumerate(reader, start=2):
                if not row:
                    continue
                try:
                    layer_value = float(row[0])
                    values = (float(row[1]), float(row[2]), float(row[3]))
                except (ValueError, IndexError) as exc:
                    raise ValueError(f"{path}:{line_no}: expected LAYER,P,R,F numbers, got {row}") from exc
                if not layer_value.is_integer() or layer_value < 0:
                    raise ValueError(f"{path}:{line_no}: the layer must be a whole number >= 0, got {row[0]!r}")
                layer = int(layer_value)
                if layer in rows:
                    raise ValueError(f"{path}:{line_no}: layer {layer} appears twice")
                if not all(math.isfinite(v) and v < 1 for v in values):
                    raise ValueError(
                        f"{path}:{line_no}: baseline values must be finite and below 1 (rescaling divides by 1 - b), "
                        f"got {row[1:4]}"
                    )
                rows[layer] = values
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    return rows


def write_baseline(path: str | os.PathLike, rows: Mapping[int, tuple[float, float, float]]) -> None:
    """Write ``{layer: (P, R, F)}`` in the ``bert-score`` format."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(["LAYER", "P", "R", "F"])
        for layer in sorted(rows):
            writer.writerow([layer, *(repr(float(v)) for v in rows[layer])])


def packaged_baseline(model_name: str) -> Path | None:
    """Path of the baseline shipped for ``model_name`` (or a preset alias of it, e.g. ``"mpnet"``), or None."""
    from .presets import canonical_name

    name = _PACKAGED.get(canonical_name(model_name))
    if name is None:
        return None
    path = Path(__file__).with_name("baselines") / name
    return path if path.is_file() else None


def load_baseline(model_name: str, layer: int, path: str | os.PathLike | None = None) -> Tensor:
    """Baseline ``[3]`` (P, R, F) of ``layer`` from ``path`` or the packaged file of ``model_name``."""
    source = Path(path) if path is not None else packaged_baseline(model_name)
    if source is None:
        raise BaselineNotFoundError(
            f"rescaling needs a baseline, and none is shipped for {model_name!r}: pass baseline=FILE "
            "(--baseline FILE on the command line; bert-score format LAYER,P,R,F; "
            "`bertscore-loss baseline` computes one)"
        )
    if not source.is_file():
        raise BaselineNotFoundError(f"baseline file {str(source)!r} (--baseline) is not a file")
    rows = read_baseline(source)
    if layer not in rows:
        raise BaselineNotFoundError(f"baseline file {str(source)!r} has no row for layer {layer} (has {sorted(rows)})")
    return torch.tensor(rows[layer], dtype=torch.float32)
