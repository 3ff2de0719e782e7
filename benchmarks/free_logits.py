"""Free-logit optimisation against real references: Adam alone, then the gradient-guided coordinate search.

    python benchmarks/free_logits.py [--refs 12] [--steps 300] [--rounds 100] [--ablations]

For each of the first ``--refs`` STS-B dev references (MiniLM layer 4, candidate length = the
reference's token count), Adam optimises free logits with the recipe of docs/loss.md, then
``coordinate_search`` refines the argmax ids (substitutions from the gradient's top-32 ∪ the 200 most
frequent STS-B train tokens, and transpositions; 128 exact proposals of each per round, patience 15).
Reports the argmax-decoded evaluation F after each stage, the rounds and the seconds. ``--ablations``
also runs the search with gradient proposals only (no frequent-token pool, as HotFlip/GCG), without
transpositions, and from a random start without Adam. Writes ``docs/free-logits.json``. One thread.
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

from bertscore_loss import BERTScorer, FrozenEncoder
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.search import SearchConfig, coordinate_search, frequent_tokens

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
logger = logging.getLogger("free_logits")


def stsb(split: str) -> list[list[str]]:
    with open(DATA / "stsb" / f"stsb-en-{split}.csv", encoding="utf-8", newline="") as fh:
        return list(csv.reader(fh))


def adam_recipe(scorer: BERTScorer, reference: str, steps: int, seed: int = 0) -> torch.Tensor:
    """Argmax ids ``[1, T]`` after Adam on free logits (the docs/loss.md recipe)."""
    loss = BERTScoreLoss(scorer=scorer, max_mode="soft", temperature=0.05, beta=4.0, gumbel="soft")
    length = len(scorer.encoder.tokenize([reference]).ids[0]) - 2
    torch.manual_seed(seed)
    logits = torch.zeros(1, length, scorer.encoder.vocab_size, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.3, eps=1e-6)
    for step in range(steps):
        frac = step / max(steps - 1, 1)
        loss.loss_config.beta = 4.0 - 3.0 * frac
        loss.loss_config.logit_temperature = 2.0 * (0.3 / 2.0) ** frac
        opt.zero_grad()
        loss(logits, [reference]).loss.backward()
        opt.step()
    return logits.detach().argmax(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", type=int, default=12)
    ap.add_argument("--steps", type=int, default=300, help="Adam steps")
    ap.add_argument("--rounds", type=int, default=100, help="coordinate-search rounds")
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "free-logits.json"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("bertscore_loss").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    scorer = BERTScorer(encoder=FrozenEncoder(layer=4, device="cpu"))
    exact = BERTScoreLoss(scorer=scorer)
    vocabulary = frequent_tokens(scorer.encoder, [row[0] for row in stsb("train")], n=200)
    config = SearchConfig(steps=args.rounds)
    decode = scorer.encoder.tokenizer.decode

    def f_of(ids: torch.Tensor, reference: str) -> float:
        return scorer.score([decode(ids[0])], [reference])[2].item()

    rows = []
    for reference in [row[1] for row in stsb("dev")[: args.refs]]:
        t0 = time.perf_counter()
        ids = adam_recipe(scorer, reference, args.steps)
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
        summary["mean_gradient_pool_only_f"] = mean("gradient_pool_only_f")
        summary["mean_no_transpositions_f"] = mean("no_transpositions_f")
        summary["mean_no_adam_f"] = mean("no_adam_f")
    for key, value in summary.items():
        logger.info("%s: %s", key, f"{value:.4f}" if isinstance(value, float) else value)
    Path(args.out).write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n", encoding="utf-8")
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
