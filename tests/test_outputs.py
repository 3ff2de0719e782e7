"""The one write rule (bertscore_loss.outputs) and every writer that uses it: the CLI, the quality report script
and the benchmarks. Each writer refuses to write onto its input and over a git-tracked file without
--overwrite (and writes it with it), leaves the old file and no temporary file when the write fails midway,
and writes under docs/ only when the path was given. An output that is also the input, and tune-layers writing
nothing before its error, are here; the Multi30k recipe's own output rules are in
studies/multi30k/tests/test_translation_recipe.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertscore_loss import outputs
from bertscore_loss.baseline import read_baseline
from bertscore_loss.cli import main
from bertscore_loss.outputs import (
    OutputRefusedError,
    atomic_path,
    check_output,
    is_tracked,
    open_output,
    save_figure,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = [
    "The cat sat on the mat.",
    "A dog barked loudly at the mailman.",
    "Heavy rain flooded the streets of the old town.",
    "Scientists discovered a new species of frog.",
    "He plays the piano every evening.",
    "The bridge was closed for repairs.",
]


# ------------------------------------------------------------------------------------------------- helpers
def git_repo(path: Path) -> Path:
    """A git repository at ``path`` with a ``docs/`` folder (files are tracked by :func:`track`)."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    (path / "docs").mkdir(exist_ok=True)
    return path


def track(*files: Path) -> None:
    """``git add`` each file (the index is what ``git ls-files`` reads: no commit needed)."""
    for f in files:
        subprocess.run(["git", "-C", str(f.parent), "add", "--", f.name], check=True)


def leftovers(folder: Path) -> list[str]:
    """Temporary files of the write rule left in ``folder``."""
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


