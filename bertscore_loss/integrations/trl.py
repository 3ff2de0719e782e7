"""Reward functions with TRL's ``reward_funcs`` contract: ``(prompts, completions, **columns) -> list[float]``.

>>> reward = BERTScoreReward("reference", layer=4)                              # doctest: +SKIP
>>> trainer = GRPOTrainer(model, reward_funcs=[reward], args=cfg, train_dataset=ds)   # doctest: +SKIP

TRL calls a reward function on each process with that process's ``prompts`` and ``completions``
(``N`` each: every prompt repeated once per generation), ``completion_ids`` and every other dataset
column as a keyword argument holding ``N`` values, plus ``trainer_state`` and a few callables; a
completion is a string, or for conversational data a list of messages (``{"role", "content"}``).
Nothing here imports TRL: the callables are plain objects (not ``nn.Module``, which TRL would treat
as a reward model) with a ``__name__``, which TRL uses to name the reward in its logs.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from bertscore_loss import BERTScorer
from bertscore_loss.config import check_measure

from ._dist import all_gather_objects, world
from ._scorer import resident_scorer

logger = logging.getLogger(__name__)

Completion = str | Sequence[dict[str, Any]]


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):  # multimodal parts: [{"type": "text", "text": ...}, ...]
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


def completion_text(completion: Completion | dict[str, Any], where: str = "completion") -> str:
    """The text to score: a string as is; for a list of messages, the assistant messages' text joined by
    newlines (tool calls, tool results and other roles are left out), stripped. Anything else (None, a
    number, bytes, a list of strings) is a TypeError naming ``where`` and what it got."""
    if isinstance(completion, str):
        return completion.strip()
    if isinstance(completion, dict):
        completion = [completion]
    if (
        isinstance(completion, (str, bytes, bytearray))
        or not isinstance(completion, Sequence)
        or not all(isinstance(m, dict) for m in completion)
    ):
        raise TypeError(
            f"{where} must be a str or a list of chat messages (dicts with 'role' and 'content'), "
            f"got {type(completion).__name__}: {completion!r:.60}"
        )
    messages: list[dict[str, Any]] = list(completion)  # type: ignore[arg-type]  # checked above: all dicts
    parts = [_content_text(m.get("content")) for m in messages if m.get("role", "assistant") == "assistant"]
    return "\n".join(p for p in parts if p).strip()


def _column(value: Any, name: str, n: int) -> Sequence[Any]:
    """A dataset column: a list (or tuple) of ``n`` rows, never a str (which would be read letter by letter)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(
            f"column {name!r} must be a list with one entry per completion, got {type(value).__name__}: {value!r:.60}"
        )
    if len(value) != n:
        raise ValueError(f"{n} completions but {len(value)} entries in column {name!r}")
    return value


def _prompts_and_completions(prompts: Any, completions: Any) -> tuple[Sequence[Any], Sequence[Any]]:
    """TRL's ``prompts`` and ``completions`` lists, checked: lists (not a str) of the same length."""
    if isinstance(completions, (str, bytes)) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a list (one per sample), got {type(completions).__name__}")
    return _column(prompts, "prompts", len(completions)), completions


