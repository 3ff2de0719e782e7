"""Fine-tune a small paraphrase generator with cross-entropy, then with cross-entropy + BERTScore loss.

The generator is a BERT2BERT encoder-decoder initialised from the bundled all-MiniLM-L6-v2, so it shares
the scoring encoder's vocabulary (its output distribution feeds ``BERTScoreLoss`` directly). Data: STS-B
train pairs with score >= 4 (sentence1 -> sentence2); evaluation: greedy generation on the dev pairs with
score >= 4, scored with the exact evaluation mode (BERTScore F) and sacreBLEU.

    python examples/finetune_semantic_loss.py --config configs/finetune_semantic_loss.yaml
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml
from torch.utils.data import DataLoader

from bertscore_loss import BERTScorer
from bertscore_loss.encoder import bundled_model_path
from bertscore_loss.loss import BERTScoreLoss

ROOT = Path(__file__).resolve().parents[1]
logger = logging.getLogger("finetune_semantic_loss")


@dataclass
class FinetuneConfig:
    seed: int = 0
    data: str = "../shared/data/stsb"
    train_min_score: float = 4.0
    train_max: int = 2000
    dev_max: int = 200
    max_len: int = 32
    batch_size: int = 16
    max_steps: int = 150
    lr: float = 5e-5
    bertscore_weight: float = 0.5
    bertscore_layer: int | None = None
    top_k: int | None = 64
    max_mode: str = "straight_through"
    temperature: float = 0.05


def read_pairs(path: Path, min_score: float, limit: int) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        rows = [(a, b) for a, b, s in csv.reader(fh) if float(s) >= min_score]
    return rows[:limit]


def build_generator(tokenizer):
    from transformers import EncoderDecoderModel

    path = bundled_model_path()
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(path, path)
    model.config.decoder_start_token_id = tokenizer.cls_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.sep_token_id
    model.generation_config.decoder_start_token_id = tokenizer.cls_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.sep_token_id
    return model


class Paraphraser(pl.LightningModule):
    """BERT2BERT generator; loss = CE (+ ``bertscore_weight`` · (1 − F) on the teacher-forced distribution)."""

    def __init__(self, cfg: FinetuneConfig, tokenizer, use_bertscore: bool) -> None:
        super().__init__()
        self.cfg, self.tokenizer = cfg, tokenizer
        self.model = build_generator(tokenizer)
        self.semantic = (
            BERTScoreLoss(
                layer=cfg.bertscore_layer,
                device="cpu",
                top_k=cfg.top_k,
                max_mode=cfg.max_mode,
                temperature=cfg.temperature,
            )
            if use_bertscore
            else None
        )

    def collate(self, batch: list[tuple[str, str]]) -> dict:
        src = self.tokenizer(
            [a for a, _ in batch], max_length=self.cfg.max_len, truncation=True, padding=True, return_tensors="pt"
        )
        tgt = self.tokenizer(
            [b for _, b in batch], max_length=self.cfg.max_len, truncation=True, padding=True, return_tensors="pt"
        )
        labels = tgt["input_ids"][:, 1:].clone()  # drop [CLS]: it is the decoder start token
        labels[tgt["attention_mask"][:, 1:] == 0] = -100
        return {
            "input_ids": src["input_ids"],
            "attention_mask": src["attention_mask"],
            "labels": labels,
            "targets": [b for _, b in batch],
        }

    def on_train_start(self) -> None:
        self.model.train()  # from_pretrained() returns eval mode (no dropout); the scoring encoder stays frozen

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        loss = out.loss
        self.log("ce", out.loss, prog_bar=True)
        if self.semantic is not None:
            labels = batch["labels"]
            words = (labels != -100) & (labels != self.tokenizer.sep_token_id)  # the target's word positions
            sem = self.semantic(out.logits, batch["targets"], words)
            loss = loss + self.cfg.bertscore_weight * sem.loss
            self.log("bertscore_f", sem.f1.mean(), prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.cfg.lr)

    @torch.no_grad()
    def generate(self, sources: list[str], batch_size: int = 32) -> list[str]:
        self.model.eval()
        texts = []
        for i in range(0, len(sources), batch_size):
            enc = self.tokenizer(
                sources[i : i + batch_size],
                max_length=self.cfg.max_len,
                truncation=True,
                padding=True,
                return_tensors="pt",
            )
            ids = self.model.generate(**enc, max_new_tokens=self.cfg.max_len, num_beams=1, do_sample=False)
            texts += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return texts


def run(cfg: FinetuneConfig, use_bertscore: bool, train, dev, scorer: BERTScorer) -> dict:
    import sacrebleu
    from transformers import AutoTokenizer

    pl.seed_everything(cfg.seed, verbose=False)
    tokenizer = AutoTokenizer.from_pretrained(bundled_model_path())
    module = Paraphraser(cfg, tokenizer, use_bertscore)
    loader = DataLoader(train, batch_size=cfg.batch_size, shuffle=True, collate_fn=module.collate)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=cfg.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    start = time.perf_counter()
    trainer.fit(module, loader)
    train_s = time.perf_counter() - start
    hyps = module.generate([a for a, _ in dev])
    refs = [b for _, b in dev]
    _, _, f = scorer.score(hyps, refs)
    return {
        "run": "CE + λ·BERTScore" if use_bertscore else "CE",
        "dev_bertscore_f": f.mean().item(),
        "dev_sacrebleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
        "train_s": train_s,
        "example": hyps[0],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "finetune_semantic_loss.yaml"))
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="override config entries")
    args = parser.parse_args(argv)
    raw = yaml.safe_load(Path(args.config).read_text()) or {}
    for item in args.set:
        key, value = item.split("=", 1)
        raw[key] = yaml.safe_load(value)
    cfg = FinetuneConfig(**raw)
    data = (ROOT / cfg.data).resolve()
    train = read_pairs(data / "stsb-en-train.csv", cfg.train_min_score, cfg.train_max)
    dev = read_pairs(data / "stsb-en-dev.csv", 4.0, cfg.dev_max)
    scorer = BERTScorer(layer=cfg.bertscore_layer, device="cpu")
    results = [run(cfg, flag, train, dev, scorer) for flag in (False, True)]
    print(f"config: {dataclasses.asdict(cfg)}")
    print(f"train pairs: {len(train)}, dev pairs: {len(dev)}, scorer: {scorer.signature()}")
    print("| run | dev BERTScore F | dev sacreBLEU | train seconds | first dev output |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        f, bleu, secs = f"{r['dev_bertscore_f']:.4f}", f"{r['dev_sacrebleu']:.2f}", f"{r['train_s']:.0f}"
        cells = (r["run"], f, bleu, secs, r["example"])
        print("| " + " | ".join(cells) + " |")
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
