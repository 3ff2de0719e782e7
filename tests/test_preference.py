"""bertscore_loss.preference: DPO (+NLL) for encoder–decoders, checked against a hand calculation, finite
differences, ``cross_entropy`` and TRL's own ``DPOTrainer`` loss on the same log-probabilities."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

from bertscore_loss import PreferenceConfig, PreferenceLoss, sequence_log_probs
from bertscore_loss.preference import dpo_loss

# Four pairs: policy and reference sequence log-probabilities (chosen, rejected).
PC = [-4.0, -10.0, -7.5, -3.0]
PR = [-6.0, -9.0, -7.0, -8.0]
RC = [-5.0, -9.5, -7.0, -3.5]
RR = [-5.5, -9.5, -8.0, -7.0]


def t(values, dtype=torch.float32):
    return torch.tensor(values, dtype=dtype)


def neg_log_sigmoid(x: float) -> float:
    return math.log1p(math.exp(-x))


def test_sigmoid_dpo_equals_a_hand_calculation():
    beta = 0.5
    terms = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=beta, reduction="none")
    # pair 0: chosen log-ratio -4 - (-5) = 1, rejected -6 - (-5.5) = -0.5, Δ = 1.5, β Δ = 0.75
    assert abs(terms.loss[0].item() - neg_log_sigmoid(0.75)) < 1e-6
    want = [neg_log_sigmoid(beta * ((pc - rc) - (pr - rr))) for pc, pr, rc, rr in zip(PC, PR, RC, RR)]
    torch.testing.assert_close(terms.loss, t(want), atol=1e-6, rtol=0)
    torch.testing.assert_close(terms.chosen_rewards, t([0.5, -0.25, -0.25, 0.25]), atol=1e-7, rtol=0)
    torch.testing.assert_close(terms.rejected_rewards, t([-0.25, 0.25, 0.5, -0.5]), atol=1e-7, rtol=0)
    mean = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=beta).loss
    total = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=beta, reduction="sum").loss
    assert abs(mean.item() - sum(want) / 4) < 1e-6 and abs(total.item() - sum(want)) < 1e-5


def test_label_smoothing_robust_and_ipo_equal_hand_calculations():
    beta, eps = 0.5, 0.2
    deltas = [(pc - rc) - (pr - rr) for pc, pr, rc, rr in zip(PC, PR, RC, RR)]  # 1.5, -1.0, -1.5, 1.5
    cdpo = [(1 - eps) * neg_log_sigmoid(beta * d) + eps * neg_log_sigmoid(-beta * d) for d in deltas]
    got = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=beta, label_smoothing=eps, reduction="none").loss
    torch.testing.assert_close(got, t(cdpo), atol=1e-6, rtol=0)
    rdpo = [((1 - eps) * neg_log_sigmoid(beta * d) - eps * neg_log_sigmoid(-beta * d)) / (1 - 2 * eps) for d in deltas]
    got = dpo_loss(t(PC), t(PR), t(RC), t(RR), beta=beta, label_smoothing=eps, loss_type="robust", reduction="none")
    torch.testing.assert_close(got.loss, t(rdpo), atol=1e-6, rtol=0)
    n_w, n_l = [2, 5, 3, 1], [4, 4, 6, 2]
    ipo = [
        ((pc - rc) / a - (pr - rr) / b - 1 / (2 * beta)) ** 2 for pc, pr, rc, rr, a, b in zip(PC, PR, RC, RR, n_w, n_l)
    ]
    got = dpo_loss(
        t(PC),
        t(PR),
        t(RC),
        t(RR),
        beta=beta,
        loss_type="ipo",
        reduction="none",
        chosen_lengths=torch.tensor(n_w),
        rejected_lengths=torch.tensor(n_l),
    )
    torch.testing.assert_close(got.loss, t(ipo), atol=1e-6, rtol=0)


def test_policy_equal_to_reference_gives_log_2_and_zero_rewards():
    out = PreferenceLoss()(t(PC), t(PR), t(PC), t(PR))
    assert abs(out.loss.item() - math.log(2)) < 1e-7 and out.nll is None
    assert not out.chosen_rewards.any() and not out.margins.any() and out.reward_accuracy.item() == 0.0


def test_output_fields_rewards_margins_accuracy():
    out = PreferenceLoss(beta=0.5)(t(PC), t(PR), t(RC), t(RR))
    torch.testing.assert_close(out.margins, t([0.75, -0.5, -0.75, 0.75]), atol=1e-7, rtol=0)
    assert out.reward_accuracy.item() == 0.5 and out.loss.shape == () and out.dpo is out.loss
    assert not out.chosen_rewards.requires_grad


# ---- logits and labels ---------------------------------------------------------------------------------


def tiny_case(dtype=torch.float64, seed: int = 0):
    """Chosen logits [2, 3, 5] and rejected [2, 4, 5] with -100 padding, and reference log-probs."""
    g = torch.Generator().manual_seed(seed)
    lc = torch.randn(2, 3, 5, generator=g, dtype=dtype)
    lr = torch.randn(2, 4, 5, generator=g, dtype=dtype)
    yc = torch.tensor([[1, 4, -100], [0, 2, 3]])
    yr = torch.tensor([[2, 2, 0, 1], [4, 1, -100, -100]])
    return lc, lr, yc, yr, t([-4.0, -5.0], dtype), t([-6.0, -3.0], dtype)


def test_nll_term_is_the_mean_token_cross_entropy_of_chosen():
    lc, lr, yc, yr, rc, rr = tiny_case(torch.float32)
    for w in (0.0, 0.7):
        loss = PreferenceLoss(beta=0.3, nll_weight=w)
        out = loss(lc, lr, rc, rr, yc, yr)
        ce = F.cross_entropy(lc.reshape(-1, 5), yc.reshape(-1), ignore_index=-100)
        assert abs(out.nll.item() - ce.item()) < 1e-6
        assert abs(out.loss.item() - (out.dpo + w * ce).item()) < 1e-6
    summed = PreferenceLoss(nll_weight=1.0, reduction="sum")(lc, lr, rc, rr, yc, yr).nll
    ce_sum = F.cross_entropy(lc.reshape(-1, 5), yc.reshape(-1), ignore_index=-100, reduction="sum")
    assert abs(summed.item() - ce_sum.item()) < 1e-5
    per_pair = PreferenceLoss(nll_weight=1.0, reduction="none")(lc, lr, rc, rr, yc, yr)
    ce_rows = [F.cross_entropy(lc[i], yc[i], ignore_index=-100) for i in range(2)]
    torch.testing.assert_close(per_pair.nll, torch.stack(ce_rows), atol=1e-6, rtol=0)
    torch.testing.assert_close(per_pair.loss, per_pair.dpo + per_pair.nll, atol=1e-6, rtol=0)


def test_logits_path_equals_the_log_prob_path():
    lc, lr, yc, yr, rc, rr = tiny_case(torch.float32)
    loss = PreferenceLoss(beta=0.2, nll_weight=0.5, label_smoothing=0.1)
    a = loss(lc, lr, rc, rr, yc, yr)
    lengths = ((yc != -100).sum(1), (yr != -100).sum(1))
    b = loss(
        sequence_log_probs(lc, yc),
        sequence_log_probs(lr, yr),
        rc,
        rr,
        chosen_lengths=lengths[0],
        rejected_lengths=lengths[1],
    )
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, atol=1e-7, rtol=0)


def test_gradient_equals_finite_differences():
    """torch.autograd.gradcheck in float64: exact on the log-probabilities (the whole loss, DPO + NLL, for
    each loss type), and through the logits (where ``sequence_log_probs`` computes in float32, so the
    central differences need a wider step and tolerance)."""
    lc, lr, yc, yr, rc, rr = tiny_case(torch.float64)
    n_w, n_l = (yc != -100).sum(1), (yr != -100).sum(1)
    pc = sequence_log_probs(lc, yc).double().requires_grad_()
    pr = sequence_log_probs(lr, yr).double().requires_grad_()
    for kind, eps in (("sigmoid", 0.0), ("sigmoid", 0.1), ("robust", 0.2), ("ipo", 0.0)):
        loss = PreferenceLoss(beta=0.5, nll_weight=0.3, label_smoothing=eps, loss_type=kind)

        def on_logps(a, b, loss=loss):
            return loss(a, b, rc, rr, chosen_lengths=n_w, rejected_lengths=n_l).loss

        assert torch.autograd.gradcheck(on_logps, (pc, pr))
    loss = PreferenceLoss(beta=0.5, nll_weight=0.3, label_smoothing=0.1)
    lc.requires_grad_()
    lr.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: loss(a, b, rc, rr, yc, yr).loss, (lc, lr), eps=1e-2, atol=1e-4)


def test_padding_positions_do_not_change_the_loss():
    lc, lr, yc, yr, rc, rr = tiny_case(torch.float32)
    loss = PreferenceLoss(beta=0.4, nll_weight=1.0)
    base = loss(lc, lr, rc, rr, yc, yr)
    g = torch.Generator().manual_seed(1)
    # Two more padded positions with arbitrary logits, and new values at the existing padded positions.
    lc2 = torch.cat([lc, 50 * torch.randn(2, 2, 5, generator=g)], dim=1).requires_grad_()
    yc2 = torch.cat([yc, torch.full((2, 2), -100)], dim=1)
    with torch.no_grad():
        lc2[0, 2] = 1e4
    lr2 = lr.clone()
    lr2[1, 2:] = -1e4
    padded = loss(lc2, lr2, rc, rr, yc2, yr)
    for x, y in zip(base, padded):
        torch.testing.assert_close(x, y, atol=1e-6, rtol=0)
    padded.loss.backward()
    assert lc2.grad is not None and not lc2.grad[:, 3:].any() and not lc2.grad[0, 2].any()
    assert lc2.grad[0, :2].abs().sum() > 0


def test_label_log_probs_on_decoder_states_gives_the_same_loss():
    """The documented memory-lean path: ``label_log_probs`` on a Marian decoder's states at real positions."""
    from transformers import MarianConfig, MarianMTModel
    from transformers.models.marian.modeling_marian import shift_tokens_right

    from bertscore_loss.risk import label_log_probs

    torch.manual_seed(0)
    cfg = MarianConfig(
        vocab_size=40,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=32,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    model = MarianMTModel(cfg).eval()
    src = torch.randint(2, 40, (3, 5))
    chosen = torch.tensor([[5, 6, 7, 1], [8, 1, -100, -100], [9, 9, 1, -100]])
    rejected = torch.tensor([[5, 1, -100], [8, 3, 1], [2, 1, -100]])
    ref_c, ref_r = torch.tensor([-9.0, -4.0, -7.0]), torch.tensor([-5.0, -8.0, -6.0])

    def lean(labels):
        dec = shift_tokens_right(labels, cfg.pad_token_id, cfg.decoder_start_token_id)
        states = model.model(input_ids=src, attention_mask=src.ne(0), decoder_input_ids=dec).last_hidden_state
        real = labels != -100
        token = label_log_probs(states[real], model.lm_head.weight, labels[real], model.final_logits_bias)
        rows = torch.arange(labels.shape[0]).repeat_interleave(real.sum(1))
        return token.new_zeros(labels.shape[0]).index_add(0, rows, token), real.sum(1)

    def logits(labels):
        return model(input_ids=src, attention_mask=src.ne(0), labels=labels).logits

    loss = PreferenceLoss(beta=0.1, nll_weight=1.0)
    full = loss(logits(chosen), logits(rejected), ref_c, ref_r, chosen, rejected)
    (lp_c, n_c), (lp_r, n_r) = lean(chosen), lean(rejected)
    fast = loss(lp_c, lp_r, ref_c, ref_r, chosen_lengths=n_c, rejected_lengths=n_r)
    torch.testing.assert_close(fast.loss, full.loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.margins, full.margins, atol=1e-6, rtol=0)


# ---- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"beta": float("nan")}, "beta must be a finite number"),
        ({"beta": float("inf")}, "beta must be a finite number"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"beta": -0.1}, "beta must be > 0"),
        ({"beta": True}, "beta must be a finite number"),
        ({"nll_weight": float("nan")}, "nll_weight must be a finite number"),
        ({"nll_weight": -1.0}, "nll_weight must be >= 0"),
        ({"label_smoothing": 0.5}, "label_smoothing must lie in [0, 0.5)"),
        ({"label_smoothing": -0.1}, "label_smoothing must lie in [0, 0.5)"),
        ({"label_smoothing": float("inf")}, "label_smoothing must be a finite number"),
        ({"loss_type": "hinge"}, "loss_type must be one of 'sigmoid', 'robust', 'ipo'"),
        ({"loss_type": "ipo", "label_smoothing": 0.1}, "label_smoothing applies to 'sigmoid' and 'robust' only"),
        ({"reduction": "max"}, "reduction must be 'mean', 'sum' or 'none'"),
    ],
)
def test_bad_settings_are_one_line_errors_naming_the_field(fields, needle):
    with pytest.raises(ValueError, match=re.escape(needle)) as err:
        PreferenceConfig(**fields)
    assert "\n" not in str(err.value) and "PreferenceConfig." in str(err.value)
    with pytest.raises(ValueError, match=re.escape(needle)):
        PreferenceLoss(**fields)
    with pytest.raises(TypeError, match="unknown settings"):
        PreferenceLoss(betta=0.1)


