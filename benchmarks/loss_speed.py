"""Speed of the differentiable loss against the evaluation-mode forward on the same batch.

    python benchmarks/loss_speed.py [--batch 32] [--length 24] [--repeats 5] [--threads N]

Candidates: B random logit tensors ``[B, T, V]`` over the bundled MiniLM's 30,522-token vocabulary;
references: real WMT16 de-en references. Prints time per batch, candidate tokens/s and the ratio to
the evaluation-mode forward (hard token ids, no gradient) for the loss forward+backward with dense
soft embeddings (``probs @ E``) and with ``top_k`` soft embeddings. References are cached (as in
training after the first epoch). The compute floor of forward+backward is about 3x a forward pass.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bertscore_loss import BERTScorer
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_speed import best_time  # noqa: E402  (one timer for all benchmarks)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def fastest(fn: Callable[[], Any], repeats: int) -> float:
    """Best seconds of ``repeats`` timed calls after one warm-up (the shared ``eval_speed.best_time``)."""
    return best_time(fn, repeats)[0][0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=24)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args()
    rules = {"overwrite": args.overwrite, "allow_docs": True, "flag": "--json"}  # --json is always explicit
    check_outputs_or_exit(ap, [args.json] if args.json else [], **rules)
    if args.threads:
        torch.set_num_threads(args.threads)
    refs = (DATA / "wmt16-daseg" / "DAseg.newstest2016.reference.de-en").read_text().splitlines()[: args.batch]
    scorer = BERTScorer(layer=args.layer, device="cpu")
    vocab = scorer.encoder.vocab_size
    torch.manual_seed(0)
    logits = torch.randn(args.batch, args.length, vocab)
    ids = logits.argmax(-1)
    tokens = args.batch * args.length

    hard = BERTScoreLoss(scorer=scorer, max_mode="hard")
    dense = BERTScoreLoss(scorer=scorer, max_mode="straight_through", top_k=None)
    topk = BERTScoreLoss(scorer=scorer, max_mode="straight_through", top_k=args.top_k)
    hard(ids, refs)  # fills the reference cache

    def eval_forward() -> None:
        with torch.inference_mode():
            hard(ids, refs)

    def train_step(module: BERTScoreLoss) -> None:
        x = logits.clone().requires_grad_(True)
        module(x, refs).loss.backward()

    rows = {
        "evaluation forward (token ids, no grad)": fastest(eval_forward, args.repeats),
        "loss fwd+bwd, dense probs @ E": fastest(lambda: train_step(dense), args.repeats),
        f"loss fwd+bwd, top-{args.top_k}": fastest(lambda: train_step(topk), args.repeats),
    }
    base = rows["evaluation forward (token ids, no grad)"]
    print(f"batch {args.batch} x {args.length} tokens, vocab {vocab}, {scorer.signature()}")
    print(f"torch threads: {torch.get_num_threads()}")
    print("| path | ms / batch | candidate tokens/s | × evaluation forward |")
    print("| --- | --- | --- | --- |")
    for name, sec in rows.items():
        print(f"| {name} | {1000 * sec:.1f} | {tokens / sec:,.0f} | {sec / base:.2f} |")
    if args.json:
        write_text(args.json, json.dumps({k: v for k, v in rows.items()}, indent=2), **rules)


if __name__ == "__main__":
    main()
