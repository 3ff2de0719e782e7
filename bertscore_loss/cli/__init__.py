"""The ``bertscore-loss`` command line: one module per subcommand, shared helpers in :mod:`.common`.

This package is the top layer: it may import every front end (``rerank``, ``bertscore_loss.lightning``,
``bertscore_loss.quality``); nothing imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from .. import ModelNotFoundError
from ..baseline import BaselineNotFoundError
from . import baseline, install_accurate, plot, rerank, score, tune_layers
from .common import quiet_libraries

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (each sets ``func``, its handler)."""
    parser = argparse.ArgumentParser(prog="bertscore-loss", description="BERTScore for training and decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details, library progress bars and warnings")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (score, rerank, tune_layers, baseline, plot, install_accurate):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; errors are one line on stderr (exit status 2), never a traceback."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    quiet_libraries(args.verbose)
    try:
        return args.func(args)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT
        print("bertscore-loss: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (e.g. `| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, OSError, ModelNotFoundError, BaselineNotFoundError) as exc:
        print(f"bertscore-loss: error: {exc}", file=sys.stderr)
        return 2
