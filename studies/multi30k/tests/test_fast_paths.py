"""The study's fast training paths give the values and gradients of the slow ones (tiny Marian, no dropout).

* ``nmt.ce_pass`` against the model called with ``labels``;
* ``nmt.candidate_log_probs`` (the minimum-risk arm's samples scored from the CE pass's encoder states)
  against the full model and against the library's :func:`bertscore_loss.risk.target_log_probs`;
* the whole ``mrt`` training step with the shared encoder against the step on the full model, and the
  seeded subset of sources that gets the semantic term;
* ``nmt.draw_tokens`` / ``FineTuner.sample``: inverse-CDF draws from the model's conditional distributions.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch import Tensor

from bertscore_loss import BERTScorer

REFS = ["A man in a red shirt rides a bicycle.", "Two dogs are playing in snow.", "A woman reads a book."]


@pytest.fixture(scope="module")
def scorer(tiny_bert_dir):
    return BERTScorer(model=tiny_bert_dir, layer=2)


def _nmt():
    folder = Path(__file__).resolve().parents[1]
    if "nmt" not in sys.modules:
        sys.path.insert(0, str(folder))
        spec = importlib.util.spec_from_file_location("nmt", folder / "nmt.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["nmt"] = module
        spec.loader.exec_module(module)
    return sys.modules["nmt"]


SOURCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]
SAMPLES = [  # k = 4 per source: repeats, and a row whose samples are all one text (no gradient)
    ["A man rides a bike.", "A man is riding a bike.", "A man rides a bike.", "A person cycles."],
    ["Two dogs play in snow.", "Two dogs play in snow.", "Two dogs play in snow.", "Two dogs play in snow."],
    ["A woman reads.", "A woman is reading a book.", "A lady reads.", "A woman reads."],
]


@pytest.fixture(scope="module")
def marian(spm_model):
    """A tiny Marian generator (no dropout: the fast and slow paths see the same function) and its batch."""
    import sentencepiece as spm

    nmt = _nmt()
    sp = spm.SentencePieceProcessor(model_file=spm_model)
    torch.manual_seed(0)
    cfg = nmt.ModelConfig(d_model=16, layers=2, heads=2, ffn=32, dropout=0.0, attention_dropout=0.0)
    model = nmt.build_model(cfg, sp.get_piece_size())
    src = nmt.pad([ids + [nmt.EOS] for ids in sp.encode(SOURCES)])
    tgt = nmt.pad([ids + [nmt.EOS] for ids in sp.encode(REFS)], -100)
    batch = {"index": torch.arange(3), "input_ids": src, "attention_mask": src != nmt.PAD, "labels": tgt}
    labels = nmt.pad([ids + [nmt.EOS] for row in SAMPLES for ids in sp.encode(row)], -100)
    return nmt, sp, model, batch, labels


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_ce_pass_equals_the_model_called_with_labels(marian):
    nmt, _, model, batch, _ = marian
    model.zero_grad()
    ce, logits, encoded = nmt.ce_pass(model, batch, 0.1)
    ce.backward()
    fast = _grads(model)
    model.zero_grad()
    full = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    slow = nmt.label_smoothed_ce(full.logits, batch["labels"], 0.1)
    slow.backward()
    torch.testing.assert_close(ce, slow, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits, full.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(encoded.last_hidden_state, full.encoder_last_hidden_state, atol=1e-6, rtol=0)
    for name, g in _grads(model).items():
        torch.testing.assert_close(fast[name], g, atol=1e-6, rtol=1e-4, msg=name)


def test_candidate_log_probs_equal_the_full_model_values_and_gradients(marian):
    from bertscore_loss import sequence_log_probs

    nmt, _, model, batch, labels = marian
    k = 4
    weights = torch.randn(labels.shape[0])
    model.zero_grad()
    src = batch["input_ids"].repeat_interleave(k, 0)
    full = model(input_ids=src, attention_mask=src != nmt.PAD, labels=labels).logits
    slow = sequence_log_probs(full, labels)
    (slow * weights).sum().backward()
    g_slow = _grads(model)
    model.zero_grad()
    states = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    sources = torch.arange(labels.shape[0]) // k
    fast = nmt.candidate_log_probs(model, states.last_hidden_state, batch["attention_mask"], sources, labels)
    (fast * weights).sum().backward()
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-6)
    g_fast = _grads(model)
    assert g_fast.keys() == g_slow.keys() and any("encoder" in n for n in g_fast)
    for name, g in g_slow.items():
        torch.testing.assert_close(g_fast[name], g, atol=1e-6, rtol=1e-4, msg=name)
    # groups of a few rows each (sorted by length, each cut to its longest row): the same values
    small = nmt.candidate_log_probs(
        model, states.last_hidden_state, batch["attention_mask"], sources, labels, budget=20
    )
    torch.testing.assert_close(small.detach(), slow.detach(), atol=1e-5, rtol=1e-6)
    # a subset of the candidates (what sample_log_probs asks for) gives the same values for them
    some = torch.tensor([0, 5, 11])
    sub = nmt.candidate_log_probs(model, states.last_hidden_state, batch["attention_mask"], some // k, labels[some])
    torch.testing.assert_close(sub.detach(), slow.detach()[some], atol=1e-5, rtol=1e-6)


def test_mrt_step_with_the_shared_encoder_equals_the_full_model_step(marian, scorer, monkeypatch):
    """The whole training step (CE + λ·risk): loss and every parameter's gradient, fast vs slow path."""
    from bertscore_loss import MinimumRiskLoss

    nmt, sp, model, batch, labels = marian
    val = nmt.PairData(sp, SOURCES, REFS, 32)
    module = nmt.FineTuner(
        model,
        sp,
        nmt.TrainConfig(),
        val,
        "32-true",
        "mrt",
        risk=MinimumRiskLoss(scorer=scorer, alpha=0.5),
        weight=3.0,
        samples=4,
    )
    module.train_targets = REFS
    src = batch["input_ids"].repeat_interleave(4, 0)
    monkeypatch.setattr(module, "sample", lambda b: (labels, SAMPLES, src))
    monkeypatch.setattr(module, "log", lambda *a, **k: None)
    results = []
    for shared in (True, False):
        module.shared_encoder = shared
        model.zero_grad()
        loss = module.training_step(batch, 0)
        loss.backward()
        results.append((loss.detach(), _grads(model)))
    (l_fast, g_fast), (l_slow, g_slow) = results
    torch.testing.assert_close(l_fast, l_slow, atol=1e-6, rtol=0)
    assert g_fast.keys() == g_slow.keys()
    for name, g in g_slow.items():
        torch.testing.assert_close(g_fast[name], g, atol=1e-6, rtol=1e-4, msg=name)
    # the risk's share of the gradient is not negligible in this comparison
    model.zero_grad()
    nmt.ce_pass(model, batch, module.cfg.label_smoothing)[0].backward()
    ce_only = _grads(model)
    assert max((g_slow[n] - ce_only[n]).abs().max() for n in g_slow) > 1e-4


