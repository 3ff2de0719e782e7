"""bertscore_loss.integrations.hf against the real transformers Seq2SeqTrainer (tiny random models, CPU)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from bertscore_loss import BERTScoreLoss, BERTScorer
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.integrations import (
    BERTScoreMetrics,
    MBRConsensusReward,
    SemanticLoss,
    bertscore_compute_metrics,
    decode_ids,
)

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "examples" / "data" / "cands.txt").read_text(encoding="utf-8").splitlines()
TARGETS = (ROOT / "examples" / "data" / "refs.txt").read_text(encoding="utf-8").splitlines()


def fresh_scorer(model_dir: str) -> BERTScorer:
    """A scorer on its own encoder (a scorer built from fields may share a loaded encoder and its cache)."""
    return BERTScorer(encoder=FrozenEncoder(model_dir, 2, device="cpu"))


def tiny_bart(tokenizer, d_model: int = 16):
    """A 1+1-layer random BART over ``tokenizer``'s vocabulary (its own special ids)."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    bos = tokenizer.cls_token_id if tokenizer.bos_token_id is None else tokenizer.bos_token_id
    eos = tokenizer.sep_token_id if tokenizer.eos_token_id is None else tokenizer.eos_token_id
    cfg = BartConfig(
        vocab_size=len(tokenizer),
        d_model=d_model,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=bos,
        eos_token_id=eos,
        decoder_start_token_id=bos,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
    )
    model = BartForConditionalGeneration(cfg)
    model.generation_config.max_length = 12
    return model


def features(tokenizer, sources: list[str], targets: list[str], max_length: int = 24) -> list[dict]:
    enc = tokenizer(sources, truncation=True, max_length=max_length)
    lab = tokenizer(text_target=targets, truncation=True, max_length=max_length)
    return [
        {"input_ids": i, "attention_mask": a, "labels": lbl}
        for i, a, lbl in zip(enc["input_ids"], enc["attention_mask"], lab["input_ids"])
    ]


def training_args(tmp_path, **kw):
    from transformers import Seq2SeqTrainingArguments

    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
    )
    base.update(kw)
    return Seq2SeqTrainingArguments(**base)


@pytest.fixture(scope="module")
def tok(tiny_bert_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_bert_dir)


def record_encoded(monkeypatch, encoder) -> list[tuple[int, ...]]:
    """Spy: every token-id row the encoder runs through its model."""
    seen: list[tuple[int, ...]] = []
    real = encoder.embed_ids

    def spy(ids, **kw):
        seen.extend(tuple(int(t) for t in r) for r in ids)
        return real(ids, **kw)

    monkeypatch.setattr(encoder, "embed_ids", spy)
    return seen


def test_decode_ids_replaces_ignore_index_and_skips_special_tokens(tok):
    ids = tok(["the cat sat", "a dog"], padding=True)["input_ids"]
    arr = np.array(ids)
    arr[1, -1] = -100  # the Trainer's padding of gathered labels / predictions
    assert decode_ids(arr, tok) == ["the cat sat", "a dog"]
    assert decode_ids(torch.tensor(arr), tok) == ["the cat sat", "a dog"]


