"""``bertscore-loss baseline`` in layer windows, for models whose every-layer embeddings do not fit in memory.

``bertscore-loss baseline`` keeps the embeddings of all layers 0..L at once: ``(L + 1) × tokens × d × 4``
bytes, 17.5 GB for all-mpnet-base-v2 (13 × 438k tokens × 768) on the shipped-baseline corpus. This
script computes the same file in windows of ``--window`` layers: for each window ``lo..hi`` it loads the
encoder truncated at ``hi``, keeps only the hidden states ``lo..hi`` and calls the very function the
command calls, :func:`bertscore_loss.quality.baseline_tool.baseline_from_corpus` (same sorted corpus, same
pairs from ``--seed``, same scoring), so each row equals the command's row (``tests/test_accurate.py``
checks it). Peak memory is ``window × tokens × d × 4`` bytes; the encoder runs once per window, up to
``hi`` only.

    python benchmarks/baseline_windows.py --corpus FILES... --pairs 100000 --seed 0 --model mpnet \\
        --device cpu --window 4 -o runs/baseline-mpnet.tsv
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from types import SimpleNamespace
from typing import Any

from torch import nn


class _LayerWindow(nn.Module):
    """Wraps a Hugging Face encoder so that its ``hidden_states`` are those of layers ``lo..`` only."""

    def __init__(self, model: nn.Module, lo: int) -> None:
        super().__init__()
        self.inner = model
        self.lo = lo
        self.config = model.config

    def forward(self, **kwargs: Any) -> SimpleNamespace:
        out = self.inner(**kwargs)
        return SimpleNamespace(hidden_states=tuple(out.hidden_states[self.lo :]))


def windowed_baseline(
    sentences: list[str],
    model: str | None,
    *,
    window: int = 4,
    pairs: int = 100_000,
    seed: int = 0,
    device: str | None = None,
    dtype: str = "float32",
    batch_tokens: int | None = None,
    progress: bool | None = None,
) -> dict[int, tuple[float, float, float]]:
    """``baseline_from_corpus(sentences, model, ...)`` computed ``window`` layers at a time: ``{layer: (P, R, F)}``."""
    from bertscore_loss.encoder import FrozenEncoder
    from bertscore_loss.quality.baseline_tool import baseline_from_corpus

    if window < 1:
        raise ValueError(f"window must be at least 1 layer, got {window}")
    probe = FrozenEncoder(model, layer=0, device="cpu")
    last = probe.num_layers
    del probe
    rows: dict[int, tuple[float, float, float]] = {}
    for lo in range(0, last + 1, window):
        hi = min(lo + window - 1, last)
        t0 = time.perf_counter()
        enc = FrozenEncoder(model, layer=hi, device=device, dtype=dtype)
        enc.model = _LayerWindow(enc.model, lo)
        enc.layer = hi - lo  # embed_all_layers keeps hidden states 0..enc.layer of the wrapped model
        part = baseline_from_corpus(
            sentences, pairs=pairs, seed=seed, batch_tokens=batch_tokens, progress=progress, encoder=enc
        )
        rows.update({lo + k: v for k, v in part.items()})
        logging.info("layers %d..%d done in %.0f s", lo, hi, time.perf_counter() - t0)
        del enc
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", "-i", nargs="+", required=True, help="as `bertscore-loss baseline --corpus`")
    ap.add_argument("--pairs", type=int, default=100_000, help="number of random pairs (default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the pairs (default: %(default)s)")
    ap.add_argument("--window", type=int, default=4, help="layers per encoder pass (default: %(default)s)")
    ap.add_argument("--model", "-m", default=None, help="model name or folder (e.g. mpnet); default: bundled MiniLM")
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--batch-tokens", type=int, default=None)
    ap.add_argument("-o", "--output", required=True, help="baseline file to write")
    ap.add_argument("--overwrite", action="store_true", help="replace an output file that git tracks")
    args = ap.parse_args(argv)  # --help returns before anything heavy (torch) is imported
    from bertscore_loss.outputs import atomic_path, check_outputs_or_exit

    check_outputs_or_exit(
        ap, [args.output], inputs=args.corpus, overwrite=args.overwrite, allow_docs=True, flag="-o/--output"
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from bertscore_loss.baseline import write_baseline
    from bertscore_loss.textio import read_corpus

    sentences = read_corpus(args.corpus)
    rows = windowed_baseline(
        sentences,
        args.model,
        window=args.window,
        pairs=args.pairs,
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        batch_tokens=args.batch_tokens,
    )
    with atomic_path(
        args.output, inputs=args.corpus, overwrite=args.overwrite, allow_docs=True, flag="-o/--output"
    ) as tmp:
        write_baseline(tmp, rows)
    sys.stdout.write(f"{len(sentences)} distinct sentences, {args.pairs} random pairs, seed {args.seed}\n")
    sys.stdout.write("LAYER,P,R,F\n")
    for k, (p, r, f) in sorted(rows.items()):
        sys.stdout.write(f"{k},{p:.6f},{r:.6f},{f:.6f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
