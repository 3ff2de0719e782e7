"""MBR-ranked training data for Multi30k de-en from a model's own samples (:func:`rerank.build_mbr_data`).

    # beam 5 + 64 epsilon samples per training source, ranked by exact MBR-BERTScore (bundled MiniLM):
    # runs/mbr-data/train-eps64/shard-*.jsonl (prompt/chosen/rejected/target/...), resumable, one thread
    python studies/multi30k/mbr_data.py --model models/multi30k-de-en --split train --out runs/mbr-data/train-eps64
    # two processes on two cores give the same files as one (shards alternate between ranks)
    python studies/multi30k/mbr_data.py --out runs/mbr-data/train-eps64 --rank 0 --world-size 2 &
    python studies/multi30k/mbr_data.py --out runs/mbr-data/train-eps64 --rank 1 --world-size 2

A stopped run resumes where it stopped (at most one shard of work is lost). ``<out>/record-rank<k>.json`` records
the machine (CPU model and bf16 flags), the settings and the seconds per stage over all shards built so far.

    # the same lists re-ranked by an equal-share mix of MBR-BERTScore and MBR-chrF (rerank.mixed_ranking):
    python studies/multi30k/mbr_data.py --mix-from runs/mbr-data/train-eps64 --out runs/mbr-data/train-eps64-mix

    # what a built folder holds (shards, sources, SHA-256 of each shard, cost, how often MBR-best is not the beam)
    python studies/multi30k/mbr_data.py --out runs/mbr-data/train-eps64 --summary docs/.../data.json
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_json, write_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="models/multi30k-de-en", help="HF Marian folder with spm.model")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="Multi30k folder")
    p.add_argument("--split", default="train", help="split whose German side is the sources (default: train)")
    p.add_argument("--limit", type=int, default=None, help="the first N sources only")
    p.add_argument(
        "--out", default=None, help="output folder, resumed when it exists (default: runs/mbr-data/train-eps64)"
    )
    p.add_argument("--samples", type=int, default=64, help="epsilon samples per source (default 64)")
    p.add_argument("--epsilon", type=float, default=0.02)
    p.add_argument("--beams", type=int, default=5)
    p.add_argument("--utility", default="bertscore", help="registered utility: bertscore, chrf, bleu")
    p.add_argument(
        "--pairing", default="beam-or-worst", help="which candidate is rejected (rerank.training_data.PAIRINGS)"
    )
    p.add_argument("--shard-size", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--precision", default="auto", choices=["auto", "32", "bf16"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--mix-from", default=None, help="re-rank this built folder into --out by a mix of utilities")
    p.add_argument("--mix-utility", default="chrf", help="--mix-from: the second utility (default chrf)")
    p.add_argument("--mix-weight", type=float, default=0.5, help="--mix-from: its share of the mix (default 0.5)")
    p.add_argument(
        "--mix-pairing",
        default=None,
        help="--mix-from: pair the re-ranked rows this way (rerank.training_data.PAIRINGS; default: the input's)",
    )
    p.add_argument(
        "--mix-partial",
        action="store_true",
        help="--mix-from: re-rank the shards built so far (default: a shard missing from the input is an error)",
    )
    p.add_argument("--summary", default=None, help="write a summary of the folder --out to this JSON (no building)")
    p.add_argument(
        "--summary-shards",
        type=int,
        default=None,
        help="--summary: only the shards numbered below this (to compare folders over the same sources)",
    )
    add_overwrite_argument(p)
    return p


def summarise(folder: Path, first_shards: int | None = None) -> dict:
    """A built folder's manifest, its shards (with SHA-256), sources, cost by stage and what the ranking chose:
    the share of sources whose MBR-best is not the beam output, the mean utility of chosen, beam, rejected, and
    how varied the samples are (distinct texts among the n, their mean expected utility: a model made peakier
    by training draws fewer distinct samples). ``first_shards``: only the shards numbered below it."""
    import hashlib
    import statistics

    import nmt

    from rerank.training_data import read_mbr_data

    manifest = json.loads((folder / "manifest.json").read_text())
    for key in ("model", "from_folder"):  # no machine path in a published summary
        path = Path(manifest.get(key, ""))
        if path.is_absolute() and path.is_relative_to(ROOT):
            manifest[key] = str(path.relative_to(ROOT))
    records = {p.stem: json.loads(p.read_text()).get("cpu") for p in sorted(folder.glob("record-rank*.json"))}
    shards = sorted(folder.glob("shard-*.jsonl"))
    rows = read_mbr_data(folder, complete=False)
    if first_shards is not None:
        shards = [p for p in shards if int(p.stem.split("-")[1]) < first_shards]
        rows = [r for r in rows if r["index"] < first_shards * manifest["config"]["shard_size"]]
    listed = [r for r in rows if "candidates" in r]
    timing = {t["shard"]: t for t in map(json.loads, (folder / "timing.jsonl").read_text().splitlines()) if t}
    built = [int(p.stem.split("-")[1]) for p in shards]
    seconds: dict[str, float] = {}
    for k in built:
        for stage, v in timing[k]["seconds"].items():
            seconds[stage] = seconds.get(stage, 0.0) + v
    n = len(rows)
    return {
        "cpu_of_build": records or None,  # from record-rank<k>.json, written when a process finishes its shards
        "cpu_of_summary": nmt.cpu_label(),
        "manifest": manifest,
        "shards": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in shards},
        "sources": n,
        "pairs": sum(r["rejected"] is not None for r in rows),
        "mbr_best_is_not_beam": sum(r["chosen"] != r["beam"] for r in rows) / n,
        "mean_utility": {
            key: statistics.mean(r[f"{key}_score"] for r in rows if r[f"{key}_score"] is not None)
            for key in ("chosen", "beam", "rejected")
        },
        # whitespace words of each side over all rows: MBR-best shorter than the beam output is a length drift
        "words": {key: sum(len((r[key] or "").split()) for r in rows) for key in ("chosen", "beam", "rejected")},
        # over the n samples of each source (beam output left out); a re-ranked folder's primary utility
        "samples": {
            "distinct_mean": statistics.mean(len(set(r["candidates"][: r["n"]])) for r in listed),
            "expected_utility_mean": statistics.mean(
                statistics.mean(r.get("expected_primary", r["expected"])[: r["n"]]) for r in listed
            ),
        }
        if listed
        else None,
        "seconds": seconds,
        "seconds_per_source": {k: v / n for k, v in seconds.items()},
        # a re-ranked folder (--mix-from) samples nothing: its cost is the second utility's MBR and log-probabilities
        "samples_per_second": n * manifest["config"]["num_samples"] / seconds["sampling"]
        if "sampling" in seconds
        else None,
        "cpu_hours": sum(seconds.values()) / 3600,  # one thread per process
    }


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.summary:
        if not args.out:
            parser.error("--summary needs --out: the built folder to summarise")
        folder = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
        summary = summarise(folder, args.summary_shards)
        write_json(Path(args.summary), summary, overwrite=args.overwrite, allow_docs=True, flag="--summary")
        return
    rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    args.out = args.out or "runs/mbr-data/train-eps64"
    record_path = (
        ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    ) / f"record-rank{args.rank}.json"
    check_outputs_or_exit(parser, [record_path], **rules)  # before any sampling
    import nmt
    import sentencepiece as spm
    import torch
    from transformers import MarianMTModel

    from rerank.training_data import MBRDataConfig, build_mbr_data

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    model_dir = ROOT / args.model if not Path(args.model).is_absolute() else Path(args.model)
    out = ROOT / args.out if not Path(args.out).is_absolute() else Path(args.out)
    config = MBRDataConfig(
        num_samples=args.samples,
        epsilon=args.epsilon,
        beams=args.beams,
        utility=args.utility,
        pairing=args.pairing,
        shard_size=args.shard_size,
        seed=args.seed,
        precision=args.precision,
    )
    model = MarianMTModel.from_pretrained(model_dir).eval()
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "spm.model"))
    if args.mix_from:
        from rerank.mixed_ranking import MixConfig, remix_mbr_data

        source = ROOT / args.mix_from if not Path(args.mix_from).is_absolute() else Path(args.mix_from)
        mix = MixConfig(utility=args.mix_utility, weight=args.mix_weight, pairing=args.mix_pairing)
        done = remix_mbr_data(model, sp, source, out, mix, missing="skip" if args.mix_partial else "error")
        write_json(record_path, {"cpu": nmt.cpu_label(), "threads": args.threads, "seconds": done.seconds}, **rules)
        return
    sources, _ = nmt.read_pairs(args.data, args.split, limit=args.limit)
    result = build_mbr_data(model, sp, sources, out, config, rank=args.rank, world_size=args.world_size)
    timing = [json.loads(line) for line in (out / "timing.jsonl").read_text().splitlines() if line]
    totals: dict[str, float] = {}
    for t in timing:
        for k, v in t["seconds"].items():
            totals[k] = totals.get(k, 0.0) + v
    built = sum(t["sources"] for t in timing)
    record = {
        "cpu": nmt.cpu_label(),
        "threads": args.threads,
        "world_size": args.world_size,
        "model": args.model,
        "split": args.split,
        "sources_built": built,
        "shards_built": len(timing),
        "seconds": totals,
        "seconds_per_source": {k: v / max(built, 1) for k, v in totals.items()},
        "samples_per_second": built * args.samples / max(totals.get("sampling", 0.0), 1e-9),
        "cpu_hours": sum(totals.values()) * args.threads / 3600,
    }
    write_text(record_path, json.dumps(record, indent=1) + "\n", **rules)
    logging.getLogger("mbr_data").info(
        "%d shards built now, %d were there; %s", result.built, result.reused, json.dumps(record["seconds_per_source"])
    )


if __name__ == "__main__":
    main()
