"""bertscore_loss.integrations.trl: reward callables, as TRL calls them and inside a real GRPOTrainer run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.integrations import BERTScoreReward, MBRConsensusReward, completion_text

ROOT = Path(__file__).resolve().parents[1]
CANDS = (ROOT / "examples" / "data" / "cands.txt").read_text(encoding="utf-8").splitlines()
REFS = (ROOT / "examples" / "data" / "refs.txt").read_text(encoding="utf-8").splitlines()


def fresh_scorer(model_dir: str) -> BERTScorer:
    """A scorer on its own encoder (a scorer built from fields may share a loaded encoder and its cache)."""
    return BERTScorer(encoder=FrozenEncoder(model_dir, 2, device="cpu"))


@pytest.fixture
def scorer(tiny_bert_dir) -> BERTScorer:
    return fresh_scorer(tiny_bert_dir)


@pytest.fixture(scope="module")
def oracle(tiny_bert_dir) -> BERTScorer:
    """A separate, cache-less scorer: the value the rewards must reproduce."""
    return fresh_scorer(tiny_bert_dir)


def trl_kwargs(**columns):
    """The extra keyword arguments GRPOTrainer passes beside the dataset columns."""
    return dict(
        completion_ids=None, trainer_state=None, log_extra=lambda *a, **k: None, log_metric=lambda *a: None, **columns
    )


def test_reward_equals_scorer_score_plain_multi_and_conversational(scorer, oracle):
    reward = BERTScoreReward("reference", scorer)
    prompts = [f"Paraphrase: {s}" for s in REFS[:6]]
    got = reward(prompts=prompts, completions=CANDS[:6], **trl_kwargs(reference=REFS[:6]))
    assert torch.allclose(torch.tensor(got), oracle.score(CANDS[:6], REFS[:6])[2], atol=1e-6, rtol=0)

    multi = [[REFS[i], REFS[i + 1]] for i in range(6)]  # several references per prompt: max per measure
    got = reward(prompts=prompts, completions=CANDS[:6], **trl_kwargs(reference=multi))
    assert torch.allclose(torch.tensor(got), oracle.score(CANDS[:6], multi)[2], atol=1e-6, rtol=0)

    chats = [[{"role": "assistant", "content": c}] for c in CANDS[:6]]
    conv_prompts = [[{"role": "user", "content": p}] for p in prompts]
    got_chat = reward(prompts=conv_prompts, completions=chats, **trl_kwargs(reference=REFS[:6]))
    assert torch.allclose(torch.tensor(got_chat), oracle.score(CANDS[:6], REFS[:6])[2], atol=1e-6, rtol=0)

    recall = BERTScoreReward("reference", scorer, measure="recall")
    got = recall(prompts=prompts, completions=CANDS[:6], **trl_kwargs(reference=REFS[:6]))
    assert torch.allclose(torch.tensor(got), oracle.score(CANDS[:6], REFS[:6])[1], atol=1e-6, rtol=0)


def test_completion_text_keeps_the_assistant_text():
    msgs = [
        {"role": "assistant", "content": "first"},
        {"role": "tool", "content": "ignored"},
        {"role": "assistant", "content": [{"type": "text", "text": "second"}, {"type": "image"}]},
    ]
    assert completion_text(msgs) == "first\nsecond"
    assert completion_text("  plain  ") == "plain"
    assert completion_text([{"role": "assistant", "content": ""}]) == ""


def test_empty_completions_score_zero_with_a_warning(scorer, oracle, caplog):
    reward = BERTScoreReward("reference", scorer)
    comps = [CANDS[0], "", "   ", [{"role": "assistant", "content": ""}], CANDS[4]]
    with caplog.at_level(logging.WARNING, logger="bertscore_loss.integrations.trl"):
        got = reward(prompts=["p"] * 5, completions=comps, **trl_kwargs(reference=REFS[:5]))
    assert got[1:4] == [0.0, 0.0, 0.0]
    assert "3 empty completion(s)" in caplog.text
    want = oracle.score([CANDS[0], CANDS[4]], [REFS[0], REFS[4]])[2]
    assert got[0] == pytest.approx(float(want[0]), abs=1e-6) and got[4] == pytest.approx(float(want[1]), abs=1e-6)


def test_one_engine_call_per_batch_and_cached_references(scorer, monkeypatch):
    reward = BERTScoreReward("reference", scorer)
    encoded: list[tuple[int, ...]] = []
    real = scorer.encoder.embed_ids

    def spy(ids, **kw):
        encoded.extend(tuple(r) for r in ids)
        return real(ids, **kw)

    monkeypatch.setattr(scorer.encoder, "embed_ids", spy)
    refs = [r for r in REFS[:4] for _ in range(2)]  # 4 prompts x 2 generations
    reward(prompts=refs, completions=CANDS[:8], **trl_kwargs(reference=refs))
    assert reward.calls == 1
    ref_rows = {tuple(r) for r in scorer.encoder.tokenize(REFS[:4]).ids}
    assert ref_rows <= set(encoded)
    encoded.clear()
    reward(prompts=refs, completions=CANDS[8:16], **trl_kwargs(reference=refs))  # next step, same prompts
    assert reward.calls == 2 and not ref_rows & set(encoded)
    assert len(encoded) == len(set(CANDS[8:16]) - set(REFS[:4]))


def test_rescaled_reward(tmp_path, tiny_bert_dir, oracle):
    baseline = tmp_path / "tiny.tsv"
    baseline.write_text("LAYER,P,R,F\n2,0.6,0.55,0.58\n", encoding="utf-8")
    reward = BERTScoreReward(
        "reference", model=tiny_bert_dir, layer=2, device="cpu", rescale=True, baseline=str(baseline)
    )
    got = reward(prompts=["p"] * 4, completions=CANDS[:4], **trl_kwargs(reference=REFS[:4]))
    raw = oracle.score(CANDS[:4], REFS[:4])[2]
    assert torch.allclose(torch.tensor(got), (raw - 0.58) / (1 - 0.58), atol=1e-6, rtol=0)


def test_missing_reference_column_names_the_columns(scorer):
    with pytest.raises(KeyError, match="'answer'"):
        BERTScoreReward("answer", scorer)(prompts=["p"], completions=["c"], **trl_kwargs(reference=["r"]))


def mbr_oracle(oracle: BERTScorer, groups: list[list[str]]) -> list[float]:
    out = []
    for g in groups:
        for i, c in enumerate(g):
            others = [o for j, o in enumerate(g) if j != i and o]
            out.append(float(oracle.score([c] * len(others), others)[2].mean()) if c and others else 0.0)
    return out


def test_mbr_consensus_groups_by_prompt_or_num_generations(scorer, oracle):
    groups = [CANDS[0:3], CANDS[3:6]]
    prompts = ["a"] * 3 + ["b"] * 3
    comps = [c for g in groups for c in g]
    want = mbr_oracle(oracle, groups)
    by_prompt = MBRConsensusReward(scorer)
    got = by_prompt(prompts=prompts, completions=comps, **trl_kwargs())
    assert by_prompt.calls == 1
    assert torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-6, rtol=0)
    by_g = MBRConsensusReward(scorer, num_generations=3)(prompts=["same"] * 6, completions=comps, **trl_kwargs())
    assert torch.allclose(torch.tensor(by_g), torch.tensor(want), atol=1e-6, rtol=0)
    # an empty member gets 0 and is no one's reference
    comps[1] = ""
    got = MBRConsensusReward(scorer)(prompts=prompts, completions=comps, **trl_kwargs())
    want = mbr_oracle(oracle, [[comps[0], "", comps[2]], groups[1]])
    assert got[1] == 0.0 and torch.allclose(torch.tensor(got), torch.tensor(want), atol=1e-6, rtol=0)


@pytest.mark.slow
def test_grpo_trainer_two_steps_with_both_rewards(tmp_path, tiny_roberta_dir, tiny_bert_dir):
    """A real GRPOTrainer run (2 steps, tiny random causal LM) with the reference and the MBR rewards."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from .conftest import tiny_causal_lm

    tok = AutoTokenizer.from_pretrained(tiny_roberta_dir)
    model = tiny_causal_lm(tok, 512)
    ds = Dataset.from_dict({"prompt": [" ".join(c.split()[:6]) for c in CANDS[:4]], "reference": REFS[:4]})
    scorer = fresh_scorer(tiny_bert_dir)
    reward = BERTScoreReward("reference", scorer)
    mbr = MBRConsensusReward(scorer, num_generations=2)
    seen = []

    def spy(prompts, completions, **columns):
        seen.append((len(prompts), sorted(k for k in columns if k in ("reference", "trainer_state"))))
        return reward(prompts, completions, **columns)

    spy.__name__ = "bertscore"
    args = trl.GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-3,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[spy, mbr], args=args, train_dataset=ds, processing_class=tok)
    trainer.train()
    assert seen and all(n == 4 and cols == ["reference", "trainer_state"] for n, cols in seen)
    assert reward.calls == len(seen) and mbr.calls >= 1
    logs = [h for h in trainer.state.log_history if "rewards/bertscore/mean" in h]
    assert len(logs) == 2 and all(0.0 <= h["rewards/bertscore/mean"] <= 1.0 for h in logs)
    assert all("rewards/bertscore_mbr/mean" in h for h in logs)
