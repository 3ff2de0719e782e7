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
