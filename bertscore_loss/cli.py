"""Command line: ``bertscore-loss score ...``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from itertools import zip_longest

from .baseline import BaselineNotFoundError
from .encoder import ModelNotFoundError


def read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 text file without their line endings (``-`` = standard input)."""
    if path == "-":
        return sys.stdin.read().splitlines()
    with open(path, encoding="utf-8") as fh:
        return fh.read().splitlines()


def read_score_inputs(args: argparse.Namespace) -> tuple[list[str], list[str] | list[list[str]]]:
    """Candidates of ``-c`` and references of the ``-r`` files (several files = multi-reference)."""
    if not args.cands or not args.refs:
        raise ValueError("give -c CANDS and -r REFS (or --stream --pairs FILE)")
    cands = read_lines(args.cands)
    ref_files = [read_lines(r) for r in args.refs]
    for path, lines in zip(args.refs, ref_files):
        if len(lines) != len(cands):
            raise ValueError(f"{args.cands} has {len(cands)} lines but {path} has {len(lines)}: the lengths must match")
    refs = ref_files[0] if len(ref_files) == 1 else [list(g) for g in zip(*ref_files)]
    return cands, refs


def iter_pairs(args: argparse.Namespace) -> Iterator[tuple[str, str | list[str]]]:
    """Pairs read lazily line by line: from ``--pairs`` (``candidate<TAB>reference[<TAB>reference…]``)
    or from ``-c`` and the ``-r`` files side by side (ValueError when one file ends before the others)."""
    with ExitStack() as stack:
        if args.pairs:
            fh = sys.stdin if args.pairs == "-" else stack.enter_context(open(args.pairs, encoding="utf-8"))
            for n, line in enumerate(fh, 1):
                cand, *refs = line.rstrip("\r\n").split("\t")
                if not refs:
                    raise ValueError(f"{args.pairs}:{n}: no TAB: expected candidate<TAB>reference")
                yield cand, refs[0] if len(refs) == 1 else refs
            return
        paths = [args.cands, *args.refs]
        files = [sys.stdin if p == "-" else stack.enter_context(open(p, encoding="utf-8")) for p in paths]
        for n, lines in enumerate(zip_longest(*files), 1):
            if any(x is None for x in lines):
                ended = [p for p, x in zip(paths, lines) if x is None]
                raise ValueError(f"{', '.join(ended)} ended at line {n - 1} before the other input(s)")
            cand, *refs = (x.rstrip("\r\n") for x in lines)
            yield cand, refs[0] if len(refs) == 1 else refs


def add_scorer_args(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a scorer."""
    p.add_argument("--model", "-m", default=None, help="HF model name (local cache) or folder; default: bundled MiniLM")
    p.add_argument("--layer", "-l", type=int, default=None, help="layer to use (default: the model's preset)")
    p.add_argument("--idf", action="store_true", help="weight tokens by IDF over the references")
    p.add_argument("--rescale", action="store_true", help="rescale with a baseline (x - b) / (1 - b)")
    p.add_argument("--baseline", default=None, help="baseline file in the bert-score format LAYER,P,R,F")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--batch-tokens", type=int, default=None, help="padded tokens per encoder batch (default: 2048 CPU, 8192 GPU)"
    )
    p.add_argument(
        "--long-inputs",
        default="truncate",
        choices=["truncate", "window"],
        help="texts over the model's maximum length: cut them (default, as bert-score) or encode overlapping windows",
    )
    p.add_argument("--window-stride", type=int, default=None, help="text tokens between windows (default: half one)")


def scorer_from_args(args: argparse.Namespace):
    from .scorer import BERTScorer

    return BERTScorer(
        model=args.model,
        layer=args.layer,
        idf=args.idf,
        rescale=args.rescale,
        baseline=args.baseline,
        device=args.device,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
        long_inputs=getattr(args, "long_inputs", "truncate"),
        window_stride=getattr(args, "window_stride", None),
    )


def cmd_score(args: argparse.Namespace) -> int:
    from .lightning.cli import cmd_score_distributed, is_distributed

    if args.stream:
        return cmd_score_stream(args)
    if args.pairs:
        raise ValueError("--pairs is read with --stream; without it give -c CANDS -r REFS")
    if is_distributed(args):
        return cmd_score_distributed(args)
    cands, refs = read_score_inputs(args)
    scorer = scorer_from_args(args)
    p, r, f = scorer.score(cands, refs)
    out = sys.stdout
    if args.per_line:
        for a, b, c in zip(p.tolist(), r.tolist(), f.tolist()):
            out.write(f"{a:.6f}\t{b:.6f}\t{c:.6f}\n")
    else:
        if len(cands):
            out.write(f"P: {p.mean().item():.6f}  R: {r.mean().item():.6f}  F: {f.mean().item():.6f}\n")
        else:
            out.write("no pairs\n")
        out.write(scorer.signature() + "\n")
    return 0


def cmd_score_stream(args: argparse.Namespace) -> int:
    """``score --stream``: P<TAB>R<TAB>F per pair on stdout as each chunk is done; means and signature on stderr."""
    if not args.pairs and (not args.cands or not args.refs):
        raise ValueError("--stream needs --pairs FILE, or -c CANDS and -r REFS")
    if args.idf:
        raise ValueError("--stream does not take --idf: IDF over each chunk's references would depend on the chunking")
    scorer = scorer_from_args(args)
    total = [0.0, 0.0, 0.0]
    n = 0
    for chunk in scorer.score_stream(iter_pairs(args), chunk_size=args.chunk_size):
        lines = zip(chunk.precision.tolist(), chunk.recall.tolist(), chunk.f1.tolist())
        sys.stdout.write("".join(f"{a:.6f}\t{b:.6f}\t{c:.6f}\n" for a, b, c in lines))
        sys.stdout.flush()
        for k, x in enumerate(chunk[:3]):
            total[k] += float(x.double().sum())
        n += len(chunk.f1)
    means = "  ".join(f"{m}: {t / max(n, 1):.6f}" for m, t in zip("PRF", total))
    print(f"{n} pairs  {means}\n{scorer.signature()}", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from rerank.cli import add_parser as add_rerank_parser

    from .lightning.cli import add_distributed_args
    from .quality.cli import add_baseline_parser, add_plot_parser, add_tune_layers_parser

    parser = argparse.ArgumentParser(prog="bertscore-loss", description="BERTScore for training and decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    sc = sub.add_parser("score", help="score candidates against references (one text per line)")
    sc.add_argument("-c", "--cands", help="candidates file, one per line")
    sc.add_argument("-r", "--refs", action="append", help="references file; repeat for multi-reference")
    sc.add_argument("--per-line", action="store_true", help="print P<TAB>R<TAB>F per input pair instead of means")
    sc.add_argument(
        "--stream",
        action="store_true",
        help="read the inputs lazily and score them in chunks in bounded memory; prints P<TAB>R<TAB>F per pair",
    )
    sc.add_argument("--pairs", help="with --stream: a file of candidate<TAB>reference[<TAB>reference...] lines")
    sc.add_argument("--chunk-size", type=int, default=4096, help="pairs per chunk with --stream")
    add_scorer_args(sc)
    add_distributed_args(sc)
    sc.set_defaults(func=cmd_score)

    add_rerank_parser(sub)
    add_tune_layers_parser(sub)
    add_baseline_parser(sub)
    add_plot_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, ModelNotFoundError, BaselineNotFoundError) as exc:
        print(f"bertscore-loss: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
