"""The docs' snippets run as a new user would run them: each Python block marked
``<!-- doc-test: run -->`` in README.md and docs/*.md is written to a file and run as a script in a fresh
interpreter, and the README's commands are the ones CI runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- doc-test: run -->\n```python\n(.*?)```", re.S)
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def marked_blocks() -> list[tuple[str, int, str]]:
    """(file name, block number in the file, code) of every marked Python block."""
    found = []
    for path in DOCS:
        for k, code in enumerate(MARK.findall(path.read_text(encoding="utf-8"))):
            found.append((path.name, k, code))
    return found


def run_script(code: str, tmp_path: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_marked_blocks_are_found():
    names = [(name, k) for name, k, _ in marked_blocks()]
    assert ("README.md", 0) in names and ("lightning.md", 0) in names


@pytest.mark.slow
def test_readme_quick_start_runs_as_written(tmp_path):
    (code,) = [c for name, _, c in marked_blocks() if name == "README.md"]
    done = run_script(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    signature = done.stdout.strip().splitlines()[-1]
    assert signature.startswith("bertscore-loss:") and "|layer:4|" in signature
    shown = re.search(r"^# (bertscore-loss:\S+)$", code, re.M).group(1)  # the signature the README shows
    assert shown.split("|")[1:5] == signature.split("|")[1:5]  # model, layer, idf, rescale as printed


@pytest.mark.slow
def test_score_distributed_snippet_runs_as_a_script(tmp_path):
    """docs/lightning.md's script: 2 CPU processes (ddp_spawn), scores equal to one process's."""
    from bertscore_loss import BERTScorer

    (code,) = [c for name, _, c in marked_blocks() if name == "lightning.md"]
    done = run_script(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    printed = torch.tensor([float(x) for x in re.findall(r"\d\.\d+", done.stdout.split("tensor(")[-1])])
    cands = re.search(r"cands = (\[.*\])", code).group(1)
    refs = re.search(r"refs = (\[.*\])", code).group(1)
    want = BERTScorer(layer=4, idf=True, device="cpu").score(eval(cands), eval(refs))[2]
    assert printed.shape == want.shape
    assert torch.allclose(printed, want, atol=1e-4)  # printed with 4 decimals


def test_readme_test_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    full = re.search(r"```bash\n\. \.venv/bin/activate && (python -m pytest -q)\n```", readme).group(1)
    assert f"\n{full}\n" in ci  # .ci/run runs the README's test command, as it says
    assert '`python -m pytest -q -m "not slow"`' in readme  # the quick loop, named in the text


@pytest.mark.slow
def test_readme_set_up_scores_the_example_files(tmp_path):
    """The set-up block ends with a score command on the committed example files."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    command = re.search(r"&& (bertscore-loss score -c examples/data/cands\.txt -r examples/data/refs\.txt)\n", readme)
    exe = Path(sys.executable).parent / "bertscore-loss"
    args = command.group(1).split()[1:]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([str(exe), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "bertscore-loss:" in done.stdout + done.stderr
