"""Minimum-risk training of a Hugging Face seq2seq model: the expected BERTScore risk of its own epsilon samples.

Each update draws ``mrt_samples`` epsilon samples per source from the model being trained (``rerank.sample_ids``,
seeded by the update) and lowers their expected risk, 1 − BERTScore F against the reference, under the model's
renormalised distribution over them (``bertscore_loss.MinimumRiskLoss``, the bundled MiniLM). The term needs
only sources and references, no MBR ranking: the data is ``rerank.trainer.MBRDataset.from_references``, and
nothing is built beforehand. Settings: a YAML of ``rerank.MBRTrainingConfig`` (``--config``, default
``configs/mrt.yaml``: ``mrt_weight: 1``, ``dpo_weight: 0``). Beam search on a test set before and after, and
``rerank.paired_bootstrap`` of the difference.

    python examples/train_mrt.py --model models/multi30k-de-en --sources train.de --references train.en \\
        --test-sources test.de --test-references test.en --out runs/mrt
    python examples/train_mrt.py --smoke     # the committed Marian model, 8 sources, seconds

Writes ``<out>/result.json``: the steps, the first and last logged ``mrt_risk``, the test.
"""

from __future__ import annotations

import argparse
import logging
import math
from dataclasses import asdict
from pathlib import Path

from bertscore_loss.outputs import write_json
from bertscore_loss.textio import read_lines
from rerank import MBRTrainer, MBRTrainingConfig, paired_bootstrap
from rerank.generate import beam_translate
from rerank.trainer import MBRDataset
from rerank.training_data import load_model_and_tokenizer

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "multi30k"
FILES = ("sources", "references", "test_sources", "test_references")
SAMPLE_FILES = dict(zip(FILES, ("train.de", "train.en", "test_2016_flickr.de", "test_2016_flickr.en")))
# --smoke: 8 sources of the sample, 4 samples each, 3 updates on the CPU, chrF for the test; seconds
SMOKE_RUN = dict(max_steps=3, mrt_samples=4, per_device_train_batch_size=8, learning_rate=1e-4, warmup_steps=0)
SMOKE_RUN.update(logging_steps=1, save_strategy="no", use_cpu=True)


def arguments(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sources", type=Path, help="training sources, one a line")
    p.add_argument("--references", type=Path, help="their reference translations, one a line (the risk's)")
    p.add_argument("--test-sources", type=Path, help="test sources, one a line")
    p.add_argument("--test-references", type=Path, help="test references, one a line")
    p.add_argument("--model", type=Path, default=ROOT / "models" / "multi30k-de-en", help="HF seq2seq model folder")
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "mrt.yaml", help="MBRTrainingConfig YAML")
    p.add_argument("--out", type=Path, default=Path("runs/mrt"), help="checkpoints, model, result.json")
    p.add_argument("--limit", type=int, help="at most this many sources (training and test)")
    p.add_argument("--eval-utility", default="bertscore", help="the significance test's utility")
    p.add_argument("--smoke", action="store_true", help="seconds: the committed model and sample")
    args = p.parse_args(argv)
    if args.smoke:
        for name, file in SAMPLE_FILES.items():
            setattr(args, name, getattr(args, name) or DATA / file)
        args.limit, args.eval_utility = 8, "chrf"
    if any(getattr(args, name) is None for name in FILES):
        p.error("give --sources, --references, --test-sources and --test-references (or --smoke)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    texts = {name: read_lines(getattr(args, name))[: args.limit] for name in FILES}
    model, tokenizer = load_model_and_tokenizer(args.model)
    dataset = MBRDataset.from_references(texts["sources"], texts["references"], tokenizer, model)
    config = MBRTrainingConfig.from_yaml(
        args.config, output_dir=str(args.out / "trainer"), **(SMOKE_RUN if args.smoke else {})
    )
    baseline = beam_translate(model, tokenizer, texts["test_sources"])  # the starting model's beam
    trainer = MBRTrainer(model, config, dataset, tokenizer)
    resumed = any((args.out / "trainer").glob("checkpoint-*"))  # a stopped run continues
    trainer.train(resume_from_checkpoint=resumed or None)
    trainer.save_model(str(args.out / "model"))
    system = beam_translate(model, tokenizer, texts["test_sources"])
    test = paired_bootstrap(baseline, system, texts["test_references"], utility=args.eval_utility)
    logging.getLogger("train_mrt").info("%s", test)
    risk = [entry["mrt_risk"] for entry in trainer.state.log_history if "mrt_risk" in entry]
    if not all(map(math.isfinite, risk)):
        raise RuntimeError(f"the risk term is not finite: {risk}")
    summary = {
        "sources": len(dataset),
        "samples_per_source": config.mrt_samples,
        "steps": trainer.state.global_step,
        "first_mrt_risk": risk[0] if risk else None,
        "last_mrt_risk": risk[-1] if risk else None,
        "test": asdict(test),
    }
    write_json(args.out / "result.json", summary)  # atomic: a stopped run leaves no half-written file
    return summary


if __name__ == "__main__":
    main()
