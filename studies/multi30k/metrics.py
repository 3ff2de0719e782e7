"""Scores the recipe reports: sacreBLEU, chrF, BERTScore F (bundled MiniLM, default layer) and length ratio,
with paired bootstrap resampling of a system against a baseline; optionally the BERTScore F of an independent
judge, all-mpnet-base-v2 at its tuned layer (the ``accurate`` extra), which fine-tuning on MiniLM's F does not
optimise."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
import sacrebleu
from sacrebleu.significance import PairedTest

from bertscore_loss import BERTScorer
from rerank.significance import paired_bootstrap_scores

BOOTSTRAP_SAMPLES = 1000
SEED = 12345  # sacrebleu's default seed: BERTScore uses the same resampling


@lru_cache(maxsize=1)
def scorer() -> BERTScorer:
    """The reporting scorer: bundled all-MiniLM-L6-v2 at its default layer, fp32, no IDF, no rescaling."""
    return BERTScorer()


def sentence_bertscore(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """BERTScore F ×100 of every sentence ``[N]``."""
    return scorer().score(list(hyps), list(refs))[2].double().numpy() * 100


@lru_cache(maxsize=1)
def judge() -> BERTScorer:
    """The independent judge: all-mpnet-base-v2 (``BERTScorer(model="mpnet")``), its tuned layer, fp32."""
    return BERTScorer(model="mpnet")


def sentence_judge(hyps: Sequence[str], refs: Sequence[str]) -> np.ndarray:
    """The judge's BERTScore F ×100 of every sentence ``[N]``."""
    return judge().score(list(hyps), list(refs))[2].double().numpy() * 100


def corpus_scores(hyps: Sequence[str], refs: Sequence[str], *, with_judge: bool = False) -> dict:
    """BLEU, chrF, BERTScore F (×100), length ratio; ``with_judge``: also ``judge_f`` (mpnet's F ×100)."""
    bleu = sacrebleu.corpus_bleu(list(hyps), [list(refs)])
    out = {
        "bleu": bleu.score,
        "chrf": sacrebleu.corpus_chrf(list(hyps), [list(refs)]).score,
        "bertscore_f": float(sentence_bertscore(hyps, refs).mean()),
        "length_ratio": bleu.sys_len / max(1, bleu.ref_len),
    }
    if with_judge:
        out["judge_f"] = float(sentence_judge(hyps, refs).mean())
    return out


def universal_screen(hyps: Sequence[str], refs: Sequence[str], *, draws: int = 8, top: int = 5, seed: int = 0) -> dict:
    """The "universal output" screen of metric gaming: every hypothesis scored (MiniLM F ×100) against the
    references of ``draws`` other sentences, drawn at random (draw ``d`` pairs sentence ``i`` with
    ``(i + offset_d) mod N``, offsets distinct in ``1 … N-1``, so never with its own). A model that learned
    outputs the metric likes whatever the reference says scores high there and shrinks the gap.

    Returns ``matched_f`` (against the own references), ``random_f`` (mean over the draws), ``gap`` (their
    difference), ``offsets`` and ``top``: the ``top`` hypotheses with the highest mean random-reference F."""
    n = len(hyps)
    if n != len(refs) or n < 2:
        raise ValueError(f"need as many hypotheses as references, at least 2: got {n} and {len(refs)}")
    draws = min(draws, n - 1)
    offsets = np.random.default_rng(seed).choice(np.arange(1, n), size=draws, replace=False)
    shifted = [refs[(i + int(o)) % n] for o in offsets for i in range(n)]
    random_f = sentence_bertscore(list(hyps) * draws, shifted).reshape(draws, n).mean(axis=0)
    matched = sentence_bertscore(hyps, refs)
    order = np.argsort(-random_f, kind="stable")[:top]
    return {
        "matched_f": float(matched.mean()),
        "random_f": float(random_f.mean()),
        "gap": float(matched.mean() - random_f.mean()),
        "draws": draws,
        "offsets": [int(o) for o in offsets],
        "top": [{"line": int(i) + 1, "hypothesis": hyps[i], "random_f": float(random_f[i])} for i in order],
    }


def paired_bootstrap(
    baseline: Sequence[str], system: Sequence[str], refs: Sequence[str], *, with_judge: bool = False
) -> dict:
    """p-values of ``system`` vs ``baseline``: sacrebleu's paired bootstrap for BLEU and chrF, and the same
    resampling (same seed, same indices, same statistic: :func:`rerank.paired_bootstrap_scores`) over sentence
    BERTScore F (and the judge's F), with their mean differences (``bertscore_delta``, ``judge_delta``: system
    minus baseline, F × 100)."""
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": sacrebleu.BLEU(), "chrF": sacrebleu.CHRF()},
        [list(refs)],
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    _, results = test()
    out = {"bleu_p": results["BLEU"][1].p_value, "chrf_p": results["chrF2"][1].p_value}  # sacrebleu names it chrF2
    sentence = {"bertscore_p": sentence_bertscore}
    if with_judge:
        sentence["judge_p"] = sentence_judge
    for key, fn in sentence.items():
        test = paired_bootstrap_scores(fn(baseline, refs), fn(system, refs), n_samples=BOOTSTRAP_SAMPLES, seed=SEED)
        out[key] = test.p_value
        out[key.replace("_p", "_delta")] = test.delta
    return out
