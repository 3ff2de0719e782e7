"""What each ranking of built MBR data picks, scored against the training references.

For the first ``--sources`` rows of a folder built by ``studies/multi30k/mbr_data.py`` (every candidate
and its expected MBR-BERTScore stored), the chosen candidate of: the beam output; the MBR ranking mixed with
MBR-chrF at each ``--weights`` share (``rerank.mixed_ranking.mixed_scores``: 0 = MBR-BERTScore alone, 1 =
MBR-chrF alone); each scored against the sources' references by corpus BLEU, chrF, BERTScore F (bundled
MiniLM) and the length ratio, with how often it is the beam output. On a converged model's own training
sources these say which ranking's choices are nearer to what the model was trained on.

    OMP_NUM_THREADS=1 python studies/multi30k/benchmarks/ranking_choices.py --data runs/mbr-data/train-eps64 \
        --sources 1000

Prints a table and writes a JSON (``--json``, default ``runs/ranking-choices.json``) labelled with the CPU.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "studies" / "multi30k"))


def build_parser() -> argparse.ArgumentParser:
    from bertscore_loss.outputs import add_overwrite_argument

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="runs/mbr-data/train-eps64", help="a built folder (stored lists)")
    p.add_argument("--corpus", default=str(ROOT.parent / "shared" / "data" / "multi30k"), help="Multi30k folder")
    p.add_argument("--split", default="train")
    p.add_argument("--sources", type=int, default=1000, help="the first N rows (default 1000)")
    p.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.3, 0.5, 0.7, 1.0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default="runs/ranking-choices.json")
    add_overwrite_argument(p)
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from bertscore_loss.outputs import check_outputs_or_exit, write_json

    out = Path(args.json)
    check_outputs_or_exit(build_parser(), [out], overwrite=args.overwrite, allow_docs=True, flag="--json")
    import nmt
    import sacrebleu
    import torch

    from bertscore_loss import BERTScorer
    from rerank import mbr
    from rerank.mixed_ranking import mixed_scores
    from rerank.training_data import pair_rows, read_mbr_data

    torch.set_num_threads(args.threads)
    rows = read_mbr_data(ROOT / args.data, complete=False)[: args.sources]
    sources, refs = nmt.read_pairs(args.corpus, args.split)
    refs = [refs[r["index"]] for r in rows]
    if any(sources[r["index"]] != r["prompt"] for r in rows):
        raise SystemExit(f"{args.data}: its rows are not the {args.split} sources at their indices")
    lists = [r["candidates"] for r in rows]
    weights = [[0.0] * r["n"] + [-math.inf] for r in rows]  # the beam output (last) is no pseudo-reference
    chrf = mbr(lists, utility="chrf", log_weights=weights, progress=False)
    picks: dict[str, list[str]] = {"beam": [r["beam"] for r in rows]}
    for w in args.weights:
        picks[f"mix {w:g}"] = [
            r["candidates"][
                pair_rows(r["candidates"], mixed_scores(r["expected"], c.expected.tolist(), w), None, "best-worst")[0]
            ]
            for r, c in zip(rows, chrf)
        ]
    scorer = BERTScorer()
    ref_words = sum(len(t.split()) for t in refs)
    table = {}
    for name, hyps in picks.items():
        table[name] = {
            "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
            "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
            "bertscore_f": 100 * float(scorer.score(hyps, refs)[2].mean()),
            "length_ratio": sum(len(t.split()) for t in hyps) / ref_words,
            "is_beam": sum(h == b for h, b in zip(hyps, picks["beam"])) / len(hyps),
        }
    print(f"{nmt.cpu_label()}; {args.data}, first {len(rows)} rows, against the {args.split} references")
    print("| choice | BLEU | chrF | MiniLM F | length ratio | = beam |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, s in table.items():
        print(
            f"| {name} | {s['bleu']:.2f} | {s['chrf']:.2f} | {s['bertscore_f']:.2f} | {s['length_ratio']:.3f} "
            f"| {s['is_beam']:.1%} |"
        )
    record = {"cpu": nmt.cpu_label(), "data": args.data, "sources": len(rows), "split": args.split, "choices": table}
    write_json(out, record, overwrite=args.overwrite, allow_docs=True, flag="--json")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
