"""MBR-ranked data on fresh in-domain sources: German captions no Multi30k model has translated.

The sources are a seeded shuffle of ``../shared/data/multi30k/mono/task2_train.de`` (141,444 captions, none a
task-1 source); after the first ``--skip`` (an earlier round's), the next ``--sources`` of that order are written
to ``<out>/sources.de`` and ranked by :func:`rerank.build_mbr_data` from the committed base model or ``--model``
(a tuned one, for a later round) (beam 5 + ε-samples, exact MBR-BERTScore on the bundled MiniLM, every candidate
and its expected utility stored for re-pairing). float32 decoding is pinned, so a folder started on one kind of
CPU resumes on any other. A stopped run resumes where it stopped (at most
one shard is lost): run the same command again.

    OMP_NUM_THREADS=1 nohup python studies/multi30k/fresh_mbr_data.py --out runs/mbr-data/fresh-eps32 &
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(ROOT / "models" / "multi30k-de-en"), help="HF Marian folder with spm.model")
    p.add_argument("--mono", default=str(ROOT.parent / "shared" / "data" / "multi30k" / "mono" / "task2_train.de"))
    p.add_argument("--out", default=str(ROOT / "runs" / "mbr-data" / "fresh-eps32"))
    p.add_argument("--sources", type=int, default=20000, help="how many fresh sources (default 20000)")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N of the order (an earlier round's)")
    p.add_argument("--order-seed", type=int, default=0, help="seed of the shuffle that picks them")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--shard-size", type=int, default=250)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world-size", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    import sentencepiece as spm
    import torch
    from transformers import MarianMTModel

    from bertscore_loss.outputs import write_text
    from rerank.training_data import MBRDataConfig, build_mbr_data

    torch.set_num_threads(args.threads)
    lines = [line for line in Path(args.mono).read_text(encoding="utf-8").split("\n") if line.strip()]
    order = list(range(len(lines)))
    random.Random(args.order_seed).shuffle(order)
    sources = [lines[i] for i in order[args.skip : args.skip + args.sources]]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    listing = out / "sources.de"
    text = "".join(s + "\n" for s in sources)
    if listing.exists() and listing.read_text(encoding="utf-8") != text:
        sys.exit(f"{listing} lists other sources: use another --out or the same --skip/--sources/--order-seed")
    write_text(listing, text)
    model = MarianMTModel.from_pretrained(args.model).eval()
    sp = spm.SentencePieceProcessor(model_file=str(Path(args.model) / "spm.model"))
    config = MBRDataConfig(
        num_samples=args.samples, pairing="best-worst", shard_size=args.shard_size, precision="32", too_long="truncate"
    )
    done = build_mbr_data(model, sp, sources, out, config, rank=args.rank, world_size=args.world_size, progress=True)
    logging.info("%d shards built now, %d reused; seconds %s", done.built, done.reused, done.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
