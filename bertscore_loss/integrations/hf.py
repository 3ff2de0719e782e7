"""Hugging Face ``Trainer`` / ``Seq2SeqTrainer``: a ``compute_metrics`` and a ``compute_loss_func``.

>>> metrics = bertscore_compute_metrics(tokenizer, layer=4)                     # doctest: +SKIP
>>> trainer = Seq2SeqTrainer(model, args, compute_metrics=metrics,              # doctest: +SKIP
...                          compute_loss_func=SemanticLoss(tokenizer, weight=0.5), ...)

Both objects hold a frozen encoder that is never attached to the trained model: it is in neither the
model's ``parameters()`` (so not in the optimizer) nor its ``state_dict()`` / ``save_pretrained`` /
the Trainer's checkpoints, and the Trainer never pickles ``compute_metrics`` or ``compute_loss_func``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import TrainerCallback

from bertscore_loss import BERTScoreLoss, BERTScorer, VocabBridge

from ._dist import all_reduce_sum, world
from ._scorer import resident_scorer

logger = logging.getLogger(__name__)

IGNORE_INDEX = -100


def decode_ids(ids: np.ndarray | Tensor | Sequence[Sequence[int]], tokenizer: Any, **decode_kwargs: Any) -> list[str]:
    """Texts of token-id rows ``[N, L]`` (padded with the pad id or ``-100``), special tokens skipped.

    Every negative id (the ``-100`` that the Trainer pads labels and gathered predictions with) is
    dropped, never mapped to an id (for a tokenizer without a pad token, id 0 is a real token, e.g.
    GPT-2's ``"!"``); the rest goes to ``tokenizer.batch_decode(..., skip_special_tokens=True,
    **decode_kwargs)``. Returns ``N`` stripped strings.
    """
    if isinstance(ids, Tensor):
        rows = ids.detach().cpu().tolist()
    elif isinstance(ids, np.ndarray):
        rows = ids.tolist()
    else:
        rows = [list(r) for r in ids]
    if rows and not isinstance(rows[0], list):
        raise ValueError(f"token ids must be rows [N, L], got a 1-D sequence of {len(rows)} ids")
    rows = [[int(t) for t in r if int(t) >= 0] for r in rows]
    decode_kwargs.setdefault("skip_special_tokens", True)
    return [t.strip() for t in tokenizer.batch_decode(rows, **decode_kwargs)]


class BERTScoreMetrics(TrainerCallback):
    """``compute_metrics`` for ``Seq2SeqTrainer(..., args=Seq2SeqTrainingArguments(predict_with_generate=True))``.

    Called with an ``EvalPrediction`` whose ``predictions`` are generated ids ``[N, Lp]`` (a tuple's
    first element is used) and ``label_ids`` ``[N, Ll]``; both are decoded by :func:`decode_ids` and
    scored by ONE resident :class:`BERTScorer` with an embedding cache (``cache_bytes``, LRU), so the
    validation references, the same texts every evaluation, are encoded once: later evaluations encode
    only the new predictions. Returns ``{prefix + "precision"|"recall"|"f1": mean}`` (and
    ``prefix + "signature"`` with ``signature=True``); the Trainer adds ``eval_``.

    Multi-process evaluation (``distributed="shard"``, default): the Trainer gathers the predictions
    and labels of all ranks and calls ``compute_metrics`` on every rank with the full arrays; each rank
    scores only its strided shard (rows ``rank::world_size``, the same rows every evaluation, so each
    rank's cache holds its own references), then the sums of P, R, F and the row count are all-reduced,
    so every rank returns the same means (as needed for ``metric_for_best_model``). ``"replicate"``:
    every rank scores all rows, no collective.

    With ``batch_eval_metrics=True`` the sums are accumulated per batch and reduced at the last one
    (``compute_result=True``). The object must then know where an evaluation ends, so pass it as a callback
    too: ``Trainer(..., compute_metrics=metrics, callbacks=[metrics])``. It then drops the sums of an
    evaluation that ended without a final batch (e.g. a dataloader that never flags its end) with a warning,
    instead of adding them to the next evaluation. A batched call on an object that no Trainer has
    registered as a callback is refused with an error saying so; outside a Trainer, call :meth:`reset`
    before the first batch of each evaluation you drive yourself.

    ``stats`` describes the last call: ``rows`` scored here, ``world_size``, ``texts_encoded`` (texts
    run through the encoder: the cache's misses, or every unique text when the cache is off).
    """

    def __init__(
        self,
        tokenizer: Any,
        scorer: BERTScorer | None = None,
        *,
        prefix: str = "bertscore_",
        signature: bool = False,
        distributed: Literal["shard", "replicate"] = "shard",
        cache_bytes: int = 256 << 20,
        decode_kwargs: Mapping[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        if distributed not in ("shard", "replicate"):
            raise ValueError(f"distributed must be 'shard' or 'replicate', got {distributed!r}")
        scorer = resident_scorer(scorer, cache_bytes, fields, "bertscore_compute_metrics")
        self.tokenizer = tokenizer
        self.scorer = scorer
        self.prefix = prefix
        self.signature = signature
        self.distributed = distributed
        self.decode_kwargs = dict(decode_kwargs or {})
        self._pending = [0.0, 0.0, 0.0, 0.0]  # sums of P, R, F and rows over the batches of one evaluation
        self._open = False  # inside an evaluation (a non-final batch was seen)
        self._attached = False  # a Trainer sends this object its callback events
        self._started = False  # reset() was called by the user: the start of an evaluation they drive
        self.stats: dict[str, int] = {}

    def _clear(self) -> None:
        self._pending = [0.0, 0.0, 0.0, 0.0]
        self._open = False

    def reset(self) -> None:
        """Start a batched evaluation from zero (``batch_eval_metrics``): forgets the sums of an unfinished
        one. A Trainer that has this object as a callback does it for you; call it yourself before the first
        batch of an evaluation you drive outside a Trainer."""
        self._clear()
        self._started = True

    # --- TrainerCallback: registration, and the end of an evaluation whatever its batches said ----
    def _close(self, what: str) -> None:
        self._attached = True
        if self._open:
            logger.warning(
                "an %s ended without a final batch (compute_result=True): its BERTScore sums were dropped", what
            )
        self._clear()

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._attached = True

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._attached = True  # the Trainer calls this before compute_metrics at every evaluation batch

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._close("evaluation")

    def on_predict(self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any) -> None:
        self._close("prediction")

    def __call__(self, eval_pred: Any, compute_result: bool = True) -> dict[str, float | str]:
        """Metrics of one evaluation (or ``{}`` for a non-final batch with ``batch_eval_metrics``).

        ``eval_pred``: an ``EvalPrediction`` or a plain ``(predictions, labels)`` tuple.
        """
        if not self._open:
            if not compute_result and not (self._attached or self._started):
                raise ValueError(
                    "batch_eval_metrics=True: BERTScoreMetrics must see where an evaluation ends, or an evaluation "
                    "that stops before its final batch leaks its sums into the next one. Pass it as a callback "
                    "too: Trainer(..., compute_metrics=metrics, callbacks=[metrics]); outside a Trainer, call "
                    "metrics.reset() before the first batch of each evaluation"
                )
            self._clear()  # the first batch of an evaluation starts from zero
        self._open = True
        try:
            out = self._call(eval_pred, compute_result)
        except BaseException:
            self._clear()
            self._started = False
            raise
        if compute_result:
            self._started = False
        return out

    def _call(self, eval_pred: Any, compute_result: bool) -> dict[str, float | str]:
        if hasattr(eval_pred, "predictions"):
            preds, labels = eval_pred.predictions, getattr(eval_pred, "label_ids", None)
        elif isinstance(eval_pred, (tuple, list)) and len(eval_pred) == 2:
            preds, labels = eval_pred
        else:
            raise TypeError(
                "compute_metrics takes an EvalPrediction or a (predictions, labels) tuple, "
                f"got {type(eval_pred).__name__}"
            )
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.asarray(preds.detach().cpu() if isinstance(preds, Tensor) else preds)
        if labels is None:
            raise ValueError("BERTScore needs the references: the evaluation dataset has no labels")
        labels = np.asarray(labels.detach().cpu() if isinstance(labels, Tensor) else labels)
        if preds.ndim == 3:
            raise ValueError(
                "predictions are logits [N, L, V]: set predict_with_generate=True (Seq2SeqTrainingArguments) "
                "or pass preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1)"
            )
        if preds.ndim != 2 or labels.ndim != 2 or len(preds) != len(labels):
            raise ValueError(
                f"predictions must be token ids [N, Lp] and labels [N, Ll] with the same N; got predictions "
                f"{list(preds.shape)} and labels {list(labels.shape)}"
            )
        rank, size = world() if self.distributed == "shard" else (0, 1)
        preds, labels = preds[rank::size], labels[rank::size]
        sums = [0.0, 0.0, 0.0, float(len(preds))]
        cache = self.scorer.encoder.cache
        misses, encoded = cache.misses, 0
        if len(preds):
            cands = decode_ids(preds, self.tokenizer, **self.decode_kwargs)
            refs = decode_ids(labels, self.tokenizer, **self.decode_kwargs)
            p, r, f = self.scorer.score(cands, refs)
            sums[:3] = [float(p.double().sum()), float(r.double().sum()), float(f.double().sum())]
            # without a cache the scorer encodes every unique (stripped) text of the call
            encoded = cache.misses - misses if cache.max_bytes else len({t.strip() for t in (*cands, *refs)})
        self.stats = {"rows": len(preds), "world_size": size, "texts_encoded": encoded}
        self._pending = [a + b for a, b in zip(self._pending, sums)]
        if not compute_result:
            return {}
        total = all_reduce_sum(self._pending) if self.distributed == "shard" else self._pending
        self._clear()
        n = max(total[3], 1.0)
        out: dict[str, float | str] = {
            f"{self.prefix}{name}": total[k] / n for k, name in enumerate(("precision", "recall", "f1"))
        }
        if self.signature:
            out[f"{self.prefix}signature"] = str(self.scorer.signature())
        logger.debug(
            "BERTScore over %d rows (%d here, %d texts encoded)", int(total[3]), len(preds), self.stats["texts_encoded"]
        )
        return out


def bertscore_compute_metrics(tokenizer: Any, scorer: BERTScorer | None = None, **kwargs: Any) -> BERTScoreMetrics:
    """The ``compute_metrics`` factory: ``BERTScoreMetrics(tokenizer, scorer, **kwargs)`` (see there)."""
    return BERTScoreMetrics(tokenizer, scorer, **kwargs)


def _same_vocabulary(a: Any, b: Any) -> bool:
    return len(a) == len(b) and a.get_vocab() == b.get_vocab()


class SemanticLoss:
    """``Trainer(compute_loss_func=SemanticLoss(tokenizer, weight=λ))``: ``CE + λ·(1 − F)``.

    ``__call__(outputs, labels, num_items_in_batch=None)`` is the Trainer's hook: ``outputs["logits"]``
    ``[B, T, V]`` (teacher-forced), ``labels`` ``[B, T]`` with ``-100`` where nothing is predicted.
    ``causal=True`` shifts them for a causal LM (logits ``t`` predict label ``t + 1``).

    - CE: summed over the label tokens and divided by ``num_items_in_batch`` (the label tokens of the
      whole accumulated batch, which the Trainer passes), else by this batch's label tokens;
    - F: :class:`BERTScoreLoss` (``reduction="none"``) of the logits, as soft candidates over the
      label positions that are not special tokens, against the labels decoded to text (special tokens
      skipped); each row's ``1 − F`` weighs its label-token count and is divided by the same
      ``num_items_in_batch``, so, like the CE, gradient accumulation gives the gradient of one big batch
      (the Trainer does not rescale a ``compute_loss_func`` loss). Rows whose reference is empty count 0.
    - ``bridge="auto"``: a :class:`VocabBridge` (``mode="retokenize"``) when ``tokenizer``'s vocabulary
      is not the encoder's; ``None``: the logits are over the encoder's vocabulary (sliced or padded to
      its size); or a ``VocabBridge`` built by the caller.

    ``criterion``: a :class:`BERTScoreLoss` with ``reduction="none"``; else one is built from ``fields``
    (scorer and loss fields, e.g. ``layer=4, max_mode="straight_through", top_k=64``). The encoder is
    frozen and held here, not by the model; it is moved to the logits' device at the first call.
    ``last`` holds the last training call's ``ce``, ``semantic`` (the weighted ``1 − F`` term) and ``f1``.
    """

    def __init__(
        self,
        tokenizer: Any,
        criterion: BERTScoreLoss | None = None,
        *,
        weight: float = 0.5,
        causal: bool = False,
        bridge: VocabBridge | Literal["auto"] | None = "auto",
        label_smoothing: float = 0.0,
        **fields: Any,
    ) -> None:
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 <= weight < math.inf:
            raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
        if isinstance(label_smoothing, bool) or not 0.0 <= float(label_smoothing) <= 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1], got {label_smoothing!r}")
        if criterion is None:
            fields.setdefault("reduction", "none")
            criterion = BERTScoreLoss(**fields)
        elif fields:
            given = ", ".join(sorted(fields))
            raise ValueError(f"SemanticLoss: pass criterion=... or the loss settings ({given}), not both")
        if criterion.loss_config.reduction != "none":
            raise ValueError("the criterion must have reduction='none' (rows are weighted by their label tokens)")
        if bridge == "auto":
            same = criterion.bridge is None and _same_vocabulary(tokenizer, criterion.encoder.tokenizer)
            bridge = None if same or criterion.bridge is not None else VocabBridge(tokenizer, criterion.encoder)
        if bridge is not None and criterion.bridge is None:
            criterion = BERTScoreLoss(scorer=criterion.scorer, bridge=bridge, loss=criterion.loss_config)
        self.criterion = criterion
        self.tokenizer = tokenizer
        self.weight = float(weight)
        self.causal = causal
        self.label_smoothing = label_smoothing
        self._special = torch.tensor(sorted(set(getattr(tokenizer, "all_special_ids", []) or [])), dtype=torch.long)
        b = criterion.bridge
        self.vocab_size = int(b.embeddings.shape[0]) if b is not None else int(criterion.encoder.vocab_size)
        self.last: dict[str, float] = {}

    def _fit_vocab(self, logits: Tensor) -> Tensor:
        """Logits ``[B, T, V]`` cut or padded (with the dtype's minimum) to the candidate vocabulary."""
        v = logits.shape[-1]
        if v >= self.vocab_size:
            return logits[..., : self.vocab_size]
        pad = logits.new_full((*logits.shape[:-1], self.vocab_size - v), torch.finfo(logits.dtype).min)
        return torch.cat((logits, pad), dim=-1)

    def __call__(self, outputs: Any, labels: Tensor, num_items_in_batch: Tensor | int | None = None) -> Tensor:
        """The scalar loss of one (micro-)batch."""
        logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs[0]
        if labels is None:
            raise ValueError("SemanticLoss needs labels (the references)")
        if logits.dim() != 3 or labels.dim() != 2 or tuple(logits.shape[:2]) != tuple(labels.shape):
            raise ValueError(
                f"SemanticLoss: logits must be [B, T, V] and labels [B, T] with the same B and T; got logits "
                f"{list(logits.shape)} and labels {list(labels.shape)}"
            )
        labels = labels.to(logits.device)
        if self.causal:
            logits, labels = logits[:, :-1], labels[:, 1:]
        valid = labels != IGNORE_INDEX
        n_items = valid.sum() if num_items_in_batch is None else num_items_in_batch
        n_items = torch.as_tensor(n_items, device=logits.device, dtype=torch.float32).clamp_min(1.0)
        ce = (
            F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]),
                labels.reshape(-1),
                ignore_index=IGNORE_INDEX,
                reduction="sum",
                label_smoothing=self.label_smoothing,
            )
            / n_items
        )
        if self.weight == 0.0:
            return ce
        content = valid & ~torch.isin(labels, self._special.to(labels.device))
        refs = decode_ids(labels, self.tokenizer)
        if self.criterion.encoder.device != logits.device:
            self.criterion.to(logits.device)
        out = self.criterion(self._fit_vocab(logits), refs, content)
        rows = content.any(dim=1) & torch.tensor([bool(r) for r in refs], device=labels.device)
        tokens = valid.sum(dim=1).to(torch.float32) * rows
        semantic = (out.loss.float().to(logits.device) * tokens).sum() / n_items
        if torch.is_grad_enabled():
            kept = out.f1.detach().float().cpu()[rows.cpu()]
            self.last = {
                "ce": float(ce.detach()),
                "semantic": float(semantic.detach()),
                "f1": float(kept.mean()) if kept.numel() else 0.0,
            }
        return ce + self.weight * semantic
