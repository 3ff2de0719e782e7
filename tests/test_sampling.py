"""rerank.sample_ids against Hugging Face's warpers, greedy search and teacher-forced scores."""

from __future__ import annotations

import pytest
import torch

from rerank import NBestReranker, SamplingConfig, generate_and_rerank, sample_ids
from rerank.generate import sequence_scores
from rerank.sampling import _draw, _epsilon_probs, filter_logits

from .conftest import bundled_path

EOS, PAD, START = 2, 0, 1


@pytest.fixture(scope="module")
def tiny_seq2seq():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(3)
    cfg = BartConfig(
        vocab_size=60,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        pad_token_id=PAD,
        bos_token_id=START,
        eos_token_id=EOS,
        decoder_start_token_id=START,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
    )
    model = BartForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # a peaked, varied distribution: EOS likely enough to end some samples early
        model.lm_head.weight.mul_(8.0)
        model.final_logits_bias[0, EOS] = 3.0
    return model


SOURCES = [[5, 6, 7, 8, EOS], [9, 10, EOS], [11, 12, 13, 14, 15, 16, 17, EOS]]


def padded(sources: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.full((len(sources), max(map(len, sources))), PAD, dtype=torch.long)
    for i, s in enumerate(sources):
        x[i, : len(s)] = torch.tensor(s)
    return x, (x != PAD).long()


def teacher_forced(model, source: list[int], seq: list[int], eos_added: bool) -> float:
    """Mean log-probability of ``seq`` (+ EOS when it ended with one) given ``source``, by one forward pass."""
    target = seq + ([EOS] if eos_added else [])
    dec = torch.tensor([[START, *target[:-1]]])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source]), decoder_input_ids=dec).logits[0]
    logp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(target).unsqueeze(1)).squeeze(1)
    return float(logp.mean())


def test_filter_logits_equals_the_hf_warpers():
    from transformers.generation.logits_process import (
        EpsilonLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    ids = torch.zeros((6, 1), dtype=torch.long)
    for cfg in (
        SamplingConfig(epsilon=0.02),
        SamplingConfig(temperature=0.7, top_k=10),
        SamplingConfig(top_p=0.8),
        SamplingConfig(temperature=1.3, top_k=20, top_p=0.9, epsilon=0.01),
        SamplingConfig(epsilon=0.5),  # only the most likely token survives
    ):
        x = logits.clone()
        if cfg.temperature != 1.0:
            x = TemperatureLogitsWarper(cfg.temperature)(ids, x)
        if cfg.top_k:
            x = TopKLogitsWarper(cfg.top_k)(ids, x)
        if cfg.top_p < 1.0:
            x = TopPLogitsWarper(cfg.top_p)(ids, x)
        if cfg.epsilon:
            x = EpsilonLogitsWarper(cfg.epsilon)(ids, x)
        want = torch.softmax(x, -1)
        got = filter_logits(logits, cfg)
        assert torch.allclose(got / got.sum(-1, keepdim=True), want, atol=1e-6)
    fast, lse = _epsilon_probs(logits, 0.02)
    slow = filter_logits(logits, SamplingConfig(epsilon=0.02))
    assert torch.allclose(fast / fast.sum(-1, keepdim=True), slow / slow.sum(-1, keepdim=True), atol=1e-6)
    assert torch.allclose(lse, torch.logsumexp(logits, -1), atol=1e-5)


def test_draw_follows_the_distribution():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0]]).repeat(20000, 1) * 7.0  # unnormalised on purpose
    tokens = _draw(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=5).double() / len(tokens)
    want = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0], dtype=torch.float64)
    sigma = (want * (1 - want) / len(tokens)).sqrt()
    assert torch.all((freq - want).abs() <= 5 * sigma + 1e-12)
    assert freq[1] == 0 and freq[4] == 0


