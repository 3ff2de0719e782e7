"""Every figure of the guide, redrawn from the committed result files under ``docs/results/``.

    python scripts/figures.py                                   # writes runs/figures/*.png
    python scripts/figures.py --out docs/figures --overwrite    # only when asked: replaces the published figures

Figures (each one PNG, named below):

* ``mbr-gain.png``: BERTScore F gain of MBR over beam 5 against the number of samples, exact MBR and its
  approximations (``docs/results/mbr-multi30k/converged/*-sweep.json``, ``validation/n512-1024-*.json``);
  95 % bootstrap intervals where a sweep stores sentence-level scores (``bertscore_f_sentences``);
* ``finetuning-curves.png``: validation BERTScore F along two epochs of fine-tuning, every arm and seed
  (``docs/results/finetuning-multi30k/converged/stage2/*.result.json``);
* ``speed-ratios.png``: our speed against ``bert-score``, torchmetrics and ``mbrs``, by machine
  (``docs/results/speed/*.json``, ``docs/results/mbr-multi30k/*/mbr-speed-vs-mbrs*.json``);
* ``layer-tuning.png``: Pearson r with WMT16 human judgments of each layer of the bundled MiniLM
  (``docs/results/layer-tuning/tune-layers-wmt16/layers.csv``).

Files are written by the one write rule (``bertscore_loss.outputs``): atomically, nothing into docs/ unless
``--out`` says so, and never over a file git tracks (the published docs/figures/*.png) without ``--overwrite``.
Needs matplotlib (the ``plot`` extra).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, save_figure

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
METHOD_STYLE = {  # MBR method -> (label, colour, marker)
    "exact": ("exact", "#1f77b4", "o"),
    "aggregate-exact": ("aggregate-then-exact (top 20)", "#2ca02c", "s"),
    "aggregate": ("reference aggregation", "#ff7f0e", "^"),
    "prune": ("confidence pruning", "#9467bd", "v"),
}
DPI = 120


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def machine(cpu: str, flags: list[str] | str | None = None, native_bf16: bool | None = None) -> str:
    """A CPU named in words with its bf16 flags: ``AMD EPYC (avx512_bf16)``, ``AMD EPYC (AVX2, no bf16)``."""
    name = re.sub(r"\(R\)|\(TM\)| Processor", "", cpu.split(" (")[0]).strip()
    found = re.findall(r"amx_bf16|avx512_bf16", f"{cpu} {flags or ''}")
    if found:
        return f"{name} ({', '.join(sorted(set(found)))})"
    if native_bf16 is True:
        return f"{name} (native bf16)"
    return f"{name} (AVX2, no bf16)"


def bootstrap_interval(
    values: np.ndarray, baseline: np.ndarray, *, resamples: int = 1000, seed: int = 12345, level: float = 0.95
) -> tuple[float, float]:
    """Paired percentile bootstrap of ``mean(values - baseline)`` over sentences (both ``[n]``): (low, high)."""
    diff = np.asarray(values, dtype=float) - np.asarray(baseline, dtype=float)
    if diff.ndim != 1 or diff.size == 0:
        raise ValueError(f"bootstrap_interval needs two equal non-empty 1-D score lists, got shape {diff.shape}")
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(resamples, diff.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


# ------------------------------------------------------------------------------------------- MBR gain
def mbr_series(sweep: dict, utility: str = "bertscore") -> dict[str, list[tuple[int, float, tuple | None]]]:
    """Per method: (n, gain in BERTScore F over beam top-1, 95 % interval or None), sorted by n."""
    rows = sweep["rows"]
    beam = next(r for r in rows if r["decoder"].startswith("beam"))
    series: dict[str, list[tuple[int, float, tuple | None]]] = {}
    for r in rows:
        if r.get("utility") != utility:
            continue
        interval = None
        if "bertscore_f_sentences" in r and "bertscore_f_sentences" in beam:
            interval = bootstrap_interval(np.array(r["bertscore_f_sentences"]), np.array(beam["bertscore_f_sentences"]))
        series.setdefault(r["method"], []).append((r["n"], r["bertscore_f"] - beam["bertscore_f"], interval))
    return {m: sorted(points) for m, points in series.items()}


def fig_mbr_gain(results: Path):
    import matplotlib.pyplot as plt

    panels = [  # (title, sweep files whose points join into one set of lines)
        (
            "test_2016_flickr, converged base\n200 sources (n ≤ 256), 100 sources (n ≥ 512)",
            [
                "mbr-multi30k/converged/test200-sweep.json",
                "mbr-multi30k/converged/large100-n512-sweep.json",
                "mbr-multi30k/converged/large100-n1024-sweep.json",
            ],
        ),
        (
            "val, converged base, 200 sources",
            ["mbr-multi30k/converged/val200-sweep.json", "mbr-multi30k/converged/val200-intervals-sweep.json"],
        ),
        (
            "test_2016_flickr, early checkpoint\n8 sources (float32 and bf16 encoder)",
            ["mbr-multi30k/validation/n512-1024-fp32.json"],
        ),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(13, 4.2), sharey=False)
    intervals_drawn = False
    for ax, (title, files) in zip(axes, panels):
        sweeps = [_json(results / f) for f in files]
        cpus = sorted({machine(s["cpu"]) for s in sweeps})
        labelled: set[str] = set()
        for sweep in sweeps:  # each sweep its own lines: the source sets (and so the beam baselines) differ
            series = mbr_series(sweep)
            for method in ("aggregate", "prune", "aggregate-exact", "exact"):  # exact drawn last, on top
                label, colour, marker = METHOD_STYLE[method]
                points = series.get(method, [])
                if not points:
                    continue
                exact = method == "exact"
                ax.plot(
                    [p[0] for p in points],
                    [p[1] for p in points],
                    marker=marker,
                    color=colour,
                    label=None if method in labelled else label,
                    lw=1.6 if exact else 1,
                    ms=9 if exact else 5,
                    mfc="none" if exact else colour,
                    zorder=3 if exact else 2,
                )
                labelled.add(method)
                for n, _, interval in points:
                    if interval is not None:
                        intervals_drawn = True
                        ax.vlines(n, interval[0], interval[1], color=colour, alpha=0.6)
            chrf = mbr_series(sweep, "chrf").get("exact", [])
            if chrf:
                ax.plot(
                    [p[0] for p in chrf],
                    [p[1] for p in chrf],
                    ls="--",
                    color="grey",
                    marker=".",
                    label=None if "chrf" in labelled else "exact MBR-chrF (its BERTScore F)",
                )
                labelled.add("chrf")
        ax.axhline(0, color="black", lw=0.6)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("samples per source (ε = 0.02)")
        ax.set_title(f"{title}\n{'; '.join(cpus)}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("BERTScore F gain over beam 5 (×100)")
    axes[0].legend(fontsize=8, loc="lower right")
    note = (
        "bars: 95 % paired bootstrap intervals over sentences, where a sweep stores sentence scores"
        if intervals_drawn
        else ("points are corpus means; these sweeps store no sentence-level scores, so no bootstrap interval is drawn")
    )
    fig.suptitle(f"MBR-BERTScore over a Multi30k de→en model's own samples ({note})", fontsize=10)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------- fine-tuning curves
ARM_STYLE = {  # result-file stem prefix -> (label, colour)
    "ce": ("ce (control)", "#1f77b4"),
    "bertscore": ("ce + 5·(1 − F)", "#d62728"),
    "mrt-rows32": ("ce + 10·risk, 32 sources/update", "#2ca02c"),
    "equal-time-bertscore-ce": ("ce for bertscore's time", "#17becf"),
    "equal-time-mrt-rows32-ce": ("ce for mrt's time", "#bcbd22"),
}


def finetuning_runs(folder: Path) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> result of every fine-tuning run of the three-seed comparison (machine reruns left out)."""
    runs = {}
    for path in sorted(folder.glob("*.result.json")):
        m = re.fullmatch(r"(.+)-seed(\d)", path.name[: -len(".result.json")])
        if m and m[1] in ARM_STYLE:
            runs[(m[1], int(m[2]))] = _json(path)
    return runs


