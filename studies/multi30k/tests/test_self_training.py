"""``fresh_mbr_data.py`` then ``self_training.py`` end to end on the committed sample (German lines as the fresh
sources, the committed Marian base): the trainer's updates, the saved model scored by the recipe's evaluate,
and a resumed run that trains no further."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
SAMPLE = HERE.parents[1] / "tests" / "data" / "multi30k"


def run(script: str, *args: str) -> None:
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow  # two subprocesses loading Marian and MiniLM: ~30 s
def test_fresh_data_then_a_self_training_arm(tmp_path):
    data, out = tmp_path / "fresh", tmp_path / "runs"
    run("fresh_mbr_data.py", "--mono", str(SAMPLE / "train.de"), "--out", str(data), "--sources", "16",
        "--samples", "4", "--shard-size", "8")  # fmt: skip
    listed = (data / "sources.de").read_text(encoding="utf-8").splitlines()
    assert len(listed) == 16 and set(listed) <= set((SAMPLE / "train.de").read_text(encoding="utf-8").splitlines())
    arm = ["--arm", "dpo", "--data", str(data), "--shards", "1", "--out", str(out), "--multi30k", str(SAMPLE),
           "--limit", "12", "--set", "max_steps=2", "--set", "per_device_train_batch_size=4",
           "--set", "save_steps=1"]  # fmt: skip
    run("self_training.py", *arm)
    result = json.loads((out / "dpo-seed0" / "result.json").read_text())
    assert result["sources"] == 8 and result["updates"] == 2 and result["split"] == "val"
    assert result["config"]["dpo_weight"] == 1.0 and result["config"]["distill_weight"] == 0.0
    hyps = (out / "dpo-seed0" / "val.en").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 12 and all(hyps)
    assert 0 < result["bertscore_f"] < 100 and (out / "dpo-seed0" / "model" / "spm.model").is_file()
    screen = result["universal"]  # the translations against other sentences' references: further from them
    assert screen["matched_f"] == pytest.approx(result["bertscore_f"]) and screen["gap"] > 0 and screen["draws"] == 8
    run("self_training.py", *arm)  # resumed from its last checkpoint: no further update
    resumed = json.loads((out / "dpo-seed0" / "result.json").read_text())
    assert resumed["updates"] == 2
    # a test split and the blind sets, from the finished run: no further update, the val result kept
    run("self_training.py", *arm, "--split", "test_2016_flickr", "--blind", str(tmp_path / "blind"))
    tested = json.loads((out / "dpo-seed0" / "result.test_2016_flickr.json").read_text())
    assert tested["updates"] == 2 and tested["split"] == "test_2016_flickr" and 0 < tested["bertscore_f"] < 100
    assert json.loads((out / "dpo-seed0" / "result.json").read_text()) == resumed
    for name in ("test_2017_flickr", "test_2017_mscoco"):
        lines = (tmp_path / "blind" / f"dpo-seed0-beam5.{name}.en").read_text(encoding="utf-8").splitlines()
        assert len(lines) == 8 and all(lines)
    with pytest.raises(AssertionError, match="holds 2 shards, --shards asks for 3"):
        run("self_training.py", *arm[:4], "--shards", "3", *arm[6:])
    with pytest.raises(AssertionError, match="--top N is for the distill arm"):
        run("self_training.py", *arm, "--top", "2")


@pytest.mark.slow  # builds a small MBR folder with Marian and MiniLM: ~13 s
def test_top_n_targets_and_a_mixed_folder(tmp_path):
    """``--top N``: each source's N best distinct candidates by the stored expected utilities (sorted here by
    hand), the first the MBR-best; ``--mix``: every example of a second folder added to the first shards'."""
    from rerank.training_data import MBRDataConfig, build_mbr_data, load_model_and_tokenizer, read_mbr_data

    sys.path.insert(0, str(HERE))
    import self_training

    model, tokenizer = load_model_and_tokenizer(HERE.parents[1] / "models" / "multi30k-de-en")
    sources = (SAMPLE / "train.de").read_text(encoding="utf-8").splitlines()[:6]
    config = MBRDataConfig(num_samples=4, pairing="best-worst", shard_size=3, precision="32")
    build_mbr_data(model, tokenizer, sources, tmp_path, config)
    rows = read_mbr_data(tmp_path)
    top = self_training.top_examples(tmp_path, 1, 3, model, tokenizer)  # the first shard: 3 sources
    want = []
    for row in rows[:3]:
        utility = {}
        for text, value in zip(row["candidates"], row["expected"]):
            utility.setdefault(text, value)
        ranked = sorted(utility, key=lambda t: (-utility[t], row["candidates"].index(t)))[:3]
        assert ranked[0] == row["chosen"]
        want += [(row["prompt"], text) for text in ranked]
    assert [(e.prompt, e.target) for e in top] == want and len(want) > 3
    assert all(e.reference == e.target and e.pairs == () for e in top)
    from rerank import MBRTrainingConfig

    mixed = self_training.mix_examples(tmp_path, model, tokenizer, MBRTrainingConfig(output_dir=str(tmp_path / "t")))
    assert [e.prompt for e in mixed] == sources and [e.target for e in mixed] == [r["chosen"] for r in rows]
