"""Performance harness: exact BERTScore evaluation against its peers and the encoder-only floor, one run.

On the 3,360 WMT16 DAseg dev pairs (6 language pairs x 560), same model (the bundled all-MiniLM-L6-v2) and
layer, all on the CPU, each row timed as the best of ``--repeats`` runs after a warm-up call on 64 pairs:

* ``bert-score``: ``bert_score.BERTScorer.score`` on a loaded scorer (the reference: ratio 1.00);
* ``torchmetrics``: ``torchmetrics.text.BERTScore`` ``update`` + ``compute`` on a constructed metric;
* ``ours <dtype>``: ``bertscore_loss.BERTScorer.score`` on a constructed scorer (default token budget, and
  in float32 the other ``--budgets`` values);
* ``floor <dtype>``: a plain forward pass of the same truncated model over the same unique sentences,
  already tokenised, length-sorted and batched with the same token budget as ours: nothing else. Ours
  (default budget) and the floor run interleaved, ``--floor-repeats`` times each, best kept.

Prints pairs/s, the ratio to ``bert-score``, the percentage of the floor of the same dtype, the largest
|dF| (|dP|, |dR|) from ``bert-score``, and the mean over language pairs of the Pearson correlation of F
with the human scores; writes ``<out>/performance-harness-<cpu>.json`` and ``.md``, ``<cpu>`` the CPU's bf16
kind (``amx``, ``avx512bf16`` or ``nobf16``: the figures depend on it), ``<out>`` = ``runs/perf-harness``
unless ``--out`` says otherwise (``--out docs/results/speed`` publishes).

    python benchmarks/perf_harness.py                         # the full run (about 15 minutes)
    python benchmarks/perf_harness.py --limit 300             # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_speed import DEFAULT_DATA, LANG_PAIRS, best_time, cpu_bf16_label, cpu_model, quiet  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--limit", type=int, default=None, help="pairs per language pair (default: all 560)")
    ap.add_argument("--layer", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per row, best kept (default: %(default)s)")
    ap.add_argument("--floor-repeats", type=int, default=4, help="interleaved runs of ours and the floor (float32)")
    ap.add_argument("--bf16-repeats", type=int, default=1, help="timed runs of the bf16 rows (default: %(default)s)")
    ap.add_argument("--budgets", default="1024,2048,4096,8192", help="float32 token budgets to sweep")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="our dtypes (default: %(default)s)")
    ap.add_argument("--batch-size", type=int, default=64, help="bert-score / torchmetrics batch size")
    ap.add_argument("--skip-torchmetrics", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda: the same rows on a GPU")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSON and markdown files (default: runs/perf-harness; --out docs/results/speed publishes)",
    )
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    args.rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    args.out = args.out or ROOT / "runs" / "perf-harness"
    stem = args.out / f"performance-harness-{cpu_bf16_label()}"
    check_outputs_or_exit(ap, [stem.with_suffix(".json"), stem.with_suffix(".md")], **args.rules)
    args.budgets = [int(b) for b in args.budgets.split(",") if b.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    return args


def load(data: Path, limit: int | None) -> tuple[list[str], list[str], list[float], list[int]]:
    """Candidates, references, human scores and the language-pair index of each pair."""
    cands, refs, human, lp_of = [], [], [], []
    base = data / "wmt16-daseg"
    for k, lp in enumerate(LANG_PAIRS):

        def read(kind: str, lp: str = lp) -> list[str]:
            return (base / f"DAseg.newstest2016.{kind}.{lp}").read_text(encoding="utf-8").splitlines()[:limit]

        c, r, h = read("mt-system"), read("reference"), read("human")
        cands += c
        refs += r
        human += [float(x) for x in h]
        lp_of += [k] * len(c)
    return cands, refs, human, lp_of


def mean_pearson(f: torch.Tensor, human: list[float], lp_of: list[int]) -> float:
    f_np, h, g = f.double().numpy(), np.asarray(human), np.asarray(lp_of)
    return float(np.mean([np.corrcoef(f_np[g == k], h[g == k])[0, 1] for k in np.unique(g)]))


def floor_batches(encoder: Any, texts: list[str], budget: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The unique texts tokenised, length-sorted and cut into token-budget batches (untimed preparation)."""
    from bertscore_loss._tokens import length_order

    ids = encoder.tokenize(texts).ids
    order, _, _ = length_order(ids)
    device = encoder.device
    return [(b.to(device), m.to(device)) for _, b, m in encoder.padded_batches(ids, order, budget)]


