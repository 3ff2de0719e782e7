"""The pure tensor core against hand calculations."""

from __future__ import annotations

import math

import pytest
import torch

from bertscore_loss.matching import (
    bertscore,
    cosine_matrix,
    f_score,
    greedy_match,
    normalize_weights,
    precision_recall_f,
    rescale,
)
from bertscore_loss.scorer import reduce_references


def test_cosine_matrix_hand_values_and_padding_is_minus_inf():
    cand = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])  # last row is padding
    ref = torch.tensor([[[0.0, 2.0], [3.0, 0.0]]])
    sim = cosine_matrix(cand, ref, torch.tensor([[True, True, False]]), torch.tensor([[True, True]]))
    assert sim.shape == (1, 3, 2)
    r = 1 / math.sqrt(2)
    assert torch.allclose(sim[0, :2], torch.tensor([[0.0, 1.0], [r, r]]))
    assert torch.isinf(sim[0, 2]).all() and (sim[0, 2] < 0).all()


def test_greedy_match_values_indices_and_padding_never_matched():
    # All real similarities are negative: a 0-valued padding entry would win under bert-score's masking.
    cand = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    ref = torch.tensor([[[-1.0, -0.1], [-0.2, -1.0], [7.0, 7.0]]])
    cm, rm = torch.tensor([[True, True]]), torch.tensor([[True, True, False]])
    m = greedy_match(cosine_matrix(cand, ref, cm, rm), cm, rm)
    s1, s2 = -1 / math.sqrt(1.01), -0.1 / math.sqrt(1.01)
    t1, t2 = -0.2 / math.sqrt(1.04), -1 / math.sqrt(1.04)
    assert torch.allclose(m.cand_sim, torch.tensor([[max(s1, t1), max(s2, t2)]]))
    assert m.cand_index.tolist() == [[1, 0]]
    assert torch.allclose(m.ref_sim, torch.tensor([[max(s1, s2), max(t1, t2), 0.0]]))
    assert m.ref_index.tolist() == [[1, 0, -1]]
    assert (m.cand_sim < 0).all()


def test_precision_recall_f_weighted_hand_calculation():
    cand_sim = torch.tensor([[0.5, 1.0, 0.9]])
    ref_sim = torch.tensor([[0.8, 0.4]])
    cw = torch.tensor([[0.0, 2.0, 1.0]])  # a special token with weight 0
    rw = torch.tensor([[1.0, 3.0]])
    p, r, f = precision_recall_f(cand_sim, ref_sim, cw, rw)
    ep = (2 * 1.0 + 0.9) / 3
    er = (0.8 + 3 * 0.4) / 4
    assert p.item() == pytest.approx(ep)
    assert r.item() == pytest.approx(er)
    assert f.item() == pytest.approx(2 * ep * er / (ep + er))


def test_f_is_zero_when_p_plus_r_is_zero_and_zero_weight_rows_score_zero():
    assert f_score(torch.tensor([0.0, 0.5]), torch.tensor([0.0, -0.5])).tolist() == [0.0, 0.0]
    p, r, f = precision_recall_f(torch.ones(1, 2), torch.ones(1, 2), torch.zeros(1, 2), torch.ones(1, 2))
    assert (p.item(), r.item(), f.item()) == (0.0, 0.0, 0.0)
    assert normalize_weights(torch.tensor([[0.0, 0.0], [1.0, 3.0]])).tolist() == [[0.0, 0.0], [0.25, 0.75]]


def test_f_beta():
    p, r = torch.tensor([0.6]), torch.tensor([0.3])
    assert f_score(p, r, beta=2.0).item() == pytest.approx(5 * 0.6 * 0.3 / (4 * 0.6 + 0.3))


def test_bertscore_identical_texts_score_one():
    torch.manual_seed(0)
    x = torch.randn(2, 4, 8)
    mask = torch.ones(2, 4, dtype=torch.bool)
    w = torch.ones(2, 4)
    p, r, f = bertscore(x, x, mask, mask, w, w)
    assert torch.allclose(f, torch.ones(2), atol=1e-6)


def test_rescale():
    x = torch.tensor([0.5, 0.9])
    assert torch.allclose(rescale(x, 0.8), (x - 0.8) / 0.2)


def test_reduce_references_max_and_best_f():
    p = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.7])
    r = torch.tensor([0.8, 0.2, 0.5, 0.1, 0.1])
    f = torch.tensor([0.3, 0.4, 0.5, 0.2, 0.2])
    m = reduce_references(p, r, f, [2, 1, 2], "max")
    assert m.precision.tolist() == pytest.approx([0.9, 0.5, 0.7])
    assert m.recall.tolist() == pytest.approx([0.8, 0.5, 0.1])
    assert m.f1.tolist() == pytest.approx([0.4, 0.5, 0.2])
    assert m.ref_index.tolist() == [1, 0, 0]  # tie in the third group -> lowest index
    b = reduce_references(p, r, f, [2, 1, 2], "best_f")
    assert b.precision.tolist() == pytest.approx([0.9, 0.5, 0.7])
    assert b.recall.tolist() == pytest.approx([0.2, 0.5, 0.1])
