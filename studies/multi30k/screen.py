"""The "universal output" screen of metric gaming (``metrics.universal_screen``) over translation files of one
Multi30k split: each file's MiniLM F against its own references, against the references of other sentences
drawn at random, their gap, and the hypotheses that score highest against random references; with
``--against FILE`` also each file's paired bootstrap p-values against that baseline (``metrics.paired_bootstrap``:
BLEU, chrF, MiniLM F and, with ``--judge``, the MPNet judge's F).

    python studies/multi30k/screen.py runs/multi30k/self-training/dpo-seed0/val.en base.val.en --split val \\
        --out runs/multi30k/self-training/screen-val.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("hyps", nargs="+", help="translation files, one line per source line of the split")
    p.add_argument("--split", default="val")
    p.add_argument("--limit", type=int, help="the split's first N sentences only (files of N lines)")
    p.add_argument("--multi30k", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    p.add_argument("--draws", type=int, default=8, help="random references per hypothesis")
    p.add_argument("--against", help="a baseline's translations of the split: paired bootstrap p of each file")
    p.add_argument("--judge", action="store_true", help="with --against: also the judge's p (extra `accurate`)")
    p.add_argument("--out", help="write the screens here (JSON); printed either way")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.path.insert(0, str(HERE))
    import metrics
    import nmt

    from bertscore_loss.outputs import write_json
    from bertscore_loss.textio import read_lines

    if args.limit is not None and args.limit < 1:
        raise SystemExit(f"--limit must be >= 1, got {args.limit}")
    _, refs = nmt.read_pairs(Path(args.multi30k), args.split, args.limit)
    scope = f"the first {len(refs)} of {args.split}" if args.limit else f"the {args.split} split has {len(refs)}"

    def lines_of(path: str) -> list[str]:
        hyps = read_lines(path)
        if len(hyps) != len(refs):
            raise SystemExit(f"{path}: {len(hyps)} lines, {scope}")
        return hyps

    baseline = lines_of(args.against) if args.against else None
    screens = {}
    for path in args.hyps:
        hyps = lines_of(path)
        screens[path] = metrics.universal_screen(hyps, refs, draws=args.draws)
        if baseline is not None:
            tested = metrics.paired_bootstrap(baseline, hyps, refs, with_judge=args.judge)
            screens[path]["against"] = {"baseline": args.against, **tested}
    if args.out:
        write_json(Path(args.out), screens, overwrite=True)
    keys = ("matched_f", "random_f", "gap", "against")
    print(json.dumps({p: {k: s[k] for k in keys if k in s} for p, s in screens.items()}, indent=1))
    return screens


if __name__ == "__main__":
    main()
