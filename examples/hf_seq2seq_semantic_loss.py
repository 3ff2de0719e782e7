"""Fine-tune a seq2seq model with Seq2SeqTrainer on CE + λ·(1 − BERTScore F), evaluated with BERTScore.

    python examples/hf_seq2seq_semantic_loss.py --model /models/t5-small --max-steps 500   # a local folder
    python examples/hf_seq2seq_semantic_loss.py --smoke                                    # CI: tiny, 2 steps

Data: ``--train-sources``/``--train-targets`` (one text per line; default: the 20 MT outputs and their
references in ``examples/data``, i.e. learning to post-edit). The loss is ``SemanticLoss`` as the
Trainer's ``compute_loss_func`` (a ``VocabBridge`` is built when the generator's tokenizer is not the
scoring encoder's); the metric is ``bertscore_compute_metrics`` with ``predict_with_generate=True``.
``--smoke`` builds a 1+1-layer random BART over the bundled MiniLM tokenizer (no download).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BartConfig,
    BartForConditionalGeneration,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from bertscore_loss import BERTScorer, bundled_model_path
from bertscore_loss.integrations import SemanticLoss, bertscore_compute_metrics

DATA = Path(__file__).resolve().parent / "data"
logger = logging.getLogger("hf_seq2seq_semantic_loss")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="local seq2seq model folder (e.g. t5-small, bart-base)")
    ap.add_argument("--smoke", action="store_true", help="tiny random BART, 2 steps (CI)")
    ap.add_argument("--train-sources", default=str(DATA / "cands.txt"))
    ap.add_argument("--train-targets", default=str(DATA / "refs.txt"))
    ap.add_argument("--scorer-model", default=None, help="scoring encoder (default: bundled MiniLM)")
    ap.add_argument("--layer", type=int, default=None, help="scoring layer (default: the model's preset)")
    ap.add_argument("--weight", type=float, default=0.5, help="λ in CE + λ·(1 − F)")
    ap.add_argument("--top-k", type=int, default=64, help="soft candidates over the k most probable tokens")
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--bf16", action="store_true", help="bf16 mixed precision for the generator")
    ap.add_argument("--output-dir", default="runs/hf_seq2seq_semantic_loss")
    args = ap.parse_args(argv)
    if not args.smoke and not args.model:
        ap.error("pass --model FOLDER (or --smoke)")
    if args.smoke:
        args.max_steps, args.batch_size, args.lr = 2, 4, 1e-3
    return args


def tiny_bart(tokenizer) -> BartForConditionalGeneration:
    """A 1+1-layer random BART over ``tokenizer`` (a WordPiece tokenizer: [CLS] starts, [SEP] ends)."""
    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(cfg)


def main(argv: list[str] | None = None) -> dict[str, float | str]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.smoke:
        tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
        model = tiny_bart(tokenizer)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForSeq2SeqLM.from_pretrained(args.model)
    sources = Path(args.train_sources).read_text(encoding="utf-8").splitlines()
    targets = Path(args.train_targets).read_text(encoding="utf-8").splitlines()
    enc = tokenizer(sources, truncation=True, max_length=64)
    lab = tokenizer(text_target=targets, truncation=True, max_length=64)
    data = [
        {"input_ids": i, "attention_mask": a, "labels": t}
        for i, a, t in zip(enc["input_ids"], enc["attention_mask"], lab["input_ids"])
    ]
    if args.smoke:
        data = data[:8]
    dev = data[: max(4, len(data) // 5)]

    # One scorer (and one frozen encoder) for both the loss and the metric; neither is part of `model`.
    scorer = BERTScorer(model=args.scorer_model, layer=args.layer, cache_bytes=256 << 20)
    loss_func = SemanticLoss(tokenizer, scorer=scorer, weight=args.weight, top_k=args.top_k, reduction="none")
    metrics = bertscore_compute_metrics(tokenizer, scorer, signature=True)
    training_args = Seq2SeqTrainingArguments(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.lr,
        bf16=args.bf16,
        predict_with_generate=True,
        generation_max_length=64 if not args.smoke else 12,
        logging_steps=1 if args.smoke else 10,
        save_strategy="no" if args.smoke else "steps",
        report_to=[],
        use_cpu=args.smoke,
        disable_tqdm=args.smoke,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=data,
        eval_dataset=dev,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_loss_func=loss_func,
        compute_metrics=metrics,
        processing_class=tokenizer,
    )
    trainer.train()
    result = trainer.evaluate()
    logger.info("last training batch: %s", loss_func.last)
    for key in ("eval_loss", "eval_bertscore_precision", "eval_bertscore_recall", "eval_bertscore_f1"):
        print(f"{key}\t{result[key]:.4f}")
    print(result["eval_bertscore_signature"])
    return result


if __name__ == "__main__":
    main()
