"""DPO on MBR-ranked pairs of a Hugging Face seq2seq model's own samples, with the library's public API.

1. Build the MBR data of a file of sources (``rerank.build_mbr_data``: beam output + epsilon samples, ranked by
   MBR; chosen = MBR-best, rejected = the beam output where it differs; reference log-probabilities stored).
2. Train with ``rerank.MBRTrainer``; the settings are a YAML of ``rerank.MBRTrainingConfig`` (``--config``,
   default ``configs/mbr_dpo.yaml``).
3. Translate a test set with beam search before and after, and test the gain with ``rerank.paired_bootstrap``.

    python examples/train_mbr_dpo.py --model models/multi30k-de-en --sources train.de \\
        --test-sources test.de --test-references test.en --out runs/mbr-dpo
    python examples/train_mbr_dpo.py --smoke     # the committed Marian model, 8 sources, seconds

A model folder with a Hugging Face tokenizer is read with ``AutoTokenizer``; one with ``spm.model`` and no
tokenizer files (the committed Marian model) with ``sentencepiece``. Writes ``<out>/result.json``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
import yaml
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, HfArgumentParser

from bertscore_loss.outputs import write_json
from rerank import MBRTrainer, MBRTrainingConfig, paired_bootstrap
from rerank.training_data import MBRDataConfig, build_mbr_data, codec_from

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "tests" / "data" / "multi30k"
logger = logging.getLogger("train_mbr_dpo")


def load(folder: Path):
    """The model and its tokenizer (an HF tokenizer, or the folder's sentencepiece model)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    if (folder / "spm.model").is_file() and not (folder / "tokenizer_config.json").is_file():
        import sentencepiece as spm

        return model, spm.SentencePieceProcessor(model_file=str(folder / "spm.model"))
    return model, AutoTokenizer.from_pretrained(folder)


def read_config(path: Path, **overrides) -> MBRTrainingConfig:
    """``MBRTrainingConfig`` from a YAML file, with ``overrides`` on top (the command line's)."""
    settings = yaml.safe_load(path.read_text()) or {}
    if not isinstance(settings, dict):
        raise SystemExit(f"{path}: expected a mapping of MBRTrainingConfig fields")
    (config,) = HfArgumentParser(MBRTrainingConfig).parse_dict({**settings, **overrides})
    return config


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], beams: int = 5, batch: int = 32) -> list[str]:
    """Beam-search translations of ``sources`` (eval mode)."""
    codec = codec_from(tokenizer, model)
    pad = model.config.pad_token_id
    model.eval()
    out: list[str] = []
    for s in range(0, len(sources), batch):
        ids = [codec.encode(t) for t in sources[s : s + batch]]
        width = max(map(len, ids))
        src = torch.tensor([r + [pad] * (width - len(r)) for r in ids], device=model.device)
        gen = model.generate(input_ids=src, attention_mask=src.ne(pad), num_beams=beams, max_new_tokens=width * 2 + 10)
        out += [codec.decode(row[1:].tolist()) for row in gen]
    return out


def lines(path: Path, limit: int | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8").splitlines()
    return [t for t in text if t.strip()][:limit]


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
    p.add_argument("--eval-utility", default="bertscore", help="the utility of the significance test")
    p.add_argument("--limit", type=int, help="at most this many training sources")
    p.add_argument("--smoke", action="store_true", help="seconds: the committed model, 8 sources, 8 samples, chrF")
    args = p.parse_args(argv)
    if args.smoke:
        args.sources = args.sources or SAMPLE / "train.de"
        args.test_sources = args.test_sources or SAMPLE / "test_2016_flickr.de"
        args.test_references = args.test_references or SAMPLE / "test_2016_flickr.en"
        args.limit, args.samples, args.utility, args.eval_utility = 8, 8, "chrf", "chrf"
    missing = [n for n in ("sources", "test_sources", "test_references") if getattr(args, n) is None]
    if missing:
        p.error(f"give {', '.join('--' + m.replace('_', '-') for m in missing)} (or --smoke)")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    model, tokenizer = load(args.model)
    sources = lines(args.sources, args.limit)
    data = args.out / "mbr-data"
    # 1. MBR-ranked pairs of the model's own samples (resumable: a stopped run continues)
    build_mbr_data(
        model,
        tokenizer,
        sources,
        data,
        MBRDataConfig(num_samples=args.samples, utility=args.utility, shard_size=500, precision="32"),
    )
    # 2. Train: Trainer's loop, checkpoints and logging; reference log-probabilities from the folder
    overrides: dict = {"output_dir": str(args.out / "trainer")}
    if args.smoke:
        overrides.update(
            max_steps=4,
            per_device_train_batch_size=8,
            learning_rate=1e-4,
            logging_steps=1,
            save_strategy="no",
            warmup_steps=0,
            use_cpu=True,
        )
    config = read_config(args.config, **overrides)
    test_src, refs = lines(args.test_sources, args.limit), lines(args.test_references, args.limit)
    before = translate(model, tokenizer, test_src)
    trainer = MBRTrainer(model, config, data, tokenizer)
    trainer.train(resume_from_checkpoint=any((args.out / "trainer").glob("checkpoint-*")) or None)
    trainer.save_model(str(args.out / "model"))
    # 3. Beam search before and after, and the paired bootstrap of the difference
    after = translate(model, tokenizer, test_src)
    test = paired_bootstrap(before, after, refs, utility=args.eval_utility)
    logger.info("%s", test)
    logs = [h for h in trainer.state.log_history if "dpo" in h]
    result = {
        "sources": len(sources),
        "pairs": sum(len(e.pairs) for e in trainer.train_dataset.examples),
        "steps": trainer.state.global_step,
        "first_dpo": logs[0]["dpo"] if logs else None,
        "last_dpo": logs[-1]["dpo"] if logs else None,
        "test": {
            "baseline": test.baseline,
            "system": test.system,
            "delta": test.delta,
            "p_value": test.p_value,
            "signature": test.signature,
        },
    }
    write_json(args.out / "result.json", result)
    return result


if __name__ == "__main__":
    main()
