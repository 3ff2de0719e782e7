"""Preference pairs and distillation targets read from a folder built by :func:`rerank.build_mbr_data`.

Each source of the folder becomes one :class:`MBRExample`: its source ids, its MBR-best target (the
distillation target) and its preference pairs. Pairs come from the stored ``chosen``/``rejected``
(``pairing="stored"``) or are drawn again from the stored candidate lists by any pairing of
:func:`rerank.training_data.pair_rows`; ``pairs_per_source`` > 1 adds, after the first pair, the
lowest-ranked distinct candidates not yet used (worst first), each against the same chosen side.
:func:`select_pairs` keeps the pairs of a length selection (``"all"``, ``"not-shorter"``, ``"balanced"``).

Every text is tokenised once, by the rule that wrote the stored reference log-probabilities
(:class:`rerank.training_data.Codec`: ``encode`` for sources, ``encode_target`` for targets, EOS
included): a DPO ratio over ids of another tokenisation would compare different sequences. A rejected side
that the builder did not store a log-probability for (another pairing, or pairs after the first) gets it from
:func:`fill_reference_log_probs`: the model that training starts from, in eval mode, without gradients, once
before training, so no second model is held in memory.
"""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from tqdm.auto import tqdm

from bertscore_loss.risk import target_log_probs

from .sampling import model_positions
from .training_data import PAIRINGS, Codec, _source_ids, _target_ids, codec_from, pair_rows, read_mbr_data

__all__ = [
    "MBRExample",
    "check_reference_model",
    "PAIR_SELECTIONS",
    "PreferencePair",
    "fill_reference_log_probs",
    "read_mbr_examples",
    "select_pairs",
]

logger = logging.getLogger(__name__)

PairSelection = Literal["all", "balanced", "not-shorter"]
PAIR_SELECTIONS: tuple[str, ...] = ("all", "balanced", "not-shorter")
READ_PAIRINGS: tuple[str, ...] = ("stored", *PAIRINGS)


@dataclass(frozen=True)
class PreferencePair:
    """One pair of a source: texts, label ids (EOS included) and the reference model's sequence
    log-probabilities (None until :func:`fill_reference_log_probs` computes a missing one)."""

    chosen: str
    rejected: str
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]
    ref_chosen_logp: float | None
    ref_rejected_logp: float | None


@dataclass(frozen=True)
class MBRExample:
    """One source: ``index`` in the corpus, ``prompt`` and its ids, the MBR-best ``target`` and its label ids,
    its ``pairs`` (possibly none), and a ``reference`` translation and its label ids when one was given."""

    index: int
    prompt: str
    prompt_ids: tuple[int, ...]
    target: str
    target_ids: tuple[int, ...]
    pairs: tuple[PreferencePair, ...]
    reference: str | None = None
    reference_ids: tuple[int, ...] | None = None


def _rejected_texts(row: dict, pairing: str, k: int) -> list[str]:
    """Up to ``k`` distinct rejected texts of ``row``: the first by ``pairing``, then the lowest-ranked others."""
    cands, expected = row.get("candidates"), row.get("expected")
    if pairing == "stored":
        first = [row["rejected"]] if row.get("rejected") is not None else []
        if k == 1 or not first:
            return first
    if cands is None or expected is None:
        raise ValueError(
            f"row {row['index']} stores no candidate lists (built with store_lists=False): pairing={pairing!r} "
            "and pairs_per_source > 1 need them; use pairing='stored' with pairs_per_source=1"
        )
    beam = len(cands) - 1 if row.get("beam") is not None else None
    if pairing != "stored":
        best, worse = pair_rows(cands, expected, beam, pairing)
        if cands[best] != row["chosen"]:
            raise ValueError(f"row {row['index']}: its candidate lists do not rank its chosen text first")
        first = [] if worse is None else [cands[worse]]
        if not first:
            return []
    order = sorted(range(len(cands)), key=lambda i: (float(expected[i]), -i))  # worst first
    out = list(first)
    for i in order:
        if len(out) >= k:
            break
        if cands[i] != row["chosen"] and cands[i] not in out:
            out.append(cands[i])
    return out


