"""The docs as a new user meets them: each Python block marked ``<!-- doc-test: run -->`` in README.md and
docs/ is written to a file and run as a script (one interpreter runs them all, each in a fresh namespace and
folder of its own, so torch and transformers import once); every shell block parses; the README's
commands are the ones CI runs; every link and anchor resolves; the README and the guide speak of the product,
not of how it was made; committed results hold no machine's absolute paths."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!-- doc-test: run -->\n```python\n(.*?)```", re.S)
SHELL = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.S)
GUIDE = sorted((ROOT / "docs").glob("*.md"))  # the user guide: one page per use
RESULTS = sorted((ROOT / "docs" / "results").rglob("*.md"))  # the findings reports and their records
DOCS = [ROOT / "README.md", *GUIDE, *RESULTS]
USER_FACING = [ROOT / "README.md", *GUIDE, *sorted((ROOT / "docs" / "results").glob("*/README.md"))]
# pages whose marked block another test runs with its own checks of the printed values
OWN_TESTS = {
    "lightning.md": "tests/test_docs.py::test_score_distributed_snippet_runs_as_a_script",
    "rerank.md": "tests/test_mbr.py::test_rerank_doc_snippet_runs_as_written",
    "preference.md": "tests/test_preference.py::test_docs_snippet_trains_a_tiny_marian_model",
}
# words of the making, not of the product: issue numbers, targets met or missed, sessions, reviewers
PROCESS = re.compile(
    r"\bissues?\b|(?<![\w&/#(`])#\d+\b|\b(?:this|that|the|a|each|next|later|previous) sessions?\b"
    r"|\btargets?\s*(?:\(|:)?\s*(?:[+≥>]|\d|of\s+[+≥\d]|missed|met\b|reached|not\b)"
    r"|\b(?:meets?|met|miss(?:es|ed)?|reach(?:es|ed)?|within)\s+(?:the\s+|its\s+|our\s+|this\s+)?targets?\b"
    r"|\*\*targets?\b|\bmissed\b|\bthe lead\b|\breviewer|\bwithdrawn\b|\bTODO\b",
    re.I,
)
# the same in code, tests, configs and the changelog: issue numbers, group codes of a review ("G7"), red team
CODE_PROCESS = re.compile(r"\bissues?\s*#?\d+|(?<![\w&/#(`'\"])#\d+\b|\bred[ -]?team", re.I)
GROUP_CODE = re.compile(r"\bG\d+\b")
CHRONOLOGY = re.compile(r"\b(?:round|session)[ -]?\d+\b", re.I)  # the study's dated record lives in docs/results/
CODE_FOLDERS = ("bertscore_loss", "rerank", "tests", "studies/multi30k", "examples", "configs", "benchmarks", "scripts")
ABSOLUTE = re.compile(r"(?<![\w.])(?:/(?:work|tmp|home|root|Users|mnt|scratch|var|opt|data|srv)/|[A-Za-z]:\\)")


def marked_blocks() -> list[tuple[str, int, str]]:
    """(page, block number in the page, code) of every marked Python block; a page is named by its file name
    (README.md, a guide page) or, under docs/results/, by its path there."""
    found = []
    for path in DOCS:
        name = path.name if path.parent in (ROOT, ROOT / "docs") else path.relative_to(ROOT / "docs").as_posix()
        for k, code in enumerate(MARK.findall(path.read_text(encoding="utf-8"))):
            found.append((name, k, code))
    return found


def run_script(code: str, tmp_path: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout
    )


# Runs each snippet file given in its own empty folder as ``__main__`` and writes ``<file>.json`` beside it:
# its printed output and, where it raised, the traceback. Process-wide state a script may change (the working
# folder, sys.argv, sys.path, torch's thread count) is restored between snippets.
DRIVER = """
import contextlib, io, json, os, runpy, sys, traceback
from pathlib import Path
import torch

