"""Thread safety: one scorer, one loss and one reranker shared by 4 threads
give the serial results.

The shared tokenizer is left in truncation mode first, as a data collator leaves it
(``tokenizer(text, truncation=True, max_length=8)``), and the texts are longer than 8 tokens, so a
tokenisation that switches the tokenizer's truncation off and on around its call without a lock would
silently cut other threads' texts. One thread also scores a text over the model's 512 positions, whose
cut (a call with ``truncation=True``) is the library's own switch of that state.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.loss import BERTScoreLoss
from rerank import NBestReranker

THREADS = 4
ROUNDS = 40
TOL = 1e-6
TEXTS = 48  # candidates (and references) per thread and call
SWITCH_INTERVAL = 1e-5  # seconds between GIL hand-overs during the threaded rounds (default 5e-3)

WORDS = (
    "the quick brown fox jumps over a lazy dog while one small cat sleeps on the warm mat near an old "
    "red barn and two birds sing in tall green trees under a bright blue summer sky"
).split()


def sentence(seed: int, n: int) -> str:
    """A deterministic sentence of ``n`` words (well over 8 tokens for n >= 10)."""
    return " ".join(WORDS[(seed * 7 + 3 * i + i * i) % len(WORDS)] for i in range(n))


def thread_texts(t: int) -> tuple[list[str], list[str]]:
    """Thread ``t``'s own candidates and references (no text shared with another thread).

    Many texts per call, so that one thread's tokenisation is still running when another's ends.
    """
    cands = [f"{sentence(100 * t + i, 10 + i % 17)} thread {t} item {i}" for i in range(TEXTS)]
    refs = [f"{sentence(100 * t + i + 50, 12 + (3 * i) % 19)} reference {t} {i}" for i in range(TEXTS)]
    if t == THREADS - 1:  # the library's own cut: a text over the model's 512 positions
        cands[0] = " ".join(sentence(t + k, 20) for k in range(40))
    return cands, refs


def content_ids(encoder: FrozenEncoder, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Encoder ids of ``texts`` without the special tokens, padded ``[B, T]`` with their mask (no truncation)."""
    pre, suf = encoder.framing
    rows = [ids[len(pre) : len(ids) - len(suf)] for ids in encoder.tokenize(texts).ids]
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


@pytest.fixture(scope="module")
def shared(tiny_bert_dir):
    """One scorer, one loss and one reranker on a private encoder (its tokenizer state is this test's)."""
    encoder = FrozenEncoder(tiny_bert_dir, 2, device="cpu")
    scorer = BERTScorer(encoder=encoder)
    # a bounded reference cache (a few texts), so threads also evict each other's entries
    loss = BERTScoreLoss(scorer=scorer, max_mode="hard", reduction="none", ref_cache_bytes=24 << 10)
    reranker = NBestReranker(scorer=scorer)
    return scorer, loss, reranker


def collator_call(scorer: BERTScorer) -> None:
    """What a data collator does with the same tokenizer object: leaves it in truncation mode."""
    scorer.encoder.tokenizer(sentence(99, 30), truncation=True, max_length=8)


def jobs(
    scorer: BERTScorer, loss: BERTScoreLoss, reranker: NBestReranker, t: int
) -> Callable[[], dict[str, torch.Tensor]]:
    cands, refs = thread_texts(t)
    ids, mask = content_ids(scorer.encoder, cands[1:17])  # the loss takes the short candidates as ids

    def run() -> dict[str, torch.Tensor]:
        p, r, f = scorer.score(cands, refs)
        multi = scorer.score(cands[:6], [refs[:2], refs[2:5], [refs[0], cands[7]], [refs[9]], refs[10:14], refs[20:22]])
        with torch.no_grad():
            out = loss(ids, refs[1:17], mask)
        ranked = reranker.rerank(
            [cands[:3], cands[2:9], cands[20:40]], [refs[:2], refs[3:6], refs[30:]], return_utility=True
        )
        mbr = reranker.rerank([cands[1:4], cands[10:30]])
        utilities = [x.utility for x in ranked]
        assert all(u is not None for u in utilities)
        return {
            "score P": p,
            "score R": r,
            "score F": f,
            "multi-reference F": multi.f1,
            "loss P": out.precision,
            "loss R": out.recall,
            "loss F": out.f1,
            **{f"reranker utility of source {s}": u for s, u in enumerate(utilities)},  # type: ignore[misc]
            "reranker best indices": torch.tensor([x.best_index for x in ranked + mbr], dtype=torch.float32),
            "MBR expected utilities": torch.tensor(mbr[0].bertscore + mbr[1].bertscore),
        }

    return run


def run_round(
    rnd: int,
    work: list[Callable[[], dict[str, torch.Tensor]]],
    serial: list[dict[str, torch.Tensor]],
    scorer: BERTScorer,
    worst: list[tuple[float, int, int, str]],
    errors: list[str],
) -> None:
    """One round: a collator call, then the 4 threads start together at a barrier; differences are recorded."""
    collator_call(scorer)  # a data collator ran between two steps
    barrier = threading.Barrier(THREADS)
    results: list[dict[str, torch.Tensor] | None] = [None] * THREADS

    def target(t: int) -> None:
        try:
            barrier.wait()
            results[t] = work[t]()
        except Exception as exc:  # reported by the test with the round and thread
            errors.append(f"round {rnd}, thread {t}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=target, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for t, got in enumerate(results):
        if got is None:
            continue
        for k, x in got.items():
            y = serial[t][k]
            diff = float((x - y).abs().max()) if x.numel() else 0.0
            if diff > TOL:
                worst.append((diff, rnd, t, k))


@pytest.mark.slow  # ~30 s: many rounds of four racing threads
def test_four_threads_equal_serial_with_the_tokenizer_left_in_truncation_mode(shared):
    scorer, loss, reranker = shared
    work = [jobs(scorer, loss, reranker, t) for t in range(THREADS)]
    serial = [w() for w in work]
    collator_call(scorer)
    serial_after = [w() for w in work]  # one thread alone is never affected by the collator's setting
    for a, b in zip(serial, serial_after):
        for k in a:
            assert torch.allclose(a[k], b[k], atol=TOL, rtol=0), f"{k} differs serially after a collator call"

    worst: list[tuple[float, int, int, str]] = []  # (|Δ|, round, thread, output)
    errors: list[str] = []
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)  # threads interleave far more often than every 5 ms
    try:
        for rnd in range(ROUNDS):
            run_round(rnd, work, serial, scorer, worst, errors)
    finally:
        sys.setswitchinterval(interval)
    first_error = errors[0] if errors else "none"
    top = max(worst) if worst else (0.0, -1, -1, "")
    score_f = max((d for d, _, _, k in worst if k == "score F"), default=0.0)
    assert not errors and not worst, (
        f"thread race over {ROUNDS} rounds x {THREADS} threads sharing one scorer/loss/reranker: {len(worst)} "
        f"output(s) differ from the serial results (max |Δ| {top[0]:.4f} at round {top[1]}, thread {top[2]}, "
        f"{top[3]!r}; max |ΔF| of score() {score_f:.4f}) and {len(errors)} call(s) raised (first: {first_error}): "
        "the shared tokenizer's truncation state (left at max_length=8 by a collator, or set by the library's "
        "own cut of a long text) leaks into other threads' tokenisation"
    )
