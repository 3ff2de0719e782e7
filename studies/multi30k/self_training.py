"""Self-training on fresh in-domain sources through the library's trainer: the committed base fine-tuned on the
MBR-ranked data of German captions no Multi30k model has seen (``fresh_mbr_data.py``), with
:class:`rerank.MBRTrainer`, then scored on a split with beam 5 by the recipe's own ``evaluate`` (the code that
scored the ``ce`` controls: MiniLM F, BLEU, chrF, length ratio; ``--judge``: the MPNet judge, a judge only) and
the "universal output" screen (``metrics.universal_screen``: the translations against other sources' references).

Arms (the loss's weights; every other setting is ``configs/self-training.yaml``, a ``rerank.MBRTrainingConfig``):
``dpo`` DPO + NLL of the chosen side on the stored pairs; ``distill`` NLL of the MBR-best (top-1
self-distillation; with ``--top N`` the N best distinct candidates of each source by expected utility, each
a target of its own). ``--set field=value`` overrides a setting (``--set pairing=best-worst``). ``--mix FOLDER``
adds every example of another built folder (the training sources' pairs, built from the same base) to the
fresh ones; ``--model`` and ``--data`` of a later round name the tuned model and the data built from it, and
``--name`` keeps its run apart.

    OMP_NUM_THREADS=1 nohup python studies/multi30k/self_training.py --arm dpo --seed 0 &

The first ``--shards`` shards of the data folder are used (all of them must exist), so a resumed run trains on
the same sources. A stopped run resumes from its last checkpoint: run the same command again. Writes
``<out>/<name>-seed<k>/`` (``<name>``: the arm unless ``--name``): ``trainer/`` (checkpoints), ``model/`` (with
the generator's ``spm.model``), ``<split>.en`` (the translations) and ``result.json`` (``result.<split>.json`` for a
split other than val); ``--blind DIR`` also writes the beam-5 translations of every blind set
(``<multi30k>/blind/*.de``) to ``DIR/<name>-seed<k>-beam5.<set>.en``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARMS = {
    "dpo": {"dpo_weight": 1.0, "nll_weight": 1.0, "distill_weight": 0.0},
    "distill": {"dpo_weight": 0.0, "distill_weight": 1.0},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=sorted(ARMS), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", default=str(ROOT / "runs" / "mbr-data" / "fresh-eps32"), help="fresh_mbr_data.py's folder")
    p.add_argument("--shards", type=int, default=80, help="train on the first K shards (all must exist)")
    p.add_argument("--top", type=int, default=1, help="distill: the N best distinct candidates as targets")
    p.add_argument("--mix", help="a second built folder whose examples are all added (the same builder model)")
    p.add_argument("--model", default=str(ROOT / "models" / "multi30k-de-en"), help="the data's builder model")
    p.add_argument("--name", help="the run's name (default: the arm)")
    p.add_argument("--config", default=str(HERE / "configs" / "self-training.yaml"))
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override a config field")
    p.add_argument("--out", default=str(ROOT / "runs" / "multi30k" / "self-training"))
    p.add_argument("--split", default="val", help="the split scored after training (val; test once chosen)")
    p.add_argument("--multi30k", default=str(ROOT.parent / "shared" / "data" / "multi30k"))
    p.add_argument("--blind", help="a folder for the beam-5 translations of the blind sets (none: not decoded)")
    p.add_argument("--limit", type=int, help="score only the split's first N sentences (a smoke run)")
    p.add_argument("--judge", action="store_true", help="also the MPNet judge's F (extra `accurate`)")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def examples_of(folder: Path, shards: int, model, tokenizer, config, need: int | None = None) -> list:
    """The examples of the corpus's first ``shards`` shards (by corpus index), all of which must exist (``need``
    sources in all; default ``shards`` full shards)."""
    import json

    from rerank import read_mbr_examples

    size = json.loads((folder / "manifest.json").read_text())["config"]["shard_size"]
    have = len(list(folder.glob("shard-*.jsonl")))
    if have < shards:
        sys.exit(f"{folder} holds {have} shards, --shards asks for {shards}: let fresh_mbr_data.py finish")
    examples = read_mbr_examples(
        folder, tokenizer, model, pairing=config.pairing, pairs_per_source=config.pairs_per_source,
        selection=config.pair_selection, seed=config.pair_seed,
    )  # fmt: skip
    need = shards * size if need is None else need
    chosen = [e for e in examples if e.index < shards * size]
    if len(chosen) != need:
        sys.exit(f"{folder}: {len(chosen)} sources among the first {shards} shards of {size}, not {need}")
    return chosen


def top_examples(folder: Path, shards: int, n: int, model, tokenizer) -> list:
    """Top-n self-distillation targets: for each source of the first ``shards`` shards, its ``n`` best distinct
    candidates by expected utility (the first is the MBR-best), each an example whose target is that candidate
    (tokenised by :meth:`rerank.trainer.MBRDataset.from_references`, as the trainer's distillation term reads it)."""
    import json

    from rerank.trainer import MBRDataset
    from rerank.training_data import read_mbr_data

    size = json.loads((folder / "manifest.json").read_text())["config"]["shard_size"]
    sources, targets = [], []
    for row in read_mbr_data(folder, complete=False):
        if row["index"] >= shards * size:
            continue
        ranked = sorted(zip(row["expected"], row["candidates"]), key=lambda t: -t[0])
        best = list(dict.fromkeys(text for _, text in ranked))[:n]
        if best[0] != row["chosen"]:
            sys.exit(f"{folder}: row {row['index']} ranks {best[0]!r} first but chose {row['chosen']!r}")
        sources += [row["prompt"]] * len(best)
        targets += best
    return MBRDataset.from_references(sources, targets, tokenizer, model).examples


def mix_examples(folder: Path, model, tokenizer, config) -> list:
    """Every example of a second built folder (all of its shards must be built), paired as the fresh ones."""
    import json
    import math

    manifest = json.loads((folder / "manifest.json").read_text())
    return examples_of(folder, math.ceil(manifest["sources"] / manifest["config"]["shard_size"]), model, tokenizer,
                       config, need=manifest["sources"])  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch
    import yaml

    from bertscore_loss.outputs import write_json
    from bertscore_loss.textio import read_lines
    from rerank import MBRTrainer, MBRTrainingConfig
    from rerank.trainer import MBRDataset
    from rerank.training_data import load_model_and_tokenizer

    sys.path.insert(0, str(HERE))
    import metrics
    import nmt
    import recipe  # the recipe's evaluate: the decoder and scores of the ce controls

    torch.set_num_threads(args.threads)
    run = Path(args.out) / f"{args.name or args.arm}-seed{args.seed}"
    overrides = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in args.set)}
    config = MBRTrainingConfig.from_yaml(
        args.config, **ARMS[args.arm], **overrides, seed=args.seed, output_dir=str(run / "trainer")
    )
    model, tokenizer = load_model_and_tokenizer(args.model)
    examples = examples_of(Path(args.data), args.shards, model, tokenizer, config)
    sources = len(examples)
    if args.top > 1:
        if args.arm != "distill" or args.mix:
            sys.exit("--top N is for the distill arm without --mix")
        examples = top_examples(Path(args.data), args.shards, args.top, model, tokenizer)
    mixed = mix_examples(Path(args.mix), model, tokenizer, config) if args.mix else []
    data = MBRDataset(examples + mixed)
    trainer = MBRTrainer(model, config, data, tokenizer)
    start = time.time()
    trainer.train(resume_from_checkpoint=any((run / "trainer").glob("checkpoint-*")) or None)
    train_seconds = time.time() - start
    trainer.save_model(str(run / "model"))
    shutil.copy(Path(args.model) / "spm.model", run / "model" / "spm.model")
    hyps = run / f"{args.split}.en"
    refs = nmt.read_pairs(args.multi30k, args.split, args.limit)[1]
    scores = recipe.evaluate(str(run / "model"), args.multi30k, args.split, 5, "32-true", args.limit,
                             judge=args.judge, hyps_out=str(hyps))  # fmt: skip
    result = {
        "arm": args.arm,
        "seed": args.seed,
        "data": args.data,
        "shards": args.shards,
        "start": args.model,  # the model trained (the data's builder)
        "mix": args.mix,
        "mixed_sources": len(mixed),
        "top": args.top,
        "sources": sources + len(mixed),
        "examples": len(data),
        "pairs": sum(len(e.pairs) for e in data.examples),
        "updates": trainer.state.global_step,
        "train_seconds_this_process": train_seconds,
        "config": {k: v for k, v in config.to_dict().items() if k in {*ARMS["dpo"], *ARMS["distill"], *overrides}},
        **scores,
        # the "universal output" screen: the translations against other sentences' references (metrics.py)
        "universal": metrics.universal_screen(read_lines(hyps), refs),
    }
    if args.blind:
        model, sp = recipe.load_model(run / "model")
        for path in recipe.blind_sources(Path(args.multi30k)):
            translated = nmt.translate(model, sp, read_lines(path), beams=5, precision="32-true")
            recipe.write_output(Path(args.blind) / f"{run.name}-beam5.{path.stem}.en", translated)
    write_json(run / ("result.json" if args.split == "val" else f"result.{args.split}.json"), result, overwrite=True)
    logging.getLogger("self_training").info("%s", result)
    return result


if __name__ == "__main__":
    main()
