"""Scores the recipe reports: sacreBLEU, chrF, BERTScore F (bundled MiniLM, default layer) and length ratio,
with paired bootstrap resampling of a system against a baseline."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import sacrebleu
from sacrebleu.significance import PairedTest

from bertscore_loss import BERTScorer

BOOTSTRAP_SAMPLES = 1000
SEED = 12345  # sacrebleu's default seed: BERTScore uses the same resampling


@lru_cache(maxsize=1)
def scorer() -> BERTScorer:
    """The reporting scorer: bundled all-MiniLM-L6-v2 at its default layer, fp32, no IDF, no rescaling."""
    return BERTScorer()


def sentence_bertscore(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """BERTScore F ×100 of every sentence ``[N]``."""
    return scorer().score(list(hyps), list(refs))[2].double().numpy() * 100


def corpus_scores(hyps: Sequence[str], refs: Sequence[str]) -> dict:
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)])
    return {
        "bleu": bleu.score,
        "chrf": sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score,
        "bertscore_f": float(sentence_bertscore(hyps, refs).mean()),
        "length_ratio": bleu.sys_len / max(1, bleu.ref_len),
    }


def _p_value(sample_diffs: np.ndarray, real_diff: float) -> float:
    """sacrebleu's paired-bootstrap p-value: centred |differences| that exceed the observed one, +1 smoothed."""
    stats = sample_diffs - sample_diffs.mean()
    return (int(np.sum(stats > real_diff)) + 1) / (len(stats) + 1)


def paired_bootstrap(baseline: Sequence[str], system: Sequence[str], refs: Sequence[str]) -> dict:
    """p-values of ``system`` vs ``baseline``: sacrebleu's paired bootstrap for BLEU and chrF, and the same
    resampling (same seed, same indices, same statistic) over sentence BERTScore F."""
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": sacrebleu.BLEU(), "chrF": sacrebleu.CHRF()},
        [list(refs)],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, results = test()
    out = {"bleu_p": results["BLEU"][1].p_value, "chrf_p": results["chrF2"][1].p_value}  # sacrebleu names it chrF2
    base, sys_ = sentence_bertscore(baseline, refs), sentence_bertscore(system, refs)
    idx = np.random.default_rng(SEED).choice(len(base), size=(BOOTSTRAP_SAMPLES, len(base)), replace=True)
    diffs = np.abs(sys_[idx].mean(1) - base[idx].mean(1))
    out["bertscore_p"] = _p_value(diffs, abs(sys_.mean() - base.mean()))
    return out
