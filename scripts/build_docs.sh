#!/usr/bin/env bash
# The documentation site, offline and in well under a minute: the user guide (docs/, built by mkdocs with
# --strict: a missing page or anchor fails) and the API reference (pdoc, from the docstrings of every public
# module of bertscore_loss and rerank) into one folder, then every link and anchor of the markdown and of
# the built HTML checked (scripts/check_links.py). Needs mkdocs and pdoc (the `test` extra). Usage:
#   scripts/build_docs.sh [OUT_DIR]        # default build/site; open OUT_DIR/index.html
# pdoc lists each module explicitly because it follows a package's __all__, which names no submodules.
# Private modules (a name part starting with _) and the deprecated shims of their old paths are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/site}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rm -rf "$out"
if ! log=$(python -m mkdocs build --strict --site-dir "$out" 2>&1); then  # (--quiet would hide the warnings
  echo "$log" | grep -E '^(WARNING|ERROR|Aborted)' >&2                      #  that --strict counts)
  exit 1
fi
modules=$(python - <<'PY'
import pkgutil

import bertscore_loss
import rerank

names = ["bertscore_loss", "rerank"]
for pkg in (bertscore_loss, rerank):
    names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
shims = {f"bertscore_loss.{m}" for m in bertscore_loss._SHIMS}  # deprecated old paths of private modules
print(" ".join(n for n in names if n not in shims and not any(part.startswith("_") for part in n.split("."))))
PY
)
# shellcheck disable=SC2086
python -m pdoc --docformat restructuredtext --no-show-source -o "$out/api" $modules
test -s "$out/index.html" && test -s "$out/api/index.html" && test -s "$out/api/bertscore_loss.html"
python scripts/check_links.py --site "$out"
echo "documentation: $out/index.html (guide) and $out/api/index.html ($(echo "$modules" | wc -w) modules)"