def test_config_is_frozen_and_the_fields_override_it():
    config = PreferenceConfig(beta=0.2)
    with pytest.raises(AttributeError):
        config.beta = 0.3  # type: ignore[misc]
    assert PreferenceLoss(config, nll_weight=1.0).config == PreferenceConfig(beta=0.2, nll_weight=1.0)


def test_bad_inputs_are_one_line_errors():
    lc, lr, yc, yr, rc, rr = tiny_case(torch.float32)
    loss = PreferenceLoss()
    cases = [
        (lambda: loss(lc, lr[:1], rc, rr, yc, yr[:1]), "chosen and rejected hold different numbers of pairs: 2 and 1"),
        (lambda: loss(lc, lr, rc[:1], rr, yc, yr), "ref_chosen_logps has shape (1,), but the pairs are (2,)"),
        (lambda: loss(lc, lr, rc, rr.view(2, 1), yc, yr), "ref_rejected_logps must be a tensor [B]"),
        (lambda: loss(lc, lr, rc, rr, yc[:, :2], yr), "chosen_labels must be [B, T] = (2, 3), got (2, 2)"),
        (lambda: loss(lc, lr, rc, rr, None, yr), "chosen holds logits [B, T, V]: pass chosen_labels"),
        (lambda: loss(lc[:, 0], lr, rc, rr, yc, yr), "chosen must be logits [B, T, V]"),
        (lambda: loss(lc, lr, t([-1.0, float("nan")]), rr, yc, yr), "ref_chosen_logps holds NaN or ±inf"),
        (lambda: loss(lc, lr, rc, t([float("-inf"), 0.0]), yc, yr), "ref_rejected_logps holds NaN or ±inf"),
        (lambda: loss(rc, rr, rc, rr, yc, yr), "chosen holds log-probs [B]: chosen_labels are for logits"),
        (lambda: loss(lc, lr, rc, rr, torch.full_like(yc, -100), yr), "chosen_labels row 0 has no target token"),
        (lambda: loss(lc, lr, rc, rr, yc, yr + 10), "labels must lie in [0, 5)"),
        (lambda: PreferenceLoss(nll_weight=1.0)(rc, rr, rc, rr), "nll_weight > 0 with log-probs [B] needs"),
        (lambda: PreferenceLoss(loss_type="ipo")(rc, rr, rc, rr), "loss_type='ipo' needs chosen_lengths"),
        (
            lambda: loss(rc, rr, rc, rr, chosen_lengths=torch.tensor([0, 3])),
            "chosen_lengths must hold finite token counts >= 1",
        ),
        (lambda: dpo_loss(t([]), t([]), t([]), t([])), "got no pairs"),
        (lambda: dpo_loss(rc, rr, rc, rr, beta=float("nan")), "PreferenceConfig.beta must be a finite number"),
        (lambda: dpo_loss(rc, rr.long(), rc, rr), "policy_rejected_logps must be a float tensor"),
    ]
    for call, needle in cases:
        with pytest.raises(ValueError, match=re.escape(needle)) as err:
            call()
        assert "\n" not in str(err.value)


