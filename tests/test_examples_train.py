"""``examples/train_mbr_dpo.py``: its ``--smoke`` run (MBR data of 8 sources from the committed Marian model,
4 DPO steps, the paired bootstrap before/after) in a fresh interpreter, and ``configs/mbr_dpo.yaml`` read by
``MBRTrainingConfig``."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "train_mbr_dpo.py"


def test_the_config_is_read_by_the_config_dataclass(tmp_path):
    from transformers import HfArgumentParser

    from rerank import MBRTrainingConfig

    path = ROOT / "configs" / "mbr_dpo.yaml"
    raw = yaml.safe_load(path.read_text())
    (config,) = HfArgumentParser(MBRTrainingConfig).parse_yaml_file(str(path))
    assert isinstance(config, MBRTrainingConfig)
    assert config.report_to in ([], ["none"], "none")
    for key, value in raw.items():
        if key == "report_to":
            continue
        got = getattr(config, key)
        assert (got.value if hasattr(got, "value") else got) in (value, [value]), key
    names = {f.name for f in dataclasses.fields(MBRTrainingConfig)}
    assert set(raw) <= names
    own = [f for f in dataclasses.fields(MBRTrainingConfig) if f.name in ("beta", "pairing", "mrt_weight")]
    assert all(f.metadata.get("help") for f in own)


def test_the_example_is_at_most_200_lines_of_public_api():
    text = SCRIPT.read_text()
    assert len(text.splitlines()) <= 200
    imported = [node for node in ast.walk(ast.parse(text)) if isinstance(node, ast.ImportFrom)]
    ours = [node for node in imported if node.module.split(".")[0] in ("rerank", "bertscore_loss")]
    assert ours, "the example uses the library"
    for node in ours:
        assert not any(part.startswith("_") for part in node.module.split(".")), node.module
        assert not any(alias.name.startswith("_") for alias in node.names), node.module
    assert not any(node.module.split(".")[0] in ("examples", "studies") for node in imported)


@pytest.mark.slow
def test_smoke_run(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--out", str(tmp_path / "run")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["sources"] == 8 and result["steps"] == 4 and result["pairs"] >= 4
    assert result["first_dpo"] == pytest.approx(math.log(2), abs=1e-4)  # policy = reference at the first step
    assert result["last_dpo"] < result["first_dpo"]
    test = result["test"]
    assert 0 < test["p_value"] <= 1 and test["signature"].startswith("test:paired-bs|n:8|bs:1000|seed:12345")
    assert (tmp_path / "run" / "model" / "config.json").is_file()
