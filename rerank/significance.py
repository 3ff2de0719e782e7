"""Paired significance of a system against a baseline, for BERTScore and any sentence-level utility.

:func:`paired_bootstrap` is sacrebleu's paired bootstrap resampling (Koehn, 2004, as ``sacrebleu
--paired-bs``) over sentence scores: ``n_samples`` resamplings of the test set with replacement
(``numpy.random.default_rng(seed).choice``; seed 12345, sacrebleu's default), the mean score of each system
on each; the p-value is ``(#{resampled |Δ| − mean resampled |Δ| > observed |Δ|} + 1) / (n_samples + 1)``, the
probability of a difference as large as the observed one if the systems were equal. Any registered utility
(``"bertscore"``, ``"chrf"``, ``"bleu"``, a callable) scores the sentences (the mean of sentence chrF or BLEU
is not the corpus statistic: for those use sacrebleu's own test). The result carries a signature that names
the test and the utility, as sacrebleu's does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertscore_loss import __version__

from .registry import UtilityLike, get_utility

__all__ = [
    "BOOTSTRAP_SAMPLES",
    "BOOTSTRAP_SEED",
    "PairedBootstrapResult",
    "paired_bootstrap",
    "paired_bootstrap_scores",
]

BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default


@dataclass(frozen=True)
class PairedBootstrapResult:
    """``baseline``, ``system``: mean sentence scores; ``delta``: system − baseline; ``p_value``; ``ci``: the
    95 % interval of the resampled delta; ``n``: sentences; ``signature``: what determines the numbers."""

    metric: str
    baseline: float
    system: float
    delta: float
    p_value: float
    ci: tuple[float, float]
    n: int
    n_samples: int
    seed: int
    signature: str

    def __str__(self) -> str:
        return (
            f"{self.metric}: system {self.system:.4f} vs baseline {self.baseline:.4f} (Δ {self.delta:+.4f}, 95% CI "
            f"[{self.ci[0]:+.4f}, {self.ci[1]:+.4f}]), p = {self.p_value:.4f} | {self.signature}"
        )


def _scores(name: str, values: Any) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.size == 0:
        raise ValueError(f"{name} must be a non-empty list of sentence scores [N], got shape {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} holds NaN or ±inf")
    return array


def paired_bootstrap_scores(
    baseline: Sequence[float] | np.ndarray,
    system: Sequence[float] | np.ndarray,
    *,
    n_samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
    metric: str = "score",
    signature: str | None = None,
) -> PairedBootstrapResult:
    """The paired bootstrap of two systems' sentence scores ``[N]`` (aligned: sentence ``i`` of each)."""
    base, sys_ = _scores("baseline", baseline), _scores("system", system)
    if base.shape != sys_.shape:
        raise ValueError(f"baseline and system hold {base.size} and {sys_.size} sentence scores: they must align")
    if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
        raise ValueError(f"n_samples must be a positive int, got {n_samples!r}")
    n = base.size
    idx = np.random.default_rng(seed).choice(n, size=(n_samples, n), replace=True)
    resampled = sys_[idx].mean(1) - base[idx].mean(1)  # [n_samples]
    diffs = np.abs(resampled)
    observed = abs(float(sys_.mean() - base.mean()))
    p = (int(np.sum(diffs - diffs.mean() > observed)) + 1) / (n_samples + 1)
    low, high = np.percentile(resampled, [2.5, 97.5])
    test = f"test:paired-bs|n:{n}|bs:{n_samples}|seed:{seed}|version:{__version__}"
    return PairedBootstrapResult(
        metric=metric,
        baseline=float(base.mean()),
        system=float(sys_.mean()),
        delta=float(sys_.mean() - base.mean()),
        p_value=p,
        ci=(float(low), float(high)),
        n=n,
        n_samples=n_samples,
        seed=seed,
        signature=f"{test}|utility:{signature}" if signature else test,
    )


def sentence_scores(
    hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]], utility: UtilityLike = "bertscore"
) -> np.ndarray:
    """The utility of each hypothesis against its reference(s) ``[N]`` (float64; several references: the best),
    in one utility session (BERTScore embeds every text once)."""
    hyps = list(hypotheses)
    refs = [[r] if isinstance(r, str) else list(dict.fromkeys(r)) for r in references]
    if len(hyps) != len(refs):
        raise ValueError(f"{len(hyps)} hypotheses but {len(refs)} references: one reference (or list) per sentence")
    if any(not isinstance(h, str) for h in hyps) or any(not r or not all(isinstance(t, str) for t in r) for r in refs):
        raise ValueError("hypotheses must be strings and every sentence needs at least one reference string")
    util = get_utility(utility)
    matrices = util.session([[h] for h in hyps], refs).full(list(range(len(hyps))))
    return np.array([float(m.max()) for m in matrices], dtype=np.float64)


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    *,
    utility: UtilityLike = "bertscore",
    n_samples: int = BOOTSTRAP_SAMPLES,
    seed: int = BOOTSTRAP_SEED,
) -> PairedBootstrapResult:
    """Is ``system`` better than ``baseline`` on ``references``? The paired bootstrap (module docstring) over
    the sentence scores of ``utility`` (a registered name, a :class:`rerank.Utility` or a callable; BERTScore
    F of the bundled MiniLM by default). Outputs align with the references, sentence by sentence."""
    if len(baseline) != len(system):
        raise ValueError(f"baseline and system hold {len(baseline)} and {len(system)} outputs: they must align")
    util = get_utility(utility)
    return paired_bootstrap_scores(
        sentence_scores(baseline, references, util),
        sentence_scores(system, references, util),
        n_samples=n_samples,
        seed=seed,
        metric=util.name,
        signature=util.signature(),
    )
