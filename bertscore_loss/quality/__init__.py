"""Quality tooling against human judgments: layer selection, baselines, a token-similarity heatmap.

Needs the ``quality`` extra (scipy, matplotlib; sacrebleu for the report script).
"""

from __future__ import annotations

from ..all_layers import LayerEmbeddings, embed_all_layers, load_full_encoder, score_all_layers
from .baseline_tool import baseline_from_corpus, compute_baseline_file, sample_pairs
from .datasets import JudgedPairs, read_corpus, read_judged_tsv, read_stsb, read_wmt_daseg
from .layers import LayerCorrelations, correlate_layers, plot_layer_correlations, tune_layers
from .plot import TokenSimilarity, plot_similarity, similarity_figure, token_similarity

__all__ = [
    "JudgedPairs",
    "LayerCorrelations",
    "LayerEmbeddings",
    "TokenSimilarity",
    "baseline_from_corpus",
    "compute_baseline_file",
    "correlate_layers",
    "embed_all_layers",
    "load_full_encoder",
    "plot_layer_correlations",
    "plot_similarity",
    "read_corpus",
    "read_judged_tsv",
    "read_stsb",
    "read_wmt_daseg",
    "sample_pairs",
    "score_all_layers",
    "similarity_figure",
    "token_similarity",
    "tune_layers",
]