def read_mbr_examples(
    folder: str | Path,
    tokenizer: Any,
    model: Any = None,
    *,
    pairing: str = "stored",
    pairs_per_source: int = 1,
    selection: PairSelection = "all",
    seed: int = 0,
    references: Sequence[str] | None = None,
) -> list[MBRExample]:
    """The examples of a built folder, in corpus order (see the module docstring).

    ``tokenizer``: as :func:`rerank.training_data.codec_from` takes it (with ``model`` for a sentencepiece
    processor), the one the folder was built with; ``model`` also bounds the sources as the builder did
    (cut to the model's positions, EOS kept). ``pairing``: ``"stored"`` or a pairing of
    :class:`rerank.training_data.MBRDataConfig`; ``selection``, ``seed``: see :func:`select_pairs`;
    ``references``: one reference translation per source of the corpus (by index): the targets of the
    trainer's reference NLL and minimum-risk terms.
    """
    if pairing not in READ_PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(READ_PAIRINGS)}, got {pairing!r}")
    if isinstance(pairs_per_source, bool) or not isinstance(pairs_per_source, int) or pairs_per_source < 1:
        raise ValueError(f"pairs_per_source must be a positive int, got {pairs_per_source!r}")
    if not (Path(folder) / "manifest.json").is_file():
        raise FileNotFoundError(f"{folder} holds no manifest.json: not a folder built by rerank.build_mbr_data")
    rows = read_mbr_data(folder)
    codec: Codec = codec_from(tokenizer, model)
    limit = model_positions(model) if model is not None else None
    examples = []
    for row in rows:
        index = int(row["index"])
        if references is not None and not 0 <= index < len(references):
            raise ValueError(f"references hold {len(references)} texts, but the folder has source index {index}")
        ids = _source_ids(codec, [row["prompt"]], limit, "truncate", index)[0][0]
        stored = {row["chosen"]: row.get("chosen_logp")}
        if row.get("rejected") is not None:
            stored[row["rejected"]] = row.get("rejected_logp")
        chosen_ids = tuple(_target_ids(codec, row["chosen"]))
        pairs = tuple(
            PreferencePair(
                row["chosen"],
                text,
                chosen_ids,
                tuple(_target_ids(codec, text)),
                stored.get(row["chosen"]),
                stored.get(text),
            )
            for text in _rejected_texts(row, pairing, pairs_per_source)
        )
        target = row.get("target") or row["chosen"]
        examples.append(
            MBRExample(
                index=index,
                prompt=row["prompt"],
                prompt_ids=tuple(ids),
                target=target,
                target_ids=chosen_ids if target == row["chosen"] else tuple(_target_ids(codec, target)),
                pairs=pairs,
                reference=None if references is None else references[index],
                reference_ids=None if references is None else tuple(_target_ids(codec, references[index])),
            )
        )
    return select_pairs(examples, selection, seed=seed)


def select_pairs(examples: Sequence[MBRExample], selection: PairSelection, *, seed: int = 0) -> list[MBRExample]:
    """The examples with the pairs of ``selection``, by the token counts of the two sides: ``"all"``;
    ``"not-shorter"``: the pairs whose chosen side is at least as long as the rejected one (a preference that
    never rewards a shorter output); ``"balanced"``: the pairs of equal length, every pair of the rarer
    direction (chosen shorter, or chosen longer) and as many of the other (a fixed random subset drawn with
    ``seed``), so that the kept pairs carry no net preference for either length. Examples keep their targets."""
    if selection not in PAIR_SELECTIONS:
        raise ValueError(f"pair selection must be one of {', '.join(PAIR_SELECTIONS)}, got {selection!r}")
    keys = [(e, j) for e in range(len(examples)) for j in range(len(examples[e].pairs))]  # corpus order
    diff = {k: len(examples[k[0]].pairs[k[1]].chosen_ids) - len(examples[k[0]].pairs[k[1]].rejected_ids) for k in keys}
    keep = {k for k, d in diff.items() if d >= 0 or selection == "all"}
    if selection == "balanced":
        shorter = [k for k in keys if diff[k] < 0]
        longer = [k for k in keys if diff[k] > 0]
        if len(shorter) >= len(longer):  # a subset of the shorter-chosen pairs
            keep |= set(random.Random(seed).sample(shorter, len(longer)))
        else:  # a subset of the longer-chosen pairs
            keep = {k for k in keys if diff[k] == 0} | set(shorter)
            keep |= set(random.Random(seed).sample(longer, len(shorter)))
    return [
        dataclasses.replace(e, pairs=tuple(p for j, p in enumerate(e.pairs) if (i, j) in keep))
        for i, e in enumerate(examples)
    ]


