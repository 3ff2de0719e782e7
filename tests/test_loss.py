"""The differentiable loss: gradients, limits, consistency with the evaluation mode, frozen encoder."""

from __future__ import annotations

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.matching import cosine_matrix, matched_similarities
from bertscore_loss.token_distributions import expected_rows, to_probs

from .conftest import needs_data, real_pairs, stsb


def content_ids(encoder, texts):
    """Encoder token ids of ``texts`` without the special tokens, padded ``[B, T]``, and the mask."""
    pre, suf = encoder.framing
    rows = [ids[len(pre) : len(ids) - len(suf)] for ids in encoder.tokenize(texts).ids]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


def _random_sim(seed=0, b=2, lc=4, lr=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    sim = torch.rand(b, lc, lr, generator=g, dtype=dtype) * 2 - 1
    cm = torch.tensor([[True, True, True, False], [True, True, True, True]])
    rm = torch.tensor([[True, True, True, True, False], [True, True, False, False, False]])
    return sim, cm, rm


# --- matching functions -------------------------------------------------------------------------
def test_gradcheck_soft_max():
    sim, cm, rm = _random_sim()
    sim.requires_grad_(True)

    def f(s):
        masked = s.masked_fill(~(cm.unsqueeze(2) & rm.unsqueeze(1)), float("-inf"))
        return matched_similarities(masked, cm, rm, mode="soft", temperature=0.3)

    assert torch.autograd.gradcheck(f, (sim,))


def test_straight_through_forward_is_hard_backward_is_soft():
    sim, cm, rm = _random_sim(1)
    masked = lambda s: s.masked_fill(~(cm.unsqueeze(2) & rm.unsqueeze(1)), float("-inf"))  # noqa: E731
    x = sim.clone().requires_grad_(True)
    st_c, st_r = matched_similarities(masked(x), cm, rm, mode="straight_through", temperature=0.3)
    hard_c, hard_r = matched_similarities(masked(sim), cm, rm, mode="hard")
    assert torch.equal(st_c.detach(), hard_c) and torch.equal(st_r.detach(), hard_r)
    w = torch.randn_like(st_c)
    (g_st,) = torch.autograd.grad((st_c * w).sum() + st_r.sum(), x)
    y = sim.clone().requires_grad_(True)
    soft_c, soft_r = matched_similarities(masked(y), cm, rm, mode="soft", temperature=0.3)
    (g_soft,) = torch.autograd.grad((soft_c * w).sum() + soft_r.sum(), y)
    assert torch.allclose(g_st, g_soft)
    # and gradcheck agrees with the straight-through gradient where soft ≈ hard (small temperature)
    z = sim.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda s: matched_similarities(masked(s), cm, rm, mode="straight_through", temperature=1e-4), (z,)
    )


def test_soft_tends_to_hard_as_temperature_goes_to_zero():
    sim, cm, rm = _random_sim(2, dtype=torch.float32)
    masked = sim.masked_fill(~(cm.unsqueeze(2) & rm.unsqueeze(1)), float("-inf"))
    hard_c, hard_r = matched_similarities(masked, cm, rm, mode="hard")
    errors = []
    for tau in (1.0, 0.1, 0.01, 0.001):
        c, r = matched_similarities(masked, cm, rm, mode="soft", temperature=tau)
        errors.append(max((c - hard_c).abs().max().item(), (r - hard_r).abs().max().item()))
    assert errors == sorted(errors, reverse=True)
    assert errors[-1] < 1e-3
    assert (hard_c[0, 3], hard_r[1, 2]) == (0.0, 0.0)  # padding


def test_top_k_and_temperature_and_gumbel():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 50)
    table = torch.randn(50, 8)
    probs = to_probs(logits)
    assert torch.allclose(expected_rows(probs, table, top_k=50), probs @ table, atol=1e-6)
    peaked = to_probs(logits * 40)
    assert torch.allclose(expected_rows(peaked, table, top_k=3), peaked @ table, atol=1e-4)
    top1 = expected_rows(probs, table, top_k=1)
    assert torch.allclose(top1, table[probs.argmax(-1)])
    assert torch.allclose(to_probs(logits, temperature=0.5), torch.softmax(logits * 2, -1))
    hard = to_probs(logits.requires_grad_(True), gumbel="hard")
    assert torch.equal(hard.detach().sum(-1), torch.ones(2, 3)) and set(hard.detach().unique().tolist()) <= {0.0, 1.0}
    (hard * torch.randn(50)).sum().backward()
    assert logits.grad.abs().sum() > 0


