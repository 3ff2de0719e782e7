"""Bad input: a clear error or a documented value, one test each."""

from __future__ import annotations

import warnings

import pytest
import torch

from bertscore_loss import BaselineNotFoundError, BERTScorer, BERTScoreWarning


def test_empty_and_whitespace_texts_score_zero_with_one_warning(tiny_scorer):
    cands = ["a cat sat", "", "   ", "a dog"]
    refs = ["a cat sat down", "something", "other", " \t "]
    with pytest.warns(BERTScoreWarning, match="2 empty candidate.*1 empty reference") as rec:
        p, r, f = tiny_scorer.score(cands, refs)
    assert len([w for w in rec if issubclass(w.category, BERTScoreWarning)]) == 1
    for x in (p, r, f):
        assert x[1:].tolist() == [0.0, 0.0, 0.0]
    assert f[0] > 0.5
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        alone, _, _ = tiny_scorer.score(cands[:1], refs[:1])
    assert alone.item() == pytest.approx(p[0].item(), abs=1e-6)


def test_mismatched_lengths_name_both(tiny_scorer):
    with pytest.raises(ValueError, match="3 candidates but 2 references"):
        tiny_scorer.score(["a", "b", "c"], ["a", "b"])


def test_non_str_item_names_its_index(tiny_scorer):
    with pytest.raises(TypeError, match=r"cands\[1\]"):
        tiny_scorer.score(["a", 3, "c"], ["a", "b", "c"])
    with pytest.raises(TypeError, match=r"refs\[2\]"):
        tiny_scorer.score(["a", "b", "c"], ["a", "b", None])
    with pytest.raises(TypeError, match=r"refs\[0\]\[1\]"):
        tiny_scorer.score(["a"], [["a", b"bytes"]])
    with pytest.raises(ValueError, match=r"refs\[0\] is an empty list"):
        tiny_scorer.score(["a"], [[]])
    with pytest.raises(TypeError, match="list of str"):
        tiny_scorer.score("a single string", ["a"])


def test_too_long_text_is_truncated_with_one_warning(tiny_scorer):
    long = "word " * 700
    with pytest.warns(BERTScoreWarning, match="2 input text.*512 tokens.*truncated"):
        p, r, f = tiny_scorer.score([long, "short", long + "x"], ["a reference", "short", "b"])
    assert torch.isfinite(f).all()


def test_rescale_without_baseline_is_an_error(tiny_bert_dir):
    with pytest.raises(BaselineNotFoundError, match="baseline"):
        BERTScorer(model=tiny_bert_dir, layer=1, rescale=True, device="cpu")


def test_rescale_baseline_without_that_layer_is_an_error(tiny_bert_dir, tmp_path):
    path = tmp_path / "b.tsv"
    path.write_text("LAYER,P,R,F\n0,0.1,0.1,0.1\n1,0.2,0.2,0.2\n")
    with pytest.raises(BaselineNotFoundError, match="no row for layer 2"):
        BERTScorer(model=tiny_bert_dir, layer=2, rescale=True, baseline=str(path), device="cpu")


def test_empty_idf_corpus_is_an_error(tiny_scorer):
    with pytest.raises(ValueError, match="IDF corpus is empty"):
        BERTScorer(encoder=tiny_scorer.encoder, idf=True, idf_corpus=[])


def test_layer_out_of_range_names_the_valid_range(tiny_bert_dir):
    with pytest.raises(ValueError, match=r"layer 9 is out of range: valid layers are 0\.\.3"):
        BERTScorer(model=tiny_bert_dir, layer=9, device="cpu")


def test_unknown_option_and_bad_multi_ref(tiny_scorer):
    with pytest.raises(TypeError):
        BERTScorer(encoder=tiny_scorer.encoder, no_such_option=1)
    with pytest.raises(ValueError, match="multi_ref"):
        BERTScorer(encoder=tiny_scorer.encoder, multi_ref="mean")


def test_no_pairs_gives_empty_tensors(tiny_scorer):
    p, r, f = tiny_scorer.score([], [])
    assert p.shape == r.shape == f.shape == (0,)
