#!/usr/bin/env bash
# API reference from the docstrings: HTML pages for every public module of bertscore_loss and rerank in
# build/api/ (open build/api/index.html). Needs pdoc (in the `test` extra). Usage:
#   scripts/build_api_docs.sh [OUT_DIR]
# Each module is listed explicitly because pdoc follows a package's __all__, which names no submodules.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/api}"
modules=$(python - <<'PY'
import pkgutil

import bertscore_loss
import rerank

names = ["bertscore_loss", "rerank"]
for pkg in (bertscore_loss, rerank):
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
print(" ".join(n for n in names if not any(part.startswith("_") for part in n.split("."))))
PY
)
rm -rf "$out"
# shellcheck disable=SC2086
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 python -m pdoc --docformat restructuredtext --no-show-source \
    -o "$out" $modules
test -s "$out/index.html" && test -s "$out/bertscore_loss.html" && test -s "$out/rerank.html"
echo "API reference: $out/index.html ($(echo "$modules" | wc -w) modules)"
