"""The fine-tuning example runs end to end in a shortened form (the full run is by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from .conftest import needs_data

ROOT = Path(__file__).resolve().parents[1]


@needs_data
@pytest.mark.slow
def test_finetune_example_smoke(capsys):
    spec = importlib.util.spec_from_file_location("finetune_example", ROOT / "examples" / "finetune_semantic_loss.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    results = module.main(["--set", "max_steps=2", "train_max=32", "dev_max=4", "batch_size=8"])
    assert [r["run"] for r in results] == ["CE", "CE + λ·BERTScore"]
    for r in results:
        assert 0.0 <= r["dev_bertscore_f"] <= 1.0 and r["dev_sacrebleu"] >= 0.0
    out = capsys.readouterr().out
    assert "| CE + λ·BERTScore |" in out and "bertscore-loss:" in out
