#!/usr/bin/env bash
# The quick test loop on the oldest transformers the project declares (pyproject.toml: `transformers>=X.Y`, run
# on X.Y.0), in a second virtual environment beside .venv: torch first, then the project with transformers
# pinned. The newest transformers is covered by .ci/run's own environment.
#
#   scripts/ci_oldest_transformers.sh                      # makes .venv-oldest (anew if it holds another pin)
#   TRANSFORMERS="transformers==5.3.0" VENV=.venv-530 scripts/ci_oldest_transformers.sh   # another pin
#   scripts/ci_oldest_transformers.sh tests/test_compat.py # arguments go to pytest
#   scripts/ci_oldest_transformers.sh --prepare            # make the environment only (.ci/run: in the background)
#
# .ci/run calls it after the main test command. Where TRL does not install beside the pin it is left out and
# the quick loop deselects the tests named for it (`-k "not trl"`). Everything else runs with CI=true: a skip
# is a failure. Name no environment with "t5" in its path: bert-score loads any model path containing "t5"
# as a T5 encoder, so its scores (the parity oracle) would be wrong.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export CI=true
VENV=${VENV:-.venv-oldest}
floor=$(python3 -c 'import re; print(re.search(r"\"transformers>=([0-9.]+)\"", open("pyproject.toml").read()).group(1))')
[[ $floor =~ ^[0-9]+\.[0-9]+$ ]] && floor="$floor.0"
TRANSFORMERS=${TRANSFORMERS:-transformers==$floor}
pinned=${TRANSFORMERS#*==}
if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import transformers; print(transformers.__version__)' 2>/dev/null)" != "$pinned" ]; then
    echo "$VENV holds another transformers than $pinned: made anew" >&2
    rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q torch==2.13.0
    # the test extra without TRL, read from pyproject.toml; TRL afterwards, where the pin allows it
    mapfile -t TEST_DEPS < <("$VENV/bin/python" - <<'EOF'
import tomllib

extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print("\n".join(dep for dep in extras["test"] if not dep.startswith("trl")))
EOF
)
    "$VENV/bin/pip" install -q -e ".[bundled]" "$TRANSFORMERS" "${TEST_DEPS[@]}"
    "$VENV/bin/pip" install -q "trl>=0.14" "$TRANSFORMERS" || echo "TRL does not install beside $TRANSFORMERS" >&2
fi
"$VENV/bin/python" -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
[ "${1:-}" = "--prepare" ] && exit 0
select=()
"$VENV/bin/python" -c "import trl" 2>/dev/null || select=(-k "not trl")
start=$(date +%s)
status=0
"$VENV/bin/python" -m pytest -q -m "not slow" "${select[@]}" -p no:cacheprovider "$@" || status=$?
echo "quick loop on $("$VENV/bin/python" -c 'import transformers; print(transformers.__version__)'): $(( $(date +%s) - start )) s"
exit $status
