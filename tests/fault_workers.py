"""Processes for the fault tests (``tests/test_faults.py``): run as ``python -m tests.fault_workers MODE ...``
from the repository root, killed with SIGKILL while they work.

``build OUT``: :func:`rerank.build_mbr_data` of 24 sources (6 shards) with a tiny model; ``build-ddp OUT``: the
same through :func:`rerank.training_data.build_mbr_data_distributed` on two processes. With ``FAULT_STALL=1``
the utility stops in the middle of a shard once shard 0 is on disk: it writes ``OUT/.stalled`` and sleeps, so
the test kills the process mid-shard. ``assemble SPEC CACHE``: :func:`bertscore_loss.accurate.model_path` of
the parts in SPEC (JSON); with ``FAULT_STALL=1`` it stops after the first extracted file (``CACHE/.stalled``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

SOURCES = ["a cat sat", "the dog runs", "a big red house", "the bird sings", "small tree", "a mat"] * 4


class StallingOverlap:
    """Unigram F1 of word sets (``tests.test_training_data.overlap``) that stalls mid-shard under FAULT_STALL=1."""

    def __init__(self, out: str) -> None:
        self.out = out

    def __call__(self, hyps: list[str], refs: list[str]) -> torch.Tensor:
        out = Path(self.out)
        if os.environ.get("FAULT_STALL") == "1" and (out / "shard-00000.jsonl").exists():
            (out / ".stalled").write_text(str(os.getpid()))
            time.sleep(600)
        from tests.test_training_data import overlap

        return overlap(hyps, refs)


def config():
    from rerank.training_data import MBRDataConfig

    return MBRDataConfig(num_samples=6, beams=2, shard_size=4, seed=3, precision="32")


def load_tiny():
    from tests.test_training_data import load_tiny as load

    return load()


def main(argv: list[str]) -> int:
    mode, *rest = argv
    if mode == "build":
        from rerank.training_data import build_mbr_data

        model, codec = load_tiny()
        build_mbr_data(model, codec, SOURCES, rest[0], config(), utility=StallingOverlap(rest[0]), progress=False)
    elif mode == "build-ddp":
        from rerank.training_data import build_mbr_data_distributed

        build_mbr_data_distributed(load_tiny, SOURCES, rest[0], config(), utility=StallingOverlap(rest[0]), devices=2)
    elif mode == "assemble":
        from bertscore_loss import accurate

        spec, cache = rest
        parts = [accurate.Part(Path(p), h, n, v) for p, h, n, v in json.loads(spec)]
        if os.environ.get("FAULT_STALL") == "1":
            real = accurate.os.fsync

            def stall(fd: int) -> None:
                real(fd)
                (Path(cache) / ".stalled").write_text(str(os.getpid()))
                time.sleep(600)

            accurate.os.fsync = stall  # type: ignore[attr-defined]
        print(accurate.model_path(parts, cache))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