def test_greedy_equals_hf_generate_and_scores_equal_sequence_scores(tiny_seq2seq):
    model = tiny_seq2seq
    cfg = SamplingConfig(num_samples=2, top_k=1, max_new_tokens=9, token_budget=40, precision="32")
    got = sample_ids(model, SOURCES, cfg)
    x, mask = padded(SOURCES)
    out = model.generate(
        input_ids=x,
        attention_mask=mask,
        do_sample=False,
        num_beams=1,
        max_new_tokens=9,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    want_scores = sequence_scores(model, out, [EOS])
    for i in range(len(SOURCES)):
        seq = out.sequences[i, 1:].tolist()
        seq = seq[: seq.index(EOS)] if EOS in seq else seq
        assert got.sequences[i] == [seq, seq]
        assert got.scores[i] == pytest.approx([float(want_scores[i])] * 2, abs=1e-5)
    assert got.precision == "32"


def test_sampled_scores_are_teacher_forced_log_probabilities(tiny_seq2seq):
    for budget in (30, 10_000):  # many small batches, or one
        cfg = SamplingConfig(num_samples=7, epsilon=0.02, max_new_tokens=8, token_budget=budget, precision="32", seed=1)
        got = sample_ids(tiny_seq2seq, SOURCES, cfg)
        assert [len(x) for x in got.sequences] == [7, 7, 7]
        lengths = {len(q) for qs in got.sequences for q in qs}
        assert 8 in lengths and min(lengths) < 8  # some rows ended early and left the batch, others ran on
        for s, source in enumerate(SOURCES):
            assert len(set(map(tuple, got.sequences[s]))) > 1  # samples, not one sequence
            for seq, score in zip(got.sequences[s], got.scores[s]):
                assert EOS not in seq and PAD not in seq
                ended = len(seq) < 8
                assert score == pytest.approx(teacher_forced(tiny_seq2seq, source, seq, ended), abs=1e-4)
    again = sample_ids(tiny_seq2seq, SOURCES, cfg)
    assert again.sequences == got.sequences  # seeded


def test_generation_config_rules_and_errors(tiny_seq2seq):
    model = tiny_seq2seq
    gen = model.generation_config
    gen.bad_words_ids, gen.min_new_tokens, gen.forced_eos_token_id = [[EOS], [7]], None, None
    try:
        got = sample_ids(model, SOURCES, SamplingConfig(num_samples=5, max_new_tokens=6, precision="32", seed=0))
        assert all(len(q) == 6 and 7 not in q for qs in got.sequences for q in qs)  # EOS banned: full length
        gen.bad_words_ids, gen.forced_eos_token_id = None, EOS
        got = sample_ids(model, SOURCES, SamplingConfig(num_samples=5, max_new_tokens=3, precision="32", seed=0))
        assert all(len(q) <= 2 for qs in got.sequences for q in qs)  # EOS forced at the last step
        gen.forced_eos_token_id, gen.min_new_tokens = None, 4
        got = sample_ids(model, SOURCES, SamplingConfig(num_samples=5, max_new_tokens=9, precision="32", seed=0))
        assert all(len(q) >= 4 for qs in got.sequences for q in qs)
        gen.min_new_tokens, gen.repetition_penalty = None, 1.2
        with pytest.raises(ValueError, match="repetition_penalty=1.2"):
            sample_ids(model, SOURCES)
        gen.repetition_penalty, gen.bad_words_ids = 1.0, [[3, 4]]
        with pytest.raises(ValueError, match="only bans single tokens"):
            sample_ids(model, SOURCES)
    finally:
        gen.bad_words_ids, gen.min_new_tokens, gen.forced_eos_token_id, gen.repetition_penalty = None, None, None, 1.0
    with pytest.raises(ValueError, match=r"sources\[1\] is empty"):
        sample_ids(model, [[5], []])
    with pytest.raises(ValueError, match="epsilon must lie in"):
        SamplingConfig(epsilon=1.0)
    with pytest.raises(ValueError, match="num_samples must be a positive int"):
        SamplingConfig(num_samples=0)


def test_causal_lm_is_refused_and_generate_and_rerank_samples(tiny_scorer):
    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(bundled_path())
    small = GPT2Config(
        vocab_size=30522, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=101, eos_token_id=102
    )
    gpt2 = GPT2LMHeadModel(small).eval()
    with pytest.raises(ValueError, match="encoder-decoder"):
        sample_ids(gpt2, [[5]])
    torch.manual_seed(0)
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=30522,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            max_position_embeddings=64,
            pad_token_id=0,
            bos_token_id=101,
            eos_token_id=102,
            decoder_start_token_id=101,
            forced_bos_token_id=None,
            forced_eos_token_id=None,
        )
    ).eval()
    reranker = NBestReranker(scorer=tiny_scorer)
    cfg = SamplingConfig(num_samples=4, max_new_tokens=5, precision="32", seed=3)
    prompts = ["the cat sat on the mat", "a dog"]
    out = generate_and_rerank(bart, tok, prompts, reranker, sampling=cfg)
    drawn = sample_ids(bart, [tok(p)["input_ids"] for p in prompts], cfg)
    texts = [[t.strip() for t in tok.batch_decode(qs, skip_special_tokens=True)] for qs in drawn.sequences]
    assert out.candidates == texts
    assert [x for xs in out.model_scores for x in xs] == pytest.approx([x for xs in drawn.scores for x in xs], abs=1e-6)
    assert out.texts == [r.best for r in reranker.rerank(texts, model_scores=out.model_scores)]
    with pytest.raises(ValueError, match="generate kwargs"):
        generate_and_rerank(bart, tok, prompts, reranker, sampling=cfg, top_k=5)
    with pytest.raises(ValueError, match="num_return_sequences=3 but sampling.num_samples=4"):
        generate_and_rerank(bart, tok, prompts, reranker, sampling=cfg, num_return_sequences=3)


def test_progress_bar_counts_completed_sources(tiny_seq2seq, monkeypatch, capsys):
    import rerank.sampling as sampling

    bars = []

    class Recording(sampling.tqdm):  # the real bar, with its updates kept
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.updates = []
            bars.append(self)

        def update(self, n=1):
            self.updates.append(n)
            return super().update(n)

    monkeypatch.setattr(sampling, "tqdm", Recording)
    # a budget of a few rows a batch: every source's samples are split over several batches
    cfg = SamplingConfig(num_samples=5, top_k=1, max_new_tokens=9, token_budget=40, precision="32", progress=True)
    got = sample_ids(tiny_seq2seq, SOURCES, cfg)
    assert [len(s) for s in got.sequences] == [5] * len(SOURCES)
    (bar,) = bars
    assert bar.total == len(SOURCES) and sum(bar.updates) == len(SOURCES)  # each source counted once
    assert len(bar.updates) > len(SOURCES) and 0 in bar.updates  # batches that completed no source
    assert "sampling 5 per source" in capsys.readouterr().err
    sample_ids(tiny_seq2seq, SOURCES, SamplingConfig(num_samples=5, top_k=1, max_new_tokens=9, progress=False))
    assert capsys.readouterr().err == ""
