"""How well bridged one-hot scoring agrees with exact evaluation of the decoded text (WMT16 dev pairs).

    python benchmarks/bridge_agreement.py [--vocab 32000] [--limit N]

A generator tokenizer of another family is trained locally on the shared English text that is NOT the
evaluation set (STS-B train + WMT17 de-en reference and system outputs): byte-level BPE and
sentencepiece-style (Metaspace) BPE, with the ``tokenizers`` library. Each WMT16 candidate is
tokenised by the generator, scored through ``BERTScoreLoss`` with a ``VocabBridge`` (hard ids = one-hot
inputs, ``max_mode="hard"``), and compared with ``BERTScorer.score`` on the same text: Pearson of F
and mean |ΔF|.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.bridge import VocabBridge
from bertscore_loss.loss import BERTScoreLoss

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
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
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    cands, refs = [], []
    for lp in LANG_PAIRS:
        base = DATA / "wmt16-daseg"
        cands += (base / f"DAseg.newstest2016.mt-system.{lp}").read_text().splitlines()[: args.limit]
        refs += (base / f"DAseg.newstest2016.reference.{lp}").read_text().splitlines()[: args.limit]
    scorer = BERTScorer(layer=args.layer, device="cpu")
    exact = scorer.score(cands, refs)[2]
    corpus = training_corpus()
    results = {}
    for kind in ("byte-level BPE", "sentencepiece BPE"):
        start = time.perf_counter()
        gen = generator_tokenizer(kind, corpus, args.vocab)
        bridge = VocabBridge(gen, scorer.encoder)
        loss = BERTScoreLoss(scorer=scorer, bridge=bridge, max_mode="hard", reduction="none")
        bridged = bridged_f(loss, gen, cands, refs)
        results[kind] = {
            "generator_vocab": len(gen),
            "pearson": float(np.corrcoef(exact.numpy(), bridged.numpy())[0, 1]),
            "mean_abs_dF": float((exact - bridged).abs().mean()),
            "mean_F_exact": float(exact.mean()),
            "mean_F_bridged": float(bridged.mean()),
            "seconds": time.perf_counter() - start,
        }
    print(f"{len(cands)} WMT16 pairs, generator tokenizers trained on {len(corpus)} sentences; {scorer.signature()}")
    print("| generator tokenizer | vocab | Pearson(F) | mean abs ΔF | mean F exact | mean F bridged |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, r in results.items():
        print(
            f"| {kind} | {r['generator_vocab']} | {r['pearson']:.4f} | {r['mean_abs_dF']:.4f} "
            f"| {r['mean_F_exact']:.4f} | {r['mean_F_bridged']:.4f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
