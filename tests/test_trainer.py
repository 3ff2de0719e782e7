"""``rerank.MBRTrainer`` and its primitives: the log-probability routine against teacher-forced models and
finite differences, pair reading and selection against the study's rule, the loss against ``PreferenceLoss``
by hand and against TRL's ``DPOTrainer``, minimum risk by hand, gradient accumulation, resumption, and 20
steps on the committed Marian model."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from bertscore_loss import MinimumRiskLoss, PreferenceLoss, sequence_log_probs
from bertscore_loss.risk import target_log_probs
from rerank import MBRTrainer, MBRTrainingConfig, read_mbr_examples, select_pairs
from rerank.preference_data import MBRExample, PreferencePair, check_reference_model, fill_reference_log_probs
from rerank.trainer import MBRDataset
from rerank.training_data import MBRDataConfig, build_mbr_data, pair_rows, read_mbr_data

from .conftest import tiny_bart, tiny_causal_lm
from .test_training_data import SOURCES, WORDS, WordCodec, overlap, tiny_bart_model

ROOT = Path(__file__).resolve().parents[1]
DATA = MBRDataConfig(num_samples=6, beams=2, shard_size=4, seed=3, precision="32", utility="chrf")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("mbr")
    build_mbr_data(tiny_bart_model(), WordCodec(), SOURCES, out, DATA, utility=overlap, progress=False)
    return out


def config(tmp_path, **kw) -> MBRTrainingConfig:
    settings = {
        "output_dir": str(tmp_path / "out"),
        "per_device_train_batch_size": 2,
        "use_cpu": True,
        "report_to": [],
        "save_strategy": "no",
        "disable_tqdm": True,
        "learning_rate": 1e-2,
        "seed": 0,
        **kw,
    }
    return MBRTrainingConfig(**settings)


def marian(seed: int = 0):
    from transformers import MarianConfig, MarianMTModel

    torch.manual_seed(seed)
    cfg = MarianConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = MarianMTModel(cfg).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
    return model


def t5():
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=40,
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(cfg).eval()


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=40, n_embd=16, n_layer=1, n_head=2, n_positions=64, pad_token_id=0, eos_token_id=1, bos_token_id=1
    )
    return GPT2LMHeadModel(cfg).eval()


SRC = [[5, 6, 7, 1], [8, 9, 1]]
TGT = [[3, 4, 1], [5, 1], [7, 8, 9, 10, 11, 1], [2, 1]]
OWN = [0, 0, 1, 1]


def one_by_one(model, src, tgt, own):
    """The oracle: the whole model on one (source, target) at a time."""
    out = []
    for t, o in zip(tgt, own):
        if model.config.is_encoder_decoder:
            labels = torch.tensor([t])
            logits = model(input_ids=torch.tensor([src[o]]), labels=labels).logits
            out.append(sequence_log_probs(logits, labels))
        else:
            logits = model(torch.tensor([src[o] + t])).logits.log_softmax(-1)[0]
            out.append(sum(logits[len(src[o]) - 1 + k, t[k]] for k in range(len(t))).reshape(1))
    return torch.cat(out)


# ---- the log-probability routine ----------------------------------------------------------------------


@pytest.mark.parametrize("make", [marian, t5, gpt2], ids=["marian-lean", "t5-logits", "gpt2-causal"])
def test_target_log_probs_equal_the_whole_model_one_pair_at_a_time(make):
    model = make()
    want = one_by_one(model, SRC, TGT, OWN)
    for budget in (4, 8, 10_000):  # one target a group, several, all at once
        got = target_log_probs(model, SRC, TGT, OWN, token_budget=budget)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    assert not target_log_probs(model, SRC, TGT, OWN, grad=False).requires_grad


@pytest.mark.parametrize(
    ("make", "h"), [(marian, 1e-3), (t5, 1e-4), (gpt2, 1e-4)], ids=["marian-lean", "t5-logits", "gpt2-causal"]
)
def test_target_log_probs_gradient_equals_finite_differences(make, h):
    """The directional derivative along a random direction in weight space, by central differences in float64
    (``h``: where each random model is still linear enough; the values are float32)."""
    model = make().double()
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(1)
    direction = [torch.randn(p.shape, generator=gen, dtype=torch.float64) for p in params]
    for p, d in zip(params, direction):
        if p.dim() == 2 and p.shape[0] == model.config.vocab_size:
            d[0] = 0.0  # the padding row (= the decoder start token here): nn.Embedding gives it no gradient
    weights = torch.tensor([0.3, -1.0, 0.7, 0.5], dtype=torch.float64)

    def value() -> torch.Tensor:
        return (target_log_probs(model, SRC, TGT, OWN, token_budget=8).double() * weights).sum()

    model.zero_grad()
    value().backward()
    analytic = sum(float((p.grad * d).sum()) for p, d in zip(params, direction) if p.grad is not None)
    with torch.no_grad():
        for p, d in zip(params, direction):
            p.add_(h * d)
        up = float(value())
        for p, d in zip(params, direction):
            p.sub_(2 * h * d)
        down = float(value())
        for p, d in zip(params, direction):
            p.add_(h * d)
    numeric = (up - down) / (2 * h)
    assert abs(analytic) > 1e-2
    assert numeric == pytest.approx(analytic, rel=5e-3, abs=2e-3)


def test_target_log_probs_bad_input_is_a_clear_error():
    model = marian()
    with pytest.raises(ValueError, match=r"targets\[1\] must be a non-empty"):
        target_log_probs(model, SRC, [[3, 1], []], [0, 1])
    with pytest.raises(ValueError, match="owners must lie in"):
        target_log_probs(model, SRC, TGT, [0, 0, 1, 2])
    with pytest.raises(ValueError, match="outside"):
        target_log_probs(model, SRC, [[3, 99]], [0])
    with pytest.raises(ValueError, match="token_budget"):
        target_log_probs(model, SRC, TGT, OWN, token_budget=0)


@pytest.mark.parametrize("make", [marian, t5], ids=["marian-lean", "t5-logits"])
def test_target_log_probs_from_encoder_states_made_already(make):
    """``encoder_states``: the same values from the states of an encoder pass made elsewhere (padded sources, in
    another order), and the gradient of the log-probabilities reaches those states: it equals the gradient
    through the encoder's own pass."""
    model = make()
    order = [1, 0]  # the states' rows: source 1 first
    src = torch.zeros(2, 4, dtype=torch.long)
    for k, s in enumerate(order):
        src[k, : len(SRC[s])] = torch.tensor(SRC[s])
    mask = (torch.arange(4) < torch.tensor([[len(SRC[s])] for s in order])).long()
    states = model.get_encoder()(input_ids=src, attention_mask=mask).last_hidden_state.detach().requires_grad_()
    owners = [order.index(o) for o in OWN]
    got = target_log_probs(model, None, TGT, owners, token_budget=8, encoder_states=(states, mask))
    torch.testing.assert_close(got, one_by_one(model, SRC, TGT, OWN), atol=2e-5, rtol=0)
    weights = torch.tensor([0.3, -1.0, 0.7, 0.5])
    (grad,) = torch.autograd.grad((got * weights).sum(), states)
    assert float(grad.abs().sum()) > 0 and float(grad[mask == 0].abs().sum()) == 0  # padding gets none

    def direct(s: torch.Tensor) -> torch.Tensor:  # the same, states perturbed along a direction
        return (target_log_probs(model, None, TGT, owners, encoder_states=(s, mask)) * weights).sum()

    d = torch.randn(states.shape, generator=torch.Generator().manual_seed(2))
    h = 1e-2
    with torch.no_grad():
        numeric = (float(direct(states + h * d)) - float(direct(states - h * d))) / (2 * h)
    assert numeric == pytest.approx(float((grad * d).sum()), rel=2e-2, abs=1e-3)


