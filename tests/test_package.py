"""The package's metadata: typed packages, the version defined once, complete project metadata, a changelog.
(Building the wheel and installing it into a fresh environment is ``scripts/check_wheel.sh``, run by CI.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import bertscore_loss
import rerank

ROOT = Path(__file__).resolve().parents[1]

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")


@pytest.fixture(scope="module")
def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_both_packages_are_typed_and_ship_the_marker(project):
    for pkg in (bertscore_loss, rerank):
        assert (Path(pkg.__file__).parent / "py.typed").is_file(), pkg.__name__
    data = project["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["bertscore_loss"] and "py.typed" in data["rerank"]
    assert "Typing :: Typed" in project["project"]["classifiers"]


def test_the_version_is_defined_once(project):
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "bertscore_loss._version.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:[.-]?\w+)?", bertscore_loss.__version__)
    assignments = [
        path.relative_to(ROOT).as_posix()
        for folder in ("bertscore_loss", "rerank")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if re.search(r"^\s*__version__\s*=", path.read_text(encoding="utf-8"), re.M)
    ]
    assert assignments == ["bertscore_loss/_version.py"]
    scorer = (ROOT / "bertscore_loss" / "scorer.py").read_text(encoding="utf-8")
    assert "from ._version import __version__" in scorer  # the signature reads it, not a copy


def test_project_metadata_is_complete(project):
    meta = project["project"]
    for key in ("name", "description", "readme", "requires-python", "license", "keywords", "classifiers"):
        assert meta.get(key), key
    assert meta["readme"] == "README.md" and meta["license"] == "MIT"
    assert any(c.startswith("Programming Language :: Python :: 3.1") for c in meta["classifiers"])
    assert not any(c.startswith("License ::") for c in meta["classifiers"])  # the SPDX `license` field says it
    assert meta["scripts"] == {"bertscore-loss": "bertscore_loss.cli:main"}
    for url in meta.get("urls", {}).values():  # only real addresses, never placeholders
        assert url.startswith("https://") and "example" not in url, url
    for tool in ("mkdocs", "build", "twine", "pdoc"):  # the docs build and the wheel check need them
        assert any(re.match(rf"{tool}\b", req) for req in meta["optional-dependencies"]["test"]), tool


def test_the_changelog_names_the_current_version():
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog.startswith("# Changelog")
    assert f"## {bertscore_loss.__version__}" in changelog


def test_ci_runs_the_readme_set_up_commands_as_written():
    import subprocess

    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'bash -euo pipefail -c "$setup"' in ci and 'bash -euo pipefail -c "$tests"' in ci
    assert "pip install" not in ci  # every install is the README's
    script = str(ROOT / "scripts" / "readme_commands.py")
    run = {k: subprocess.run([sys.executable, script, k], capture_output=True, text=True) for k in ("setup", "test")}
    assert all(r.returncode == 0 for r in run.values())
    got = {key: r.stdout.strip() for key, r in run.items()}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"```bash\n{got['setup']}\n```" in readme and f"```bash\n{got['test']}\n```" in readme
    assert "install-accurate" in got["setup"] and got["test"].endswith("python -m pytest -q")
