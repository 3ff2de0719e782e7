"""Score every layer of an encoder from one pass, and choose a layer by correlation with human judgments.

One forward pass of the untruncated model with ``output_hidden_states=True`` gives the hidden states of
all layers ``0..L`` (0 = embedding output); each layer is unit-normalised and packed, and pairs are
scored by :class:`bertscore_loss.pipeline.ScoringPlan` (the same code as :class:`~bertscore_loss.BERTScorer`),
so the scores of layer ``k`` equal ``BERTScorer(layer=k).score(...)``.

Recommendation rule: the layer with the highest mean (over groups, e.g. language pairs) Pearson
correlation of F with the human scores; ties go to the lower layer.
"""

from __future__ import annotations

import csv
import logging
import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..encoder import (
    BERTScoreWarning,
    FrozenEncoder,
    ModelNotFoundError,
    PackedEmbeddings,
    bundled_model_path,
    config_layers,
    length_order,
)
from ..matching import normalize
from ..pipeline import ScoringPlan
from .datasets import JudgedPairs

logger = logging.getLogger(__name__)

MEASURES = ("P", "R", "F")
STATS = ("pearson", "kendall")
_STAT_NAMES = {"pearson": "Pearson r", "kendall": "Kendall τ"}


def load_full_encoder(
    model: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    allow_download: bool = False,
) -> FrozenEncoder:
    """``FrozenEncoder`` of ``model`` (None = bundled MiniLM) keeping all its layers."""
    from transformers import AutoConfig

    path = bundled_model_path() if model is None else str(model)
    kwargs = {} if model is None or os.path.isdir(path) or allow_download else {"local_files_only": True}
    try:
        config = AutoConfig.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ModelNotFoundError(
            f"model {path!r} was not found locally (no model hub is used): pass a local folder holding "
            "config.json, the weights and the tokenizer files, or a hub name in the local Hugging Face cache"
        ) from exc
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "num_layers", None) is not None:
        layers = int(config.num_layers)
    else:
        layers = config_layers(config, type(config).__name__)
    return FrozenEncoder(model, layer=layers, device=device, dtype=dtype, allow_download=allow_download)


@dataclass
class LayerEmbeddings:
    """Unit-normalised token embeddings of a set of texts at every layer ``0..L``.

    ``layers[k]`` packs layer ``k`` (``flat`` ``[T, d]`` float32); all share offsets, lengths and
    ``token_ids`` ``[T]``. ``index`` maps a stripped text to its row; ``ids`` are the token ids per row.
    """

    layers: list[PackedEmbeddings]
    ids: list[list[int]]
    index: dict[str, int]
    special_ids: frozenset[int]
    vocab_size: int

    @property
    def num_layers(self) -> int:
        """Highest layer ``L`` (``len(layers) - 1``)."""
        return len(self.layers) - 1

    def rows(self, texts: Sequence[str]) -> Tensor:
        """Row index ``[N]`` of each text; KeyError naming a text that was not embedded."""
        try:
            return torch.tensor([self.index[t.strip()] for t in texts], dtype=torch.long)
        except KeyError as exc:
            raise KeyError(f"text {exc.args[0]!r} was not embedded") from None

    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str],
        *,
        idf: bool = False,
        groups: Sequence[str] | None = None,
        max_elements: int = 1 << 24,
        progress: bool | None = None,
    ) -> Tensor:
        """P, R, F of every layer ``[L + 1, 3, N]`` (CPU float32) of the pairs ``(cands[i], refs[i])``.

        With ``idf`` the IDF table is computed over the references of each group (all references when
        ``groups`` is None), as one ``BERTScorer(idf=True).score`` call per group would. ``progress``:
        None = a bar for 10,000 or more pairs.
        """
        if len(cands) != len(refs):
            raise ValueError(f"got {len(cands)} candidates but {len(refs)} references: the lengths must match")
        if groups is not None and len(groups) != len(cands):
            raise ValueError(f"got {len(cands)} pairs but {len(groups)} group names")
        n = len(cands)
        cand_rows, ref_rows = self.rows(cands), self.rows(refs)
        members: dict[str, list[int]] = {}
        for i, g in enumerate(groups if groups is not None else ["all"] * n):
            members.setdefault(g, []).append(i)
        out = torch.zeros((len(self.layers), 3, n), dtype=torch.float32)
        plan = ScoringPlan(
            special_ids=self.special_ids, vocab_size=self.vocab_size, use_idf=idf, max_elements=max_elements
        )
        plan.index = dict(self.index)
        show = progress if progress is not None else n >= 10_000
        bar = tqdm(total=n * len(self.layers), desc="scoring (all layers)", unit="pair", disable=not show, leave=False)
        for items in members.values():
            sel = torch.tensor(items, dtype=torch.long)
            c, r = cand_rows[sel], ref_rows[sel]
            plan.use_embeddings(self.layers[0], self.ids, r)  # IDF (when on) over this group's references
            for k, packed in enumerate(self.layers):
                out[k, :, sel] = plan.score_pairs(c, r, packed).cpu()
                bar.update(len(items))
        bar.close()
        return out


