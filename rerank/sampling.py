"""Many samples per source from an encoder-decoder model, at the speed of the model.

:func:`sample_ids` draws ``num_samples`` sequences per source with ancestral sampling (temperature,
top-k, top-p and epsilon truncation, applied in Hugging Face's order), in token-budgeted batches of
``(source, sample)`` rows:

* each batch runs the encoder once per source and repeats its output for the source's rows;
* rows that produced EOS leave the batch (their key/value cache rows are dropped), so the decoder
  never runs for finished samples;
* a token is drawn by inverting the cumulative distribution (one uniform number per row) instead of
  ``torch.multinomial``, and the sequence score (mean log-probability of the generated tokens up to
  and including EOS, from the raw logits, as :func:`rerank.sequence_scores`) is accumulated on the
  way, so no per-step logits are stored;
* ``precision="auto"`` runs the model under bfloat16 autocast where the hardware has native bf16 (a CPU
  with ``avx512_bf16`` or ``amx_bf16`` in ``/proc/cpuinfo``, a CUDA device that supports it), else float32.

Shapes: ``R`` rows of a batch (sources × their samples), ``V`` vocabulary, ``L`` source tokens.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bertscore_loss import machine

__all__ = ["Samples", "SamplingConfig", "filter_logits", "native_bf16", "sample_ids"]

logger = logging.getLogger(__name__)

# generation_config settings that add logits processors this sampler does not apply: refuse them
_UNSUPPORTED = {
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "exponential_decay_length_penalty": None,
    "guidance_scale": None,
    "watermarking_config": None,
}


def native_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether ``device`` computes bfloat16 natively: a CPU with ``avx512_bf16`` or ``amx_bf16`` in
    ``/proc/cpuinfo`` (never assumed elsewhere), or a CUDA device where ``torch.cuda.is_bf16_supported()``
    (:func:`bertscore_loss.machine.native_bf16`)."""
    return machine.native_bf16(device)


@dataclass(frozen=True)
class SamplingConfig:
    """Settings of :func:`sample_ids`.

    ``num_samples`` per source; ``temperature``, ``top_k`` (0 = off), ``top_p`` (1 = off) and
    ``epsilon`` (0 = off; epsilon sampling, Hewitt et al. 2022, e.g. 0.02 for MBR) as Hugging Face's
    warpers, applied in that order; the most likely token always stays. ``max_new_tokens``: None =
    ``1.5 × source length + 10`` per batch. ``token_budget``: rows × (source length + new tokens) per
    batch. ``precision``: ``"auto"`` (bf16 autocast where native, see :func:`native_bf16`), ``"32"`` or
    ``"bf16"``. ``seed``: of a private generator (None: torch's global one). ``progress``: a bar over
    sources on stderr (None: on a terminal, for 10,000 samples or more).
    """

    num_samples: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    epsilon: float = 0.0
    max_new_tokens: int | None = None
    token_budget: int = 65536
    precision: Literal["auto", "32", "bf16"] = "auto"
    seed: int | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        for name in ("num_samples", "token_budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.max_new_tokens is not None and (
            isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be a positive int or None, got {self.max_new_tokens!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not 0.0 <= self.epsilon < 1.0:
            raise ValueError(f"epsilon must lie in [0, 1), got {self.epsilon!r}")
        if self.precision not in ("auto", "32", "bf16"):
            raise ValueError(f"precision must be 'auto', '32' or 'bf16', got {self.precision!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")


@dataclass
class Samples:
    """What :func:`sample_ids` drew: per source ``num_samples`` token-id lists (generated tokens, without
    EOS or padding) and their scores (mean log-probability per generated token, EOS included), plus the
    wall time and the precision used."""

    sequences: list[list[list[int]]]
    scores: list[list[float]]
    seconds: float
    precision: str


def filter_logits(logits: Tensor, config: SamplingConfig) -> Tensor:
    """Unnormalised probabilities ``[R, V]`` (float32) of the truncated sampling distribution of ``logits``.

    Temperature, then top-k (keep the k largest), top-p (drop the smallest tokens whose cumulative
    probability is at most ``1 - top_p``) and epsilon (drop tokens with probability below ``epsilon``),
    each as the Hugging Face warper of that name with ``min_tokens_to_keep=1``.
    """
    x = logits.float()
    if config.temperature != 1.0:
        x = x / config.temperature
    if config.top_k:
        kth = torch.topk(x, min(config.top_k, x.shape[-1])).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=False)
        cumulative = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - config.top_p)
        drop[..., -1:] = False
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if config.epsilon > 0:
        top = x.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill((probs < config.epsilon) & (x < top), 0.0)
    return probs


