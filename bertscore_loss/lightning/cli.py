"""``bertscore-loss score ... --devices N [--num-nodes K] [--accelerator cpu|gpu]``: scoring under DDP.

``add_distributed_args`` adds the options to the ``score`` parser; ``cmd_score`` hands over to
:func:`run_score` (or to :func:`cmd_score_distributed` as a whole) when ``--devices`` or ``--num-nodes`` > 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from torch import Tensor

from ..cli import read_score_inputs


def add_distributed_args(p: argparse.ArgumentParser) -> None:
    """``--devices``, ``--num-nodes``, ``--accelerator``, ``--strategy``, ``--batch-pairs`` on a ``score`` parser."""
    g = p.add_argument_group("distributed scoring (Lightning DDP; used when --devices or --num-nodes > 1)")
    g.add_argument("--devices", type=int, default=1, help="processes (CPU) or GPUs per node (default: 1)")
    g.add_argument("--num-nodes", type=int, default=1, help="number of nodes (default: 1)")
    g.add_argument(
        "--accelerator", default="auto", choices=["cpu", "gpu", "auto"], help="device kind (default: gpu if present)"
    )
    g.add_argument(
        "--strategy",
        default="auto",
        choices=["auto", "ddp", "ddp_spawn", "ddp_fork"],
        help="auto = ddp under torchrun/SLURM, else ddp_spawn; ddp_fork starts fast, CPU ranks single-threaded",
    )
    g.add_argument("--batch-pairs", type=int, default=512, help="pairs per predict step on a rank (default: 512)")


def is_distributed(args: argparse.Namespace) -> bool:
    """True when the command asks for more than one process."""
    return getattr(args, "devices", 1) > 1 or getattr(args, "num_nodes", 1) > 1


def scorer_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`ScorerConfig` fields given by ``add_scorer_args`` options (without ``device``)."""
    if getattr(args, "device", None) is not None:
        raise ValueError("--device does not apply to distributed scoring: use --accelerator cpu|gpu with --devices N")
    return {
        "model": args.model,
        "layer": args.layer,
        "idf": args.idf,
        "rescale": args.rescale,
        "baseline": args.baseline,
        "dtype": args.dtype,
        "batch_tokens": args.batch_tokens,
    }


def _run(cands: Sequence[str], refs: Any, scorer_kwargs: dict[str, Any], args: argparse.Namespace):
    from .distributed import score_distributed_full

    kwargs = {k: v for k, v in scorer_kwargs.items() if k != "device"}
    return score_distributed_full(
        cands,
        refs,
        kwargs,
        devices=args.devices,
        num_nodes=args.num_nodes,
        accelerator=args.accelerator,
        strategy=getattr(args, "strategy", "auto"),
        batch_pairs=getattr(args, "batch_pairs", 512),
        verbose=getattr(args, "verbose", False),
    )


def run_score(
    cands: Sequence[str], refs: Any, scorer_kwargs: dict[str, Any], args: argparse.Namespace
) -> tuple[Tensor, Tensor, Tensor] | None:
    """P, R, F ``[N]`` in input order, scored by ``args.devices × args.num_nodes`` ranks.

    Returns None on processes other than global rank 0 (under ``ddp``, every rank runs the command):
    print nothing there.
    """
    out = _run(cands, refs, scorer_kwargs, args)
    return None if out is None else (out.precision, out.recall, out.f1)


def cmd_score_distributed(args: argparse.Namespace) -> int:
    """The ``score`` command under DDP: same inputs and output format as ``bertscore-loss score``."""
    scorer_kwargs = scorer_kwargs_from_args(args)
    cands, refs = read_score_inputs(args)
    out = _run(cands, refs, scorer_kwargs, args)
    if out is None:  # not global rank 0
        return 0
    stdout = sys.stdout
    if args.per_line:
        for a, b, c in zip(out.precision.tolist(), out.recall.tolist(), out.f1.tolist()):
            stdout.write(f"{a:.6f}\t{b:.6f}\t{c:.6f}\n")
    else:
        if len(cands):
            p, r, f = (x.mean().item() for x in (out.precision, out.recall, out.f1))
            stdout.write(f"P: {p:.6f}  R: {r:.6f}  F: {f:.6f}\n")
        else:
            stdout.write("no pairs\n")
        stdout.write(out.signature + "\n")
    return 0
