"""Texts longer than the model's maximum: truncation (default) and overlapping windows."""

from __future__ import annotations

import warnings

import pytest
import torch

from bertscore_loss import BERTScorer, BERTScoreWarning
from bertscore_loss.encoder import FrozenEncoder

from .conftest import bundled_path, wmt16


@pytest.fixture(scope="module")
def short_bert_dir(tmp_path_factory) -> str:
    """A 2-layer random BERT with only 16 positions (so 14 text tokens per window) and the bundled tokenizer."""
    import shutil
    from pathlib import Path

    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("short-bert")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(bundled_path()) / name, d / name)
    cfg = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=16,
    )  # fmt: skip
    BertModel(cfg).save_pretrained(d)
    return str(d)


LONG = " ".join(f"w{i}" if i % 3 else "cat" for i in range(40))


def test_window_equals_plain_when_the_text_fits(short_bert_dir):
    plain = FrozenEncoder(short_bert_dir, layer=2, device="cpu")
    windowed = FrozenEncoder(short_bert_dir, layer=2, device="cpu", long_inputs="window", window_stride=5)
    texts = ["a cat sat on the mat", "the dog barked at the postman today"]  # 8 and 9 tokens with [CLS]/[SEP]
    assert max(len(r) for r in plain.tokenize(texts).ids) <= plain.max_length == 16
    a, ids_a, _ = plain.embed_texts(texts)
    b, ids_b, _ = windowed.embed_texts(texts)
    assert ids_a == ids_b
    assert torch.equal(a.flat, b.flat)


def test_each_token_comes_from_the_window_where_it_has_most_context(short_bert_dir):
    enc = FrozenEncoder(short_bert_dir, layer=2, device="cpu", long_inputs="window", window_stride=5)
    assert (enc.window_body, enc.window_stride) == (14, 5)
    ids = enc.tokenize([LONG]).ids[0]
    n = len(ids) - 2  # text tokens between [CLS] and [SEP]
    assert n > 30
    packed, _, truncated = enc.embed_texts([LONG])
    assert truncated == 0 and packed.row(0).shape[0] == len(ids)
    # windows start at 0, 5, 10, ... and the last is flush with the end
    starts = [*range(0, n - 14, 5), n - 14]
    windows = [[ids[0], *ids[1 + s : 1 + s + 14], ids[-1]] for s in starts]
    alone = enc.embed_ids(windows)
    # hand-picked tokens: context = min(tokens before it, tokens after it) inside a window
    #   t=0: only window 0 holds it; t=20: windows at 10 (min 10, 3) = 3, 15 (5, 8) = 5, 20 (0, 13) = 0 -> 15;
    #   t=n-1: the last window; t=7: windows 0 (7, 6) = 6 and 5 (2, 11) = 2 -> 0
    for t, start in ((0, 0), (20, 15), (n - 1, starts[-1]), (7, 0)):
        k = starts.index(start)
        want = alone.row(k)[1 + t - start]
        torch.testing.assert_close(packed.row(0)[1 + t], want, rtol=0, atol=1e-6)
    torch.testing.assert_close(packed.row(0)[0], alone.row(0)[0], rtol=0, atol=1e-6)  # [CLS] of the first
    torch.testing.assert_close(packed.row(0)[-1], alone.row(len(starts) - 1)[-1], rtol=0, atol=1e-6)  # [SEP] last


def test_windowed_scores_among_short_texts_keep_input_order(short_bert_dir):
    windowed = BERTScorer(model=short_bert_dir, layer=2, device="cpu", long_inputs="window")
    cands = ["a cat", LONG, "the dog"]
    refs = ["the cat", LONG, "a dog"]
    f = windowed.score(cands, refs)[2]
    alone = torch.stack([windowed.score([c], [r])[2][0] for c, r in zip(cands, refs)])
    torch.testing.assert_close(f, alone, rtol=0, atol=1e-6)
    assert f[1].item() == pytest.approx(1.0, abs=1e-6)  # identical long texts
    assert "|long:window(stride=7)|" in str(windowed.signature())  # half of the 14 text tokens of a window


def test_bad_window_options(short_bert_dir):
    with pytest.raises(ValueError, match="long_inputs"):
        FrozenEncoder(short_bert_dir, layer=1, device="cpu", long_inputs="chunks")
    with pytest.raises(ValueError, match="window_stride must be in 1..14"):
        FrozenEncoder(short_bert_dir, layer=1, device="cpu", long_inputs="window", window_stride=15)


def test_long_document_windowed_differs_from_truncated(minilm_encoders):
    mt, ref, _ = wmt16("de-en", 40)
    doc, doc_ref = " ".join(mt), " ".join(ref)
    truncating = BERTScorer(encoder=minilm_encoders(4))
    assert len(truncating.encoder.tokenize([doc]).ids[0]) == 512
    windowed = BERTScorer(layer=4, device="cpu", long_inputs="window")
    assert len(windowed.encoder.tokenize([doc]).ids[0]) > 800
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        f_cut = truncating.score([doc], [doc_ref])[2]
        f_win = windowed.score([doc], [doc_ref])[2]
    assert sum(issubclass(r.category, BERTScoreWarning) and "truncated" in str(r.message) for r in rec) == 1
    assert 0.5 < f_win.item() < 1.0 and abs(f_win.item() - f_cut.item()) > 1e-3
