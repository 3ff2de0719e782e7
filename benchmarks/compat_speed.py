"""CPU speed of the ``bert-score`` drop-in: ``bertscore_loss.compat.score`` against ``bert_score.score`` and the
native ``bertscore_loss.BERTScorer``, in float32, measured in the same run.

Scores the WMT16 DAseg dev pairs (6 language pairs x 560) with the bundled all-MiniLM-L6-v2 and prints a
markdown table of wall-clock times per call (best of ``--repeats`` after one untimed warm-up), the ratios, and
the largest score difference against ``bert_score.score``. The CPU model and its bf16 kind label the table.

    python benchmarks/compat_speed.py --repeats 3
    python benchmarks/compat_speed.py --limit 300 --idf     # quick check

Rows (one call each, as a user writes it):

* ``bert_score.score``: ``bert_score.score(cands, refs, model_type=<folder>, num_layers=k)``, which loads the
  model in every call.
* ``compat.score``: ``bertscore_loss.compat.score`` with the same arguments (the latest call's model stays
  loaded, so a warm call does not reload it).
* ``native BERTScorer.score``: ``BERTScorer(model=<folder>, layer=k).score`` on a constructed scorer.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib.metadata import version
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eval_speed import DEFAULT_DATA, best_time, cpu_bf16_label, cpu_model, load_pairs, max_abs_diff, quiet  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wmt16-daseg/ (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N pairs")
    ap.add_argument("--layer", type=int, default=4, help="encoder layer (default: %(default)s)")
    ap.add_argument("--idf", action="store_true", help="IDF weighting over the references of each call")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per row; the best is kept (default: 3)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be at least 1")
    outputs = [args.json] if args.json else []
    check_outputs_or_exit(ap, outputs, overwrite=args.overwrite, allow_docs=True, flag="--json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    import bert_score

    from bertscore_loss import BERTScorer, bundled_model_path, compat

    cands, refs = load_pairs(args.data, args.limit)
    model = bundled_model_path()
    kw = {"model_type": model, "num_layers": args.layer, "idf": args.idf, "device": "cpu"}
    env = {
        "cpu": cpu_model(),
        "bf16": cpu_bf16_label(),
        "threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "bert_score": version("bert-score"),
    }
    print(f"{len(cands)} pairs | layer {args.layer} | idf {args.idf} | float32 | best of {args.repeats}", flush=True)
    print(f"CPU: {env['cpu']} (bf16: {env['bf16']}), {env['threads']} torch threads", flush=True)

    rows: dict[str, float] = {}
    (rows["bert_score.score"], _), theirs = best_time(lambda: bert_score.score(cands, refs, **kw), args.repeats)
    (rows["compat.score"], _), ours = best_time(lambda: compat.score(cands, refs, **kw), args.repeats)
    native = BERTScorer(model=model, layer=args.layer, idf=args.idf, device="cpu")
    (rows["native BERTScorer.score"], _), mine = best_time(lambda: native.score(cands, refs), args.repeats)
    diff = max_abs_diff(ours, theirs)
    base = rows["bert_score.score"]
    print("\n| call | seconds | bert_score.score / this |\n| --- | ---: | ---: |")
    for name, sec in rows.items():
        print(f"| `{name}` | {sec:.2f} | {base / sec:.2f}x |")
    print(
        f"\ncompat.score is {base / rows['compat.score']:.2f}x bert_score.score and "
        f"{rows['native BERTScorer.score'] / rows['compat.score']:.2f}x the native path (>1: faster); "
        f"max |dP| {diff['P']:.1e}, |dR| {diff['R']:.1e}, |dF| {diff['F']:.1e} against bert_score.score; "
        f"native vs compat max |dF| {max_abs_diff(mine, ours)['F']:.1e}"
    )
    if args.json:
        record = {"env": env, "pairs": len(cands), "layer": args.layer, "idf": args.idf, "seconds": rows}
        record["max_abs_diff"] = diff
        write_text(args.json, json.dumps(record, indent=2) + "\n", overwrite=args.overwrite, allow_docs=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
