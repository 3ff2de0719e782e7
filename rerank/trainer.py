"""A Hugging Face ``Trainer`` for any generator on MBR-ranked data: DPO, MBR self-distillation, minimum risk.

:class:`MBRTrainer` trains a Hugging Face encoder–decoder (Marian, T5, BART, NLLB …) or causal LM on a
folder built by :func:`rerank.build_mbr_data` (read by :func:`rerank.preference_data.read_mbr_examples`),
with the loss

``dpo_weight · (DPO + nll_weight · NLL(chosen)) + distill_weight · NLL(MBR-best target) + mrt_weight · risk
+ reference_weight · NLL(reference)``

- DPO: :class:`bertscore_loss.PreferenceLoss` (``"sigmoid"``, ``"robust"``, ``"ipo"``) against the reference
  log-probabilities the folder stores (those it lacks computed once before training by the starting
  weights: :func:`rerank.preference_data.fill_reference_log_probs`); no second model in memory.
- Self-distillation: the token-mean NLL of each source's MBR-best target.
- Minimum-risk training (encoder–decoders): :class:`bertscore_loss.MinimumRiskLoss` over ``mrt_samples``
  epsilon samples per source (:func:`rerank.sample_ids`, seeded by ``seed`` and the update, so a resumed run
  draws the same), against the sources' references (or, without them, the MBR-best target).
- Reference NLL: the token-mean NLL of reference translations given with ``references=`` (cross-entropy on
  the corpus beside the MBR terms).

Log-probabilities come from :func:`bertscore_loss.risk.target_log_probs` (token-budgeted, one encoder pass
per source). With ``disable_dropout`` (default) the loss passes run in eval mode, as the reference values
were made: at the first step the policy equals the reference and the DPO term is ``log 2``. ``Trainer``
does the rest: optimiser, schedule, gradient accumulation, bf16 autocast, checkpoints, ``resume_from_checkpoint``,
``save_model``, logging (``rewards/chosen``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen`` …).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import yaml
from torch import Tensor
from torch.utils.data import Dataset
from transformers import HfArgumentParser, Trainer, TrainingArguments

from bertscore_loss.preference import PREFERENCE_LOSS_TYPES, PreferenceConfig, PreferenceLoss
from bertscore_loss.risk import MinimumRiskLoss, distinct_candidates, target_log_probs

from .preference_data import (
    PAIR_SELECTIONS,
    READ_PAIRINGS,
    MBRExample,
    check_reference_model,
    fill_reference_log_probs,
    read_mbr_examples,
)
from .sampling import SamplingConfig, model_positions, sample_ids
from .training_data import _source_ids, _target_ids, codec_from

__all__ = ["MBRDataset", "MBRTrainer", "MBRTrainingConfig"]

logger = logging.getLogger(__name__)


@dataclass
class MBRTrainingConfig(TrainingArguments):
    """``transformers.TrainingArguments`` plus the settings of :class:`MBRTrainer` (the loss, the pairs);
    :meth:`from_yaml` reads one from a YAML file."""

    beta: float = field(default=0.1, metadata={"help": "DPO's beta: strength of the anchor to the reference (> 0)."})
    loss_type: str = field(
        default="sigmoid", metadata={"help": "Preference loss: 'sigmoid' (DPO), 'robust' (rDPO) or 'ipo'."}
    )
    label_smoothing: float = field(
        default=0.0, metadata={"help": "Assumed share of flipped preferences, in [0, 0.5) ('sigmoid', 'robust')."}
    )
    nll_weight: float = field(
        default=1.0, metadata={"help": "Weight of the chosen side's token NLL inside the DPO term (0 = plain DPO)."}
    )
    dpo_weight: float = field(default=1.0, metadata={"help": "Weight of the preference term (0 = off)."})
    distill_weight: float = field(
        default=0.0, metadata={"help": "Weight of the token NLL of each source's MBR-best target (0 = off)."}
    )
    mrt_weight: float = field(
        default=0.0, metadata={"help": "Weight of the minimum-risk term over epsilon samples (0 = off)."}
    )
    reference_weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the token NLL of the reference translations given to the trainer (0 = off)."},
    )
    pairing: str = field(
        default="stored",
        metadata={
            "help": "Pairs: 'stored' (the folder's chosen/rejected) or re-paired from the stored candidate lists: "
            "'beam-or-worst', 'best-worst', 'best-beam', 'best-second', 'best-2sigma'."
        },
    )
    pairs_per_source: int = field(
        default=1, metadata={"help": "Pairs per source: after the first, the lowest-ranked other candidates."}
    )
    pair_selection: str = field(
        default="all",
        metadata={"help": "Pairs kept by length: 'all', 'not-shorter' (chosen not shorter) or 'balanced'."},
    )
    pair_seed: int = field(default=0, metadata={"help": "Seed of the 'balanced' selection's random subset."})
    mrt_samples: int = field(default=8, metadata={"help": "Minimum-risk training: epsilon samples per source."})
    mrt_epsilon: float = field(default=0.02, metadata={"help": "Minimum-risk training: epsilon of the sampling."})
    mrt_alpha: float = field(
        default=1.0, metadata={"help": "Minimum-risk training: sharpness of the renormalised sample distribution."}
    )
    token_budget: int = field(
        default=8192, metadata={"help": "Padded target tokens per log-probability pass (memory bound)."}
    )
    disable_dropout: bool = field(
        default=True, metadata={"help": "Run the loss passes in eval mode, as the reference values were made."}
    )
    check_reference: bool = field(
        default=True,
        metadata={"help": "Refuse a model whose log-probabilities differ from the folder's stored reference ones."},
    )
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: the trainer's batches are examples, not model inputs."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        PreferenceConfig(
            beta=self.beta,
            nll_weight=self.nll_weight,
            label_smoothing=self.label_smoothing,
            loss_type=self.loss_type,  # type: ignore[arg-type]
        )
        if self.loss_type not in PREFERENCE_LOSS_TYPES:  # (PreferenceConfig said so already)
            raise ValueError(f"loss_type must be one of {PREFERENCE_LOSS_TYPES}")
        for name in ("dpo_weight", "distill_weight", "mrt_weight", "reference_weight", "mrt_epsilon", "mrt_alpha"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"MBRTrainingConfig.{name} must be a finite number >= 0, got {value!r}")
        if not (self.dpo_weight or self.distill_weight or self.mrt_weight or self.reference_weight):
            raise ValueError(
                "MBRTrainingConfig: dpo_weight, distill_weight, mrt_weight and reference_weight are all 0: "
                "nothing to train"
            )
        if self.pairing not in READ_PAIRINGS:
            raise ValueError(f"MBRTrainingConfig.pairing must be one of {READ_PAIRINGS}, got {self.pairing!r}")
        if self.pair_selection not in PAIR_SELECTIONS:
            raise ValueError(
                f"MBRTrainingConfig.pair_selection must be one of {PAIR_SELECTIONS}, got {self.pair_selection!r}"
            )
        for name in ("pairs_per_source", "mrt_samples", "token_budget"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MBRTrainingConfig.{name} must be a positive int, got {value!r}")
        if not self.mrt_epsilon < 1:
            raise ValueError(f"MBRTrainingConfig.mrt_epsilon must lie in [0, 1), got {self.mrt_epsilon!r}")

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> MBRTrainingConfig:
        """The config of a YAML mapping of its fields (``HfArgumentParser``), ``overrides`` (e.g. a command
        line's ``output_dir``) on top. ``ValueError`` naming the file when the YAML is not a mapping, or when it or
        ``overrides`` name a field the class lacks."""
        settings = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        settings = {} if settings is None else settings
        if not isinstance(settings, dict):
            raise ValueError(f"{path}: expected a mapping of {cls.__name__} fields, got a {type(settings).__name__}")
        names = {f.name for f in fields(cls) if f.init}
        unknown = sorted({str(k) for k in [*settings, *overrides] if k not in names})
        if unknown:
            raise ValueError(f"{path}: unknown {cls.__name__} field(s): {', '.join(unknown)}")
        (config,) = HfArgumentParser(cls).parse_dict({**settings, **overrides})  # type: ignore[arg-type]
        return config


class MBRDataset(Dataset):
    """The :class:`~rerank.preference_data.MBRExample` s a trainer reads, one per source (a batch is a list)."""

    def __init__(self, examples: Sequence[MBRExample]) -> None:
        self.examples = list(examples)

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> MBRExample:
        return self.examples[i]

    @staticmethod
    def collate(examples: list[MBRExample]) -> dict[str, Any]:
        return {"examples": examples}

    @classmethod
    def from_references(
        cls, sources: Sequence[str], references: Sequence[str], tokenizer: Any, model: Any = None
    ) -> MBRDataset:
        """Sources with their reference translations, no MBR data: each example's target and reference are the
        reference, and it has no pairs. Enough for the trainer's minimum-risk and reference-NLL terms (its
        distillation term then trains on the references), so these need no :func:`rerank.build_mbr_data` run.
        Tokenised as :func:`rerank.read_mbr_examples` does (``tokenizer`` and ``model`` as there; sources over
        the model's positions cut, EOS kept)."""
        if len(sources) != len(references):
            raise ValueError(f"got {len(sources)} sources but {len(references)} references: one reference a source")
        codec = codec_from(tokenizer, model)
        ids, _ = _source_ids(codec, sources, model_positions(model) if model is not None else None, "truncate", 0)
        examples = []
        for index, (source, reference) in enumerate(zip(sources, references)):
            if not isinstance(reference, str):
                raise TypeError(f"references[{index}] is a {type(reference).__name__}, not a str")
            target = tuple(_target_ids(codec, reference))
            examples.append(MBRExample(index, source, tuple(ids[index]), reference, target, (), reference, target))
        return cls(examples)


@contextlib.contextmanager
def _eval_mode(module: torch.nn.Module, on: bool) -> Iterator[None]:
    """``module`` in eval mode (no dropout) with gradients kept, when ``on``; every submodule's mode restored."""
    if not on:
        yield
        return
    modes = {m: m.training for m in module.modules()}
    module.eval()
    try:
        yield
    finally:
        for m, mode in modes.items():
            m.training = mode


class MBRTrainer(Trainer):
    """``transformers.Trainer`` on MBR-ranked data (see the module docstring).

    ``model``: a Hugging Face encoder–decoder or causal LM, the weights training starts from (the reference).
    ``train_dataset`` / ``eval_dataset``: a folder built by :func:`rerank.build_mbr_data` (read with ``args``'
    pairing and selection) or an :class:`MBRDataset`. ``tokenizer``: the one the folder was built with (an HF
    tokenizer, a sentencepiece processor or a :class:`rerank.training_data.Codec`; passed to ``Trainer`` as
    ``processing_class`` when it is a Hugging Face tokenizer). ``references``: one reference per corpus source
    (the reference NLL and minimum-risk terms). ``risk``: a :class:`bertscore_loss.MinimumRiskLoss`
    (default: the bundled MiniLM's F, ``alpha=args.mrt_alpha``). Before training, missing reference
    log-probabilities are computed by ``model`` and, with ``args.check_reference``, its values of a few stored
    ones are checked.
    """

    args: MBRTrainingConfig

    def __init__(
        self,
        model: Any,
        args: MBRTrainingConfig,
        train_dataset: str | Path | MBRDataset,
        tokenizer: Any,
        *,
        eval_dataset: str | Path | MBRDataset | None = None,
        references: Sequence[str] | None = None,
        risk: MinimumRiskLoss | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, MBRTrainingConfig):
            raise TypeError(f"args must be an MBRTrainingConfig, got {type(args).__name__}")
        self.is_encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        if args.mrt_weight and not self.is_encoder_decoder:
            raise ValueError(
                "minimum-risk training (mrt_weight > 0) samples with rerank.sample_ids: encoder-decoders only"
            )
        self.codec = codec_from(tokenizer, model)
        if getattr(model.config, "model_type", None) == "marian":
            for name, param in model.named_parameters():
                if "embed_positions" in name:  # sinusoidal tables save_pretrained does not store: kept fixed
                    param.requires_grad_(False)
        train = self._dataset(model, train_dataset, tokenizer, args, references)
        evaluation = None if eval_dataset is None else self._dataset(model, eval_dataset, tokenizer, args, references)
        if args.reference_weight and any(e.reference_ids is None for e in train.examples):
            raise ValueError("reference_weight > 0 trains on reference translations: pass references=[...]")
        if not (args.distill_weight or args.mrt_weight or args.reference_weight):  # DPO alone: pairless sources idle
            train = MBRDataset([e for e in train.examples if e.pairs])
        if len(train) == 0:
            raise ValueError("the training data holds no example with a preference pair")
        self.preference = PreferenceLoss(
            beta=args.beta,
            nll_weight=args.nll_weight,
            label_smoothing=args.label_smoothing,
            loss_type=args.loss_type,  # type: ignore[arg-type]
        )
        self._risk = risk
        self._metrics: dict[str, dict[str, list[float]]] = {"train": defaultdict(list), "eval": defaultdict(list)}
        if hasattr(tokenizer, "save_pretrained"):  # saved with the model (Trainer before 4.46 names it tokenizer)
            key = (
                "processing_class"
                if "processing_class" in inspect.signature(Trainer.__init__).parameters
                else "tokenizer"
            )
            kwargs.setdefault(key, tokenizer)
        super().__init__(
            model=model,
            args=args,
            data_collator=MBRDataset.collate,
            train_dataset=train,
            eval_dataset=evaluation,
            **kwargs,
        )
        self.model_accepts_loss_kwargs = False  # the loss is a mean per micro-batch: Trainer scales it for accumulation

    @staticmethod
    def _dataset(
        model: Any,
        data: str | Path | MBRDataset,
        tokenizer: Any,
        args: MBRTrainingConfig,
        references: Sequence[str] | None,
    ) -> MBRDataset:
        if isinstance(data, MBRDataset):
            examples = data.examples
        elif isinstance(data, (str, Path)):
            examples = read_mbr_examples(
                data,
                tokenizer,
                model,
                pairing=args.pairing,
                pairs_per_source=args.pairs_per_source,
                selection=args.pair_selection,  # type: ignore[arg-type]
                seed=args.pair_seed,
                references=references,
            )
        else:
            raise TypeError(f"a dataset must be a folder built by rerank.build_mbr_data or an MBRDataset, got {data!r}")
        if args.check_reference:
            check_reference_model(model, examples, token_budget=args.token_budget)
        return MBRDataset(fill_reference_log_probs(model, examples, token_budget=args.token_budget))

    @property
    def risk(self) -> MinimumRiskLoss:
        """The minimum-risk loss (built on first use: the bundled MiniLM's F)."""
        if self._risk is None:
            self._risk = MinimumRiskLoss(alpha=self.args.mrt_alpha)
        return self._risk

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Tensor | int | None = None,
    ) -> Tensor | tuple[Tensor, Any]:
        """The loss of a batch ``{"examples": [...]}`` (see the module docstring); logs its terms."""
        mode = "train" if model.training else "eval"
        with _eval_mode(model, self.args.disable_dropout):
            loss, metrics = self.mbr_loss(model, inputs["examples"])
        for key, value in metrics.items():
            self._metrics[mode][key].append(value)
        return (loss, {}) if return_outputs else loss

    def mbr_loss(self, model: torch.nn.Module, examples: Sequence[MBRExample]) -> tuple[Tensor, dict[str, float]]:
        """The loss (scalar) and its logged terms over ``examples``, with ``model`` in the mode it is in."""
        args = self.args
        model = self.accelerator.unwrap_model(model)  # its config and encoder; one process holds the whole model
        device = next(model.parameters()).device
        sources = [list(e.prompt_ids) for e in examples]
        pairs = [(s, p) for s, e in enumerate(examples) for p in e.pairs] if args.dpo_weight else []
        targets = [list(p.chosen_ids) for _, p in pairs] + [list(p.rejected_ids) for _, p in pairs]
        owners = [s for s, _ in pairs] * 2
        if args.distill_weight:
            targets += [list(e.target_ids) for e in examples]
            owners += list(range(len(examples)))
        if args.reference_weight:
            targets += [list(e.reference_ids or ()) for e in examples]
            owners += list(range(len(examples)))
        lp = target_log_probs(model, sources, targets, owners, token_budget=args.token_budget)
        loss = lp.new_zeros(())
        metrics: dict[str, float] = {}
        m = len(pairs)
        if m:
            ref_c = torch.tensor([p.ref_chosen_logp for _, p in pairs], device=device, dtype=torch.float32)
            ref_r = torch.tensor([p.ref_rejected_logp for _, p in pairs], device=device, dtype=torch.float32)
            n_w = torch.tensor([len(p.chosen_ids) for _, p in pairs], device=device)
            n_l = torch.tensor([len(p.rejected_ids) for _, p in pairs], device=device)
            pref = self.preference(lp[:m], lp[m : 2 * m], ref_c, ref_r, chosen_lengths=n_w, rejected_lengths=n_l)
            loss = loss + args.dpo_weight * pref.loss
            metrics.update(
                {
                    "dpo": float(pref.dpo.detach()),
                    "rewards/chosen": float(pref.chosen_rewards.mean()),
                    "rewards/rejected": float(pref.rejected_rewards.mean()),
                    "rewards/margins": float(pref.margins.mean()),
                    "rewards/accuracies": float(pref.reward_accuracy),
                    "logps/chosen": float(pref.chosen_logps.mean()),
                    "logps/rejected": float(pref.rejected_logps.mean()),
                }
            )
            if pref.nll is not None:
                metrics["nll"] = float(pref.nll.detach())
        start = 2 * m
        if args.distill_weight:
            tokens = sum(len(e.target_ids) for e in examples)
            distill = -lp[start : start + len(examples)].sum() / tokens
            loss = loss + args.distill_weight * distill
            metrics["distill_nll"] = float(distill.detach())
            start += len(examples)
        if args.reference_weight:
            tokens = sum(len(e.reference_ids or ()) for e in examples)
            reference = -lp[start : start + len(examples)].sum() / tokens
            loss = loss + args.reference_weight * reference
            metrics["reference_nll"] = float(reference.detach())
        if args.mrt_weight:
            risk = self.risk_term(model, examples)
            loss = loss + args.mrt_weight * risk
            metrics["mrt_risk"] = float(risk.detach())
        return loss, metrics

    def risk_term(self, model: torch.nn.Module, examples: Sequence[MBRExample]) -> Tensor:
        """The expected risk of ``mrt_samples`` epsilon samples per source (drawn in eval mode, without gradients,
        seeded by ``seed`` and the update); log-probabilities only of the distinct samples of rows with two or more."""
        args, k = self.args, self.args.mrt_samples
        unwrapped = self.accelerator.unwrap_model(model)
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            drawn = sample_ids(
                unwrapped,
                [list(e.prompt_ids) for e in examples],
                SamplingConfig(
                    num_samples=k,
                    epsilon=args.mrt_epsilon,
                    precision="32",
                    seed=1_000_003 * args.seed + self.state.global_step,
                    progress=False,
                ),
            )
        finally:
            unwrapped.train(was_training)
        eos = int(unwrapped.config.eos_token_id)
        texts = [[self.codec.decode(ids) for ids in row] for row in drawn.sequences]
        present = distinct_candidates(texts, k)
        need = present & (present.sum(dim=1, keepdim=True) > 1)
        cells = need.nonzero().tolist()
        log_probs = torch.zeros(len(examples), k, device=next(model.parameters()).device)
        if cells:
            values = target_log_probs(
                model,
                [list(e.prompt_ids) for e in examples],
                [[*drawn.sequences[b][j], eos] for b, j in cells],
                [b for b, _ in cells],
                token_budget=args.token_budget,
            )
            rows = torch.tensor([b for b, _ in cells], device=values.device)
            cols = torch.tensor([j for _, j in cells], device=values.device)
            log_probs = log_probs.index_put((rows, cols), values)
        refs = [e.reference if e.reference is not None else e.target for e in examples]
        return self.risk(log_probs, texts, refs).loss

    def prediction_step(
        self,
        model: torch.nn.Module,
        inputs: dict[str, Any],
        prediction_loss_only: bool,
        ignore_keys: list[str] | None = None,
    ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
        with torch.no_grad():
            loss = self.compute_loss(model, inputs)
        assert isinstance(loss, Tensor)
        return loss.detach(), None, None

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``Trainer.log`` with the means of the loss terms since the last log (``eval_`` prefixed in evaluation)."""
        mode = "eval" if any(k.startswith("eval_") for k in logs) else "train"
        means = {k: sum(v) / len(v) for k, v in self._metrics[mode].items() if v}
        if mode == "eval":
            means = {f"eval_{k}": v for k, v in means.items()}
        logs = {**logs, **means}
        self._metrics[mode].clear()
        if start_time is None:
            super().log(logs)
        else:  # Trainer from 4.47 on
            super().log(logs, start_time)
