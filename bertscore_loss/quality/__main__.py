"""``python -m bertscore_loss.quality {tune-layers,baseline,plot} ...`` (same as ``bertscore-loss <command>``)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..baseline import BaselineNotFoundError
from ..encoder import ModelNotFoundError
from .cli import add_baseline_parser, add_plot_parser, add_tune_layers_parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bertscore_loss.quality", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)
    add_tune_layers_parser(sub)
    add_baseline_parser(sub)
    add_plot_parser(sub)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError, ModelNotFoundError, BaselineNotFoundError) as exc:
        print(f"bertscore-loss: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
