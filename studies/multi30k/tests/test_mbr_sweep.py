"""studies/multi30k/mbr_sweep.py end to end on a random tiny Marian model and the committed Multi30k sample."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "tests" / "data" / "multi30k"
RECIPE = ROOT / "studies" / "multi30k"


def _load(name: str):
    sys.path.insert(0, str(RECIPE))
    spec = importlib.util.spec_from_file_location(name, RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_export_sweep_and_blind_outputs(tmp_path):
    sweep = _load("mbr_sweep")
    nmt = sweep.nmt
    stage1 = tmp_path / "stage1"
    spm_path = nmt.train_sentencepiece(SAMPLE, stage1, 250)
    cfg = nmt.ModelConfig(vocab_size=250, d_model=32, layers=1, heads=2, ffn=64, dropout=0.0)
    torch.manual_seed(0)
    model = nmt.build_model(cfg, 250)
    (stage1 / "epochs").mkdir()
    torch.save(model.state_dict(), stage1 / "epochs" / "epoch-000.pt")
    torch.save({k: v * 0 for k, v in model.state_dict().items()}, stage1 / "epochs" / "epoch-001.pt")
    (stage1 / "settings.json").write_text(json.dumps({"vocab_size": 250, "model": vars(cfg)}))
    assert spm_path == stage1 / "spm.model"
    folder = tmp_path / "model"
    sweep.main(["export", "--stage1", str(stage1), "--out", str(folder), "--epoch", "0"])
    exported, sp = sweep.load_model(folder)
    for key, value in exported.state_dict().items():
        assert torch.equal(value, model.state_dict()[key]), key  # epoch 0, not the latest (1)
    run = tmp_path / "run"
    common = ["--model", str(folder), "--data", str(SAMPLE), "--run", str(run), "--threads", "1"]
    argv = ["sweep", *common, "--split", "val", "--limit", "3", "--sizes", "2", "4", "--utilities", "chrf"]
    sweep.main([*argv, "--precision", "32"])
    result = json.loads((run / "sweep.json").read_text())
    names = [r["decoder"] for r in result["rows"]]
    assert names[0] == "beam5-top1"
    for n in (2, 4):
        for method in ("", "-aggregate", "-aggregate-exact", "-prune"):
            assert f"eps{n}+mbr-chrf{method}" in names
    lists = json.loads((run / "lists" / "val" / "eps4.json").read_text())
    assert len(lists["texts"]) == 3 and all(len(x) == 4 for x in lists["texts"])
    assert len(lists["scores"]) == 3 and lists["precision"] == "32-true"
    for row in result["rows"]:  # sentence F for bootstrap intervals (scripts/figures.py): their mean is the F
        assert len(row["bertscore_f_sentences"]) == 3
        assert sum(row["bertscore_f_sentences"]) / 3 == pytest.approx(row["bertscore_f"], abs=1e-3)
    for row in result["rows"][1:]:
        assert 0 <= row["chrf"] <= 100 and row["evaluations_per_sentence"] > 0 and row["rerank_s"] >= 0
        if row["method"] != "exact":
            assert 0.0 <= row["same_choice"] <= 1.0
    table = (run / "sweep.md").read_text()
    assert "| decoder | BLEU | chrF | BERTScore F |" in table and "eps4+mbr-chrf-prune" in table
    # the saved lists are reused: no resampling (same sampling seconds)
    sweep.main([*argv, "--precision", "32"])
    again = json.loads((run / "sweep.json").read_text())
    assert [r.get("sampling_s") for r in again["rows"]] == [r.get("sampling_s") for r in result["rows"]]
    sweep.main(["blind", *common, "--n", "4", "--utilities", "chrf", "--name", "tiny", "--precision", "32"])
    for src in sorted((SAMPLE / "blind").glob("*.de")):
        lines = len(nmt.read_lines(src))
        for decoder in ("beam5-top1", "eps4+mbr-chrf", "eps4+mbr-chrf-aggregate-exact"):
            out = run / "outputs" / f"tiny-{decoder}.{src.stem}.en"
            assert len(nmt.read_lines(out)) == lines
        samples = json.loads((run / "lists" / src.stem / "eps4.json").read_text())["texts"]
        chosen = nmt.read_lines(run / "outputs" / f"tiny-eps4+mbr-chrf.{src.stem}.en")
        assert all(c in s for c, s in zip(chosen, samples))
    record = json.loads((run / "outputs" / "tiny-blind.json").read_text())
    assert (record["n"], record["sampling_precision"], record["methods"]) == (
        4,
        "32-true",
        ["exact", "aggregate-exact"],
    )
    for src in sorted((SAMPLE / "blind").glob("*.de")):
        entry = record["sets"][src.stem]
        assert entry["sources"] == len(nmt.read_lines(src)) and 1 <= entry["distinct_samples_per_source"] <= 4
        assert set(entry["files"]) == {"beam5-top1", "eps4+mbr-chrf", "eps4+mbr-chrf-aggregate-exact"}
        assert set(entry["seconds"]) == {
            "beam5",
            "sampling eps4",
            "rerank eps4+mbr-chrf",
            "rerank eps4+mbr-chrf-aggregate-exact",
        }
    # --sets: only the named blind set, from the lists saved above (the same choices); an unknown name is refused
    first = sorted((SAMPLE / "blind").glob("*.de"))[0].stem
    one = ["blind", *common, "--n", "4", "--utilities", "chrf", "--approx", "--name", "one", "--precision", "32"]
    sweep.main([*one, "--sets", first])
    written = sorted(p.name for p in (run / "outputs").glob("one-*"))
    assert written == sorted(["one-blind.json", f"one-beam5-top1.{first}.en", f"one-eps4+mbr-chrf.{first}.en"])
    for decoder in ("beam5-top1", "eps4+mbr-chrf"):
        assert nmt.read_lines(run / "outputs" / f"one-{decoder}.{first}.en") == nmt.read_lines(
            run / "outputs" / f"tiny-{decoder}.{first}.en"
        )
    assert list(json.loads((run / "outputs" / "one-blind.json").read_text())["sets"]) == [first]
    with pytest.raises(SystemExit, match=r"--sets: no blind set test_2099 in .*\(known: "):
        sweep.main([*one, "--sets", "test_2099"])
