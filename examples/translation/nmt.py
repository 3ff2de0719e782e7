"""Multi30k de→en: data, generator tokenizer, model and the Lightning module behind the recipe's stages.

Only the public API of ``bertscore_loss`` and ``rerank`` is used here; everything else is an ordinary
translation set-up (sentencepiece, a ``MarianConfig`` transformer, label-smoothed cross-entropy,
token-budget batches, inverse-square-root learning rate).
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import sacrebleu
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

logger = logging.getLogger("translation")

PAD, UNK, BOS, EOS = 0, 1, 2, 3


# --------------------------------------------------------------------------------------------------- data
def read_lines(path: str | Path) -> list[str]:
    """One sentence per line; lines end at ``\\n`` only (``str.splitlines`` would also split at U+2028)."""
    text = Path(path).read_text(encoding="utf-8")
    return [line.rstrip("\r") for line in text.split("\n")[: -1 if text.endswith("\n") else None]]


def read_pairs(data: str | Path, split: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    src, tgt = read_lines(Path(data) / f"{split}.de"), read_lines(Path(data) / f"{split}.en")
    if len(src) != len(tgt):
        raise ValueError(f"{split}: {len(src)} German lines but {len(tgt)} English lines")
    return (src[:limit], tgt[:limit]) if limit else (src, tgt)


def train_sentencepiece(data: str | Path, out: str | Path, vocab_size: int, limit: int | None = None) -> Path:
    """A joint de+en sentencepiece model on the training text; ids 0-3 are pad, unk, bos, eos."""
    import sentencepiece as spm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    src, tgt = read_pairs(data, "train", limit)
    corpus = out / "spm-train.txt"
    corpus.write_text("\n".join(src + tgt) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out / "spm"),
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    corpus.unlink()
    return out / "spm.model"


class TokenBudgetSampler(Sampler[list[int]]):
    """Batches of similar-length pairs whose padded size (rows × longest side) stays within ``budget`` tokens.

    Lengths are sorted with a little noise each epoch and the batches are shuffled, so every epoch sees
    different batches; ``set_epoch`` makes the order reproducible and resumable.
    """

    def __init__(self, lengths: Sequence[int], budget: int, shuffle: bool = True, seed: int = 0) -> None:
        self.lengths, self.budget, self.shuffle, self.seed, self.epoch = list(lengths), budget, shuffle, seed, 0
        self._batches = self._make()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._batches = self._make()

    def _make(self) -> list[list[int]]:
        rng = random.Random(self.seed * 1000 + self.epoch)
        keys = [(n + (rng.random() * 2 if self.shuffle else 0), i) for i, n in enumerate(self.lengths)]
        order = [i for _, i in sorted(keys)]
        batches, cur, longest = [], [], 0
        for i in order:
            n = self.lengths[i]
            if cur and max(longest, n) * (len(cur) + 1) > self.budget:
                batches.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, n)
        if cur:
            batches.append(cur)
        if self.shuffle:
            rng.shuffle(batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self._batches)

    def __len__(self) -> int:
        return len(self._batches)


def pad(rows: Sequence[Sequence[int]], value: int = PAD) -> Tensor:
    out = torch.full((len(rows), max(len(r) for r in rows)), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out


class PairData:
    """Tokenised pairs: source ids end with EOS; labels are target ids + EOS (the model shifts them right)."""

    def __init__(self, sp, src: list[str], tgt: list[str], max_len: int) -> None:
        self.src_text, self.tgt_text = src, tgt
        self.src = [ids[: max_len - 1] + [EOS] for ids in sp.encode(src)]
        self.tgt = [ids[: max_len - 1] + [EOS] for ids in sp.encode(tgt)]

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> int:
        return i

    def lengths(self) -> list[int]:
        return [max(len(a), len(b)) for a, b in zip(self.src, self.tgt)]

    def collate(self, idx: list[int]) -> dict:
        src = pad([self.src[i] for i in idx])
        labels = pad([self.tgt[i] for i in idx], -100)
        return {
            "index": torch.tensor(idx),
            "input_ids": src,
            "attention_mask": src != PAD,
            "labels": labels,
        }

    def loader(self, budget: int, shuffle: bool, seed: int = 0) -> DataLoader:
        sampler = TokenBudgetSampler(self.lengths(), budget, shuffle, seed)
        return DataLoader(self, batch_sampler=sampler, collate_fn=self.collate)


# -------------------------------------------------------------------------------------------------- model
@dataclass
class ModelConfig:
    vocab_size: int = 8000
    d_model: int = 256
    layers: int = 3
    heads: int = 4
    ffn: int = 1024
    dropout: float = 0.1
    attention_dropout: float | None = None  # None = dropout
    max_positions: int = 256


def build_model(cfg: ModelConfig, vocab_size: int):
    """A small Marian transformer (shared, tied embeddings) initialised at random."""
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=cfg.d_model,
        encoder_layers=cfg.layers,
        decoder_layers=cfg.layers,
        encoder_attention_heads=cfg.heads,
        decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.ffn,
        decoder_ffn_dim=cfg.ffn,
        dropout=cfg.dropout,
        attention_dropout=cfg.dropout if cfg.attention_dropout is None else cfg.attention_dropout,
        activation_dropout=0.0,
        activation_function="relu",
        max_position_embeddings=cfg.max_positions,
        scale_embedding=True,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=BOS,
        decoder_start_token_id=BOS,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    model = MarianMTModel(config)
    gen = model.generation_config
    gen.decoder_start_token_id, gen.pad_token_id, gen.eos_token_id, gen.bos_token_id = BOS, PAD, EOS, BOS
    gen.forced_eos_token_id = None
    gen.bad_words_ids = None
    gen.max_length = None
    return model


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_label() -> str:
    """The CPU model and its bf16 flags, to label every recorded figure."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags |= set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = sorted(flags & {"avx512_bf16", "amx_bf16"})
    return f"{model} ({', '.join(bf16) if bf16 else 'no native bf16'})"


