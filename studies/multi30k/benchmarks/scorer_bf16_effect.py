"""What a bfloat16 frozen scorer changes in the Multi30k stage-2 objectives (``scorer_dtype=bfloat16``).

On the stage-2 batches of seed 0 (``--batch-tokens``), with the generator of ``--model``:

* ``mrt``: ``k`` ancestral samples per source (``FineTuner.sample``) scored against the references by
  ``MinimumRiskLoss`` with an fp32 and a bf16 ``BERTScorer``: the utilities (F), the expected risk and its
  gradient w.r.t. the samples' log-probabilities (random log-probabilities, the same for both);
* ``bertscore``: ``BERTScoreLoss`` (the recipe's settings) on the teacher-forced logits under the run's
  ``bf16-mixed`` autocast, with an fp32 encoder (autocast casts its weights) and a bf16 one (same Gumbel
  noise): F and the gradient w.r.t. the logits.

Also times the scoring call (fp32 vs bf16). Run with one thread:

    OMP_NUM_THREADS=1 python studies/multi30k/benchmarks/scorer_bf16_effect.py --threads 1 --model models/multi30k-de-en
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "studies" / "multi30k"))
import nmt  # noqa: E402
import recipe  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402
from rerank.sampling import native_bf16  # noqa: E402


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "studies" / "multi30k" / "configs" / "stage2.yaml"))
    parser.add_argument("--model", required=True, help="generator folder (HF + spm.model)")
    parser.add_argument("--batch-tokens", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None, help="JSON file (default: runs/scorer-bf16-effect.json)")
    add_overwrite_argument(parser)
    args = parser.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": args.json is not None, "flag": "--json"}
    args.json = args.json or str(ROOT / "runs" / "scorer-bf16-effect.json")
    check_outputs_or_exit(parser, [args.json], **rules)
    torch.set_num_threads(args.threads)
    if not native_bf16("cpu"):
        print("note: this CPU has no native bf16: the bf16 scorer is emulated (slow) here", file=sys.stderr)
    from bertscore_loss import BERTScoreLoss, BERTScorer, MinimumRiskLoss, VocabBridge

    cfg = recipe.load_config(recipe.Stage2Config, args.config, {"batch_tokens": args.batch_tokens})
    model_dir = Path(args.model)
    model, sp = recipe.load_model(model_dir)
    train = nmt.PairData(sp, *nmt.read_pairs(recipe.resolve(cfg.data), "train"), cfg.max_len)
    val = nmt.PairData(sp, *nmt.read_pairs(recipe.resolve(cfg.data), "val", 8), cfg.max_len)
    scorers = {name: BERTScorer(dtype=name) for name in ("float32", "bfloat16")}
    risks = {name: MinimumRiskLoss(scorer=s, alpha=cfg.alpha) for name, s in scorers.items()}
    bridge = VocabBridge(model_dir / "spm.model", scorers["float32"].encoder, vocab_size=sp.get_piece_size())
    losses = {
        name: BERTScoreLoss(
            scorer=s,
            bridge=bridge,
            max_mode=cfg.max_mode,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            gumbel=cfg.gumbel,
            reduction="none",
        )
        for name, s in scorers.items()
    }
    module = nmt.FineTuner(model, sp, cfg.train, val, "bf16-mixed", "mrt", samples=cfg.samples)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16("cpu"))
    f_diff, risk_diff, grad_cos, rank_same, seconds = [], [], [], [], {n: 0.0 for n in scorers}
    bs_f_diff, bs_grad_cos = [], []
    torch.manual_seed(0)
    for i, batch in enumerate(train.loader(cfg.batch_tokens, True, 1000 + cfg.seed)):
        if i == args.batches:
            break
        refs = [train.tgt_text[j] for j in batch["index"].tolist()]
        with autocast:
            _, texts, _ = module.sample(batch)
        n, k = len(texts), cfg.samples
        lp = torch.randn(n, k, dtype=torch.float64) * 3
        out = {}
        for name, risk in risks.items():
            x = lp.clone().requires_grad_(True)
            risk.scorer.encoder.cache.clear()
            t0 = time.perf_counter()
            res = risk(x, texts, refs)
            seconds[name] += time.perf_counter() - t0
            res.loss.backward()
            out[name] = (res.utility, res.loss.detach(), x.grad)
        u32, u16 = out["float32"][0], out["bfloat16"][0]
        real = ~torch.isnan(u32)
        f_diff.append((u32 - u16)[real].abs())
        risk_diff.append(float((out["float32"][1] - out["bfloat16"][1]).abs()))
        grad_cos.append(cosine(out["float32"][2], out["bfloat16"][2]))
        rank_same.append(float((u32.nan_to_num(-1).argmax(1) == u16.nan_to_num(-1).argmax(1)).double().mean()))
        model.eval()
        with torch.no_grad(), autocast:
            logits = nmt.ce_pass(model, batch, 0.0)[1]
        model.train()
        labels = batch["labels"]
        words = (labels != -100) & (labels != nmt.EOS)
        res2 = {}
        for name, loss in losses.items():
            x = logits.float().clone().requires_grad_(True)
            torch.manual_seed(100 + i)
            with autocast:
                o = loss(x, refs, words)
            o.loss.sum().backward()
            res2[name] = (o.f1.detach().float(), x.grad)
        bs_f_diff.append((res2["float32"][0] - res2["bfloat16"][0]).abs())
        bs_grad_cos.append(cosine(res2["float32"][1], res2["bfloat16"][1]))
    f_all, bs_all = torch.cat(f_diff), torch.cat(bs_f_diff)
    result = {
        "cpu": nmt.cpu_label(),
        "model": str(model_dir),
        "batches": args.batches,
        "batch_tokens": args.batch_tokens,
        "mrt": {
            "samples_scored": int(f_all.numel()),
            "utility_abs_diff_mean": float(f_all.mean()),
            "utility_abs_diff_max": float(f_all.max()),
            "expected_risk_abs_diff_max": max(risk_diff),
            "risk_gradient_cosine_min": min(grad_cos),
            "same_best_sample_share": sum(rank_same) / len(rank_same),
            "scoring_seconds": seconds,
        },
        "bertscore": {
            "f_abs_diff_mean": float(bs_all.mean()),
            "f_abs_diff_max": float(bs_all.max()),
            "logit_gradient_cosine_min": min(bs_grad_cos),
        },
    }
    write_text(args.json, json.dumps(result, indent=1) + "\n", **rules)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
