"""Token-similarity heatmap of one (candidate, reference) pair with the greedy matches marked."""

from __future__ import annotations

import os
from pathlib import Path

from torch import Tensor

from ..outputs import save_figure
from ..scorer import BERTScorer, TokenSimilarity


def token_similarity(cand: str, ref: str, scorer: BERTScorer | None = None) -> TokenSimilarity:
    """:meth:`BERTScorer.token_similarity` of ``cand`` against ``ref`` (default scorer: the bundled model)."""
    return (scorer or BERTScorer()).token_similarity(cand, ref)


def similarity_figure(data: TokenSimilarity, *, annotate: bool | None = None):
    """Matplotlib ``Figure`` of :class:`TokenSimilarity`: heatmap rows = candidate, columns = reference tokens.

    Red circles mark each candidate token's best reference token (precision), black crosses each
    reference token's best candidate token (recall); special tokens (weight 0) are greyed and not marked. Tick
    labels show the IDF weight when IDF is on. ``annotate``: print the similarity in each cell (default:
    when the grid has at most 400 cells).
    """
    from matplotlib.figure import Figure

    lc, lr = data.sim.shape
    annotate = lc * lr <= 400 if annotate is None else annotate
    width = min(4.0 + 0.45 * lr, 30.0)
    height = min(3.0 + 0.4 * lc, 30.0)
    fig = Figure(figsize=(width, height), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    image = ax.imshow(data.sim.numpy(), cmap="viridis", aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="cosine similarity")

    def labels(tokens: list[str], weight: Tensor) -> list[str]:
        if not data.idf:
            return tokens
        return [f"{t} ({w:.2f})" if w > 0 else t for t, w in zip(tokens, weight.tolist())]

    ax.set_xticks(range(lr))
    ax.set_xticklabels(labels(data.ref_tokens, data.ref_weight), rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(lc))
    ax.set_yticklabels(labels(data.cand_tokens, data.cand_weight), fontsize=8)
    for tick, w in zip(ax.get_xticklabels(), data.ref_weight.tolist()):
        if w <= 0:
            tick.set_color("grey")
    for tick, w in zip(ax.get_yticklabels(), data.cand_weight.tolist()):
        if w <= 0:
            tick.set_color("grey")
    rows = [i for i in range(lc) if data.cand_weight[i] > 0]
    ax.scatter(
        [int(data.cand_match[i]) for i in rows],
        rows,
        s=110,
        facecolors="none",
        edgecolors="red",
        linewidths=1.5,
        label="best reference token of a candidate token (P)",
    )
    cols = [j for j in range(lr) if data.ref_weight[j] > 0]
    ax.scatter(
        cols,
        [int(data.ref_match[j]) for j in cols],
        s=60,
        marker="x",
        color="black",
        linewidths=1.5,
        label="best candidate token of a reference token (R)",
    )
    if annotate:
        for i in range(lc):
            for j in range(lr):
                value = float(data.sim[i, j])
                ax.text(j, i - 0.28, f"{value:.2f}", ha="center", va="center", fontsize=6, color="black")
    ax.set_xlabel("reference tokens" + (" (IDF weight)" if data.idf else ""))
    ax.set_ylabel("candidate tokens" + (" (IDF weight)" if data.idf else ""))
    p, r, f = data.scores
    ax.set_title(
        f"{data.model} layer {data.layer}{' idf' if data.idf else ''}: P={p:.3f} R={r:.3f} F={f:.3f}", fontsize=9
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), fontsize=7, ncol=1, frameon=False)
    fig.tight_layout()
    return fig


def plot_similarity(
    cand: str,
    ref: str,
    path: str | os.PathLike | None = None,
    scorer: BERTScorer | None = None,
    *,
    annotate: bool | None = None,
):
    """Heatmap figure of ``cand`` against ``ref`` (see :func:`similarity_figure`), saved as PNG to ``path``
    (atomically: a temporary file, then a rename)."""
    fig = similarity_figure(token_similarity(cand, ref, scorer), annotate=annotate)
    if path is not None:
        save_figure(fig, Path(path), format="png", overwrite=True, allow_docs=True)
    return fig
