"""The public API: what each root exports, where every other name lives, and the one-release deprecation of
the names the roots exported before and of the engine modules' old (public) paths.

The roots ``bertscore_loss`` and ``rerank`` export a short, fixed list; every other name lives in a public
submodule. A removed root name still resolves for one release with a ``DeprecationWarning`` naming its new
home; the engine modules are private (``bertscore_loss._pipeline``, ...) and their old paths are shims that warn
on import. Nothing in the repository uses a deprecated path: a static scan of the code and the docs checks it,
and pytest turns our own deprecation warnings into errors (``filterwarnings`` in pyproject.toml)."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import bertscore_loss
import rerank

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
CODE_FOLDERS = ("bertscore_loss", "rerank", "tests", "studies", "benchmarks", "examples", "scripts")

BERTSCORE_LOSS_ROOT = {
    "BERTScorer",
    "ScorerConfig",
    "Scores",
    "bertscore",
    "BERTScoreLoss",
    "LossConfig",
    "MinimumRiskLoss",
    "PreferenceLoss",
    "PreferenceConfig",
    "sequence_log_probs",
    "target_log_probs",
    "VocabBridge",
    "Signature",
    "bundled_model_path",
    "BERTScoreWarning",
    "ModelNotFoundError",
    "BaselineNotFoundError",
}
RERANK_ROOT = {
    "NBestReranker",
    "mbr",
    "generate_and_rerank",
    "sample_ids",
    "SamplingConfig",
    "get_utility",
    "register_utility",
    "Utility",
    "build_mbr_data",
    "MBRDataConfig",
    "MBRTrainer",
    "MBRTrainingConfig",
    "paired_bootstrap",
    "read_mbr_examples",
    "select_pairs",
}


def _homes(groups: dict[str, str]) -> dict[str, str]:
    return {name: home for names, home in groups.items() for name in names.split()}


# every other name the roots exported in 0.1.0 -> its public home
BERTSCORE_LOSS_MOVED = _homes(
    {
        "load_baseline read_baseline write_baseline": "bertscore_loss.baseline",
        "SentencePieceVocab": "bertscore_loss.bridge",
        "MEASURES Measure check_measure": "bertscore_loss.config",
        "FrozenEncoder PackedEmbeddings": "bertscore_loss.encoder",
        "idf_table token_weights": "bertscore_loss.idf",
        "LossOutput": "bertscore_loss.loss",
        "Matches cosine_matrix f_score greedy_match matched_similarities precision_recall_f rescale soft_max": (
            "bertscore_loss.matching"
        ),
        "DPOTerms PreferenceOutput dpo_loss": "bertscore_loss.preference",
        "encoder_for get_encoder": "bertscore_loss.registry",
        "RiskOutput": "bertscore_loss.risk",
        "PRF match_blocks reduce_references scorer_from": "bertscore_loss.scorer",
        "LogitConfig SearchConfig SearchResult coordinate_search frequent_tokens optimise_logits token_log_prior": (
            "bertscore_loss.search"
        ),
    }
)
RERANK_MOVED = _homes(
    {
        "BERTScoreUtility": "rerank.bertscore_utility",
        "GenerateRerankOutput sequence_scores": "rerank.generate",
        "METHODS Aggregate AggregateExact Agreement Exact MBRResult Method Prune agreement gain_share get_method": (
            "rerank.mbr"
        ),
        "BLEU BLEUConfig ChrF ChrFConfig": "rerank.ngram_utility",
        "MBRExample PreferencePair": "rerank.preference_data",
        "UTILITIES UtilityLike": "rerank.registry",
        "RerankResult expected_utility": "rerank.reranker",
        "Samples filter_logits native_bf16": "rerank.sampling",
        "PairedBootstrapResult paired_bootstrap_scores": "rerank.significance",
        "CallableUtility Session": "rerank.utility",
        "MBRDataset": "rerank.trainer",
    }
)
MOVED = {"bertscore_loss": BERTSCORE_LOSS_MOVED, "rerank": RERANK_MOVED}
# rerank.trainer imports transformers' Trainer: its names resolve in the slow tests
REMOVED = [
    pytest.param(root, name, home, id=f"{root}.{name}", marks=[pytest.mark.slow] if home == "rerank.trainer" else [])
    for root, moved in MOVED.items()
    for name, home in sorted(moved.items())
]
# the engine modules, private by name; their old paths bertscore_loss.<name> are shims for one release
PRIVATE = ("pipeline", "pairs", "chunking", "loading", "tokens", "packed", "blocks")
SHIMS = {f"bertscore_loss.{m}": f"bertscore_loss._{m}" for m in PRIVATE}


# --- the roots ---------------------------------------------------------------------------------------------
def test_the_roots_export_exactly_the_public_names():
    assert set(bertscore_loss.__all__) == BERTSCORE_LOSS_ROOT | {"__version__"}
    assert set(rerank.__all__) == RERANK_ROOT
    assert len(BERTSCORE_LOSS_ROOT) <= 20 and len(RERANK_ROOT) <= 15
    for package in (bertscore_loss, rerank):
        assert len(package.__all__) == len(set(package.__all__))
        assert dir(package) == sorted(package.__all__)  # dir() lists only the public names


@pytest.mark.parametrize(
    "package,names",
    [
        pytest.param(bertscore_loss, bertscore_loss.__all__, id="bertscore_loss"),
        pytest.param(rerank, [n for n in rerank.__all__ if n not in rerank._TRAINER], id="rerank"),
        pytest.param(rerank, rerank._TRAINER, id="rerank-trainer", marks=pytest.mark.slow),  # imports the Trainer
    ],
)
def test_every_root_name_resolves_without_a_warning_and_none_is_a_module(package, names, recwarn):
    for name in names:
        value = getattr(package, name)
        assert not isinstance(value, types.ModuleType), f"{package.__name__}.{name} re-exports a module"
        assert name == "__version__" or not name.startswith("_")
    assert [str(w.message) for w in recwarn if re.match(r"(bertscore_loss|rerank)\.", str(w.message))] == []


def test_the_moved_names_are_the_roots_former_exports():
    """The tables of the roots' __getattr__ equal this test's: each former name has one public home."""
    assert bertscore_loss._MOVED == BERTSCORE_LOSS_MOVED and rerank._MOVED == RERANK_MOVED
    assert len(BERTSCORE_LOSS_MOVED) + len(BERTSCORE_LOSS_ROOT) - 1 == 53  # target_log_probs is new at the root
    assert len(RERANK_MOVED) + len(RERANK_ROOT) - 2 == 45  # build_mbr_data, MBRDataConfig are new at the root
    for root, moved in MOVED.items():
        assert not set(moved) & set(importlib.import_module(root).__all__)
        for home in set(moved.values()):
            assert not any(part.startswith("_") for part in home.split(".")), f"{home} is private"


@pytest.mark.parametrize("root,name,home", REMOVED)
def test_a_removed_root_name_warns_and_is_its_homes_object(root, name, home):
    package = importlib.import_module(root)
    message = rf"^{root}\.{name} is deprecated: import it from {re.escape(home)} .*removed in the next release"
    with pytest.warns(DeprecationWarning, match=message) as record:
        value = getattr(package, name)
    assert value is getattr(importlib.import_module(home), name)
    assert record[0].filename == __file__  # the warning points at the caller
    assert name not in dir(package)
    with pytest.warns(DeprecationWarning, match=message):
        namespace: dict = {}
        exec(f"from {root} import {name}", namespace)  # the import statement form
    assert namespace[name] is value


def test_our_deprecation_warnings_are_errors_in_the_test_run():
    """pyproject.toml's filterwarnings: a message starting with ``bertscore_loss.`` or ``rerank.`` is an error."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    entries = config["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert "error:(bertscore_loss|rerank)\\.:DeprecationWarning" in entries
    pattern = r"(bertscore_loss|rerank)\."
    assert re.match(pattern, "bertscore_loss.pipeline is private and moved to bertscore_loss._pipeline")
    assert re.match(pattern, "rerank.ChrF is deprecated: import it from rerank.ngram_utility")
    assert not re.match(pattern, "torch.foo is deprecated; see bertscore_loss.x")  # the message's start only
    with pytest.raises(DeprecationWarning, match=r"^bertscore_loss\.cosine_matrix "):
        getattr(bertscore_loss, "cosine_matrix")  # noqa: B009
    with pytest.raises(DeprecationWarning, match=r"^rerank\.Exact "):
        getattr(rerank, "Exact")  # noqa: B009


