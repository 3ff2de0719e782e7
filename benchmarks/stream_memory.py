"""Peak memory of streaming: ``bertscore-loss score --stream`` on 100k and 1M generated pairs.

Each size is a TSV of ``candidate<TAB>reference`` lines made of random words of the WMT16 references
(6-16 words per text, fixed seed), scored by the CLI in a child process under ``/usr/bin/time -v`` with
its scores written to a file; the peak resident set size (RSS) and the wall time are read from ``time``.
Streaming keeps memory bounded by ``--chunk-size``, so the peak should not grow with the number of pairs.

    python benchmarks/stream_memory.py                          # 100k and 1M pairs, layer 0 (about 12 min)
    python benchmarks/stream_memory.py --json docs/results/speed/performance-stream-<cpu>.json   # publish (a new file)
    python benchmarks/stream_memory.py --sizes 20000 --layer 1  # quick check
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"


def write_pairs(path: Path, n: int, seed: int = 0) -> None:
    words = (DATA / "wmt16-daseg" / "DAseg.newstest2016.reference.de-en").read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for _ in range(n):
            a = " ".join(rng.choices(words, k=rng.randint(6, 16)))
            b = " ".join(rng.choices(words, k=rng.randint(6, 16)))
            fh.write(f"{a}\t{b}\n")


def measure(pairs: Path, out: Path, layer: int, chunk: int) -> dict:
    cmd = [sys.executable, "-m", "bertscore_loss", "score", "--stream", "--pairs", str(pairs)]
    cmd += ["--layer", str(layer), "--device", "cpu", "--chunk-size", str(chunk)]
    timer = shutil.which("time", path="/usr/bin") or "/usr/bin/time"
    with open(out, "w") as fh:
        proc = subprocess.run([timer, "-v", *cmd], stdout=fh, stderr=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"scoring failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", proc.stderr).group(1)
    seconds = sum(float(x) * 60**i for i, x in enumerate(reversed(wall.split(":"))))
    lines = sum(1 for _ in open(out, encoding="utf-8"))
    return {"peak_rss_mib": rss_kb / 1024, "seconds": seconds, "scored_lines": lines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="numbers of pairs (default: %(default)s)")
    ap.add_argument("--layer", type=int, default=0, help="encoder layer; low for speed (default: %(default)s)")
    ap.add_argument("--chunk-size", type=int, default=4096)
    ap.add_argument(
        "--json", type=Path, default=None, help="JSON file (default: runs/performance-stream.json; docs/ when given)"
    )
    add_overwrite_argument(ap)
    args = ap.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": args.json is not None, "flag": "--json"}
    args.json = args.json or ROOT / "runs" / "performance-stream.json"
    check_outputs_or_exit(ap, [args.json], **rules)
    if not Path("/usr/bin/time").exists():
        raise SystemExit("needs /usr/bin/time (Debian package 'time')")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(s) for s in args.sizes.split(",")):
            pairs = Path(tmp) / f"pairs-{n}.tsv"
            t0 = time.perf_counter()
            write_pairs(pairs, n)
            print(f"  generated {n} pairs in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            row = {"pairs": n, "layer": args.layer, "chunk_size": args.chunk_size}
            row.update(measure(pairs, Path(tmp) / "scores.tsv", args.layer, args.chunk_size))
            row["pairs_per_s"] = n / row["seconds"]
            if row["scored_lines"] != n:
                raise SystemExit(f"{row['scored_lines']} score lines for {n} pairs")
            results.append(row)
            print(f"  {row}", file=sys.stderr, flush=True)
            pairs.unlink()
    print("| pairs | layer | chunk | peak RSS (MiB) | seconds | pairs/s |\n|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['pairs']:,} | {r['layer']} | {r['chunk_size']} | {r['peak_rss_mib']:.0f} | {r['seconds']:.0f} "
            f"| {r['pairs_per_s']:.0f} |"
        )
    write_text(
        args.json, json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "rows": results}, indent=2) + "\n", **rules
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
