"""MinimumRiskLoss and sequence_log_probs: values from the exact scorer, gradients from the analytic formula."""

from __future__ import annotations

import pytest
import torch

from bertscore_loss import BERTScorer, MinimumRiskLoss, sequence_log_probs

REFS = ["a man is riding a horse.", "two dogs play in the snow."]
CANDS = [
    ["a man rides a horse.", "a woman is riding a horse.", "a man is eating.", "the horse runs."],
    ["two dogs are playing in snow.", "a cat sleeps.", "dogs run in the snow."],
]


@pytest.fixture(scope="module")
def scorer(tiny_bert_dir):
    return BERTScorer(model=tiny_bert_dir, layer=2)


def _oracle_f(scorer, cands, refs):
    """F of each candidate against its row's reference(s), one scorer call per row."""
    out = torch.full((len(cands), max(map(len, cands))), float("nan"), dtype=torch.float64)
    for b, row in enumerate(cands):
        out[b, : len(row)] = scorer.score(row, [refs[b]] * len(row))[2].double()
    return out


def test_value_and_gradient_equal_the_expected_risk_formula(scorer):
    torch.manual_seed(0)
    log_probs = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    alpha = 0.7
    out = MinimumRiskLoss(scorer=scorer, alpha=alpha)(log_probs, CANDS, REFS)
    f = _oracle_f(scorer, CANDS, REFS)
    torch.testing.assert_close(out.utility, f, atol=1e-6, rtol=0, equal_nan=True)
    risk = 1 - f
    present = ~torch.isnan(f)
    q = torch.softmax((alpha * log_probs.detach()).masked_fill(~present, float("-inf")), dim=1)
    expected = (q * risk.nan_to_num(0)).sum(1)
    torch.testing.assert_close(out.loss.detach(), expected.mean(), atol=1e-9, rtol=0)
    out.loss.backward()
    mean_risk = (q * risk.nan_to_num(0)).sum(1, keepdim=True)
    analytic = alpha * q * (risk.nan_to_num(0) - mean_risk) / 2  # / B: mean over rows
    torch.testing.assert_close(log_probs.grad, analytic, atol=1e-9, rtol=0)
    assert log_probs.grad[1, 3] == 0  # padding


def test_gradcheck_finite_differences(scorer):
    loss = MinimumRiskLoss(scorer=scorer, alpha=1.3)
    utilities = loss.utilities(CANDS, REFS, 4)  # scored once; the function below reuses them through the cache
    lp = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(x, CANDS, REFS).loss, (lp,))
    torch.testing.assert_close(loss(lp, CANDS, REFS).utility.float(), utilities, equal_nan=True)


def test_one_sample_per_source_has_its_risk_and_no_gradient(scorer):
    cands = [[CANDS[0][0]], [CANDS[1][1]]]
    lp = torch.tensor([[-3.0], [-0.5]], requires_grad=True)
    out = MinimumRiskLoss(scorer=scorer, reduction="none")(lp, cands, REFS)
    f = _oracle_f(scorer, cands, REFS)[:, 0].float()
    torch.testing.assert_close(out.loss.detach(), 1 - f, atol=1e-6, rtol=0)
    assert torch.equal(out.weights, torch.ones(2, 1))
    out.loss.sum().backward()
    assert torch.equal(lp.grad, torch.zeros(2, 1))


def test_duplicate_samples_count_once(scorer):
    loss = MinimumRiskLoss(scorer=scorer)
    lp = torch.tensor([[-1.0, -2.0, -1.5]], requires_grad=True)
    dup = loss(lp, [["a man rides a horse.", "a man is eating.", " a man rides  a horse. "]], REFS[:1])
    lp2 = torch.tensor([[-1.0, -2.0]])
    single = loss(lp2, [["a man rides a horse.", "a man is eating."]], REFS[:1])
    torch.testing.assert_close(dup.loss.detach(), single.loss, atol=1e-6, rtol=0)
    assert dup.weights[0, 2] == 0
    dup.loss.backward()
    assert lp.grad[0, 2] == 0 and lp.grad[0, 0] != 0


