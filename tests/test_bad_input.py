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


# --- the bad-input table ---------------------------------------------------------------------------------------
def test_layer_must_be_an_int(tiny_bert_dir):
    with pytest.raises(ValueError, match="layer must be a non-negative int.*4.7"):
        BERTScorer(model=tiny_bert_dir, layer=4.7, device="cpu")


def test_device_nonsense_and_cuda_without_cuda(tiny_bert_dir):
    with pytest.raises(ValueError, match="'nonsense' is not a torch device"):
        BERTScorer(model=tiny_bert_dir, layer=1, device="nonsense")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            BERTScorer(model=tiny_bert_dir, layer=1, device="cuda")


def test_model_folder_empty_or_broken_config(tmp_path):
    from bertscore_loss import ModelNotFoundError

    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match="holds no config.json"):
        BERTScorer(model=str(tmp_path / "empty"), layer=1, device="cpu")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ModelNotFoundError, match="config.json: not a valid JSON"):
        BERTScorer(model=str(tmp_path / "broken"), layer=1, device="cpu")


@pytest.mark.parametrize(
    "row,match",
    [
        ("4,1.0,0.5,0.5", "finite and below 1"),
        ("4,nan,0.5,0.5", "finite and below 1"),
        ("4.7,0.5,0.5,0.5", "whole number"),
    ],
)
def test_bad_baseline_rows_name_the_line(tmp_path, row, match):
    from bertscore_loss.baseline import read_baseline

    path = tmp_path / "b.tsv"
    path.write_text(f"LAYER,P,R,F\n{row}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"b.tsv:2: .*{match}"):
        read_baseline(path)


def test_baseline_duplicate_layer_and_bom(tmp_path):
    from bertscore_loss.baseline import read_baseline

    path = tmp_path / "b.tsv"
    path.write_text("LAYER,P,R,F\n1,0.1,0.1,0.1\n1,0.2,0.2,0.2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="b.tsv:3: layer 1 appears twice"):
        read_baseline(path)
    path.write_text("\ufeffLAYER,P,R,F\n1,0.1,0.2,0.3\n", encoding="utf-8")
    assert read_baseline(path) == {1: (0.1, 0.2, 0.3)}


def test_zero_width_space_only_text_counts_as_empty(tiny_scorer):
    with pytest.warns(BERTScoreWarning, match="1 empty candidate"):
        p, r, f = tiny_scorer.score(["\u200b", "a cat"], ["a cat", "a cat"])
    assert f[0] == 0


def test_empty_text_with_rescale_warns_the_value_it_gets(tiny_bert_dir, tmp_path):
    path = tmp_path / "b.tsv"
    path.write_text("LAYER,P,R,F\n1,0.5,0.5,0.5\n", encoding="utf-8")
    scorer = BERTScorer(model=tiny_bert_dir, layer=1, device="cpu", rescale=True, baseline=str(path))
    with pytest.warns(BERTScoreWarning, match=r"0 before rescaling, i\.e\. P = -1\.000000"):
        p, r, f = scorer.score([""], ["a cat"])
    assert p.item() == pytest.approx(-1.0)  # (0 - 0.5) / (1 - 0.5): the documented value


def test_identical_references_with_idf_warn(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=1, device="cpu", idf=True)
    with pytest.warns(BERTScoreWarning, match="IDF gives every token"):
        scorer.score(["a cat", "a dog"], ["the cat", "the cat"])


def test_baseline_without_rescale_and_stride_without_window_are_errors(tiny_scorer):
    with pytest.raises(ValueError, match="baseline is given but rescale is off"):
        BERTScorer(encoder=tiny_scorer.encoder, baseline="x.tsv")
    with pytest.raises(ValueError, match="window_stride is only used with long_inputs='window'"):
        BERTScorer(encoder=tiny_scorer.encoder, window_stride=4)


def test_score_groups_ragged_rows_give_nan(tiny_scorer):
    out = tiny_scorer.score_groups([["a cat", "a dog", "a cat"], ["the sun"], []], ["a cat", ["sun", "the sun"], "x"])
    assert out.f1.shape == (3, 3) and out.ref_index.dtype == torch.long
    assert torch.isnan(out.f1[1, 1:]).all() and torch.isnan(out.f1[2]).all() and (out.ref_index[1, 1:] == -1).all()
    p, r, f = tiny_scorer.score(["a cat", "a dog", "a cat", "the sun"], ["a cat", "a cat", "a cat", ["sun", "the sun"]])
    got = torch.cat((out.f1[0], out.f1[1, :1]))
    torch.testing.assert_close(got, f, rtol=0, atol=1e-6)
    assert out.ref_index[1, 0].item() == 1


def test_loss_bad_references_and_candidates(tiny_bert_dir):
    from bertscore_loss import BERTScoreLoss

    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none")
    ids = torch.tensor([[1000, 1001], [1002, 1003]])
    with pytest.raises(TypeError, match="got str"):
        loss(ids, "ab")
    with pytest.raises(TypeError, match=r"references\[1\] must be str or a list of token ids, got NoneType"):
        loss(ids, ["a cat", None])
    with pytest.raises(TypeError, match=r"references\[0\] is a list of str"):
        loss(ids, [["a", "b"], ["c"]])
    with pytest.raises(ValueError, match=r"references\[0\] holds token id 99999999"):
        loss(ids, [[101, 99999999, 102], [101, 102]])
    with pytest.raises(TypeError, match="candidates must be a torch.Tensor"):
        loss([[1, 2]], ["a"])


def test_loss_empty_batch_and_zero_length(tiny_bert_dir):
    from bertscore_loss import BERTScoreLoss

    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu")
    v = loss.encoder.vocab_size
    out = loss(torch.zeros((0, 3, v), requires_grad=True), [])
    assert out.loss.item() == 0 and out.f1.shape == (0,)
    with pytest.warns(BERTScoreWarning, match="no real position"):
        out = loss(torch.zeros((2, 0), dtype=torch.long), ["a cat", "a dog"])
    assert out.f1.tolist() == [0.0, 0.0] and out.loss.item() == 1.0


def test_loss_nan_logits_masked_give_zero_gradient_real_give_an_error(tiny_bert_dir):
    from bertscore_loss import BERTScoreLoss

    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu")
    v = loss.encoder.vocab_size
    logits = torch.randn(2, 3, v)
    logits[:, 2] = float("nan")
    logits[0, 1] = float("-inf")
    logits.requires_grad_(True)
    mask = torch.tensor([[True, False, False], [True, True, False]])
    loss(logits, ["a cat", "a dog"], mask).loss.backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[:, 2] == 0).all() and (logits.grad[0, 1] == 0).all()
    with pytest.raises(ValueError, match="NaN at a real"):
        loss(logits.detach(), ["a cat", "a dog"])
