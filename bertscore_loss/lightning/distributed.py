"""Scoring a big corpus across processes and nodes with Lightning (``Trainer.predict`` under DDP).

Pairs are dealt to ranks by index (no padding, no duplicates: :class:`ShardSampler`), each rank scores its
shard with :meth:`BERTScorer.score`, and global rank 0 gathers ``(index, P, R, F)`` and puts the scores
back in input order, so the result equals one process's ``BERTScorer.score(cands, refs)``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler

from ..config import ScorerConfig
from ..registry import encoder_on
from ..scorer import PRF, BERTScorer
from ..validation import check_pairs
from .metric import idf_sentences

logger = logging.getLogger(__name__)

_LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric")


def shard_indices(n: int, rank: int, world_size: int, order: Sequence[int] | None = None) -> list[int]:
    """Indices of rank ``rank``: ``order[rank::world_size]`` (``order`` defaults to ``range(n)``).

    Every index goes to exactly one rank; shard sizes differ by at most one (nothing is padded).
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, {world_size}) and world_size be >= 1, got rank={rank}")
    order = list(range(n)) if order is None else list(order)
    return order[rank::world_size]


class ShardSampler(Sampler[list[int]]):
    """Batches of this rank's pair indices, at most ``batch_size`` each; unlike ``DistributedSampler`` it
    neither pads nor repeats. A rank without pairs gets one empty batch, so all ranks run the same hooks.
    """

    def __init__(self, indices: Sequence[int], batch_size: int) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.indices = list(indices)
        self.batch_size = int(batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        if not self.indices:
            yield []
            return
        for start in range(0, len(self.indices), self.batch_size):
            yield self.indices[start : start + self.batch_size]

    def __len__(self) -> int:
        return max(1, math.ceil(len(self.indices) / self.batch_size))


class _Positions(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def _collate(batch: list[int]) -> Tensor:
    return torch.tensor(batch, dtype=torch.long)


class DistributedScores(NamedTuple):
    """Scores ``[N]`` in input order (``precision``, ``recall``, ``f1`` as in :class:`~bertscore_loss.PRF`)
    and the scorer's signature."""

    precision: Tensor
    recall: Tensor
    f1: Tensor
    signature: str


class PairScoringModule(pl.LightningModule):
    """A parameter-free LightningModule that scores its shard of ``(cands[i], refs[i])`` in ``predict_step``.

    ``refs``: one list of references per candidate. IDF (when ``config.idf``) is fixed before scoring from
    ``idf_corpus``, by default all references (duplicates counted), exactly as one ``BERTScorer.score``
    call over the whole corpus computes it.
    """

    def __init__(
        self,
        cands: list[str],
        refs: list[list[str]],
        config: ScorerConfig,
        *,
        idf_corpus: list[str] | None = None,
        batch_pairs: int = 512,
        out_path: str | None = None,
        forked: bool = False,
    ) -> None:
        super().__init__()
        self.cands = cands
        self.refs = refs
        self.config = config
        self.idf_corpus = idf_corpus
        self.batch_pairs = batch_pairs
        self.out_path = out_path
        self.result: DistributedScores | None = None
        self._scorer: BERTScorer | None = None
        self._local: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []
        self.forked = forked

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_scorer"] = None  # never pickle an encoder into spawned workers
        return state

    def get_scorer(self) -> BERTScorer:
        if self._scorer is None:
            c = self.config
            # every encoder setting of the config (long_inputs and window_stride included) keys the encoder
            scorer = BERTScorer(c, encoder=encoder_on(c, self.device))
            if c.idf:
                if self.idf_corpus is not None:
                    scorer.set_idf_corpus(self.idf_corpus)
                else:  # over the references, as in one score() call
                    scorer.set_idf_corpus([r for g in self.refs for r in g], description="refs")
            self._scorer = scorer
        return self._scorer

    def setup(self, stage: str) -> None:
        # Our ShardSampler returns every index exactly once; Lightning cannot know that about a custom sampler.
        warnings.filterwarnings("ignore", message=r".*custom batch sampler `ShardSampler`.*")
        if self.forked and self.device.type == "cpu":
            # A forked child that starts OpenMP threads after its parent used them hangs (GNU libgomp):
            # forked CPU ranks run single-threaded.
            torch.set_num_threads(1)

    def predict_dataloader(self) -> DataLoader:
        n = len(self.cands)
        # Deal pairs round-robin in length order: ranks get similar amounts of work, and each predict step
        # gets pairs of similar lengths (less padding). The index carried with each score restores the order.
        order = sorted(range(n), key=lambda i: len(self.cands[i]) + sum(len(r) for r in self.refs[i]))
        mine = shard_indices(n, self.global_rank, self.trainer.world_size, order)
        return DataLoader(_Positions(n), batch_sampler=ShardSampler(mine, self.batch_pairs), collate_fn=_collate)

    def on_predict_epoch_start(self) -> None:
        self._local = []
        self.get_scorer()

    def predict_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        idx = batch.tolist()
        if idx:
            p, r, f = self.get_scorer().score([self.cands[i] for i in idx], [self.refs[i] for i in idx])
            self._local.append((batch.cpu(), p, r, f))
        return batch

    def on_predict_epoch_end(self) -> None:
        if self._local:
            local = tuple(torch.cat(x) for x in zip(*self._local))
        else:
            local = (torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.zeros(0), torch.zeros(0))
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            parts: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
            dist.gather_object(local, parts, dst=0)  # only global rank 0 needs the scores
        else:
            parts = [local]
        self._local = []
        if self.global_rank != 0:
            return
        assert parts is not None, "rank 0 receives the gathered parts"
        index = torch.cat([p[0] for p in parts])
        n = len(self.cands)
        if index.numel() != n or not torch.equal(torch.sort(index).values, torch.arange(n)):
            raise RuntimeError(f"distributed scoring returned {index.numel()} scores for {n} pairs")
        out = torch.zeros((3, n))
        for k in range(3):
            out[k, index] = torch.cat([p[k + 1] for p in parts])
        self.result = DistributedScores(out[0], out[1], out[2], str(self.get_scorer().signature()))
        if self.out_path is not None:
            torch.save(self.result._asdict(), self.out_path)


def _externally_launched() -> bool:
    """True under torchrun / torchelastic or a SLURM job step: the processes already exist."""
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    return TorchElasticEnvironment.detect() or SLURMEnvironment.detect()


@contextmanager
def _quiet_lightning(verbose: bool) -> Iterator[None]:
    """Keep Lightning's start-up messages ("GPU available: ...") off the output unless ``verbose``."""
    if verbose:
        yield
        return
    saved = {}
    for name in _LIGHTNING_LOGGERS:
        log = logging.getLogger(name)
        saved[name] = log.level
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def score_distributed_full(
    cands: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    config: ScorerConfig | Mapping[str, Any] | None = None,
    *,
    devices: int = 2,
    num_nodes: int = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
    batch_pairs: int = 512,
    idf_corpus: str | os.PathLike | Sequence[str] | None = None,
    progress: bool = False,
    verbose: bool = False,
) -> DistributedScores | None:
    """Like :func:`score_distributed`, also giving the signature; None on processes other than global rank 0."""
    cands, groups = check_pairs(cands, refs)
    if isinstance(config, Mapping):
        config = ScorerConfig(**config)
    config = dataclasses.replace(config or ScorerConfig(), device=None, progress=False).validate()
    if devices < 1 or num_nodes < 1:
        raise ValueError(f"devices and num_nodes must be >= 1, got devices={devices}, num_nodes={num_nodes}")
    if batch_pairs < 1:
        raise ValueError(f"batch_pairs must be >= 1, got {batch_pairs}")
    if accelerator not in ("cpu", "gpu", "cuda", "auto"):
        raise ValueError(f"accelerator must be 'cpu', 'gpu' or 'auto', got {accelerator!r}")
    if idf_corpus is not None and not config.idf:
        raise ValueError("idf_corpus is given but idf is off: set idf=True in the config")
    corpus = idf_sentences(idf_corpus) if idf_corpus is not None else None
    if strategy == "auto":
        strategy = "ddp" if _externally_launched() else "ddp_spawn"
    if strategy not in ("ddp", "ddp_spawn", "ddp_fork"):
        raise ValueError(f"strategy must be 'auto', 'ddp', 'ddp_spawn' or 'ddp_fork', got {strategy!r}")
    if devices * num_nodes == 1:
        strategy = "auto"

    with tempfile.TemporaryDirectory(prefix="bertscore-ddp-") as tmp:
        out_path = str(Path(tmp) / "scores.pt") if strategy in ("ddp_spawn", "ddp_fork") else None
        module = PairScoringModule(
            cands,
            groups,
            config,
            idf_corpus=corpus,
            batch_pairs=batch_pairs,
            out_path=out_path,
            forked=strategy == "ddp_fork",
        )
        with _quiet_lightning(verbose):
            trainer = pl.Trainer(
                accelerator=accelerator,
                devices=devices,
                num_nodes=num_nodes,
                strategy=strategy,
                logger=False,
                enable_checkpointing=False,
                enable_model_summary=False,
                enable_progress_bar=progress,
                use_distributed_sampler=False,
                inference_mode=True,
            )
            trainer.predict(module, return_predictions=False)
        if out_path is not None:
            if not os.path.exists(out_path):
                return None  # this node does not hold global rank 0
            return DistributedScores(**torch.load(out_path, weights_only=False))
        return module.result


def score_distributed(
    cands: Sequence[str],
    refs: Sequence[str] | Sequence[Sequence[str]],
    config: ScorerConfig | Mapping[str, Any] | None = None,
    *,
    devices: int = 2,
    num_nodes: int = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
    batch_pairs: int = 512,
    idf_corpus: str | os.PathLike | Sequence[str] | None = None,
    progress: bool = False,
    verbose: bool = False,
) -> PRF | None:
    """P, R, F ``[N]`` of every pair, in input order, scored by ``devices × num_nodes`` processes.

    Equal to ``BERTScorer(config).score(cands, refs)`` (up to float rounding from batch composition)
    for any N, including N not divisible by the world size. ``config``: a :class:`ScorerConfig` or its
    fields as a dict (``device`` is ignored: each rank uses its own). IDF, when on, is over all
    references (or ``idf_corpus``), never per shard.

    ``strategy="auto"``: ``"ddp"`` when the processes were launched outside (torchrun, SLURM), else
    ``"ddp_spawn"``, which works from any Python process (scripts, notebooks, tests) at the price of
    re-importing torch and the model in each new process. ``"ddp_fork"`` starts in about a second (the
    workers inherit the loaded encoder) but CPU ranks then run single-threaded (a forked child that starts
    OpenMP threads after its parent used them hangs), so use it with ``devices`` near the core count.
    ``"ddp"`` launched from a plain script re-runs that script for the other ranks.
    Returns None on processes other than global rank 0 (only with ``"ddp"``, where every process runs
    the caller's code).
    """
    out = score_distributed_full(
        cands,
        refs,
        config,
        devices=devices,
        num_nodes=num_nodes,
        accelerator=accelerator,
        strategy=strategy,
        batch_pairs=batch_pairs,
        idf_corpus=idf_corpus,
        progress=progress,
        verbose=verbose,
    )
    return None if out is None else PRF(out.precision, out.recall, out.f1)