def test_an_unknown_root_name_is_an_attribute_error():
    for package in (bertscore_loss, rerank):
        with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
            package.no_such_name  # noqa: B018


def test_rerank_mbr_is_the_function_at_the_root_and_a_module_below_it():
    mbr_module = importlib.import_module("rerank.mbr")
    assert callable(rerank.mbr) and rerank.mbr is mbr_module.mbr
    from rerank.mbr import Exact

    assert Exact is mbr_module.Exact


# --- the engine modules' old paths ---------------------------------------------------------------------------
@contextlib.contextmanager
def _forgotten(module: str):
    """``module`` out of sys.modules (and off its package) while the block runs, then as before."""
    parent, _, leaf = module.rpartition(".")
    package = importlib.import_module(parent)
    saved = sys.modules.pop(module, None)
    attribute = package.__dict__.pop(leaf, None)
    try:
        yield
    finally:
        sys.modules.pop(module, None)
        package.__dict__.pop(leaf, None)
        if saved is not None:
            sys.modules[module] = saved
        if attribute is not None:
            setattr(package, leaf, attribute)


@pytest.mark.parametrize("old,new", sorted(SHIMS.items()))
def test_an_old_module_path_warns_and_exposes_the_private_modules_names(old, new):
    private = importlib.import_module(new)
    with _forgotten(old):
        message = (
            rf"^{re.escape(old)} is private and moved to {re.escape(new)}; the shim is removed in the next release"
        )
        with pytest.warns(DeprecationWarning, match=message):
            shim = importlib.import_module(old)
        assert shim.__all__ == private.__all__ and shim.__all__
        for name in private.__all__:
            assert getattr(shim, name) is getattr(private, name), name


