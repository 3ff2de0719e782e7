"""Speed of the Trainer / TRL integrations, as ratios measured in one run.

1. Second evaluation: ``BERTScoreMetrics`` (one resident scorer, reference cache) on an evaluation set
   whose predictions change between evaluations, against the same metric without the cache.
2. Reward throughput (completions/s): ``BERTScoreReward`` over GRPO-shaped batches (prompts x G
   completions, the prompts cycling over a small dataset so references recur), against calling
   ``bert-score`` per batch: ``bert_score.score(...)`` (loads the model every call, as a naive reward
   function does) and a resident ``bert_score.BERTScorer(...).score(...)``.

    python benchmarks/integrations_speed.py                 # STS-B dev from ../shared/data, else examples/data
    python benchmarks/integrations_speed.py --quick         # small sizes

Writes ``runs/integrations-speed.json`` (``--out docs/results/speed/integrations-speed.json --overwrite`` replaces the
published one). All runs use the bundled MiniLM at layer 4 in float32.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from eval_speed import cpu_model, quiet  # noqa: E402

from bertscore_loss.machine import cpu_bf16_flags, cpu_flags  # noqa: E402
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402


def load_texts(limit: int) -> tuple[list[str], list[str]]:
    stsb = ROOT.parent / "shared" / "data" / "stsb" / "stsb-en-dev.csv"
    if stsb.is_file():
        with open(stsb, encoding="utf-8", newline="") as fh:
            rows = list(csv.reader(fh))[:limit]
        return [r[0] for r in rows], [r[1] for r in rows]
    a = (ROOT / "examples" / "data" / "cands.txt").read_text(encoding="utf-8").splitlines()
    b = (ROOT / "examples" / "data" / "refs.txt").read_text(encoding="utf-8").splitlines()
    return a[:limit], b[:limit]


def timed(fn: Callable[[], object], repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def padded(tok, texts: list[str], pad: int) -> np.ndarray:
    ids = tok(texts, truncation=True, max_length=128)["input_ids"]
    width = max(len(r) for r in ids)
    return np.array([r + [pad] * (width - len(r)) for r in ids])


def second_evaluation(tok, n: int, repeats: int) -> dict:
    from transformers import EvalPrediction

    from bertscore_loss import BERTScorer
    from bertscore_loss.encoder import FrozenEncoder
    from bertscore_loss.integrations import BERTScoreMetrics

    preds_a, refs = load_texts(n)
    preds_b = [p.lower() for p in preds_a]  # "the model changed": new predictions, same references
    labels = padded(tok, refs, -100)
    first, second = EvalPrediction(padded(tok, preds_a, 0), labels), EvalPrediction(padded(tok, preds_b, 0), labels)
    out: dict = {"rows": len(refs)}
    for name, cache in (("cache", 256 << 20), ("no_cache", 0)):
        # each run its own encoder: a scorer built from fields may share a loaded encoder (and its cache)
        metric = BERTScoreMetrics(tok, BERTScorer(encoder=FrozenEncoder(layer=4, device="cpu")), cache_bytes=cache)
        assert metric.scorer.encoder.cache.max_bytes == cache
        metric(EvalPrediction(padded(tok, ["warm up the encoder"], 0), padded(tok, ["warm up"], -100)))
        out[f"{name}_first_s"] = timed(lambda m=metric: m(first))
        times = []
        for k in range(repeats):  # alternate the predictions so each timed call has new ones to encode
            batch = second if k % 2 == 0 else first
            if cache:
                metric.scorer.encoder.cache.clear()
                metric(EvalPrediction(batch.label_ids, batch.label_ids))  # references cached, as after eval 1
            times.append(timed(lambda m=metric, b=batch: m(b)))
            out[f"{name}_texts_encoded"] = metric.stats["texts_encoded"]
        out[f"{name}_second_s"] = min(times)
    out["speedup_second_vs_no_cache"] = out["no_cache_second_s"] / out["cache_second_s"]
    return out


def reward_throughput(n_prompts: int, per_step: int, group: int, steps: int, per_call_steps: int) -> dict:
    import bert_score

    from bertscore_loss import BERTScorer, bundled_model_path
    from bertscore_loss.encoder import FrozenEncoder
    from bertscore_loss.integrations import BERTScoreReward

    sources, refs = load_texts(n_prompts * group)
    prompts = list(range(n_prompts))
    batches = []
    for s in range(steps):
        ids = [prompts[(s * per_step + i) % n_prompts] for i in range(per_step)]
        comps = [sources[(p * group + g) % len(sources)] for p in ids for g in range(group)]
        batches.append((comps, [refs[p] for p in ids for _ in range(group)]))
    n = sum(len(c) for c, _ in batches)
    path = bundled_model_path()
    reward = BERTScoreReward("reference", BERTScorer(encoder=FrozenEncoder(layer=4, device="cpu")))
    reward(["w"], ["warm up"], reference=["warm up the encoder"])
    ours = timed(lambda: [reward(["p"] * len(c), c, reference=r) for c, r in batches])
    resident = bert_score.BERTScorer(model_type=path, num_layers=4, device="cpu")
    resident.score(["warm up"], ["warm up the encoder"])
    theirs = timed(lambda: [resident.score(c, r) for c, r in batches])
    k = min(per_call_steps, steps)
    per_call = timed(
        lambda: [bert_score.score(c, r, model_type=path, num_layers=4, device="cpu") for c, r in batches[:k]]
    )
    m = sum(len(c) for c, _ in batches[:k])
    got = torch.tensor(reward(["p"] * len(batches[0][0]), batches[0][0], reference=batches[0][1]))
    diff = float((got - resident.score(*batches[0])[2]).abs().max())
    return {
        "completions": n,
        "batch": per_step * group,
        "steps": steps,
        "dataset_prompts": n_prompts,
        "ours_completions_per_s": n / ours,
        "bert_score_resident_completions_per_s": n / theirs,
        "bert_score_per_call_completions_per_s": m / per_call,
        "ratio_vs_resident": theirs / ours,
        "ratio_vs_per_call": (per_call / m) / (ours / n),
        "max_abs_diff_f_vs_bert_score": diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--out", default=None, help="JSON file (default: runs/integrations-speed.json; docs/ only when given)"
    )
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    args.out = args.out or str(ROOT / "runs" / "integrations-speed.json")
    check_outputs_or_exit(ap, [args.out], **rules)
    quiet()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from bertscore_loss import bundled_model_path

    tok = AutoTokenizer.from_pretrained(bundled_model_path())
    load = subprocess.run(["cat", "/proc/loadavg"], capture_output=True, text=True).stdout.strip()
    env = {
        "cpu": cpu_model(),
        "bf16_flags": "unknown" if cpu_flags() is None else ",".join(sorted(cpu_bf16_flags())) or "none",
        "threads": args.threads,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "bert_score": version("bert-score"),
        "loadavg_at_start": load,
        "note": "a background training job ran on the machine: compare the ratios, measured in the same run",
    }
    print(f"# {env['cpu']} | bf16 flags: {env['bf16_flags']} | {args.threads} thread(s) | load {load}")
    evaluation = second_evaluation(tok, 64 if args.quick else 500, 2 if args.quick else 3)
    print(
        f"second evaluation ({evaluation['rows']} rows, new predictions): {evaluation['cache_second_s']:.2f} s with "
        f"the reference cache vs {evaluation['no_cache_second_s']:.2f} s without -> "
        f"{evaluation['speedup_second_vs_no_cache']:.2f}x (first evaluation {evaluation['cache_first_s']:.2f} s; "
        f"texts encoded in the second: {evaluation['cache_texts_encoded']} vs {evaluation['no_cache_texts_encoded']})"
    )
    rewards = reward_throughput(8 if args.quick else 32, 4 if args.quick else 16, 4, 4 if args.quick else 8, 2)
    print(
        f"reward ({rewards['batch']} completions per batch, {rewards['steps']} steps): "
        f"BERTScoreReward {rewards['ours_completions_per_s']:.0f}/s, "
        f"bert-score resident {rewards['bert_score_resident_completions_per_s']:.0f}/s "
        f"({rewards['ratio_vs_resident']:.2f}x), bert_score.score per batch "
        f"{rewards['bert_score_per_call_completions_per_s']:.1f}/s ({rewards['ratio_vs_per_call']:.1f}x); "
        f"max |F - bert-score| {rewards['max_abs_diff_f_vs_bert_score']:.1e}"
    )
    write_text(
        args.out, json.dumps({"env": env, "evaluation": evaluation, "reward": rewards}, indent=2) + "\n", **rules
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