def test_semantic_rows_put_the_risk_on_a_seeded_subset_and_ce_on_every_source(marian, scorer, monkeypatch):
    """semantic_rows = 2 of 3: loss = CE(all 3) + λ·risk(the 2 chosen sources), the same value as the step on
    a batch of those 2 sources with CE swapped for the full batch's; the subset depends on (seed, update) only."""
    from bertscore_loss import MinimumRiskLoss

    nmt, sp, model, batch, labels = marian
    module = nmt.FineTuner(
        model,
        sp,
        nmt.TrainConfig(),
        nmt.PairData(sp, SOURCES, REFS, 32),
        "32-true",
        "mrt",
        risk=MinimumRiskLoss(scorer=scorer, alpha=0.5),
        weight=3.0,
        samples=4,
    )
    module.train_targets = REFS
    per_source = labels.view(3, 4, -1)

    def sample(b):
        idx = b["index"].tolist()
        return per_source[idx].reshape(4 * len(idx), -1), [SAMPLES[i] for i in idx], None

    monkeypatch.setattr(module, "sample", sample)
    monkeypatch.setattr(module, "log", lambda *a, **k: None)
    module.semantic_rows, module.row_seed = 2, 7
    rows = module.semantic_subset(3)
    assert rows is not None and len(rows) == 2 and rows.tolist() == sorted(set(rows.tolist()))
    assert torch.equal(module.semantic_subset(3), rows)  # seeded: a resumed run picks the same sources
    assert module.semantic_subset(2) is None  # no more rows asked than the batch has
    module.eval()  # the tiny Marian has no dropout; eval keeps the comparison exact anyway
    loss = module.training_step(batch, 0)
    ce_all = nmt.ce_pass(model, batch, module.cfg.label_smoothing)[0]
    sub = {key: value[rows] for key, value in batch.items()}
    module.semantic_rows = None
    only_sub = module.training_step(sub, 0) - nmt.ce_pass(model, sub, module.cfg.label_smoothing)[0]
    assert abs(float(only_sub.detach())) > 1e-4  # the risk term is not zero here
    torch.testing.assert_close(loss, ce_all + only_sub, atol=1e-6, rtol=0)
    module.semantic_rows = 2
    picks = set()
    for step in range(12):
        monkeypatch.setattr(type(module), "global_step", property(lambda self, s=step: s))
        picks.add(tuple(module.semantic_subset(3).tolist()))
    assert len(picks) > 1  # another update, another subset
    module.arm = "ce"
    assert module.semantic_subset(3) is None