@torch.inference_mode()
def embed_all_layers(
    enc: FrozenEncoder, texts: Sequence[str], *, batch_tokens: int | None = None, progress: bool | None = None
) -> LayerEmbeddings:
    """Encode the distinct stripped ``texts`` once and keep every layer ``0..enc.layer``.

    Texts are tokenised as :meth:`FrozenEncoder.tokenize` does (truncation and empty texts warn as in
    :class:`~bertscore_loss.BERTScorer`) and encoded in length-sorted batches of at most
    ``batch_tokens`` padded tokens. Memory: ``(L + 1) × tokens × d × 4`` bytes.
    """
    index: dict[str, int] = {}
    for t in texts:
        index.setdefault(t.strip(), len(index))
    unique = list(index)
    empty = sum(1 for t in unique if not t)
    if empty:
        warnings.warn("an empty text is among the inputs: its pairs score P = R = F = 0", BERTScoreWarning, 2)
    tok = enc.tokenize(unique)
    if tok.truncated:
        warnings.warn(
            f"{tok.truncated} input text(s) are longer than the model's maximum of {enc.max_length} tokens "
            "and were truncated",
            BERTScoreWarning,
            stacklevel=2,
        )
    ids = tok.ids
    n = len(ids)
    device = enc.device
    order, offsets, lengths = length_order(ids)
    chunks: list[list[Tensor]] = [[] for _ in range(enc.layer + 1)]
    total = int(lengths.sum())
    logger.info(
        "encoding %d texts (%d tokens) at %d layers: %.2f GB of embeddings",
        n,
        total,
        enc.layer + 1,
        (enc.layer + 1) * total * enc.hidden_size * 4 / 1e9,
    )
    show = progress if progress is not None else n >= 1000
    bar = tqdm(total=n, desc="encoding (all layers)", unit="sent", disable=not show, leave=False)
    for members, batch, mask in enc.padded_batches(ids, order, batch_tokens):
        hidden = enc.model(
            input_ids=batch.to(device), attention_mask=mask.to(device), output_hidden_states=True
        ).hidden_states
        if len(hidden) != enc.layer + 1:
            raise ValueError(f"the model returned {len(hidden)} hidden states, expected {enc.layer + 1}")
        keep = mask.to(device).bool()
        for k, h in enumerate(hidden):
            chunks[k].append(normalize(h[keep].float()))
        bar.update(len(members))
    bar.close()
    token_ids = torch.tensor([t for i in order for t in ids[i]], dtype=torch.long, device=device)
    offsets, lengths = offsets.to(device), lengths.to(device)
    layers = []
    for k in range(enc.layer + 1):
        flat = torch.cat(chunks[k]) if chunks[k] else torch.zeros((0, enc.hidden_size), device=device)
        chunks[k] = []
        layers.append(PackedEmbeddings(flat, offsets, lengths, token_ids))
    return LayerEmbeddings(layers, ids, index, enc.special_ids, enc.vocab_size)


def score_all_layers(
    enc: FrozenEncoder,
    cands: Sequence[str],
    refs: Sequence[str],
    *,
    idf: bool = False,
    groups: Sequence[str] | None = None,
    batch_tokens: int | None = None,
    max_elements: int = 1 << 24,
    progress: bool | None = None,
) -> Tensor:
    """P, R, F ``[L + 1, 3, N]`` of every layer of ``enc`` from one encoder pass (see :class:`LayerEmbeddings`)."""
    if len(cands) != len(refs):
        raise ValueError(f"got {len(cands)} candidates but {len(refs)} references: the lengths must match")
    emb = embed_all_layers(enc, [*cands, *refs], batch_tokens=batch_tokens, progress=progress)
    return emb.score(cands, refs, idf=idf, groups=groups, max_elements=max_elements)


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

    def write_csv(self, path: str | os.PathLike) -> None:
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=["layer", "measure", "group", "n", "pearson", "kendall"])
            writer.writeheader()
            for row in self.rows():
                writer.writerow({k: f"{v:.6f}" if isinstance(v, float) else v for k, v in row.items()})

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

    Returns the matplotlib ``Figure`` (and saves it to ``path`` when given). The recommended layer of
    the first entry is marked with a dotted vertical line.
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
        fig.savefig(Path(path), format="png")
    return fig
