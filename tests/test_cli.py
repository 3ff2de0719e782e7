"""The command line against the Python API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"


def test_score_per_line_equals_api(tiny_bert_dir, tmp_path, capsys):
    cands = ["a cat sat on the mat", "the dog barked", "hello"]
    refs = ["the cat sat", "a dog was barking", "hello world"]
    (tmp_path / "c.txt").write_text("\n".join(cands) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "2",
            "--device",
            "cpu",
            "--per-line",
        ]
    )
    assert rc == 0
    rows = [list(map(float, line.split("\t"))) for line in capsys.readouterr().out.splitlines()]
    p, r, f = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu").score(cands, refs)
    assert torch.allclose(torch.tensor(rows), torch.stack((p, r, f), 1), atol=1e-6)


def test_score_multi_reference_mean_and_signature(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a cat\nthe dog\n")
    (tmp_path / "r1.txt").write_text("a cat\nsomething else\n")
    (tmp_path / "r2.txt").write_text("nothing\nthe dog\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r1.txt"),
            "-r",
            str(tmp_path / "r2.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "1",
            "--device",
            "cpu",
            "--idf",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    p, r, f = (float(x) for x in out[0].split()[1::2])
    assert (p, r, f) == pytest.approx((1.0, 1.0, 1.0), abs=1e-5)  # each candidate has an identical reference
    assert out[1].startswith("bertscore-loss:") and "layer:1" in out[1] and "idf:yes" in out[1]


def test_score_length_mismatch_is_a_clear_error(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\nb\n")
    (tmp_path / "r.txt").write_text("a\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "1",
        ]
    )
    assert rc == 2
    assert "has 2 lines but" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_on_bundled_example():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertscore_loss",
            "score",
            "-c",
            str(EXAMPLES / "cands.txt"),
            "-r",
            str(EXAMPLES / "refs.txt"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    f = float(out[0].split()[-1])
    p, r, f_api = BERTScorer(device="cpu").score(
        (EXAMPLES / "cands.txt").read_text().splitlines(), (EXAMPLES / "refs.txt").read_text().splitlines()
    )
    assert f == pytest.approx(f_api.mean().item(), abs=1e-6)
    assert "all-MiniLM-L6-v2" in out[1]
