"""``bertscore-loss tune-layers``: correlation of every layer with human scores; recommends a layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .common import UsageError, add_model_args, add_overwrite_arg, check_output_dir, positive_int

FILES = ("layers.csv", "layers.md", "layers.png")


def cmd_tune_layers(args: argparse.Namespace) -> int:
    from ..outputs import check_output, save_figure, write_text
    from ..quality.datasets import JudgedPairs, read_judged_tsv, read_stsb, read_wmt_daseg
    from ..quality.layers import plot_layer_correlations, tune_layers

    out = check_output_dir(args.output or "tune-layers", "-o/--output")  # before any computation
    rules: dict[str, Any] = {
        "inputs": [args.stsb, *(args.tsv or [])],
        "overwrite": args.overwrite,
        "allow_docs": args.output is not None,  # the default folder never goes under docs/
        "flag": "-o/--output",
    }
    for name in FILES:
        check_output(out / name, **rules)
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
    best = corr.best_layer()  # constant scores end here, before anything is written
    csv_text, markdown, summary = corr.to_csv(), corr.to_markdown() + "\n", corr.summary_markdown()
    name = args.model or "bundled all-MiniLM-L6-v2"
    figure = plot_layer_correlations(corr, title=f"{Path(name).name}{' +idf' if args.idf else ''}: best layer {best}")
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "layers.csv", csv_text, **rules)
    write_text(out / "layers.md", markdown, **rules)
    save_figure(figure, out / "layers.png", format="png", **rules)
    sys.stdout.write(summary + "\n\n")
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
    p.add_argument("-o", "--output", default=None, help="output folder for layers.{csv,md,png} (default: tune-layers)")
    add_model_args(p)
    add_overwrite_arg(p)
    p.set_defaults(func=cmd_tune_layers)
    return p
