"""How well bridged one-hot scoring agrees with exact evaluation of the text (WMT16 dev pairs).

    python benchmarks/bridge_agreement.py [--vocab 32000] [--limit N] [--modes mean,retokenize]

A generator tokenizer of another family is trained locally on the shared English text that is NOT the
evaluation set (STS-B train + WMT17 de-en reference and system outputs): byte-level BPE and
sentencepiece-style (Metaspace) BPE, with the ``tokenizers`` library. Each WMT16 candidate is
tokenised by the generator, scored through ``BERTScoreLoss`` with a ``VocabBridge`` in each mode
(``mean``, ``retokenize``; hard ids = one-hot inputs, ``max_mode="hard"``), and compared with
``BERTScorer.score`` on the original candidate text: Pearson of F, mean |ΔF|, and the seconds to build
the bridge and to score. The exact side is the original text, not the generator's decoded text: a
sentencepiece generator drops characters it cannot encode (``<unk>``), which counts against the bridge.
Runs on one CPU thread (``torch.set_num_threads(1)``).
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.bridge import VocabBridge
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
logger = logging.getLogger("bridge_agreement")
LANG_PAIRS = ("cs-en", "de-en", "fi-en", "ro-en", "ru-en", "tr-en")


def training_corpus() -> list[str]:
    with open(DATA / "stsb" / "stsb-en-train.csv", encoding="utf-8", newline="") as fh:
        lines = [s for row in csv.reader(fh) for s in row[:2]]
    for path in sorted((DATA / "wmt17-de-en-systems").glob("*")):
        if not path.name.endswith(".de"):
            lines += path.read_text(encoding="utf-8").splitlines()
    return lines


def generator_tokenizer(kind: str, corpus: list[str], vocab: int):
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<unk>"]
    trainer = ByteLevelBPETokenizer() if kind == "byte-level BPE" else SentencePieceBPETokenizer()
    trainer.train_from_iterator(corpus, vocab_size=vocab, special_tokens=specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=trainer._tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def bridged_f(loss: BERTScoreLoss, gen, cands: list[str], refs: list[str], batch: int = 64) -> torch.Tensor:
    """F ``[N]`` of the generator's token ids of ``cands`` scored through ``loss`` (one-hot inputs)."""
    out = []
    for i in range(0, len(cands), batch):
        ids = gen(cands[i : i + batch], add_special_tokens=False)["input_ids"]
        width = max(1, max(len(r) for r in ids))
        x = torch.zeros(len(ids), width, dtype=torch.long)
        mask = torch.zeros(len(ids), width, dtype=torch.bool)
        for j, row in enumerate(ids):
            x[j, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[j, : len(row)] = True
        with torch.no_grad():
            out.append(loss(x, refs[i : i + batch], mask).f1)
    return torch.cat(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--layer", type=int, default=None)
    ap.add_argument("--limit", type=int, default=None, help="pairs per language pair (default: all 560)")
    ap.add_argument("--modes", default="mean,retokenize", help="comma-separated VocabBridge modes")
    ap.add_argument("--json", default=None, help="also write the results as JSON to this file")
    add_overwrite_argument(ap)
    args = ap.parse_args()
    rules = {"overwrite": args.overwrite, "allow_docs": True, "flag": "--json"}  # --json is always explicit
    check_outputs_or_exit(ap, [args.json] if args.json else [], **rules)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    cands, refs = [], []
    for lp in LANG_PAIRS:
        base = DATA / "wmt16-daseg"
        cands += (base / f"DAseg.newstest2016.mt-system.{lp}").read_text().splitlines()[: args.limit]
        refs += (base / f"DAseg.newstest2016.reference.{lp}").read_text().splitlines()[: args.limit]
    scorer = BERTScorer(layer=args.layer, device="cpu")
    start = time.perf_counter()
    exact = scorer.score(cands, refs)[2]
    exact_s = time.perf_counter() - start
    logger.info("exact evaluation of %d pairs: %.1f s", len(cands), exact_s)
    corpus = training_corpus()
    results = {}
    for kind in ("byte-level BPE", "sentencepiece BPE"):
        gen = generator_tokenizer(kind, corpus, args.vocab)
        for mode in modes:
            start = time.perf_counter()
            bridge = VocabBridge(gen, scorer.encoder, mode=mode)
            build_s = time.perf_counter() - start
            loss = BERTScoreLoss(scorer=scorer, bridge=bridge, max_mode="hard", reduction="none")
            start = time.perf_counter()
            bridged = bridged_f(loss, gen, cands, refs)
            score_s = time.perf_counter() - start
            r = {
                "generator_vocab": len(gen),
                "pearson": float(np.corrcoef(exact.numpy(), bridged.numpy())[0, 1]),
                "mean_abs_dF": float((exact - bridged).abs().mean()),
                "max_abs_dF": float((exact - bridged).abs().max()),
                "within_1e-4": int(((exact - bridged).abs() < 1e-4).sum()),
                "mean_F_exact": float(exact.mean()),
                "mean_F_bridged": float(bridged.mean()),
                "build_seconds": build_s,
                "score_seconds": score_s,
            }
            results[f"{kind} / {mode}"] = r
            logger.info("%s / %s: %s", kind, mode, json.dumps(r))
    print(f"{len(cands)} WMT16 pairs, generator tokenizers trained on {len(corpus)} sentences; {scorer.signature()}")
    print(f"exact evaluation: {exact_s:.0f} s (one CPU thread)")
    print(
        "| generator tokenizer | vocab | mode | Pearson(F) | mean abs ΔF | max abs ΔF | pairs within 1e-4 "
        "| mean F bridged (exact) | build s | score s |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for key, r in results.items():
        kind, mode = key.split(" / ")
        print(
            f"| {kind} | {r['generator_vocab']:,} | {mode} | {r['pearson']:.4f} | {r['mean_abs_dF']:.4f} "
            f"| {r['max_abs_dF']:.4f} | {r['within_1e-4']:,} / {len(cands):,} "
            f"| {r['mean_F_bridged']:.4f} ({r['mean_F_exact']:.4f}) "
            f"| {r['build_seconds']:.0f} | {r['score_seconds']:.0f} |"
        )
    if args.json:
        write_text(args.json, json.dumps(results, indent=2), **rules)


if __name__ == "__main__":
    main()