def _epsilon_probs(logits: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """Fast path of :func:`filter_logits` at temperature 1 without top-k/top-p: the unnormalised epsilon-truncated
    probabilities ``[R, V]`` and ``logsumexp(logits)`` ``[R]`` from one exponential pass."""
    top = logits.max(dim=-1, keepdim=True).values
    p = torch.exp(logits - top)
    z = p.sum(dim=-1, keepdim=True)
    if epsilon > 0:
        p = torch.where((p < epsilon * z) & (logits < top), 0.0, p)
    return p, (top + torch.log(z)).squeeze(-1)


def _draw(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token ``[R]`` per row of unnormalised probabilities ``[R, V]`` by inverting the cumulative sums."""
    total = probs.cumsum(dim=-1)
    u = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device) * total[:, -1:]
    token = torch.searchsorted(total, u, right=True).clamp_max(probs.shape[-1] - 1).squeeze(1)
    bad = probs.gather(1, token.unsqueeze(1)).squeeze(1) <= 0  # only by rounding at the very end
    if bool(bad.any()):
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).int().argmax(-1)
        token = torch.where(bad, last, token)
    return token


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]


def _setting(model: Any, name: str) -> Any:
    value = getattr(getattr(model, "generation_config", None), name, None)
    return value if value is not None else getattr(model.config, name, None)


def _cache_name(model: Any) -> str:
    """The forward argument (and output field) of the key/value cache: ``cache`` (transformers >= 5.x) or
    ``past_key_values``."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _select(cache_: Any, keep: Tensor) -> Any:
    """The key/value cache with only the batch rows ``keep``."""
    if hasattr(cache_, "batch_select_indices"):
        cache_.batch_select_indices(keep)
        return cache_
    if hasattr(cache_, "reorder_cache"):
        cache_.reorder_cache(keep)
        return cache_
    return tuple(tuple(t.index_select(0, keep) for t in layer) for layer in cache_)  # legacy tuples


@torch.no_grad()
def sample_ids(model: Any, sources: Sequence[Sequence[int]], config: SamplingConfig | None = None) -> Samples:
    """``config.num_samples`` samples for each source (token ids, EOS included or not) from a Hugging Face
    encoder-decoder ``model`` (``config.is_encoder_decoder``); see the module docstring.

    The model's ``generation_config`` gives EOS, padding, the decoder start token, ``forced_bos_token_id``,
    ``forced_eos_token_id`` (forced at the last step), ``min_new_tokens``/``min_length`` (EOS suppressed
    before) and single-token ``bad_words_ids`` (never drawn); settings that need other logits processors
    (repetition penalties, n-gram blocking, suppress lists …) are refused. Its sampling settings (top-k …)
    are not used: ``config`` holds them.
    """
    config = config or SamplingConfig()
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError(
            "sample_ids needs an encoder-decoder model (config.is_encoder_decoder); use generate for others"
        )
    gen_cfg = getattr(model, "generation_config", None)
    bad = [
        f"{k}={getattr(gen_cfg, k)!r}"
        for k, default in _UNSUPPORTED.items()
        if gen_cfg is not None and getattr(gen_cfg, k, default) not in (default, None, [], 0)
    ]
    if bad:
        raise ValueError(f"the model's generation_config sets {', '.join(bad)}, which sample_ids does not apply")
    eos = _ids(_setting(model, "eos_token_id"))
    pad_ids = _ids(_setting(model, "pad_token_id")) or eos[:1]
    start_ids = _ids(_setting(model, "decoder_start_token_id")) or _ids(_setting(model, "bos_token_id"))
    if not eos or not pad_ids or not start_ids:
        raise ValueError("the model needs eos_token_id, pad_token_id (or EOS) and decoder_start_token_id")
    pad, start = pad_ids[0], start_ids[0]
    banned = []
    for words in getattr(gen_cfg, "bad_words_ids", None) or []:
        if len(words) != 1:
            raise ValueError(f"bad_words_ids entry {words!r}: sample_ids only bans single tokens")
        banned.append(int(words[0]))
    forced_bos = _setting(model, "forced_bos_token_id")
    forced_eos = _ids(_setting(model, "forced_eos_token_id"))
    min_new = int(getattr(gen_cfg, "min_new_tokens", None) or max(0, int(getattr(gen_cfg, "min_length", 0) or 0) - 1))
    vocab = int(getattr(model.config, "vocab_size", 0) or 0)
    limit = model_positions(model)
    if limit is not None and config.max_new_tokens is not None and config.max_new_tokens > limit - 1:
        raise ValueError(
            f"max_new_tokens={config.max_new_tokens} is past the model's {limit} positions "
            f"(at most {limit - 1} new tokens after the start token)"
        )
    srcs = []
    for i, s in enumerate(sources):
        try:
            ids = [int(t) for t in s]
        except (TypeError, ValueError) as exc:
            raise TypeError(f"sources[{i}] must be a sequence of int token ids") from exc
        if not ids:
            raise ValueError(f"sources[{i}] is empty: give at least one token (e.g. EOS)")
        bad_ids = [t for t in ids if t < 0 or (vocab and t >= vocab)]
        if bad_ids:
            raise ValueError(f"sources[{i}] holds token id {bad_ids[0]}, outside the model's vocabulary [0, {vocab})")
        if limit is not None and len(ids) > limit:
            raise ValueError(f"sources[{i}] has {len(ids)} tokens, over the model's {limit} positions: shorten it")
        srcs.append(ids)
    device = next(model.parameters()).device
    bf16 = config.precision == "bf16" or (config.precision == "auto" and native_bf16(device))
    precision = "bf16" if bf16 else "32"
    generator = None if config.seed is None else torch.Generator(device=device).manual_seed(config.seed)
    was_training = model.training
    model.eval()
    n = config.num_samples
    sequences: list[list[list[int]]] = [[] for _ in srcs]
    scores: list[list[float]] = [[] for _ in srcs]
    eos_t = torch.tensor(eos, device=device)
    # progress None: a bar for 10,000 samples or more, when stderr is a terminal (tqdm's disable=None)
    disable = (not config.progress) if config.progress is not None else (None if len(srcs) * n >= 10**4 else True)
    bar = tqdm(total=len(srcs), desc=f"sampling {n} per source", unit="source", disable=disable, leave=False)
    t0 = time.perf_counter()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            for batch in _batches([len(s) for s in srcs], n, config, limit):
                rows = _decode_batch(
                    model,
                    srcs,
                    batch,
                    config,
                    pad,
                    start,
                    eos_t,
                    banned,
                    forced_bos,
                    forced_eos,
                    min_new,
                    generator,
                    limit,
                )
                for owner, seq, score in rows:
                    sequences[owner].append(seq)
                    scores[owner].append(score)
                bar.update(sum(1 for owner, _ in batch if len(sequences[owner]) == n))  # sources completed
    finally:
        bar.close()
        model.train(was_training)
    seconds = time.perf_counter() - t0
    logger.info("sampled %d x %d sequences in %.2f s (%s)", len(srcs), n, seconds, precision)
    return Samples(sequences, scores, seconds, precision)


def model_positions(model: Any) -> int | None:
    """The model's maximum positions (``config.max_position_embeddings``), None when it has no such limit."""
    value = getattr(model.config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def default_new_tokens(length: int, limit: int | None = None) -> int:
    """The default new-token limit for a source of ``length`` tokens: ``1.5 × length + 10``, capped by the
    decoder's ``limit`` positions (the start token takes one)."""
    want = int(length * 1.5) + 10
    return max(1, min(want, limit - 1)) if limit else want


def _max_new(length: int, config: SamplingConfig, limit: int | None = None) -> int:
    return config.max_new_tokens if config.max_new_tokens is not None else default_new_tokens(length, limit)


def _batches(
    lengths: list[int], n: int, config: SamplingConfig, limit: int | None = None
) -> list[list[tuple[int, int]]]:
    """Batches of ``(source, samples)``, sources longest first, each within ``token_budget`` row tokens."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[tuple[int, int]]] = []
    cur: list[tuple[int, int]] = []
    rows = 0
    for s in order:
        need = n
        while need:
            longest = lengths[cur[0][0]] if cur else lengths[s]  # the first source of a batch is its longest
            cap = max(1, config.token_budget // (longest + _max_new(longest, config, limit)))
            take = min(need, cap - rows)
            if take <= 0:
                batches.append(cur)
                cur, rows = [], 0
                continue
            cur.append((s, take))
            rows += take
            need -= take
    if cur:
        batches.append(cur)
    return batches


def _decode_batch(
    model: Any,
    srcs: list[list[int]],
    batch: list[tuple[int, int]],
    config: SamplingConfig,
    pad: int,
    start: int,
    eos: Tensor,
    banned: list[int],
    forced_bos: int | None,
    forced_eos: list[int],
    min_new: int,
    generator: torch.Generator | None,
    limit: int | None = None,
) -> list[tuple[int, list[int], float]]:
    """Samples of one batch: ``(source, token ids, score)`` per row, in the batch's row order."""
    device = eos.device
    distinct = list(dict.fromkeys(s for s, _ in batch))
    longest = max(len(srcs[s]) for s in distinct)
    src = torch.full((len(distinct), longest), pad, dtype=torch.long)
    for k, s in enumerate(distinct):
        src[k, : len(srcs[s])] = torch.tensor(srcs[s])
    src = src.to(device)
    mask = torch.arange(longest, device=device).unsqueeze(0) < torch.tensor(
        [len(srcs[s]) for s in distinct], device=device
    ).unsqueeze(1)
    encoder_out = model.get_encoder()(input_ids=src, attention_mask=mask.long(), return_dict=True)
    where = {s: k for k, s in enumerate(distinct)}
    row_src = torch.tensor([where[s] for s, c in batch for _ in range(c)], device=device)
    owner = [s for s, c in batch for _ in range(c)]
    hidden = encoder_out.last_hidden_state.index_select(0, row_src)
    attn = mask.long().index_select(0, row_src)
    total = len(owner)
    max_new = _max_new(longest, config, limit)
    alive = torch.arange(total, device=device)  # batch rows → original rows
    tokens = torch.full((total, 1), start, dtype=torch.long, device=device)
    out = torch.full((total, max_new), -1, dtype=torch.long)
    logp_sum = torch.zeros(total, dtype=torch.float64)
    count = torch.zeros(total, dtype=torch.long)
    finished = torch.zeros(total, dtype=torch.bool, device=device)  # rows of the current batch that ended
    cache_ = None
    from transformers.modeling_outputs import BaseModelOutput

    name = _cache_name(model)
    for step in range(max_new):
        o = model(
            encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
            attention_mask=attn,
            decoder_input_ids=tokens,
            use_cache=True,
            return_dict=True,
            **{name: cache_},
        )
        cache_ = getattr(o, name)
        logits = o.logits[:, -1, :].float()  # [R, V], raw
        fast = config.temperature == 1.0 and not config.top_k and config.top_p == 1.0
        probs, lse = _epsilon_probs(logits, config.epsilon) if fast else (None, torch.logsumexp(logits, dim=-1))
        proc = logits
        if banned or (min_new and step < min_new) or (step == 0 and forced_bos is not None):
            proc = proc.clone()
            if banned:
                proc[:, banned] = float("-inf")
            if min_new and step < min_new:
                proc[:, eos] = float("-inf")
            probs = None  # the restricted distribution differs from the fast path's
        if step == 0 and forced_bos is not None:
            token = torch.full((len(alive),), int(forced_bos), dtype=torch.long, device=device)
        elif step == max_new - 1 and forced_eos:
            token = torch.full((len(alive),), forced_eos[0], dtype=torch.long, device=device)
        else:
            token = _draw(probs if probs is not None else filter_logits(proc, config), generator)
        token = torch.where(finished, torch.full_like(token, pad), token)
        lp = (logits.gather(1, token.unsqueeze(1)).squeeze(1) - lse).double().cpu()
        live = (~finished).cpu()
        rows_cpu = alive.cpu()
        out[rows_cpu[live], step] = token.cpu()[live]
        logp_sum[rows_cpu[live]] += lp[live]
        count[rows_cpu[live]] += 1
        finished = finished | torch.isin(token, eos)
        if bool(finished.all()):
            break
        n_done = int(finished.sum())
        if n_done and n_done * 4 >= len(alive):  # drop finished rows once they are a quarter of the batch
            keep = torch.nonzero(~finished).squeeze(1)
            cache_ = _select(cache_, keep)
            hidden, attn, alive, finished = hidden[keep], attn[keep], alive[keep], finished[keep]
            token = token[keep]
        tokens = token.unsqueeze(1)
    eos_set = set(eos.tolist())
    result = []
    for r in range(total):
        seq = [int(t) for t in out[r].tolist() if t >= 0]
        if seq and seq[-1] in eos_set:
            seq = seq[:-1]
        result.append((owner[r], seq, float(logp_sum[r] / max(1, int(count[r])))))
    return result
