"""MBR at scale on Multi30k: beam 5 top-1 against MBR over n epsilon samples, every MBR method, one table.

    # a model folder (HF Marian + spm.model) from a stage-1 run's per-epoch weights (default: the latest)
    python studies/multi30k/mbr_sweep.py export --stage1 runs/multi30k/converged/stage1 --out runs/mbr/model
    # beam 5 and n in {32, 64, 128, 256} samples (epsilon 0.02), exact MBR and every approximation,
    # BERTScore and chrF utilities: runs/mbr/val/sweep.{json,md} (--tag NAME: sweep-NAME.{json,md})
    python studies/multi30k/mbr_sweep.py sweep --model runs/mbr/model --split val --run runs/mbr/val
    # the reranking time where the n^2 part dominates: n = 512 and 1,024 on 100 sources
    python studies/multi30k/mbr_sweep.py sweep --model runs/mbr/model --split test_2016_flickr --limit 100 \\
        --sizes 512 1024 --run runs/mbr/large
    # blind outputs: beam 5 top-1 and the n = 256 decoders (exact and one approximation, BERTScore and chrF);
    # --sets test_2017_flickr: only that blind set
    python studies/multi30k/mbr_sweep.py blind --model runs/mbr/model --run runs/mbr/blind --name converged

Every file is written by the project's write rule (``bertscore_loss.outputs``): atomically, and never over a
file git tracks (published outputs) without ``--overwrite``, which is checked before any decoding.

The candidate lists are saved under ``<run>/lists/<set>/`` (``beam5.json``, ``eps<n>.json``: texts, model
scores, seconds) and reused, so methods can be re-run without resampling (``--resample`` draws again).
Hypotheses and pseudo-references are the same samples; exact MBR leaves each sample's own column out.
Every row reports corpus BLEU, chrF, BERTScore F (bundled MiniLM, layer 4; ``metrics.py``), the length
ratio, utility evaluations and seconds per sentence (sampling and reranking), the peak extra resident
memory of the reranking call, and for the approximations their share of exact MBR's gain over beam top-1
(on the utility's own metric) and how often they choose exact MBR's candidate.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics  # noqa: E402
import nmt  # noqa: E402

from bertscore_loss.outputs import (  # noqa: E402
    OVERWRITE_HELP,
    OutputRefusedError,
    check_output,
    write_bytes,
    write_text,
)
from rerank import get_utility, mbr  # noqa: E402
from rerank.mbr import AggregateExact, Method, Prune, agreement, gain_share, get_method  # noqa: E402
from rerank.sampling import native_bf16  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("mbr_sweep")
METHODS: dict[str, Method] = {
    "exact": get_method("exact"),
    "aggregate": get_method("aggregate"),
    "aggregate-exact": AggregateExact(top_k=20),
    "prune": Prune(),
}
UTILITY_METRIC = {"bertscore": "bertscore_f", "chrf": "chrf", "bleu": "bleu"}


def resolve(path: str | Path) -> Path:
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


# Every path here is given on the command line (--run, --out, --outputs), so a path under docs/ was asked for.
def writable(paths, overwrite: bool = False) -> None:
    """Every one of ``paths`` may be written (checked before the work that makes them), else one line."""
    for path in paths:
        try:
            check_output(path, overwrite=overwrite, allow_docs=True, flag="--run/--outputs/--out")
        except (OutputRefusedError, OSError) as err:
            raise SystemExit(f"mbr_sweep.py: error: {err}") from None


def write(path: Path, data: str | bytes, overwrite: bool = False) -> None:
    """``data`` written to ``path`` by the write rule, or one line saying why not."""
    try:
        if isinstance(data, bytes):
            write_bytes(path, data, overwrite=overwrite, allow_docs=True, flag="--run/--outputs/--out")
        else:
            write_text(path, data, overwrite=overwrite, allow_docs=True, flag="--run/--outputs/--out")
    except OutputRefusedError as err:
        raise SystemExit(f"mbr_sweep.py: error: {err}") from None


# --- export ------------------------------------------------------------------------------------------------
def export(stage1: Path, out: Path, epoch: int | None = None, overwrite: bool = False) -> Path:
    """``out``: the HF Marian model of ``stage1/epochs/epoch-NNN.pt`` (default the latest) + ``spm.model``."""
    settings = json.loads((stage1 / "settings.json").read_text())
    epochs = sorted((stage1 / "epochs").glob("epoch-*.pt"))
    if epoch is not None:
        epochs = [p for p in epochs if p.name == f"epoch-{epoch:03d}.pt"]
    if not epochs:
        raise SystemExit(f"no epoch weights {'' if epoch is None else epoch} in {stage1 / 'epochs'}")
    model = nmt.build_model(nmt.ModelConfig(**settings["model"]), settings.get("vocab_size", 8000))
    model.load_state_dict(torch.load(epochs[-1], map_location="cpu"))
    writable([out / "spm.model", out / "exported-from.txt", out / "config.json", out / "model.safetensors"], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write(out / "spm.model", (stage1 / "spm.model").read_bytes(), overwrite)
    write(out / "exported-from.txt", f"{epochs[-1]}\n", overwrite)
    return out


def load_model(folder: Path):
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder).eval()
    import sentencepiece as spm

    return model, spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))


# --- memory ------------------------------------------------------------------------------------------------
class PeakRSS:
    """Peak resident memory above the level at entry (MiB), polled every few milliseconds on a thread."""

    def __init__(self, every: float = 0.005) -> None:
        self.every, self.peak_mib = every, 0.0

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self) -> PeakRSS:
        self.base = self.top = self.rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(self.every):
            self.top = max(self.top, self.rss())

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.top = max(self.top, self.rss())
        self.peak_mib = (self.top - self.base) / 2**20


# --- candidate lists ---------------------------------------------------------------------------------------
def decode_lists(model, sp, sources: list[str], sizes: list[int], folder: Path, args: argparse.Namespace) -> dict:
    """Beam-5 top-1 and the sample lists of ``sources``, read from ``folder`` or decoded and saved there."""
    folder.mkdir(parents=True, exist_ok=True)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and native_bf16("cpu"))
    prec = "bf16-mixed" if bf16 else "32-true"
    lists: dict[str, dict] = {}
    path = folder / "beam5.json"
    if path.exists() and not args.resample:
        lists["beam5"] = json.loads(path.read_text())
    else:
        t0 = time.perf_counter()
        texts = nmt.translate(model, sp, sources, beams=5, precision=prec)
        lists["beam5"] = {"texts": texts, "seconds": time.perf_counter() - t0, "precision": prec}
        write(path, json.dumps(lists["beam5"], ensure_ascii=False), args.overwrite)
    for n in sizes:
        path = folder / f"eps{n}.json"
        if path.exists() and not args.resample:
            lists[f"eps{n}"] = json.loads(path.read_text())
            continue
        t0 = time.perf_counter()
        texts, scores = nmt.sample(
            model,
            sp,
            sources,
            n,
            epsilon=args.epsilon,
            precision=prec,
            token_budget=args.token_budget,
            seed=args.seed + n,
        )
        seconds = time.perf_counter() - t0
        lists[f"eps{n}"] = {"texts": texts, "scores": scores, "seconds": seconds, "precision": prec}
        write(path, json.dumps(lists[f"eps{n}"], ensure_ascii=False), args.overwrite)
        logger.info(
            "eps%d: %d sources in %.1f s (%.0f samples/s)", n, len(sources), seconds, n * len(sources) / seconds
        )
    return lists


def utilities(names: list[str], dtype: str = "float32") -> dict:
    """The MBR utilities; BERTScore with the reporting scorer (bundled MiniLM, layer 4), or the same model
    with its encoder in ``dtype`` (bfloat16: a documented approximation, the matching stays float32)."""
    from bertscore_loss import BERTScorer

    def bertscore_scorer() -> BERTScorer:
        return metrics.scorer() if dtype == "float32" else BERTScorer(dtype=dtype)  # type: ignore[arg-type]

    return {
        u: get_utility(u, scorer=bertscore_scorer()) if u.startswith("bertscore") else get_utility(u) for u in names
    }


def run_methods(samples: list[list[str]], utility, methods: list[str], repeats: int = 1) -> dict[str, dict]:
    """Every method on the same lists (``repeats`` alternating rounds, the fastest kept): choices, results,
    evaluations, seconds, peak memory."""
    out: dict[str, dict] = {}
    for _ in range(repeats):
        for name in methods:
            with PeakRSS() as mem:
                t0 = time.perf_counter()
                results = mbr(samples, utility=utility, method=METHODS[name], progress=False)
                seconds = time.perf_counter() - t0
            if name not in out or seconds < out[name]["seconds"]:
                out[name] = {"results": results, "seconds": seconds, "peak_mib": mem.peak_mib}
    return out


# --- the sweep --------------------------------------------------------------------------------------------
def list_files(folder: Path, sizes: list[int], args: argparse.Namespace) -> list[Path]:
    """The candidate-list files ``decode_lists`` will write into ``folder`` (those missing, or all with --resample)."""
    paths = [folder / "beam5.json", *(folder / f"eps{n}.json" for n in sizes)]
    return [p for p in paths if args.resample or not p.exists()]


def sweep(args: argparse.Namespace) -> dict:
    data, run = resolve(args.data), resolve(args.run)
    name = f"sweep-{args.tag}" if args.tag else "sweep"
    lists_dir = run / "lists" / args.split
    writable([*list_files(lists_dir, args.sizes, args), run / f"{name}.json", run / f"{name}.md"], args.overwrite)
    model, sp = load_model(resolve(args.model))
    sources, refs = nmt.read_pairs(data, args.split, args.limit)
    lists = decode_lists(model, sp, sources, args.sizes, lists_dir, args)
    beam = lists["beam5"]["texts"]
    base = metrics.corpus_scores(beam, refs)
    sentences = metrics.sentence_bertscore(beam, refs).round(4).tolist()  # for bootstrap intervals of the gains
    rows = [
        {"decoder": "beam5-top1", "n": 1, **base, "bertscore_f_sentences": sentences}
        | {"sampling_s": lists["beam5"]["seconds"] / len(beam)}
    ]
    oracle: dict[str, float] = {}
    utils = utilities(args.utilities, args.bertscore_dtype)
    for n in args.sizes:
        entry = lists[f"eps{n}"]
        samples = entry["texts"]
        f = metrics.scorer().score_groups(samples, refs).f1 * 100
        oracle[f"eps{n}"] = float(torch.nan_to_num(f, nan=-1.0).max(1).values.mean())
        for uname, utility in utils.items():
            runs = run_methods(samples, utility, args.methods, args.repeats)
            exact = runs.get("exact")
            exact_scores = None
            for mname, r in runs.items():
                hyps = [x.best for x in r["results"]]
                scores = metrics.corpus_scores(hyps, refs)
                row = {
                    "decoder": f"eps{n}+mbr-{uname}" + ("" if mname == "exact" else f"-{mname}"),
                    "n": n,
                    "utility": uname,
                    "method": mname,
                    **scores,
                    "bertscore_f_sentences": metrics.sentence_bertscore(hyps, refs).round(4).tolist(),
                    "evaluations_per_sentence": sum(x.evaluations for x in r["results"]) / len(hyps),
                    "sampling_s": entry["seconds"] / len(hyps),
                    "rerank_s": r["seconds"] / len(hyps),
                    "peak_mib": r["peak_mib"],
                }
                if mname == "exact":
                    exact_scores = scores
                elif exact is not None and exact_scores is not None:
                    a = agreement(exact["results"], r["results"])
                    key = UTILITY_METRIC.get(uname, "bertscore_f")
                    row.update(
                        same_choice=a.same_choice,
                        kept_utility=a.kept_utility,
                        evaluation_share=a.evaluations,
                        speedup=exact["seconds"] / r["seconds"],
                        gain_share=gain_share(base[key], exact_scores[key], scores[key]),
                        gain_share_bertscore_f=gain_share(
                            base["bertscore_f"], exact_scores["bertscore_f"], scores["bertscore_f"]
                        ),
                        gain_share_chrf=gain_share(base["chrf"], exact_scores["chrf"], scores["chrf"]),
                    )
                rows.append(row)
                logger.info("%s: %s", row["decoder"], {k: v for k, v in row.items() if k != "decoder"})
    result = {
        "model": str(args.model),  # as given (repository-relative by default): no machine path in results
        "split": args.split,
        "sources": len(sources),
        "epsilon": args.epsilon,
        "cpu": nmt.cpu_label(),
        "threads": torch.get_num_threads(),
        "precision": lists["beam5"].get("precision"),
        "bertscore_dtype": args.bertscore_dtype,
        "repeats": args.repeats,
        "command": " ".join(sys.argv),
        "oracle_bertscore_f": oracle,
        "rows": rows,
    }
    write(run / f"{name}.json", json.dumps(result, indent=1), args.overwrite)
    write(run / f"{name}.md", markdown(result), args.overwrite)
    return result


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def markdown(result: dict) -> str:
    """The sweep as a markdown table (one row per decoder)."""
    head = (
        f"{result['split']}, {result['sources']} sources, epsilon {result['epsilon']}, {result['cpu']}, "
        f"{result['threads']} threads, sampling precision {result['precision']}, BERTScore utility encoder "
        f"{result.get('bertscore_dtype', 'float32')}, rerank time: best of {result.get('repeats', 1)}\n\n"
    )
    cols = (
        "| decoder | BLEU | chrF | BERTScore F | len ratio | utility evals / sent | sampling s / sent "
        "| rerank s / sent | peak MiB | share of exact gain | same choice as exact | rerank speed-up |"
    )
    lines = [head + cols, "|" + " --- |" * 12]
    for r in result["rows"]:
        lines.append(
            f"| {r['decoder']} | {fmt(r['bleu'])} | {fmt(r['chrf'])} | {fmt(r['bertscore_f'])} | "
            f"{fmt(r['length_ratio'], 3)} | {fmt(r.get('evaluations_per_sentence'), 0)} | "
            f"{fmt(r.get('sampling_s'), 3)} | "
            f"{fmt(r.get('rerank_s'), 4)} | {fmt(r.get('peak_mib'), 0)} | {fmt(r.get('gain_share'))} | "
            f"{fmt(r.get('same_choice'))} | {fmt(r.get('speedup'), 1)} |"
        )
    oracle = ", ".join(f"{k} {v:.2f}" for k, v in result["oracle_bertscore_f"].items())
    lines.append(f"\nOracle BERTScore F of the sample lists (the sample closest to the reference): {oracle}")
    lines.append(f"\nCommand: `{result['command']}`")
    return "\n".join(lines) + "\n"


# --- blind outputs ---------------------------------------------------------------------------------------------
def blind(args: argparse.Namespace) -> dict:
    """``<outputs>/<name>-<decoder>.<set>.en`` for every ``blind/*.de``: beam 5 top-1 and the n-sample decoders;
    ``<outputs>/<name>-blind.json`` records the settings, the CPU, the files and the seconds of each step."""
    data, run = resolve(args.data), resolve(args.run)
    dest = resolve(args.outputs) if args.outputs else run / "outputs"
    n = args.n
    sets = sorted((data / "blind").glob("*.de"))
    if not sets:
        raise SystemExit(f"no blind sets in {data / 'blind'}")
    if args.sets:
        unknown = sorted(set(args.sets) - {s.stem for s in sets})
        if unknown:
            known = ", ".join(s.stem for s in sets)
            raise SystemExit(f"--sets: no blind set {', '.join(unknown)} in {data / 'blind'} (known: {known})")
        sets = [s for s in sets if s.stem in args.sets]
    decoders = ["beam5-top1"] + [
        f"eps{n}+mbr-{u}" + ("" if m == "exact" else f"-{m}") for u in args.utilities for m in ["exact", *args.approx]
    ]
    writable(
        [
            *(p for s in sets for p in list_files(run / "lists" / s.stem, [n], args)),
            *(dest / f"{args.name}-{d}.{s.stem}.en" for s in sets for d in decoders),
            dest / f"{args.name}-blind.json",
        ],
        args.overwrite,
    )
    model, sp = load_model(resolve(args.model))
    utils = utilities(args.utilities, args.bertscore_dtype)
    record: dict[str, Any] = {"sets": {}}
    for path in sets:
        sources = nmt.read_lines(path)
        lists = decode_lists(model, sp, sources, [n], run / "lists" / path.stem, args)
        outputs = {"beam5-top1": lists["beam5"]["texts"]}
        samples = lists[f"eps{n}"]["texts"]
        seconds = {"beam5": lists["beam5"]["seconds"], f"sampling eps{n}": lists[f"eps{n}"]["seconds"]}
        for uname, utility in utils.items():
            for mname in ["exact", *args.approx]:
                decoder = f"eps{n}+mbr-{uname}" + ("" if mname == "exact" else f"-{mname}")
                t0 = time.perf_counter()
                outputs[decoder] = [r.best for r in mbr(samples, utility=utility, method=METHODS[mname])]
                seconds[f"rerank {decoder}"] = time.perf_counter() - t0
        files = {}
        for decoder, hyps in outputs.items():
            if len(hyps) != len(sources):
                raise SystemExit(f"{decoder}: {len(hyps)} outputs for {len(sources)} sources of {path.name}")
            target = dest / f"{args.name}-{decoder}.{path.stem}.en"
            write(target, "\n".join(hyps) + "\n", args.overwrite)
            files[decoder] = target.name
        record["sets"][path.stem] = {
            "sources": len(sources),
            "distinct_samples_per_source": sum(len(set(s)) for s in samples) / len(samples),
            "files": files,
            "seconds": seconds,
        }
    record.update(blind_settings(args, lists[f"eps{n}"].get("precision")))
    write(dest / f"{args.name}-blind.json", json.dumps(record, indent=1), args.overwrite)
    return {s: [str(dest / f) for f in r["files"].values()] for s, r in record["sets"].items()}


def blind_settings(args: argparse.Namespace, precision: str | None) -> dict:
    """What a blind run's outputs depend on, and where it ran."""
    return {
        "model": str(args.model),
        "n": args.n,
        "epsilon": args.epsilon,
        "seed": args.seed,
        "sampling_precision": precision,
        "utilities": args.utilities,
        "bertscore_dtype": args.bertscore_dtype,
        "methods": ["exact", *args.approx],
        "cpu": nmt.cpu_label(),
        "threads": torch.get_num_threads(),
        "command": " ".join(sys.argv),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    pe = sub.add_parser("export", help="a model folder from a stage-1 run's per-epoch weights")
    pe.add_argument("--stage1", required=True, help="stage-1 run folder (settings.json, epochs/, spm.model)")
    pe.add_argument("--out", required=True)
    pe.add_argument("--epoch", type=int, help="epoch number (default: the latest)")
    pe.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", required=True, help="HF Marian folder with spm.model (as the recipe writes)")
        p.add_argument("--data", default="../shared/data/multi30k")
        p.add_argument("--run", required=True, help="output folder (lists/, sweep.json, sweep.md, outputs/)")
        p.add_argument("--epsilon", type=float, default=0.02)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--precision", choices=["auto", "32", "bf16"], default="auto", help="decoding precision")
        p.add_argument("--token-budget", type=int, default=65536, help="sampler rows x tokens per batch")
        p.add_argument("--utilities", nargs="+", default=["bertscore", "chrf"])
        p.add_argument(
            "--bertscore-dtype",
            choices=["float32", "bfloat16"],
            default="float32",
            help="encoder dtype of the BERTScore utility (bfloat16: approximate, where the CPU has native bf16)",
        )
        p.add_argument("--resample", action="store_true", help="decode again even if the lists exist")
        p.add_argument("--threads", type=int, help="torch.set_num_threads")
        p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    ps = sub.add_parser("sweep", help="beam 5 vs MBR over n samples, every method, JSON + markdown table")
    common(ps)
    ps.add_argument("--split", default="val")
    ps.add_argument("--limit", type=int, help="first N sources of the split")
    ps.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    ps.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ps.add_argument("--repeats", type=int, default=1, help="alternating reranking rounds; the fastest is kept")
    ps.add_argument("--tag", default="", help="write sweep-<tag>.{json,md} (other settings on the same lists)")
    pb = sub.add_parser("blind", help="blind outputs: beam 5 top-1 and the n-sample MBR decoders")
    common(pb)
    pb.add_argument("--n", type=int, default=256)
    pb.add_argument("--approx", nargs="*", default=["aggregate-exact"], choices=[m for m in METHODS if m != "exact"])
    pb.add_argument("--name", default="model", help="names the output files <name>-<decoder>.<set>.en")
    pb.add_argument("--outputs", help="folder for the .en files (default: <run>/outputs)")
    pb.add_argument("--sets", nargs="+", help="only these blind sets, named as blind/<set>.de (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "export":
        print(export(resolve(args.stage1), resolve(args.out), args.epoch, args.overwrite))
    elif args.command == "sweep":
        result = sweep(args)
        print(markdown(result))
    else:
        print(json.dumps(blind(args), indent=1))


if __name__ == "__main__":
    main()
