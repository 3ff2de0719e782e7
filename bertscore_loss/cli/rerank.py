"""``bertscore-loss rerank``: the chosen candidate per source by BERTScore (or chrF, BLEU) against references or
by MBR (exact or approximate)."""

from __future__ import annotations

import argparse
import math
import sys

from ..config import MEASURES
from ..textio import iter_lines
from .common import UsageError, add_scorer_args, check_stdin_once, read_input_lines, scorer_from_args


def read_tsv(path: str) -> tuple[list[str], list[list[str]], list[list[float]] | None]:
    """Candidate lists from ``source_id<TAB>candidate[<TAB>model_score]`` lines.

    Sources are in order of first appearance, candidates in file order; completely empty lines are
    skipped; lines end at ``\n``/``\r\n`` only and a leading UTF-8 BOM is dropped.
    Returns the source ids, the candidate lists and the model scores (None without a third
    column; either every line has one or none does).
    """
    order: dict[str, int] = {}
    cands: list[list[str]] = []
    scores: list[list[float]] = []
    with_scores: bool | None = None
    for no, line in enumerate(iter_lines(path, what="--tsv file"), start=1):
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) not in (2, 3):
            raise ValueError(
                f"{path}:{no}: expected source_id<TAB>candidate[<TAB>model_score], got {len(parts)} field(s)"
            )
        if with_scores is None:
            with_scores = len(parts) == 3
        elif with_scores != (len(parts) == 3):
            raise ValueError(f"{path}:{no}: either every line has a model_score column or none does")
        sid = parts[0]
        if sid not in order:
            order[sid] = len(order)
            cands.append([])
            scores.append([])
        cands[order[sid]].append(parts[1])
        if with_scores:
            try:
                scores[order[sid]].append(float(parts[2]))
            except ValueError as exc:
                raise ValueError(f"{path}:{no}: model_score {parts[2]!r} is not a number") from exc
    return list(order), cands, (scores if with_scores else None)


def read_systems(paths: list[str]) -> list[list[str]]:
    """Candidate lists from system files: line i of every file belongs to source i."""
    files = [read_input_lines(p, "--systems") for p in paths]
    for p, lines in zip(paths[1:], files[1:]):
        if len(lines) != len(files[0]):
            raise ValueError(
                f"{paths[0]} has {len(files[0])} lines but {p} has {len(lines)}: "
                "every system file needs one line per source"
            )
    return [list(c) for c in zip(*files)]


UTILITY_CHOICES = ["bertscore", "chrf", "chrf++", "bleu"]
METHOD_CHOICES = ["exact", "aggregate", "aggregate-exact", "prune"]


def method_from_args(args: argparse.Namespace):  # -> rerank.mbr.Method
    from rerank.mbr import get_method

    if args.top_k is not None and args.method != "aggregate-exact":
        raise UsageError("--top-k applies to --method aggregate-exact only")
    if args.prune_alpha is not None and args.method != "prune":
        raise UsageError("--prune-alpha applies to --method prune only")
    options: dict = {}
    if args.method == "aggregate-exact" and args.top_k is not None:
        options["top_k"] = args.top_k
    if args.method == "prune":
        options["seed"] = args.seed
        if args.prune_alpha is not None:
            options["alpha"] = args.prune_alpha
    return get_method(args.method, **options)


