"""scripts/figures.py: every figure of the guide from the committed results, values read as published."""

from __future__ import annotations

import importlib.util
import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("_figures_script", ROOT / "scripts" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_bootstrap_interval_is_the_paired_percentile_interval(figures):
    assert figures.bootstrap_interval(np.full(50, 2.0), np.ones(50)) == (1.0, 1.0)  # a constant gain: no spread
    values, baseline = np.array([1.0, 3.0, 0.0, 4.0]), np.array([0.0, 1.0, 1.0, 1.0])  # differences 1, 2, -1, 3
    low, high = figures.bootstrap_interval(values, baseline, resamples=4000, seed=0)
    diff = values - baseline
    assert -1.0 <= low < diff.mean() < high <= 3.0
    rng = np.random.default_rng(0)  # the same resamples, by hand
    means = diff[rng.integers(0, 4, size=(4000, 4))].mean(axis=1)
    assert (low, high) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    with pytest.raises(ValueError, match="equal non-empty 1-D"):
        figures.bootstrap_interval(np.array([]), np.array([]))


def test_mbr_series_are_the_sweeps_gains(figures):
    sweep = json.loads((RESULTS / "mbr-multi30k" / "converged" / "test200-sweep.json").read_text())
    series = figures.mbr_series(sweep)
    exact = dict((n, gain) for n, gain, _ in series["exact"])
    assert sorted(exact) == [32, 64, 128, 256]
    assert exact[256] == pytest.approx(89.00 - 88.57, abs=0.01)  # the published +0.43 F
    assert set(series) == {"exact", "aggregate", "aggregate-exact", "prune"}
    assert all(interval is None for points in series.values() for _, _, interval in points)  # corpus means only
    beam = sweep["rows"][0]  # with sentence-level scores the interval is drawn around the gain
    row = next(r for r in sweep["rows"] if r.get("method") == "exact" and r["n"] == 32)
    rich = {"rows": [{**beam, "bertscore_f_sentences": [80.0, 90.0]}, {**row, "bertscore_f_sentences": [81.0, 92.0]}]}
    ((n, gain, (low, high)),) = figures.mbr_series(rich)["exact"]
    assert n == 32 and low == pytest.approx(1.0) and high == pytest.approx(2.0)


def test_speed_rows_are_the_published_ratios(figures):
    rows = {(c, m): r for c, m, r in figures.speed_rows(RESULTS)}
    assert rows[("evaluation vs bert-score, float32", "AMD EPYC (AVX2, no bf16)")] == pytest.approx(1.49, abs=0.005)
    assert rows[("evaluation vs bert-score, ours in bf16", "Intel Xeon (amx_bf16, avx512_bf16)")] == pytest.approx(
        4.98, abs=0.005
    )
    assert rows[("256-sample MBR vs mbrs, float32", "AMD EPYC (avx512_bf16)")] == pytest.approx(5.55, abs=0.005)
    assert rows[("n-best MBR vs mbrs, float32", "AMD EPYC (avx512_bf16)")] == pytest.approx(1.43, abs=0.005)
    assert all(r > 1 for r in rows.values())  # every committed comparison: faster than the other library


def test_finetuning_runs_and_layer_table_read_the_committed_files(figures):
    runs = figures.finetuning_runs(RESULTS / "finetuning-multi30k" / "converged" / "stage2")
    assert {("ce", s) for s in range(3)} | {("bertscore", s) for s in range(3)} <= set(runs)
    assert ("ce-seed0-rerun-avx512bf16", 0) not in runs  # machine reruns are not arms
    table = figures.layer_table(RESULTS / "layer-tuning" / "tune-layers-wmt16" / "layers.csv")
    best = max(table[("F", "mean")], key=lambda p: p[1])
    assert best == (4, pytest.approx(0.6355, abs=5e-5))  # the bundled model's default layer
    quality = RESULTS / "layer-tuning" / "quality.md"
    assert figures.sentence_metric_r(quality, "chrF") == 0.5421
    assert figures.sentence_metric_r(quality, "sentBLEU") == 0.4879


def test_machine_names_the_cpu_and_its_bf16_flags(figures):
    assert figures.machine("Intel(R) Xeon(R) Processor", ["amx_bf16", "avx512_bf16"]) == (
        "Intel Xeon (amx_bf16, avx512_bf16)"
    )
    assert figures.machine("AMD EPYC (avx512_bf16)") == "AMD EPYC (avx512_bf16)"
    assert figures.machine("AMD EPYC", native_bf16=False) == "AMD EPYC (AVX2, no bf16)"


@pytest.mark.slow
def test_the_script_draws_every_figure_from_the_committed_data(figures, tmp_path):
    assert figures.main(["--out", str(tmp_path)]) == 0
    for name in figures.FIGURES:
        width, height = png_size(tmp_path / name)
        assert width >= 600 and height >= 300, name
    published = {p.name for p in (ROOT / "docs" / "figures").glob("*.png")}
    assert set(figures.FIGURES) <= published  # the committed figures are this script's (plus the CLI's example)


def test_the_script_writes_by_the_rule(figures, tmp_path, capsys, monkeypatch):
    seen = []

    def record(parser, paths, **rules):
        seen.append((list(paths), rules))
        raise SystemExit(0)

    monkeypatch.setattr(figures, "check_outputs_or_exit", record)
    with pytest.raises(SystemExit):
        figures.main([])  # no --out: runs/figures, never docs/
    paths, rules = seen[0]
    assert all(p.parent == ROOT / "runs" / "figures" for p in paths) and rules["allow_docs"] is False
    monkeypatch.undo()
    repo = tmp_path / "repo"  # a published figure (git tracks it) is replaced only with --overwrite
    repo.mkdir()
    (repo / "layer-tuning.png").write_bytes(b"published")
    for cmd in (["init", "-q"], ["add", "layer-tuning.png"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True, capture_output=True)
    with pytest.raises(SystemExit) as info:
        figures.main(["--out", str(repo), "--only", "layer-tuning.png"])
    assert info.value.code == 2 and "git tracks it" in capsys.readouterr().err
    assert (repo / "layer-tuning.png").read_bytes() == b"published"
    assert figures.main(["--out", str(repo), "--only", "layer-tuning.png", "--overwrite"]) == 0
    assert png_size(repo / "layer-tuning.png")[0] >= 600
