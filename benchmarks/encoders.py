"""The fast encoder against the accurate one: agreement with people and speed, in one run on one machine.

Encoders: the bundled all-MiniLM-L6-v2 at its preset layer (``BERTScorer()``) and all-mpnet-base-v2 at
its preset layer (``BERTScorer(model="mpnet")``, extra ``accurate``), each in float32 and bfloat16 on the
CPU. For each it measures

* agreement with human judgments, as the BERTScore paper: Pearson r of F with the WMT16 DAseg
  to-English human scores per language pair (560 pairs each) and their mean, and Pearson r and
  Spearman rho of F with the STS-B dev scores (1,500 pairs); no IDF, no rescaling (both affine-free
  for correlations);
* speed: pairs per second of ``scorer.score`` on the first ``--speed-pairs`` WMT16 pairs (the same
  pairs for every encoder; no embedding cache; after a warm-up, ``--repeats`` rounds in which every
  configuration is timed in turn, so that a change of load touches all alike; the best round counts).

It prints one table and the ratios (mpnet / MiniLM for agreement, MiniLM / mpnet for speed, bf16 / fp32),
and writes everything, with the CPU model, its bf16 flags, the thread count and the load, to ``--json``.

    python benchmarks/encoders.py --json runs/encoders.json                  # everything (~1 h on 1 thread)
    python benchmarks/encoders.py --limit 50 --speed-pairs 60 --repeats 1    # a quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
ENCODERS = {"minilm": None, "mpnet": "mpnet"}  # name -> BERTScorer(model=...)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="see docs/encoders.md")
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder holding wmt16-daseg/ and stsb/")
    ap.add_argument("--encoders", default="minilm,mpnet", help="comma-separated, of minilm,mpnet")
    ap.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated, of float32,bfloat16")
    ap.add_argument("--limit", type=int, default=None, help="first N pairs per language pair / of STS-B (default all)")
    ap.add_argument("--speed-pairs", type=int, default=600, help="WMT16 pairs timed for pairs/s (default 600)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of the speed set; the best counts")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1: the shared machine)")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON to this file")
    ap.add_argument("--overwrite", action="store_true", help="replace a --json file that git tracks")
    args = ap.parse_args(argv)  # --help returns before anything heavy (torch) is imported
    args.encoders = [e.strip() for e in args.encoders.split(",") if e.strip()]
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not args.encoders or any(e not in ENCODERS for e in args.encoders):
        ap.error(f"--encoders takes {', '.join(ENCODERS)}")
    if not args.dtypes or any(d not in ("float32", "bfloat16") for d in args.dtypes):
        ap.error("--dtypes takes float32 and/or bfloat16")
    if args.repeats < 1 or args.speed_pairs < 1 or args.threads < 1:
        ap.error("--repeats, --speed-pairs and --threads must be positive")
    for sub in ("wmt16-daseg", "stsb"):
        if not (args.data / sub).is_dir():
            ap.error(f"--data {args.data}: no {sub}/ folder there")
    from bertscore_loss.outputs import check_outputs_or_exit

    check_outputs_or_exit(
        ap, [args.json] if args.json else [], overwrite=args.overwrite, allow_docs=True, flag="--json"
    )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch
    import transformers
    from scipy.stats import pearsonr, spearmanr

    from bertscore_loss import BERTScorer
    from bertscore_loss.machine import cpu_bf16_flags, cpu_model
    from bertscore_loss.outputs import write_text
    from bertscore_loss.quality import read_stsb, read_wmt_daseg

    torch.set_num_threads(args.threads)
    wmt = read_wmt_daseg(args.data / "wmt16-daseg")
    sts = read_stsb(args.data / "stsb" / "stsb-en-dev.csv")
    lps = sorted(set(wmt.groups))
    by_lp = {lp: [i for i, g in enumerate(wmt.groups) if g == lp][: args.limit] for lp in lps}
    sts_n = len(sts.cands) if args.limit is None else min(args.limit, len(sts.cands))
    speed_idx = [i for lp in lps for i in by_lp[lp]][: args.speed_pairs]
    speed_c, speed_r = [wmt.cands[i] for i in speed_idx], [wmt.refs[i] for i in speed_idx]
    env = {
        "cpu": cpu_model(),
        "bf16_flags": cpu_bf16_flags(),
        "cores": os.cpu_count(),
        "threads": args.threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg(),
        "command": "python benchmarks/encoders.py " + " ".join(sys.argv[1:] if argv is None else argv),
    }
    print(f"# {env['cpu']} (bf16 flags: {', '.join(env['bf16_flags']) or 'none'}), {args.threads} thread(s)")
    configs = [(name, dtype) for name in args.encoders for dtype in args.dtypes]
    scorers, rows = {}, {}
    for name, dtype in configs:
        t0 = time.perf_counter()
        scorer = BERTScorer(model=ENCODERS[name], device="cpu", dtype=dtype, progress=False)
        rows[name, dtype] = {
            "encoder": name,
            "dtype": dtype,
            "layer": scorer.layer,
            "signature": str(scorer.signature()),
            "load_s": round(time.perf_counter() - t0, 2),
            "speed_pairs": len(speed_c),
            "speed_times_s": [],
        }
        scorer.score(speed_c[:32], speed_r[:32])  # warm-up
        scorers[name, dtype] = scorer
    # Speed: the configurations take turns in every round, so a change of load on the shared machine
    # touches all of them alike; the best round counts.
    for _ in range(args.repeats):
        for key in configs:
            t = time.perf_counter()
            scorers[key].score(speed_c, speed_r)
            rows[key]["speed_times_s"].append(round(time.perf_counter() - t, 3))
    for key in configs:
        rows[key]["pairs_per_s"] = len(speed_c) / min(rows[key]["speed_times_s"])
    for key in configs:
        scorer, row = scorers.pop(key), rows[key]
        t = time.perf_counter()
        row["wmt16_pearson_f"] = {}
        for lp in lps:
            idx = by_lp[lp]
            f = scorer.score([wmt.cands[i] for i in idx], [wmt.refs[i] for i in idx]).f1
            row["wmt16_pearson_f"][lp] = float(pearsonr(f.double().numpy(), [wmt.human[i] for i in idx])[0])
        row["wmt16_pairs"] = sum(len(v) for v in by_lp.values())
        row["wmt16_mean_pearson_f"] = sum(row["wmt16_pearson_f"].values()) / len(lps)
        f = scorer.score(sts.cands[:sts_n], sts.refs[:sts_n]).f1.double().numpy()
        row["stsb_pairs"] = sts_n
        row["stsb_pearson_f"] = float(pearsonr(f, sts.human[:sts_n])[0])
        row["stsb_spearman_f"] = float(spearmanr(f, sts.human[:sts_n])[0])
        row["correlation_scoring_s"] = round(time.perf_counter() - t, 1)
        print(
            f"{key[0]:7s} {key[1]:9s} layer {row['layer']:2d}: WMT16 mean r(F) {row['wmt16_mean_pearson_f']:.4f}, "
            f"STS-B r {row['stsb_pearson_f']:.4f} rho {row['stsb_spearman_f']:.4f}, {row['pairs_per_s']:.1f} pairs/s",
            flush=True,
        )
        del scorer
    env["loadavg_end"] = os.getloadavg()
    table = list(rows.values())
    ratios = _ratios(table)
    print(_table(table, lps))
    for key, value in ratios.items():
        print(f"{key}: {value:.3f}")
    if args.json:
        config = {k: _portable(v) for k, v in vars(args).items()}
        result = {"env": env, "config": config, "rows": table, "ratios": ratios}
        write_text(
            args.json, json.dumps(result, indent=2) + "\n", overwrite=args.overwrite, allow_docs=True, flag="--json"
        )
    return 0


def _portable(value: Any) -> Any:
    """A path relative to the repository (``../shared/data``), so committed results name no machine's folders."""
    if isinstance(value, Path):
        return os.path.relpath(value.resolve(), Path(__file__).resolve().parents[1])
    return value if isinstance(value, (int, float, bool, list, type(None))) else str(value)


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    get = {(r["encoder"], r["dtype"]): r for r in rows}
    out: dict[str, float] = {}
    for dtype in ("float32", "bfloat16"):
        a, b = get.get(("minilm", dtype)), get.get(("mpnet", dtype))
        if a and b:
            out[f"{dtype}: WMT16 mean r(F) mpnet / MiniLM"] = b["wmt16_mean_pearson_f"] / a["wmt16_mean_pearson_f"]
            out[f"{dtype}: STS-B r(F) mpnet / MiniLM"] = b["stsb_pearson_f"] / a["stsb_pearson_f"]
            out[f"{dtype}: pairs/s MiniLM / mpnet"] = a["pairs_per_s"] / b["pairs_per_s"]
    for enc in ("minilm", "mpnet"):
        a, b = get.get((enc, "float32")), get.get((enc, "bfloat16"))
        if a and b:
            out[f"{enc}: pairs/s bf16 / fp32"] = b["pairs_per_s"] / a["pairs_per_s"]
            out[f"{enc}: WMT16 mean r(F) bf16 - fp32"] = b["wmt16_mean_pearson_f"] - a["wmt16_mean_pearson_f"]
    return out


def _table(rows: list[dict[str, Any]], lps: list[str]) -> str:
    head = ["encoder", "dtype", "layer", *lps, "WMT16 mean r", "STS-B r", "STS-B rho", "pairs/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["encoder"], r["dtype"], str(r["layer"])]
        cells += [f"{r['wmt16_pearson_f'][lp]:.4f}" for lp in lps]
        cells += [f"{r['wmt16_mean_pearson_f']:.4f}", f"{r['stsb_pearson_f']:.4f}", f"{r['stsb_spearman_f']:.4f}"]
        cells += [f"{r['pairs_per_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
