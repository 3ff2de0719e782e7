"""Sub-commands ``tune-layers``, ``baseline`` and ``plot`` (registered by ``bertscore_loss.cli``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def _encoder_args(p: argparse.ArgumentParser) -> None:
    """Model options of the commands that use every layer (no --layer, --rescale or --baseline)."""
    p.add_argument("--model", "-m", default=None, help="HF model name (local cache) or folder; default: bundled MiniLM")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch-tokens", type=int, default=None, help="padded tokens per encoder batch (default by device)")


# --- tune-layers -------------------------------------------------------------------------------------
def cmd_tune_layers(args: argparse.Namespace) -> int:
    from .datasets import JudgedPairs, read_judged_tsv, read_stsb, read_wmt_daseg
    from .layers import plot_layer_correlations, tune_layers

    parts = []
    if args.wmt_daseg:
        lps = [x.strip() for x in args.lang_pairs.split(",") if x.strip()] if args.lang_pairs else None
        parts.append(read_wmt_daseg(args.wmt_daseg, lps))
    if args.stsb:
        parts.append(read_stsb(args.stsb))
    for path in args.tsv or []:
        parts.append(read_judged_tsv(path))
    if not parts:
        raise ValueError("give a dev set: --wmt-daseg DIR, --stsb CSV or --tsv FILE")
    if args.limit is not None and args.limit < 1:
        raise ValueError(f"--limit must be positive, got {args.limit}")
    data = JudgedPairs.concat(parts).head(args.limit)
    corr, _ = tune_layers(
        data, args.model, idf=args.idf, device=args.device, dtype=args.dtype, batch_tokens=args.batch_tokens
    )
    out = Path(args.output)
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


def add_tune_layers_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``tune-layers``: correlation of every layer with human scores; recommends a layer."""
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
    p.add_argument("--limit", type=int, default=None, help="use the first N pairs of each group")
    p.add_argument("--idf", action="store_true", help="IDF weights over the references of each group")
    p.add_argument("-o", "--output", default="tune-layers", help="output folder for layers.{csv,md,png}")
    _encoder_args(p)
    p.set_defaults(func=cmd_tune_layers)
    return p


# --- baseline ----------------------------------------------------------------------------------------
def cmd_baseline(args: argparse.Namespace) -> int:
    from ..baseline import write_baseline
    from .baseline_tool import baseline_from_corpus
    from .datasets import read_corpus

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
    write_baseline(args.output, rows)
    sys.stdout.write(f"{len(sentences)} distinct sentences, {args.pairs} random pairs, seed {args.seed}\n")
    sys.stdout.write("LAYER,P,R,F\n")
    for k, (p, r, f) in rows.items():
        sys.stdout.write(f"{k},{p:.6f},{r:.6f},{f:.6f}\n")
    sys.stdout.write(f"wrote {args.output}\n")
    return 0


def add_baseline_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``baseline``: a rescaling baseline (bert-score format) from random sentence pairs."""
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
    p.add_argument("--pairs", type=int, default=100_000, help="number of random pairs (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed of the pairs (default: %(default)s)")
    p.add_argument("-o", "--output", required=True, help="baseline file to write (e.g. my-model.tsv)")
    _encoder_args(p)
    p.set_defaults(func=cmd_baseline)
    return p


# --- plot --------------------------------------------------------------------------------------------
def cmd_plot(args: argparse.Namespace) -> int:
    from ..cli import read_lines, scorer_from_args
    from .plot import similarity_figure, token_similarity

    scorer = scorer_from_args(args)
    if args.idf_corpus:
        if not args.idf:
            raise ValueError("--idf-corpus needs --idf")
        scorer.set_idf_corpus(read_lines(args.idf_corpus))
    elif args.idf:
        logger.warning("--idf without --idf-corpus: IDF over the one reference gives its tokens weight 0")
    data = token_similarity(args.cand, args.ref, scorer)
    similarity_figure(data).savefig(args.output, format="png")
    p, r, f = data.scores
    sys.stdout.write(f"P: {p:.6f}  R: {r:.6f}  F: {f:.6f}\nwrote {args.output}\n")
    return 0


def add_plot_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``plot``: token-similarity heatmap of one pair with the greedy matches."""
    from ..cli import add_scorer_args

    p = subparsers.add_parser(
        "plot",
        help="token-similarity heatmap of one candidate/reference pair (PNG)",
        description="Heatmap of the cosine similarities between the tokens of one pair, greedy matches marked.",
    )
    p.add_argument("-c", "--cand", required=True, help="candidate text")
    p.add_argument("-r", "--ref", required=True, help="reference text")
    p.add_argument("-o", "--output", required=True, help="PNG file to write")
    p.add_argument("--idf-corpus", default=None, help="with --idf: file of sentences (one per line) for the IDF table")
    add_scorer_args(p)
    p.set_defaults(func=cmd_plot)
    return p
