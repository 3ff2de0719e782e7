"""Every given script parses ``--help``: one interpreter for all of them (torch and transformers import once).

Files without a ``__main__`` guard are modules, not scripts, and are passed over. Each script runs as
``__main__`` with ``sys.argv = [path, "--help"]`` and must exit 0 with a usage text;
between scripts, ``sys.path`` is restored and the modules a script imported from outside the installed
packages are dropped, so two scripts with a sibling module of the same name do not see each other's.

    python scripts/check_help.py benchmarks/[a-z]*.py studies/multi30k/[a-z]*.py
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bertscore_loss", "rerank")
PREFIX = str(Path(sys.prefix).resolve())  # a virtual environment inside the repository holds no script modules


def check(path: str) -> str | None:
    """The reason ``path --help`` fails, or ``None`` when it prints a usage text and exits 0."""
    saved_path, saved_argv, saved_modules = list(sys.path), list(sys.argv), set(sys.modules)
    sys.argv = [path, "--help"]
    sys.path.insert(0, str(Path(path).resolve().parent))
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_path(path, run_name="__main__")
    except SystemExit as stop:
        if stop.code not in (0, None):
            return f"exit status {stop.code}"
    except Exception as error:  # noqa: BLE001 - reported with the script's name
        return f"{type(error).__name__}: {error}"
    else:
        return "returned without parsing --help"
    finally:
        sys.path[:], sys.argv[:] = saved_path, saved_argv
        for name in set(sys.modules) - saved_modules:
            file = getattr(sys.modules[name], "__file__", None) or ""
            if name.split(".")[0] not in PACKAGES and file.startswith(str(ROOT)) and not file.startswith(PREFIX):
                del sys.modules[name]
    return None if "usage:" in out.getvalue() else "printed no usage text"


def main(paths: list[str]) -> int:
    """Checks the given files that are scripts (a ``__main__`` guard); modules beside them are passed over."""
    paths = [p for p in paths if 'if __name__ == "__main__"' in Path(p).read_text(encoding="utf-8")]
    start, failed = time.perf_counter(), 0
    for path in paths:
        reason = check(path)
        if reason is not None:
            failed += 1
            print(f"check_help: {path} --help failed: {reason}", file=sys.stderr)
    seconds = time.perf_counter() - start
    print(f"check_help: {len(paths) - failed} of {len(paths)} scripts parse --help ({seconds:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
