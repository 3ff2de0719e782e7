"""Every name that the benchmarks, scripts, examples and studies import from this project exists (also imports
inside functions, which running ``--help`` would not reach)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("bertscore_loss", "rerank")
FILES = sorted(
    p
    for folder in ("benchmarks", "scripts", "examples", "studies")
    for p in (ROOT / folder).rglob("*.py")
    if ".venv" not in p.parts
)


def _project_imports(path: Path) -> list[tuple[str, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in ("bertscore_loss", "rerank")
        ):
            out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name.split(".")[0] in OURS]
    return out


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_imported_names_exist(path):
    for module, name in _project_imports(path):
        mod = importlib.import_module(module)
        assert not name or name == "*" or hasattr(mod, name) or importlib.util.find_spec(f"{module}.{name}"), (
            f"{path.relative_to(ROOT)} imports {name!r} from {module}, which does not exist"
        )
