"""``bertscore-loss tune-layers``: correlation of every layer with human scores; recommends a layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import UsageError, add_model_args, check_output_dir, positive_int


def cmd_tune_layers(args: argparse.Namespace) -> int:
    from ..quality.datasets import JudgedPairs, read_judged_tsv, read_stsb, read_wmt_daseg
    from ..quality.layers import plot_layer_correlations, tune_layers

    out = check_output_dir(args.output, "-o/--output")  # before any computation
    parts = []
    if args.wmt_daseg:
        lps = [x.strip() for x in args.lang_pairs.split(",") if x.strip()] if args.lang_pairs else None
        parts.append(read_wmt_daseg(args.wmt_daseg, lps))
    elif args.lang_pairs:
        raise UsageError("--lang-pairs selects pairs of --wmt-daseg: give --wmt-daseg DIR")
    if args.stsb:
        parts.append(read_stsb(args.stsb))
    for path in args.tsv or []:
        parts.append(read_judged_tsv(path))
    if not parts:
        raise UsageError("give a dev set: --wmt-daseg DIR, --stsb CSV or --tsv FILE")
    data = JudgedPairs.concat(parts).head(args.limit)
    corr, _ = tune_layers(
        data, args.model, idf=args.idf, device=args.device, dtype=args.dtype, batch_tokens=args.batch_tokens
    )
    out.mkdir(parents=True, exist_ok=True)
    corr.write_csv(out / "layers.csv")
    (out / "layers.md").write_text(corr.to_markdown() + "\n", encoding="utf-8")
    name = args.model or "bundled all-MiniLM-L6-v2"
    title = f"{Path(name).name}{' +idf' if args.idf else ''}: best layer {corr.best_layer()}"
    plot_layer_correlations(corr, out / "layers.png", title=title)
    sys.stdout.write(corr.summary_markdown() + "\n\n")
    best = corr.best_layer()
    sys.stdout.write(
        f"recommended layer: {best} (mean Pearson of F over {len(corr.groups)} group(s): "
        f"{corr.mean()[best, 2]:.4f})\nwrote {out / 'layers.csv'}, {out / 'layers.md'}, {out / 'layers.png'}\n"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``tune-layers`` to the ``bertscore-loss`` subcommands."""
    p = subparsers.add_parser(
        "tune-layers",
        help="correlate every layer's P/R/F with human scores and recommend a layer",
        description="Scores every layer from one encoder pass and reports Pearson and Kendall per layer and "
        "group; the recommended layer has the highest mean (over groups) Pearson of F (lowest on ties).",
    )
    p.add_argument("--wmt-daseg", "--wmt16-daseg", default=None, help="folder in the WMT DAseg layout (group = lp)")
    p.add_argument("--lang-pairs", default=None, help="comma-separated language pairs of --wmt-daseg (default: all)")
    p.add_argument("--stsb", default=None, help="STS-B CSV (sentence1,sentence2,score)")
    p.add_argument("--tsv", action="append", help="cand<TAB>ref<TAB>score[<TAB>group] file; repeatable")
    p.add_argument("--limit", type=positive_int, default=None, help="use the first N pairs of each group")
    p.add_argument("--idf", action="store_true", help="IDF weights over the references of each group")
    p.add_argument("-o", "--output", default="tune-layers", help="output folder for layers.{csv,md,png}")
    add_model_args(p)
    p.set_defaults(func=cmd_tune_layers)
    return p
