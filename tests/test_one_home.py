"""One helper, one home: native bf16 detection, the CPU label, token-budget batching and the line reader
are each defined once, and every package, study, benchmark, example and script uses that definition."""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from bertscore_loss import machine
from bertscore_loss.machine import (
    budget_groups,
    cpu_bf16_flags,
    cpu_flags,
    cpu_has_native_bf16,
    cpu_label,
    cpu_model,
    native_bf16,
)
from rerank.sampling import native_bf16 as rerank_native_bf16

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("bertscore_loss", "rerank", "benchmarks", "studies", "examples", "scripts")
MACHINE, TEXTIO = "bertscore_loss/machine.py", "bertscore_loss/textio.py"

# family -> (the names of its functions, their one home, the functions the home must define)
FAMILIES = {
    "native bf16": (
        re.compile(r"^_?(cpu_has|native)\w*bf16"),
        MACHINE,
        {"cpu_has_native_bf16", "native_bf16"},
    ),
    "CPU description": (
        re.compile(r"^_?cpu_(label|info|flags|model|bf16_flags)$"),
        MACHINE,
        {"cpu_label", "cpu_flags", "cpu_model", "cpu_bf16_flags"},
    ),
    "token-budget batching": (re.compile(r"budget_(batches|groups)|length_groups"), MACHINE, {"budget_groups"}),
    "line reader": (re.compile(r"^_?read_lines$"), TEXTIO, {"read_lines"}),
}
# public names kept outside the home: each body is one call of the home's function of that name
DELEGATIONS = {("rerank/sampling.py", "native_bf16"): "native_bf16"}
# definitions still outside their home, with the reason; an entry whose definition is gone fails
KNOWN_OUTSIDE: dict[tuple[str, str], str] = {}

AMX = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
vmx flags\t: vnmi preemption_timer

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu vme avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""
AVX512 = """processor\t: 0
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu avx2 avx512f avx512_bf16 avx512_vnni
"""
NEITHER = """processor\t: 0
model name\t: AMD EPYC 7R13 Processor
flags\t\t: fpu avx2 fma
bugs\t\t: sysret_ss_attrs
"""


