"""Known defects (silent wrong results, unclear errors), one test per kind, through the public API.

Each test failed on the library before its fix. Thread safety as a property is in ``test_threads.py``, the
cross-front-end agreement in ``test_properties.py``, the write rule in ``test_outputs.py``.
"""

from __future__ import annotations

import logging
import math
import threading

import numpy as np
import pytest
import torch

from bertscore_loss import BERTScoreLoss, BERTScorer, LossConfig, Signature
from rerank import mbr, sample_ids
from rerank.sampling import SamplingConfig

LONG = " ".join(["the quick brown fox jumps over the lazy dog near the old river bank"] * 50)


# --- a tokenizer left in truncation mode by someone else never cuts the scorer's texts ----------------
def test_threads_with_a_tokenizer_in_truncation_mode_equal_serial(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, long_inputs="window")
    texts = [f"{LONG[: 40 * (k + 1)]} {k}" for k in range(8)] + [LONG]
    refs = [f"a sentence number {k} about a dog" for k in range(len(texts))]
    serial = scorer.score(texts, refs).f1
    tok = scorer.encoder.tokenizer
    tok(["a data collator cuts this text short"], truncation=True, max_length=8)  # shared state: truncate at 8
    errors: list[float] = []
    done = threading.Event()

    def collator() -> None:  # another thread keeps using the shared tokenizer in truncation mode
        while not done.is_set():
            tok(["a data collator cuts this text short"], truncation=True, max_length=8)

    def work() -> None:
        for _ in range(6):
            errors.append(float((scorer.score(texts, refs).f1 - serial).abs().max()))

    side = threading.Thread(target=collator)
    side.start()
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    side.join()
    assert len(errors) == 24 and max(errors) < 1e-6


# --- padded reference ids are refused, or read through a mask ---------------------------------------
def test_loss_refuses_padded_reference_ids_and_takes_a_mask(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    loss = BERTScoreLoss(scorer=scorer, max_mode="hard", reduction="none")
    refs = ["a cat sat on the mat", "dogs"]
    rows = scorer.encoder.tokenize(refs).ids
    width = max(len(r) for r in rows)
    pad = scorer.encoder.tokenizer.pad_token_id
    padded = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.bool)
    cands = torch.tensor(scorer.encoder.tokenize(["the cat", "a dog"]).ids)[:, 1:-1]  # content ids, 2 each
    with pytest.raises(ValueError, match=r"references\[1\] holds the pad id 0.*reference_mask"):
        loss(cands, padded)
    got = loss(cands, padded, reference_mask=mask).f1
    want = scorer.score(["the cat", "a dog"], refs).f1
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="reference_mask must have the references' shape"):
        loss(cands, padded, reference_mask=mask[:, :2])


# --- loss settings checked when built; probabilities that are not distributions refused -------------
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("beta", math.nan),
        ("logit_temperature", math.inf),
        ("temperature", 0.0),
        ("beta", -1.0),
        ("top_k", 0),
        ("top_k", 2.5),
        ("ref_cache_bytes", -1),
    ],
)
def test_loss_config_rejects_bad_numbers(field, value, tiny_bert_dir):
    with pytest.raises(ValueError, match=f"{field} must be"):
        LossConfig(**{field: value})
    with pytest.raises(ValueError, match=f"{field} must be"):
        BERTScoreLoss(model=tiny_bert_dir, layer=2, **{field: value})


def test_probs_that_are_not_distributions_are_refused(tiny_bert_dir):
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, inputs="probs")
    vocab = loss.encoder.vocab_size
    good = torch.full((1, 3, vocab), 1.0 / vocab)
    assert 0.0 < float(loss(good, ["a cat"]).f1[0]) <= 1.0
    bad = good.clone()
    bad[0, 1] *= 0.5  # position 1 sums to 0.5
    with pytest.raises(ValueError, match=r"candidates\[0, 1\] is not a distribution \(sum 0.5"):
        loss(bad, ["a cat"])
    masked = loss(bad, ["a cat"], candidate_mask=torch.tensor([[True, False, True]]))  # a masked row never matters
    assert torch.isfinite(masked.loss)


# --- a non-finite utility is an error, not a silently reversed ranking --------------------------------
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_mbr_refuses_non_finite_utilities(bad):
    def utility(h, r):
        u = torch.zeros(len(h), len(r), dtype=torch.float64)
        u[0, :] = bad
        return u

    with pytest.raises(ValueError, match="returned (NaN|an infinite value): a utility must be finite"):
        mbr([["a", "b", "c"]], utility=utility)