def run_floor(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Forward passes only (batches already on the model's device); waits for the device to finish."""
    with torch.inference_mode():
        for ids, mask in batches:
            model(input_ids=ids, attention_mask=mask)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    import bert_score
    import transformers

    from bertscore_loss import BERTScorer, bundled_model_path
    from bertscore_loss.config import batch_tokens_for
    from bertscore_loss.encoder import FrozenEncoder
    from bertscore_loss.machine import cpu_has_native_bf16

    cands, refs, human, lp_of = load(args.data, args.limit)
    n, layer, bs, k = len(cands), args.layer, args.batch_size, args.repeats
    w_c, w_r = cands[:64], refs[:64]
    path = bundled_model_path()
    uniq = list(dict.fromkeys(t.strip() for t in cands + refs))
    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bert_score": version("bert-score"),
        "torchmetrics": version("torchmetrics"),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "native_bf16": cpu_has_native_bf16(),
        "loadavg_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(" | ".join(f"{key} {v}" for key, v in env.items()))
    print(f"{n} pairs, {len(uniq)} unique texts | layer {layer} | best of {k} (bf16: {args.bf16_repeats})", flush=True)
    rows: list[dict[str, Any]] = []

    def log(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    def add(system: str, dtype: str, seconds: float, times: list[float], prf: Any = None, **extra: Any) -> None:
        row = {"system": system, "dtype": dtype, "seconds": seconds, "all_seconds": times, "pairs_per_s": n / seconds}
        if prf is not None:
            p, r, f = (x.float().cpu() for x in prf[:3])
            row["max_abs_diff"] = {m: float((a - b).abs().max()) for m, a, b in zip("PRF", (p, r, f), oracle)}
            row["pearson_human"] = mean_pearson(f, human, lp_of)
            # same values in another order? (torchmetrics 1.9 returns scores out of input order)
            row["max_abs_diff_sorted_F"] = float((f.sort().values - oracle[2].sort().values).abs().max())
        row.update(extra)
        rows.append(row)
        log(f"{system} [{dtype}]: {seconds:.2f} s {[round(t, 2) for t in times]}")

    # --- bert-score -----------------------------------------------------------------------------
    log("bert-score")
    bsc = bert_score.BERTScorer(model_type=path, num_layers=layer, device=args.device, batch_size=bs)
    (sec, times), out = best_time(lambda s=bsc: s.score(cands, refs), k, lambda s=bsc: s.score(w_c, w_r))
    oracle = tuple(x.float() for x in out)
    add("bert-score BERTScorer.score", "float32", sec, times, out)
    del bsc

    # --- torchmetrics ---------------------------------------------------------------------------
    if not args.skip_torchmetrics:
        from torchmetrics.text import BERTScore

        log("torchmetrics")
        tm = BERTScore(model_name_or_path=path, num_layers=layer, batch_size=bs, device=args.device, max_length=512)

        def tm_run(c: list[str] = cands, r: list[str] = refs) -> Any:
            tm.reset()
            tm.update(c, r)
            got = tm.compute()
            return got["precision"], got["recall"], got["f1"]

        (sec, times), out = best_time(tm_run, k, lambda: tm_run(w_c, w_r))
        add("torchmetrics BERTScore", "float32", sec, times, out)
        del tm

    # --- ours and the floor ---------------------------------------------------------------------
    for dtype in args.dtypes:
        enc = FrozenEncoder(layer=layer, device=args.device, dtype=dtype)
        default = batch_tokens_for(args.device)
        if dtype == "float32":  # the budget sweep (ours only)
            for budget in sorted(set(args.budgets) - {default}):
                swept = BERTScorer(encoder=enc, progress=False, batch_tokens=budget)
                log(f"ours {dtype} budget {budget}")
                (sec, times), out = best_time(
                    lambda s=swept: s.score(cands, refs), k, lambda s=swept: s.score(w_c, w_r)
                )
                add("ours BERTScorer.score", dtype, sec, times, out, batch_tokens=budget)
        # ours (default budget) and the floor at the same batching, runs interleaved so that load changes
        # on a shared machine hit both alike
        scorer = BERTScorer(encoder=enc, progress=False)
        batches = floor_batches(enc, uniq, default)
        scorer.score(w_c, w_r)
        run_floor(enc.model, floor_batches(enc, uniq[:128], default))
        ours_t: list[float] = []
        floor_t: list[float] = []
        out = None
        for rep in range(args.floor_repeats if dtype == "float32" else args.bf16_repeats):
            log(f"ours {dtype} default budget / floor, interleaved run {rep + 1}")
            t0 = time.perf_counter()
            out = scorer.score(cands, refs)
            ours_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            run_floor(enc.model, batches)
            floor_t.append(time.perf_counter() - t0)
        add("ours BERTScorer.score (default)", dtype, min(ours_t), ours_t, out, batch_tokens=default)
        add("floor: encoder forward only", dtype, min(floor_t), floor_t, batch_tokens=default)
        del scorer, enc

    # --- ratios and table -------------------------------------------------------------------------
    ref_pps = rows[0]["pairs_per_s"]
    floor_pps = {r["dtype"]: r["pairs_per_s"] for r in rows if r["system"].startswith("floor")}
    for r in rows:
        r["ratio_vs_bert_score"] = r["pairs_per_s"] / ref_pps
        r["percent_of_floor"] = 100 * r["pairs_per_s"] / floor_pps[r["dtype"]] if r["dtype"] in floor_pps else None
    env["loadavg_end"] = os.getloadavg()[0]
    lines = [
        f"{n} WMT16 DAseg dev pairs ({len(uniq)} unique texts), all-MiniLM-L6-v2 layer {layer}, CPU "
        f"({env['cpu']}, {env['cpu_count']} logical CPUs, {env['threads']} torch threads, native bf16: "
        f"{env['native_bf16']}), peers and the budget sweep best of {k} runs after a warm-up, ours (default) and "
        f"the floor interleaved, best of {args.floor_repeats} (bf16: {args.bf16_repeats}); "
        f"torch {env['torch']}, transformers {env['transformers']}, bert-score {env['bert_score']}, "
        f"torchmetrics {env['torchmetrics']}; load average {env['loadavg_start']:.2f} → {env['loadavg_end']:.2f}; "
        f"{env['date']}.",
        "",
        "| system | dtype | batch tokens | seconds | pairs/s | × bert-score | % of floor | max abs dF | "
        "max abs dP | max abs dR | mean Pearson (human) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d = r.get("max_abs_diff")
        diffs = " | ".join(f"{d[m]:.1e}" for m in "FPR") if d else "- | - | -"
        pct = f"{r['percent_of_floor']:.1f} %" if r["percent_of_floor"] is not None else "-"
        ph = f"{r['pearson_human']:.4f}" if "pearson_human" in r else "-"
        lines.append(
            f"| {r['system']} | {r['dtype']} | {r.get('batch_tokens', '-')} | {r['seconds']:.2f} | "
            f"{r['pairs_per_s']:.1f} | {r['ratio_vs_bert_score']:.2f} | {pct} | {diffs} | {ph} |"
        )
    for r in rows:
        d, ds = r.get("max_abs_diff"), r.get("max_abs_diff_sorted_F")
        if d and ds is not None and d["F"] > 10 * max(ds, 1e-6):
            lines += [
                "",
                f"{r['system']}: its F values sorted differ from bert-score's sorted by at most {ds:.1e}, but pair "
                f"by pair by up to {d['F']:.1e}: it returns the scores out of input order (hence its Pearson).",
            ]
    stem = f"performance-harness-{cpu_bf16_label()}"
    threads = os.environ.get("OMP_NUM_THREADS")
    command = ("" if threads is None else f"OMP_NUM_THREADS={threads} ") + "python " + " ".join(sys.argv)
    lines += ["", f"Reproduce: `{command}` (writes this file, {stem}.md, and {stem}.json)."]
    table = "\n".join(lines)
    print(table)
    write_text(args.out / f"{stem}.json", json.dumps({"env": env, "rows": rows}, indent=2) + "\n", **args.rules)
    write_text(args.out / f"{stem}.md", "# Performance harness (generated)\n\n" + table + "\n", **args.rules)
    print(f"wrote {args.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