# --- the whole module ---------------------------------------------------------------------------
@pytest.mark.parametrize("max_mode", ["soft", "hard"])
def test_finite_difference_of_loss_wrt_logits(tiny_bert_dir, max_mode):
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf=True, idf_corpus=["a cat sat", "the dog ran"])
    loss = BERTScoreLoss(scorer=scorer, max_mode=max_mode, temperature=0.5, top_k=None).double()
    torch.manual_seed(0)
    vocab = scorer.encoder.vocab_size
    logits = torch.zeros(2, 3, vocab, dtype=torch.float64)
    ids = torch.tensor([[1037, 4937, 2938], [1996, 3899, 2743]])
    logits.scatter_(2, ids.unsqueeze(-1), 4.0)
    logits += 0.5 * torch.randn_like(logits)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    refs = ["a cat sat", "the dog ran fast"]
    x = logits.clone().requires_grad_(True)
    value = loss(x, refs, mask).loss
    (grad,) = torch.autograd.grad(value, x)
    eps = 1e-6
    for seed in range(3):
        u = torch.randn(logits.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        with torch.no_grad():
            fd = (loss(logits + eps * u, refs, mask).loss - loss(logits - eps * u, refs, mask).loss) / (2 * eps)
        assert (grad * u).sum().item() == pytest.approx(fd.item(), rel=1e-4, abs=1e-7)
    if max_mode == "soft":  # straight-through: the hard value forward, the soft matching gradient backward
        st = BERTScoreLoss(scorer=scorer, max_mode="straight_through", temperature=0.5).double()
        hard = BERTScoreLoss(scorer=scorer, max_mode="hard").double()
        y = logits.clone().requires_grad_(True)
        out = st(y, refs, mask)
        (g_st,) = torch.autograd.grad(out.loss, y)
        # same direction as the soft gradient (F's own derivative is taken at the hard values)
        cos = torch.nn.functional.cosine_similarity(g_st.flatten(), grad.flatten(), dim=0)
        assert cos > 0.99
        assert out.loss.item() == pytest.approx(hard(logits, refs, mask).loss.item(), abs=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("idf", [False, True])
def test_one_hot_hard_equals_evaluation_mode_on_real_pairs(minilm_encoders, idf):
    cands, refs = real_pairs(per_lp=5, n_sts=20)  # 50 pairs: one-hot inputs are [50, T, 30522]
    scorer = BERTScorer(encoder=minilm_encoders(4), idf=idf, idf_corpus=refs if idf else None)
    p, r, f = scorer.score(cands, refs)
    loss = BERTScoreLoss(scorer=scorer, max_mode="hard", inputs="probs", reduction="none")
    ids, mask = content_ids(scorer.encoder, cands)
    onehot = torch.nn.functional.one_hot(ids, scorer.encoder.vocab_size).float()
    for candidates in (ids, onehot):
        with torch.no_grad():
            out = loss(candidates, refs, mask)
        for a, b in ((out.precision, p), (out.recall, r), (out.f1, f)):
            assert (a - b).abs().max().item() <= 1e-5
    assert torch.allclose(out.loss, 1 - f, atol=1e-5)


@pytest.mark.slow
@needs_data
def test_adam_on_free_logits_alone_reaches_095(minilm_encoders):
    """Adam on free logits alone, maximising F against a real STS-B reference, reaches argmax-decoded
    evaluation F >= 0.95 in a bounded number of steps (``optimise_logits`` defaults: 150 steps, 8
    restarts in one batch, the logits starting from the STS-B train unigram prior at scales 1-3).

    From zero logits the same Adam stays below 0.95 (the gradient misranks function words when they are
    absent; docs/loss.md); the prior puts them in the sentence from the first step.
    """
    from bertscore_loss.search import optimise_logits, token_log_prior

    scorer = BERTScorer(encoder=minilm_encoders(4))
    loss = BERTScoreLoss(scorer=scorer)
    reference = stsb("dev", 2)[1][1]  # "A child is riding a horse." (seeds 0-3: 0.966-0.983)
    prior = token_log_prior(scorer.encoder, stsb("train")[0])
    found = optimise_logits(loss, [reference], prior=prior)
    assert found.steps == 150
    text = scorer.encoder.tokenizer.decode(found.ids[0])
    final = scorer.score([text], [reference])[2].item()
    assert final >= 0.95, (text, final)
    assert found.value.item() == pytest.approx(final, abs=1e-5)
    assert found.start.item() < 0.5  # the prior's argmax ("a a a ...") is far from the reference


@pytest.mark.slow
@needs_data
def test_coordinate_search_takes_adam_past_095(minilm_encoders):
    """Where Adam alone stops below 0.95 (zero-init logits, one restart, on "A man wearing a hard hat is
    dancing."), the gradient-guided coordinate search on the exact score takes it past 0.95: the
    frequent tokens of a corpus supply the function words and transpositions fix the order."""
    from bertscore_loss.search import LogitConfig, SearchConfig, coordinate_search, frequent_tokens, optimise_logits

    scorer = BERTScorer(encoder=minilm_encoders(4))
    loss = BERTScoreLoss(scorer=scorer)
    reference = stsb("dev", 1)[1][0]  # "A man wearing a hard hat is dancing."
    adam = optimise_logits(loss, [reference], config=LogitConfig(restarts=1))
    assert adam.value.item() == pytest.approx(0.823, abs=0.03)  # measured 0.8232 ("man man wear hat dancing ...")
    vocabulary = frequent_tokens(scorer.encoder, stsb("train")[0], n=200)
    found = coordinate_search(loss, adam.ids, [reference], vocabulary=vocabulary, config=SearchConfig(steps=100))
    text = scorer.encoder.tokenizer.decode(found.ids[0])
    final = scorer.score([text], [reference])[2].item()
    assert final >= 0.95, (adam.value.item(), final, text)  # measured 0.9800
    assert final >= 0.965  # measured 0.980 (1 thread) and 1.000 (2 threads): the search path depends on float ties
    assert found.start.item() == pytest.approx(adam.value.item(), abs=1e-5)
    assert found.value.item() == pytest.approx(final, abs=1e-5)


def test_frozen_encoder_discipline(tiny_bert_dir):
    class Generator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 30522)
            self.metric = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu")

    gen = Generator()
    enc = gen.metric.encoder
    names = [n for n, _ in gen.named_parameters()]
    assert names == ["head.weight", "head.bias"]  # the encoder never reaches an optimizer
    assert set(gen.state_dict()) == {"head.weight", "head.bias"}  # nor a checkpoint
    gen.train()
    assert not enc.training and not any(m.training for m in enc.model.modules())
    logits = gen.head(torch.randn(2, 3, 4))
    gen.metric(logits, ["a cat", "a dog"]).loss.backward()
    assert all(p.grad is None for p in enc.parameters())
    assert gen.head.weight.grad is not None and gen.head.weight.grad.abs().sum() > 0
    gen.to(torch.float64)
    assert gen.metric.encoder.dtype == torch.float64 and gen.metric.vocab_weight.dtype == torch.float64
    assert enc.dtype == torch.float32  # the registry's shared encoder is not converted under its other users
    gen.load_state_dict(gen.state_dict())  # strict round trip works without encoder keys


def test_bf16_autocast_and_pretokenised_references(tiny_bert_dir):
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none")
    torch.manual_seed(0)
    logits = torch.randn(2, 4, loss.encoder.vocab_size, requires_grad=True)
    refs = ["a cat sat on the mat", "the dog"]
    full = loss(logits, refs)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = loss(logits, refs)
    half.loss.sum().backward()
    assert torch.isfinite(logits.grad).all()
    assert torch.allclose(half.f1.float(), full.f1, atol=3e-2)
    by_ids = loss(logits, loss.encoder.tokenize(refs).ids)
    assert torch.allclose(by_ids.f1, full.f1, atol=1e-6)


def test_reference_cache_skips_re_encoding(tiny_bert_dir):
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu")
    ids = torch.tensor([[1037, 4937]])
    first = loss(ids, ["a cat"]).f1
    calls = []
    handle = loss.encoder.model.register_forward_hook(lambda *a: calls.append(1))
    second = loss(ids, ["a cat"]).f1
    handle.remove()
    assert len(calls) == 1  # the candidate only
    assert torch.equal(first, second)


def test_loss_options_and_bad_input(tiny_bert_dir):
    base = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none")
    ids = torch.tensor([[1037, 4937], [1996, 3899]])
    out = base(ids, ["a cat sat", "the dog"])
    for measure, beta, expect in (("precision", 1.0, out.precision), ("recall", 1.0, out.recall)):
        other = BERTScoreLoss(encoder=base.encoder, measure=measure, beta=beta, reduction="none")
        assert torch.allclose(other(ids, ["a cat sat", "the dog"]).loss, 1 - expect)
    f2 = BERTScoreLoss(encoder=base.encoder, beta=2.0, reduction="sum")(ids, ["a cat sat", "the dog"])
    p, r = out.precision, out.recall
    assert f2.loss.item() == pytest.approx((1 - 5 * p * r / (4 * p + r)).sum().item(), abs=1e-6)
    with pytest.raises(ValueError, match="2 candidates but 1 references"):
        base(ids, ["a"])
    with pytest.raises(ValueError, match="vocab"):
        base(torch.randn(2, 3, 7), ["a", "b"])
    with pytest.raises(ValueError, match="candidate_mask"):
        base(ids, ["a", "b"], torch.ones(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="idf_corpus"):
        BERTScoreLoss(encoder=base.encoder, idf=True)
    with pytest.raises(ValueError, match="max_mode"):
        BERTScoreLoss(encoder=base.encoder, max_mode="median")(ids, ["a", "b"])


def test_mask_excludes_positions_after_eos(tiny_bert_dir):
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none", max_mode="hard")
    short = loss(torch.tensor([[1037, 4937]]), ["a cat sat"]).f1
    padded = loss(torch.tensor([[1037, 4937, 2000, 2000]]), ["a cat sat"], torch.tensor([[1, 1, 0, 0]]).bool()).f1
    assert torch.allclose(short, padded, atol=1e-6)
    cos = cosine_matrix(torch.ones(1, 1, 2), torch.ones(1, 1, 2))
    assert cos.item() == pytest.approx(1.0)