# --- a batched evaluation that ends without a final batch never leaks into the next --------------------
def test_compute_metrics_callback_drops_an_unfinished_evaluation(tiny_bert_dir, caplog):
    from transformers import AutoTokenizer, TrainerCallback

    from bertscore_loss.integrations.hf import BERTScoreMetrics

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    metrics = BERTScoreMetrics(tok, BERTScorer(model=tiny_bert_dir, layer=2), cache_bytes=0)
    assert isinstance(metrics, TrainerCallback)  # Trainer(callbacks=[metrics])
    metrics.on_init_end(None, None, None)  # what the Trainer sends a registered callback
    same = np.array(tok(["a cat sat here"], padding="max_length", max_length=8)["input_ids"])
    other = np.array(tok(["dogs bark loudly"], padding="max_length", max_length=8)["input_ids"])
    assert metrics((other, same), compute_result=False) == {}  # the evaluation never sends a final batch
    with caplog.at_level(logging.WARNING, logger="bertscore_loss.integrations.hf"):
        metrics.on_evaluate(None, None, None)  # the Trainer's end of that evaluation
    assert "ended without a final batch" in caplog.text
    out = metrics((same, same), compute_result=True)  # the next evaluation: identical texts only
    assert out["bertscore_f1"] == pytest.approx(1.0, abs=1e-6)


# --- one IDF rule in every front end -----------------------------------------------------------------
def test_integrations_refuse_idf_without_a_fixed_corpus(tiny_bert_dir):
    from transformers import AutoTokenizer

    from bertscore_loss.integrations.hf import bertscore_compute_metrics
    from bertscore_loss.integrations.trl import BERTScoreReward, MBRConsensusReward

    tok = AutoTokenizer.from_pretrained(tiny_bert_dir)
    for build in (
        lambda **kw: bertscore_compute_metrics(tok, **kw),
        lambda **kw: BERTScoreReward("reference", **kw),
        lambda **kw: MBRConsensusReward(num_generations=2, **kw),
    ):
        with pytest.raises(ValueError, match="idf=True needs idf_corpus"):
            build(model=tiny_bert_dir, layer=2, idf=True)
    corpus = ["a bird sings", "a cat sleeps", "the dog"]
    reward = BERTScoreReward("reference", model=tiny_bert_dir, layer=2, idf=True, idf_corpus=corpus)
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=corpus)
    want = scorer.score(["a bird", "the cat"], ["a bird sings", "a cat sleeps"]).f1.tolist()
    assert reward(["p", "q"], ["a bird", "the cat"], reference=["a bird sings", "a cat sleeps"]) == pytest.approx(
        want, abs=1e-6
    )


# --- the IDF rule of score() and score_groups() without a fixed table, as documented ---------------------
def test_idf_counts_references_as_given_to_the_call(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, idf=True)
    groups = [["a bird", "the bird flies"], ["a cat"]]
    refs = ["a bird sings", "a cat sleeps"]
    grouped = scorer.score_groups(groups, refs).f1
    flat_c = [c for g in groups for c in g]
    flat_r = [r for g, r in zip(groups, refs) for _ in g]
    flat = scorer.score(flat_c, flat_r).f1
    # score_groups: each group's references once; score: each candidate's reference (as bert-score)
    once = BERTScorer(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=refs).score(flat_c, flat_r).f1
    per_pair = BERTScorer(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=flat_r).score(flat_c, flat_r).f1
    torch.testing.assert_close(grouped[~torch.isnan(grouped)], once, atol=1e-6, rtol=0)
    torch.testing.assert_close(flat, per_pair, atol=1e-6, rtol=0)
    assert float((flat - once).abs().max()) > 1e-4  # the two rules differ here: a group of two candidates
    single = scorer.score_groups([["a bird"], ["a cat"]], refs).f1[:, 0]  # one candidate a group: equal
    torch.testing.assert_close(single, scorer.score(["a bird", "a cat"], refs).f1, atol=1e-6, rtol=0)


