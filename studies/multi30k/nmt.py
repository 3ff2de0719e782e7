"""Multi30k de→en: data, generator tokenizer, model and the Lightning module behind the recipe's stages.

Only the public API of ``bertscore_loss`` and ``rerank`` is used here; everything else is an ordinary
translation set-up (sentencepiece, a ``MarianConfig`` transformer, label-smoothed cross-entropy,
token-budget batches, inverse-square-root learning rate).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytorch_lightning as pl
import sacrebleu
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import DataLoader, Sampler

from bertscore_loss.machine import cpu_label  # the label of every recorded figure
from bertscore_loss.outputs import atomic_path, write_text
from bertscore_loss.textio import read_lines  # lines end at \n or \r\n only, never at U+2028
from rerank.sampling import native_bf16

logger = logging.getLogger("translation")

PAD, UNK, BOS, EOS = 0, 1, 2, 3


# --------------------------------------------------------------------------------------------------- data
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


class StepBatches(Sampler[list[int]]):
    """The batches of updates ``start`` … ``stop - 1`` of a run: the epochs of ``base`` one after another.

    Update ``u``'s batch depends only on ``base``'s seed and ``u``, so a run resumed at update ``start``
    sees the same batches as one that never stopped, and runs of different lengths share their first
    batches. ``len()`` is ``stop`` (Lightning counts the updates done before a resume into the epoch).
    """

    def __init__(self, base: TokenBudgetSampler, stop: int, start: int = 0) -> None:
        if not 0 <= start <= stop:
            raise ValueError(f"need 0 <= start <= stop, got start={start}, stop={stop}")
        self.base, self.stop, self.start = base, stop, start

    def __iter__(self) -> Iterator[list[int]]:
        u, epoch = 0, 0
        while u < self.stop:
            self.base.set_epoch(epoch)
            n = len(self.base)
            if u + n <= self.start:  # a whole epoch before the start: skip without copying it
                u, epoch = u + n, epoch + 1
                continue
            for batch in self.base:
                if u >= self.stop:
                    return
                if u >= self.start:
                    yield batch
                u += 1
            epoch += 1

    def __len__(self) -> int:
        return self.stop


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

    def batches_per_epoch(self, budget: int, seed: int = 0) -> int:
        """How many shuffled token-budget batches one epoch has (the first epoch of ``seed``)."""
        return len(TokenBudgetSampler(self.lengths(), budget, True, seed))

    def step_loader(self, budget: int, seed: int, stop: int, start: int = 0) -> DataLoader:
        """The shuffled batches of updates ``start`` … ``stop - 1`` (:class:`StepBatches`), epoch after epoch."""
        sampler = StepBatches(TokenBudgetSampler(self.lengths(), budget, True, seed), stop, start)
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


def freeze_positions(model):
    """Keep the sinusoidal position tables fixed, as Marian defines them: ``save_pretrained`` does not store
    them (they are rebuilt on load), so trained ones would be lost on export. ``from_pretrained`` (transformers
    5) returns them trainable; ``MarianMTModel(config)`` frozen."""
    for name, param in model.named_parameters():
        if "embed_positions" in name:
            param.requires_grad_(False)
    return model


def scorer_dtype(name: str) -> str:
    """The frozen scorer's dtype for a ``scorer_dtype`` setting: ``auto`` = bfloat16 where the CPU has native
    bf16 (AMX or AVX512-BF16: never assumed), else float32; ``float32``/``bfloat16`` as given."""
    if name == "auto":
        return "bfloat16" if native_bf16("cpu") else "float32"
    if name not in ("float32", "bfloat16"):
        raise ValueError(f"scorer_dtype must be 'float32', 'bfloat16' or 'auto', got {name!r}")
    return name


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
            logits = self.model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
            ).logits
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
        # a run's own file: atomic (an interruption leaves no truncated epoch), the run folder already checked
        with atomic_path(self.epoch_dir / f"epoch-{self.current_epoch:03d}.pt", overwrite=True, allow_docs=True) as tmp:
            torch.save(state, tmp)
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
ARMS = ("ce", "bertscore", "mrt", "mbr-distill", "mbr-dpo")
MRT_CANDIDATES = ("ancestral", "epsilon", "beam")  # mrt: how the candidates of a source are drawn
SELECT = ("bertscore_f", "bleu", "chrf")  # val scores the checkpoint rule may maximise


@dataclass
class RunPlan:
    """How a stage-2 run goes: its length, when it validates, which weights it keeps, when it pauses.

    ``val_every`` updates (and after the last one, and before the first: the initial model) the module
    decodes val with ``val_beams`` beams and scores it with ``val_score(hyps, refs) -> dict``; the weights
    with the highest ``select`` score so far are kept. ``patience``: stop once that many validations in a
    row bring no better score. ``stop_at`` (an update) and ``deadline`` (``time.time()``) end this
    invocation early with a checkpoint to resume from; neither changes what the run computes.
    """

    updates: int
    val_every: int | None = None  # None: no validation, the last weights are kept
    val_beams: int = 1
    val_limit: int | None = None  # the first N val pairs (None = all)
    select: str = "bertscore_f"
    patience: int | None = None
    checkpoint: Path | None = None  # last.ckpt: written after every validation and when the run pauses
    curve: Path | None = None  # the val curve so far (JSON, rewritten after every validation)
    stop_at: int | None = None
    deadline: float | None = None


def draw_tokens(logits: Tensor, block: int | None = None) -> Tensor:
    """One token per row of ``logits`` ``[N, V]`` drawn from ``softmax(logits)`` (computed in float32 whatever
    the logits' dtype) by inverse-CDF sampling: one uniform number per row, the CDF over blocks of ``block``
    tokens (None: a divisor of V near √V) and then within the chosen block (cumulative sums in float64), so a
    draw costs the softmax and one more pass (torch.multinomial draws V random numbers per row). A token of
    probability 0 is never drawn."""
    n, v = logits.shape
    block = block or _block_size(v)
    nb = -(-v // block)
    weights = torch.softmax(logits, dim=-1, dtype=torch.float32)
    if nb * block != v:
        weights = F.pad(weights, (0, nb * block - v))
    weights = weights.view(n, nb, block)  # [N, blocks, block]
    sums = weights.sum(dim=-1).double()  # [N, blocks] (a float64 sum would first copy all of weights to float64)
    cdf = sums.cumsum(dim=-1)
    u = torch.rand(n, 1, dtype=torch.float64, device=logits.device) * cdf[:, -1:]
    b = torch.searchsorted(cdf, u, right=True).clamp_max(nb - 1)  # [N, 1]
    rest = u - (cdf.gather(1, b) - sums.gather(1, b))
    inside = weights.gather(1, b.unsqueeze(-1).expand(n, 1, block)).squeeze(1)  # [N, block]
    j = torch.searchsorted(inside.double().cumsum(dim=-1), rest, right=True)
    last = block - 1 - (inside > 0).flip(-1).long().argmax(dim=-1, keepdim=True)  # a rounding overshoot stays real
    return (b * block + torch.minimum(j, last)).squeeze(1)


def _block_size(v: int) -> int:
    """A divisor of ``v`` between √v/2 and 2√v (no padding per draw), else ⌈√v⌉."""
    root = max(int(v**0.5), 1)
    for d in sorted(range(max(root // 2, 1), 2 * root + 1), key=lambda d: abs(d - root)):
        if v % d == 0:
            return d
    return root + 1


@torch.no_grad()
def sample_sequences(
    model, states: Tensor, attention_mask: Tensor, max_new_tokens: int, *, compact: float = 0.125
) -> Tensor:
    """Ancestral samples ``[N, 1 + steps]`` (BOS first, PAD after EOS) of the decoder given encoder states
    ``[N, S, d]`` and their mask ``[N, S]``: the whole softmax (temperature 1), :func:`draw_tokens` at each
    step. Finished rows leave the batch (their cache rows too) once they are a ``compact`` share of it, so a
    step costs about what the unfinished rows cost. Call it with the model in the mode to sample in (eval:
    no dropout)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    n = states.shape[0]
    out = torch.full((n, max_new_tokens + 1), PAD, dtype=torch.long, device=states.device)
    out[:, 0] = BOS
    rows = torch.arange(n, device=states.device)  # the output row of each batch row
    done = torch.zeros(n, dtype=torch.bool, device=states.device)
    cache = EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    # the cache argument's name: `cache` in newer transformers, `past_key_values` before (an unknown keyword is
    # swallowed by **kwargs there: every step would decode its last token alone)
    cache_arg = "cache" if "cache" in inspect.signature(decoder.forward).parameters else "past_key_values"
    bias = getattr(model, "final_logits_bias", None)
    bias = bias if bias is not None and bool(bias.any()) else None  # Marian's stays 0: one [N, V] pass less
    tokens, steps = out[:, :1], 0
    for t in range(max_new_tokens):
        hidden = decoder(
            input_ids=tokens,
            encoder_hidden_states=states,
            encoder_attention_mask=attention_mask,
            use_cache=True,
            **{cache_arg: cache},
        ).last_hidden_state[:, -1]
        logits = head(hidden)  # [N, V], bf16 under autocast: draw_tokens' softmax reads it as float32
        nxt = draw_tokens(logits.float() + bias if bias is not None else logits)
        nxt = nxt.masked_fill(done, PAD)  # rows finished earlier (not yet compacted) get padding
        out[rows, t + 1] = nxt
        steps = t + 1
        done |= nxt == EOS
        if bool(done.all()):
            break
        if float(done.float().mean()) >= compact:
            keep = (~done).nonzero().squeeze(1)
            rows, states, attention_mask, nxt = rows[keep], states[keep], attention_mask[keep], nxt[keep]
            done = done[keep]
            cache.batch_select_indices(keep)
        tokens = nxt.unsqueeze(1)
    return out[:, : steps + 1]


@contextlib.contextmanager
def no_dropout(module) -> Iterator[None]:
    """``module`` in eval mode (no dropout: as reference log-probabilities and samples are made) with SDPA's
    math attention kernel (the fused CPU kernel's backward is slow in bf16), gradients kept; the modules'
    modes are restored after."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        for m, mode in modes.items():
            m.training = mode


@contextlib.contextmanager
def decoder_dropout(model, on: bool) -> Iterator[None]:
    """With ``on=False``: the decoder without dropout (:func:`no_dropout`) for the duration; ``on``: as it is."""
    if on:
        yield
        return
    with no_dropout(model.get_decoder()):
        yield


DPO_PAIRS = ("all", "not-shorter", "balanced")  # MBRTargets.select_pairs modes (the recipe's dpo_pairs)


@dataclass
class MBRTargets:
    """What the ``mbr-*`` arms read from MBR-ranked data (``rerank.build_mbr_data``), by training index: the
    MBR-best target's ids (labels: ids + EOS), the rejected candidate's ids (rows with a pair), and the
    generating model's log-probabilities of both (the preference loss's reference)."""

    target: dict[int, list[int]]
    rejected: dict[int, list[int]]
    ref_chosen: dict[int, float]
    ref_rejected: dict[int, float]

    @classmethod
    def read(cls, folder: str | Path, sp, max_len: int, sources: Sequence[str]) -> MBRTargets:
        """The rows of ``folder`` (shards built so far; their prompts must be ``sources`` at their indices)."""
        from rerank.training_data import read_mbr_data

        rows = read_mbr_data(folder, complete=False)
        if not rows:
            raise ValueError(f"{folder}: no MBR data built yet")
        for r in rows:
            if r["index"] >= len(sources) or sources[r["index"]] != r["prompt"]:
                raise ValueError(f"{folder}: row {r['index']} is not the training source at that index")
        whole = {r["index"]: sp.encode(r["chosen"]) + [EOS] for r in rows}
        ids = {i: t[: max_len - 1] + [EOS] if len(t) > max_len else t for i, t in whole.items()}
        pairs = [r for r in rows if r["rejected"] is not None and r.get("rejected_logp") is not None]
        rej_whole = {r["index"]: sp.encode(r["rejected"]) + [EOS] for r in pairs}
        # the stored log-probabilities are of the whole texts: a pair cut to max_len would compare a cut
        # policy sequence with a whole reference one, so it leaves the preference term (its target stays, cut)
        long = {i for i in rej_whole if len(rej_whole[i]) > max_len or len(whole[i]) > max_len}
        cut = long | {i for i in rej_whole if len(sp.encode(sources[i])) + 1 > max_len}  # a cut source too
        if cut:
            logger.warning(
                "%s: %d preference pairs left out: a side or the source is over max_len %d tokens (the stored "
                "log-probabilities are of whole texts)",
                folder,
                len(cut),
                max_len,
            )
        pairs = [r for r in pairs if r["index"] not in cut]
        rej = {r["index"]: rej_whole[r["index"]] for r in pairs}
        return cls(
            ids, rej, {r["index"]: r["chosen_logp"] for r in pairs}, {r["index"]: r["rejected_logp"] for r in pairs}
        )

    def select_pairs(self, mode: str) -> MBRTargets:
        """The same targets with the preference pairs of ``mode`` (token counts of the two sides): ``"all"``;
        ``"not-shorter"``: the pairs whose chosen side is at least as long as the rejected one (a preference
        that never rewards a shorter output); ``"balanced"``: the pairs of equal length, every pair of the
        rarer direction (chosen shorter, or chosen longer) and as many of the other direction (a fixed random
        subset, seed 0), so that the kept pairs carry no net preference for either length.

        The rule is :func:`rerank.select_pairs` (seed 0) on the pairs in training-index order."""
        from rerank.preference_data import MBRExample, PreferencePair, select_pairs

        examples = []
        for i, r in sorted(self.rejected.items()):
            pair = PreferencePair("", "", tuple(self.target[i]), tuple(r), None, None)
            examples.append(MBRExample(i, "", (), "", tuple(self.target[i]), (pair,)))
        keep = {e.index for e in select_pairs(examples, mode, seed=0) if e.pairs}  # type: ignore[arg-type]
        return MBRTargets(
            self.target,
            {i: r for i, r in self.rejected.items() if i in keep},
            {i: v for i, v in self.ref_chosen.items() if i in keep},
            {i: v for i, v in self.ref_rejected.items() if i in keep},
        )


def shift_right(labels: Tensor) -> Tensor:
    """Decoder inputs ``[N, T]`` of ``labels`` (-100 = padding): BOS, then the labels but the last (as HF does)."""
    out = labels.new_full(labels.shape, PAD)
    out[:, 1:] = labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD)
    out[:, 0] = BOS
    return out


def ce_pass(model, batch: dict, smoothing: float) -> tuple[Tensor, Tensor, object]:
    """Label-smoothed CE, logits ``[B, T, V]`` and the encoder output of a batch: ``Translator.ce`` keeping the
    encoder output (its states ``[B, S, d]`` feed the samples' log-probability pass) and without the
    unsmoothed loss a Hugging Face model computes when given ``labels=``."""
    encoded = model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    out = model(
        attention_mask=batch["attention_mask"], encoder_outputs=encoded, decoder_input_ids=shift_right(batch["labels"])
    )
    return label_smoothed_ce(out.logits, batch["labels"], smoothing), out.logits, encoded


def candidate_log_probs(
    model, states: Tensor, attention_mask: Tensor, sources: Tensor, labels: Tensor, *, budget: int = 8192
) -> Tensor:
    """Log-probability ``[N]`` of each candidate ``labels`` ``[N, T]`` (-100 = padding at the end) given the
    encoder states ``states[sources]`` (``states`` ``[B, S, d]``, ``attention_mask`` ``[B, S]``, ``sources``
    ``[N]``): :func:`bertscore_loss.risk.target_log_probs` on states already made, so the ``mrt`` arm scores
    its samples from the CE pass's encoder output (one encoder pass per update, its dropout draw shared with
    the CE term). Equals ``sequence_log_probs(model(input_ids=src[sources], ..., labels=labels).logits,
    labels)`` without dropout, and the gradient reaches ``states`` (studies/multi30k/tests/test_fast_paths.py).
    """
    from bertscore_loss.risk import target_log_probs

    if labels.shape[0] == 0:
        return torch.zeros(0, device=labels.device)
    targets = [row[row != -100].tolist() for row in labels]
    return target_log_probs(
        model, None, targets, sources.tolist(), token_budget=budget, encoder_states=(states, attention_mask)
    )


def sample_log_probs(model, states: Tensor, attention_mask: Tensor, labels: Tensor, texts, k: int) -> Tensor:
    """The log-probabilities ``[B, k]`` of ``k`` samples per source that ``MinimumRiskLoss`` uses: the distinct
    samples of rows with two or more of them (:func:`bertscore_loss.risk.distinct_candidates`), computed by
    :func:`candidate_log_probs` from the sources' encoder states ``[B, S, d]``; 0 elsewhere (a repeat or the
    one candidate of a row has no effect on the risk's value or gradient, whatever its log-probability)."""
    from bertscore_loss.risk import distinct_candidates

    present = distinct_candidates(texts, k)
    need = (present & (present.sum(dim=1, keepdim=True) > 1)).view(-1).to(labels.device)
    rows = need.nonzero().squeeze(1)
    lp = torch.zeros(need.numel(), device=labels.device)
    if rows.numel():
        lp = lp.index_put((rows,), candidate_log_probs(model, states, attention_mask, rows // k, labels[rows]))
    return lp.view(len(texts), k)


class FineTuner(Translator):
    """Stage 2: one arm of the comparison, from the stage-1 weights, with the same batches for every arm.

    ``ce``: cross-entropy only (the control). ``bertscore``: CE + ``weight`` · ``BERTScoreLoss`` on the
    teacher-forced output distributions, through a ``VocabBridge`` built from the generator's
    sentencepiece model. ``mrt``: CE + ``weight`` · ``MinimumRiskLoss`` over ``samples`` translations
    sampled per source (risk 1 − F from the exact evaluation mode, all candidate lists of the batch
    scored in one call), expected under the renormalised sequence probabilities (sharpness ``alpha``).
    """

    # mrt: the samples' log-probabilities from the CE pass's encoder states, and only where the risk needs them
    # (sample_log_probs); False = the full model on every sample (the same values without dropout)
    shared_encoder: bool = True
    sampler: str = "loop"  # mrt: how sample() draws ("loop": sample_sequences, or "generate": Hugging Face)
    # mrt: dropout in the samples' decoder pass (True, as in the CE pass); False: that decoder pass without it
    log_prob_dropout: bool = True
    # bertscore / mrt: the semantic term on this many sources of each batch (None: all), chosen at random by
    # a generator seeded with (row_seed, update), so a resumed run picks the same ones; CE on every source
    semantic_rows: int | None = None
    row_seed: int = 0
    # mrt: "ancestral" (full softmax, temperature 1), "epsilon" (epsilon sampling, rerank.sample_ids) or
    # "beam" (the beam's n-best list: Edunov et al. 2018); the epsilon of "epsilon"
    mrt_candidates: str = "ancestral"
    mrt_epsilon: float = 0.02
    # the weight of the CE on the references (BERTTune's arm trains on -F alone: 0)
    ce_weight: float = 1.0
    # mbr-distill: the share of rows with an MBR-best target whose label is that target (the rest keep the
    # reference), drawn per row and update from (row_seed, update); mbr-*: the MBRTargets read
    distill_share: float = 0.5
    mbr: MBRTargets | None = None

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
        self.preference = None  # mbr-dpo: a bertscore_loss.PreferenceLoss (no parameters, no state)
        self.step_seconds: list[float] = []
        self.plan: RunPlan | None = None  # set by the recipe: validation, checkpoint rule, pauses
        self.val_score: Callable[[list[str], list[str]], dict] | None = None  # (hyps, refs) -> val scores
        self.best: dict | None = None  # the val row of the kept weights
        self.best_state: dict[str, Tensor] | None = None
        self.val_seconds, self.stopped_early, self.paused = 0.0, False, False
        self._rng: dict | None = None  # random states restored from a checkpoint, applied when training starts

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.model.parameters(), lr=self.cfg.lr, betas=tuple(self.cfg.betas))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, self.cfg.warmup)))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_epoch_start(self) -> None:
        pass  # the recipe's StepBatches order the batches by update, across epochs (no set_epoch)

    def on_train_start(self) -> None:
        self.model.train()  # from_pretrained() returns eval mode: without this, dropout would be off in every arm
        if self._rng is not None:  # after the data loader's iterator drew its seed, as in a run that never paused
            torch.set_rng_state(self._rng["torch"])
            random.setstate(self._rng["python"])
            self._rng = None
        if self.plan is not None and self.plan.val_every and not self.history and self.global_step == 0:
            self.validate()  # the initial model: the rule may keep it if no update improves on it

    def on_train_batch_start(self, batch, batch_idx) -> None:
        self._step_t0 = time.perf_counter()

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.step_seconds.append(time.perf_counter() - self._step_t0)  # the update only: validation not counted
        plan, step = self.plan, self.global_step
        if plan is None:
            return
        finished = step >= plan.updates
        validated = False
        if plan.val_every and (step % plan.val_every == 0 or finished):
            self.validate()
            validated = True
            since = [row["step"] for row in self.history].index(self.best["step"]) if self.best else 0
            if plan.patience and len(self.history) - 1 - since >= plan.patience and not finished:
                logger.info("update %d: no better val %s in %d validations: stopping", step, plan.select, plan.patience)
                self.stopped_early = finished = True
        late = plan.deadline is not None and time.time() > plan.deadline
        pause = not finished and ((plan.stop_at is not None and step >= plan.stop_at) or late)
        if plan.checkpoint is not None and (validated or finished or pause):
            self.save_run_checkpoint(plan.checkpoint)
        if self.stopped_early or pause:
            self.paused = pause
            self.trainer.should_stop = True

    @torch.no_grad()
    def validate(self) -> dict:
        """Decode val, score it (``val_score``), keep the weights if their ``select`` score is the best so far."""
        plan = self.plan
        assert plan is not None and self.val_score is not None, "validate() needs a plan and a val_score"
        n = plan.val_limit or len(self.val)
        src, refs = self.val.src_text[:n], self.val.tgt_text[:n]
        t0 = time.perf_counter()
        hyps = translate(self.model, self.sp, src, beams=plan.val_beams, precision=self.precision_name)
        row = {"step": self.global_step, **self.val_score(hyps, refs), "val_loss": self.val_loss()}
        row["seconds"] = time.perf_counter() - t0
        self.val_seconds += row["seconds"]
        self.history.append(row)
        if self.best is None or row[plan.select] > self.best[plan.select]:
            self.best = row
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        if plan.curve is not None:
            curve = {"select": plan.select, "best": self.best, "curve": self.history}
            write_text(plan.curve, json.dumps(curve, indent=1), overwrite=True, allow_docs=True)  # a run's own file
        logger.info(
            "update %d: val BLEU %.2f chrF %.2f BERTScore F %.2f (best %s %.2f at update %d)",
            row["step"],
            row["bleu"],
            row["chrf"],
            row["bertscore_f"],
            plan.select,
            self.best[plan.select],
            self.best["step"],
        )
        return row

    def save_run_checkpoint(self, path: Path) -> None:
        """The Lightning checkpoint (weights, optimizer, schedule, loop state, this run's state), written atomically."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        self.trainer.save_checkpoint(tmp)
        os.replace(tmp, path)

    def run_state(self) -> dict:
        """What a resumed run needs beyond the weights: val history, the kept weights, timings, random states."""
        return {
            "history": self.history,
            "best": self.best,
            "best_state": self.best_state,
            "step_seconds": self.step_seconds,
            "val_seconds": self.val_seconds,
            "stopped_early": self.stopped_early,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        }

    def load_run_state(self, state: dict) -> None:
        self.history, self.best, self.best_state = list(state["history"]), state["best"], state["best_state"]
        self.step_seconds, self.val_seconds = list(state["step_seconds"]), state["val_seconds"]
        self.stopped_early, self._rng = state["stopped_early"], state["rng"]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["stage2_run"] = self.run_state()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "stage2_run" in checkpoint:
            self.load_run_state(checkpoint["stage2_run"])

    def sample(self, batch: dict) -> tuple[Tensor, list[list[str]], Tensor]:
        """``samples`` candidates per source: labels ``[B·k, T]`` (-100 after EOS), texts, sources.

        ``mrt_candidates="epsilon"``: epsilon samples (:func:`rerank.sample_ids`, seeded by the update);
        ``"beam"``: the beam's ``samples``-best list; ``"ancestral"``: as follows.
        The generator samples in eval mode (no dropout), from the full softmax (temperature 1, no top-k).
        ``sampler="loop"`` (default): the encoder runs once over the ``B`` sources, its states are repeated
        for the ``k`` samples, and :func:`sample_sequences` decodes (one uniform number per row and step,
        finished rows leave the batch); ``"generate"``: Hugging Face sampling (``torch.multinomial`` draws
        one random number per vocabulary entry, row and step: on CPU that was most of the sampling time).
        Both sample the same distribution, from different random streams.
        """
        k = self.samples
        self.model.eval()
        steps = int(batch["input_ids"].shape[1] * 1.5) + 10
        if self.mrt_candidates not in MRT_CANDIDATES:
            raise ValueError(f"mrt_candidates must be one of {MRT_CANDIDATES}, got {self.mrt_candidates!r}")
        with torch.no_grad():
            if self.mrt_candidates == "epsilon":
                from rerank import SamplingConfig, sample_ids

                srcs = [[t for t in row if t != PAD] for row in batch["input_ids"].tolist()]
                seed = 1_000_003 * self.row_seed + self.global_step
                got = sample_ids(
                    self.model,
                    srcs,
                    SamplingConfig(num_samples=k, epsilon=self.mrt_epsilon, precision="32", seed=seed, progress=False),
                )
                seqs = [q + [EOS] for qs in got.sequences for q in qs]
                gen = torch.cat((torch.full((len(seqs), 1), BOS), pad(seqs)), dim=1).to(batch["input_ids"].device)
            elif self.mrt_candidates == "beam":
                gen = self.model.generate(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    do_sample=False,
                    num_beams=k,
                    num_return_sequences=k,
                    max_new_tokens=steps,
                )
            elif self.sampler == "generate":
                gen = self.model.generate(
                    input_ids=batch["input_ids"],
                    attention_mask=batch["attention_mask"],
                    do_sample=True,
                    top_k=0,
                    num_beams=1,
                    num_return_sequences=k,
                    max_new_tokens=steps,
                )
            elif self.sampler == "loop":
                encoded = self.model.get_encoder()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
                states = encoded.last_hidden_state.repeat_interleave(k, 0)  # [B·k, S, d], as generate expands them
                gen = sample_sequences(self.model, states, batch["attention_mask"].repeat_interleave(k, 0), steps)
            else:
                raise ValueError(f"sampler must be 'loop' or 'generate', got {self.sampler!r}")
        self.model.train()
        labels = gen[:, 1:].clone()  # drop the decoder start token
        after_eos = (labels == EOS).long().cumsum(1) - (labels == EOS).long() > 0
        labels[after_eos | (labels == PAD)] = -100
        rows = [[t for t in row if t > EOS] for row in labels.clamp_min(0).tolist()]
        texts = self.sp.decode(rows)
        b = batch["input_ids"].shape[0]
        return labels, [texts[i * k : (i + 1) * k] for i in range(b)], batch["input_ids"].repeat_interleave(k, 0)

    def distill_labels(self, batch: dict) -> dict:
        """``mbr-distill``: the batch with the label of a ``distill_share`` of its rows that have an MBR-best
        target replaced by that target (drawn per row from ``(row_seed, update)``)."""
        assert self.mbr is not None, "mbr-distill needs MBR targets (mbr_data)"
        gen = torch.Generator().manual_seed(1_000_003 * self.row_seed + self.global_step + 7)
        draw = torch.rand(batch["input_ids"].shape[0], generator=gen)
        rows, changed = [], 0
        for r, (i, lab) in enumerate(zip(batch["index"].tolist(), batch["labels"].tolist())):
            target = self.mbr.target.get(i)
            if target is not None and float(draw[r]) < self.distill_share:
                rows.append(target)
                changed += 1
            else:
                rows.append([t for t in lab if t != -100])
        self.log("train/distilled_rows", float(changed), batch_size=len(rows))
        return {**batch, "labels": pad(rows, -100).to(batch["labels"].device)}

    def preference_term(self, batch: dict):
        """``mbr-dpo``: the preference loss over the batch's rows with an MBR pair, or None (no such row).

        Chosen and rejected log-probabilities from :func:`bertscore_loss.risk.target_log_probs` (each source
        encoded once), the whole model without dropout (as the stored reference log-probabilities were made),
        gradients kept."""
        from bertscore_loss.risk import target_log_probs

        assert self.mbr is not None and self.preference is not None, "mbr-dpo needs MBR pairs and a PreferenceLoss"
        idx = [r for r, i in enumerate(batch["index"].tolist()) if i in self.mbr.rejected]
        if not idx:
            return None
        keys = [int(batch["index"][r]) for r in idx]
        dev = batch["input_ids"].device
        chosen = [self.mbr.target[i] for i in keys]
        rejected = [self.mbr.rejected[i] for i in keys]
        sources = [batch["input_ids"][r][batch["attention_mask"][r].bool()].tolist() for r in idx]
        with no_dropout(self.model):
            lp = target_log_probs(self.model, sources, chosen + rejected, list(range(len(idx))) * 2)
        ref_c = torch.tensor([self.mbr.ref_chosen[i] for i in keys], device=dev)
        ref_r = torch.tensor([self.mbr.ref_rejected[i] for i in keys], device=dev)
        n_w = torch.tensor([len(c) for c in chosen], device=dev)
        n_l = torch.tensor([len(r) for r in rejected], device=dev)
        m = len(idx)
        return self.preference(lp[:m], lp[m:], ref_c, ref_r, chosen_lengths=n_w, rejected_lengths=n_l)

    def semantic_subset(self, n: int) -> Tensor | None:
        """Sorted indices ``[semantic_rows]`` of the sources that get the semantic term this update, or None
        (all ``n``): a random subset from a generator seeded by ``row_seed`` and the update number."""
        if self.arm == "ce" or self.semantic_rows is None or self.semantic_rows >= n:
            return None
        gen = torch.Generator().manual_seed(1_000_003 * self.row_seed + self.global_step)
        return torch.randperm(n, generator=gen)[: self.semantic_rows].sort().values

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        from bertscore_loss import sequence_log_probs

        n = batch["input_ids"].shape[0]
        if self.arm == "mbr-distill":
            batch = self.distill_labels(batch)
        ce, logits, encoded = ce_pass(self.model, batch, self.cfg.label_smoothing)
        loss = self.ce_weight * ce
        rows = self.semantic_subset(n)
        if rows is not None:  # the semantic term on a subset of the sources (CE above saw them all)
            batch = {key: value[rows] for key, value in batch.items()}
            logits, n = logits[rows], len(rows)
        refs = [self.train_targets[i] for i in batch["index"].tolist()]
        if self.arm == "bertscore":
            labels = batch["labels"]
            words = (labels != -100) & (labels != EOS)
            # the sparse top-k path reads bf16 logits as they are (no [B, T, V] float32 copy); the dense one in fp32
            sem = self.semantic(logits if self.semantic.sparse_inputs(logits) else logits.float(), refs, words)
            loss = loss + self.weight * sem.loss
            self.log("train/bertscore_f", sem.f1.mean(), batch_size=n)
        elif self.arm == "mrt":
            labels, texts, src = self.sample(batch)
            if self.shared_encoder:
                # The CE pass's encoder states (with their gradient) serve the samples' decoder pass.
                states = encoded.last_hidden_state if rows is None else encoded.last_hidden_state[rows]
                with decoder_dropout(self.model, self.log_prob_dropout):
                    lp = sample_log_probs(self.model, states, batch["attention_mask"], labels, texts, self.samples)
            else:
                out = self.model(input_ids=src, attention_mask=src != PAD, labels=labels)
                lp = sequence_log_probs(out.logits, labels).view(n, self.samples)
            risk = self.risk(lp, texts, refs)
            loss = loss + self.weight * risk.loss
            self.log("train/risk", risk.loss, batch_size=n)
        elif self.arm == "mbr-dpo":
            pref = self.preference_term(batch)
            if pref is not None:
                loss = loss + self.weight * pref.loss
                self.log("train/dpo", pref.dpo, batch_size=n)
                self.log("train/reward_accuracy", pref.reward_accuracy, batch_size=n)
                self.log("train/margin", pref.margins.mean(), batch_size=n)
        self.log("train/ce", ce, prog_bar=True, batch_size=n)
        self.log("train/loss", loss, batch_size=n)
        return loss