def test_target_log_probs_encoder_states_bad_input_is_a_clear_error():
    model = marian()
    states, mask = torch.zeros(2, 4, 16), torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="sources are needed unless encoder_states"):
        target_log_probs(model, None, TGT, OWN)
    with pytest.raises(ValueError, match=r"states \[B, S, d\] and mask \[B, S\]"):
        target_log_probs(model, None, TGT, OWN, encoder_states=(states, mask[:, :3]))
    with pytest.raises(ValueError, match="hold 2 sources, sources has 1"):
        target_log_probs(model, SRC[:1], TGT, [0] * 4, encoder_states=(states, mask))
    with pytest.raises(ValueError, match=r"owners must lie in \[0, 2\)"):
        target_log_probs(model, None, TGT, [0, 1, 2, 0], encoder_states=(states, mask))
    with pytest.raises(ValueError, match="encoder-decoder"):
        target_log_probs(gpt2(), None, TGT, OWN, encoder_states=(states, mask))


def test_stored_log_probs_are_the_routines(folder):
    """The builder's stored reference values are the routine's in eval mode: the same tokenisation rule."""
    model = tiny_bart_model()
    examples = read_mbr_examples(folder, WordCodec(), model)
    pairs = [(e, p) for e in examples for p in e.pairs]
    got = target_log_probs(model, [e.prompt_ids for e, _ in pairs], [p.rejected_ids for _, p in pairs], grad=False)
    want = torch.tensor([p.ref_rejected_logp for _, p in pairs])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    check_reference_model(model, examples)
    with pytest.raises(ValueError, match="another model's"):
        check_reference_model(tiny_bart(len(WORDS) + 3, 24, seed=5), examples)


