"""Scores do not depend on batching, token budgets, input order or duplication."""

from __future__ import annotations

import random

import pytest
import torch

from bertscore_loss import BERTScorer

from .conftest import real_pairs


@pytest.fixture(scope="module")
def pairs():
    cands, refs = real_pairs(per_lp=8, n_sts=30)
    return cands, refs


@pytest.mark.slow
@pytest.mark.parametrize("idf", [False, True])
def test_batching_budget_and_order_invariance(tiny_scorer, pairs, idf):
    cands, refs = pairs
    base = BERTScorer(encoder=tiny_scorer.encoder, idf=idf)
    p0, r0, f0 = base.score(cands, refs)
    for budget, elements in [(64, 1000), (300, 50_000), (100_000, 1 << 26)]:
        s = BERTScorer(encoder=tiny_scorer.encoder, idf=idf, batch_tokens=budget, max_elements=elements)
        p, r, f = s.score(cands, refs)
        for a, b in ((p, p0), (r, r0), (f, f0)):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
    perm = list(range(len(cands)))
    random.Random(0).shuffle(perm)
    p, r, f = base.score([cands[i] for i in perm], [refs[i] for i in perm])
    assert torch.allclose(f, f0[perm], atol=1e-6, rtol=0)
    assert torch.allclose(p, p0[perm], atol=1e-6, rtol=0)


def test_duplicate_pairs_get_identical_scores(tiny_scorer, pairs):
    cands, refs = pairs
    c = cands[:5] + cands[:5] + [cands[0]]
    r = refs[:5] + refs[:5] + [refs[0]]
    p, _, f = tiny_scorer.score(c, r)
    assert torch.equal(f[:5], f[5:10]) and f[10] == f[0] and torch.equal(p[:5], p[5:10])


def test_whitespace_variants_are_the_same_text(tiny_scorer):
    _, _, f = tiny_scorer.score(["a cat sat", "  a cat sat\n"], ["the cat", "the cat "])
    assert f[0] == f[1]


# --- the invariance contract on every front end (docs/semantics.md#invariance) ---------------------------
# Each front end scores pairs (a[i], b[i]) in calls of `batch` pairs and returns one measure [N]:
# F1(a, b) = F1(b, a), P(a, b) = R(b, a), the same scores for batch sizes 1, 7 and 64 and in any input order,
# and a text against itself scores 1 (no IDF, no rescaling), all to 1e-6 in float32.

CONTRACT_TOL = 1e-6
MEASURE_INDEX = {"precision": 0, "recall": 1, "f1": 2}


def _in_calls(fn, a, b, batch):
    return torch.cat([fn(a[k : k + batch], b[k : k + batch]) for k in range(0, len(a), batch)])


def _native(scorer, measure):
    return lambda a, b: scorer.score(a, b)[MEASURE_INDEX[measure]]


def _compat(folder, measure):
    from bertscore_loss import compat

    return lambda a, b: compat.score(a, b, model_type=folder, num_layers=2, batch_size=len(a))[MEASURE_INDEX[measure]]


def _evaluate_metric(folder, measure):
    evaluate = pytest.importorskip("evaluate")
    from bertscore_loss.compat import evaluate_module_path

    metric = evaluate.load(evaluate_module_path())
    return lambda a, b: torch.tensor(
        metric.compute(predictions=list(a), references=list(b), model_type=folder, num_layers=2)[measure]
    )


def _lightning_metric(scorer, measure):
    from bertscore_loss.lightning import BERTScoreMetric

    def fn(a, b):
        metric = BERTScoreMetric(scorer=scorer, per_sample=True)
        metric.update(list(a), list(b))
        return metric.compute()[measure]

    return fn


def _reranker(scorer, measure):
    from rerank import NBestReranker

    reranker = NBestReranker(scorer=scorer, measure=measure)

    def fn(a, b):
        out = reranker.rerank([[x] for x in a], list(b), return_utility=True)
        return torch.stack([r.utility[0, 0] for r in out])

    return fn


def _reward(scorer, measure):
    from bertscore_loss.integrations import BERTScoreReward

    reward = BERTScoreReward(scorer=scorer, measure=measure, cache_bytes=0)
    return lambda a, b: torch.tensor(reward(prompts=["p"] * len(a), completions=list(a), reference=list(b)))


FRONT_ENDS = ["scorer", "compat", "evaluate-metric", "lightning-metric", "reranker", "reward"]


@pytest.fixture(scope="module")
def front_end(tiny_bert_dir, tiny_scorer):
    from bertscore_loss import BERTScorer

    scorer = BERTScorer(encoder=tiny_scorer.encoder)  # no IDF, no rescaling, layer 2

    def make(name, measure):
        if name == "scorer":
            return _native(scorer, measure)
        if name == "compat":
            return _compat(tiny_bert_dir, measure)
        if name == "evaluate-metric":
            return _evaluate_metric(tiny_bert_dir, measure)
        if name == "lightning-metric":
            return _lightning_metric(scorer, measure)
        if name == "reranker":
            return _reranker(scorer, measure)
        return _reward(scorer, measure)

    return make


@pytest.fixture(scope="module")
def contract_pairs():
    cands, refs = real_pairs(per_lp=12, n_sts=0)  # 72 real pairs: batches of 64 split them too
    return cands, refs


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n == "evaluate-metric" else n for n in FRONT_ENDS]
)  # evaluate.load builds its module in seconds: the quick loop takes the other front ends
def test_invariance_contract(front_end, contract_pairs, name):
    a, b = contract_pairs
    f1, precision, recall = (front_end(name, m) for m in ("f1", "precision", "recall"))
    whole = f1(a, b)
    assert whole.shape == (len(a),) and whole.dtype == torch.float32
    assert (whole - f1(b, a)).abs().max() <= CONTRACT_TOL  # F1(a, b) = F1(b, a)
    assert (precision(a, b) - recall(b, a)).abs().max() <= CONTRACT_TOL  # P(a, b) = R(b, a)
    for batch in (7, 64):
        assert (_in_calls(f1, a, b, batch) - whole).abs().max() <= CONTRACT_TOL, batch
    assert (_in_calls(f1, a[:14], b[:14], 1) - whole[:14]).abs().max() <= CONTRACT_TOL  # one pair per call
    perm = list(range(len(a)))
    random.Random(1).shuffle(perm)
    shuffled = f1([a[i] for i in perm], [b[i] for i in perm])
    assert (shuffled - whole[perm]).abs().max() <= CONTRACT_TOL
    for fn in (f1, precision, recall):
        assert (fn(a, a) - 1).abs().max() <= CONTRACT_TOL  # a text against itself