# ------------------------------------------------------------------------------------------------ decoding
@torch.no_grad()
def translate(
    model,
    sp,
    sources: Sequence[str],
    *,
    beams: int = 5,
    budget: int = 6000,
    max_len: int = 128,
    precision: str = "32-true",
    **generate_kwargs,
) -> list[str]:
    """Translations in input order; length-sorted batches of at most ``budget`` source tokens × beams."""
    was_training = model.training
    model.eval()
    ids = [s[: max_len - 1] + [EOS] for s in sp.encode(list(sources))]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    out: list[str] = [""] * len(ids)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
    start = 0
    n_ret = generate_kwargs.get("num_return_sequences", 1)
    while start < len(order):
        longest = len(ids[order[start]])
        end = start
        while end < len(order) and max(longest, len(ids[order[end]])) * (end - start + 1) * max(beams, n_ret) <= budget:
            longest = max(longest, len(ids[order[end]]))
            end += 1
        end = max(end, start + 1)
        batch = [order[i] for i in range(start, end)]
        src = pad([ids[i] for i in batch]).to(model.device)
        with autocast:
            gen = model.generate(
                input_ids=src,
                attention_mask=src != PAD,
                num_beams=beams,
                max_new_tokens=int(src.shape[1] * 1.5) + 10,
                **generate_kwargs,
            )
        texts = sp.decode([[t for t in row if t > EOS] for row in gen.tolist()])
        if n_ret > 1:
            for j, i in enumerate(batch):
                out[i] = texts[j * n_ret : (j + 1) * n_ret]
        else:
            for i, t in zip(batch, texts):
                out[i] = t
        start = end
    model.train(was_training)
    return out


def sample(
    model,
    sp,
    sources: Sequence[str],
    n: int,
    *,
    epsilon: float = 0.02,
    max_len: int = 128,
    precision: str = "32-true",
    token_budget: int = 65536,
    seed: int | None = None,
) -> tuple[list[list[str]], list[list[float]]]:
    """``n`` epsilon samples per source (texts, and their mean log-probabilities per token) with
    :func:`rerank.sample_ids`: token-budgeted batches, the source encoded once per batch, finished samples
    leave the batch; ``precision`` ``"bf16-mixed"`` runs under bf16 autocast."""
    from rerank import SamplingConfig, sample_ids

    ids = [s[: max_len - 1] + [EOS] for s in sp.encode(list(sources))]
    cfg = SamplingConfig(
        num_samples=n,
        epsilon=epsilon,
        precision="bf16" if precision.startswith("bf16") else "32",
        token_budget=token_budget,
        seed=seed,
    )
    out = sample_ids(model, ids, cfg)
    texts = [sp.decode([[t for t in q if t > EOS] for q in qs]) for qs in out.sequences]
    return texts, out.scores