# ---- pairs ----------------------------------------------------------------------------------------------


def test_pairings_and_several_pairs_per_source(folder):
    rows = read_mbr_data(folder)
    stored = read_mbr_examples(folder, WordCodec())
    assert [(e.prompt, [(p.chosen, p.rejected) for p in e.pairs]) for e in stored] == [
        (r["prompt"], [(r["chosen"], r["rejected"])] if r["rejected"] is not None else []) for r in rows
    ]
    several = read_mbr_examples(folder, WordCodec(), pairing="best-worst", pairs_per_source=3)
    for row, ex in zip(rows, several):
        cands, exp = row["candidates"], row["expected"]
        best, worst = pair_rows(cands, exp, len(cands) - 1, "best-worst")
        ranked = sorted(range(len(cands)), key=lambda i: (exp[i], -i))  # worst first
        distinct = list(dict.fromkeys(cands[i] for i in ranked if cands[i] != cands[best]))
        assert [p.rejected for p in ex.pairs] == distinct[:3]
        assert ex.pairs[0].rejected == cands[worst] and all(p.chosen == cands[best] for p in ex.pairs)
        assert ex.pairs[0].chosen_ids == tuple(WordCodec().encode(cands[best]))  # EOS included
    # a rejected side the builder did not store gets its value from the model, once, in eval mode
    model = tiny_bart_model()
    filled = fill_reference_log_probs(model.train(), several)
    assert model.training
    for ex in filled:
        for p in ex.pairs:
            want = target_log_probs(model.eval(), [ex.prompt_ids], [p.rejected_ids], grad=False)
            assert p.ref_rejected_logp == pytest.approx(float(want), abs=1e-5)