@torch.no_grad()
def fill_reference_log_probs(
    model: Any, examples: Sequence[MBRExample], *, token_budget: int = 8192, progress: bool | None = None
) -> list[MBRExample]:
    """The examples with every missing reference log-probability computed by ``model`` (the reference: the
    weights training starts from), in eval mode (its mode is restored after), float32, without gradients."""
    todo = [
        (e, j, side)
        for e, ex in enumerate(examples)
        for j, p in enumerate(ex.pairs)
        for side in ("chosen", "rejected")
        if getattr(p, f"ref_{side}_logp") is None
    ]
    if not todo:
        return list(examples)
    logger.info("computing %d reference log-probabilities the folder does not store", len(todo))
    found: dict[tuple[int, int, str], float] = {}
    was_training = model.training
    model.eval()
    try:
        step = 256
        for s in tqdm(range(0, len(todo), step), desc="reference log-probs", unit="batch", disable=not progress):
            part = todo[s : s + step]
            owners = sorted({e for e, _, _ in part})
            where = {e: k for k, e in enumerate(owners)}
            values = target_log_probs(
                model,
                [examples[e].prompt_ids for e in owners],
                [getattr(examples[e].pairs[j], f"{side}_ids") for e, j, side in part],
                [where[e] for e, _, _ in part],
                token_budget=token_budget,
                grad=False,
            )
            found.update(zip(part, values.tolist()))
    finally:
        model.train(was_training)
    out = []
    for e, ex in enumerate(examples):
        pairs = tuple(
            dataclasses.replace(
                p,
                ref_chosen_logp=found.get((e, j, "chosen"), p.ref_chosen_logp),
                ref_rejected_logp=found.get((e, j, "rejected"), p.ref_rejected_logp),
            )
            for j, p in enumerate(ex.pairs)
        )
        out.append(dataclasses.replace(ex, pairs=pairs))
    return out


def check_reference_model(
    model: Any, examples: Sequence[MBRExample], rows: int = 4, *, token_budget: int = 8192
) -> None:
    """Raise ``ValueError`` unless ``model`` gives the stored reference log-probabilities of the chosen sides of
    the first ``rows`` pairs (float32, eval mode; within 1e-3 + 1e-4·|value|: padding and batching only). DPO
    compares the policy with the stored values: training must start from the model that computed them."""
    picked = [(e, p) for e in examples for p in e.pairs if p.ref_chosen_logp is not None][:rows]
    if not picked:
        return
    was_training = model.training
    model.eval()
    try:
        got = target_log_probs(
            model,
            [e.prompt_ids for e, _ in picked],
            [p.chosen_ids for _, p in picked],
            token_budget=token_budget,
            grad=False,
        ).tolist()
    finally:
        model.train(was_training)
    for (e, p), value in zip(picked, got):
        want = float(p.ref_chosen_logp or 0.0)
        if abs(value - want) > 1e-3 + 1e-4 * abs(want):
            raise ValueError(
                f"the stored reference log-probabilities are another model's (source {e.index}: stored {want:.4f}, "
                f"this model {value:.4f}): start training from the model that built the data"
            )