def test_idf_and_multi_reference_use_the_scorer_settings(tiny_bert_dir):
    corpus = REFS + ["a dog runs.", "a man is riding a bike."]
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=corpus)
    refs = [[REFS[0], "someone rides a horse."], [REFS[1]]]
    out = MinimumRiskLoss(scorer=scorer)(torch.zeros(2, 4), CANDS, refs)
    for b, row in enumerate(CANDS):
        f = scorer.score(row, [refs[b]] * len(row))[2]
        torch.testing.assert_close(out.utility[b, : len(row)], f, atol=1e-6, rtol=0)
    # max over the references: at least the single-reference utility
    single = BERTScorer(model=tiny_bert_dir, layer=2, idf=True, idf_corpus=corpus).score(CANDS[0], [REFS[0]] * 4)[2]
    assert bool((out.utility[0] >= single - 1e-6).all())
    with pytest.raises(ValueError, match="idf_corpus"):
        MinimumRiskLoss(model=tiny_bert_dir, layer=2, idf=True)


def test_mask_excludes_candidates(scorer):
    lp = torch.zeros(2, 4, requires_grad=True)
    mask = torch.tensor([[True, True, False, False], [True, False, False, False]])
    out = MinimumRiskLoss(scorer=scorer, reduction="none")(lp, CANDS, REFS, mask)
    f = _oracle_f(scorer, CANDS, REFS).float()
    torch.testing.assert_close(out.loss.detach(), torch.stack([1 - f[0, :2].mean(), 1 - f[1, 0]]), atol=1e-6, rtol=0)


def test_frozen_scorer_is_not_a_submodule(scorer):
    loss = MinimumRiskLoss(scorer=scorer)
    assert list(loss.parameters()) == [] and loss.state_dict() == {}


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.zeros(2), CANDS, REFS), r"\[batch, k\]"),
        ((torch.zeros(3, 4), CANDS, REFS), "3 lists"),
        ((torch.zeros(2, 4), CANDS, REFS[:1]), "references must hold 2"),
        ((torch.zeros(2, 4), CANDS, "ab"), "references must hold 2"),
        ((torch.zeros(2, 2), CANDS, REFS), "at most 2 strings"),
        ((torch.tensor([[0.0, float("nan"), 0, 0], [0, 0, 0, 0]]), CANDS, REFS), "NaN"),
        ((torch.zeros(2, 4, dtype=torch.long), CANDS, REFS), "float tensor"),
    ],
)
def test_bad_input_is_named(scorer, args, match):
    with pytest.raises(ValueError, match=match):
        MinimumRiskLoss(scorer=scorer)(*args)


def test_bad_settings_are_named(scorer):
    with pytest.raises(ValueError, match="alpha"):
        MinimumRiskLoss(scorer=scorer, alpha=0)
    with pytest.raises(ValueError, match="utility"):
        MinimumRiskLoss(scorer=scorer, utility="bleu")


def test_sequence_log_probs_sum_and_mean():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5, requires_grad=True)
    labels = torch.tensor([[1, 4, -100], [0, 2, 3]])
    lp = torch.log_softmax(logits.detach(), -1)
    want = torch.stack([lp[0, 0, 1] + lp[0, 1, 4], lp[1, 0, 0] + lp[1, 1, 2] + lp[1, 2, 3]])
    torch.testing.assert_close(sequence_log_probs(logits, labels), want)
    torch.testing.assert_close(sequence_log_probs(logits, labels, normalize=True), want / torch.tensor([2.0, 3.0]))
    sequence_log_probs(logits, labels).sum().backward()
    assert logits.grad[0, 2].abs().sum() == 0  # ignored position
    with pytest.raises(ValueError, match="lie in"):
        sequence_log_probs(logits, torch.tensor([[1, 5, 0], [0, 0, 0]]))
    with pytest.raises(ValueError, match=r"\[N, T, V\]"):
        sequence_log_probs(logits, labels[:, :2])


def test_exact_scores_inside_a_bf16_autocast_training_step(scorer):
    """The evaluation mode ignores a caller's autocast: the risk of a bf16-mixed step is the fp32 one."""
    want = scorer.score(CANDS[0], [REFS[0]] * 4)[2]
    lp = torch.zeros(2, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = scorer.score(CANDS[0], [REFS[0]] * 4)[2]
        out = MinimumRiskLoss(scorer=scorer)(lp, CANDS, REFS)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    torch.testing.assert_close(out.utility[0], want, atol=0, rtol=0)
