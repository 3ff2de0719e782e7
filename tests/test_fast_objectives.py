"""The fast paths of the training objectives give the values and gradients of the slow paths.

* ``top_k_probs`` / ``expected_top_k`` (the sparse top-k soft inputs of ``BERTScoreLoss``) against the dense
  ``to_probs`` + ``expected_rows``, with and without Gumbel noise (same seed, same noise);
* ``BERTScoreLoss`` on generator logits through a ``VocabBridge`` with the sparse path against the same loss
  forced onto the dense path (loss values and gradients w.r.t. the logits);
* the loss's own reference cache against encoding every call.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from bertscore_loss import BERTScorer, VocabBridge
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.token_distributions import TopK, expected_rows, expected_top_k, to_probs, top_k_probs

REFS = ["A man in a red shirt rides a bicycle.", "Two dogs are playing in snow.", "A woman reads a book."]


@pytest.fixture(scope="module")
def scorer(tiny_bert_dir):
    return BERTScorer(model=tiny_bert_dir, layer=2)


def _torch_gumbel(shape, *, dtype=torch.float32, device=None):
    """The noise F.gumbel_softmax draws (same random numbers for the same seed)."""
    return -torch.empty(shape, dtype=dtype, device=device).exponential_().log()


@pytest.fixture
def same_noise(monkeypatch):
    """The sparse path draws F.gumbel_softmax's noise, so both paths see the same Gumbel sample."""
    import bertscore_loss.token_distributions as td

    monkeypatch.setattr(td, "gumbel_noise", _torch_gumbel)


@pytest.fixture
def fixed_noise(monkeypatch):
    """``fixed_noise(noise [B, T, V], mask [B, T])``: both paths of the loss perturb with this Gumbel noise, the
    dense one (``F.gumbel_softmax``) all of it, the sparse one the rows of its real positions."""
    import bertscore_loss.token_distributions as td

    state: dict = {}

    def sparse(shape, *, dtype=torch.float32, device=None):
        noise = state["noise"]
        return (noise if tuple(shape) == tuple(noise.shape) else noise[state["mask"]]).to(dtype)

    def dense(logits, tau=1.0, hard=False, eps=1e-10, dim=-1):
        assert not hard and logits.shape == state["noise"].shape
        return torch.softmax((logits + state["noise"]) / tau, dim=dim)

    monkeypatch.setattr(td, "gumbel_noise", sparse)
    monkeypatch.setattr(torch.nn.functional, "gumbel_softmax", dense)

    def set_noise(noise: Tensor, mask: Tensor) -> None:
        state.update(noise=noise, mask=mask)

    return set_noise


def test_gumbel_noise_is_standard_gumbel_without_a_grid_in_its_tails():
    import math

    from bertscore_loss.token_distributions import gumbel_noise

    torch.manual_seed(0)
    n = 4_000_000
    g = gumbel_noise((n,)).double()
    assert g.dtype == torch.float64 and torch.isfinite(g).all()
    x, _ = g.sort()
    cdf = torch.exp(-torch.exp(-x))
    ranks = torch.arange(1, n + 1, dtype=torch.float64) / n
    ks = max(float((cdf - ranks).abs().max()), float((cdf - ranks + 1.0 / n).abs().max()))
    assert ks < 1.95 / math.sqrt(n)  # Kolmogorov-Smirnov at the 0.1 % level
    for above in (6.0, 8.0, 10.0):  # the upper tail (it decides a top-k)
        p = 1 - math.exp(-math.exp(-above))
        assert abs(int((g > above).sum()) - n * p) < 5 * math.sqrt(n * p)
    for below in (-2.0, -2.3):
        p = math.exp(-math.exp(-below))
        assert abs(int((g < below).sum()) - n * p) < 5 * math.sqrt(n * p)
    # float32 uniforms alone put the tails on a grid (steps >= 5e-4 above 9, >= 5e-5 below -2.2): here the
    # closest distinct values are far closer than that
    for tail, step in ((g[g > 9.0], 2e-4), (g[g < -2.2], 1e-5)):
        gaps = tail.unique().diff()
        assert tail.numel() > 300 and gaps[gaps > 0].min() < step / 10