def test_draw_tokens_is_inverse_cdf_sampling_of_the_softmax():
    nmt = _nmt()
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(6, 300, generator=g) * 2
    logits[:, 10:40] = float("-inf")
    logits[1, 290] = 9.0  # mass in the last, partial block
    torch.manual_seed(4)
    got = nmt.draw_tokens(logits, block=128)
    torch.manual_seed(4)  # the same uniform numbers: the pick is the first token whose CDF exceeds u
    u = torch.rand(6, 1, dtype=torch.float64)
    w = torch.exp(logits - logits.max(dim=-1, keepdim=True).values).double()
    cdf = w.cumsum(-1)
    expected = [int((cdf[i] > u[i] * cdf[i, -1]).nonzero()[0]) for i in range(6)]
    assert got.tolist() == expected
    n = 200_000
    probs = torch.softmax(logits[1].double(), dim=-1)
    picks = nmt.draw_tokens(logits[1:2].expand(n, 300), block=128)
    freq = torch.bincount(picks, minlength=300).double() / n
    assert freq[10:40].sum() == 0  # probability 0 is never drawn
    assert ((freq - probs).abs() <= 5 * (probs * (1 - probs) / n).sqrt() + 1e-6).all()


@pytest.mark.parametrize("compact", [0.0, 0.125, 0.5])
def test_sample_draws_from_the_models_conditional_distributions(marian, monkeypatch, compact):
    """Every step of FineTuner.sample (the encoder once, its states repeated k times, finished rows leaving the
    batch once they are a ``compact`` share of it) drew from the logits the model gives the sampled prefix,
    teacher-forced from the sources, and returned the token it drew."""
    import functools

    nmt, sp, model, batch, _ = marian
    val = nmt.PairData(sp, SOURCES, REFS, 32)
    module = nmt.FineTuner(model, sp, nmt.TrainConfig(), val, "32-true", "mrt", samples=4)
    seen: list[tuple[Tensor, Tensor]] = []
    draw = nmt.draw_tokens

    def recording(logits, block=None):
        out = draw(logits, block)
        seen.append((logits.clone(), out))
        return out

    monkeypatch.setattr(nmt, "draw_tokens", recording)
    monkeypatch.setattr(nmt, "sample_sequences", functools.partial(nmt.sample_sequences, compact=compact))
    torch.manual_seed(3)
    labels, texts, src = module.sample(batch)
    assert model.training and len(texts) == 3 and all(len(row) == 4 for row in texts)
    assert torch.equal(src, batch["input_ids"].repeat_interleave(4, 0))
    model.eval()
    with torch.no_grad():
        forced = model(input_ids=src, attention_mask=src != nmt.PAD, labels=labels).logits
    model.train()
    rows = torch.arange(labels.shape[0])  # the batch rows of each step, as sample_sequences keeps them
    done = torch.zeros(labels.shape[0], dtype=torch.bool)
    assert len(seen) == labels.shape[1]
    for t, (logits, pick) in enumerate(seen):
        assert len(pick) == len(rows)
        live = ~done
        assert (labels[rows[live], t] != -100).all() and (labels[rows[done], t] == -100).all()
        torch.testing.assert_close(logits[live], forced[rows[live], t], atol=1e-5, rtol=1e-5)
        assert torch.equal(pick[live], labels[rows[live], t])
        done = done | (labels[rows, t] == nmt.EOS)
        if done.float().mean() >= compact:
            rows, done = rows[~done], done[~done]
    assert texts[0][0] == sp.decode([t for t in labels[0].tolist() if t > nmt.EOS])
    if compact == 0.0:
        module.sampler = "generate"  # the Hugging Face path still runs
        labels2, texts2, _ = module.sample(batch)
        assert len(texts2) == 3 and labels2.shape[0] == 12


def test_candidate_log_probs_equal_the_librarys_target_log_probs(marian):
    """The shared-encoder pass (encoder states given) and the library's routine (it encodes the sources
    itself) give the same values and gradients when no dropout differs between them."""
    from bertscore_loss.risk import target_log_probs

    nmt, _, model, batch, labels = marian
    k = 4
    weights = torch.randn(labels.shape[0])
    sources = [row[mask].tolist() for row, mask in zip(batch["input_ids"], batch["attention_mask"])]
    targets = [row[row != -100].tolist() for row in labels]
    model.zero_grad()
    ours = target_log_probs(model, sources, targets, [i // k for i in range(len(targets))])
    (ours * weights).sum().backward()
    g_ours = _grads(model)
    model.zero_grad()
    states = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    owners = torch.arange(labels.shape[0]) // k
    study = nmt.candidate_log_probs(model, states.last_hidden_state, batch["attention_mask"], owners, labels)
    (study * weights).sum().backward()
    torch.testing.assert_close(study, ours, atol=1e-5, rtol=1e-6)
    g_study = _grads(model)
    assert g_study.keys() == g_ours.keys()
    for name, g in g_ours.items():
        torch.testing.assert_close(g_study[name], g, atol=1e-6, rtol=1e-4, msg=name)
