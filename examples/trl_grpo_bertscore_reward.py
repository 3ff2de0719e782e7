"""GRPO (TRL) with a BERTScore reward against a reference column, plus an optional MBR-consensus reward.

    pip install -e ".[trl]"
    python examples/trl_grpo_bertscore_reward.py --model /models/Qwen2.5-0.5B-Instruct --max-steps 200
    python examples/trl_grpo_bertscore_reward.py --smoke          # CI: tiny random causal LM, 2 steps

Data: prompts "Rewrite in fluent English: <MT output>" with the human reference as the ``reference``
column (``examples/data``, 20 pairs; ``--sources``/``--targets`` for your own). ``BERTScoreReward``
reads that column (TRL passes every dataset column to reward functions); ``--mbr`` adds
``MBRConsensusReward``, which needs no reference: each completion's mean BERTScore against the other
completions of its prompt. ``--chat`` builds conversational prompts (then the assistant text is scored).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel
from trl import GRPOConfig, GRPOTrainer

from bertscore_loss import BERTScorer, bundled_model_path
from bertscore_loss.integrations import BERTScoreReward, MBRConsensusReward

DATA = Path(__file__).resolve().parent / "data"
logger = logging.getLogger("trl_grpo_bertscore_reward")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="local causal LM folder")
    ap.add_argument("--smoke", action="store_true", help="tiny random GPT-2 over the bundled tokenizer, 2 steps")
    ap.add_argument("--sources", default=str(DATA / "cands.txt"))
    ap.add_argument("--targets", default=str(DATA / "refs.txt"))
    ap.add_argument("--chat", action="store_true", help="conversational prompts (the model needs a chat template)")
    ap.add_argument("--mbr", action="store_true", help="add the reference-free MBR-consensus reward")
    ap.add_argument("--rescale", action="store_true", help="rescale with the scoring model's baseline")
    ap.add_argument("--scorer-model", default=None, help="scoring encoder (default: bundled MiniLM)")
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=8, help="completions per device and step")
    ap.add_argument("--max-completion-length", type=int, default=64)
    ap.add_argument("--max-steps", type=int, default=100)
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--output-dir", default="runs/trl_grpo_bertscore_reward")
    args = ap.parse_args(argv)
    if not args.smoke and not args.model:
        ap.error("pass --model FOLDER (or --smoke)")
    if args.smoke:
        args.max_steps, args.batch_size, args.num_generations, args.max_completion_length = 2, 4, 2, 8
        args.lr, args.mbr = 1e-3, True
    return args


def tiny_causal_lm(tokenizer) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=16,
        n_layer=1,
        n_head=2,
        n_positions=512,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(cfg)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.smoke:
        tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
        tokenizer.eos_token = tokenizer.sep_token  # a WordPiece tokenizer has no EOS of its own
        model = tiny_causal_lm(tokenizer)
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model)
    sources = Path(args.sources).read_text(encoding="utf-8").splitlines()
    targets = Path(args.targets).read_text(encoding="utf-8").splitlines()
    if args.smoke:
        sources = [" ".join(s.split()[:8]) for s in sources[:4]]
        targets = targets[:4]
    prompts: list = [f"Rewrite in fluent English: {s}" for s in sources]
    if args.chat:
        prompts = [[{"role": "user", "content": p}] for p in prompts]
    dataset = Dataset.from_dict({"prompt": prompts, "reference": targets})

    scorer = BERTScorer(model=args.scorer_model, layer=args.layer, rescale=args.rescale)
    reward_funcs = [BERTScoreReward("reference", scorer)]
    if args.mbr:  # shares the scorer (one encoder in memory)
        reward_funcs.append(MBRConsensusReward(scorer, num_generations=args.num_generations))
    config = GRPOConfig(
        output_dir=args.output_dir,
        per_device_train_batch_size=args.batch_size,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_steps=args.max_steps,
        learning_rate=args.lr,
        logging_steps=1,
        report_to=[],
        use_cpu=args.smoke,
        bf16=False if args.smoke else torch.cuda.is_available(),
        save_strategy="no" if args.smoke else "steps",
        disable_tqdm=args.smoke,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=reward_funcs, args=config, train_dataset=dataset, processing_class=tokenizer
    )
    trainer.train()
    logs = [h for h in trainer.state.log_history if "rewards/bertscore/mean" in h]
    for h in logs:
        mbr = f"\tbertscore_mbr {h['rewards/bertscore_mbr/mean']:.4f}" if "rewards/bertscore_mbr/mean" in h else ""
        print(f"step {h['step']}\tbertscore {h['rewards/bertscore/mean']:.4f}{mbr}")
    return logs


if __name__ == "__main__":
    main()