def _dense_top_k(logits, k, temperature, gumbel, seed):
    """The slow path: the dense distribution, then the top-k renormalisation of ``expected_rows``."""
    torch.manual_seed(seed)
    probs = to_probs(logits, temperature=temperature, gumbel=gumbel)
    values, ids = probs.topk(k, dim=-1)
    return ids, values / values.sum(dim=-1, keepdim=True), probs.argmax(dim=-1)


@pytest.mark.parametrize("gumbel", [None, "soft"])
@pytest.mark.parametrize("temperature", [1.0, 0.3])
def test_top_k_probs_equal_the_renormalised_dense_distribution(gumbel, temperature, same_noise):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 5, 50, generator=g, dtype=torch.float64) * 2).requires_grad_(True)
    weights = torch.randn(3, 5, 7, dtype=torch.float64, generator=g)
    ids, dense, best = _dense_top_k(logits, 7, temperature, gumbel, seed=11)
    (g_dense,) = torch.autograd.grad((dense * weights).sum(), logits)
    torch.manual_seed(11)
    top = top_k_probs(logits, 7, temperature=temperature, gumbel=gumbel)
    assert torch.equal(top.ids, ids) and torch.equal(top.best, best)
    torch.testing.assert_close(top.probs, dense, atol=1e-12, rtol=1e-10)
    (g_sparse,) = torch.autograd.grad((top.probs * weights).sum(), logits)
    torch.testing.assert_close(g_sparse, g_dense, atol=1e-12, rtol=1e-9)
    assert (g_sparse != 0).sum(-1).max() <= 7  # only the kept tokens get a gradient


