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
    assert json.loads((out / "dpo-seed0" / "result.json").read_text())["updates"] == 2
    with pytest.raises(AssertionError, match="holds 2 shards, --shards asks for 3"):
        run("self_training.py", *arm[:4], "--shards", "3", *arm[6:])