def cmd_rerank(args: argparse.Namespace) -> int:
    from rerank import NBestReranker

    if bool(args.refs) == bool(args.mbr):
        raise UsageError("give -r REFS (reference-based reranking) or --mbr (minimum Bayes risk), exactly one")
    if not args.mbr:
        ignored = [
            f
            for f, on in (
                ("--include-self", args.include_self),
                ("--expectation", args.expectation != "uniform"),
                ("--temperature", args.temperature != 1.0),
                ("--method", args.method != "exact"),
            )
            if on
        ]
        if ignored:
            raise UsageError(f"{', '.join(ignored)} apply to --mbr only")
    elif args.temperature != 1.0 and args.expectation != "model":
        raise UsageError("--temperature is used with --expectation model only")
    check_stdin_once(
        [*(args.systems or [args.tsv]), *args.refs],
        ["--systems/--tsv"] * len(args.systems or [1]) + ["-r"] * len(args.refs),
    )
    if args.systems:
        cands, model_scores = read_systems(args.systems), None
    else:
        _, cands, model_scores = read_tsv(args.tsv)
    if (args.weight > 0 or args.expectation == "model") and model_scores is None:
        raise ValueError("--weight needs model scores and --expectation model too: give a TSV with a third column")
    refs = None
    if args.refs:
        ref_files = [read_input_lines(r, "-r") for r in args.refs]
        for path, lines in zip(args.refs, ref_files):
            if len(lines) != len(cands):
                raise ValueError(f"there are {len(cands)} sources but {path} has {len(lines)} lines")
        refs = ref_files[0] if len(ref_files) == 1 else [list(g) for g in zip(*ref_files)]
    if args.utility != "bertscore" and args.measure != "f1":
        raise UsageError("--measure chooses the BERTScore measure: it does not apply to --utility " + args.utility)
    method = method_from_args(args)
    if args.utility == "bertscore":
        reranker = NBestReranker(scorer=scorer_from_args(args), method=method)
    else:
        reranker = NBestReranker(utility=args.utility, method=method)
    results = reranker.rerank(
        cands,
        refs,
        model_scores=model_scores,
        weight=args.weight,
        measure=args.measure,
        include_self=args.include_self,
        expectation=args.expectation,
        temperature=args.temperature,
    )
    out = sys.stdout
    for res in results:
        value = str(res.best_index) if args.print == "index" else res.best
        if args.with_score:
            score = res.scores[0]
            value += "\t" + (f"{score:.6f}" if math.isfinite(score) else str(score))
        out.write(value + "\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register the ``rerank`` subcommand (handler in ``func``)."""
    p = subparsers.add_parser(
        "rerank",
        help="pick the best candidate per source by BERTScore against references or by MBR",
        description=(
            "Rerank candidate lists and print the chosen candidate per source, one line each, in source "
            "order. Candidates come from system files (line i of every file belongs to source i) or from a "
            "TSV of source_id<TAB>candidate[<TAB>model_score] lines (sources in order of first appearance)."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--systems", nargs="+", metavar="FILE", help="system output files, one line per source")
    src.add_argument("--tsv", metavar="FILE", help="source_id<TAB>candidate[<TAB>model_score] lines")
    p.add_argument(
        "-r", "--refs", action="append", default=[], help="references file, one line per source; repeat for several"
    )
    p.add_argument("--mbr", action="store_true", help="minimum-Bayes-risk: the candidates are each other's references")
    p.add_argument(
        "--utility",
        choices=UTILITY_CHOICES,
        default="bertscore",
        help="utility: BERTScore (the scorer options below), or sacrebleu's sentence chrF, chrF++ or BLEU",
    )
    p.add_argument("--measure", choices=list(MEASURES), default="f1", help="BERTScore measure (default: f1)")
    p.add_argument(
        "--method",
        choices=METHOD_CHOICES,
        default="exact",
        help="MBR method: exact (default), reference aggregation, aggregation then exact on the top-k, or "
        "confidence-based pruning",
    )
    p.add_argument("--top-k", type=int, default=None, help="--method aggregate-exact: exact MBR among the K best (20)")
    p.add_argument("--prune-alpha", type=float, default=None, help="--method prune: confidence threshold (0.99)")
    p.add_argument("--seed", type=int, default=0, help="--method prune: seed of the column order and bootstrap")
    p.add_argument("--include-self", action="store_true", help="MBR: let U[i, i] count in candidate i's expectation")
    p.add_argument(
        "--expectation",
        choices=["uniform", "model"],
        default="uniform",
        help="MBR: uniform mean, or weighted by softmax(model_score / temperature) (TSV third column)",
    )
    p.add_argument("--temperature", type=float, default=1.0, help="softmax temperature of --expectation model")
    p.add_argument(
        "--weight",
        type=float,
        default=0.0,
        help="final = (1 - W) * bertscore + W * model_score (needs the TSV third column); default 0",
    )
    p.add_argument("--print", choices=["text", "index"], default="text", help="print the candidate or its index")
    p.add_argument("--with-score", action="store_true", help="append <TAB>final score to each line")
    add_scorer_args(p)
    p.set_defaults(func=cmd_rerank)
    return p