# ---------------------------------------------------------------------------------------------- lightning
@dataclass
class TrainConfig:
    lr: float = 1e-3
    warmup: int = 500
    label_smoothing: float = 0.1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    clip: float = 1.0
    val_beams: int = 1
    val_limit: int | None = None


def inverse_sqrt(warmup: int):
    def factor(step: int) -> float:
        step += 1
        return min(step / warmup, math.sqrt(warmup / step))

    return factor


def label_smoothed_ce(logits: Tensor, labels: Tensor, smoothing: float) -> Tensor:
    """Token-mean label-smoothed cross-entropy; ``labels`` ``[B, T]`` with -100 = ignored."""
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, label_smoothing=smoothing
    )


class Translator(pl.LightningModule):
    """The generator and its cross-entropy training; validation decodes val and logs sacreBLEU and BERTScore F."""

    def __init__(self, model, sp, train_cfg: TrainConfig, val: PairData, precision: str = "32-true") -> None:
        super().__init__()
        self.model, self.sp, self.cfg, self.val, self.precision_name = model, sp, train_cfg, val, precision
        from bertscore_loss.lightning import BERTScoreMetric

        self.val_bertscore = BERTScoreMetric()
        self._t0: float | None = None
        self.history: list[dict] = []
        self.curve_path: Path | None = None
        self.epoch_dir: Path | None = None  # stage 1: the generator's weights after every epoch (for averaging)
        self.keep_epochs = 0  # how many of them to keep (0 = all)

    def configure_optimizers(self):
        opt = torch.optim.Adam(
            self.model.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas), weight_decay=self.cfg.weight_decay
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt(self.cfg.warmup))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_epoch_start(self) -> None:
        sampler = self.trainer.train_dataloader.batch_sampler
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.current_epoch)
        self._t0 = time.perf_counter()

    def ce(self, batch: dict) -> tuple[Tensor, Tensor]:
        out = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        return label_smoothed_ce(out.logits, batch["labels"], self.cfg.label_smoothing), out.logits

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, _ = self.ce(batch)
        self.log("train/ce", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def on_train_epoch_end(self) -> None:
        if self._t0 is not None:
            self.log("train/epoch_seconds", time.perf_counter() - self._t0)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        pass  # decoding happens once per epoch in on_validation_epoch_end (length-sorted, all val at once)

    @torch.no_grad()
    def val_loss(self, budget: int = 4096) -> float:
        """Token-mean cross-entropy (no smoothing) of all val pairs, teacher-forced, dropout off."""
        was_training = self.model.training
        self.model.eval()
        total, count = 0.0, 0
        for batch in self.val.loader(budget, shuffle=False):
            batch = {k: v.to(self.device) for k, v in batch.items()}
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                labels=batch["labels"]).logits
            n = int((batch["labels"] != -100).sum())
            total += float(label_smoothed_ce(logits, batch["labels"], 0.0)) * n
            count += n
        self.model.train(was_training)
        return total / max(1, count)

    def save_epoch_weights(self) -> None:
        """The generator's weights after this epoch (``epoch-NNN.pt``), the oldest beyond ``keep_epochs`` removed."""
        if self.epoch_dir is None:
            return
        self.epoch_dir.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        torch.save(state, self.epoch_dir / f"epoch-{self.current_epoch:03d}.pt")
        saved = sorted(self.epoch_dir.glob("epoch-*.pt"))
        for old in saved[: max(0, len(saved) - self.keep_epochs)] if self.keep_epochs else []:
            old.unlink()

    def on_validation_epoch_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        n = self.cfg.val_limit or len(self.val)
        src, refs = self.val.src_text[:n], self.val.tgt_text[:n]
        t0 = time.perf_counter()
        train_seconds = t0 - self._t0 if self._t0 is not None else None
        hyps = translate(self.model, self.sp, src, beams=self.cfg.val_beams, precision=self.precision_name)
        bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
        self.val_bertscore.reset()
        self.val_bertscore.update(hyps, refs)
        f1 = float(self.val_bertscore.compute()["f1"]) * 100
        row = {
            "epoch": self.current_epoch,
            "step": self.global_step,
            "val_bleu": bleu,
            "val_bertscore_f": f1,
            "val_loss": self.val_loss(),
            "val_seconds": time.perf_counter() - t0,
            "train_seconds": train_seconds,
        }
        self.save_epoch_weights()
        self.history.append(row)
        if self.curve_path is not None:  # one row per validated epoch, across resumes (written as it goes)
            with open(self.curve_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**row, "cpu": cpu_label(), "precision": self.precision_name}) + "\n")
        logger.info("epoch %d step %d: val BLEU %.2f BERTScore F %.2f", self.current_epoch, self.global_step, bleu, f1)
        self.log("val/bleu", bleu)
        self.log("val/bertscore_f", f1)
        self.log("val/loss", row["val_loss"])


