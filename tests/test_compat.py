"""``bertscore_loss.compat`` and the ``evaluate`` module against the live oracle ``bert-score`` 0.3.13."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
import torch

from bertscore_loss import BaselineNotFoundError, ModelNotFoundError, compat
from bertscore_loss.baseline import packaged_baseline

from .conftest import LANG_PAIRS, bundled_path, needs_data, real_pairs, wmt16

TOL = 1e-6
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def same_hash(ours: str, theirs: str) -> bool:
    """Equal hash strings modulo the ``version=`` field (ours names this library)."""
    field = re.compile(r"_version=[^(]*\(")
    return field.sub("_version=(", ours) == field.sub("_version=(", theirs) and "bertscore-loss-" in ours


def assert_equal(ours, theirs, tol: float = TOL) -> None:
    assert isinstance(ours, tuple) and len(ours) == 3
    for name, a, b in zip("PRF", ours, theirs):
        assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape, (name, a.shape, b.shape)
        diff = (a - b).abs().max().item()
        assert diff <= tol, f"max |Δ{name}| = {diff:.2e}"


@pytest.fixture(scope="module")
def pairs():
    return real_pairs(per_lp=4, n_sts=16)  # 40 real pairs


@pytest.fixture(scope="module")
def baseline_file():
    return str(packaged_baseline(MINILM))


def oracle(*args, **kw):
    import bert_score

    return bert_score.score(*args, device="cpu", nthreads=0, **kw)  # nthreads: IDF without worker processes


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="plain"),
        pytest.param({"idf": True}, id="idf", marks=pytest.mark.slow),
        pytest.param({"num_layers": 2}, id="layer2", marks=pytest.mark.slow),
        pytest.param({"rescale_with_baseline": True, "lang": "en"}, id="rescaled", marks=pytest.mark.slow),
        pytest.param(
            {"idf": True, "rescale_with_baseline": True, "lang": "en", "use_fast_tokenizer": True},
            id="idf-rescaled-fast",
        ),
    ],
)
def test_score_equals_bert_score_with_its_hash(pairs, baseline_file, options):
    cands, refs = pairs
    kw = {"num_layers": 4, **options}
    if kw.get("rescale_with_baseline"):
        kw["baseline_path"] = baseline_file
    ours, our_hash = compat.score(cands, refs, model_type=bundled_path(), return_hash=True, **kw)
    theirs, their_hash = oracle(cands, refs, model_type=bundled_path(), return_hash=True, **kw)
    assert_equal(ours, theirs)
    assert same_hash(our_hash, their_hash), (our_hash, their_hash)
    assert compat.score(cands, refs, model_type=bundled_path(), **kw)[2].shape == (len(cands),)


@pytest.mark.slow
def test_multi_reference_and_idf_dict_equal_bert_score(pairs):
    from bert_score.utils import get_idf_dict, get_tokenizer

    cands, refs = pairs
    n = len(cands)
    groups = [[refs[i], cands[(i + 1) % n], refs[(i + 3) % n]][: 1 + i % 3] for i in range(n)]
    for idf in (False, True):
        ours = compat.score(cands, groups, model_type=bundled_path(), num_layers=4, idf=idf)
        assert_equal(ours, oracle(cands, groups, model_type=bundled_path(), num_layers=4, idf=idf))
    idf_dict = get_idf_dict(refs[::2], get_tokenizer(bundled_path()), nthreads=0)
    assert isinstance(idf_dict, defaultdict)
    ours = compat.score(cands, refs, model_type=bundled_path(), num_layers=4, idf=idf_dict)
    assert_equal(ours, oracle(cands, refs, model_type=bundled_path(), num_layers=4, idf=idf_dict))


@pytest.mark.slow
def test_all_layers_equal_bert_score_layer_by_layer(pairs, baseline_file):
    cands, refs = pairs[0][:24], pairs[1][:24]
    kw = {"num_layers": 4, "all_layers": True}
    ours = compat.score(cands, refs, model_type=bundled_path(), **kw)
    assert ours[0].shape == (7, 24)  # [L + 1, N], as bert-score returns them
    assert_equal(ours, oracle(cands, refs, model_type=bundled_path(), **kw))
    resc = {**kw, "idf": True, "rescale_with_baseline": True, "lang": "en", "baseline_path": baseline_file}
    assert_equal(
        compat.score(cands, refs, model_type=bundled_path(), **resc), oracle(cands, refs, bundled_path(), **resc)
    )
    one = compat.score(cands, refs, model_type=bundled_path(), num_layers=3)
    assert torch.equal(one[2], ours[2][3]) or (one[2] - ours[2][3]).abs().max() <= TOL


def test_scorer_class_equals_bert_score_scorer(pairs, baseline_file):
    import bert_score

    cands, refs = pairs
    kw = {"num_layers": 4, "idf": True, "lang": "en", "rescale_with_baseline": True, "baseline_path": baseline_file}
    ours = compat.BERTScorer(bundled_path(), idf_sents=refs[:30], **kw)
    theirs = bert_score.BERTScorer(bundled_path(), idf_sents=refs[:30], device="cpu", nthreads=0, **kw)
    out, our_hash = ours.score(cands, refs, return_hash=True)
    assert_equal(out, theirs.score(cands, refs))
    assert same_hash(our_hash, theirs.hash) and our_hash == ours.hash
    assert (ours.model_type, ours.num_layers, ours.idf, ours.lang) == (bundled_path(), 4, True, "en")
    assert repr(ours).startswith("BERTScorer(hash=") and str(ours) == repr(ours)
    with pytest.warns(UserWarning, match="Overwriting the previous importance weights"):
        ours.compute_idf(refs)
    theirs.compute_idf(refs)
    assert_equal(ours.score(cands, refs, batch_size=3), theirs.score(cands, refs))
    assert torch.allclose(ours.baseline_vals, theirs.baseline_vals)


def test_packaged_name_lang_default_and_offline_errors(pairs, tiny_bert_dir):
    cands, refs = pairs[0][:5], pairs[1][:5]
    (p, r, f), h = compat.score(cands, refs, model_type=MINILM, return_hash=True)  # packaged: its tuned layer 4
    assert h.startswith(f"{MINILM}_L4_no-idf_version=bertscore-loss-")
    assert_equal((p, r, f), compat.score(cands, refs, model_type=bundled_path(), num_layers=4))
    with pytest.raises(ModelNotFoundError, match=r"'roberta-large'.*not available offline.*local model folder"):
        compat.score(cands, refs, lang="en")
    with pytest.raises(ModelNotFoundError, match="bert-base-multilingual-cased"):
        compat.BERTScorer(lang="de")
    with pytest.raises(ValueError, match="either lang .* or model_type"):
        compat.score(cands, refs)
    with pytest.raises(ValueError, match="no default layer is known .*pass num_layers"):
        compat.score(cands, refs, model_type=tiny_bert_dir)
    with pytest.raises(BaselineNotFoundError, match="baseline_path=FILE"):
        compat.score(cands, refs, model_type=tiny_bert_dir, num_layers=2, rescale_with_baseline=True, lang="en")
    with pytest.raises(ValueError, match="lengths must match|2 candidates but 1"):
        compat.score(cands[:2], refs[:1], model_type=tiny_bert_dir, num_layers=2)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        compat.score(cands, refs, model_type=tiny_bert_dir, num_layers=2, batch_size=0)
    scorer = compat.BERTScorer(tiny_bert_dir, num_layers=2, idf=True)
    with pytest.raises(ValueError, match="IDF weights are not computed"):
        scorer.score(cands, refs)


def test_the_model_class_comes_from_the_folder_not_its_path(pairs, tiny_bert_dir, tmp_path):
    """``bert-score`` loads any ``model_type`` containing "t5" as ``T5EncoderModel``; ours reads the folder's
    config, so the same BERT folder under such a path scores alike (and like the oracle at its plain path)."""
    import shutil

    cands, refs = pairs
    moved = shutil.copytree(tiny_bert_dir, tmp_path / "t5-named-env" / "model")
    here = compat.score(cands, refs, model_type=tiny_bert_dir, num_layers=2)
    there = compat.score(cands, refs, model_type=str(moved), num_layers=2)
    assert_equal(there, here)
    assert_equal(here, oracle(cands, refs, model_type=tiny_bert_dir, num_layers=2))


def test_plot_example_saves_the_heatmap(tiny_bert_dir, tmp_path):
    path = tmp_path / "pair.png"
    fig = compat.BERTScorer(tiny_bert_dir, num_layers=2).plot_example("a cat sat", "the cat sat", fname=str(path))
    assert path.stat().st_size > 1000 and fig.axes
    assert compat.plot_example("a cat", "a dog", model_type=tiny_bert_dir, num_layers=1).axes


def evaluate_oracle(predictions, references, **kw):
    """``bert-score`` called the way ``evaluate.load("bertscore")`` calls it: references as lists, IDF over all
    of them through ``BERTScorer(idf_sents=...)``, the hash of ``get_hash``."""
    import bert_score

    groups = [[r] if isinstance(r, str) else r for r in references]
    idf = kw.get("idf", False)
    scorer = bert_score.BERTScorer(
        model_type=kw["model_type"],
        num_layers=kw["num_layers"],
        idf=idf,
        idf_sents=[r for g in groups for r in g] if idf else None,
        device="cpu",
        nthreads=0,
        lang=kw.get("lang"),
        rescale_with_baseline=kw.get("rescale_with_baseline", False),
        baseline_path=kw.get("baseline_path"),
    )
    p, r, f = scorer.score(predictions, groups)
    return {"precision": p.tolist(), "recall": r.tolist(), "f1": f.tolist(), "hashcode": scorer.hash}


def assert_same_dict(ours: dict, theirs: dict) -> None:
    assert set(ours) == {"precision", "recall", "f1", "hashcode"} == set(theirs)
    for key in ("precision", "recall", "f1"):
        assert isinstance(ours[key], list) and len(ours[key]) == len(theirs[key])
        assert max(abs(a - b) for a, b in zip(ours[key], theirs[key])) <= TOL, key
    assert same_hash(ours["hashcode"], theirs["hashcode"])


@pytest.fixture(scope="module")
def metric():
    evaluate = pytest.importorskip("evaluate")
    return evaluate.load(compat.evaluate_module_path())


@pytest.mark.parametrize("idf", [pytest.param(False, marks=pytest.mark.slow), True])
def test_evaluate_module_equals_the_bertscore_module(metric, pairs, baseline_file, idf):
    cands, refs = pairs
    kw = {"model_type": bundled_path(), "num_layers": 4, "idf": idf}
    assert_same_dict(metric.compute(predictions=cands, references=refs, **kw), evaluate_oracle(cands, refs, **kw))
    n = len(cands)
    groups = [[refs[i], refs[(i + 1) % n]] for i in range(n)]
    resc = {**kw, "lang": "en", "rescale_with_baseline": True, "baseline_path": baseline_file}
    assert_same_dict(
        metric.compute(predictions=cands, references=groups, **resc), evaluate_oracle(cands, groups, **resc)
    )


def test_evaluate_module_lang_and_packaged_model(metric):
    out = metric.compute(predictions=["a cat sat", "hello"], references=["a cat sat", "hi"], model_type=MINILM)
    assert out["f1"][0] == pytest.approx(1.0, abs=TOL) and out["f1"][1] < 0.99
    assert out["hashcode"].startswith(f"{MINILM}_L4_no-idf_version=bertscore-loss-")
    with pytest.raises(ModelNotFoundError, match="roberta-large"):
        metric.compute(predictions=["a"], references=["a"], lang="en")


@pytest.mark.slow
@needs_data
def test_wmt16_all_language_pairs_equal_bert_score(baseline_file):
    """560 pairs of each WMT16 language pair, one setting per pair: IDF on/off, rescaling on/off, multi-reference."""
    settings = [
        {},
        {"idf": True},
        {"rescale_with_baseline": True},
        {"idf": True, "rescale_with_baseline": True},
        {"multi": True},
        {"multi": True, "idf": True, "rescale_with_baseline": True},
    ]
    for lp, setting in zip(LANG_PAIRS, settings):
        cands, refs, _ = wmt16(lp)
        assert len(cands) == 560
        kw = {k: v for k, v in setting.items() if k != "multi"}
        if kw.get("rescale_with_baseline"):
            kw.update(lang="en", baseline_path=baseline_file)
        if setting.get("multi"):  # a second reference: the next segment's, which rarely matches
            refs = [[r, refs[(i + 1) % len(refs)]] for i, r in enumerate(refs)]
        ours, our_hash = compat.score(cands, refs, model_type=bundled_path(), num_layers=4, return_hash=True, **kw)
        theirs, their_hash = oracle(cands, refs, model_type=bundled_path(), num_layers=4, return_hash=True, **kw)
        assert_equal(ours, theirs)
        assert same_hash(our_hash, their_hash), lp


@pytest.mark.slow
@needs_data
def test_wmt16_evaluate_module_equals_the_bertscore_module(metric):
    cands, refs, _ = wmt16("de-en")
    kw = {"model_type": bundled_path(), "num_layers": 4, "idf": True}
    assert_same_dict(metric.compute(predictions=cands, references=refs, **kw), evaluate_oracle(cands, refs, **kw))