def _fail_after_half(real_write):
    """A writer that writes half of its data, then fails (an interruption midway)."""

    def write(fh, data):
        real_write(fh, data[: len(data) // 2])
        raise OSError("disk full (simulated)")

    return write


# ------------------------------------------------------------------------------------------- the helper
def test_write_is_atomic_and_a_failure_midway_keeps_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    write_json(target, {"a": 1})
    assert target.read_text() == '{\n "a": 1\n}\n'
    with pytest.raises(RuntimeError, match="midway"):
        with open_output(target) as fh:
            fh.write('{"a": ')
            fh.flush()
            raise RuntimeError("interrupted midway")
    assert target.read_text() == '{\n "a": 1\n}\n' and leftovers(tmp_path) == []
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "new.bin") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("interrupted")
    assert not (tmp_path / "new.bin").exists() and leftovers(tmp_path) == []
    target.chmod(0o640)  # the replaced file's permissions are kept
    write_text(target, "b\n")
    assert target.read_text() == "b\n" and (target.stat().st_mode & 0o777) == 0o640
    write_text(tmp_path / "sub" / "deep.txt", "x")  # missing folders are created
    assert (tmp_path / "sub" / "deep.txt").read_text() == "x"


def test_never_onto_an_input(tmp_path, monkeypatch):
    src = tmp_path / "c.txt"
    src.write_text("input\n")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.txt").symlink_to(src)
    os.link(src, tmp_path / "hard.txt")
    for name in ("c.txt", "./c.txt", str(src), "link.txt", "hard.txt"):
        with pytest.raises(OutputRefusedError, match=r"it is also an input of this command"):
            write_text(name, "output\n", inputs=[str(src)])
    assert src.read_text() == "input\n"
    write_text(tmp_path / "other.txt", "ok", inputs=[str(src), None, "-"])  # stdin and None are skipped


def test_a_tracked_file_needs_overwrite(tmp_path):
    repo = git_repo(tmp_path / "repo")
    tracked, untracked = repo / "results.json", repo / "scratch.json"
    tracked.write_text("committed\n")
    untracked.write_text("scratch\n")
    track(tracked)
    assert is_tracked(tracked) and not is_tracked(untracked) and not is_tracked(repo / "missing.json")
    with pytest.raises(OutputRefusedError) as info:
        write_text(tracked, "new\n")
    assert str(info.value) == (
        f"refusing to overwrite {tracked}: git tracks it (a committed file); pass --overwrite to replace it, "
        "or write elsewhere"
    )
    assert tracked.read_text() == "committed\n"
    write_text(untracked, "new\n")  # not tracked: replaced
    write_text(tracked, "new\n", overwrite=True)
    assert tracked.read_text() == "new\n" and untracked.read_text() == "new\n"
    outside = tmp_path / "plain"  # not a repository: nothing is tracked
    outside.mkdir()
    write_text(outside / "x.txt", "a")
    write_text(outside / "x.txt", "b")
    assert (outside / "x.txt").read_text() == "b"


def test_docs_only_when_asked(tmp_path):
    repo = git_repo(tmp_path / "repo")
    target = repo / "docs" / "sub" / "new.json"
    with pytest.raises(OutputRefusedError) as info:
        write_json(target, {}, flag="--json")
    assert str(info.value).startswith(f"refusing to write {target}: it is under the repository's docs/ folder")
    assert str(info.value).endswith("name that path explicitly with --json")
    assert not target.exists()
    write_json(target, {}, allow_docs=True)
    assert target.read_text() == "{}\n"
    with pytest.raises(OutputRefusedError, match="docs/ folder"):  # this project's docs/ too
        check_output(ROOT / "docs" / "never-written.json")
    check_output(repo / "documentation.md")  # only the docs/ folder itself


def test_save_figure_is_atomic(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot(1, 1, 1).plot([0, 1], [1, 0])
    target = tmp_path / "f.png"
    save_figure(fig, target)
    old = target.read_bytes()
    assert old[:8] == b"\x89PNG\r\n\x1a\n"

    class Broken(Figure):
        def savefig(self, path, **kw):
            Path(path).write_bytes(b"\x89PNG half")
            raise OSError("interrupted")

    with pytest.raises(OSError, match="interrupted"):
        save_figure(Broken(), target)
    assert target.read_bytes() == old and leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------------ the CLI
def _tiny(model: str) -> list[str]:
    return ["--model", model, "--device", "cpu"]


def test_g11_baseline_and_plot_refuse_to_write_onto_their_input(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    before = corpus.read_bytes()
    assert main(["baseline", "--corpus", str(corpus), "-o", str(corpus), "--model", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        f"bertscore-loss: error: refusing to write {corpus}: it is also an input of this command ({corpus}); "
        "write the output elsewhere"
    )
    argv = ["plot", "-c", "a", "-r", "b", "--idf", "--idf-corpus", str(corpus), "-o", str(corpus)]
    assert main([*argv, "--model", str(tmp_path / "none")]) == 2
    assert "it is also an input of this command" in capsys.readouterr().err
    other = tmp_path / "d.txt"
    other.write_text("x\n")
    argv = ["baseline", "--corpus", str(other), str(corpus), "-o", str(tmp_path / "." / "c.txt")]
    assert main([*argv, "--model", str(tmp_path / "none")]) == 2  # any of several inputs, any spelling
    assert corpus.read_bytes() == before  # the model was never even looked for: refused first


def test_baseline_tracked_overwrite_and_a_failure_midway(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    import bertscore_loss.baseline as baseline_module

    repo = git_repo(tmp_path / "repo")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    out = repo / "tiny.tsv"
    out.write_text("LAYER,P,R,F\n0,0.5,0.5,0.5\n")
    track(out)
    argv = ["baseline", "--corpus", str(corpus), "--pairs", "20", "-o", str(out), *_tiny(tiny_bert_dir)]
    assert main(argv) == 2
    assert "git tracks it (a committed file); pass --overwrite" in capsys.readouterr().err
    assert read_baseline(out) == {0: (0.5, 0.5, 0.5)}
    real = baseline_module.write_baseline

    def half(path, rows):  # writes the header and one row, then fails
        real(path, dict(list(rows.items())[:1]))
        raise OSError("interrupted (simulated)")

    monkeypatch.setattr(baseline_module, "write_baseline", half)
    assert main([*argv, "--overwrite"]) == 2
    assert "interrupted (simulated)" in capsys.readouterr().err
    assert read_baseline(out) == {0: (0.5, 0.5, 0.5)} and leftovers(repo) == []
    monkeypatch.setattr(baseline_module, "write_baseline", real)
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(read_baseline(out)) == [0, 1, 2, 3] and leftovers(repo) == []


def test_plot_tracked_overwrite_and_a_failure_midway(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    repo = git_repo(tmp_path / "repo")
    out = repo / "heat.png"
    out.write_bytes(b"old png")
    track(out)
    argv = ["plot", "-c", "a cat", "-r", "the cat", "-o", str(out), "--layer", "2", *_tiny(tiny_bert_dir)]
    assert main(argv) == 2 and "pass --overwrite" in capsys.readouterr().err
    real = Figure.savefig

    def half(self, path, **kw):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError("interrupted (simulated)")

    monkeypatch.setattr(Figure, "savefig", half)
    assert main([*argv, "--overwrite"]) == 2
    assert out.read_bytes() == b"old png" and leftovers(repo) == []
    monkeypatch.setattr(Figure, "savefig", real)
    assert main([*argv, "--overwrite"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and leftovers(repo) == []


def _judged(tmp_path: Path, human: list[float]) -> Path:
    tsv = tmp_path / "dev.tsv"
    pairs = zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1], human)
    tsv.write_text("".join(f"{c}\t{r}\t{h}\n" for c, r, h in pairs))
    return tsv


def test_g12_tune_layers_validates_before_it_writes(tiny_bert_dir, tmp_path, capsys):
    tsv = _judged(tmp_path, [3.0] * 6)  # constant human scores: no correlation is defined
    out = tmp_path / "out"
    assert main(["tune-layers", "--tsv", str(tsv), "-o", str(out), *_tiny(tiny_bert_dir)]) == 2
    assert "no layer has a defined correlation (constant scores?)" in capsys.readouterr().err
    assert not (out / "layers.csv").exists() and not (out / "layers.md").exists()


def test_tune_layers_tracked_docs_input_and_a_failure_midway(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    repo = git_repo(tmp_path / "repo")
    tsv = _judged(tmp_path, [1.0, 2.5, 0.5, 4.0, 3.0, 2.0])
    argv = ["tune-layers", "--tsv", str(tsv), *_tiny(tiny_bert_dir)]
    out = repo / "layers"
    out.mkdir()
    (out / "layers.csv").write_text("old\n")
    track(out / "layers.csv")
    assert main([*argv, "-o", str(out)]) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["layers.csv"]  # refused before computing: nothing written
    # the default folder (./tune-layers) is never under docs/; an explicit -o there is asked for
    monkeypatch.chdir(repo / "docs")
    assert main(argv) == 2 and "under the repository's docs/ folder" in capsys.readouterr().err
    assert main([*argv, "-o", str(repo / "docs" / "tuned")]) == 0
    capsys.readouterr()
    assert (repo / "docs" / "tuned" / "layers.csv").is_file()
    io = tmp_path / "io"  # a dev set named layers.csv in the output folder: an input, never overwritten
    io.mkdir()
    (io / "layers.csv").write_bytes(tsv.read_bytes())
    assert main(["tune-layers", "--tsv", str(io / "layers.csv"), "-o", str(io), *_tiny(tiny_bert_dir)]) == 2
    assert "it is also an input of this command" in capsys.readouterr().err
    assert (io / "layers.csv").read_bytes() == tsv.read_bytes()
    import bertscore_loss.outputs as out_module

    real_replace = out_module.os.replace
    calls = []

    def fail_second(src, dst):  # layers.csv renamed, then the interruption before layers.md
        calls.append(dst)
        if len(calls) == 2:
            raise OSError("interrupted (simulated)")
        real_replace(src, dst)

    monkeypatch.setattr(out_module.os, "replace", fail_second)
    assert main([*argv, "-o", str(out), "--overwrite"]) == 2
    assert (out / "layers.csv").read_text().startswith("layer,measure,group") and not (out / "layers.md").exists()
    assert leftovers(out) == []


def test_every_writing_command_documents_overwrite():
    from bertscore_loss.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name in ("baseline", "plot", "tune-layers"):
        text = sub.choices[name].format_help()
        assert "--overwrite" in text and "atomically" in text and "docs/" in text, name


# --------------------------------------------------------------------------------- scripts and benchmarks
def _load(path: Path):
    name = f"_writer_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# (file, output option, how main takes its arguments, the option's value is a folder)
WRITERS = [
    ("scripts/quality_report.py", "--out", "argv", True),
    ("benchmarks/bridge_agreement.py", "--json", "sys.argv", False),
    ("benchmarks/eval_speed.py", "--json", "argv", False),
    ("benchmarks/free_logits.py", "--out", "sys.argv", False),
    ("benchmarks/integrations_speed.py", "--out", "argv", False),
    ("benchmarks/loss_speed.py", "--json", "sys.argv", False),
    ("benchmarks/mbr_speed.py", "--json", "argv", False),
    ("benchmarks/metric_speed.py", "--json", "argv", False),
    ("benchmarks/perf_harness.py", "--out", "argv", True),
    ("benchmarks/rerank_speed.py", "--json", "argv", False),
    ("studies/multi30k/benchmarks/sampling_speed.py", "--json", "argv", False),
    ("studies/multi30k/benchmarks/scorer_bf16_effect.py", "--json", "argv", False),
    ("benchmarks/stream_memory.py", "--json", "argv", False),
    ("studies/multi30k/benchmarks/translation_arms.py", "--json", "argv", False),
    ("studies/multi30k/mbr_data.py", "--out", "argv", True),
]
REQUIRED = {  # required options of a script (their values are never read: the check comes first)
    "studies/multi30k/benchmarks/scorer_bf16_effect.py": ["--model", "m"],
    "studies/multi30k/benchmarks/sampling_speed.py": ["--model", "m"],
    "benchmarks/mbr_speed.py": ["--lists", "l.json"],
}


def _run_main(module, how: str, argv: list[str], monkeypatch):
    if how == "sys.argv":
        monkeypatch.setattr(sys, "argv", [module.__file__, *argv])
        return module.main()
    return module.main(argv)


@pytest.mark.parametrize("path,flag,how,folder", WRITERS, ids=[w[0] for w in WRITERS])
def test_scripts_and_benchmarks_refuse_a_tracked_file_before_running(
    path, flag, how, folder, tmp_path, monkeypatch, capsys
):
    module = _load(ROOT / path)
    repo = git_repo(tmp_path / "repo")
    if folder:
        target_dir = repo / "published"
        target_dir.mkdir()
        names = {"scripts/quality_report.py": "quality.md", "studies/multi30k/mbr_data.py": "record-rank0.json"}
        name = names.get(path) or f"performance-harness-{module.cpu_bf16_label()}.json"
        (target_dir / name).write_text("committed\n")
        track(target_dir / name)
        value, tracked = str(target_dir), target_dir / name
    else:
        tracked = repo / "result.json"
        tracked.write_text("committed\n")
        track(tracked)
        value = str(tracked)
    with pytest.raises(SystemExit) as info:
        _run_main(module, how, [*REQUIRED.get(path, []), flag, value], monkeypatch)
    assert info.value.code == 2  # as argparse's own errors: one line on stderr
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(
            f"refusing to overwrite {tracked}: git tracks it (a committed file); pass --overwrite to "
            "replace it, or write elsewhere"
        )
        and "\n" not in err
    )
    assert tracked.read_text() == "committed\n" and leftovers(tracked.parent) == []


DEFAULTS = [
    ("scripts/quality_report.py", "argv", "check_outputs_or_exit"),
    ("benchmarks/free_logits.py", "sys.argv", "check_outputs_or_exit"),
    ("benchmarks/integrations_speed.py", "argv", "check_outputs_or_exit"),
    ("benchmarks/stream_memory.py", "argv", "check_outputs_or_exit"),
    ("benchmarks/perf_harness.py", "argv", "check_outputs_or_exit"),
    ("studies/multi30k/benchmarks/scorer_bf16_effect.py", "argv", "check_outputs_or_exit"),
    ("studies/multi30k/benchmarks/translation_arms.py", "argv", "check_outputs_or_exit"),
]


@pytest.mark.parametrize("path,how,checker", DEFAULTS, ids=[d[0] for d in DEFAULTS])
def test_default_outputs_are_not_under_docs(path, how, checker, monkeypatch):
    """Run without an output option, a script writes under runs/, and a path under docs/ would be refused."""
    module = _load(ROOT / path)
    seen = []

    class Stop(Exception):
        pass

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        raise Stop

    monkeypatch.setattr(module, checker, record)
    with pytest.raises(Stop):
        _run_main(module, how, REQUIRED.get(path, []), monkeypatch)
    args, kwargs = seen[0]
    paths = list(args[1])
    assert paths and all(Path(p).resolve().is_relative_to(ROOT / "runs") for p in paths), paths
    assert kwargs["allow_docs"] is False


def test_the_rule_is_the_one_helper_everywhere():
    """No writer of the CLI, quality tools, scripts, benchmarks or examples writes a file another way."""
    import re

    files = [
        *sorted((ROOT / "bertscore_loss" / "cli").glob("*.py")),
        *sorted((ROOT / "bertscore_loss" / "quality").glob("*.py")),
        *sorted((ROOT / "scripts").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "examples").rglob("*.py")),
        *sorted(p for p in (ROOT / "studies").rglob("*.py") if "tests" not in p.parts),
    ]
    direct = re.compile(
        r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"'][wa]b?[\"']|\.savefig\(|torch\.save\(|json\.dump\("
    )
    allowed = {  # (file, the line's text): writes that are not result files
        ("benchmarks/_mbrs_timing.py", "json.dump("),  # prints the job's result on stdout, in mbrs's own venv
        ("benchmarks/rerank_speed.py", "json.dump(job, fh)"),  # a temporary job file for that venv
        ("benchmarks/mbr_speed.py", "json.dump(job, fh)"),
        ("benchmarks/stream_memory.py", 'with open(path, "w", encoding="utf-8") as fh:'),  # temporary input pairs
        ("benchmarks/stream_memory.py", 'with open(out, "w") as fh:'),  # the child's stdout, in a temp folder
        ("studies/multi30k/nmt.py", 'corpus.write_text("\\n".join(src + tgt) + "\\n", encoding="utf-8")'),
        ("studies/multi30k/nmt.py", 'with open(self.curve_path, "a", encoding="utf-8") as fh:'),  # a log
    }
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for line in path.read_text(encoding="utf-8").splitlines():
            text = line.strip()
            if text.startswith("#") or not direct.search(text) or re.search(r"\(\w+, tmp\)$", text):
                continue  # a comment, no write, or a write to the temporary path of outputs.atomic_path
            if not any(rel == f and text.startswith(t) for f, t in allowed):
                found.append(f"{rel}: {text}")
    assert found == [], "write through bertscore_loss.outputs:\n" + "\n".join(found)


def test_outputs_module_is_in_the_core_contract():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"bertscore_loss.outputs",' in text
    assert outputs.__name__ == "bertscore_loss.outputs"


def test_mbr_sweep_refuses_committed_outputs_before_loading_the_model(tmp_path, capsys):
    sweep = _load(ROOT / "studies" / "multi30k" / "mbr_sweep.py")
    sample = ROOT / "tests" / "data" / "multi30k"
    repo = git_repo(tmp_path / "repo")
    dest = repo / "docs" / "mbr"
    dest.mkdir()
    blind = sorted((sample / "blind").glob("*.de"))
    committed = dest / f"t-eps4+mbr-chrf.{blind[0].stem}.en"
    committed.write_text("published\n")
    track(committed)
    common = ["--model", str(tmp_path / "no-model"), "--data", str(sample), "--run", str(tmp_path / "run")]
    argv = ["blind", *common, "--n", "4", "--utilities", "chrf", "--name", "t", "--outputs", str(dest)]
    with pytest.raises(SystemExit) as info:
        sweep.main(argv)
    assert str(info.value.code) == (
        f"mbr_sweep.py: error: refusing to overwrite {committed}: git tracks it (a committed file); "
        "pass --overwrite to replace it, or write elsewhere"
    )
    assert committed.read_text() == "published\n" and not (tmp_path / "run").exists()
    table = repo / "sweep.md"
    table.write_text("published\n")
    track(table)
    with pytest.raises(SystemExit, match="sweep.md: git tracks it"):
        sweep.main(["sweep", *common[:4], "--run", str(repo), "--split", "val", "--sizes", "2"])
    assert table.read_text() == "published\n"