# --- a loss on a windowing scorer windows long candidates as the scorer does ---------------------------
def test_loss_windows_long_candidates_like_the_scorer(tiny_bert_dir):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, long_inputs="window")
    loss = BERTScoreLoss(scorer=scorer, max_mode="hard", reduction="none")
    cands, refs = [LONG, "a short one"], [LONG[: len(LONG) // 2] + " river", "a short reference"]
    ids = scorer.encoder.tokenize(cands).ids
    assert len(ids[0]) > scorer.encoder.max_length
    width = max(len(r) - 2 for r in ids)
    content = torch.tensor([r[1:-1] + [0] * (width - len(r) + 2) for r in ids])
    mask = torch.tensor([[1] * (len(r) - 2) + [0] * (width - len(r) + 2) for r in ids], dtype=torch.bool)
    out = loss(content, refs, candidate_mask=mask)
    want = scorer.score(cands, refs)
    for got, exp in zip(out[1:], want):
        torch.testing.assert_close(got, exp, atol=1e-5, rtol=0)
    probs = torch.nn.functional.one_hot(content, loss.encoder.vocab_size).float().requires_grad_(True)
    soft = BERTScoreLoss(scorer=scorer, inputs="probs", max_mode="soft", temperature=0.01)
    soft(probs, refs, candidate_mask=mask).loss.backward()  # the windowed pass is differentiable
    assert probs.grad is not None and bool(probs.grad[0, -1].abs().sum() > 0)  # a token of a later window


# --- whitespace-like completions are empty everywhere ------------------------------------------------
def test_zero_width_completions_are_empty_in_rewards(tiny_bert_dir):
    from bertscore_loss.integrations.trl import BERTScoreReward, MBRConsensusReward

    scorer = BERTScorer(model=tiny_bert_dir, layer=2)
    blank = ["", "\u200b", "\ufeff", " \u200b\t", "\u2060"]
    assert scorer.empty_texts(blank + ["a cat"]) == [True] * len(blank) + [False]
    reward = BERTScoreReward("reference", scorer, empty_value=-7.0)
    got = reward(["p"] * 6, blank + ["a cat"], reference=["a cat"] * 6)
    assert got[:5] == [-7.0] * 5 and got[5] == pytest.approx(1.0, abs=1e-6)
    consensus = MBRConsensusReward(scorer, num_generations=3, empty_value=-7.0)
    out = consensus(["p"] * 3, ["a cat", "\u200b", "a cat"])  # the blank one is nobody's partner
    assert out == pytest.approx([1.0, -7.0, 1.0], abs=1e-6)


# --- bad sources and lengths for sampling are clear errors ------------------------------------------
def test_sample_ids_checks_ids_and_lengths():
    from .conftest import tiny_bart

    model = tiny_bart(40, 24)
    with pytest.raises(ValueError, match=r"sources\[1\] holds token id 40, outside the model's vocabulary"):
        sample_ids(model, [[5, 2], [40, 2]], SamplingConfig(num_samples=2))
    with pytest.raises(ValueError, match=r"sources\[0\] has 30 tokens, over the model's 24 positions"):
        sample_ids(model, [[5] * 29 + [2]], SamplingConfig(num_samples=2))
    with pytest.raises(ValueError, match="max_new_tokens=30 is past the model's 24 positions"):
        sample_ids(model, [[5, 2]], SamplingConfig(num_samples=2, max_new_tokens=30))
    out = sample_ids(model, [[5] * 19 + [2]], SamplingConfig(num_samples=3, seed=0))  # default: 1.5*20+10 > 24
    assert all(len(s) <= 23 for s in out.sequences[0])


# --- a lone surrogate names the text ----------------------------------------------------------------
def test_lone_surrogate_names_the_text(tiny_scorer):
    with pytest.raises(ValueError, match=r"cands\[1\] is not valid Unicode: it holds the lone surrogate '\\udc80'"):
        tiny_scorer.score(["a cat", "the cat \udc80 sat"], ["a", "b"])


# --- signatures round-trip any folder name; the layer is plain digits ---------------------------------
def test_signature_round_trips_odd_folder_names():
    for model in ("/models/mini|lm", "C:\\models\\mini", "a\\|b", "x:y"):
        sig = Signature(version="0.1.0", model=model, layer=4)
        assert Signature.parse(str(sig)) == sig
    for layer in ("-1", "\u0663", "+4", "4.0"):
        with pytest.raises(ValueError, match="layer must be a non-negative int"):
            Signature.parse(f"bertscore-loss:0.1.0|model:m|layer:{layer}")


# --- every settings object checks its numbers where it is built ----------------------------------------------
def _config_classes():
    import bertscore_loss
    import rerank
    from bertscore_loss.search import LogitConfig, SearchConfig
    from rerank.mbr import Aggregate, AggregateExact, Exact, Prune
    from rerank.ngram_utility import BLEUConfig, ChrFConfig
    from rerank.training_data import MBRDataConfig

    return [
        bertscore_loss.ScorerConfig,
        bertscore_loss.LossConfig,
        bertscore_loss.PreferenceConfig,
        SearchConfig,
        LogitConfig,
        rerank.SamplingConfig,
        MBRDataConfig,
        ChrFConfig,
        BLEUConfig,
        Exact,
        Aggregate,
        AggregateExact,
        Prune,
    ]


def test_every_config_refuses_non_finite_numbers_naming_the_field():
    import dataclasses

    checked = 0
    for cls in _config_classes():
        for f in dataclasses.fields(cls):
            default = f.default
            if isinstance(default, bool) or not isinstance(default, (int, float)):
                continue
            for bad in (math.nan, math.inf):
                with pytest.raises(ValueError, match=f.name):
                    cls(**{f.name: bad})
            checked += 1
    assert checked >= 30  # the numeric settings of all the classes above
