"""``rerank.paired_bootstrap``: the p-value, interval and means by hand on a small case, any registry utility,
errors. (The Multi30k study's reported p-values are this test: studies/multi30k/tests/test_metrics.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from rerank import paired_bootstrap
from rerank.significance import paired_bootstrap_scores, sentence_scores


def test_scores_by_hand():
    base = [0.1, 0.5, 0.2, 0.9, 0.4]
    system = [0.3, 0.5, 0.6, 0.8, 0.7]
    got = paired_bootstrap_scores(base, system, n_samples=7, seed=3, metric="toy", signature="toy-utility")
    idx = np.random.default_rng(3).choice(5, size=(7, 5), replace=True)
    deltas = [np.mean([system[i] for i in row]) - np.mean([base[i] for i in row]) for row in idx]
    abs_d = [abs(d) for d in deltas]
    centred = [d - sum(abs_d) / 7 for d in abs_d]
    observed = abs(np.mean(system) - np.mean(base))  # 0.16
    assert got.p_value == pytest.approx((sum(c > observed for c in centred) + 1) / 8)
    assert (
        got.delta == pytest.approx(0.16) and got.baseline == pytest.approx(0.42) and got.system == pytest.approx(0.58)
    )
    assert got.ci == pytest.approx(tuple(np.percentile(deltas, [2.5, 97.5])))
    assert got.signature.startswith("test:paired-bs|n:5|bs:7|seed:3|version:") and got.signature.endswith(
        "|utility:toy-utility"
    )
    assert "toy: system 0.5800 vs baseline 0.4200" in str(got)


def test_no_gain_is_not_significant_and_a_clear_gain_is():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.6, 0.9, size=200)
    noise = rng.normal(0.0, 0.05, size=200)
    assert paired_bootstrap_scores(base, base + noise - noise.mean()).p_value > 0.3  # observed delta 0
    better = paired_bootstrap_scores(base, base + rng.uniform(0.01, 0.05, size=200))
    assert better.p_value == pytest.approx(1 / 1001) and better.ci[0] > 0


REFS = [
    "A man rides a bike down a hill.",
    "Two dogs run on the grass.",
    "A woman is reading a book in the park.",
    "Children play football in the street.",
    "A little girl climbs into a wooden playhouse.",
    "Several men in hard hats operate a machine.",
    "A boy jumps into the water.",
    "Two young men are outside near some bushes.",
]
BASE = [
    "A man on a bike.",
    "Two dogs are running.",
    "A woman reads.",
    "Kids play a ball game.",
    "A girl climbs into a house.",
    "Men in helmets work a machine.",
    "A boy in water.",
    "Two men outside.",
]
SYSTEM = [
    "A man rides a bike down the hill.",
    "Two dogs run on grass.",
    "A woman is reading a book in a park.",
    "Children play football on the street.",
    "A little girl climbs into a playhouse of wood.",
    "Several men in hard hats operate a machine.",
    "A boy jumps in the water.",
    "Two young men are outdoors near bushes.",
]


def test_any_registry_utility_and_several_references():
    import sacrebleu

    got = sentence_scores(SYSTEM, REFS, "chrf")
    want = [sacrebleu.sentence_chrf(h, [r]).score for h, r in zip(SYSTEM, REFS)]  # chrF in 0..100
    np.testing.assert_allclose(got, want, atol=1e-9)
    multi = sentence_scores(BASE, [[r, s] for r, s in zip(REFS, SYSTEM)], "chrf")  # the better reference counts
    best = [max(a, b) for a, b in zip(sentence_scores(BASE, REFS, "chrf"), sentence_scores(BASE, SYSTEM, "chrf"))]
    np.testing.assert_allclose(multi, best, atol=1e-12)

    def overlap(hyps, refs):
        return np.array([[len(set(h.split()) & set(r.split())) / len(set(r.split())) for r in refs] for h in hyps])

    result = paired_bootstrap(BASE, SYSTEM, REFS, utility=overlap, n_samples=200)
    assert result.delta > 0 and result.n_samples == 200 and 0 < result.p_value <= 1


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="must align"):
        paired_bootstrap_scores([0.1, 0.2], [0.3])
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap_scores([0.1, float("nan")], [0.3, 0.2])
    with pytest.raises(ValueError, match="non-empty"):
        paired_bootstrap_scores([], [])
    with pytest.raises(ValueError, match="n_samples"):
        paired_bootstrap_scores([0.1], [0.2], n_samples=0)
    with pytest.raises(ValueError, match="must align"):
        paired_bootstrap(BASE, SYSTEM[:3], REFS, utility="chrf")
    with pytest.raises(ValueError, match="one reference"):
        paired_bootstrap(BASE, SYSTEM, REFS[:3], utility="chrf")
