"""Which hypotheses and pseudo-references for MBR-BERTScore? Variants on the candidate lists stage 3 saved.

Reads ``<name>-beam<N>-nbest.<split>.json`` and ``<name>-eps<M>.<split>.json`` from a stage-3 output folder
(one candidate list per source) and the beam top-1 translations; prints the oracle and mean BERTScore F
of each kind of list, then one markdown row per decoder:

- ``beam top-1``: the given translations;
- ``samples, leave-one-out``: MBR over the samples, each against the other samples (stage 3's decoder);
- ``n-best vs samples``: the beam n-best list as hypotheses, the samples as pseudo-references;
- ``n-best + samples, samples as pseudo-references``: both pools as hypotheses; a sample's own column counts
  (``self``) or is left out (``leave-one-out``, an unbiased estimate for samples).

Usage (val, the split the choice is made on)::

    python studies/multi30k/mbr_pools.py --lists runs/multi30k/s4/stage3-val --name mrt-seed0 \\
        --split val --beam runs/multi30k/stage2/mrt-seed0/val.hyp.en
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics  # noqa: E402
import nmt  # noqa: E402

from rerank import NBestReranker  # noqa: E402
from rerank.reranker import expected_utility  # noqa: E402


def choose(nbest: list[list[str]], samples: list[list[str]], reranker: NBestReranker) -> dict[str, list[str]]:
    """The translation each decoder picks per source, from one ``[n + m, m]`` utility matrix per source."""
    out: dict[str, list[str]] = {k: [] for k in ("loo", "nbest", "pool-self", "pool-loo")}
    results = reranker.rerank([s + n for s, n in zip(samples, nbest)], pseudo_references=samples, return_utility=True)
    for s, n, r in zip(samples, nbest, results):
        u = r.utility  # rows: the m samples, then the n-best; columns: the m samples (input order)
        m = len(s)
        full = expected_utility(u, None)
        loo = torch.cat([expected_utility(u[:m], None, exclude_diagonal=True), full[m:]])
        pool = s + n
        out["loo"].append(s[int(loo[:m].argmax())])
        out["nbest"].append(n[int(full[m:].argmax())])
        out["pool-self"].append(pool[int(full.argmax())])
        out["pool-loo"].append(pool[int(loo.argmax())])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lists", required=True, help="stage-3 output folder with the candidate lists (.json)")
    parser.add_argument("--name", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--beam", required=True, help="beam top-1 translations of the split (one per line)")
    parser.add_argument("--data", default="../shared/data/multi30k")
    parser.add_argument("--nbest", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    folder = Path(args.lists)
    nbest = json.loads((folder / f"{args.name}-beam{args.nbest}-nbest.{args.split}.json").read_text())
    samples = json.loads((folder / f"{args.name}-eps{args.samples}.{args.split}.json").read_text())
    refs = nmt.read_pairs(Path(args.data), args.split, None)[1]
    beam = nmt.read_lines(Path(args.beam))
    if not (len(nbest) == len(samples) == len(refs) == len(beam)):
        raise SystemExit(f"lists of {len(nbest)}, {len(samples)}, {len(beam)} sources for {len(refs)} references")
    picks = choose(nbest, samples, NBestReranker(scorer=metrics.scorer()))
    rows = {
        "beam top-1": beam,
        f"{args.samples} samples, leave-one-out (stage 3)": picks["loo"],
        f"beam-{args.nbest} n-best vs {args.samples} samples": picks["nbest"],
        "n-best + samples, self counted": picks["pool-self"],
        "n-best + samples, leave-one-out": picks["pool-loo"],
    }
    scorer = metrics.scorer()
    for name, lists in ((f"{args.samples} samples", samples), (f"beam-{args.nbest} n-best", nbest)):
        f = scorer.score_groups(lists, refs).f1 * 100  # [sources, k], NaN where a list is shorter
        best = torch.nan_to_num(f, nan=float("-inf")).max(1).values.mean()
        print(f"{name}: oracle (the candidate closest to the reference) F {best:.2f}, mean F {f.nanmean():.2f}")
    print()
    print(f"| decoder ({args.split}) | BLEU | chrF | BERTScore F | length ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, hyps in rows.items():
        s = metrics.corpus_scores(hyps, refs)
        print(f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['bertscore_f']:.2f} | {s['length_ratio']:.3f} |")


if __name__ == "__main__":
    main()
