"""Free-logit optimisation against real references: Adam alone, then the gradient-guided coordinate search.

    python benchmarks/free_logits.py [--refs 12] [--steps 150] [--rounds 100] [--ablations]

For each of the first ``--refs`` STS-B dev references (MiniLM layer 4, candidate length = the
reference's token count), ``optimise_logits`` runs Adam on free logits (defaults: 8 restarts in one
batch starting from the STS-B train unigram prior at scales 1, 1.5, 2, 3; the best argmax ids by exact
F every 5 steps), then ``coordinate_search`` refines those ids (defaults: substitutions from the gradient's
top-128 ∪ the 200 most frequent STS-B train tokens, and transpositions; 512 exact proposals of each per
round, patience 15). Reports the argmax-decoded evaluation F after each stage, the rounds and the seconds.
``--ablations`` also runs Adam from zero logits (no prior, same restarts), Adam with the prior and a
single restart, and the search with gradient proposals only (no frequent-token pool, as HotFlip/GCG),
without transpositions, and from a random start without Adam. Writes ``runs/free-logits.json`` (``--out
docs/results/free-logits/free-logits.json --overwrite`` replaces the published one). One thread.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import time
from pathlib import Path

import torch

from bertscore_loss import BERTScorer
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text
from bertscore_loss.search import (
    LogitConfig,
    SearchConfig,
    coordinate_search,
    frequent_tokens,
    optimise_logits,
    token_log_prior,
)

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
logger = logging.getLogger("free_logits")


def stsb(split: str) -> list[list[str]]:
    with open(DATA / "stsb" / f"stsb-en-{split}.csv", encoding="utf-8", newline="") as fh:
        return list(csv.reader(fh))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=150, help="Adam steps")
    ap.add_argument("--rounds", type=int, default=100, help="coordinate-search rounds")
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument(
        "--out", default=None, help="JSON file to write (default: runs/free-logits.json; docs/ only when given)"
    )
    add_overwrite_argument(ap)
    args = ap.parse_args()
    rules = {"overwrite": args.overwrite, "allow_docs": args.out is not None, "flag": "--out"}
    args.out = args.out or str(Path(__file__).resolve().parents[1] / "runs" / "free-logits.json")
    check_outputs_or_exit(ap, [args.out], **rules)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bertscore_loss").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    scorer = BERTScorer(encoder=FrozenEncoder(layer=4, device="cpu"))
    exact = BERTScoreLoss(scorer=scorer)
    train = [row[0] for row in stsb("train")]
    vocabulary = frequent_tokens(scorer.encoder, train, n=200)
    prior = token_log_prior(scorer.encoder, train)
    adam = LogitConfig(steps=args.steps)
    config = SearchConfig(steps=args.rounds)
    decode = scorer.encoder.tokenizer.decode

    def f_of(ids: torch.Tensor, reference: str) -> float:
        return scorer.score([decode(ids[0])], [reference])[2].item()

    rows = []
    for reference in [row[1] for row in stsb("dev")[: args.refs]]:
        t0 = time.perf_counter()
        ids = optimise_logits(exact, [reference], prior=prior, config=adam).ids
        t1 = time.perf_counter()
        found = coordinate_search(exact, ids, [reference], vocabulary=vocabulary, config=config)
        t2 = time.perf_counter()
        row = {
            "reference": reference,
            "adam_f": f_of(ids, reference),
            "adam_text": decode(ids[0]),
            "adam_s": t1 - t0,
            "search_f": f_of(found.ids, reference),
            "search_text": decode(found.ids[0]),
            "rounds": found.steps,
            "search_s": t2 - t1,
        }
        if args.ablations:
            no_prior = optimise_logits(exact, [reference], config=adam)
            row["adam_no_prior_f"] = f_of(no_prior.ids, reference)
            single = optimise_logits(exact, [reference], prior=prior, config=dataclasses.replace(adam, restarts=1))
            row["adam_one_restart_f"] = f_of(single.ids, reference)
            grad_only = coordinate_search(exact, ids, [reference], config=config)
            row["gradient_pool_only_f"] = f_of(grad_only.ids, reference)
            no_tr = dataclasses.replace(config, transpositions=False)
            substitutions = coordinate_search(exact, ids, [reference], vocabulary=vocabulary, config=no_tr)
            row["no_transpositions_f"] = f_of(substitutions.ids, reference)
            rand = torch.randint(1999, scorer.encoder.vocab_size, ids.shape, generator=torch.Generator().manual_seed(0))
            no_adam = coordinate_search(exact, rand, [reference], vocabulary=vocabulary, config=config)
            row["no_adam_f"] = f_of(no_adam.ids, reference)
        logger.info(
            "%.4f -> %.4f (%d rounds, %.1f s + %.1f s)  %r -> %r",
            row["adam_f"],
            row["search_f"],
            row["rounds"],
            row["adam_s"],
            row["search_s"],
            row["adam_text"],
            row["search_text"],
        )
        rows.append(row)
    n = len(rows)

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / n

    summary = {
        "references": n,
        "adam_steps": args.steps,
        "rounds": args.rounds,
        "mean_adam_f": mean("adam_f"),
        "mean_search_f": mean("search_f"),
        "reached_095": sum(r["search_f"] >= 0.95 for r in rows),
        "adam_reached_095": sum(r["adam_f"] >= 0.95 for r in rows),
        "mean_adam_s": mean("adam_s"),
        "mean_search_s": mean("search_s"),
    }
    if args.ablations:
        for key in ("adam_no_prior_f", "adam_one_restart_f"):
            summary[f"mean_{key}"] = mean(key)
            summary[f"{key[:-2]}_reached_095"] = sum(r[key] >= 0.95 for r in rows)
        summary["mean_gradient_pool_only_f"] = mean("gradient_pool_only_f")
        summary["mean_no_transpositions_f"] = mean("no_transpositions_f")
        summary["mean_no_adam_f"] = mean("no_adam_f")
    for key, value in summary.items():
        logger.info("%s: %s", key, f"{value:.4f}" if isinstance(value, float) else value)
    write_text(args.out, json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n", **rules)
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