def _definitions() -> list[tuple[str, str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    found.append((rel, node.name, node))
    return found


DEFINITIONS = _definitions()


@pytest.mark.parametrize("family", FAMILIES)
def test_each_helper_is_defined_only_in_its_home(family):
    pattern, home, expected = FAMILIES[family]
    defined = [(rel, name) for rel, name, _ in DEFINITIONS if pattern.search(name)]
    assert expected <= {name for rel, name in defined if rel == home}  # the home defines the family
    elsewhere = sorted(
        (rel, name)
        for rel, name in defined
        if rel != home and (rel, name) not in DELEGATIONS and (rel, name) not in KNOWN_OUTSIDE
    )
    assert elsewhere == [], f"{family}: define it once, in {home}, and import it from there"


def test_the_known_exceptions_still_exist():
    defined = {(rel, name) for rel, name, _ in DEFINITIONS}
    assert set(KNOWN_OUTSIDE) <= defined  # a moved definition leaves the list


def test_rerank_native_bf16_is_one_call_of_the_home():
    for (rel, name), target in DELEGATIONS.items():
        (node,) = [n for r, nm, n in DEFINITIONS if r == rel and nm == name]
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        assert len(body) == 1 and isinstance(body[0], ast.Return), f"{rel}::{name} must only delegate"
        call = body[0].value
        assert isinstance(call, ast.Call)
        assert ast.unparse(call.func) == f"machine.{target}"
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        imports = [ast.unparse(n) for n in tree.body if isinstance(n, ast.ImportFrom)]
        assert "from bertscore_loss import machine" in imports


def test_rerank_native_bf16_answers_what_the_home_answers(monkeypatch):
    answer = object()
    seen = []
    monkeypatch.setattr(machine, "native_bf16", lambda device="cpu": seen.append(device) or answer)
    assert rerank_native_bf16("cuda:1") is answer
    assert seen == ["cuda:1"]


# --- the machine helpers on a given /proc/cpuinfo ------------------------------------------------------
@pytest.fixture
def cpuinfo(monkeypatch):
    """Set the text ``/proc/cpuinfo`` reads as (None: it cannot be read)."""

    def use(text: str | None) -> None:
        monkeypatch.setattr(machine, "_cpuinfo", lambda: text)

    return use


def _load_benchmark(name: str, monkeypatch):
    path = ROOT / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_one_home_{name}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "text,flags,label,tag",
    [
        (AMX, ["amx_bf16", "avx512_bf16"], "Intel(R) Xeon(R) Processor (amx_bf16, avx512_bf16)", "amx"),
        (AVX512, ["avx512_bf16"], "AMD EPYC 9R14 96-Core Processor (avx512_bf16)", "avx512bf16"),
        (NEITHER, [], "AMD EPYC 7R13 Processor (no native bf16)", "nobf16"),
    ],
    ids=["amx", "avx512", "neither"],
)
def test_flags_native_bf16_and_label_from_cpuinfo(cpuinfo, monkeypatch, text, flags, label, tag):
    cpuinfo(text)
    assert "fpu" in cpu_flags() and "vnmi" not in cpu_flags()  # the flags lines only, not "vmx flags"
    assert cpu_bf16_flags() == flags
    assert cpu_has_native_bf16() is bool(flags)
    assert native_bf16("cpu") is bool(flags) and rerank_native_bf16("cpu") is bool(flags)
    assert native_bf16("meta") is False
    assert cpu_label() == label
    assert _load_benchmark("eval_speed", monkeypatch).cpu_bf16_label() == tag  # the file-name tag, from the flags


def test_an_unreadable_cpuinfo_never_assumes_native_bf16(cpuinfo, monkeypatch):
    cpuinfo(None)
    monkeypatch.setattr(machine.platform, "processor", lambda: "")
    monkeypatch.setattr(machine.platform, "machine", lambda: "")
    assert cpu_flags() is None and cpu_bf16_flags() == []
    assert cpu_has_native_bf16() is False  # emulated bf16 is slow and rounds differently
    assert native_bf16("cpu") is False and rerank_native_bf16("cpu") is False
    assert cpu_model() == "unknown CPU"
    assert cpu_label() == "unknown CPU (no native bf16)"
    assert _load_benchmark("eval_speed", monkeypatch).cpu_bf16_label() == "unknown"
    monkeypatch.setattr(machine.platform, "processor", lambda: "arm")
    assert cpu_label() == "arm (no native bf16)"  # not Linux: the platform names the processor


def test_the_cpuinfo_file_is_read_and_a_missing_one_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(machine, "CPUINFO", str(tmp_path / "cpuinfo"))
    try:
        (tmp_path / "cpuinfo").write_text(AVX512, encoding="utf-8")
        machine._cpuinfo.cache_clear()
        assert machine._cpuinfo() == AVX512 and cpu_label() == "AMD EPYC 9R14 96-Core Processor (avx512_bf16)"
        (tmp_path / "cpuinfo").unlink()
        machine._cpuinfo.cache_clear()
        assert machine._cpuinfo() is None and cpu_has_native_bf16() is False
    finally:
        machine._cpuinfo.cache_clear()  # the next call reads the real file again


# --- token-budget batching ----------------------------------------------------------------------------
def test_budget_groups_by_hand():
    lengths = [3, 5, 2, 5, 1]  # longest first, ties in index order: rows 1, 3, 0, 2, 4
    assert budget_groups(lengths, 10) == [[1, 3], [0, 2, 4]]  # 2 × 5 = 10 fits; then 3 × 3 = 9
    assert budget_groups(lengths, 9) == [[1], [3], [0, 2, 4]]  # 2 × 5 = 10 > 9
    assert budget_groups(lengths, 10, per_row=2) == [[1], [3], [0], [2, 4]]  # 2 × 3 × 2 = 12 > 10; 2 × 2 × 2 = 8
    assert budget_groups([20, 1], 10) == [[0], [1]]  # a row over the budget still forms a group, alone
    assert budget_groups([0, 0, 0], 1) == [[0, 1, 2]]  # empty rows cost nothing
    assert budget_groups([], 10) == []


def _greedy(lengths: Sequence[int], per_row: int, budget: int) -> list[list[int]]:
    """The batcher the beam decoder and the risk's log-probabilities used, word for word."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] * per_row <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def test_budget_groups_equal_the_greedy_batcher_they_replace():
    rng = random.Random(0)
    for _ in range(500):
        lengths = [rng.randint(0, 40) for _ in range(rng.randint(0, 30))]
        per_row, budget = rng.randint(1, 6), rng.randint(1, 400)
        assert budget_groups(lengths, budget, per_row=per_row) == _greedy(lengths, per_row, budget)