# ------------------------------------------------------------------------------------------- fine-tuning
ARMS = ("ce", "bertscore", "mrt")


class FineTuner(Translator):
    """Stage 2: one arm of the comparison, from the stage-1 weights, with the same batches for every arm.

    ``ce``: cross-entropy only (the control). ``bertscore``: CE + ``weight`` · ``BERTScoreLoss`` on the
    teacher-forced output distributions, through a ``VocabBridge`` built from the generator's
    sentencepiece model. ``mrt``: CE + ``weight`` · ``MinimumRiskLoss`` over ``samples`` translations
    sampled per source (risk 1 − F from the exact evaluation mode, all candidate lists of the batch
    scored in one call), expected under the renormalised sequence probabilities (sharpness ``alpha``).
    """

    def __init__(
        self,
        model,
        sp,
        cfg: TrainConfig,
        val: PairData,
        precision: str,
        arm: str,
        semantic=None,
        risk=None,
        weight: float = 1.0,
        samples: int = 8,
    ) -> None:
        super().__init__(model, sp, cfg, val, precision)
        if arm not in ARMS:
            raise ValueError(f"arm must be one of {ARMS}, got {arm!r}")
        self.arm, self.semantic, self.risk, self.weight, self.samples = arm, semantic, risk, weight, samples
        self.step_seconds: list[float] = []

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, self.cfg.warmup)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        self.model.train()  # from_pretrained() returns eval mode: without this, dropout would be off in every arm

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._step_t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.step_seconds.append(time.perf_counter() - self._step_t0)

    def sample(self, batch: dict) -> tuple[Tensor, list[list[str]], Tensor]:
        """``samples`` ancestral samples per source: labels ``[B·k, T]`` (-100 after EOS), texts, sources."""
        k = self.samples
        self.model.eval()
        with torch.no_grad():
            gen = self.model.generate(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                do_sample=True,
                top_k=0,
                num_beams=1,
                num_return_sequences=k,
                max_new_tokens=int(batch["input_ids"].shape[1] * 1.5) + 10,
            )
        self.model.train()
        labels = gen[:, 1:].clone()  # drop the decoder start token
        after_eos = (labels == EOS).long().cumsum(1) - (labels == EOS).long() > 0
        labels[after_eos | (labels == PAD)] = -100
        rows = [[t for t in row if t > EOS] for row in labels.clamp_min(0).tolist()]
        texts = self.sp.decode(rows)
        b = batch["input_ids"].shape[0]
        return labels, [texts[i * k : (i + 1) * k] for i in range(b)], batch["input_ids"].repeat_interleave(k, 0)

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        from bertscore_loss import sequence_log_probs

        n = batch["input_ids"].shape[0]
        ce, logits = self.ce(batch)
        loss = ce
        refs = [self.train_targets[i] for i in batch["index"].tolist()]
        if self.arm == "bertscore":
            labels = batch["labels"]
            words = (labels != -100) & (labels != EOS)
            sem = self.semantic(logits.float(), refs, words)
            loss = ce + self.weight * sem.loss
            self.log("train/bertscore_f", sem.f1.mean(), batch_size=n)
        elif self.arm == "mrt":
            labels, texts, src = self.sample(batch)
            out = self.model(input_ids=src, attention_mask=src != PAD, labels=labels)
            lp = sequence_log_probs(out.logits, labels).view(n, self.samples)
            risk = self.risk(lp, texts, refs)
            loss = ce + self.weight * risk.loss
            self.log("train/risk", risk.loss, batch_size=n)
        self.log("train/ce", ce, prog_bar=True, batch_size=n)
        self.log("train/loss", loss, batch_size=n)
        return loss