@pytest.mark.parametrize("mode", ["all", "not-shorter", "balanced"])
def test_selection_by_hand(mode):
    """40 pairs of random side lengths: which pairs each selection keeps, counted by hand."""
    gen = torch.Generator().manual_seed(0)
    examples, diffs = [], []
    for i in range(40):
        n_w, n_l = (int(v) for v in torch.randint(1, 6, (2,), generator=gen))
        pair = PreferencePair("c", "r", (5,) * n_w, (6,) * n_l, -1.0, -2.0)
        examples.append(MBRExample(i, "p", (7, 1), "c", (5,) * n_w, (pair,)))
        diffs.append(n_w - n_l)
    ours = select_pairs(examples, mode)
    assert [e.index for e in ours] == list(range(40))
    assert [e.target_ids for e in ours] == [e.target_ids for e in examples]
    kept = {e.index for e in ours if e.pairs}
    shorter = {i for i, d in enumerate(diffs) if d < 0}
    longer = {i for i, d in enumerate(diffs) if d > 0}
    equal = {i for i, d in enumerate(diffs) if d == 0}
    assert shorter and longer and equal  # the draw covers the three cases
    if mode == "all":
        assert kept == set(range(40))
    elif mode == "not-shorter":
        assert kept == longer | equal
    else:  # every pair of the rarer direction, as many of the other, and the equal ones
        rare, common = (longer, shorter) if len(shorter) >= len(longer) else (shorter, longer)
        assert equal <= kept and rare <= kept and len(kept & common) == len(rare)
        assert select_pairs(examples, mode, seed=0) == ours  # a fixed subset for a seed


# ---- the loss -------------------------------------------------------------------------------------------


def test_loss_is_preference_loss_plus_distillation_and_reference_nll_by_hand(folder, tmp_path):
    model = tiny_bart_model()
    args = config(
        tmp_path,
        beta=0.3,
        nll_weight=0.7,
        dpo_weight=1.5,
        distill_weight=0.4,
        reference_weight=0.2,
        pairing="best-worst",
        pairs_per_source=2,
    )
    refs = [s.replace("a ", "the ") for s in SOURCES]
    trainer = MBRTrainer(model, args, folder, WordCodec(), references=refs)
    examples = trainer.train_dataset.examples[:3]
    with torch.no_grad():
        for p in model.parameters():  # away from the reference, so that the rewards are not all 0
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    loss = trainer.compute_loss(model, {"examples": examples})

    def logits(ex, ids):
        labels = torch.tensor([list(ids)])
        return model(input_ids=torch.tensor([list(ex.prompt_ids)]), labels=labels).logits, labels

    pairs = [(ex, p) for ex in examples for p in ex.pairs]
    width = max(len(p.chosen_ids) for _, p in pairs), max(len(p.rejected_ids) for _, p in pairs)

    def stack(side: int):
        out_logits, out_labels = [], []
        for ex, p in pairs:
            lg, lab = logits(ex, p.chosen_ids if side == 0 else p.rejected_ids)
            pad = width[side] - lab.shape[1]
            out_logits.append(torch.nn.functional.pad(lg, (0, 0, 0, pad)))
            out_labels.append(torch.nn.functional.pad(lab, (0, pad), value=-100))
        return torch.cat(out_logits), torch.cat(out_labels)

    (cl, clab), (rl, rlab) = stack(0), stack(1)
    ref_c = torch.tensor([p.ref_chosen_logp for _, p in pairs])
    ref_r = torch.tensor([p.ref_rejected_logp for _, p in pairs])
    pref = PreferenceLoss(beta=0.3, nll_weight=0.7)(cl, rl, ref_c, ref_r, clab, rlab)
    with torch.no_grad():
        nll_sum = sum(-float(sequence_log_probs(*logits(ex, ex.target_ids))) for ex in examples)
        ref_ids = [WordCodec().encode(refs[ex.index]) for ex in examples]
        ref_sum = sum(-float(sequence_log_probs(*logits(ex, ids))) for ex, ids in zip(examples, ref_ids))
    distill = nll_sum / sum(len(ex.target_ids) for ex in examples)
    reference = ref_sum / sum(map(len, ref_ids))
    assert float(loss) == pytest.approx(1.5 * float(pref.loss) + 0.4 * distill + 0.2 * reference, abs=1e-5)
    assert float(pref.margins.abs().max()) > 1e-3


