"""Optimising token sequences on the exact BERTScore (``bertscore_loss.search``): Adam on free logits
and the gradient-guided coordinate search."""

from __future__ import annotations

import math

import pytest
import torch

from bertscore_loss import BERTScorer, VocabBridge
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.search import (
    LogitConfig,
    SearchConfig,
    _gains,
    coordinate_search,
    exact_values,
    frequent_tokens,
    optimise_logits,
    token_log_prior,
)

WORDS = ["a", "cat", "sat", "dog", "runs", "the", "mat"]


def word_ids(scorer: BERTScorer, text: str) -> list[int]:
    return scorer.encoder.tokenize([text]).ids[0][1:-1]


def exhaustive(steps: int = 1, **kw: object) -> SearchConfig:
    """No gradient pool, every swap of the vocabulary scored: a deterministic best-improvement search."""
    return SearchConfig(steps=steps, top_k=0, proposals=10_000, patience=None, **kw)


@pytest.mark.parametrize("idf", [False, True])
def test_one_round_takes_the_best_single_swap(tiny_bert_dir, idf):
    corpus = ["a cat sat on the mat", "the dog runs", "a dog sat"]
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf=idf, idf_corpus=corpus if idf else None)
    loss = BERTScoreLoss(scorer=scorer)
    vocab = [word_ids(scorer, w)[0] for w in WORDS]
    start, ref = "dog dog runs", "a cat sat"
    ids = torch.tensor([word_ids(scorer, start)])
    # Brute force with the evaluation mode on decoded text.
    texts = []
    for i in range(3):
        for v in vocab:
            if v != ids[0, i]:
                cand = ids[0].clone()
                cand[i] = v
                texts.append(scorer.encoder.tokenizer.decode(cand))
    brute = scorer.score(texts, [ref] * len(texts))[2]
    start_f = scorer.score([start], [ref])[2].item()
    res = coordinate_search(loss, ids, [ref], vocabulary=vocab, config=exhaustive())
    assert res.steps == 1
    assert res.start.item() == pytest.approx(start_f, abs=1e-5)
    assert res.value.item() == pytest.approx(max(brute.max().item(), start_f), abs=1e-5)
    assert (res.ids != ids).sum().item() == (1 if brute.max().item() > start_f else 0)
    decoded = scorer.encoder.tokenizer.decode(res.ids[0])
    assert scorer.score([decoded], [ref])[2].item() == pytest.approx(res.value.item(), abs=1e-5)
    assert exact_values(loss, res.ids, [ref]).item() == pytest.approx(res.value.item(), abs=1e-6)


def test_search_never_descends_and_reaches_the_reference(tiny_scorer):
    loss = BERTScoreLoss(scorer=tiny_scorer)
    vocab = [word_ids(tiny_scorer, w)[0] for w in WORDS]
    ids = torch.tensor([word_ids(tiny_scorer, "dog runs dog")])
    ref = "a cat sat"
    values = [
        coordinate_search(loss, ids, [ref], vocabulary=vocab, config=exhaustive(s)).value.item() for s in range(6)
    ]
    assert all(b >= a for a, b in zip(values, values[1:])), values
    cfg = SearchConfig(steps=10, top_k=0, proposals=10_000, patience=1)
    final = coordinate_search(loss, ids, [ref], vocabulary=vocab, config=cfg)
    assert final.value.item() == pytest.approx(1.0, abs=1e-6)  # the reference itself: F = 1
    assert tiny_scorer.encoder.tokenizer.decode(final.ids[0]) == ref
    assert final.steps == 4  # three swaps (every position differs), then one round without gain: stop


def test_batch_rows_are_independent_in_input_order_and_padding_stays(tiny_scorer):
    loss = BERTScoreLoss(scorer=tiny_scorer)
    vocab = [word_ids(tiny_scorer, w)[0] for w in WORDS]
    pad = tiny_scorer.encoder.tokenizer.pad_token_id
    a = word_ids(tiny_scorer, "dog dog runs")
    b = word_ids(tiny_scorer, "mat the") + [pad]
    ids = torch.tensor([a, b])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    refs = ["a cat sat", "the dog runs"]
    both = coordinate_search(loss, ids, refs, mask, vocabulary=vocab, config=exhaustive(3))
    for row, ref in enumerate(refs):
        alone = coordinate_search(
            loss, ids[row : row + 1, : int(mask[row].sum())], [ref], vocabulary=vocab, config=exhaustive(3)
        )
        assert torch.equal(both.ids[row, : int(mask[row].sum())], alone.ids[0])
        assert both.value[row].item() == pytest.approx(alone.value.item(), abs=1e-6)
    assert both.ids[1, 2].item() == pad


