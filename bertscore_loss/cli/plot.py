"""``bertscore-loss plot``: token-similarity heatmap of one pair with the greedy matches (PNG)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .common import UsageError, add_overwrite_arg, add_scorer_args, check_output_file, scorer_from_args


def cmd_plot(args: argparse.Namespace) -> int:
    from ..outputs import save_figure
    from ..quality.plot import similarity_figure, token_similarity
    from ..textio import read_corpus

    rules: dict[str, Any] = {"inputs": [args.idf_corpus], "overwrite": args.overwrite, "allow_docs": True}
    output = check_output_file(args.output, "-o/--output", **rules)  # before loading the model
    if args.idf_corpus and not args.idf:
        raise UsageError("--idf-corpus needs --idf")
    corpus = read_corpus(args.idf_corpus, distinct=False) if args.idf_corpus else None
    scorer = scorer_from_args(args)
    if corpus is not None:
        scorer.set_idf_corpus(corpus)
    data = token_similarity(args.cand, args.ref, scorer)  # warns when IDF gives every token weight 0
    save_figure(similarity_figure(data), output, format="png", flag="-o/--output", **rules)
    p, r, f = data.scores
    sys.stdout.write(f"P: {p:.6f}  R: {r:.6f}  F: {f:.6f}\nwrote {args.output}\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``plot`` to the ``bertscore-loss`` subcommands."""
    p = subparsers.add_parser(
        "plot",
        help="token-similarity heatmap of one candidate/reference pair (PNG; needs the plot extra: matplotlib)",
        description="Heatmap of the cosine similarities between the tokens of one pair, greedy matches marked.",
    )
    p.add_argument("-c", "--cand", required=True, help="candidate text")
    p.add_argument("-r", "--ref", required=True, help="reference text")
    p.add_argument("-o", "--output", required=True, help="PNG file to write (never the --idf-corpus file)")
    p.add_argument("--idf-corpus", default=None, help="with --idf: file of sentences (one per line) for the IDF table")
    add_scorer_args(p)
    add_overwrite_arg(p)
    p.set_defaults(func=cmd_plot)
    return p
