"""Samples per second: ``rerank.sample_ids`` against plain ``model.generate(num_return_sequences=n)``.

Same model (a Multi30k Marian folder with ``spm.model``, as ``studies/multi30k`` writes it), same
sources, same epsilon sampling (``epsilon_cutoff`` / ``SamplingConfig.epsilon``, ``top_k=0``). Systems,
timed in alternating rounds in one process (the best round of each is kept):

* ``generate``: ``model.generate(do_sample=True, num_return_sequences=n)`` in the recipe's batches
  (``nmt.translate``: length-sorted, ``--budget`` source tokens × n per batch), no scores;
* ``generate + scores``: the same with ``output_scores=True, output_logits=True,
  return_dict_in_generate=True`` (what sequence scores for MBR need; ``rerank.generate_and_rerank``);
* ``sample_ids float32`` and ``sample_ids bf16`` (bf16 autocast; on a CPU without native bf16 it is
  emulated and slow, the row says so).

    python studies/multi30k/benchmarks/sampling_speed.py --model runs/mbr/model --sources 32 --n 64 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "studies" / "multi30k"))
from eval_speed import cpu_model, quiet  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=Path, help="HF Marian folder with spm.model")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "multi30k")
    ap.add_argument("--split", default="val")
    ap.add_argument("--sources", type=int, default=32)
    ap.add_argument("--n", type=int, default=64, help="samples per source")
    ap.add_argument("--epsilon", type=float, default=0.02)
    ap.add_argument("--rounds", type=int, default=2, help="alternating timed rounds (best kept)")
    ap.add_argument("--budget", type=int, default=6000, help="nmt.translate batch budget (source tokens x n)")
    ap.add_argument("--token-budget", type=int, default=65536, help="sample_ids rows x tokens per batch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": True, "flag": "--json"}  # --json is always explicit
    check_outputs_or_exit(ap, [args.json] if args.json else [], **rules)
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    import nmt
    import sentencepiece as spm
    from transformers import MarianMTModel

    from rerank import SamplingConfig, sample_ids
    from rerank.sampling import native_bf16

    model = MarianMTModel.from_pretrained(args.model).eval()
    sp = spm.SentencePieceProcessor(model_file=str(args.model / "spm.model"))
    sources, _ = nmt.read_pairs(args.data, args.split, args.sources)
    ids = [s[:127] + [nmt.EOS] for s in sp.encode(sources)]
    n, eps = args.n, args.epsilon
    total = len(sources) * n

    def plain(scores: bool) -> int:
        kwargs: dict[str, Any] = {}
        if scores:
            kwargs = {"output_scores": True, "output_logits": True, "return_dict_in_generate": True}
        out = 0
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and len(ids[order[end]]) * (end - start + 1) * n <= args.budget:
                end += 1
            x = nmt.pad([ids[i] for i in order[start:end]])
            with torch.no_grad():
                gen = model.generate(
                    input_ids=x,
                    attention_mask=x != nmt.PAD,
                    do_sample=True,
                    top_k=0,
                    epsilon_cutoff=eps,
                    num_beams=1,
                    num_return_sequences=n,
                    max_new_tokens=int(x.shape[1] * 1.5) + 10,
                    **kwargs,
                )
            out += int((gen.sequences if scores else gen).shape[0])
            start = end
        return out

    def ours(precision: str) -> int:
        cfg = SamplingConfig(num_samples=n, epsilon=eps, precision=precision, token_budget=args.token_budget)  # type: ignore[arg-type]
        return sum(len(q) for q in sample_ids(model, ids, cfg).sequences)

    native = native_bf16("cpu")
    systems = {
        "generate": lambda: plain(False),
        "generate + scores": lambda: plain(True),
        "sample_ids float32": lambda: ours("32"),
        "sample_ids bf16" + ("" if native else " (emulated: no native bf16)"): lambda: ours("bf16"),
    }
    best: dict[str, float] = {k: float("inf") for k in systems}
    for fn in systems.values():  # warm-up
        torch.manual_seed(0)
        fn()
    for _ in range(args.rounds):
        for name, fn in systems.items():
            torch.manual_seed(0)
            t0 = time.perf_counter()
            made = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
            assert made == total, (name, made, total)
    flags = sorted({"avx512_bf16", "amx_bf16"} & set(Path("/proc/cpuinfo").read_text().split()))
    print(
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs, bf16 flags: {', '.join(flags) or 'none'}) "
        f"| torch {torch.__version__} | threads {torch.get_num_threads()}"
    )
    print(
        f"model: {args.model} | {len(sources)} {args.split} sources x {n} samples (epsilon {eps}) | "
        f"best of {args.rounds} alternating rounds after a warm-up"
    )
    print()
    print("| system | seconds | samples/s | vs generate |")
    print("|---|---:|---:|---:|")
    rows = []
    for name, t in best.items():
        row = {"system": name, "seconds": t, "samples_per_s": total / t, "speedup": best["generate"] / t}
        rows.append(row)
        print(f"| {name} | {t:.2f} | {row['samples_per_s']:.0f} | {row['speedup']:.2f}x |")
    if args.json:
        env = {"cpu": cpu_model(), "bf16_flags": flags, "threads": torch.get_num_threads(), "torch": torch.__version__}
        write_text(
            args.json,
            json.dumps(
                {
                    "env": env,
                    "config": vars(args) | {"model": str(args.model), "data": str(args.data), "json": str(args.json)},
                    "rows": rows,
                },
                indent=1,
            ),
            **rules,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