def test_gradient_gains_are_the_one_hot_gradient(tiny_scorer):
    """The ``[B, T, V]`` gains from one backward through rows equal autograd through a one-hot input."""
    loss = BERTScoreLoss(scorer=tiny_scorer, max_mode="soft", temperature=0.1, inputs="probs", beta=2.0)
    ids = torch.tensor([word_ids(tiny_scorer, "dog runs on the mat")])
    mask = torch.ones_like(ids, dtype=torch.bool)
    gains = _gains(loss, ids, mask, ["a cat sat"])
    onehot = torch.nn.functional.one_hot(ids, tiny_scorer.encoder.vocab_size).float().requires_grad_()
    (1 - loss(onehot, ["a cat sat"]).loss).backward()
    assert gains.shape == onehot.shape
    assert torch.allclose(gains, onehot.grad, atol=1e-6, rtol=1e-4)


def test_frequent_tokens_counts_a_corpus(tiny_scorer):
    tok = tiny_scorer.encoder.tokenizer
    got = frequent_tokens(tiny_scorer.encoder, ["a cat", "a dog .", "a cat ."], n=4)
    assert tok.convert_ids_to_tokens(got.tolist()) == ["a", "cat", ".", "dog"]  # 3, 2, 2, 1 (ties: first seen)
    assert frequent_tokens(tiny_scorer.encoder, ["a cat"], n=1).tolist() == [tok.convert_tokens_to_ids("a")]
    with pytest.raises(ValueError, match="non-empty corpus"):
        frequent_tokens(tiny_scorer.encoder, [])


def test_bad_input_is_named(tiny_scorer, tiny_roberta_dir):
    loss = BERTScoreLoss(scorer=tiny_scorer)
    ids = torch.tensor([word_ids(tiny_scorer, "a cat")])
    with pytest.raises(ValueError, match="the lengths must match"):
        coordinate_search(loss, ids, ["a", "b"])
    with pytest.raises(ValueError, match=r"token ids \[batch, length\]"):
        coordinate_search(loss, ids.float(), ["a"])
    with pytest.raises(ValueError, match="mask must have shape"):
        coordinate_search(loss, ids, ["a"], torch.ones(1, 3, dtype=torch.bool))
    cls = tiny_scorer.encoder.tokenizer.cls_token_id
    with pytest.raises(ValueError, match="non-special token ids"):
        coordinate_search(loss, ids, ["a"], vocabulary=[cls])
    with pytest.raises(ValueError, match=r"must lie in \[0, 30522\)"):
        coordinate_search(loss, torch.tensor([[40000]]), ["a"])
    from transformers import AutoTokenizer

    bridged = BERTScoreLoss(
        scorer=tiny_scorer, bridge=VocabBridge(AutoTokenizer.from_pretrained(tiny_roberta_dir), tiny_scorer.encoder)
    )
    with pytest.raises(ValueError, match="VocabBridge"):
        coordinate_search(bridged, ids, ["a"])


def test_token_log_prior_is_the_smoothed_unigram_log_frequency(tiny_scorer):
    enc = tiny_scorer.encoder
    tok = enc.tokenizer
    prior = token_log_prior(enc, ["a cat", "a dog ."], smoothing=0.1)  # a: 2, cat, dog, .: 1, total 5
    assert prior.shape == (enc.vocab_size,)
    a, cat, unseen = tok.convert_tokens_to_ids(["a", "cat", "mat"])
    assert prior[a].item() == 0.0 and prior.max().item() == 0.0
    assert prior[cat].item() == pytest.approx(math.log(1.1 / 2.1), abs=1e-6)
    assert prior[unseen].item() == pytest.approx(math.log(0.1 / 2.1), abs=1e-6)
    assert all(prior[i].item() == float("-inf") for i in enc.special_ids)
    with pytest.raises(ValueError, match="smoothing"):
        token_log_prior(enc, ["a"], smoothing=0)
    with pytest.raises(ValueError, match="non-empty corpus"):
        token_log_prior(enc, [])


