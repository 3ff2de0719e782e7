"""Write the committed samples of ``../shared/data`` that the tests read (run from the project root).

The samples are the first lines of each file, copied byte for byte, so a test on a sample scores the same
texts it would read from the shared folder; ``tests/test_samples.py`` checks that they still match it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[2] / "shared" / "data"
LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")
WMT16_LINES = 40  # per language pair and kind
STSB_ROWS = {"dev": 100, "train": 3000}  # 3000 train rows: enough text for an 8k-token BPE vocabulary


def head(path: Path, n: int) -> bytes:
    """The first ``n`` lines of a file (``\\n``-terminated), as bytes."""
    with open(path, "rb") as fh:
        return b"".join(fh.readline() for _ in range(n))


def samples(shared: Path = SHARED) -> dict[str, bytes]:
    """Sample file name -> its content."""
    out = {}
    for lp in LANG_PAIRS:
        for kind in ("mt-system", "reference", "human"):
            name = f"DAseg.newstest2016.{kind}.{lp}"
            out[f"wmt16-daseg/{name}"] = head(shared / "wmt16-daseg" / name, WMT16_LINES)
    for split, rows in STSB_ROWS.items():
        name = f"stsb-en-{split}.csv"
        out[f"stsb/{name}"] = head(shared / "stsb" / name, rows)  # no field of these rows spans lines
    return out


if __name__ == "__main__":
    shared = Path(sys.argv[1]) if len(sys.argv) > 1 else SHARED
    for name, content in samples(shared).items():
        (HERE / name).parent.mkdir(parents=True, exist_ok=True)
        (HERE / name).write_bytes(content)
        print(HERE / name, len(content))
