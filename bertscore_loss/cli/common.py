"""What every subcommand shares: scorer options, input readers, output checks, quiet libraries."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import ScorerConfig
from ..outputs import add_overwrite_argument, check_output
from ..textio import check_input_file, read_lines

if TYPE_CHECKING:
    from ..scorer import BERTScorer


class UsageError(ValueError):
    """A command-line mistake (options that contradict each other or would be silently ignored)."""


def positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def quiet_libraries(verbose: bool) -> None:
    """No "Loading weights" bars, advisory warnings or Lightning notices on stderr unless ``verbose``.

    Environment variables carry the choice into processes started for distributed scoring.
    """
    if verbose:
        return
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning,ignore::FutureWarning")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    for category in (DeprecationWarning, FutureWarning, PendingDeprecationWarning):
        warnings.filterwarnings("ignore", category=category)
    warnings.filterwarnings("ignore", module=r"(pytorch_)?lightning.*")
    warnings.filterwarnings("ignore", module=r"lightning_fabric.*")


# --- scorer options ---------------------------------------------------------------------------------
def add_model_args(p: argparse.ArgumentParser) -> None:
    """Options of every command that loads a model."""
    p.add_argument("--model", "-m", default=None, help="HF model name (local cache) or folder; default: bundled MiniLM")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if present)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument(
        "--batch-tokens",
        type=positive_int,
        default=None,
        help="padded tokens per encoder batch (default: 2048 CPU, 8192 GPU)",
    )


def add_scorer_args(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that builds a scorer."""
    add_model_args(p)
    p.add_argument("--layer", "-l", type=int, default=None, help="layer to use (default: the model's preset)")
    p.add_argument("--idf", action="store_true", help="weight tokens by IDF over the references")
    p.add_argument("--rescale", action="store_true", help="rescale with a baseline (x - b) / (1 - b)")
    p.add_argument(
        "--baseline", default=None, help="with --rescale: baseline file in the bert-score format LAYER,P,R,F"
    )
    p.add_argument(
        "--long-inputs",
        default="truncate",
        choices=["truncate", "window"],
        help="texts over the model's maximum length: cut them (default, as bert-score) or encode overlapping windows",
    )
    p.add_argument(
        "--window-stride",
        type=positive_int,
        default=None,
        help="with --long-inputs window: text tokens between windows (default: half a window)",
    )


def scorer_config_from_args(args: argparse.Namespace, *, device: bool = True) -> ScorerConfig:
    """The :class:`ScorerConfig` of the ``add_scorer_args`` options (errors name the flags)."""
    if args.baseline is not None and not args.rescale:
        raise UsageError("--baseline is only read with --rescale: add --rescale (or drop --baseline)")
    if args.window_stride is not None and args.long_inputs != "window":
        raise UsageError("--window-stride is only used with --long-inputs window")
    if args.baseline is not None:
        check_input_file(args.baseline, "--baseline file")
    config = ScorerConfig(
        model=args.model,
        layer=args.layer,
        idf=args.idf,
        rescale=args.rescale,
        baseline=args.baseline,
        device=args.device if device else None,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
        long_inputs=args.long_inputs,
        window_stride=args.window_stride,
    )
    return config.validate()


def scorer_from_args(args: argparse.Namespace) -> BERTScorer:
    """The :class:`BERTScorer` of the ``add_scorer_args`` options."""
    from ..scorer import BERTScorer

    return BERTScorer(scorer_config_from_args(args))


# --- inputs and outputs ---------------------------------------------------------------------------------
def check_stdin_once(paths: Sequence[str | None], flags: Sequence[str]) -> None:
    """Standard input (``-``, ``/dev/stdin``, ``/dev/fd/0``) can feed one option only."""
    used = [f for p, f in zip(paths, flags) if p in ("-", "/dev/stdin", "/dev/fd/0", "/proc/self/fd/0")]
    if len(used) > 1:
        raise UsageError(f"{' and '.join(used)} all read standard input ('-'): at most one input can")


def read_input_lines(path: str, flag: str) -> list[str]:
    """Lines of the file given to ``flag`` (``-`` = standard input; lines end at ``\\n``/``\\r\\n`` only)."""
    return read_lines(path, what=f"{flag} file")


def add_overwrite_arg(p: argparse.ArgumentParser) -> None:
    """``--overwrite``: the one switch of the write rule (:mod:`bertscore_loss.outputs`)."""
    add_overwrite_argument(p)


def check_output_file(
    path: str | os.PathLike,
    flag: str,
    *,
    inputs: Sequence[str | os.PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = True,
) -> Path:
    """An output file path that can be written: not a directory, its folder exists, and the write rule lets
    it be written (not an input, not git-tracked without ``--overwrite``, not under ``docs/`` unless
    ``allow_docs``: the path was given explicitly). Checked before computing."""
    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(f"{flag} {str(p)!r} is a directory: give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise FileNotFoundError(f"{flag} {str(p)!r}: the folder {str(parent)!r} does not exist")
    return check_output(p, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag)


def check_output_dir(path: str | os.PathLike, flag: str) -> Path:
    """An output folder (created later when missing); an error when a file of that name exists."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise FileExistsError(f"{flag} {str(p)!r} is a file: give a folder name")
    return p


def write_summary(n: int, means: Sequence[float] | None, signature: object, *, per_line: bool) -> None:
    """The one rule for the summary (means and signature) of every scoring mode: on stdout when it is the
    output (means mode), on stderr when stdout carries one line per pair (``--per-line``, ``--stream``)."""
    values = None if means is None else "  ".join(f"{m}: {v:.6f}" for m, v in zip("PRF", means))
    if per_line:
        print(f"{n} pairs" + ("" if values is None else "  " + values) + f"\n{signature}", file=sys.stderr)
    else:
        sys.stdout.write(f"{values or 'no pairs'}\n{signature}\n")


def write_rows(p: Sequence[float], r: Sequence[float], f: Sequence[float]) -> None:
    """``P<TAB>R<TAB>F`` lines, one per pair."""
    sys.stdout.write("".join(f"{a:.6f}\t{b:.6f}\t{c:.6f}\n" for a, b, c in zip(p, r, f)))