@pytest.mark.slow
@pytest.mark.parametrize("idf", [False, True])
def test_optimise_logits_returns_the_best_exact_argmax_per_reference(tiny_bert_dir, idf):
    corpus = ["a cat sat on the mat", "the dog runs", "a dog sat"]
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf=idf, idf_corpus=corpus if idf else None)
    loss = BERTScoreLoss(scorer=scorer)
    prior = token_log_prior(scorer.encoder, corpus)
    refs = ["a cat sat on the mat", "the dog runs"]
    cfg = LogitConfig(steps=12, restarts=3, check_every=4, prior_scales=(1.0, 2.0))
    rng = torch.get_rng_state()
    res = optimise_logits(loss, refs, prior=prior, config=cfg)
    assert torch.equal(torch.get_rng_state(), rng)  # the user's RNG is left alone
    pad = scorer.encoder.tokenizer.pad_token_id
    assert res.ids.shape == (2, 6) and res.steps == 12
    assert res.ids[1, 3:].tolist() == [pad] * 3  # the second reference has 3 tokens
    assert not torch.isin(res.ids[:, :3], torch.tensor(sorted(scorer.encoder.special_ids))).any()
    # Each row is scored against its own reference, in input order: the evaluation mode on decoded text.
    texts = [scorer.encoder.tokenizer.decode(res.ids[0]), scorer.encoder.tokenizer.decode(res.ids[1, :3])]
    assert torch.allclose(res.value, scorer.score(texts, refs)[2], atol=1e-5)
    assert (res.value >= res.start).all()
    # At the start every restart is its prior's argmax, the corpus's most frequent token at every position.
    top = scorer.encoder.tokenizer.convert_ids_to_tokens(int(prior.argmax()))
    first = scorer.score([" ".join([top] * 6), " ".join([top] * 3)], refs)[2]
    assert torch.allclose(res.start, first, atol=1e-5)
    again = optimise_logits(loss, refs, prior=prior, config=cfg)
    assert torch.equal(again.ids, res.ids)  # seeded


def test_optimise_logits_lengths(tiny_scorer):
    loss = BERTScoreLoss(scorer=tiny_scorer)
    cfg = LogitConfig(steps=2, restarts=1, check_every=1)
    framed = tiny_scorer.encoder.tokenize(["a cat", "the dog runs"]).ids  # pre-tokenised: [CLS] ... [SEP]
    res = optimise_logits(loss, framed, config=cfg)
    assert res.ids.shape == (2, 3)
    assert res.ids[0, 2].item() == tiny_scorer.encoder.tokenizer.pad_token_id
    with pytest.raises(ValueError, match="not a mix"):
        optimise_logits(loss, ["a cat", framed[1]], config=cfg)
    with pytest.raises(ValueError, match="not a mix"):
        loss(torch.tensor([[5, 6], [7, 8]]), ["a cat", framed[1]])
    assert optimise_logits(loss, ["a cat", "the dog runs"], 4, config=cfg).ids.shape == (2, 4)
    assert optimise_logits(loss, ["a cat", "a"], [1, 2], config=cfg).ids.shape == (2, 2)


def test_optimise_logits_bad_input_is_named(tiny_scorer, tiny_roberta_dir):
    loss = BERTScoreLoss(scorer=tiny_scorer)
    with pytest.raises(ValueError, match="the lengths must match"):
        optimise_logits(loss, ["a", "b"], [2])
    with pytest.raises(ValueError, match="empty reference needs an explicit length"):
        optimise_logits(loss, ["a", ""])
    with pytest.raises(ValueError, match=r"prior must have shape \[30522\]"):
        optimise_logits(loss, ["a"], prior=torch.zeros(5))
    with pytest.raises(ValueError, match="restarts must be an int >= 1"):  # checked where the config is built
        LogitConfig(restarts=0)
    with pytest.raises(ValueError, match="prior_scales"):
        optimise_logits(loss, ["a"], config=LogitConfig(prior_scales=()))
    from transformers import AutoTokenizer

    bridged = BERTScoreLoss(
        scorer=tiny_scorer, bridge=VocabBridge(AutoTokenizer.from_pretrained(tiny_roberta_dir), tiny_scorer.encoder)
    )
    with pytest.raises(ValueError, match="without a bridge"):
        optimise_logits(bridged, ["a"])