def test_first_step_is_log_2_and_logs_rewards(folder, tmp_path):
    trainer = MBRTrainer(
        tiny_bart_model(), config(tmp_path, nll_weight=0.0, max_steps=1, logging_steps=1), folder, WordCodec()
    )
    trainer.train()
    first = trainer.state.log_history[0]
    assert first["dpo"] == pytest.approx(math.log(2), abs=1e-5) and first["rewards/margins"] == pytest.approx(
        0, abs=1e-6
    )
    assert {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "logps/chosen", "logps/rejected"} <= set(first)


@pytest.fixture(scope="module")
def trl_case(tmp_path_factory, tiny_roberta_dir):
    """A tiny random GPT-2 and TRL's tokenised rows of 4 preference pairs; a factory of TRL DPOTrainers."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_roberta_dir)
    model = tiny_causal_lm(tok, 128).eval()
    pairs = {
        "prompt": ["A man on a", "Two dogs", "A woman", "Children"],
        "chosen": [" bike rides down a hill.", " run.", " is reading a book in the park.", " play football."],
        "rejected": [" bike.", " are running on the grass together.", " reads.", " are playing with a ball."],
    }
    out = tmp_path_factory.mktemp("trl-dpo")

    def make(**settings):
        args = trl.DPOConfig(
            output_dir=str(out),
            per_device_train_batch_size=4,
            report_to=[],
            use_cpu=True,
            bf16=False,
            save_strategy="no",
            disable_tqdm=True,
            precompute_ref_log_probs=True,
            **settings,
        )
        return trl.DPOTrainer(model=model, args=args, train_dataset=Dataset.from_dict(pairs), processing_class=tok)

    rows = [make().train_dataset[i] for i in range(4)]
    return make, model, tok, rows


@pytest.mark.parametrize(
    ("trl_settings", "ours"),
    [
        ({"beta": 0.1}, {"beta": 0.1, "nll_weight": 0.0}),
        (
            {"beta": 0.3, "loss_type": ["robust"], "label_smoothing": 0.15},
            {"beta": 0.3, "loss_type": "robust", "label_smoothing": 0.15, "nll_weight": 0.0},
        ),
        ({"beta": 0.3, "loss_type": ["ipo"]}, {"beta": 0.3, "loss_type": "ipo", "nll_weight": 0.0}),
        ({"beta": 0.2, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.6]}, {"beta": 0.2, "nll_weight": 0.6}),
    ],
)
def test_equals_trl_dpo_trainer_loss_on_a_causal_lm(trl_case, tmp_path, trl_settings, ours):
    """Over the same pairs (TRL's own token ids), the same model and reference values, MBRTrainer's loss is
    TRL's ``DPOTrainer`` loss."""
    make, model, tok, rows = trl_case
    trainer = make(**trl_settings)
    batch = trainer.data_collator(rows)
    with torch.no_grad():
        pc, pr = trainer.compute_ref_log_probs(model, batch)
    ref_c, ref_r = pc + torch.tensor([1.5, -2.0, 0.3, -0.7]), pr + torch.tensor([-1.0, 0.5, 2.0, -0.2])
    batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref_c, ref_r
    with torch.no_grad():
        want = trainer.compute_loss(model, batch)
    examples = [
        MBRExample(
            i,
            "",
            tuple(r["prompt_ids"]),
            "",
            tuple(r["chosen_ids"]),
            (
                PreferencePair(
                    "", "", tuple(r["chosen_ids"]), tuple(r["rejected_ids"]), float(ref_c[i]), float(ref_r[i])
                ),
            ),
        )
        for i, r in enumerate(rows)
    ]
    ours_trainer = MBRTrainer(model, config(tmp_path, check_reference=False, **ours), MBRDataset(examples), tok)
    with torch.no_grad():
        got = ours_trainer.compute_loss(model, {"examples": examples})
    assert float(got) == pytest.approx(float(want), abs=1e-5)


@pytest.mark.slow
def test_minimum_risk_term_by_hand(folder, tmp_path, tiny_scorer):
    """The MRT term: the trainer's samples (seeded by seed and update), their log-probabilities by the whole
    model, and ``MinimumRiskLoss`` against the references."""
    from rerank import SamplingConfig, sample_ids

    model = tiny_bart_model()
    risk = MinimumRiskLoss(scorer=tiny_scorer)
    refs = [s.replace("a ", "the ") for s in SOURCES]
    args = config(tmp_path, dpo_weight=0.0, mrt_weight=1.0, mrt_samples=4, seed=3)
    trainer = MBRTrainer(model, args, folder, WordCodec(), references=refs, risk=risk)
    examples = trainer.train_dataset.examples[:3]
    with torch.no_grad():
        got = trainer.compute_loss(model, {"examples": examples})
        drawn = sample_ids(
            model,
            [list(e.prompt_ids) for e in examples],
            SamplingConfig(num_samples=4, epsilon=0.02, precision="32", seed=3_000_009, progress=False),
        )
        texts = [[WordCodec().decode(s) for s in row] for row in drawn.sequences]
        lp = torch.stack(
            [
                one_by_one(model, [list(e.prompt_ids)], [s + [2] for s in row], [0] * 4)
                for e, row in zip(examples, drawn.sequences)
            ]
        )
        want = risk(lp, texts, [refs[e.index] for e in examples]).loss
    assert float(got) == pytest.approx(float(want), abs=1e-5)
    assert len({t for row in texts for t in row}) > 3  # the samples vary


# ---- training mechanics ---------------------------------------------------------------------------------


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_gradient_accumulation_equals_the_big_batch(folder, tmp_path):
    """One SGD update from a batch of 4 pairs = from 2 micro-batches of 2 (the DPO term is a mean over pairs)."""
    settings = {
        "nll_weight": 0.0,
        "max_steps": 1,
        "optim": "sgd",
        "learning_rate": 0.5,
        "lr_scheduler_type": "constant",
    }
    big = tiny_bart_model()
    MBRTrainer(big, config(tmp_path / "a", per_device_train_batch_size=4, **settings), folder, WordCodec()).train()
    small = tiny_bart_model()
    args = config(tmp_path / "b", per_device_train_batch_size=2, gradient_accumulation_steps=2, **settings)
    MBRTrainer(small, args, folder, WordCodec()).train()
    start = weights(tiny_bart_model())
    a, b = weights(big), weights(small)
    assert max(float((a[k] - start[k]).abs().max()) for k in a) > 1e-3  # it moved
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-5)


