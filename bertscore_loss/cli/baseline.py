"""``bertscore-loss baseline``: a rescaling baseline (bert-score format) from random sentence pairs."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import add_model_args, add_overwrite_arg, check_output_file, positive_int


def cmd_baseline(args: argparse.Namespace) -> int:
    from ..baseline import write_baseline
    from ..outputs import atomic_path
    from ..quality.baseline_tool import baseline_from_corpus
    from ..textio import read_corpus

    rules: dict[str, Any] = {"inputs": args.corpus, "overwrite": args.overwrite, "allow_docs": True}
    output = check_output_file(args.output, "-o/--output", **rules)  # before the whole computation
    sentences = read_corpus(args.corpus)
    rows = baseline_from_corpus(
        sentences,
        args.model,
        pairs=args.pairs,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
    )
    with atomic_path(output, flag="-o/--output", **rules) as tmp:  # the old file or the new one, never half of one
        write_baseline(tmp, rows)
    sys.stdout.write(f"{len(sentences)} distinct sentences, {args.pairs} random pairs, seed {args.seed}\n")
    sys.stdout.write("LAYER,P,R,F\n")
    for k, (p, r, f) in rows.items():
        sys.stdout.write(f"{k},{p:.6f},{r:.6f},{f:.6f}\n")
    sys.stdout.write(f"wrote {args.output}\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``baseline`` to the ``bertscore-loss`` subcommands."""
    p = subparsers.add_parser(
        "baseline",
        help="compute a rescaling baseline (LAYER,P,R,F) from random pairs of corpus sentences",
        description="Mean P/R/F of random (candidate, reference) pairs of distinct corpus sentences at every "
        "layer, written in the bert-score baseline format.",
    )
    p.add_argument(
        "--corpus",
        "-i",
        nargs="+",
        required=True,
        help="text files (one sentence per line) or STS-B *.csv files; sentences are stripped and deduplicated",
    )
    p.add_argument("--pairs", type=positive_int, default=100_000, help="number of random pairs (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the pairs (default: %(default)s)")
    p.add_argument(
        "-o", "--output", required=True, help="baseline file to write (e.g. my-model.tsv; never one of --corpus)"
    )
    add_overwrite_arg(p)
    add_model_args(p)
    p.set_defaults(func=cmd_baseline)
    return p