threads, path, argv = torch.get_num_threads(), list(sys.path), list(sys.argv)
for script in map(Path, sys.argv[1:]):
    folder = script.with_suffix("")
    folder.mkdir()
    os.chdir(folder)
    out, error = io.StringIO(), None
    sys.argv[:] = [str(script)]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    except BaseException:
        error = traceback.format_exc()
    finally:
        sys.path[:], sys.argv[:] = path, argv
        torch.set_num_threads(threads)
    script.with_suffix(".json").write_text(json.dumps({"stdout": out.getvalue(), "error": error}))
"""


def run_scripts(codes: dict[str, str], tmp_path: Path, timeout: int = 1200) -> dict[str, dict]:
    """{name: {"stdout": printed text, "error": traceback or None}} of each snippet run as a script."""
    scripts = [tmp_path / f"snippet{k}.py" for k in range(len(codes))]
    for script, code in zip(scripts, codes.values()):
        script.write_text(code, encoding="utf-8")
    (tmp_path / "driver.py").write_text(DRIVER, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "driver.py"), *map(str, scripts)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    results = {}
    for name, script in zip(codes, scripts):
        result = script.with_suffix(".json")
        results[name] = (
            json.loads(result.read_text(encoding="utf-8"))
            if result.is_file()
            else {"stdout": "", "error": f"the driver stopped (exit status {done.returncode}): {done.stderr[-3000:]}"}
        )
    return results


def _links_module():
    spec = importlib.util.spec_from_file_location("_check_links", ROOT / "scripts" / "check_links.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_marked_blocks_are_found():
    names = [(name, k) for name, k, _ in marked_blocks()]
    assert ("README.md", 0) in names and ("lightning.md", 0) in names
    assert sum(name == "README.md" for name, _ in names) >= 5  # one per use: score, train, rerank, Lightning, HF
    # the README's trainer block (<!-- doc-test: trainer -->) runs in tests/test_trainer.py (slow)
    for page in ("evaluate.md", "loss.md", "performance.md", "quality-tools.md", "rerank.md", "preference.md"):
        assert (page, 0) in names, page
    assert not any(n.endswith("/README.md") for n, _ in names)  # the reports show results, the guide runs code


GENERAL = [(name, k, code) for name, k, code in marked_blocks() if name not in OWN_TESTS]


@pytest.fixture(scope="module")
def general_runs(tmp_path_factory) -> dict[str, dict]:
    """The printed output (or traceback) of every GENERAL block, keyed ``page-k``."""
    return run_scripts({f"{name}-{k}": code for name, k, code in GENERAL}, tmp_path_factory.mktemp("snippets"))


@pytest.mark.slow
@pytest.mark.parametrize("name,k", [(name, k) for name, k, _ in GENERAL], ids=[f"{n}-{k}" for n, k, _ in GENERAL])
def test_marked_block_runs_as_written(name, k, general_runs):
    run = general_runs[f"{name}-{k}"]
    assert run["error"] is None, run["error"][-3000:]
    assert run["stdout"].strip(), f"{name} block {k} prints nothing: show the reader what it computes"


def test_the_snippet_driver_reports_each_script_on_its_own(tmp_path):
    """A raising snippet is reported with its traceback and does not stop the next one; each runs in its own
    folder and namespace (no variable of the one before)."""
    runs = run_scripts(
        {
            "a": "x = 1\nprint(open('f', 'w').write('1'))\nraise ValueError('boom')",
            "b": "print(sorted(globals()).count('x'))",
        },
        tmp_path,
        timeout=120,
    )
    assert "ValueError: boom" in runs["a"]["error"] and runs["a"]["stdout"] == "1\n"
    assert runs["b"] == {"stdout": "0\n", "error": None}
    assert sorted(p.name for p in tmp_path.glob("snippet*/*")) == ["f"]


@pytest.mark.slow
def test_readme_quick_start_prints_the_signature_it_shows(general_runs):
    code = next(c for name, _, c in marked_blocks() if name == "README.md")  # the first example: scoring
    run = general_runs["README.md-0"]
    assert run["error"] is None, run["error"][-3000:]
    signature = run["stdout"].strip().splitlines()[-1]
    assert signature.startswith("bertscore-loss:") and "|layer:4|" in signature
    shown = re.search(r"^# (bertscore-loss:\S+)$", code, re.M).group(1)  # the signature the README shows
    assert shown.split("|")[1:5] == signature.split("|")[1:5]  # model, layer, idf, rescale as printed
    from bertscore_loss import BERTScorer

    want = BERTScorer(device="cpu").score(["The cat sat on the mat."], ["A cat was sitting on the mat."])[2]
    assert f"F = {want.mean():.4f}" in run["stdout"]


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


def test_readme_names_the_quick_loop():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert '`python -m pytest -q -m "not slow"`' in readme  # the quick loop, named in the text
    # .ci/run runs the README's two set-up commands as written: tests/test_package.py


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


def test_readme_is_a_product_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 160
    sections = re.findall(r"^## (.+)$", readme, re.M)
    for words in ("Set up", "Score", "Train", "Rerank", "MBR", "Lightning", "Hugging Face", "What we measured"):
        assert any(words in s for s in sections), words
    table = readme.split("## What we measured", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith(("| finding", "| ---"))]
    assert 1 <= len(rows) <= 10
    for row in rows:  # each row names its machine in words and links its report
        assert re.search(r"AMD EPYC|Intel Xeon|CPU", row) and "](docs/results/" in row, row
    for page in GUIDE:  # the README links every page of the guide
        assert f"](docs/{page.name})" in readme, page.name


def test_shell_blocks_parse():
    """Every bash block of the README, the guide and the reports is valid shell (``bash -n``)."""
    blocks = [(p, k, b) for p in DOCS for k, b in enumerate(SHELL.findall(p.read_text(encoding="utf-8")))]
    assert len(blocks) >= 40
    for path, k, block in blocks:
        done = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{path.relative_to(ROOT)} shell block {k}: {done.stderr.strip()}"


def test_documented_cli_commands_exist():
    """Every ``bertscore-loss <command>`` of the README and the guide is a command of the CLI."""
    from bertscore_loss.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for path in [ROOT / "README.md", *GUIDE]:
        for block in SHELL.findall(path.read_text(encoding="utf-8")):
            for command in re.findall(r"^\s*bertscore-loss (\S+)", block, re.M):
                assert command in sub.choices, f"{path.name}: bertscore-loss {command}"


def test_no_process_words_in_the_readme_and_the_guide():
    """The README, the guide and the findings reports tell what the product does and what was found; issue
    numbers, targets met or missed, sessions and reviewers belong to the project's history."""
    found = []
    for path in USER_FACING:
        text = path.read_text(encoding="utf-8")
        for m in PROCESS.finditer(text):
            line = text[: m.start()].count("\n") + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    assert found == [], "\n".join(found)
    assert PROCESS.search("target missed") and PROCESS.search("issue 19's protocol") and PROCESS.search("#19")
    assert not PROCESS.search("the distillation target (chosen targets, `-100` at padding)")