def test_expected_top_k_equals_expected_rows_values_and_gradients():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 4, 60, generator=g, dtype=torch.float64, requires_grad=True)
    table = torch.randn(60, 9, generator=g, dtype=torch.float64)
    weight = torch.rand(60, generator=g, dtype=torch.float64)
    probs = torch.softmax(logits, dim=-1)
    probe_e, probe_w = torch.randn(2, 4, 9, dtype=torch.float64), torch.randn(2, 4, dtype=torch.float64)
    slow = (expected_rows(probs, table, 5) * probe_e).sum() + (expected_rows(probs, weight, 5) * probe_w).sum()
    (g_slow,) = torch.autograd.grad(slow, logits)
    top = top_k_probs(logits, 5)
    fast = (expected_top_k(top, table) * probe_e).sum() + (expected_top_k(top, weight) * probe_w).sum()
    (g_fast,) = torch.autograd.grad(fast, logits)
    torch.testing.assert_close(fast, slow, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(g_fast, g_slow, atol=1e-12, rtol=1e-9)
    first = torch.tensor([[1], [0]])
    picked = top.select(first)
    assert isinstance(picked, TopK) and picked.ids.shape == (2, 1, 5)
    assert torch.equal(picked.ids[0, 0], top.ids[0, 1]) and torch.equal(picked.best[:, 0], top.best[[0, 1], [1, 0]])


def test_top_k_probs_masked_positions_never_leak():
    logits = torch.randn(2, 3, 40, requires_grad=True)
    dirty = logits.detach().clone()
    dirty[0, 2] = float("nan")
    dirty[1, 1] = float("inf")
    dirty.requires_grad_(True)
    mask = torch.tensor([[True, True, False], [True, False, True]])
    top = top_k_probs(dirty, 4, gumbel="soft", mask=mask)
    assert torch.isfinite(top.probs).all()
    assert (top.probs[~mask] == 0.25).all() and (top.ids[~mask] == torch.arange(4)).all()
    # a real position's entries do not depend on the masked ones (their noise is not even drawn)
    torch.manual_seed(1)
    alone = top_k_probs(dirty[mask].unsqueeze(0), 4, gumbel="soft")
    torch.manual_seed(1)
    within = top_k_probs(dirty, 4, gumbel="soft", mask=mask)
    assert torch.equal(alone.ids[0], within.ids[mask]) and torch.equal(alone.probs[0], within.probs[mask])
    (grad,) = torch.autograd.grad((top.probs * torch.randn(2, 3, 4)).sum(), dirty)
    assert torch.isfinite(grad).all()
    assert (grad[~mask] == 0).all() and (grad[mask] != 0).any()
    # at a real position NaN / +inf / all -inf logits give NaN probabilities, as the dense softmax does
    for bad in (float("nan"), float("inf")):
        x = logits.detach().clone()
        x[0, 0, 3] = bad
        assert torch.isnan(top_k_probs(x, 4, mask=mask).probs[0, 0]).all()
    x = logits.detach().clone()
    x[0, 1] = float("-inf")
    assert torch.isnan(top_k_probs(x, 4, mask=mask).probs[0, 1]).all()


def _generator_logits(sp, texts, vocab, seed=0, noise=3.0):
    """Logits ``[B, T, V]`` whose argmax spells ``texts`` (+ EOS) in the sentencepiece model, and the mask."""
    g = torch.Generator().manual_seed(seed)
    rows = [sp.encode(t) + [3] for t in texts]
    width = max(map(len, rows)) + 1
    logits = torch.randn(len(rows), width, vocab, generator=g) * noise
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        logits[i, torch.arange(len(r)), torch.tensor(r)] += 12.0
        mask[i, : len(r) - 1] = True  # the words; EOS and padding are masked
    return logits, mask


@pytest.mark.parametrize("mode", ["retokenize", "mean"])
@pytest.mark.parametrize("gumbel", [None, "soft"])
def test_loss_sparse_path_equals_dense_path(scorer, spm_model, monkeypatch, fixed_noise, mode, gumbel):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    bridge = VocabBridge(spm_model, scorer.encoder, mode, vocab_size=sp.get_piece_size())
    loss = BERTScoreLoss(scorer=scorer, bridge=bridge, top_k=16, gumbel=gumbel, temperature=0.1, reduction="none")
    texts = ["A man in a red shirt is riding a bike.", "Two dogs play in the snow!", "A woman is reading."]
    logits, mask = _generator_logits(sp, texts, sp.get_piece_size())
    logits[0, -1] = float("nan")  # a masked position: must not matter on either path
    fixed_noise(_torch_gumbel(logits.shape), mask)
    results = []
    for sparse in (True, False):
        if not sparse:
            monkeypatch.setattr(BERTScoreLoss, "sparse_inputs", lambda self, c: False)
        x = logits.clone().requires_grad_(True)
        torch.manual_seed(5)
        out = loss(x, REFS, mask)
        (grad,) = torch.autograd.grad(out.loss.sum(), x)
        results.append((out, grad))
    (fast, g_fast), (slow, g_slow) = results
    assert loss.sparse_inputs(logits) is False  # the monkeypatch is active for the slow run
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    assert torch.isfinite(g_fast).all() and (g_fast[~mask] == 0).all()
    torch.testing.assert_close(g_fast, g_slow, atol=1e-7, rtol=1e-4)
    assert g_fast.abs().max() > 1e-6  # a real gradient was compared


def test_loss_sparse_path_without_bridge_and_under_autocast(scorer, monkeypatch):
    loss = BERTScoreLoss(scorer=scorer, top_k=8, reduction="none")
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 6, loss.encoder.vocab_size, generator=g) * 3
    refs = REFS[:2]
    outs = {}
    for sparse in (True, False):
        if not sparse:
            monkeypatch.setattr(BERTScoreLoss, "sparse_inputs", lambda self, c: False)
        x = logits.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = loss(x, refs)
        (grad,) = torch.autograd.grad(out.loss.sum(), x)
        outs[sparse] = (out.f1.float(), grad)
    torch.testing.assert_close(outs[True][0], outs[False][0], atol=1e-2, rtol=0)  # bf16 encoder noise
    cos = torch.nn.functional.cosine_similarity(outs[True][1].flatten(), outs[False][1].flatten(), dim=0)
    assert cos > 0.99


