"""Seconds per update of the Multi30k stage-2 arms, as ratios to the cross-entropy control, in one run.

Each arm fine-tunes the stage-1 model for ``--updates`` updates on the same batches with the settings of
``configs/translation/stage2.yaml`` (no evaluation), one after the other in this process's threads; the
first ``--skip`` updates of each arm (warm-up: first batches, allocator, encoder load) are not counted.
Run it with nothing else on the machine: another CPU-heavy job changes every figure.

    OMP_NUM_THREADS=1 python benchmarks/translation_arms.py --threads 1      # needs runs/multi30k/stage1/model

Prints a markdown table and writes ``docs/translation-arms-speed.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "translation"))
import nmt  # noqa: E402
import recipe  # noqa: E402

ARMS = {"ce": {}, "bertscore": {}, "mrt": {"weight": 10.0}}  # the weights of the stage-2 tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "translation" / "stage2.yaml"))
    parser.add_argument("--updates", type=int, default=25)
    parser.add_argument("--skip", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "docs" / "translation-arms-speed.json"))
    args = parser.parse_args(argv)
    if args.skip >= args.updates:
        raise SystemExit(f"--skip {args.skip} leaves no update of --updates {args.updates} to time")
    torch.set_num_threads(args.threads)
    base = recipe.load_config(recipe.Stage2Config, args.config, {})
    if not recipe.resolve(base.init).is_dir():
        raise SystemExit(f"no stage-1 model at {base.init}: run recipe.py stage1 first")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, extra in ARMS.items():
            cfg = dataclasses.replace(
                base, arm=arm, seed=0, updates=args.updates, out=tmp, eval_sets=[], blind=False, **extra
            )
            recipe.stage2(cfg)
            timed = json.loads((Path(tmp) / f"{arm}-seed0" / "result.json").read_text())
            steps = timed["step_seconds"][args.skip :]
            rows[arm] = sum(steps) / len(steps)
    result = {
        "cpu": nmt.cpu_label(),
        "threads": args.threads,
        "precision": recipe.precision_of(base.precision),
        "updates_timed": args.updates - args.skip,
        "seconds_per_update": rows,
        "ratio_to_ce": {arm: v / rows["ce"] for arm, v in rows.items()},
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['cpu']}, {args.threads} thread(s), {result['precision']}, {result['updates_timed']} updates timed")
    print("| arm | s / update | × ce |")
    print("| --- | --- | --- |")
    for arm, v in rows.items():
        print(f"| {arm} | {v:.2f} | {v / rows['ce']:.1f}× |")


if __name__ == "__main__":
    main()
