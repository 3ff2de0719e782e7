"""MBR-BERTScore over many samples per source: ``rerank.mbr`` against ``mbrs`` on the same lists.

The lists are sample lists saved by ``studies/multi30k/mbr_sweep.py`` (``<run>/lists/<set>/eps<n>.json``)
or any JSON list of candidate lists. Every system uses the bundled all-MiniLM-L6-v2 at ``--layer`` (4),
float32, the same torch threads; hypotheses and pseudo-references are the same list. Systems:

* ours ``exact (j = i counted)``: the rule of ``mbrs`` (mean over every pseudo-reference, the
  hypothesis' own column included), for the like-for-like time and choice comparison;
* ours ``exact`` (default: j != i), ``aggregate``, ``aggregate-exact`` (top 20), ``prune``;
* ``mbrs`` ``DecoderMBR`` and ``DecoderPruningMBR`` (its defaults: alpha 0.99, schedule 8..256, 500
  bootstraps) with ``MetricBERTScore``, in their own venv (``mbrs`` pins ``transformers < 5``; created on
  first use as in ``rerank_speed.py``).

Timed in alternating rounds (ours, then mbrs in its subprocess), the best round of each kept, after a
warm-up. Agreement: the share of sources where a system chooses the same text as ``mbrs``'s exact
decoder, and where ``mbrs``'s choice is an argmax of our exact expectation (within 1e-5: float noise).

    python benchmarks/mbr_speed.py --lists runs/mbr/val/lists/val/eps256.json --sources 60 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from eval_speed import cpu_model, quiet  # noqa: E402
from rerank_speed import DEFAULT_VENV, ensure_mbrs_venv  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402


def load(path: Path, count: int | None) -> list[list[str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    lists = data["texts"] if isinstance(data, dict) else data
    return [list(x) for x in lists[:count]]


def run_mbrs(py: Path, lists: list[list[str]], args: argparse.Namespace) -> dict[str, Any]:
    job = {
        "candidates": lists,
        "layer": args.layer,
        "batch_size": args.batch_size,
        "repeats": 1,
        "threads": args.threads,
        "decoders": ["mbr", "pruning_mbr"],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as fh:
        json.dump(job, fh)
    try:
        proc = subprocess.run([str(py), str(HERE / "_mbrs_timing.py"), fh.name], capture_output=True, text=True)
    finally:
        os.unlink(fh.name)
    if proc.returncode != 0:
        raise RuntimeError(f"mbrs timing failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lists", type=Path, required=True, help="JSON: candidate lists (or mbr_sweep's eps<n>.json)")
    ap.add_argument("--sources", type=int, default=None, help="first N lists (default: all)")
    ap.add_argument("--layer", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=64, help="mbrs batch size")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--mbrs-venv", type=Path, default=DEFAULT_VENV)
    ap.add_argument("--no-mbrs", action="store_true")
    ap.add_argument(
        "--bf16", action="store_true", help="also ours with the encoder in bfloat16 (approximate; native bf16 CPUs)"
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": True, "flag": "--json"}  # --json is always explicit
    check_outputs_or_exit(ap, [args.json] if args.json else [], **rules)
    quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    from bertscore_loss import BERTScorer
    from rerank import mbr
    from rerank.bertscore_utility import BERTScoreUtility
    from rerank.mbr import AggregateExact

    lists = load(args.lists, args.sources)
    utility = BERTScoreUtility(BERTScorer(layer=args.layer, progress=False))
    ours: dict[str, dict[str, Any]] = {
        "ours exact (j = i counted, the mbrs rule)": {"method": "exact", "include_self": True},
        "ours exact (j != i)": {"method": "exact"},
        "ours aggregate": {"method": "aggregate"},
        "ours aggregate-exact (top 20)": {"method": AggregateExact(top_k=20)},
        "ours prune": {"method": "prune"},
    }
    if args.bf16:
        half = BERTScoreUtility(BERTScorer(layer=args.layer, progress=False, dtype="bfloat16"))
        ours["ours exact (j = i counted), encoder bf16"] = {"method": "exact", "include_self": True, "utility": half}
        ours["ours aggregate-exact (top 20), encoder bf16"] = {"method": AggregateExact(top_k=20), "utility": half}
    py = None if args.no_mbrs else ensure_mbrs_venv(args.mbrs_venv)
    for options in ours.values():  # warm-up
        mbr(lists[:3], **{"utility": utility, **options})
    best: dict[str, float] = {}
    choices: dict[str, list[str]] = {}
    exact_self: list[torch.Tensor] = []
    mbrs_info: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, options in ours.items():
            t0 = time.perf_counter()
            res = mbr(lists, progress=False, **{"utility": utility, **options})
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
            choices[name] = [r.best for r in res]
            if options.get("include_self") and "utility" not in options:
                exact_self = [r.expected for r in res]
        if py is not None:
            info = run_mbrs(py, lists, args)
            mbrs_info = {"versions": info["versions"], "threads": info["threads"]}
            for dec, label in (("mbr", "mbrs DecoderMBR"), ("pruning_mbr", "mbrs DecoderPruningMBR")):
                d = info["decoders"][dec]
                best[label] = min(best.get(label, float("inf")), d["seconds"])
                choices[label] = [lst[i] for lst, i in zip(lists, d["choices"])]
    sizes = [len(x) for x in lists]
    distinct = sum(len(set(x)) for x in lists) / sum(sizes)
    flags = sorted({"avx512_bf16", "amx_bf16"} & set(Path("/proc/cpuinfo").read_text().split()))
    print(
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs, bf16 flags: {', '.join(flags) or 'none'}) "
        f"| torch {torch.__version__} | threads {torch.get_num_threads()}"
    )
    print(
        f"lists: {args.lists} | {len(lists)} sources x {min(sizes)}-{max(sizes)} candidates ({100 * distinct:.0f}% "
        f"distinct) | MiniLM layer {args.layer}, float32 | best of {args.rounds} alternating rounds"
    )
    if mbrs_info:
        v = mbrs_info["versions"]
        print(
            f"mbrs {v['mbrs']} (torch {v['torch']}, transformers {v['transformers']}, {mbrs_info['threads']} threads)"
        )
    print()
    ref = "mbrs DecoderMBR" if "mbrs DecoderMBR" in best else None
    print("| system | seconds | s / source | speed vs mbrs DecoderMBR | same text as mbrs DecoderMBR |")
    print("|---|---:|---:|---:|---:|")
    rows = []
    for name, t in best.items():
        same = None
        if ref is not None:
            same = sum(a.strip() == b.strip() for a, b in zip(choices[name], choices[ref])) / len(lists)
        speed = best[ref] / t if ref else None
        rows.append({"system": name, "seconds": t, "speedup_vs_mbrs": speed, "same_as_mbrs": same})
        print(
            f"| {name} | {t:.2f} | {t / len(lists):.3f} | {'–' if speed is None else f'{speed:.2f}x'} | "
            f"{'–' if same is None else f'{100 * same:.1f}%'} |"
        )
    if ref is not None and exact_self:
        tie = sum(
            float(e[lst.index(c)]) >= float(e.max()) - 1e-5 for e, lst, c in zip(exact_self, lists, choices[ref])
        ) / len(lists)
        print(
            "\nmbrs DecoderMBR's choice is an argmax of our exact expectation (same rule, within 1e-5): "
            f"{100 * tie:.1f}%"
        )
    if args.json:
        env = {"cpu": cpu_model(), "bf16_flags": flags, "threads": torch.get_num_threads(), "torch": torch.__version__}
        out = {"env": env, "lists": str(args.lists), "sources": len(lists), "rows": rows, "mbrs": mbrs_info}
        write_text(args.json, json.dumps(out, indent=1) + "\n", **rules)
    return 0


if __name__ == "__main__":
    sys.exit(main())
