"""DPO on MBR-ranked pairs of a Hugging Face seq2seq model's own samples, with the library's public API.

1. Build the MBR data of a file of sources (``rerank.build_mbr_data``: beam output + epsilon samples, ranked by
   MBR; chosen = MBR-best, rejected = the beam output where it differs; reference log-probabilities stored).
2. Train with ``rerank.MBRTrainer``; the settings are a YAML of ``rerank.MBRTrainingConfig`` (``--config``,
   default ``configs/mbr_dpo.yaml``).
3. Translate a test set with beam search before and after, and test the gain with ``rerank.paired_bootstrap``.

    python examples/train_mbr_dpo.py --model models/multi30k-de-en --sources train.de \\
        --test-sources test.de --test-references test.en --out runs/mbr-dpo
    python examples/train_mbr_dpo.py --smoke     # the committed Marian model, 8 sources, seconds

The model folder is read by ``rerank.training_data.load_model_and_tokenizer`` (an HF tokenizer, or the
folder's ``spm.model``). Writes ``<out>/result.json``. Siblings: ``train_mbr_distill.py``, ``train_mrt.py``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from pathlib import Path

from bertscore_loss.outputs import write_json
from bertscore_loss.textio import read_lines
from rerank import MBRTrainer, MBRTrainingConfig, paired_bootstrap
from rerank.generate import beam_translate
from rerank.training_data import PAIRINGS, MBRDataConfig, build_mbr_data, load_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "multi30k"
logger = logging.getLogger("train_mbr_dpo")
# --smoke: the committed sample's files (unless given), 8 sources, 8 samples, chrF; 4 updates of all 8 pairs
SMOKE_FILES = {"sources": "train.de", "test_sources": "test_2016_flickr.de", "test_references": "test_2016_flickr.en"}
SMOKE = {"limit": 8, "samples": 8, "utility": "chrf", "eval_utility": "chrf"}
SMOKE_TRAINING = dict(max_steps=4, per_device_train_batch_size=8, learning_rate=1e-4, logging_steps=1)
SMOKE_TRAINING.update(save_strategy="no", warmup_steps=0, use_cpu=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "multi30k-de-en", help="HF seq2seq model folder")
    p.add_argument("--sources", type=Path, help="training sources, one a line")
    p.add_argument("--test-sources", type=Path, help="test sources, one a line")
    p.add_argument("--test-references", type=Path, help="test references, one a line")
    p.add_argument("--out", type=Path, default=Path("runs/mbr-dpo"), help="MBR data, checkpoints, model, result")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "mbr_dpo.yaml", help="MBRTrainingConfig YAML")
    p.add_argument("--samples", type=int, default=64, help="epsilon samples per source")
    p.add_argument("--utility", default="bertscore", help="MBR utility (a registered name: bertscore, chrf, bleu)")
    p.add_argument("--pairing", default="beam-or-worst", choices=PAIRINGS, help="which candidate is rejected")
    p.add_argument("--eval-utility", default="bertscore", help="the utility of the significance test")
    p.add_argument("--limit", type=int, help="at most this many training sources")
    p.add_argument("--smoke", action="store_true", help="seconds: the committed model, 8 sources, 8 samples, chrF")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update({k: getattr(args, k) or SAMPLE / v for k, v in SMOKE_FILES.items()}, **SMOKE)
    missing = [n for n in ("sources", "test_sources", "test_references") if getattr(args, n) is None]
    if missing:
        p.error(f"give {', '.join('--' + m.replace('_', '-') for m in missing)} (or --smoke)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_model_and_tokenizer(args.model)
    sources = read_lines(args.sources)[: args.limit]
    data = args.out / "mbr-data"
    # 1. MBR-ranked pairs of the model's own samples (resumable: a stopped run continues)
    build_mbr_data(
        model,
        tokenizer,
        sources,
        data,
        MBRDataConfig(args.samples, utility=args.utility, pairing=args.pairing, shard_size=500, precision="32"),
    )
    # 2. Train: Trainer's loop, checkpoints and logging; reference log-probabilities from the folder
    overrides = SMOKE_TRAINING if args.smoke else {}
    config = MBRTrainingConfig.from_yaml(args.config, output_dir=str(args.out / "trainer"), **overrides)
    test_src, refs = read_lines(args.test_sources)[: args.limit], read_lines(args.test_references)[: args.limit]
    before = beam_translate(model, tokenizer, test_src)
    trainer = MBRTrainer(model, config, data, tokenizer)
    trainer.train(resume_from_checkpoint=any((args.out / "trainer").glob("checkpoint-*")) or None)
    trainer.save_model(str(args.out / "model"))
    # 3. Beam search before and after, and the paired bootstrap of the difference
    test = paired_bootstrap(before, beam_translate(model, tokenizer, test_src), refs, utility=args.eval_utility)
    logger.info("%s", test)
    dpo = [h["dpo"] for h in trainer.state.log_history if "dpo" in h]
    result = {
        "sources": len(sources),
        "pairs": sum(len(e.pairs) for e in trainer.train_dataset.examples),
        "steps": trainer.state.global_step,
        "first_dpo": dpo[0] if dpo else None,
        "last_dpo": dpo[-1] if dpo else None,
        "test": dataclasses.asdict(test),
    }
    write_json(args.out / "result.json", result)  # atomic: a stopped run leaves no half-written file
    return result


if __name__ == "__main__":
    main()
