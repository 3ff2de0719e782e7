"""Direct preference optimisation for any generator, encoder–decoders included.

TRL's ``DPOTrainer`` trains causal LMs only; Marian, T5 and BART are encoder–decoders. This module is
the loss alone, on sequence log-probabilities, so any model whose teacher-forced logits (or decoder
states, through :func:`~bertscore_loss.risk.label_log_probs`) give the log-probability of a target
can use it. For a pair (``y_w`` chosen, ``y_l`` rejected) of a source ``x``, with ``π`` the policy and
``π_ref`` the frozen reference:

- ``"sigmoid"`` (Rafailov et al., 2023, "Direct Preference Optimization"):
  ``−log σ(β·Δ)`` with ``Δ = (log π(y_w|x) − log π_ref(y_w|x)) − (log π(y_l|x) − log π_ref(y_l|x))``;
  with ``label_smoothing = ε`` the conservative form (cDPO, Mitchell 2023; what TRL's ``sigmoid`` loss
  computed before version 1.0): ``−(1−ε)·log σ(βΔ) − ε·log σ(−βΔ)``.
- ``"robust"`` (Chowdhury et al., 2024, rDPO; TRL's ``robust``): ``(−(1−ε)·log σ(βΔ) + ε·log σ(−βΔ)) / (1−2ε)``.
- ``"ipo"`` (Azar et al., 2024; TRL's length-normalised ``ipo``): ``(Δ_w/|y_w| − Δ_l/|y_l| − 1/(2β))²``
  where ``Δ_w``, ``Δ_l`` are the chosen and rejected log-ratios and ``|y|`` the number of target tokens.

The implicit rewards are ``β·(log π(y|x) − log π_ref(y|x))``, as TRL reports them. An optional NLL term on
the chosen side, ``nll_weight`` × the mean token NLL of the chosen targets, gives DPO+NLL (Pang et al.,
2024, "Iterative Reasoning Preference Optimization"; TRL's ``rpo_alpha``): it keeps the chosen
log-probability from falling while the margin grows.

The reference model is not held in memory: its sequence log-probabilities are computed once, before
training, and stored with the pairs. With a Hugging Face encoder–decoder ``ref`` (dropout off)::

    ref.eval()
    with torch.no_grad():
        for side in ("chosen", "rejected"):
            logits = ref(input_ids=src, attention_mask=mask, labels=batch[f"{side}_labels"]).logits
            batch[f"ref_{side}_logps"] = sequence_log_probs(logits, batch[f"{side}_labels"])  # [B], stored

``labels`` are the target ids with ``-100`` at padding (the model builds its decoder inputs from them).
Train the policy with dropout off too (TRL's ``disable_dropout=True`` default): then the policy starts
equal to the reference, every reward starts at 0 and the loss at ``log 2``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .risk import sequence_log_probs

PreferenceLossType = Literal["sigmoid", "robust", "ipo"]
PREFERENCE_LOSS_TYPES: tuple[str, ...] = get_args(PreferenceLossType)
Reduction = Literal["mean", "sum", "none"]


@dataclass(frozen=True)
class PreferenceConfig:
    """Settings of :class:`PreferenceLoss` (and :func:`dpo_loss`); validated on construction.

    ``beta`` (> 0): strength of the KL anchor to the reference (TRL's default 0.1; for ``"ipo"`` the
    regulariser τ). ``nll_weight`` (>= 0): weight of the chosen side's mean token NLL (0 = plain DPO; 1.0 in
    Pang et al.). ``label_smoothing`` in [0, 0.5): the assumed probability that a pair's preference is
    flipped (``"sigmoid"``: conservative DPO; ``"robust"``: rDPO; not used by ``"ipo"``, where it must be 0).
    ``loss_type``: ``"sigmoid"``, ``"robust"`` or ``"ipo"``. ``reduction``: ``"mean"``, ``"sum"`` or
    ``"none"`` over the pairs (the NLL term follows ``cross_entropy``'s: the token mean over the batch, the
    token sum, or per pair the mean over its tokens).
    """

    beta: float = 0.1
    nll_weight: float = 0.0
    label_smoothing: float = 0.0
    loss_type: PreferenceLossType = "sigmoid"
    reduction: Reduction = "mean"

    def __post_init__(self) -> None:
        for name in ("beta", "nll_weight", "label_smoothing"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"PreferenceConfig.{name} must be a finite number, got {value!r}")
        if not self.beta > 0:
            raise ValueError(f"PreferenceConfig.beta must be > 0, got {self.beta!r}")
        if not self.nll_weight >= 0:
            raise ValueError(f"PreferenceConfig.nll_weight must be >= 0, got {self.nll_weight!r}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"PreferenceConfig.label_smoothing must lie in [0, 0.5), got {self.label_smoothing!r}")
        if self.loss_type not in PREFERENCE_LOSS_TYPES:
            raise ValueError(
                f"PreferenceConfig.loss_type must be one of {', '.join(map(repr, PREFERENCE_LOSS_TYPES))}, "
                f"got {self.loss_type!r}"
            )
        if self.loss_type == "ipo" and self.label_smoothing:
            raise ValueError("PreferenceConfig.label_smoothing applies to 'sigmoid' and 'robust' only: set it to 0")
        if self.reduction not in get_args(Reduction):
            raise ValueError(f"PreferenceConfig.reduction must be 'mean', 'sum' or 'none', got {self.reduction!r}")


class DPOTerms(NamedTuple):
    """``loss`` (scalar, or ``[B]`` with ``reduction="none"``); the implicit rewards ``[B]`` (detached)."""

    loss: Tensor
    chosen_rewards: Tensor
    rejected_rewards: Tensor


class PreferenceOutput(NamedTuple):
    """What :class:`PreferenceLoss` returns.

    ``loss`` = ``dpo + nll_weight · nll`` (scalar, or ``[B]`` with ``reduction="none"``); ``dpo``: the
    preference term; ``nll``: the chosen side's token NLL (None when the token counts are unknown: log-probs
    given without ``chosen_lengths``); ``chosen_rewards``, ``rejected_rewards``, ``margins`` (their
    difference) ``[B]``: implicit rewards, detached; ``reward_accuracy``: scalar, the fraction of pairs whose
    chosen reward is higher; ``chosen_logps``, ``rejected_logps`` ``[B]``: the policy's sequence
    log-probabilities, detached (a falling ``chosen_logps`` is DPO's known likelihood displacement).
    """

    loss: Tensor
    dpo: Tensor
    nll: Tensor | None
    chosen_rewards: Tensor
    rejected_rewards: Tensor
    margins: Tensor
    reward_accuracy: Tensor
    chosen_logps: Tensor
    rejected_logps: Tensor


def _reduce(values: Tensor, reduction: str) -> Tensor:
    if reduction == "none":
        return values
    return values.sum() if reduction == "sum" else values.mean()


def _check_sequence_values(name: str, value: Tensor, shape: torch.Size | None) -> Tensor:
    if not isinstance(value, Tensor) or value.dim() != 1:
        got = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a tensor [B] (one value per pair), got {got}")
    if shape is not None and value.shape != shape:
        raise ValueError(f"{name} has shape {tuple(value.shape)}, but the pairs are {tuple(shape)}")
    return value


def _check_logps(name: str, value: Tensor, shape: torch.Size | None) -> Tensor:
    _check_sequence_values(name, value, shape)
    if not torch.is_floating_point(value):
        raise ValueError(f"{name} must be a float tensor, got {value.dtype}")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} holds NaN or ±inf")
    return value


def _check_lengths(name: str, value: Tensor, shape: torch.Size) -> Tensor:
    _check_sequence_values(name, value, shape)
    if bool((value <= 0).any()) or not bool(torch.isfinite(value.float()).all()):
        raise ValueError(f"{name} must hold finite token counts >= 1")
    return value


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    loss_type: PreferenceLossType = "sigmoid",
    reduction: Reduction = "mean",
    chosen_lengths: Tensor | None = None,
    rejected_lengths: Tensor | None = None,
) -> DPOTerms:
    """The preference loss of ``B`` pairs from their sequence log-probabilities ``[B]`` (the module docstring
    gives the formulas); differentiable in the policy's log-probabilities.

    ``chosen_lengths``, ``rejected_lengths`` ``[B]``: token counts of the targets, needed by ``"ipo"`` only.
    Computed in float32 (float64 inputs stay float64). Returns ``(loss, chosen_rewards, rejected_rewards)``
    with the rewards ``β·(policy − ref)`` ``[B]``, detached.
    """
    config = PreferenceConfig(beta=beta, label_smoothing=label_smoothing, loss_type=loss_type, reduction=reduction)
    shape = _check_logps("policy_chosen_logps", policy_chosen_logps, None).shape
    if shape[0] == 0:
        raise ValueError("got no pairs: the log-probabilities are empty")
    _check_logps("policy_rejected_logps", policy_rejected_logps, shape)
    _check_logps("ref_chosen_logps", ref_chosen_logps, shape)
    _check_logps("ref_rejected_logps", ref_rejected_logps, shape)
    dtype = torch.promote_types(policy_chosen_logps.dtype, torch.float32)
    device = policy_chosen_logps.device

    def cast(x: Tensor) -> Tensor:
        return x.to(device=device, dtype=dtype)

    chosen_ratio = cast(policy_chosen_logps) - cast(ref_chosen_logps)
    rejected_ratio = cast(policy_rejected_logps) - cast(ref_rejected_logps)
    eps = config.label_smoothing
    if config.loss_type == "ipo":
        if chosen_lengths is None or rejected_lengths is None:
            raise ValueError("loss_type='ipo' needs chosen_lengths and rejected_lengths (token counts [B])")
        n_w = cast(_check_lengths("chosen_lengths", chosen_lengths, shape))
        n_l = cast(_check_lengths("rejected_lengths", rejected_lengths, shape))
        per_pair = (chosen_ratio / n_w - rejected_ratio / n_l - 1.0 / (2.0 * config.beta)) ** 2
    else:
        z = config.beta * (chosen_ratio - rejected_ratio)
        agree, flip = F.logsigmoid(z), F.logsigmoid(-z)
        if config.loss_type == "sigmoid":
            per_pair = -(1.0 - eps) * agree - eps * flip if eps else -agree
        else:  # robust
            per_pair = (-(1.0 - eps) * agree + eps * flip) / (1.0 - 2.0 * eps)
    rewards_w = config.beta * chosen_ratio.detach()
    rewards_l = config.beta * rejected_ratio.detach()
    return DPOTerms(_reduce(per_pair, config.reduction), rewards_w, rewards_l)


_FIELDS = {f.name for f in dataclasses.fields(PreferenceConfig)}


class PreferenceLoss(nn.Module):
    """DPO (or rDPO, IPO) plus an optional NLL term on the chosen side, for any generator.

    ``forward(chosen, rejected, ref_chosen_logps, ref_rejected_logps, chosen_labels=None,
    rejected_labels=None, *, chosen_lengths=None, rejected_lengths=None)``:

    - ``chosen``, ``rejected``: the policy's teacher-forced logits ``[B, T, V]`` with ``chosen_labels``,
      ``rejected_labels`` ``[B, T]`` (long, ``-100`` at padding; a Hugging Face encoder–decoder's
      ``labels=``; the two sides may have different ``T``), reduced with :func:`sequence_log_probs`; or
      the policy's sequence log-probabilities ``[B]`` (e.g. ``label_log_probs`` on the decoder states,
      summed per target, to avoid holding the ``[B, T, V]`` logits), with ``chosen_lengths`` /
      ``rejected_lengths`` ``[B]`` (token counts) where the NLL term or ``"ipo"`` needs them.
    - ``ref_chosen_logps``, ``ref_rejected_logps`` ``[B]``: the reference model's sequence log-probabilities
      of the same targets, computed once and stored with the pairs (see the module docstring).

    Settings: a :class:`PreferenceConfig` or its fields as keyword arguments (both: the fields override
    the config's). No parameters, no buffers.
    """

    def __init__(self, config: PreferenceConfig | None = None, **fields: Any) -> None:
        super().__init__()
        unknown = sorted(set(fields) - _FIELDS)
        if unknown:
            raise TypeError(f"PreferenceLoss got unknown settings {unknown}; the settings are {sorted(_FIELDS)}")
        self.config = dataclasses.replace(config or PreferenceConfig(), **fields)

    def extra_repr(self) -> str:
        c = self.config
        return (
            f"loss_type={c.loss_type!r}, beta={c.beta}, nll_weight={c.nll_weight}, "
            f"label_smoothing={c.label_smoothing}, reduction={c.reduction!r}"
        )

    @staticmethod
    def _side(name: str, values: Tensor, labels: Tensor | None, lengths: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """(sequence log-probs [B], token counts [B] or None) of one side."""
        if not isinstance(values, Tensor) or values.dim() not in (1, 3):
            got = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
            raise ValueError(f"{name} must be logits [B, T, V] (with {name}_labels) or log-probs [B], got {got}")
        if values.dim() == 1:
            if labels is not None:
                raise ValueError(f"{name} holds log-probs [B]: {name}_labels are for logits [B, T, V]; drop them")
            _check_logps(name, values, None)
            if lengths is not None:
                _check_lengths(f"{name}_lengths", lengths, values.shape)
            return values, lengths
        if labels is None:
            raise ValueError(f"{name} holds logits [B, T, V]: pass {name}_labels [B, T] (-100 at padding)")
        if lengths is not None:
            raise ValueError(f"{name}_lengths are for log-probs [B]; with logits they come from {name}_labels")
        if labels.dim() != 2 or labels.shape != values.shape[:2]:
            raise ValueError(f"{name}_labels must be [B, T] = {tuple(values.shape[:2])}, got {tuple(labels.shape)}")
        counts = (labels != -100).sum(dim=1)
        if bool((counts == 0).any()):
            row = int((counts == 0).nonzero()[0, 0])
            raise ValueError(f"{name}_labels row {row} has no target token (all -100)")
        return sequence_log_probs(values, labels), counts

    def forward(
        self,
        chosen: Tensor,
        rejected: Tensor,
        ref_chosen_logps: Tensor,
        ref_rejected_logps: Tensor,
        chosen_labels: Tensor | None = None,
        rejected_labels: Tensor | None = None,
        *,
        chosen_lengths: Tensor | None = None,
        rejected_lengths: Tensor | None = None,
    ) -> PreferenceOutput:
        c = self.config
        chosen_logps, n_w = self._side("chosen", chosen, chosen_labels, chosen_lengths)
        rejected_logps, n_l = self._side("rejected", rejected, rejected_labels, rejected_lengths)
        if rejected_logps.shape != chosen_logps.shape:
            raise ValueError(
                f"chosen and rejected hold different numbers of pairs: {chosen_logps.shape[0]} and "
                f"{rejected_logps.shape[0]}"
            )
        dpo, rewards_w, rewards_l = dpo_loss(
            chosen_logps,
            rejected_logps,
            ref_chosen_logps,
            ref_rejected_logps,
            beta=c.beta,
            label_smoothing=c.label_smoothing,
            loss_type=c.loss_type,
            reduction=c.reduction,
            chosen_lengths=n_w,
            rejected_lengths=n_l,
        )
        nll: Tensor | None = None
        if n_w is not None:
            logps = chosen_logps.to(torch.promote_types(chosen_logps.dtype, torch.float32))
            counts = n_w.to(device=logps.device, dtype=logps.dtype)
            if c.reduction == "none":
                nll = -logps / counts
            elif c.reduction == "sum":
                nll = -logps.sum()
            else:
                nll = -logps.sum() / counts.sum()
        elif c.nll_weight > 0:
            raise ValueError("nll_weight > 0 with log-probs [B] needs chosen_lengths (token counts [B])")
        loss = dpo + c.nll_weight * nll if nll is not None and c.nll_weight > 0 else dpo
        margins = rewards_w - rewards_l
        return PreferenceOutput(
            loss=loss,
            dpo=dpo,
            nll=nll,
            chosen_rewards=rewards_w,
            rejected_rewards=rewards_l,
            margins=margins,
            reward_accuracy=(margins > 0).float().mean(),
            chosen_logps=chosen_logps.detach(),
            rejected_logps=rejected_logps.detach(),
        )