def fig_finetuning_curves(results: Path):
    import matplotlib.pyplot as plt

    runs = finetuning_runs(results / "finetuning-multi30k" / "converged" / "stage2")
    seeds = sorted({seed for _, seed in runs})
    fig, axes = plt.subplots(1, len(seeds), figsize=(13, 4), sharey=True)
    for ax, seed in zip(np.atleast_1d(axes), seeds):
        for arm, (label, colour) in ARM_STYLE.items():
            run = runs.get((arm, seed))
            if run is None:
                continue
            curve = run["val_curve"]
            ls = ":" if arm.startswith("equal-time") else "-"
            ax.plot(
                [c["step"] for c in curve],
                [c["bertscore_f"] for c in curve],
                ls=ls,
                marker=".",
                color=colour,
                label=label,
            )
            chosen = run["chosen_update"]
            ax.plot([chosen], [run["chosen_val"]["bertscore_f"]], marker="*", ms=11, color=colour, ls="none")
        cpu = runs.get(("bertscore", seed)) or runs[next(k for k in runs if k[1] == seed)]
        precision = {"32-true": "float32", "bf16-mixed": "bf16-mixed"}.get(cpu["precision"], cpu["precision"])
        ax.set_title(f"seed {seed}: {cpu['cpu']}, {precision}, one thread", fontsize=9)
        ax.set_xlabel("update (≈115 sentence pairs each)")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("val BERTScore F (greedy, ×100)")
    np.atleast_1d(axes)[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(
        "Fine-tuning the converged Multi30k base (9.4 M parameters): validation F; ★ = the kept checkpoint", fontsize=10
    )
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------- speed ratios
def speed_rows(results: Path) -> list[tuple[str, str, float]]:
    """(comparison, machine, our speed ÷ the peer's), from every committed speed measurement."""
    rows: list[tuple[str, str, float]] = []
    for path in sorted((results / "speed").glob("performance-harness*.json")):
        data = _json(path)
        env = data["env"]
        where = machine(env["cpu"], native_bf16=env.get("native_bf16"))
        if "amx" in path.name:
            where = machine(env["cpu"], "amx_bf16 avx512_bf16")
        elif "avx512bf16" in path.name:
            where = machine(env["cpu"], "avx512_bf16")
        by = {(r["system"], r["dtype"]): r for r in data["rows"]}
        ours = by[("ours BERTScorer.score (default)", "float32")]
        peer = by[("bert-score BERTScorer.score", "float32")]
        rows.append(("evaluation vs bert-score, float32", where, ours["pairs_per_s"] / peer["pairs_per_s"]))
        if env.get("native_bf16"):
            bf16 = by[("ours BERTScorer.score (default)", "bfloat16")]
            rows.append(("evaluation vs bert-score, ours in bf16", where, bf16["pairs_per_s"] / peer["pairs_per_s"]))
        if ("torchmetrics BERTScore", "float32") in by:
            tm = by[("torchmetrics BERTScore", "float32")]
            rows.append(("evaluation vs torchmetrics, float32", where, ours["pairs_per_s"] / tm["pairs_per_s"]))
    rerank = _json(results / "speed" / "rerank-speed-avx512bf16.json")
    where = machine(rerank["env"]["cpu"], "avx512_bf16")
    seconds = {(r["task"], r["system"]): r["seconds"] for r in rerank["rows"]}
    rows.append(("n-best MBR vs mbrs, float32", where, rerank["mbrs"]["seconds"] / seconds[("MBR", "ours float32")]))
    rows.append(
        ("n-best MBR vs mbrs, ours in bf16", where, rerank["mbrs"]["seconds"] / seconds[("MBR", "ours bfloat16")])
    )
    rows.append(
        ("n-best MBR vs bert-score, float32", where, seconds[("MBR", "bert-score")] / seconds[("MBR", "ours float32")])
    )
    for path in sorted(results.glob("mbr-multi30k/*/mbr-speed-vs-mbrs*.json")):
        data = _json(path)
        ours = next(r for r in data["rows"] if r["system"].startswith("ours exact (j = i"))
        where = machine(data["env"]["cpu"], data["env"].get("bf16_flags"))
        rows.append(("256-sample MBR vs mbrs, float32", where, ours["speedup_vs_mbrs"]))
    hf = _json(results / "speed" / "integrations-speed.json")
    where = machine(hf["env"]["cpu"], hf["env"].get("bf16_flags"))
    rows.append(("TRL reward vs resident bert-score", where, hf["reward"]["ratio_vs_resident"]))
    return rows


def fig_speed_ratios(results: Path):
    import matplotlib.pyplot as plt

    rows = speed_rows(results)
    comparisons = list(dict.fromkeys(r[0] for r in rows))
    machines = sorted({r[1] for r in rows})
    colours = dict(zip(machines, ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]))
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rows) + 1.5))
    y = 0.0
    ticks, labels = [], []
    seen: set[str] = set()
    for comparison in comparisons:
        group = [r for r in rows if r[0] == comparison]
        for k, (_, where, ratio) in enumerate(group):
            pos = y + k * 0.8
            ax.barh(pos, ratio, height=0.7, color=colours[where], label=None if where in seen else where)
            seen.add(where)
            ax.text(ratio * 1.03, pos, f"{ratio:.2f}×", va="center", fontsize=8)
        ticks.append(y + (len(group) - 1) * 0.4)
        labels.append(comparison)
        y += len(group) * 0.8 + 0.6
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlim(0.7, 14)
    ax.set_xticks([1, 2, 4, 8])
    ax.set_xticklabels(["1×", "2×", "4×", "8×"])
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("our speed ÷ the other library's (same data, same process or same machine; > 1 = faster)")
    ax.legend(fontsize=8, loc="upper right", title="2-core CPU", title_fontsize=8)
    ax.set_title(
        "Speed against bert-score 0.3.13, torchmetrics 1.9 and mbrs 0.1.8 (bundled MiniLM, layer 4)", fontsize=10
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------- layer tuning
def layer_table(path: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """(measure, group) -> [(layer, Pearson r)] from a ``tune-layers`` CSV."""
    table: dict[tuple[str, str], list[tuple[int, float]]] = {}
    with path.open(encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            table.setdefault((row["measure"], row["group"]), []).append((int(row["layer"]), float(row["pearson"])))
    return {k: sorted(v) for k, v in table.items()}


def sentence_metric_r(report: Path, name: str) -> float | None:
    """The WMT16 mean Pearson r of a sentence-level metric (``sentBLEU``, ``chrF``) from the quality report."""
    if not report.is_file():
        return None
    for line in report.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == name and len(cells) >= 8:
            return float(cells[7])  # metric, 6 language pairs, then the WMT16 mean
    return None


def fig_layer_tuning(results: Path):
    import matplotlib.pyplot as plt

    table = layer_table(results / "layer-tuning" / "tune-layers-wmt16" / "layers.csv")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (measure, group), points in sorted(table.items()):
        if measure == "F" and group != "mean":
            ax.plot(*zip(*points), color="grey", alpha=0.35, lw=0.8)
    for measure, colour in (("P", "#1f77b4"), ("R", "#ff7f0e"), ("F", "#d62728")):
        points = table[(measure, "mean")]
        ax.plot(
            *zip(*points),
            marker="o",
            color=colour,
            label=f"{measure}, mean of 6 language pairs",
            lw=2 if measure == "F" else 1.2,
        )
    for name, style in (("chrF", "--"), ("sentBLEU", ":")):
        r = sentence_metric_r(results / "layer-tuning" / "quality.md", name)
        if r is not None:
            ax.axhline(r, color="black", ls=style, lw=1, label=f"sentence-level {name}: r = {r:.4f}")
    best = max(table[("F", "mean")], key=lambda p: p[1])
    ax.annotate(f"layer {best[0]}: r = {best[1]:.4f}", best, textcoords="offset points", xytext=(8, 8), fontsize=8)
    ax.plot([], [], color="grey", alpha=0.5, label="F, each language pair")
    ax.set_xlabel("layer of all-MiniLM-L6-v2 (0 = embeddings)")
    ax.set_ylabel("Pearson r with WMT16 DA human scores")
    ax.set_title("Which layer agrees with people: 3,360 WMT16 to-English segments", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


FIGURES: dict[str, Callable[[Path], Any]] = {
    "mbr-gain.png": fig_mbr_gain,
    "finetuning-curves.png": fig_finetuning_curves,
    "speed-ratios.png": fig_speed_ratios,
    "layer-tuning.png": fig_layer_tuning,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", type=Path, default=None, help="folder for the PNGs (default: runs/figures; docs/ only when given)"
    )
    ap.add_argument("--results", type=Path, default=RESULTS, help="the committed results (default: docs/results)")
    ap.add_argument("--only", nargs="+", choices=sorted(FIGURES), help="draw only these figures")
    add_overwrite_argument(ap)  # the published docs/figures/*.png are tracked: --out docs/figures needs it
    args = ap.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    out = args.out or ROOT / "runs" / "figures"
    names = args.only or list(FIGURES)
    check_outputs_or_exit(ap, [out / name for name in names], **rules)  # before drawing anything
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in names:
        fig = FIGURES[name](args.results)
        save_figure(fig, out / name, dpi=DPI, metadata={"Software": None}, **rules)
        plt.close(fig)
        print(f"wrote {out / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