@pytest.mark.slow
def test_seq2seq_train_evaluate_metric_reuses_reference_cache(tmp_path, tok, tiny_bert_dir, monkeypatch):
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    model = tiny_bart(tok)
    data = features(tok, SOURCES[:8], TARGETS[:8])
    scorer = fresh_scorer(tiny_bert_dir)
    metrics = bertscore_compute_metrics(tok, scorer, signature=True)
    assert scorer.encoder.cache.max_bytes > 0  # the factory turns the reference cache on
    args = training_args(tmp_path, max_steps=2, predict_with_generate=True, generation_max_length=12)
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=data[:6],
        data_collator=DataCollatorForSeq2Seq(tok, model=model),
        compute_metrics=metrics,
        processing_class=tok,
    )
    trainer.train()
    encoded = record_encoded(monkeypatch, scorer.encoder)
    first = trainer.evaluate()
    first_rows = set(encoded)
    encoded.clear()
    second = trainer.evaluate()
    refs = decode_ids([d["labels"] for d in data[:6]], tok)
    ref_rows = {tuple(r) for r in scorer.encoder.tokenize(refs).ids}
    assert ref_rows <= first_rows  # the first evaluation encodes the references ...
    assert not ref_rows & set(encoded)  # ... the second one does not
    assert metrics.stats["rows"] == 6 and metrics.stats["texts_encoded"] <= 6  # at most the predictions
    for m in (first, second):
        assert {"eval_bertscore_precision", "eval_bertscore_recall", "eval_bertscore_f1"} <= set(m)
        assert m["eval_bertscore_signature"].startswith("bertscore-loss:")
    assert first["eval_bertscore_f1"] == pytest.approx(second["eval_bertscore_f1"], abs=1e-6)

    # the means equal BERTScorer.score of the decoded generations on a fresh, cache-less scorer
    pred = trainer.predict(data[:6])
    cands = decode_ids(pred.predictions, tok)
    p, r, f = fresh_scorer(tiny_bert_dir).score(cands, refs)
    assert second["eval_bertscore_f1"] == pytest.approx(float(f.mean()), abs=1e-6)
    assert second["eval_bertscore_precision"] == pytest.approx(float(p.mean()), abs=1e-6)
    assert second["eval_bertscore_recall"] == pytest.approx(float(r.mean()), abs=1e-6)


def test_batch_eval_metrics_equal_one_call(tok, tiny_scorer):
    from transformers import EvalPrediction

    preds = np.array(tok(TARGETS[8:14][::-1], padding="max_length", max_length=40, truncation=True)["input_ids"])
    labels = np.array(tok(TARGETS[8:14], padding="max_length", max_length=40, truncation=True)["input_ids"])
    labels[labels == tok.pad_token_id] = -100
    whole = BERTScoreMetrics(tok, tiny_scorer, cache_bytes=0)(EvalPrediction(preds, labels))
    batched = BERTScoreMetrics(tok, tiny_scorer, cache_bytes=0)
    with pytest.raises(ValueError, match=r"callbacks=\[metrics\]"):  # no Trainer tells it where evaluations end
        batched(EvalPrediction(preds[:4], labels[:4]), compute_result=False)
    batched.reset()  # outside a Trainer: the caller marks the start of an evaluation
    assert batched(EvalPrediction(preds[:4], labels[:4]), compute_result=False) == {}
    out = batched(EvalPrediction(preds[4:], labels[4:]), compute_result=True)
    assert out == pytest.approx(whole, abs=1e-6)
    with pytest.raises(ValueError, match="predict_with_generate"):
        batched(EvalPrediction(np.zeros((2, 3, 5)), labels[:2]))


class _Endless:
    """A plain DataLoader wrapper (not prepared by accelerate): the Trainer never learns its last batch, so every
    batch is called with compute_result=False, as with a dataloader that never flags its end."""

    def __init__(self, loader) -> None:
        self.loader = loader
        self.dataset = loader.dataset
        self.batch_size = loader.batch_size

    def __iter__(self):
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)


