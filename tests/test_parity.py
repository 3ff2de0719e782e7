"""Parity with the reference implementation ``bert-score`` on real data with the bundled MiniLM."""

from __future__ import annotations

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.matching import cosine_matrix, greedy_match

from .conftest import bundled_path, real_pairs

pytestmark = pytest.mark.slow
TOL = 1e-5


@pytest.fixture(scope="module")
def pairs():
    cands, refs = real_pairs(per_lp=20, n_sts=60)  # the full WMT16 set: tests/test_compat.py
    assert len(cands) >= 150
    return cands, refs


def oracle(cands, refs, layer, **kw):
    from bert_score import score

    return score(cands, refs, model_type=bundled_path(), num_layers=layer, device="cpu", batch_size=64, **kw)


@pytest.fixture(scope="module")
def oracle_layers(pairs):
    """{idf: (P, R, F)}, each ``[7, N]``: bert-score's scores at every layer (0 = the embeddings) in one pass
    (its ``all_layers=True`` over the 6-layer model: row L equals its ``num_layers=L``)."""
    cands, refs = pairs
    return {idf: oracle(cands, refs, 6, idf=idf, all_layers=True) for idf in (False, True)}


def negative_best_match(scorer: BERTScorer, cands, refs) -> torch.Tensor:
    """[N] True where some token's best real match is negative.

    There ``bert-score`` may match a padding position (similarity 0) instead, which our scorer never
    does (the one documented divergence); parity is asserted on the other pairs, and those pairs
    are checked to differ only in that direction.
    """
    groups = [[r] if isinstance(r, str) else r for r in refs]
    flat_c = [c for c, g in zip(cands, groups) for _ in g]
    flat_r = [r for g in groups for r in g]
    packed, _ = scorer.embed(flat_c + flat_r)
    n = len(flat_c)
    ce, cm, _ = packed.gather(torch.arange(n))
    re, rm, _ = packed.gather(torch.arange(n, 2 * n))
    m = greedy_match(cosine_matrix(ce, re, cm, rm, normalized=True), cm, rm)
    neg = (m.cand_sim < 0).any(dim=1) | (m.ref_sim < 0).any(dim=1)
    owner = torch.repeat_interleave(torch.arange(len(groups)), torch.tensor([len(g) for g in groups]))
    return torch.zeros(len(groups), dtype=torch.long).index_add_(0, owner, neg.long()).bool()


def assert_close(ours, theirs, skip=None):
    keep = torch.ones_like(ours[0], dtype=torch.bool) if skip is None else ~skip
    assert int(keep.sum()) >= 100
    for name, a, b in zip("PRF", ours, theirs):
        assert a.shape == b.shape
        diff = (a - b)[keep].abs().max().item()
        assert diff <= TOL, f"max |Δ{name}| = {diff:.2e} over {int(keep.sum())} pairs"
        if skip is not None and name != "F":  # where padding was matched, bert-score scores higher
            assert ((a - b)[skip] <= TOL).all()


@pytest.mark.parametrize("layer", [1, 2, 3, 4, 5, 6])
@pytest.mark.parametrize("idf", [False, True])
def test_single_reference_layers_and_idf(minilm_encoders, pairs, oracle_layers, layer, idf):
    cands, refs = pairs
    scorer = BERTScorer(encoder=minilm_encoders(layer), idf=idf)
    skip = negative_best_match(scorer, cands, refs)
    assert skip.sum() <= 10
    assert_close(scorer.score(cands, refs), [x[layer] for x in oracle_layers[idf]], skip)


def test_all_layers_rows_are_the_single_layer_scores(pairs, oracle_layers):
    """The fixture's premise, checked at one layer: bert-score's all-layers row L = its own num_layers=L."""
    cands, refs = pairs
    one = oracle(cands[:100], refs[:100], 3)  # without IDF, a pair's score does not depend on the others
    for a, b in zip(one, oracle_layers[False]):
        assert (a - b[3, :100]).abs().max() <= 1e-6


@pytest.mark.parametrize("idf", [False, True])
def test_multi_reference_max(minilm_encoders, pairs, idf):
    cands, refs = pairs[0][:110], pairs[1][:110]  # up to 3 references each
    n = len(cands)
    groups = [[refs[i], refs[(i + 1) % n], cands[(i + 2) % n]][: 1 + i % 3] for i in range(n)]
    scorer = BERTScorer(encoder=minilm_encoders(4), idf=idf)
    skip = negative_best_match(scorer, cands, groups)
    assert_close(scorer.score(cands, groups), oracle(cands, groups, 4, idf=idf), skip)


def test_multi_reference_best_f_and_index(minilm_encoders, pairs):
    cands, refs = pairs
    cands, refs = cands[:105], refs[:105]
    n = len(cands)
    groups = [[refs[(i + 1) % n], refs[i]] for i in range(n)]
    flat_c = [c for c in cands for _ in range(2)]
    flat_r = [r for g in groups for r in g]
    p, r, f = oracle(flat_c, flat_r, 4)
    p, r, f = p.view(n, 2), r.view(n, 2), f.view(n, 2)
    best = f.argmax(dim=1)
    scorer = BERTScorer(encoder=minilm_encoders(4), multi_ref="best_f")
    assert not negative_best_match(scorer, cands, groups).any()
    out = scorer.score(cands, groups, return_ref_index=True)
    assert torch.equal(out.ref_index, best)
    assert (best == 1).float().mean() > 0.75  # the true reference usually wins
    rows = torch.arange(n)
    assert_close(out[:3], (p[rows, best], r[rows, best], f[rows, best]))


@pytest.mark.parametrize("idf", [False, True])
def test_rescale_with_baseline_file(minilm_encoders, pairs, tmp_path, idf):
    cands, refs = pairs
    path = tmp_path / "baseline.tsv"
    rows = "\n".join(f"{k},{0.70 + 0.02 * k},{0.71 + 0.02 * k},{0.705 + 0.02 * k}" for k in range(7))
    path.write_text("LAYER,P,R,F\n" + rows + "\n")
    scorer = BERTScorer(encoder=minilm_encoders(3), idf=idf, rescale=True, baseline=str(path))
    theirs = oracle(cands, refs, 3, idf=idf, rescale_with_baseline=True, baseline_path=str(path), lang="en")
    ours = scorer.score(cands, refs)
    assert_close(ours, theirs, negative_best_match(scorer, cands, refs))
    assert (ours[2] < 0.9).any()  # rescaling really happened


def test_fixed_idf_corpus_equals_bert_score_idf_dict(minilm_encoders, pairs):
    from bert_score.utils import get_idf_dict, get_tokenizer

    cands, refs = pairs
    corpus = refs[::2]
    idf_dict = get_idf_dict(corpus, get_tokenizer(bundled_path()), nthreads=0)
    scorer = BERTScorer(encoder=minilm_encoders(4), idf=True, idf_corpus=corpus)
    skip = negative_best_match(scorer, cands, refs)
    assert_close(scorer.score(cands, refs), oracle(cands, refs, 4, idf=idf_dict), skip)


def test_bfloat16_is_close(pairs):
    cands, refs = pairs[0][:40], pairs[1][:40]  # bf16 is emulated (slow) on CPUs without bf16 instructions
    ours = BERTScorer(layer=4, device="cpu", dtype="bfloat16").score(cands, refs)
    theirs = oracle(cands, refs, 4)
    assert (ours[2] - theirs[2]).abs().max() < 2e-2
