"""The study's reported p-values (``metrics.paired_bootstrap``) are the library's paired bootstrap: sentence
BERTScore F of the bundled MiniLM ×100, seed 12345, 1000 resamplings, the same as
:func:`rerank.paired_bootstrap` on the same outputs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rerank import paired_bootstrap
from rerank.significance import BOOTSTRAP_SEED, PairedBootstrapResult

RECIPE = Path(__file__).resolve().parents[1]


def _study_metrics():
    sys.path.insert(0, str(RECIPE))
    spec = importlib.util.spec_from_file_location("metrics", RECIPE / "metrics.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["metrics"] = module
    spec.loader.exec_module(module)
    return module


from tests.test_significance import BASE, REFS, SYSTEM  # noqa: E402  (the same sentences as the library's test)


@pytest.mark.slow
def test_reported_bertscore_p_value_is_the_librarys_paired_bootstrap():
    """The study's ``metrics.paired_bootstrap`` (sentence BERTScore F of the bundled MiniLM, ×100, seed 12345,
    1000 resamplings) and ours on the same outputs give the same p-value."""
    metrics = _study_metrics()
    study = metrics.paired_bootstrap(BASE, SYSTEM, REFS)
    ours = paired_bootstrap(BASE, SYSTEM, REFS)
    assert isinstance(ours, PairedBootstrapResult) and ours.seed == BOOTSTRAP_SEED == metrics.SEED
    assert ours.p_value == pytest.approx(study["bertscore_p"], abs=1e-12)
    want = metrics.sentence_bertscore(SYSTEM, REFS).mean() - metrics.sentence_bertscore(BASE, REFS).mean()
    assert ours.delta * 100 == pytest.approx(want, abs=1e-4)
    assert ours.delta > 0 and ours.metric == "bertscore" and "|utility:bertscore-loss:" in ours.signature


def test_universal_screen_scores_each_hypothesis_against_other_references():
    """Hand check of the screen on real sentences: random_f is the mean F against the drawn others' references
    (never the own), matched_f the F against the own; a constant output has a small gap, a faithful one a
    large gap."""
    metrics = _study_metrics()
    refs = [
        "A man is riding a bicycle down the street.",
        "Two dogs play in the snow.",
        "A woman is cooking dinner in a kitchen.",
        "Children are swimming in a pool.",
    ]
    screen = metrics.universal_screen(refs, refs, draws=2, top=2, seed=3)
    offsets = screen["offsets"]
    assert len(offsets) == 2 and all(1 <= o <= 3 for o in offsets) and len(set(offsets)) == 2
    pairs = [(refs[i], refs[(i + o) % 4]) for o in offsets for i in range(4)]
    want = metrics.sentence_bertscore([h for h, _ in pairs], [r for _, r in pairs]).mean()
    assert screen["random_f"] == pytest.approx(want, abs=1e-9)
    assert screen["matched_f"] == pytest.approx(100.0, abs=1e-3)  # every hypothesis is its reference
    assert screen["gap"] == pytest.approx(screen["matched_f"] - screen["random_f"])
    assert [t["random_f"] for t in screen["top"]] == sorted((t["random_f"] for t in screen["top"]), reverse=True)
    constant = metrics.universal_screen(["A person is doing something."] * 4, refs, draws=3)
    assert constant["gap"] < 3 < screen["gap"]  # the same output for every source: its own reference is no nearer
    with pytest.raises(ValueError, match="at least 2"):
        metrics.universal_screen(["a"], ["b"])


@pytest.mark.slow  # MiniLM and sacrebleu's resampling
def test_screen_against_a_baseline_gives_the_paired_bootstrap_of_each_file(tmp_path):
    """``screen.py --against``: each file's p-values against the baseline are ``metrics.paired_bootstrap``'s on
    the same lines; the references themselves beat a constant caption on every statistic."""
    metrics = _study_metrics()
    sys.path.insert(0, str(RECIPE))
    import screen

    sample = RECIPE.parents[1] / "tests" / "data" / "multi30k"
    refs = (sample / "val.en").read_text(encoding="utf-8").splitlines()
    (tmp_path / "const.en").write_text("A person is outside.\n" * len(refs), encoding="utf-8")
    out = screen.main([str(sample / "val.en"), "--against", str(tmp_path / "const.en"), "--multi30k", str(sample)])
    tested = out[str(sample / "val.en")]["against"]
    want = metrics.paired_bootstrap(["A person is outside."] * len(refs), refs, refs)
    assert tested == {"baseline": str(tmp_path / "const.en"), **want}
    assert max(want["bleu_p"], want["chrf_p"], want["bertscore_p"]) < 0.05 and "judge_p" not in want
    const_f = metrics.sentence_bertscore(["A person is outside."] * len(refs), refs)
    assert want["bertscore_delta"] == pytest.approx(100 - float(const_f.mean()), abs=1e-3)  # refs score 100
    # --limit: the split's first N sentences, files of N lines; another length is refused naming the scope
    (tmp_path / "const5.en").write_text("A person is outside.\n" * 5, encoding="utf-8")
    (tmp_path / "refs5.en").write_text("\n".join(refs[:5]) + "\n", encoding="utf-8")
    argv = [str(tmp_path / "refs5.en"), "--limit", "5", "--multi30k", str(sample)]
    out = screen.main([*argv, "--against", str(tmp_path / "const5.en")])
    assert out[str(tmp_path / "refs5.en")]["against"] == {
        "baseline": str(tmp_path / "const5.en"),
        **metrics.paired_bootstrap(["A person is outside."] * 5, refs[:5], refs[:5]),
    }
    with pytest.raises(SystemExit, match=r"const.en: \d+ lines, the first 5 of val"):
        screen.main([*argv, "--against", str(tmp_path / "const.en")])
