"""MBR self-distillation of a Hugging Face seq2seq model: train on the NLL of its own MBR-best translations.

1. Rank ``--samples`` epsilon samples of each source by MBR (``rerank.build_mbr_data``). Distillation reads the
   MBR-best target alone, so no beam output, pairs, log-probabilities or candidate lists are built.
2. Train the token NLL of each source's MBR-best target with ``rerank.MBRTrainer`` (``dpo_weight: 0``,
   ``distill_weight: 1``; the settings are a YAML of ``rerank.MBRTrainingConfig``, ``--config``, default
   ``configs/mbr_distill.yaml``): beam search learns what MBR decoding would choose.
3. Translate a test set with beam search before and after; ``rerank.paired_bootstrap`` tests the gain.

    python examples/train_mbr_distill.py --model models/multi30k-de-en --sources train.de \\
        --test-sources test.de --test-references test.en --out runs/mbr-distill
    python examples/train_mbr_distill.py --smoke     # the committed Marian model, 8 sources, seconds

Writes ``<out>/result.json``: the steps, the first and last logged ``distill_nll``, the test.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict
from pathlib import Path

from bertscore_loss.outputs import write_json
from bertscore_loss.textio import read_lines
from rerank import MBRDataConfig, MBRTrainer, MBRTrainingConfig, build_mbr_data, paired_bootstrap
from rerank.generate import beam_translate
from rerank.training_data import load_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "multi30k"
log = logging.getLogger("train_mbr_distill")
SMOKE_INPUTS = {"sources": "train.de", "test_sources": "test_2016_flickr.de", "test_references": "test_2016_flickr.en"}
SMOKE_SIZES = {"limit": 8, "samples": 8, "utility": "chrf", "eval_utility": "chrf"}  # seconds on a CPU
SMOKE_UPDATES = {"max_steps": 4, "per_device_train_batch_size": 8, "learning_rate": 1e-4, "logging_steps": 1}


def cli(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "multi30k-de-en", help="HF seq2seq model folder")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "mbr_distill.yaml", help="training YAML")
    p.add_argument("--out", type=Path, default=Path("runs/mbr-distill"), help="MBR targets, checkpoints, model")
    p.add_argument("--sources", type=Path, help="the sources to distil MBR decoding on, one a line")
    p.add_argument("--limit", type=int, help="at most this many of them")
    p.add_argument("--samples", type=int, default=64, help="epsilon samples per source: MBR's candidates")
    p.add_argument("--utility", default="bertscore", help="MBR's utility: bertscore, chrf, bleu …")
    p.add_argument("--test-sources", type=Path, help="test sources, one a line")
    p.add_argument("--test-references", type=Path, help="their references")
    p.add_argument("--eval-utility", default="bertscore", help="utility of the paired bootstrap")
    p.add_argument("--smoke", action="store_true", help="seconds: the committed model and sample, chrF")
    args = p.parse_args(argv)
    if args.smoke:  # the sample's files unless others are given; its sizes always
        vars(args).update({k: getattr(args, k) or SAMPLE / v for k, v in SMOKE_INPUTS.items()}, **SMOKE_SIZES)
    for name in SMOKE_INPUTS:
        if getattr(args, name) is None:
            p.error(f"--{name.replace('_', '-')} is required (or --smoke)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = cli(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load_model_and_tokenizer(args.model)
    test_sources = read_lines(args.test_sources)[: args.limit]
    beam_before = beam_translate(model, tokenizer, test_sources)
    # 1. The MBR-best of the samples per source ("best-beam" pairing without a beam: no pairs); resumable
    sources, targets = read_lines(args.sources)[: args.limit], args.out / "mbr-targets"
    ranking = dict(beams=0, pairing="best-beam", log_probs=False, store_lists=False)
    build_mbr_data(model, tokenizer, sources, targets, MBRDataConfig(args.samples, utility=args.utility, **ranking))
    # 2. The NLL of the MBR-best targets in Trainer's loop (the smoke run: on the CPU, no checkpoints)
    smoke = {**SMOKE_UPDATES, "warmup_steps": 0, "save_strategy": "no", "use_cpu": True} if args.smoke else {}
    config = MBRTrainingConfig.from_yaml(args.config, output_dir=str(args.out / "trainer"), **smoke)
    trainer = MBRTrainer(model, config, targets, tokenizer)
    checkpoints = sorted((args.out / "trainer").glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=bool(checkpoints) or None)
    trainer.save_model(str(args.out / "model"))
    # 3. The beam search of the distilled model against the original's
    beam_after = beam_translate(model, tokenizer, test_sources)
    refs = read_lines(args.test_references)[: args.limit]
    test = paired_bootstrap(beam_before, beam_after, refs, utility=args.eval_utility)
    log.info("%s", test)
    nll = [row["distill_nll"] for row in trainer.state.log_history if "distill_nll" in row]
    result = {"sources": len(sources), "steps": trainer.state.global_step}
    result.update(first_distill_nll=nll[0] if nll else None, last_distill_nll=nll[-1] if nll else None)
    result["test"] = asdict(test)
    write_json(args.out / "result.json", result)  # atomic: a stopped run leaves no half-written file
    return result


if __name__ == "__main__":
    main()
