"""The two integration examples run end to end with their --smoke settings (real Trainer / GRPOTrainer)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_hf_seq2seq_semantic_loss_example_smoke(tmp_path, capsys):
    result = load("hf_seq2seq_semantic_loss").main(["--smoke", "--output-dir", str(tmp_path)])
    assert 0.0 <= result["eval_bertscore_f1"] <= 1.0
    out = capsys.readouterr().out
    assert "eval_bertscore_f1\t" in out and "bertscore-loss:" in out


@pytest.mark.slow
def test_trl_grpo_bertscore_reward_example_smoke(tmp_path, capsys):
    pytest.importorskip("trl")
    logs = load("trl_grpo_bertscore_reward").main(["--smoke", "--output-dir", str(tmp_path)])
    assert len(logs) == 2 and all("rewards/bertscore_mbr/mean" in h for h in logs)
    assert "bertscore_mbr" in capsys.readouterr().out