def test_no_process_words_in_the_code_tests_configs_and_changelog():
    """The library, the tests, the Multi30k study's code and configs and the changelog name what a rule or a
    test is, not the issue, review group or red team it came from (docs/results/ keeps the study's dated
    record)."""
    files = [ROOT / "CHANGELOG.md"]
    for folder in CODE_FOLDERS:
        files += sorted(p for ext in ("*.py", "*.yaml") for p in (ROOT / folder).rglob(ext))
    found = []
    for path in files:
        if path == Path(__file__).resolve():
            continue  # the patterns' own examples below
        text = path.read_text(encoding="utf-8")
        for m in [*CODE_PROCESS.finditer(text), *GROUP_CODE.finditer(text), *CHRONOLOGY.finditer(text)]:
            line = text[: m.start()].count("\n") + 1
            found.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    assert len(files) > 100 and found == [], "\n".join(found)
    patterns = (CODE_PROCESS, GROUP_CODE, CHRONOLOGY)
    process = ("issue 14", "Issue #28", "#19", "red team", "red-team", "G10", "Multi30k round 6", "round6", "session 3")
    for word in process:
        assert any(p.search(word) for p in patterns), word
    for fine in ("g0, g1 = temps", "an issue with", "# 3 rows", "&#13;", "G = 4", "round {rnd}", "one round without"):
        assert not any(p.search(fine) for p in patterns), fine


