"""``bertscore-loss score``: means, per-line scores, a bounded-memory stream, or Lightning DDP (``--devices N``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from itertools import zip_longest

from ..textio import check_input_file, iter_lines
from .common import (
    UsageError,
    add_scorer_args,
    check_stdin_once,
    positive_int,
    read_input_lines,
    scorer_config_from_args,
    scorer_from_args,
    write_rows,
    write_summary,
)


def read_score_inputs(args: argparse.Namespace) -> tuple[list[str], list[str] | list[list[str]]]:
    """Candidates of ``-c`` and references of the ``-r`` files (several files = multi-reference)."""
    if not args.cands or not args.refs:
        raise UsageError("give -c CANDS and -r REFS (or --stream --pairs FILE)")
    check_stdin_once([args.cands, *args.refs], ["-c", *["-r"] * len(args.refs)])
    cands = read_input_lines(args.cands, "-c")
    ref_files = [read_input_lines(r, "-r") for r in args.refs]
    for path, lines in zip(args.refs, ref_files):
        if len(lines) != len(cands):
            raise ValueError(f"{args.cands} has {len(cands)} lines but {path} has {len(lines)}: the lengths must match")
    refs = ref_files[0] if len(ref_files) == 1 else [list(g) for g in zip(*ref_files)]
    return cands, refs


def iter_pairs(args: argparse.Namespace) -> Iterator[tuple[str, str | list[str]]]:
    """Pairs read lazily line by line: from ``--pairs`` (``candidate<TAB>reference[<TAB>reference…]``)
    or from ``-c`` and the ``-r`` files side by side (ValueError when one file ends before the others)."""
    if args.pairs:
        for n, line in enumerate(iter_lines(args.pairs, what="--pairs file"), 1):
            cand, *refs = line.split("\t")
            if not refs:
                raise ValueError(f"{args.pairs}:{n}: no TAB: expected candidate<TAB>reference")
            yield cand, refs[0] if len(refs) == 1 else refs
        return
    paths = [args.cands, *args.refs]
    with ExitStack() as stack:
        readers = [stack.enter_context(_closing(iter_lines(p, what="input file"))) for p in paths]
        for n, lines in enumerate(zip_longest(*readers), 1):
            if any(x is None for x in lines):
                ended = [p for p, x in zip(paths, lines) if x is None]
                raise ValueError(f"{', '.join(ended)} ended at line {n - 1} before the other input(s)")
            cand, *refs = lines
            yield cand, refs[0] if len(refs) == 1 else refs


class _closing:
    """Close a generator (and so its file) when the block ends."""

    def __init__(self, gen: Generator[str, None, None]) -> None:
        self.gen = gen

    def __enter__(self) -> Iterator[str]:
        return self.gen

    def __exit__(self, *exc: object) -> None:
        self.gen.close()


def is_distributed(args: argparse.Namespace) -> bool:
    """True when the command asks for more than one process."""
    return getattr(args, "devices", 1) > 1 or getattr(args, "num_nodes", 1) > 1


def cmd_score(args: argparse.Namespace) -> int:
    if args.stream:
        return cmd_score_stream(args)
    if args.pairs:
        raise UsageError("--pairs is read with --stream; without it give -c CANDS -r REFS")
    if args.chunk_size is not None:
        raise UsageError("--chunk-size is used with --stream only")
    if is_distributed(args):
        return cmd_score_distributed(args)
    _check_not_distributed_only(args)
    cands, refs = read_score_inputs(args)
    scorer = scorer_from_args(args)
    p, r, f = scorer.score(cands, refs)
    if args.per_line:
        write_rows(p.tolist(), r.tolist(), f.tolist())
    means = (p.mean().item(), r.mean().item(), f.mean().item()) if len(cands) else None
    write_summary(len(cands), means, scorer.signature(), per_line=args.per_line)
    return 0


def _check_not_distributed_only(args: argparse.Namespace) -> None:
    given = [flag for flag, value, default in _DISTRIBUTED_ONLY if getattr(args, value) != default]
    if given:
        raise UsageError(f"{', '.join(given)} apply to distributed scoring only (--devices N > 1 or --num-nodes > 1)")


_DISTRIBUTED_ONLY = [
    ("--accelerator", "accelerator", "auto"),
    ("--strategy", "strategy", "auto"),
    ("--batch-pairs", "batch_pairs", 512),
]


def cmd_score_stream(args: argparse.Namespace) -> int:
    """``score --stream``: P<TAB>R<TAB>F per pair on stdout as each chunk is done; the summary on stderr."""
    if args.pairs and (args.cands or args.refs):
        raise UsageError("--stream reads --pairs FILE or -c CANDS -r REFS, not both")
    if not args.pairs and (not args.cands or not args.refs):
        raise UsageError("--stream needs --pairs FILE, or -c CANDS and -r REFS")
    if is_distributed(args):
        raise UsageError("--stream runs in one process: drop --devices/--num-nodes (or --stream)")
    _check_not_distributed_only(args)
    if args.idf:
        raise UsageError("--stream does not take --idf: IDF over each chunk's references would depend on the chunking")
    if args.per_line:
        raise UsageError("--stream always prints one line per pair: drop --per-line")
    paths = [args.pairs] if args.pairs else [args.cands, *args.refs]
    check_stdin_once(paths, ["--pairs"] if args.pairs else ["-c", *["-r"] * len(args.refs)])
    for p in paths:
        if p != "-":
            check_input_file(p, "input")
    scorer = scorer_from_args(args)
    total = [0.0, 0.0, 0.0]
    n = 0
    try:
        for chunk in scorer.score_stream(iter_pairs(args), chunk_size=args.chunk_size or 4096):
            write_rows(chunk.precision.tolist(), chunk.recall.tolist(), chunk.f1.tolist())
            sys.stdout.flush()
            for k, x in enumerate(chunk):
                total[k] += float(x.double().sum())
            n += len(chunk.f1)
    except KeyboardInterrupt:  # every written line is whole (a chunk is one write): say how far it got
        sys.stdout.flush()
        print(f"bertscore-loss: interrupted after {n} pairs (their lines are complete)", file=sys.stderr)
        write_summary(n, [t / n for t in total] if n else None, scorer.signature(), per_line=True)
        return 130
    write_summary(n, [t / n for t in total] if n else None, scorer.signature(), per_line=True)
    return 0


def cmd_score_distributed(args: argparse.Namespace) -> int:
    """The ``score`` command under DDP: same inputs and output as in one process (``--per-line`` in input order)."""
    from ..lightning.distributed import score_distributed_full

    if args.device is not None:
        raise UsageError("--device does not apply to distributed scoring: use --accelerator cpu|gpu with --devices N")
    config = scorer_config_from_args(args, device=False)  # every setting, long inputs included
    cands, refs = read_score_inputs(args)
    out = score_distributed_full(
        cands,
        refs,
        config,
        devices=args.devices,
        num_nodes=args.num_nodes,
        accelerator=args.accelerator,
        strategy=args.strategy,
        batch_pairs=args.batch_pairs,
        verbose=args.verbose,
    )
    if out is None:  # not global rank 0
        return 0
    if args.per_line:
        write_rows(out.precision.tolist(), out.recall.tolist(), out.f1.tolist())
    means = tuple(x.mean().item() for x in (out.precision, out.recall, out.f1)) if len(cands) else None
    write_summary(len(cands), means, out.signature, per_line=args.per_line)
    return 0


def register(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``score`` to the ``bertscore-loss`` subcommands."""
    sc = sub.add_parser("score", help="score candidates against references (one text per line)")
    sc.add_argument("-c", "--cands", help="candidates file, one per line ('-' = standard input)")
    sc.add_argument("-r", "--refs", action="append", help="references file; repeat for multi-reference")
    sc.add_argument(
        "--per-line",
        action="store_true",
        help="print P<TAB>R<TAB>F per input pair on stdout (means and signature go to stderr)",
    )
    sc.add_argument(
        "--stream",
        action="store_true",
        help="read the inputs lazily and score them in chunks in bounded memory; prints P<TAB>R<TAB>F per pair",
    )
    sc.add_argument("--pairs", help="with --stream: a file of candidate<TAB>reference[<TAB>reference...] lines")
    sc.add_argument(
        "--chunk-size", type=positive_int, default=None, help="pairs per chunk with --stream (default 4096)"
    )
    add_scorer_args(sc)
    g = sc.add_argument_group("distributed scoring (Lightning DDP; used when --devices or --num-nodes > 1)")
    g.add_argument("--devices", type=positive_int, default=1, help="processes (CPU) or GPUs per node (default: 1)")
    g.add_argument("--num-nodes", type=positive_int, default=1, help="number of nodes (default: 1)")
    g.add_argument(
        "--accelerator", default="auto", choices=["cpu", "gpu", "auto"], help="device kind (default: gpu if present)"
    )
    g.add_argument(
        "--strategy",
        default="auto",
        choices=["auto", "ddp", "ddp_spawn", "ddp_fork"],
        help="auto = ddp under torchrun/SLURM, else ddp_spawn; ddp_fork starts fast, CPU ranks single-threaded",
    )
    g.add_argument(
        "--batch-pairs", type=positive_int, default=512, help="pairs per predict step on a rank (default: 512)"
    )
    sc.set_defaults(func=cmd_score)
    return sc