def test_loss_sparse_path_refuses_nan_at_a_real_position(scorer):
    loss = BERTScoreLoss(scorer=scorer, top_k=8)
    logits = torch.randn(1, 3, loss.encoder.vocab_size)
    logits[0, 1, 5] = float("nan")
    assert loss.sparse_inputs(logits)
    with pytest.raises(ValueError, match="NaN at a real"):
        loss(logits, REFS[:1])


def test_reference_cache_values_hits_and_autocast_keys(tiny_bert_dir):
    loss = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none")
    plain = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none", ref_cache_bytes=0)
    ids = torch.tensor([[1037, 4937, 2001], [1996, 3899, 0]])
    mask = ids != 0
    refs = ["a cat sat on the mat", "the dog runs"]
    before = len(loss.encoder.cache)
    first = loss(ids, refs, mask).f1
    assert loss.reference_cache.misses == 2 and len(loss.reference_cache) == 2
    assert len(loss.encoder.cache) == before  # the shared encoder cache gets nothing from the loss
    calls = []
    handle = loss.encoder.model.register_forward_hook(lambda *a: calls.append(a[1][0].shape if a[1] else None))
    again = loss(ids, [refs[1], refs[0]], mask).f1
    assert len(calls) == 1 and loss.reference_cache.hits == 2  # the candidates only
    torch.testing.assert_close(first, plain(ids, refs, mask).f1, atol=0, rtol=0)
    torch.testing.assert_close(again, plain(ids, [refs[1], refs[0]], mask).f1, atol=0, rtol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss(ids, refs, mask)
    assert len(loss.reference_cache) == 4  # the autocast encodings are kept apart
    handle.remove()
    by_ids = loss(ids, loss.encoder.tokenize(refs).ids, mask).f1
    torch.testing.assert_close(by_ids, first, atol=1e-6, rtol=0)
    assert len(loss.reference_cache) == 6
    loss.double()  # a dtype change: a private copy of the encoder, and the cache is emptied
    assert len(loss.reference_cache) == 0


def test_distinct_candidates():
    from bertscore_loss.risk import distinct_candidates

    got = distinct_candidates([["a b", "a  b ", "c"], ["x"], []], 3)
    assert got.tolist() == [[True, False, True], [True, False, False], [False, False, False]]
    with pytest.raises(ValueError, match="at most k=2"):
        distinct_candidates([["a", "b", "c"]], 2)


def test_label_log_probs_equals_log_softmax_values_and_gradients():
    from bertscore_loss.risk import label_log_probs

    g = torch.Generator().manual_seed(12)
    hidden = torch.randn(37, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(1, 50, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (37,), generator=g)
    probe = torch.randn(37, generator=g, dtype=torch.float64)
    slow = torch.log_softmax(hidden @ weight.t() + bias, dim=-1).gather(1, labels.unsqueeze(1)).squeeze(1)
    g_slow = torch.autograd.grad((slow * probe).sum(), (hidden, weight, bias))
    fast = label_log_probs(hidden, weight, labels, bias, chunk_rows=8)
    g_fast = torch.autograd.grad((fast * probe).sum(), (hidden, weight, bias))
    torch.testing.assert_close(fast, slow.float(), atol=1e-6, rtol=1e-6)  # the softmax runs in float32
    for a, b in zip(g_fast, g_slow):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    # under bf16 autocast the product runs in bf16, as the output layer's would
    h32, w32 = hidden.detach().float(), weight.detach().float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto = label_log_probs(h32, w32, labels)
        ref = torch.log_softmax(torch.nn.functional.linear(h32, w32).float(), -1).gather(1, labels[:, None])[:, 0]
    torch.testing.assert_close(auto, ref, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="labels must lie"):
        label_log_probs(hidden, weight, labels + 50)


def test_top_k_probs_reads_bf16_logits_as_float32(same_noise):
    logits = (torch.randn(2, 3, 30) * 4).bfloat16()
    for gumbel in (None, "soft"):
        torch.manual_seed(9)
        a = top_k_probs(logits, 5, gumbel=gumbel, temperature=0.5)
        torch.manual_seed(9)
        b = top_k_probs(logits.float(), 5, gumbel=gumbel, temperature=0.5)
        assert a.probs.dtype == torch.float32
        assert torch.equal(a.ids, b.ids) and torch.equal(a.best, b.best) and torch.equal(a.probs, b.probs)


def test_math_attention_kernel_under_bf16_autocast_agrees_with_the_default(scorer, monkeypatch):
    """The loss's encoder pass with gradient under bf16 autocast uses SDPA's math kernel; the values and the
    gradient agree with the default kernel's to bf16 rounding, and fp32 passes are left alone."""
    import contextlib

    import bertscore_loss.loss as loss_mod

    loss = BERTScoreLoss(scorer=scorer, top_k=8, reduction="none")
    g = torch.Generator().manual_seed(6)
    logits = torch.randn(3, 7, loss.encoder.vocab_size, generator=g) * 3
    framed = torch.zeros(2, 3, 4, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not isinstance(loss_mod.attention_kernel(framed), contextlib.nullcontext)
        with torch.no_grad():
            assert isinstance(loss_mod.attention_kernel(framed), contextlib.nullcontext)
    assert isinstance(loss_mod.attention_kernel(framed), contextlib.nullcontext)
    runs = []
    for kernel in ("math", "default"):
        if kernel == "default":
            monkeypatch.setattr(loss_mod, "attention_kernel", lambda x: contextlib.nullcontext())
        x = logits.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = loss(x, REFS, torch.ones(3, 7, dtype=torch.bool))
        (grad,) = torch.autograd.grad(out.loss.sum(), x)
        runs.append((out.f1.float(), grad))
    torch.testing.assert_close(runs[0][0], runs[1][0], atol=2e-2, rtol=0)
    cos = torch.nn.functional.cosine_similarity(runs[0][1].flatten(), runs[1][1].flatten(), dim=0)
    assert cos > 0.98


@pytest.mark.slow
@pytest.mark.parametrize("gumbel", [None, "soft"])
def test_loss_sparse_path_equals_dense_path_with_the_real_minilm(
    spm_model, minilm_encoders, monkeypatch, fixed_noise, gumbel
):
    """The recipe's settings (retokenize bridge, straight-through max at 0.05, top-64) on the bundled MiniLM:
    the sparse path gives the dense path's P, R, F and logit gradient (fp32)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    encoder = minilm_encoders(4)
    bridge = VocabBridge(spm_model, encoder, "retokenize", vocab_size=sp.get_piece_size())
    loss = BERTScoreLoss(encoder=encoder, bridge=bridge, top_k=64, gumbel=gumbel, temperature=0.05, reduction="none")
    texts = ["A man in a red shirt is riding a bike.", "Two dogs play in the snow!", "A woman is reading."]
    logits, mask = _generator_logits(sp, texts, sp.get_piece_size(), seed=1)
    fixed_noise(_torch_gumbel(logits.shape), mask)
    runs = []
    for sparse in (True, False):
        if not sparse:
            monkeypatch.setattr(BERTScoreLoss, "sparse_inputs", lambda self, c: False)
        x = logits.clone().requires_grad_(True)
        torch.manual_seed(2)
        out = loss(x, REFS, mask)
        (grad,) = torch.autograd.grad(out.loss.sum(), x)
        runs.append((out, grad))
    (fast, g_fast), (slow, g_slow) = runs
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(g_fast, g_slow, atol=1e-7, rtol=1e-4)
    assert g_fast.abs().max() > 1e-5