def test_links_and_anchors_resolve():
    links = _links_module()
    files = links.markdown_files()
    assert {ROOT / "README.md", ROOT / "CHANGELOG.md", *GUIDE} <= set(files)
    assert links.check_markdown(files) == []


def test_link_checker_catches_broken_links(tmp_path):
    links = _links_module()
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "sub" / "b.md").write_text("# B — title (x)\n\n## Two words\n", encoding="utf-8")
    (tmp_path / "src.py").write_text("", encoding="utf-8")
    (docs / "a.md").write_text(
        "[ok](sub/b.md#two-words) [gone](sub/c.md) [anchor](sub/b.md#nope) [out](../src.py) [dir](sub/)\n"
        "[web](https://example.org/x) `[code](nowhere.md)` [split](sub/b.md#b--title-x)\n",
        encoding="utf-8",
    )
    problems = links.check_markdown([docs / "a.md"], root=tmp_path)
    assert [p.split(": ", 2)[1] for p in problems] == [
        "sub/c.md",
        "sub/b.md#nope",
        "../src.py",
        "sub/",
        "sub/b.md#b--title-x",
    ]
    assert "in the site" in problems[-1] and "repository view" not in problems[-1]  # slugs differ: one rule fails
    site = tmp_path / "site"
    (site / "api").mkdir(parents=True)
    (site / "index.html").write_text('<a href="api/m.html#f">x</a><a href="gone.html">y</a><h2 id="h">h</h2>')
    (site / "api" / "m.html").write_text('<div id="g"></div><a href="../index.html#h">back</a>')
    assert [p.split(": ")[1] for p in links.check_site(site)] == ["api/m.html#f", "gone.html"]


def test_every_guide_page_is_in_the_index_and_the_site():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in GUIDE:
        if page.name != "index.md":
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"
        assert re.search(rf":\s+{re.escape(page.name)}\s*$", mkdocs, re.M), f"mkdocs.yml nav lacks {page.name}"
    for report in sorted((ROOT / "docs" / "results").glob("*/README.md")):
        rel = report.relative_to(ROOT / "docs").as_posix()
        assert rel in mkdocs, f"mkdocs.yml nav lacks {rel}"
        text = report.read_text(encoding="utf-8")
        for part in ("## Conditions", "## Reproduce"):  # what was found, under what conditions, how to redo it
            assert part in text, f"{rel} has no {part!r}"


def test_every_figure_is_shown_in_the_guide():
    shown = "\n".join(p.read_text(encoding="utf-8") for p in [*GUIDE, *RESULTS])
    for figure in sorted((ROOT / "docs" / "figures").glob("*.png")):
        assert f"figures/{figure.name})" in shown, f"docs/figures/{figure.name} is embedded in no page"


def _strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, str):
        yield value


def test_committed_results_hold_no_absolute_machine_paths():
    """Paths in committed JSON are relative to the repository (runs/..., models/..., ../shared/data/...)."""
    files = sorted([*(ROOT / "docs").rglob("*.json"), *(ROOT / "docs").rglob("*.jsonl")])
    assert len(files) >= 50
    found = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        values = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if path.suffix == ".jsonl"
            else [json.loads(text)]
        )
        found += [f"{path.relative_to(ROOT)}: {s!r}" for s in _strings(values) if ABSOLUTE.search(s) or s[:1] == "/"]
    assert found == [], "\n".join(found)
    assert ABSOLUTE.search("/work/main/models/x") and ABSOLUTE.search("C:\\data") and not ABSOLUTE.search("runs/x")
