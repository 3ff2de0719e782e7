"""Hugging Face ``generate`` integration: n sequences per input (``model.generate`` or :func:`rerank.sample_ids`),
their scores, decoding and reranking."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .mbr import Method
from .reranker import Expectation, Measure, NBestReranker, RerankResult
from .sampling import SamplingConfig, model_positions, sample_ids
from .training_data import codec_from

logger = logging.getLogger(__name__)


@dataclass
class GenerateRerankOutput:
    """Result of :func:`generate_and_rerank`, one entry per input.

    ``texts``: the chosen candidate per input; ``candidates``: the ``n`` decoded sequences in
    generation order; ``model_scores``: their length-normalised log-probabilities (aligned with
    ``candidates``); ``results``: the full :class:`RerankResult` per input.
    """

    texts: list[str]
    candidates: list[list[str]]
    model_scores: list[list[float]]
    results: list[RerankResult]


def _eos_ids(model: Any, generate_kwargs: Mapping[str, Any]) -> list[int]:
    eos = generate_kwargs.get("eos_token_id")
    if eos is None:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]


def sequence_scores(model: Any, out: Any, eos_token_ids: Sequence[int]) -> Tensor:
    """Length-normalised log-probability ``[B·n]`` (float32, CPU) of each generated sequence of ``out``.

    ``out``: the ``return_dict_in_generate=True, output_scores=True`` result of ``model.generate``.
    Beam search: its ``sequences_scores`` (sum of log-probabilities / length ** ``length_penalty``;
    with the default ``length_penalty=1.0`` the mean per generated token). Sampling or greedy search:
    the mean log-probability of the generated tokens up to and including the first EOS, from the raw
    logits (``output_logits=True``; else from the processed scores) via ``compute_transition_scores``.
    """
    if getattr(out, "sequences_scores", None) is not None:
        return out.sequences_scores.detach().float().cpu()
    steps = getattr(out, "logits", None) or out.scores
    if not steps:
        raise ValueError("generate returned no per-step scores: call it with output_scores=True")
    logp = model.compute_transition_scores(out.sequences, steps, normalize_logits=True).float()  # [B·n, T]
    gen = out.sequences[:, -len(steps) :]
    if eos_token_ids:
        is_eos = torch.isin(gen, torch.tensor(list(eos_token_ids), device=gen.device))
        valid = (torch.cumsum(is_eos.long(), dim=1) - is_eos.long()) == 0  # up to and including the first EOS
    else:
        valid = torch.ones_like(gen, dtype=torch.bool)
    total = torch.where(valid, logp, torch.zeros_like(logp)).sum(dim=1)
    return (total / valid.sum(dim=1).clamp_min(1)).detach().cpu()


def generate_and_rerank(
    model: Any,
    tokenizer: Any,
    inputs: str | Sequence[str] | Mapping[str, Tensor],
    reranker: NBestReranker,
    *,
    num_return_sequences: int | None = None,
    references: Sequence[str] | Sequence[Sequence[str]] | None = None,
    mbr: bool | None = None,
    weight: float | None = None,
    measure: Measure | None = None,
    include_self: bool | None = None,
    expectation: Expectation | None = None,
    temperature: float | None = None,
    max_input_length: int | None = None,
    sampling: SamplingConfig | None = None,
    method: Method | str | None = None,
    **generate_kwargs: Any,
) -> GenerateRerankOutput:
    """Generate ``num_return_sequences`` candidates per input (default 4) with ``model.generate``, decode and
    rerank them.

    ``model``: a seq2seq (``config.is_encoder_decoder``) or causal LM; ``inputs``: text(s), tokenised
    here (left padding for causal LMs), or a mapping with ``input_ids`` ``[B, L]`` (and
    ``attention_mask``). Beam search (``num_beams=n``) or sampling (``do_sample=True``) is chosen by
    ``generate_kwargs``, passed on to ``generate``. Candidates are decoded with
    ``skip_special_tokens=True`` (the prompt stripped for causal LMs) and reranked by ``reranker``
    against ``references`` (one per input) or by MBR among themselves (``mbr``: None = MBR exactly
    when no references are given). ``weight``, ``measure``, ``include_self``, ``expectation`` and
    ``temperature`` are passed to :meth:`NBestReranker.rerank` with the model scores of
    :func:`sequence_scores`; ``method`` (MBR: ``"exact"``, ``"aggregate"`` …) too.

    ``sampling``: draw the candidates with :func:`rerank.sample_ids` instead (encoder-decoder models: the
    source encoded once per batch, finished samples leave the batch, token-budgeted batches, bf16 where
    native); ``sampling.num_samples`` candidates per input, scored the same way. ``generate_kwargs`` do
    not apply then.
    """
    if sampling is not None:
        if generate_kwargs:
            raise ValueError(
                f"sampling= draws with rerank.sample_ids: generate kwargs {sorted(generate_kwargs)} do not apply"
            )
        if num_return_sequences is not None and num_return_sequences != sampling.num_samples:
            raise ValueError(
                f"num_return_sequences={num_return_sequences} but sampling.num_samples={sampling.num_samples}: give one"
            )
        num_return_sequences = sampling.num_samples
        if not getattr(model.config, "is_encoder_decoder", False):
            raise ValueError("sampling= needs an encoder-decoder model; sample a causal LM with do_sample=True instead")
    if num_return_sequences is None:
        num_return_sequences = 4
    if num_return_sequences < 1:
        raise ValueError(f"num_return_sequences must be at least 1, got {num_return_sequences}")
    if mbr is None:
        mbr = references is None
    if mbr and references is not None:
        raise ValueError("mbr=True reranks the candidates among themselves: do not pass references=")
    if not mbr and references is None:
        raise ValueError("mbr=False reranks against references: pass references= (one per input)")
    for key in ("num_return_sequences", "return_dict_in_generate", "output_scores"):
        if key in generate_kwargs:
            raise ValueError(f"{key} is set by generate_and_rerank; do not pass it")

    is_seq2seq = bool(getattr(model.config, "is_encoder_decoder", False))
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        eos = _eos_ids(model, generate_kwargs)
        if not eos:
            raise ValueError("the tokenizer has no pad token and the model no EOS token to pad with")
        pad_id = eos[0]
    if isinstance(inputs, str):
        inputs = [inputs]
    if isinstance(inputs, Mapping):
        if "input_ids" not in inputs:
            raise ValueError("inputs as a mapping must hold input_ids")
        batch = {k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")}
    else:
        texts = list(inputs)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise TypeError("inputs must be a str, a non-empty list of str, or a mapping with input_ids")
        side, pad_token = tokenizer.padding_side, tokenizer.pad_token
        try:
            tokenizer.padding_side = "right" if is_seq2seq else "left"
            if pad_token is None:
                tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
            encoded = tokenizer(
                texts,
                return_tensors="pt",
                padding=True,
                truncation=max_input_length is not None,
                max_length=max_input_length,
            )
            batch = {k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded}
        finally:
            tokenizer.padding_side = side
            if pad_token is None:
                tokenizer.pad_token = pad_token
    device = next(model.parameters()).device
    batch = {k: v.to(device) for k, v in batch.items()}
    n_inputs = int(batch["input_ids"].shape[0])
    if references is not None and len(references) != n_inputs:
        raise ValueError(f"got {n_inputs} inputs but {len(references)} references: the lengths must match")

    n = num_return_sequences
    if sampling is not None:
        ids = batch["input_ids"].cpu()
        keep = batch.get("attention_mask", torch.ones_like(batch["input_ids"])).cpu().bool()
        drawn = sample_ids(model, [row[m].tolist() for row, m in zip(ids, keep)], sampling)
        decoded = [
            t.strip()
            for t in tokenizer.batch_decode([q for qs in drawn.sequences for q in qs], skip_special_tokens=True)
        ]
        scores = torch.tensor([x for xs in drawn.scores for x in xs])
    else:
        generate_kwargs.setdefault("pad_token_id", pad_id)
        generate_kwargs.setdefault("output_logits", True)
        with torch.no_grad():
            out = model.generate(
                **batch,
                num_return_sequences=num_return_sequences,
                return_dict_in_generate=True,
                output_scores=True,
                **generate_kwargs,
            )
        scores = sequence_scores(model, out, _eos_ids(model, generate_kwargs))
        prompt_len = 0 if is_seq2seq else int(batch["input_ids"].shape[1])
        decoded = [t.strip() for t in tokenizer.batch_decode(out.sequences[:, prompt_len:], skip_special_tokens=True)]
    if len(decoded) != n_inputs * n:
        raise ValueError(f"generate returned {len(decoded)} sequences for {n_inputs} inputs x {n}")
    candidates = [decoded[i * n : (i + 1) * n] for i in range(n_inputs)]
    model_scores = [scores[i * n : (i + 1) * n].tolist() for i in range(n_inputs)]
    logger.info("generated %d x %d candidates; reranking (%s)", n_inputs, n, "MBR" if mbr else "references")
    results = reranker.rerank(
        candidates,
        None if mbr else references,
        model_scores=model_scores,
        weight=weight,
        measure=measure,
        include_self=include_self,
        expectation=expectation,
        temperature=temperature,
        method=method,
    )
    return GenerateRerankOutput([r.best for r in results], candidates, model_scores, results)


@torch.no_grad()
def beam_translate(
    model: Any, tokenizer: Any, sources: Sequence[str], num_beams: int = 5, batch_size: int = 32
) -> list[str]:
    """Beam-search translations of ``sources`` by an encoder-decoder ``model`` (eval mode, no gradients; its mode
    restored after), ``batch_size`` sources a ``generate`` call, in input order.

    ``tokenizer``: as :func:`rerank.training_data.codec_from` takes it (an HF tokenizer, a sentencepiece processor
    or a codec): sources are encoded, and outputs decoded (special tokens dropped), by its codec. At most
    ``2 × source tokens + 10`` new tokens per batch, within the model's positions.
    """
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("beam_translate needs an encoder-decoder model")
    if num_beams < 1 or batch_size < 1:
        raise ValueError(f"num_beams and batch_size must be >= 1, got {num_beams} and {batch_size}")
    codec = codec_from(tokenizer, model)
    pad, limit = int(model.config.pad_token_id), model_positions(model)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[str] = []
    try:
        for start in range(0, len(sources), batch_size):
            ids = [list(codec.encode(text)) for text in sources[start : start + batch_size]]
            width = max(map(len, ids))
            src = torch.tensor([row + [pad] * (width - len(row)) for row in ids], device=device)
            mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in ids], device=device)
            new = 2 * width + 10 if limit is None else min(2 * width + 10, limit - 1)
            gen = model.generate(input_ids=src, attention_mask=mask, num_beams=num_beams, max_new_tokens=new)
            out += [codec.decode(row[1:].tolist()) for row in gen]  # after the decoder start token
    finally:
        model.train(was_training)
    return out