@pytest.mark.slow
def test_old_paths_warn_in_a_fresh_interpreter_at_the_importers_line():
    """A fresh process: each shim warns once, pointing at the import statement, as does a removed root name;
    importing every public module of both packages imports no shim and warns nothing of ours."""
    code = (
        "import sys, pkgutil, importlib, bertscore_loss, rerank\n"
        "public = [m.name for p in (bertscore_loss, rerank)"
        " for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')"
        " if not any(part.startswith('_') for part in m.name.split('.'))"
        f" and m.name not in {sorted(SHIMS)!r}]\n"
        "for name in public: importlib.import_module(name)\n"
        f"assert not [m for m in {sorted(SHIMS)!r} if m in sys.modules], 'a public module imports a shim'\n"
        "print('public modules', len(public), flush=True)\n"
        "import warnings; warnings.simplefilter('always')\n"
        + "".join(f"import {old}\n" for old in sorted(SHIMS))
        + "from bertscore_loss import cosine_matrix\nfrom rerank import ChrF\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "error:bertscore_loss.:DeprecationWarning", "-W", "error:rerank.:DeprecationWarning"]
        + ["-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) >= 30
    for old, new in SHIMS.items():
        line = _line_of(code, f"import {old}")
        assert f"<string>:{line}: DeprecationWarning: {old} is private and moved to {new}" in run.stderr
    assert re.search(r"<string>:\d+: DeprecationWarning: bertscore_loss\.cosine_matrix is deprecated", run.stderr)
    assert re.search(r"<string>:\d+: DeprecationWarning: rerank\.ChrF is deprecated", run.stderr)


def _line_of(code: str, line: str) -> int:
    return code.splitlines().index(line) + 1


# --- nothing in the repository uses a deprecated path -------------------------------------------------------
def _module_of(rel: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = Path(rel).with_suffix("").parts[:-1]
    base = list(package[: len(package) - node.level + 1])
    return ".".join(base + ([node.module] if node.module else []))


def deprecated_uses(source: str, rel: str) -> list[str]:
    """Imports of a shim or of a removed root name in the Python ``source`` of the file ``rel`` (relative to
    the repository, for relative imports), and ``root.name`` attribute uses of those."""
    tree = ast.parse(source, filename=rel)
    found, roots = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in SHIMS:
                    found.append(f"{node.lineno}: import {alias.name}")
                top = alias.name.split(".")[0]
                if top in MOVED and (alias.asname is None or alias.name == top):
                    roots[alias.asname or top] = top
        elif isinstance(node, ast.ImportFrom):
            module = _module_of(rel, node)
            if module in SHIMS:
                found.append(f"{node.lineno}: from {module} import ...")
            for alias in node.names if module in MOVED else ():
                if alias.name in MOVED[module] or f"{module}.{alias.name}" in SHIMS:
                    found.append(f"{node.lineno}: from {module} import {alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in roots:
            root = roots[node.value.id]
            if node.attr in MOVED[root] or f"{root}.{node.attr}" in SHIMS:
                found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_code_in_the_repository_uses_a_deprecated_path():
    files = [p for folder in CODE_FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]
    found = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        found += [f"{rel}:{use}" for use in deprecated_uses(path.read_text(encoding="utf-8"), rel)]
    assert len(files) > 100 and found == [], "\n".join(found)


def test_the_scan_finds_each_kind_of_deprecated_use():
    source = (
        "import bertscore_loss\nimport bertscore_loss.pipeline\nimport rerank as rr\n"
        "from bertscore_loss import cosine_matrix\nfrom .. import loading\nfrom ..packed import PackedEmbeddings\n"
        "from rerank import ChrF, mbr\nx = bertscore_loss.idf_table, rr.Exact, bertscore_loss.BERTScorer\n"
    )
    uses = deprecated_uses(source, "bertscore_loss/lightning/probe.py")
    assert [u.split(": ", 1)[1] for u in uses] == [
        "import bertscore_loss.pipeline",
        "from bertscore_loss import cosine_matrix",
        "from bertscore_loss import loading",
        "from bertscore_loss.packed import ...",
        "from rerank import ChrF",
        "bertscore_loss.idf_table",
        "rr.Exact",
    ]


def _markdown() -> list[Path]:
    """The pages a user reads today; the dated records under docs/results/ keep the names of their time."""
    results = ROOT / "docs" / "results"
    pages = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if results not in p.parents)]
    return pages + [p for f in ("studies", "examples", "benchmarks") for p in sorted((ROOT / f).rglob("*.md"))]


def test_the_docs_use_no_deprecated_path_and_name_no_private_module():
    """README, the guide and the study pages: no removed root name (in an import or as
    ``root.name``), no old module path, no private module."""
    found = []
    for page in _markdown():
        text = page.read_text(encoding="utf-8")
        uses = [m for m in re.finditer(r"\b(bertscore_loss|rerank)\.(\w+)", text) if m.group(2) in MOVED[m.group(1)]]
        uses += [m for m in re.finditer(r"\bbertscore_loss\.(\w+)\b", text) if m.group(0) in SHIMS]
        uses += list(re.finditer(r"\b(?:bertscore_loss|rerank)\._[a-z]\w*", text))
        for m in re.finditer(r"\bfrom (bertscore_loss|rerank) import (\([^)]*\)|[^\n]*)", text):
            names = re.findall(r"\w+", m.group(2).split("#")[0])
            uses += [m] if set(names) & (set(MOVED[m.group(1)]) | {s.split(".")[1] for s in SHIMS}) else []
        found += [f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}: {m.group(0)}" for m in uses]
    assert found == [], "\n".join(found)


@pytest.mark.slow  # the module walk imports every subpackage (Lightning, the integrations)
def test_the_api_reference_lists_no_private_module_and_no_shim():
    """The module list scripts/build_docs.sh gives pdoc, and the site's navigation."""
    script = (ROOT / "scripts" / "build_docs.sh").read_text(encoding="utf-8")
    code = re.search(r"python - <<'PY'\n(.*?)\nPY\n", script, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "build_docs.sh", "exec"), {"__name__": "__build_docs__"})
    modules = out.getvalue().split()
    assert {"bertscore_loss", "rerank", "bertscore_loss.scorer", "rerank.mbr", "rerank.trainer"} <= set(modules)
    assert not [m for m in modules if m in SHIMS or any(part.startswith("_") for part in m.split("."))]
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert not re.search(r"\b(?:bertscore_loss|rerank)\._", nav) and not any(s in nav for s in SHIMS)
