"""The study's tests run under the project's test rules: the fixtures of ``tests/conftest.py``, its
``needs_data`` gate, and its rule that under ``CI=true`` a skipped test (or module) is a failed one."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.conftest import *  # noqa: E402, F403  (the shared fixtures)
from tests.conftest import (  # noqa: E402, F401  (the hooks, named so that pytest registers them here too)
    pytest_make_collect_report,
    pytest_runtest_makereport,
    pytest_runtest_setup,
)
