"""Re-ranking built MBR data by a mix of utilities (``rerank.mixed_ranking``): the mix by hand, the weights'
ends, the new reference log-probabilities, resumption, a partly built input, the data's cost and clear errors."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from rerank import mbr
from rerank.mixed_ranking import MixConfig, mixed_scores, remix_mbr_data
from rerank.training_data import MBRDataConfig, build_seconds, read_mbr_data

from .test_training_data import SOURCES, WordCodec, assert_teacher_forced_log_probs, build, tiny_bart_model


def length_match(hyps: list[str], refs: list[str]) -> torch.Tensor:
    """1 - |word-count difference| / longer word count: a second utility that ranks differently."""
    u = torch.zeros(len(hyps), len(refs), dtype=torch.float64)
    for i, h in enumerate(hyps):
        for j, r in enumerate(refs):
            a, b = len(h.split()), len(r.split())
            u[i, j] = 1.0 - abs(a - b) / max(a, b, 1)
    return u


@pytest.fixture(scope="module")
def model():
    return tiny_bart_model()


@pytest.fixture(scope="module")
def built(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("mix") / "base"
    build(model, out)
    return out


def remix(model, src, out, weight=0.5, missing="error", **kw):
    config = MixConfig(weight=weight, **kw)
    return remix_mbr_data(model, WordCodec(), src, out, config, utility=length_match, missing=missing)


def z(x):
    x = np.asarray(x, dtype=np.float64)
    s = x.std()
    return (x - x.mean()) / s if s > 1e-12 else np.zeros_like(x)


def test_rows_are_ranked_by_the_standardised_mix(model, built, tmp_path):
    remix(model, built, tmp_path / "m", weight=0.5)
    base, rows = read_mbr_data(built), read_mbr_data(tmp_path / "m")
    assert [r["index"] for r in rows] == list(range(len(SOURCES)))
    changed = 0
    for b, r in zip(base, rows):
        cands = r["candidates"]
        assert cands == b["candidates"] and r["expected_primary"] == b["expected"]
        u = length_match(cands, cands[:6])  # samples leave their own draw out; the beam output sees all six
        second = [float((u[i].sum() - u[i, i]) / 5) for i in range(6)] + [float(u[6].mean())]
        assert r["expected_second"] == pytest.approx(second, abs=1e-12)
        want = 0.5 * z(b["expected"]) + 0.5 * z(second)
        assert r["expected"] == pytest.approx(want.tolist(), abs=1e-9)
        best = max(range(7), key=lambda i: (want[i], -i))
        assert r["chosen"] == r["target"] == cands[best] and r["chosen_score"] == pytest.approx(want[best])
        if r["beam"] != r["chosen"]:
            assert r["rejected"] == r["beam"]
        changed += (r["chosen"], r["rejected"]) != (b["chosen"], b["rejected"])
        assert r["utility"].startswith("mix:z|0.5*[overlap]+0.5*[") and r["pairing"] == "beam-or-worst"
    assert changed > 0  # the mix moved some choices, so the test below checks new log-probabilities


def test_new_sides_get_the_models_log_probabilities(model, built, tmp_path):
    remix(model, built, tmp_path / "m", weight=0.5)
    assert_teacher_forced_log_probs(model, read_mbr_data(tmp_path / "m"))


def test_the_weights_ends_are_each_utility_alone(model, built, tmp_path):
    remix(model, built, tmp_path / "w0", weight=0.0)
    for b, r in zip(read_mbr_data(built), read_mbr_data(tmp_path / "w0")):
        assert (r["chosen"], r["rejected"], r["chosen_logp"], r["rejected_logp"]) == (
            b["chosen"],
            b["rejected"],
            b["chosen_logp"],
            b["rejected_logp"],
        )
    remix(model, built, tmp_path / "w1", weight=1.0)
    rows = read_mbr_data(tmp_path / "w1")
    res = mbr([r["candidates"] for r in rows], utility=length_match, log_weights=[[0.0] * 6 + [-float("inf")]] * 6)
    assert [x.best for x in res] == [r["chosen"] for r in rows]


def test_resume_and_clear_errors(model, built, tmp_path):
    out = tmp_path / "m"
    remix(model, built, out)
    first = {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.jsonl"))}
    (out / "shard-00001.jsonl").unlink()
    result = remix(model, built, out)
    assert (result.built, result.reused) == (1, 1)
    assert {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.jsonl"))} == first
    with pytest.raises(ValueError, match="other settings"):
        remix(model, built, out, weight=0.2)
    with pytest.raises(ValueError, match="must differ"):
        remix(model, built, built)
    with pytest.raises(ValueError, match=r"weight must lie in \[0, 1\]"):
        MixConfig(weight=1.5)
    with pytest.raises(ValueError, match="pairing"):
        MixConfig(pairing="best-of-all")
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        remix(model, tmp_path / "nothing", tmp_path / "o")
    bare = tmp_path / "bare"
    config = MBRDataConfig(num_samples=6, beams=2, shard_size=4, seed=3, precision="32", store_lists=False)
    build(model, bare, config)
    with pytest.raises(ValueError, match="without store_lists"):
        remix(model, bare, tmp_path / "o2")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["mix"]["weight"] == 0.5 and manifest["sources"] == len(SOURCES)


def test_a_partly_built_input_is_an_error_or_re_ranked_as_far_as_it_goes(model, built, tmp_path):
    whole = tmp_path / "whole"
    remix(model, built, whole)
    partial = tmp_path / "partial"
    shutil.copytree(built, partial)
    (partial / "shard-00001.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"shard-00001.jsonl is missing"):
        remix(model, partial, tmp_path / "o")
    out = tmp_path / "o2"
    result = remix(model, partial, out, missing="skip")
    assert (result.built, [p.name for p in result.files]) == (1, ["shard-00000.jsonl"])
    assert (out / "shard-00000.jsonl").read_bytes() == (whole / "shard-00000.jsonl").read_bytes()
    shutil.copy(built / "shard-00001.jsonl", partial / "shard-00001.jsonl")  # the build went on
    result = remix(model, partial, out, missing="skip")
    assert (result.built, result.reused) == (1, 1)
    assert {p.name: p.read_bytes() for p in out.glob("shard-*.jsonl")} == {
        p.name: p.read_bytes() for p in whole.glob("shard-*.jsonl")
    }
    with pytest.raises(ValueError, match="missing='later'"):
        remix(model, partial, out, missing="later")


def test_another_model_than_the_builder_is_refused(model, built, tmp_path):
    """Reused and new log-probabilities must be one model's: a slightly changed copy is refused before any output."""
    other = tiny_bart_model()
    noise = torch.randn(other.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # random: a uniform shift would leave every softmax as it is
        other.lm_head.weight.add_(0.05 * noise)
    with pytest.raises(ValueError, match=r"holds log-probabilities of another model \(row 0: stored -"):
        remix(other, built, tmp_path / "o")
    assert not list((tmp_path / "o").glob("shard-*"))


def test_mixed_scores_by_hand():
    assert mixed_scores([1.0, 2.0, 3.0], [5.0, 5.0, 5.0], 0.5) == pytest.approx((0.5 * z([1, 2, 3])).tolist())
    assert mixed_scores([0.9, 0.9], [1.0, 3.0], 0.25) == pytest.approx([-0.25, 0.25])
    with pytest.raises(ValueError, match="2 second"):
        mixed_scores([1.0], [1.0, 2.0], 0.5)


def _timing_sums(folder):
    rows = [json.loads(line) for line in (folder / "timing.jsonl").read_text().splitlines() if line]
    last = {r["shard"]: r["seconds"] for r in rows}
    return {stage: sum(sec[stage] for sec in last.values()) for stage in next(iter(last.values()))}


def test_the_cost_of_re_ranked_data_counts_the_samples_it_was_made_from(model, built, tmp_path):
    own = _timing_sums(built)
    assert set(own) == {"beam", "sampling", "mbr", "log_probs"} and own["sampling"] > 0
    assert build_seconds(built) == pytest.approx(own)
    moved = tmp_path / "moved-base"
    shutil.copytree(built, moved)
    out = tmp_path / "m"
    remix(model, moved, out)
    remix_own = _timing_sums(out)
    got = build_seconds(out)
    # the samples' cost, where the re-ranking alone would have counted only its own seconds
    assert got == pytest.approx({**own, "remix_mbr": remix_own["mbr"], "remix_log_probs": remix_own["log_probs"]})
    assert sum(got.values()) > sum(remix_own.values()) + own["sampling"] - 1e-9
    # a shard built twice counts its last build
    with open(out / "timing.jsonl", "a") as log:
        log.write(json.dumps({"shard": 0, "sources": 4, "seconds": {"mbr": 100.0, "log_probs": 1.0}}) + "\n")
    assert build_seconds(out)["remix_mbr"] == pytest.approx(remix_own["mbr"] - _first(out, "mbr") + 100.0)
    # the input moved: the manifest says where it was; a moved re-ranked folder still resumes
    shutil.move(str(moved), str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match="which is gone"):
        build_seconds(out)
    remix(model, tmp_path / "elsewhere", out)  # every shard there: resumes (nothing to build), not refused
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["from_folder"] = str(tmp_path / "elsewhere")
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert build_seconds(out)["sampling"] == pytest.approx(own["sampling"])
    # another input at that place, or a folder re-ranked before the manifest named its input
    other = json.loads((tmp_path / "elsewhere" / "manifest.json").read_text())
    other["config"]["seed"] += 1
    (tmp_path / "elsewhere" / "manifest.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="other data than"):
        build_seconds(out)
    del manifest["from_folder"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="does not name"):
        build_seconds(out)
    with pytest.raises(FileNotFoundError, match="not a folder of MBR data"):
        build_seconds(tmp_path / "nothing")


def _first(folder, stage):
    rows = [json.loads(line) for line in (folder / "timing.jsonl").read_text().splitlines() if line]
    return next(r["seconds"][stage] for r in rows if r["shard"] == 0)
