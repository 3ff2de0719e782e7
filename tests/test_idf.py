"""IDF against a hand calculation and bert-score's get_idf_dict."""

from __future__ import annotations

import math

import pytest
import torch

from bertscore_loss.idf import idf_table, token_weights


def test_idf_hand_calculation():
    docs = [[1, 5, 5, 2], [1, 6, 2], [1, 5, 2]]
    idf = idf_table(docs, vocab_size=8)
    m = 3
    assert idf[5].item() == pytest.approx(math.log((m + 1) / (2 + 1)))  # df counts a doc once
    assert idf[6].item() == pytest.approx(math.log((m + 1) / (1 + 1)))
    assert idf[1].item() == pytest.approx(0.0)
    assert idf[7].item() == pytest.approx(math.log(m + 1))  # unseen


def test_idf_empty_corpus_is_an_error():
    with pytest.raises(ValueError, match="IDF corpus is empty"):
        idf_table([], vocab_size=8)


def test_token_weights_special_zero():
    ids = torch.tensor([101, 7, 8, 102])
    assert token_weights(ids, frozenset({101, 102})).tolist() == [0.0, 1.0, 1.0, 0.0]
    idf = torch.arange(200, dtype=torch.float32)
    assert token_weights(ids, frozenset({101, 102}), idf).tolist() == [0.0, 7.0, 8.0, 0.0]


def test_idf_equals_bert_score(tiny_bert_dir):
    from bert_score.utils import get_idf_dict, get_tokenizer

    from bertscore_loss.encoder import FrozenEncoder

    corpus = ["the cat sat on the mat", "the dog", "a cat and a dog", "the cat sat on the mat"]
    enc = FrozenEncoder(tiny_bert_dir, layer=1, device="cpu")
    ours = idf_table(enc.tokenize(corpus).ids, enc.vocab_size)
    theirs = get_idf_dict(corpus, get_tokenizer(tiny_bert_dir), nthreads=0)
    for tok_id in set(theirs) | {0, 999}:
        assert ours[tok_id].item() == pytest.approx(theirs[tok_id], abs=1e-6)