@pytest.mark.slow
def test_resume_from_checkpoint_equals_the_uninterrupted_run(folder, tmp_path):
    settings = {"max_steps": 4, "save_strategy": "steps", "save_steps": 2, "distill_weight": 0.3}
    whole = tiny_bart_model()
    MBRTrainer(whole, config(tmp_path / "whole", **settings), folder, WordCodec()).train()
    resumed = tiny_bart_model()
    trainer = MBRTrainer(resumed, config(tmp_path / "resumed", **settings), folder, WordCodec())
    trainer.train(resume_from_checkpoint=str(tmp_path / "whole" / "out" / "checkpoint-2"))
    assert trainer.state.global_step == 4
    a, b = weights(whole), weights(resumed)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
    trainer.save_model(str(tmp_path / "saved"))
    assert (tmp_path / "saved" / "config.json").is_file()


def test_bad_settings_are_clear_errors(folder, tmp_path):
    with pytest.raises(ValueError, match="loss_type"):
        config(tmp_path, loss_type="hinge")
    with pytest.raises(ValueError, match="pair_selection"):
        config(tmp_path, pair_selection="shortest")
    with pytest.raises(ValueError, match="nothing to train"):
        config(tmp_path, dpo_weight=0.0)
    with pytest.raises(ValueError, match="pass references"):
        MBRTrainer(tiny_bart_model(), config(tmp_path, reference_weight=1.0), folder, WordCodec())
    with pytest.raises(ValueError, match="another model's"):
        MBRTrainer(tiny_bart(len(WORDS) + 3, 24, seed=9), config(tmp_path), folder, WordCodec())
    with pytest.raises(ValueError, match="encoder-decoders only"):
        MBRTrainer(gpt2(), config(tmp_path, mrt_weight=1.0), folder, WordCodec())
    with pytest.raises(FileNotFoundError, match="manifest"):
        MBRTrainer(tiny_bart_model(), config(tmp_path), tmp_path, WordCodec())