# ---- TRL's DPOTrainer on the same log-probabilities ----------------------------------------------------


@pytest.fixture(scope="module")
def trl_case(tmp_path_factory, tiny_roberta_dir):
    """A tiny random GPT-2, TRL's collated batch of 4 preference pairs, and a factory of DPOTrainers."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from transformers import AutoTokenizer

    from .conftest import tiny_causal_lm

    tok = AutoTokenizer.from_pretrained(tiny_roberta_dir)
    model = tiny_causal_lm(tok, 128).eval()
    pairs = {
        "prompt": ["A man on a", "Two dogs", "A woman", "Children"],
        "chosen": [" bike rides down a hill.", " run.", " is reading a book in the park.", " play football."],
        "rejected": [" bike.", " are running on the grass together.", " reads.", " are playing with a ball."],
    }
    ds = Dataset.from_dict(pairs)
    out = tmp_path_factory.mktemp("trl-dpo")

    def trainer(**settings):
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
        return trl.DPOTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)

    first = trainer()
    rows = [first.train_dataset[i] for i in range(4)]
    return trainer, model, rows


def trl_loss(trainer, model, rows, ref_chosen, ref_rejected):
    """TRL's loss and metrics on its batch of ``rows`` with our reference log-probs, and the policy's
    sequence log-probs and completion lengths as TRL computes them."""
    batch = trainer.data_collator(rows)
    batch["ref_chosen_logps"], batch["ref_rejected_logps"] = ref_chosen, ref_rejected
    with torch.no_grad():
        policy_chosen, policy_rejected = trainer.compute_ref_log_probs(model, batch)  # with the policy itself
        trainer._metrics["eval"].clear()
        loss = trainer.compute_loss(model, batch)
    n_chosen, n_rejected = batch["completion_mask"][:, 1:].sum(1).chunk(2)
    return loss, dict(trainer._metrics["eval"]), policy_chosen, policy_rejected, n_chosen, n_rejected


REF_OFFSETS_CHOSEN = torch.tensor([1.5, -2.0, 0.3, -0.7])
REF_OFFSETS_REJECTED = torch.tensor([-1.0, 0.5, 2.0, -0.2])


@pytest.mark.parametrize(
    "settings",
    [
        {"beta": 0.1},
        {"beta": 0.7},
        {"beta": 0.3, "loss_type": ["robust"], "label_smoothing": 0.15},
        {"beta": 0.3, "loss_type": ["ipo"]},
        {"beta": 0.2, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.6]},  # DPO + NLL on chosen
    ],
)
def test_equals_trl_dpo_trainer_loss(trl_case, settings):
    make, model, rows = trl_case
    trainer = make(**settings)
    with torch.no_grad():
        pc, pr = trainer.compute_ref_log_probs(model, trainer.data_collator(rows))
    ref_c, ref_r = pc + REF_OFFSETS_CHOSEN, pr + REF_OFFSETS_REJECTED
    loss, metrics, pc, pr, n_c, n_r = trl_loss(trainer, model, rows, ref_c, ref_r)
    kind = settings.get("loss_type", ["sigmoid"])[0]
    nll_weight = settings["loss_weights"][1] if "loss_weights" in settings else 0.0
    ours = PreferenceLoss(
        beta=settings["beta"],
        loss_type=kind,
        label_smoothing=settings.get("label_smoothing", 0.0),
        nll_weight=nll_weight,
    )(pc, pr, ref_c, ref_r, chosen_lengths=n_c, rejected_lengths=n_r)
    assert abs(ours.loss.item() - loss.item()) < 1e-6
    assert abs(ours.chosen_rewards.mean().item() - metrics["rewards/chosen"][0]) < 1e-6
    assert abs(ours.rejected_rewards.mean().item() - metrics["rewards/rejected"][0]) < 1e-6
    assert abs(ours.margins.mean().item() - metrics["rewards/margins"][0]) < 1e-6
    assert abs(ours.reward_accuracy.item() - metrics["rewards/accuracies"][0]) < 1e-7
    assert 0 < ours.reward_accuracy.item() < 1  # the offsets make a mixed batch


def test_label_smoothing_equals_trl_conservative_form(trl_case):
    """TRL 1.16's ``sigmoid`` has no label smoothing; its conservative form ``−(1−ε) log σ(βΔ) − ε log σ(−βΔ)``
    is TRL's ``aot`` loss, which sorts the batch's log-ratios: on a batch of one pair it is exactly cDPO."""
    make, model, rows = trl_case
    trainer = make(beta=0.4, loss_type=["aot"], label_smoothing=0.2)
    for i in range(4):
        with torch.no_grad():
            pc, pr = trainer.compute_ref_log_probs(model, trainer.data_collator(rows[i : i + 1]))
        ref_c, ref_r = pc + REF_OFFSETS_CHOSEN[i], pr + REF_OFFSETS_REJECTED[i]
        loss, *_ = trl_loss(trainer, model, rows[i : i + 1], ref_c, ref_r)
        ours = dpo_loss(pc, pr, ref_c, ref_r, beta=0.4, label_smoothing=0.2)
        assert abs(ours.loss.item() - loss.item()) < 1e-6


# ---- the documented example ----------------------------------------------------------------------------


@pytest.mark.slow
def test_docs_snippet_trains_a_tiny_marian_model(tmp_path):
    from .test_docs import marked_blocks, run_script

    (code,) = [c for name, _, c in marked_blocks() if name == "preference.md"]
    done = run_script(code, tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"step (\d+): dpo ([\d.]+) nll ([\d.]+) margin (-?[\d.]+) accuracy ([\d.]+)", done.stdout)
    assert len(rows) == 2, done.stdout
    (s0, dpo0, _, margin0, _), (_, dpo1, _, margin1, acc1) = rows
    assert s0 == "0" and abs(float(dpo0) - math.log(2)) < 1e-4 and float(margin0) == 0.0  # policy = reference
    assert float(dpo1) < float(dpo0) and float(margin1) > 0 and float(acc1) == 1.0
