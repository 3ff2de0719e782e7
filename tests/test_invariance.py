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
