"""Why semantic fine-tuning of a converged generator barely moves its F: diagnostics on one training batch.

On the first stage-2 batch of seed 0 (``--batch-tokens`` rows × longest side) of ``--model`` (default the
committed converged base), float32, one thread:

* **candidates**: BERTScore F (bundled MiniLM, the reporting scorer) of the greedy output, and the mean and
  best-of-k F of k ancestral samples at temperature 1 (what the published ``mrt`` runs trained on) and of k
  epsilon samples (ε 0.02, what MBR ranks), against the references;
* **gradient noise**: the cosine between the gradients (all generator weights) of the semantic term alone from
  two independent draws on the same rows: ``mrt`` with ancestral and with epsilon candidates, and the
  ``bertscore`` arm with Gumbel-softmax samples at τ 1 (the published runs) and τ 0.1 (BERTTune); and the
  cosine of each with the CE gradient (how much of it only repeats CE).

    OMP_NUM_THREADS=1 python studies/multi30k/benchmarks/teacher_diagnostics.py --threads 1

Prints a table and writes a JSON (``--json``, default ``runs/teacher-diagnostics.json``) labelled with the CPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "studies" / "multi30k"))


def build_parser() -> argparse.ArgumentParser:
    from bertscore_loss.outputs import add_overwrite_argument

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/multi30k-de-en")
    p.add_argument("--config", default="studies/multi30k/configs/stage2-teacher.yaml")
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--rows", type=int, default=32, help="sources of the batch used (the first N; default 32)")
    p.add_argument("--k", type=int, default=8, help="candidates per source (default 8)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="runs/teacher-diagnostics.json")
    add_overwrite_argument(p)
    return p


def flat_grad(module, loss) -> torch.Tensor:
    module.model.zero_grad(set_to_none=True)
    loss.backward()
    return torch.cat([p.grad.reshape(-1) for p in module.model.parameters() if p.grad is not None])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=0))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from bertscore_loss.outputs import check_outputs_or_exit, write_text

    out = ROOT / args.json
    check_outputs_or_exit(build_parser(), [out], overwrite=args.overwrite)
    torch.set_num_threads(args.threads)
    import nmt
    import recipe

    from bertscore_loss import BERTScorer

    model_dir = ROOT / args.model
    cfg = recipe.load_config(recipe.Stage2Config, str(ROOT / args.config), {"precision": "32-true"})
    cfg = dataclasses.replace(cfg, batch_tokens=args.batch_tokens, samples=args.k, mbr_data=None)
    _, sp = recipe.load_model(model_dir)
    data = recipe.resolve(cfg.data)
    train = nmt.PairData(sp, *nmt.read_pairs(data, "train"), cfg.max_len)
    val = nmt.PairData(sp, *nmt.read_pairs(data, "val", 4), cfg.max_len)
    first = next(iter(train.step_loader(cfg.batch_tokens, 1000 + cfg.seed, 1)))
    batch = train.collate(first["index"][: args.rows].tolist())
    refs = [train.tgt_text[i] for i in batch["index"].tolist()]
    scorer = BERTScorer()
    t0 = time.perf_counter()

    def f(texts: list[str], references: list[str]) -> torch.Tensor:
        return scorer.score(texts, references).f1 * 100

    def tuner(arm: str, **settings):
        c = dataclasses.replace(cfg, arm=arm, **settings)
        model, _ = recipe.load_model(model_dir)
        module = recipe.fine_tuner(c, model, sp, model_dir, train, val, "32-true")
        module.log = lambda *a, **k: None
        module.model.train()
        return module

    result: dict = {"cpu": nmt.cpu_label(), "threads": args.threads, "rows": len(refs), "k": args.k}
    probe = tuner("mrt", mrt_candidates="ancestral")
    greedy = nmt.translate(probe.model, sp, [train.src_text[i] for i in batch["index"].tolist()], beams=1)
    result["greedy_f"] = float(f(greedy, refs).mean())
    for kind in ("ancestral", "epsilon"):
        probe.mrt_candidates = kind
        torch.manual_seed(1)
        _, texts, _ = probe.sample(batch)
        scores = f([t for ts in texts for t in ts], [r for r in refs for _ in range(args.k)]).view(len(refs), args.k)
        result[f"{kind}_mean_f"] = float(scores.mean())
        result[f"{kind}_best_of_k_f"] = float(scores.max(dim=1).values.mean())
    ce_module = tuner("ce")
    ce_grad = flat_grad(ce_module, ce_module.training_step(batch, 0))
    arms = {
        "mrt ancestral (published)": ("mrt", {"mrt_candidates": "ancestral", "mrt_dropout": True}),
        "mrt epsilon, no dropout": ("mrt", {"mrt_candidates": "epsilon", "mrt_dropout": False}),
        "bertscore Gumbel tau 1 (published)": ("bertscore", {"logit_temperature": 1.0}),
        "bertscore Gumbel tau 0.1 (BERTTune)": ("bertscore", {"logit_temperature": 0.1}),
    }
    for label, (arm, settings) in arms.items():
        grads = []
        for draw in range(2):
            module = tuner(arm, ce_weight=0.0, weight=1.0, **settings)
            module.row_seed = draw  # epsilon candidates are seeded by (row_seed, update)
            torch.manual_seed(100 + draw)  # ancestral samples, Gumbel noise, dropout
            grads.append(flat_grad(module, module.training_step(batch, 0)))
        result[label] = {
            "draw_cosine": cosine(grads[0], grads[1]),
            "ce_cosine": (cosine(grads[0], ce_grad) + cosine(grads[1], ce_grad)) / 2,
        }
    result["seconds"] = time.perf_counter() - t0
    print(f"{result['cpu']}, {args.threads} thread(s), {len(refs)} sources, k = {args.k}")
    print(f"greedy F {result['greedy_f']:.2f}")
    for kind in ("ancestral", "epsilon"):
        mean, best = result[f"{kind}_mean_f"], result[f"{kind}_best_of_k_f"]
        print(f"{kind:>9} samples: mean F {mean:.2f}, best of {args.k} {best:.2f}")
    print("| semantic term | cosine of two draws | cosine with CE |\n| --- | ---: | ---: |")
    for label in arms:
        print(f"| {label} | {result[label]['draw_cosine']:+.3f} | {result[label]['ce_cosine']:+.3f} |")
    write_text(out, json.dumps(result, indent=1) + "\n", overwrite=args.overwrite)


if __name__ == "__main__":
    main()