def _references(value: Any) -> list[str]:
    """One row of the reference column: a str, a list of str (several references) or messages."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict) or (isinstance(value, Sequence) and value and isinstance(value[0], dict)):
        return [completion_text(value)]
    if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        return list(value)
    raise TypeError(f"a reference must be a str, a list of str or a list of messages, got {value!r:.80}")


def _prompt_key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class BERTScoreReward:
    """BERTScore of each completion against its references from the dataset column ``reference_column``.

    ``__call__(prompts, completions, **columns) -> list[float]`` (``N`` values in input order):
    ``columns[reference_column]`` holds per completion a string, a list of strings (several references,
    reduced by the scorer's ``multi_ref``, ``"max"`` by default) or a list of messages. Completions are
    strings or lists of messages (:func:`completion_text`). Empty completions score ``empty_value``
    (0.0) with a logged warning and are not sent to the engine; all others are scored in ONE
    :meth:`BERTScorer.score` call, where each unique text is encoded once and the references come from
    the encoder's byte-bounded LRU cache (``cache_bytes``) after their first step.

    ``measure``: ``"f1"``, ``"precision"`` or ``"recall"``; ``rescale=True`` rescales with the model's
    baseline (or ``baseline=`` a file); other fields (``model``, ``layer``, ``idf``, ``device``, …) go
    to the :class:`BERTScorer`, or pass ``scorer``. ``calls`` counts engine calls.
    """

    def __init__(
        self,
        reference_column: str = "reference",
        scorer: BERTScorer | None = None,
        *,
        measure: str = "f1",
        empty_value: float = 0.0,
        cache_bytes: int = 256 << 20,
        name: str = "bertscore",
        **fields: Any,
    ) -> None:
        check_measure(measure)
        scorer = resident_scorer(scorer, cache_bytes, fields, "BERTScoreReward")
        self.scorer = scorer
        self.reference_column = reference_column
        self.measure = measure
        self.empty_value = float(empty_value)
        self.__name__ = name
        self.calls = 0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Completion], **columns: Any) -> list[float]:
        if self.reference_column not in columns:
            names = sorted(k for k, v in columns.items() if isinstance(v, (list, tuple)))
            raise KeyError(f"no dataset column {self.reference_column!r} among the reward's columns {names}")
        prompts, completions = _prompts_and_completions(prompts, completions)
        refs = _column(columns[self.reference_column], self.reference_column, len(completions))
        texts = [completion_text(c, f"completions[{i}]") for i, c in enumerate(completions)]
        rewards = [self.empty_value] * len(texts)
        keep = [i for i, e in enumerate(self.scorer.empty_texts(texts)) if not e]  # the scorer's rule of emptiness
        if len(keep) < len(texts):
            logger.warning("%d empty completion(s) get reward %s", len(texts) - len(keep), self.empty_value)
        if keep:
            scores = self.scorer.score([texts[i] for i in keep], [_references(refs[i]) for i in keep])
            self.calls += 1
            values = getattr(scores, self.measure).tolist()
            for i, v in zip(keep, values):
                rewards[i] = float(v)
        return rewards


class MBRConsensusReward:
    """Reference-free reward: each completion's mean BERTScore against the other completions of its group.

    ``__call__(prompts, completions, **columns) -> list[float]``: completion ``i`` of a group ``G``
    gets ``mean_{j in G, j != i, c_j non-empty} F(c_i, c_j)`` (``c_i`` the candidate, ``c_j`` the
    reference): the minimum-Bayes-risk consensus that GRPO's group of samples per prompt provides
    without references. Groups are the completions of identical prompts, or with ``num_generations``
    (TRL's ``G``) consecutive blocks of that size. Empty completions get ``empty_value`` and are no
    one's reference; a completion without a non-empty partner gets ``empty_value`` too (both logged).
    All ordered pairs of a call go to ONE :meth:`BERTScorer.score` call (each unique text encoded once).

    Several processes (``gather=True``, default): TRL scores each process's slice of the batch, and a
    group may straddle processes; the texts and prompts of all ranks are gathered (in rank order, as
    TRL gathers the rewards) and each rank scores only the pairs of its own completions.
    """

    def __init__(
        self,
        scorer: BERTScorer | None = None,
        *,
        num_generations: int | None = None,
        measure: str = "f1",
        empty_value: float = 0.0,
        gather: bool = True,
        name: str = "bertscore_mbr",
        **fields: Any,
    ) -> None:
        check_measure(measure)
        if num_generations is not None and num_generations < 2:
            raise ValueError("num_generations must be >= 2 (a group needs other members)")
        self.scorer = resident_scorer(scorer, 0, fields, "MBRConsensusReward")
        self.num_generations = num_generations
        self.measure = measure
        self.empty_value = float(empty_value)
        self.gather = gather
        self.__name__ = name
        self.calls = 0

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Completion], **columns: Any) -> list[float]:
        prompts, completions = _prompts_and_completions(prompts, completions)
        texts = [completion_text(c, f"completions[{i}]") for i, c in enumerate(completions)]
        keys = [_prompt_key(p) for p in prompts]
        rank, size = world() if self.gather else (0, 1)
        offset = 0
        if size > 1:
            parts = all_gather_objects((keys, texts))
            offset = sum(len(k) for k, _ in parts[:rank])
            keys = [k for ks, _ in parts for k in ks]
            texts = [t for _, ts in parts for t in ts]
        if self.num_generations is not None:
            if len(texts) % self.num_generations:
                raise ValueError(f"{len(texts)} completions are not groups of num_generations={self.num_generations}")
            group_of = [i // self.num_generations for i in range(len(texts))]
        else:
            ids: dict[str, int] = {}
            group_of = [ids.setdefault(k, len(ids)) for k in keys]
        real = [not e for e in self.scorer.empty_texts(texts)]  # the scorer's one rule of emptiness
        members: dict[int, list[int]] = {}
        for i, g in enumerate(group_of):
            if real[i]:
                members.setdefault(g, []).append(i)
        mine = range(offset, offset + len(completions))
        pairs = [(i, j) for i in mine if real[i] for j in members.get(group_of[i], []) if j != i]
        rewards = [self.empty_value] * len(completions)
        empty = sum(1 for i in mine if not real[i])
        alone = sum(1 for i in mine if real[i] and len(members[group_of[i]]) < 2)
        if empty or alone:
            logger.warning(
                "%d empty completion(s) and %d without a non-empty partner in their group get reward %s",
                empty,
                alone,
                self.empty_value,
            )
        if pairs:
            scores = self.scorer.score([texts[i] for i, _ in pairs], [texts[j] for _, j in pairs])
            self.calls += 1
            values = getattr(scores, self.measure).tolist()
            sums: dict[int, list[float]] = {}
            for (i, _), v in zip(pairs, values):
                acc = sums.setdefault(i, [0.0, 0.0])
                acc[0] += v
                acc[1] += 1
            for i, (total, n) in sums.items():
                rewards[i - offset] = total / n
        return rewards
