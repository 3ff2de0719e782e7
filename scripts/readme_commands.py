"""Print one of the README's two set-up commands, as written, for ``.ci/run`` to run (CI cannot drift from what a
new user runs): ``setup`` (install + score on the bundled model) or ``test`` (the test command).

    python3 scripts/readme_commands.py setup   # the first ```bash block under "## Set up"
    python3 scripts/readme_commands.py test    # the second one

Standard library only (it runs before any virtual environment exists).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def commands(text: str) -> dict[str, str]:
    """The two ```bash blocks of the README's "## Set up" section: {"setup": ..., "test": ...}."""
    match = re.search(r"^## Set up\n(.*?)(?=^## )", text, re.S | re.M)
    if match is None:
        raise ValueError("README.md has no '## Set up' section")
    blocks = [b.strip() for b in re.findall(r"^```bash\n(.*?)^```", match.group(1), re.S | re.M)]
    if len(blocks) != 2 or any("\n" in b for b in blocks):
        raise ValueError(f"README.md's Set up section must hold exactly two one-line bash commands, found {blocks}")
    return {"setup": blocks[0], "test": blocks[1]}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("setup", "test"):
        sys.stderr.write("usage: readme_commands.py setup|test\n")
        return 2
    sys.stdout.write(commands(README.read_text(encoding="utf-8"))[argv[0]] + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
