"""Score every layer of an encoder from one pass, and choose a layer by correlation with human judgments.

One forward pass of the untruncated model with ``output_hidden_states=True`` gives the hidden states of
all layers ``0..L`` (0 = embedding output); each layer is unit-normalised and packed, and pairs are
scored by :mod:`bertscore_loss.all_layers` (the same pipeline as :class:`~bertscore_loss.BERTScorer`),
so the scores of layer ``k`` equal ``BERTScorer(layer=k).score(...)``.

Recommendation rule: the layer with the highest mean (over groups, e.g. language pairs) Pearson
correlation of F with the human scores; ties go to the lower layer.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torch import Tensor

from ..all_layers import load_full_encoder, score_all_layers
from ..encoder import FrozenEncoder
from ..outputs import save_figure, write_text
from .datasets import JudgedPairs

logger = logging.getLogger(__name__)

MEASURES = ("P", "R", "F")
STATS = ("pearson", "kendall")
_STAT_NAMES = {"pearson": "Pearson r", "kendall": "Kendall τ"}


@dataclass
class LayerCorrelations:
    """Correlations of each layer's P/R/F with human scores.

    ``pearson``/``kendall`` ``[L + 1, 3, G]`` (layer, measure P/R/F, group); ``n`` pairs per group.
    """

    groups: list[str]
    n: list[int]
    pearson: np.ndarray
    kendall: np.ndarray

    @property
    def layers(self) -> list[int]:
        return list(range(self.pearson.shape[0]))

    def mean(self, stat: str = "pearson") -> np.ndarray:
        """Mean over groups ``[L + 1, 3]``."""
        if stat not in STATS:
            raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
        return getattr(self, stat).mean(axis=2)

    def best_layer(self, measure: str = "F", stat: str = "pearson") -> int:
        """Layer with the highest mean ``stat`` of ``measure`` over the groups (lowest layer on ties)."""
        if measure not in MEASURES:
            raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
        curve = self.mean(stat)[:, MEASURES.index(measure)]
        if np.all(np.isnan(curve)):
            raise ValueError("no layer has a defined correlation (constant scores?)")
        return int(np.nanargmax(curve))

    def rows(self) -> list[dict[str, object]]:
        """Long-format rows ``layer, measure, group, n, pearson, kendall`` (group ``mean`` last per layer/measure)."""
        out: list[dict[str, object]] = []
        mp, mk = self.mean("pearson"), self.mean("kendall")
        for k in self.layers:
            for m, name in enumerate(MEASURES):
                for g, group in enumerate(self.groups):
                    out.append(
                        {
                            "layer": k,
                            "measure": name,
                            "group": group,
                            "n": self.n[g],
                            "pearson": float(self.pearson[k, m, g]),
                            "kendall": float(self.kendall[k, m, g]),
                        }
                    )
                out.append(
                    {
                        "layer": k,
                        "measure": name,
                        "group": "mean",
                        "n": sum(self.n),
                        "pearson": float(mp[k, m]),
                        "kendall": float(mk[k, m]),
                    }
                )
        return out

    def to_csv(self) -> str:
        """:meth:`rows` as CSV text (a header, then one line per row; floats with 6 decimals)."""
        fh = io.StringIO(newline="")
        writer = csv.DictWriter(fh, fieldnames=["layer", "measure", "group", "n", "pearson", "kendall"])
        writer.writeheader()
        for row in self.rows():
            writer.writerow({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in row.items()})
        return fh.getvalue()

    def write_csv(self, path: str | os.PathLike) -> None:
        """:meth:`to_csv` written to ``path`` atomically (:mod:`bertscore_loss.outputs`; the caller chose the path)."""
        write_text(path, self.to_csv(), overwrite=True, allow_docs=True)

    def summary_markdown(self) -> str:
        """Table of the mean Pearson r and Kendall τ of P/R/F per layer; the recommended layer in bold."""
        best = self.best_layer()
        mp, mk = self.mean("pearson"), self.mean("kendall")
        lines = [
            "| layer | P r | R r | F r | P τ | R τ | F τ |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for k in self.layers:
            cells = [_fmt(x) for x in (*mp[k], *mk[k])]
            name = f"**{k}**" if k == best else str(k)
            if k == best:
                cells[2] = f"**{cells[2]}**"
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def group_markdown(self, stat: str = "pearson") -> str:
        """Per-group table of ``stat``: one row per (layer, measure), one column per group plus the mean."""
        values, mean = getattr(self, stat), self.mean(stat)
        head = ["layer", "measure", *self.groups, "mean"]
        lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
        for k in self.layers:
            for m, name in enumerate(MEASURES):
                cells = [_fmt(x) for x in values[k, m]] + [_fmt(mean[k, m])]
                lines.append(f"| {k} | {name} | " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def to_markdown(self) -> str:
        best = self.best_layer()
        groups = ", ".join(f"{g} ({n})" for g, n in zip(self.groups, self.n))
        return "\n\n".join(
            [
                f"Groups (pairs): {groups}. Recommended layer: **{best}** (highest mean Pearson r of F over the "
                f"groups: {_fmt(self.mean()[best, 2])}).",
                "Mean over the groups (r = Pearson, τ = Kendall tau-b):",
                self.summary_markdown(),
                "Pearson r per group:",
                self.group_markdown("pearson"),
                "Kendall τ per group:",
                self.group_markdown("kendall"),
            ]
        )


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4f}"


def _corr(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    from scipy import stats

    if len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0]):
        return math.nan, math.nan
    return float(stats.pearsonr(x, y)[0]), float(stats.kendalltau(x, y)[0])


def correlate_layers(scores: Tensor, human: Sequence[float], groups: Sequence[str] | None = None) -> LayerCorrelations:
    """Pearson and Kendall tau-b of ``scores`` ``[L + 1, 3, N]`` with ``human`` ``[N]``, per group.

    A group whose metric or human scores are constant gets NaN.
    """
    if scores.dim() != 3 or scores.shape[1] != 3:
        raise ValueError(f"scores must have shape [layers, 3, N], got {tuple(scores.shape)}")
    h = np.asarray(human, dtype=np.float64)
    if h.shape != (scores.shape[2],):
        raise ValueError(f"got {scores.shape[2]} scored pairs but {h.size} human scores")
    names = list(groups) if groups is not None else ["all"] * len(h)
    if len(names) != len(h):
        raise ValueError(f"got {len(h)} human scores but {len(names)} group names")
    order = list(dict.fromkeys(names))
    s = scores.double().numpy()
    pearson = np.full((s.shape[0], 3, len(order)), np.nan)
    kendall = np.full_like(pearson, np.nan)
    counts = []
    for g, group in enumerate(order):
        sel = np.array([i for i, x in enumerate(names) if x == group])
        counts.append(len(sel))
        for k in range(s.shape[0]):
            for m in range(3):
                pearson[k, m, g], kendall[k, m, g] = _corr(s[k, m, sel], h[sel])
    return LayerCorrelations(order, counts, pearson, kendall)


def tune_layers(
    data: JudgedPairs,
    model: str | None = None,
    *,
    idf: bool = False,
    device: str | None = None,
    dtype: str = "float32",
    batch_tokens: int | None = None,
    progress: bool | None = None,
    encoder: FrozenEncoder | None = None,
) -> tuple[LayerCorrelations, Tensor]:
    """Correlations of every layer of ``model`` with the human scores of ``data``, and the scores ``[L+1, 3, N]``.

    ``encoder``: an untruncated encoder to use instead of loading ``model``.
    """
    if len(data) == 0:
        raise ValueError("the dev set is empty")
    enc = encoder or load_full_encoder(model, device=device, dtype=dtype)
    scores = score_all_layers(
        enc, data.cands, data.refs, idf=idf, groups=data.groups, batch_tokens=batch_tokens, progress=progress
    )
    return correlate_layers(scores, data.human, data.groups), scores


def plot_layer_correlations(
    curves: LayerCorrelations | Mapping[str, LayerCorrelations],
    path: str | os.PathLike | None = None,
    *,
    stat: str = "pearson",
    title: str | None = None,
):
    """Mean correlation vs layer, one line per measure P/R/F (line style per entry of ``curves``).

    Returns the matplotlib ``Figure`` (and saves it to ``path`` when given, atomically). The recommended
    layer of the first entry is marked with a dotted vertical line.
    """
    from matplotlib.figure import Figure

    if isinstance(curves, LayerCorrelations):
        curves = {"": curves}
    if not curves:
        raise ValueError("nothing to plot")
    fig = Figure(figsize=(6.4, 4.2), dpi=110)
    ax = fig.add_subplot(1, 1, 1)
    colors = {"P": "tab:blue", "R": "tab:orange", "F": "tab:green"}
    styles = ["-", "--", ":", "-."]
    for c, (label, corr) in enumerate(curves.items()):
        mean = corr.mean(stat)
        for m, name in enumerate(MEASURES):
            ax.plot(
                corr.layers,
                mean[:, m],
                styles[c % len(styles)],
                marker="o",
                color=colors[name],
                label=f"{name} {label}".strip(),
            )
    first = next(iter(curves.values()))
    best = first.best_layer()
    ax.axvline(best, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("layer (0 = embeddings)")
    ax.set_ylabel(f"mean {_STAT_NAMES[stat]} over {len(first.groups)} group(s)")
    ax.set_xticks(first.layers)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title or f"correlation with human scores by layer (best: {best})", fontsize=10)
    fig.tight_layout()
    if path is not None:
        save_figure(fig, Path(path), format="png", overwrite=True, allow_docs=True)
    return fig