# ---- the committed Marian model ---------------------------------------------------------------------------


@pytest.mark.slow
def test_twenty_steps_on_the_committed_marian_model_lower_the_preference_loss(tmp_path):
    import sentencepiece as spm
    from transformers import MarianMTModel

    folder = ROOT / "models" / "multi30k-de-en"
    model = MarianMTModel.from_pretrained(folder)
    sp = spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    sources = (ROOT / "tests" / "data" / "multi30k" / "train.de").read_text().splitlines()[:8]
    data = MBRDataConfig(num_samples=8, beams=2, shard_size=8, seed=0, precision="32", utility="chrf")
    build_mbr_data(model, sp, sources, tmp_path / "mbr", data, progress=False)
    args = config(
        tmp_path,
        max_steps=20,
        per_device_train_batch_size=8,
        learning_rate=3e-4,
        logging_steps=1,
        beta=0.1,
        nll_weight=0.0,
        pairing="best-worst",
    )
    trainer = MBRTrainer(model, args, tmp_path / "mbr", sp)
    trainer.train()
    losses = [h["dpo"] for h in trainer.state.log_history if "dpo" in h]
    assert losses[0] == pytest.approx(math.log(2), abs=1e-4)
    assert losses[-1] < losses[0] - 0.1
    assert trainer.state.log_history[-2]["rewards/accuracies"] == 1.0


@pytest.mark.slow
def test_docs_trainer_snippet_runs_as_written(tmp_path):
    """The block of docs/preference.md marked ``<!-- doc-test: trainer -->``, in a fresh interpreter, in a
    folder where ``models/`` is the repository's: step 1 is ``log 2`` with zero margin, and DPO falls."""
    import re

    from .test_docs import run_script

    text = (ROOT / "docs" / "preference.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"<!-- doc-test: trainer -->\n```python\n(.*?)```", text, re.S)
    assert len(code.strip().splitlines()) <= 30  # a user's DPO in at most 30 lines
    (tmp_path / "models").symlink_to(ROOT / "models")
    done = run_script(code, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [
        (int(s), float(d), float(m))
        for s, d, m in re.findall(r"step (\d+): dpo ([\d.]+) margin (-?[\d.]+)", done.stdout)
    ]
    assert [s for s, _, _ in rows] == [1, 2, 3, 4, 5], done.stdout
    assert rows[0][1] == pytest.approx(math.log(2), abs=1e-4) and abs(rows[0][2]) < 1e-3
    assert rows[-1][1] < rows[0][1] and rows[-1][2] > 0
    assert (tmp_path / "dpo-model" / "config.json").is_file()


@pytest.mark.slow
def test_readme_trainer_snippet_runs_as_written(tmp_path):
    """README.md's "Learn from MBR" block (marked ``<!-- doc-test: trainer -->``) in a fresh interpreter: the
    printed DPO values start at log 2 (policy = reference) and fall."""
    import re

    from .test_docs import run_script

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    (code,) = re.findall(r"<!-- doc-test: trainer -->\n```python\n(.*?)```", text, re.S)
    (tmp_path / "models").symlink_to(ROOT / "models")
    done = run_script(code, tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    values = [float(x) for x in re.findall(r"[\d.]+", done.stdout.strip().splitlines()[-1])]
    assert len(values) == 3 and values[0] == pytest.approx(math.log(2), abs=1e-4) and values[-1] < values[0]