@pytest.mark.slow
def test_batched_evaluation_that_stops_early_never_leaks(tmp_path, tok, tiny_bert_dir, caplog):
    from torch.utils.data import DataLoader
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    model = tiny_bart(tok)
    data = features(tok, SOURCES[:8], TARGETS[:8])
    collator = DataCollatorForSeq2Seq(tok, model=model)
    cut = {"on": True}

    class Trainer(Seq2SeqTrainer):
        def get_eval_dataloader(self, eval_dataset=None):
            loader = super().get_eval_dataloader(eval_dataset)
            if cut["on"]:
                return _Endless(DataLoader(data[:4], batch_size=2, collate_fn=collator))
            return loader

    args = training_args(tmp_path, predict_with_generate=True, generation_max_length=12, batch_eval_metrics=True)
    kw = dict(model=model, args=args, eval_dataset=data[4:8], data_collator=collator, processing_class=tok)

    # the plain compute_metrics: a batched evaluation is refused with the fix in its message, never silently summed
    trainer = Trainer(compute_metrics=BERTScoreMetrics(tok, fresh_scorer(tiny_bert_dir)), **kw)
    with pytest.raises(ValueError, match=r"callbacks=\[metrics\]"):
        trainer.evaluate()

    # as a callback too: the evaluation that stopped early is dropped, the next equals a fresh metric's
    metrics = BERTScoreMetrics(tok, fresh_scorer(tiny_bert_dir))
    trainer = Trainer(compute_metrics=metrics, callbacks=[metrics], **kw)
    with caplog.at_level("WARNING", logger="bertscore_loss.integrations.hf"):
        stopped = trainer.evaluate()
    assert "eval_bertscore_f1" not in stopped
    assert "its BERTScore sums were dropped" in caplog.text
    cut["on"] = False
    after = trainer.evaluate()
    fresh = BERTScoreMetrics(tok, fresh_scorer(tiny_bert_dir))
    clean = Trainer(compute_metrics=fresh, callbacks=[fresh], **kw).evaluate()
    assert after["eval_bertscore_f1"] == pytest.approx(clean["eval_bertscore_f1"], abs=1e-6)
    pred = trainer.predict(data[4:8])
    cands = decode_ids(pred.predictions, tok)
    refs = decode_ids([d["labels"] for d in data[4:8]], tok)
    f = fresh_scorer(tiny_bert_dir).score(cands, refs)[2]
    assert after["eval_bertscore_f1"] == pytest.approx(float(f.mean()), abs=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MBR_PROMPTS = ["a", "a", "b", "b", "c", "c"]


def _sharded_worker(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist
    from transformers import AutoTokenizer, EvalPrediction

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        preds = np.array(tok(SOURCES[:7], padding="max_length", max_length=48, truncation=True)["input_ids"])
        labels = np.array(tok(TARGETS[:7], padding="max_length", max_length=48, truncation=True)["input_ids"])
        metric = BERTScoreMetrics(tok, model=model_dir, layer=2, device="cpu")
        out = metric(EvalPrediction(preds, labels))  # every rank gets the gathered arrays, as in the Trainer
        # TRL's MBR reward: each rank holds a slice of the batch; the group of prompt "b" straddles the ranks
        mbr = MBRConsensusReward(metric.scorer)
        local = slice(3 * rank, 3 * rank + 3)
        rewards = mbr(prompts=MBR_PROMPTS[local], completions=SOURCES[:6][local])
        result = {"metrics": out, "stats": metric.stats, "mbr": rewards}
        Path(out_dir, f"{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_processes_sharded_metric_and_mbr_groups(tmp_path, tok, tiny_bert_dir):
    """Each of 2 ranks scores its strided shard and the all-reduced means equal one process's; the MBR
    reward (bertscore_loss.integrations.trl) gathers a group split over the ranks (one spawn for both)."""
    import torch.multiprocessing as mp

    mp.spawn(_sharded_worker, args=(2, _free_port(), tiny_bert_dir, str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    assert [r["stats"]["rows"] for r in results] == [4, 3] and results[0]["stats"]["world_size"] == 2
    assert results[0]["metrics"] == results[1]["metrics"]
    preds = tok(SOURCES[:7], padding="max_length", max_length=48, truncation=True)["input_ids"]
    labels = tok(TARGETS[:7], padding="max_length", max_length=48, truncation=True)["input_ids"]
    scorer = fresh_scorer(tiny_bert_dir)
    p, r, f = scorer.score(decode_ids(preds, tok), decode_ids(labels, tok))
    got = results[0]["metrics"]
    assert got["bertscore_f1"] == pytest.approx(float(f.mean()), abs=1e-6)
    assert got["bertscore_precision"] == pytest.approx(float(p.mean()), abs=1e-6)
    one_process = MBRConsensusReward(scorer)(prompts=MBR_PROMPTS, completions=SOURCES[:6])
    assert results[0]["mbr"] + results[1]["mbr"] == pytest.approx(one_process, abs=1e-6)


@pytest.mark.slow
def test_semantic_loss_decreases_and_stays_out_of_checkpoints(tmp_path, tok, tiny_bert_dir):
    from safetensors import safe_open
    from transformers import DataCollatorForSeq2Seq, Seq2SeqTrainer

    model = tiny_bart(tok)
    batch = features(tok, SOURCES[:4], TARGETS[:4], max_length=16)
    loss_func = SemanticLoss(tok, weight=1.0, model=tiny_bert_dir, layer=2, device="cpu", top_k=32)
    assert loss_func.criterion.bridge is None  # same vocabulary as the encoder: no bridge
    args = training_args(tmp_path, max_steps=4, learning_rate=1e-2, save_strategy="steps", save_steps=4)
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=batch,  # one batch of 4, repeated
        data_collator=DataCollatorForSeq2Seq(tok, model=model),
        compute_loss_func=loss_func,
        processing_class=tok,
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert 0.0 <= loss_func.last["f1"] <= 1.0 and loss_func.last["semantic"] > 0.0

    encoder_params = {id(p) for p in loss_func.criterion.encoder.parameters()}
    optimised = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert not encoder_params & {id(p) for p in optimised}
    assert sum(p.numel() for p in optimised) == sum(p.numel() for p in model.parameters())
    assert not any("scorer" in k or "criterion" in k for k in model.state_dict())

    ckpt = tmp_path / "checkpoint-4"
    with safe_open(str(ckpt / "model.safetensors"), "pt") as fh:
        keys = set(fh.keys())
        saved = sum(int(np.prod(fh.get_slice(k).get_shape())) for k in keys)
    assert keys <= set(model.state_dict())
    assert saved <= sum(t.numel() for t in model.state_dict().values())
    opt = torch.load(ckpt / "optimizer.pt", weights_only=False)
    opt_numel = sum(s["exp_avg"].numel() for s in opt["state"].values())
    assert opt_numel == sum(p.numel() for p in model.parameters())
    # no file holds the scorer: everything in the folder is the generator, its optimizer and small state
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    total = sum(f.stat().st_size for f in ckpt.rglob("*") if f.is_file())
    encoder_bytes = sum(p.numel() * p.element_size() for p in loss_func.criterion.encoder.parameters())
    assert total < 3 * model_bytes + (4 << 20) and encoder_bytes > (1 << 20)
    assert not any("bert" in f.name.lower() and f.suffix in (".bin", ".safetensors") for f in ckpt.rglob("*"))


@pytest.mark.slow
def test_semantic_loss_bridge_gradient_accumulation_and_bf16(tmp_path, tiny_roberta_dir, tiny_bert_dir):
    """A generator with another tokenizer (byte-level BPE) gets a VocabBridge; gradient accumulation splits
    give the full batch's gradient; a Trainer run with bf16 autocast and accumulation trains."""
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer

    gen_tok = AutoTokenizer.from_pretrained(tiny_roberta_dir)
    criterion = BERTScoreLoss(model=tiny_bert_dir, layer=2, device="cpu", reduction="none")
    loss_func = SemanticLoss(gen_tok, criterion, weight=0.5)
    assert loss_func.criterion.bridge is not None and loss_func.criterion.bridge.mode == "retokenize"

    model = tiny_bart(gen_tok)
    data = features(gen_tok, SOURCES[:4], TARGETS[:4], max_length=20)
    collate = DataCollatorForSeq2Seq(gen_tok, model=model)

    def grads(parts: list[list[dict]]) -> list[torch.Tensor]:
        model.eval()  # no dropout: the two runs must see the same function
        model.zero_grad()
        n_items = sum(sum(1 for t in d["labels"] if t != -100) for part in parts for d in part)
        for part in parts:
            inputs = collate(part)
            labels = inputs.pop("labels")
            loss_func(model(**inputs), labels, n_items).backward()  # the collator made decoder_input_ids
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    full, accumulated = grads([data]), grads([data[:2], data[2:]])
    for a, b in zip(full, accumulated):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)

    args = training_args(tmp_path, max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=2, bf16=True)
    dtypes = []  # accelerate runs the model's forward under bf16 autocast (logits come back as float32)
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: dtypes.append(out.dtype))
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collate,
        compute_loss_func=loss_func,
        processing_class=gen_tok,
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(np.isfinite(losses))
    hook.remove()
    assert dtypes == [torch.bfloat16] * 4  # 2 steps x 2 micro-batches
    assert 0.0 <= loss_func.last["f1"] <= 1.0
