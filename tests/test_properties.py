"""Property-based consistency of every front end on the same inputs.

Random texts (unicode letters, marks, punctuation, CJK, emoji, whitespace-like characters such as
``"\\u200b"``, ``"\\ufeff"``, ``"\\u00a0"``, tabs and newlines, texts longer than the model's positions,
empty strings), random list shapes and random settings (IDF over a fixed corpus or over each call's
references, multi-reference ``max``/``best_f``, rescaling with a baseline, ``long_inputs="window"``) go
through ``BERTScorer.score``, ``score_groups`` (``reduce=True`` and the reduction of the ``reduce=False``
blocks), ``score_stream``, the one-hot ``BERTScoreLoss`` with ``max_mode="hard"``, ``NBestReranker``
(against references and MBR), the Lightning metric, the HF ``compute_metrics`` and the TRL rewards. They
agree to 1e-5, in input order, or differ only where a documented rule says so, and then the rule is what
is asserted:

* a text without a content token (empty, whitespace- or zero-width-only) scores 0 before rescaling, with
  a warning (README "Semantics"); the TRL rewards give it ``empty_value`` and never use it as an MBR
  partner (docs/integrations-trl.md: whitespace-like text is empty everywhere);
* IDF without a fixed table counts the references as given to the call: ``score`` each candidate's,
  ``score_groups`` (and the reranker) each group's once (README "Rules"); it is refused where
  batches would change it (``score_stream``, the loss, the Lightning metric, the HF metric and the TRL
  rewards: one rule);
* the HF metric scores the decoded predictions and labels;
* ``bert-score`` differs where README says so (a negative best match; a side whose weights are all 0).

A small sample is checked against ``bert-score`` on the real bundled MiniLM (``slow``).

The encoder is a tiny random BERT with 40 positions (built once per module), so that long texts are
cheap. Each property runs a bounded, derandomised number of examples (``PROFILE``).
"""

from __future__ import annotations

import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from bertscore_loss import BERTScorer, BERTScoreWarning
from bertscore_loss.loss import BERTScoreLoss
from bertscore_loss.scorer import reduce_references

TOL = 1e-5
MAX_POS = 40  # positions of this module's tiny BERT: a text of 40+ words is "long"
EMPTY_VALUE = -7.0  # the TRL rewards' empty_value here: distinct from any score

#: Bounded and derandomised; no shrinking (a failing property stays within its time: the explicit
#: ``@example`` of each defect found is its minimal case). ``BERTSCORE_SHRINK=1`` shrinks new failures.
PROFILE = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if os.environ.get("BERTSCORE_SHRINK") else [])],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- texts ------------------------------------------------------------------------------------------
ASCII_WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "bird", "ran", "quickly", "red", "house", "under")
WORDS = (
    *ASCII_WORDS,
    "über",
    "naïve",
    "café",
    "Straße",
    "東京",
    "猫が好き",
    "😀",
    "🐈\u200d⬛",
    "don't",
    "e-mail",
    "3.14",
    "#1",
    "ﬁne",
    "ＡＢＣ",
    "١٢٣",
    "שלום",
    "a\u0301",
)
WHITESPACE_LIKE = ("\u200b", "\ufeff", "\u00a0", "\t", "\n", "\u3000", "\u2028", " ", "\r\n")
IDF_CORPUS = [
    "the cat sat on the mat",
    "a dog ran under the red house",
    "the bird sat on a house",
    "café über naïve",
    "東京 猫",
    "the cat and the dog",
]

_word = st.one_of(
    st.sampled_from(WORDS),
    st.text(st.characters(categories=("L", "M", "N", "P", "S")), min_size=1, max_size=5),
)
_sep = st.sampled_from((" ", " ", " ", *WHITESPACE_LIKE))
_pad = st.lists(st.sampled_from(WHITESPACE_LIKE), max_size=2).map("".join)
_sentence = st.lists(st.tuples(_word, _sep), min_size=1, max_size=8).map(lambda ws: "".join(w + s for w, s in ws))
_KINDS = (
    st.builds(lambda a, s, b: a + s + b, _pad, _sentence, _pad),  # ordinary text, maybe framed by odd spaces
    st.lists(st.sampled_from(WHITESPACE_LIKE), max_size=3).map("".join),  # "" or whitespace-like only
    st.lists(st.sampled_from(ASCII_WORDS), min_size=MAX_POS, max_size=2 * MAX_POS + 5).map(" ".join),  # long
)
#: one text: ordinary (4 in 6), empty or whitespace-like only (1 in 6), longer than the model's positions (1 in 6)
TEXTS = st.sampled_from((0, 0, 0, 0, 1, 2)).flatmap(lambda kind: _KINDS[kind])
#: ``B`` groups of 1-5 candidates and 1-3 references each
GROUPS = st.lists(
    st.tuples(st.lists(TEXTS, min_size=1, max_size=5), st.lists(TEXTS, min_size=1, max_size=3)), min_size=1, max_size=3
)
#: 1-5 (candidate, 1-3 references) pairs
MULTI_PAIRS = st.lists(st.tuples(TEXTS, st.lists(TEXTS, min_size=1, max_size=3)), min_size=1, max_size=5)
#: 1-5 (candidate, reference) pairs
PAIRS = st.lists(st.tuples(TEXTS, TEXTS), min_size=1, max_size=5)
MEASURES = st.sampled_from(("precision", "recall", "f1"))
_K = {"precision": 0, "recall": 1, "f1": 2}

LONG = " ".join(ASCII_WORDS[i % len(ASCII_WORDS)] for i in range(2 * MAX_POS))

# --- settings ---------------------------------------------------------------------------------------
#: name -> scorer settings; "idf-refs" is IDF over each call's references (no fixed table)
SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {},
    "idf-corpus": {"idf": True, "idf_corpus": IDF_CORPUS},
    "idf-refs": {"idf": True},
    "rescale": {"rescale": True},
    "window": {"long_inputs": "window"},
    "best-f": {"multi_ref": "best_f"},
    "all": {"idf": True, "idf_corpus": IDF_CORPUS, "rescale": True, "long_inputs": "window", "multi_ref": "best_f"},
}
FIXED = [name for name in SETTINGS if name != "idf-refs"]  # every setting with a fixed IDF table (or none)
BASELINE = (0.6, 0.55, 0.58)


class Setups:
    """Scorers (and their losses) of every setting on one tiny model, built once each."""

    def __init__(self, model_dir: str, baseline: str) -> None:
        from transformers import AutoTokenizer

        self.model_dir, self.baseline = model_dir, baseline
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)  # the test's own: never the encoder's object
        self._scorers: dict[str, BERTScorer] = {}
        self._losses: dict[str, BERTScoreLoss] = {}

    def scorer(self, name: str) -> BERTScorer:
        if name not in self._scorers:
            kw = dict(SETTINGS[name])
            if kw.get("rescale"):
                kw["baseline"] = self.baseline
            self._scorers[name] = BERTScorer(model=self.model_dir, layer=2, device="cpu", **kw)
        return self._scorers[name]

    def loss(self, name: str) -> BERTScoreLoss:
        if name not in self._losses:
            self._losses[name] = BERTScoreLoss(
                scorer=self.scorer(name), max_mode="hard", inputs="probs", reduction="none"
            )
        return self._losses[name]

    def content_ids(self, text: str) -> list[int]:
        """The text's token ids without special tokens, uncut (what a generator would emit)."""
        return self.tokenizer(text.strip(), add_special_tokens=False)["input_ids"]

    def is_empty(self, text: str) -> bool:
        """No content token: empty, whitespace- or zero-width-only (the core's "empty text")."""
        return not self.content_ids(text)

    def zero(self, name: str) -> tuple[float, float, float]:
        """P, R, F of an empty text under setting ``name``: 0, rescaled when the setting rescales."""
        if SETTINGS[name].get("rescale"):
            return tuple((0.0 - b) / (1.0 - b) for b in BASELINE)  # type: ignore[return-value]
        return (0.0, 0.0, 0.0)


@pytest.fixture(scope="module")
def setups(tmp_path_factory, tiny_bert_dir) -> Setups:
    """A tiny random BERT with ``MAX_POS`` positions and the bundled tokenizer, and a baseline file for it."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("short-bert")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tiny_bert_dir) / name, d / name)
    cfg = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=MAX_POS,
    )
    BertModel(cfg).save_pretrained(d)
    baseline = d / "baseline.tsv"
    baseline.write_text("LAYER,P,R,F\n2,{},{},{}\n".format(*BASELINE), encoding="utf-8")
    return Setups(str(d), str(baseline))


# --- helpers ----------------------------------------------------------------------------------------
@contextmanager
def recorded() -> Iterator[list[str]]:
    """Every BERTScoreWarning message raised inside (none deduplicated)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        messages: list[str] = []
        try:
            yield messages
        finally:
            messages.extend(str(w.message) for w in caught if issubclass(w.category, BERTScoreWarning))


def close(a: Any, b: Any, what: str, tol: float = TOL) -> None:
    """``a`` and ``b`` (tensors or lists of float) equal to ``tol``, NaN where the other is NaN."""
    x = torch.as_tensor(a, dtype=torch.float64).reshape(-1)
    y = torch.as_tensor(b, dtype=torch.float64).reshape(-1)
    assert x.shape == y.shape, f"{what}: shapes {tuple(x.shape)} vs {tuple(y.shape)}"
    assert torch.equal(torch.isnan(x), torch.isnan(y)), f"{what}: NaN at different places: {x.tolist()} vs {y.tolist()}"
    keep = ~torch.isnan(x)
    diff = (x[keep] - y[keep]).abs()
    largest = float(diff.max()) if diff.numel() else 0.0
    at = int(diff.argmax()) if diff.numel() else 0
    ok = largest <= tol
    assert ok, f"{what}: max |Δ| {largest:.3g} at {at}: {x[keep].tolist()} vs {y[keep].tolist()}"


def flatten(
    groups: list[tuple[list[str], list[str]]],
) -> tuple[list[list[str]], list[list[str]], list[str], list[list[str]]]:
    """(candidate lists, reference lists, flat candidates, each flat candidate's references)."""
    cands = [list(c) for c, _ in groups]
    refs = [list(r) for _, r in groups]
    flat_c = [c for g in cands for c in g]
    flat_r = [r for g, r in zip(cands, refs) for _ in g]
    return cands, refs, flat_c, flat_r


def one_hot_candidates(setups: Setups, texts: list[str], vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Content ids ``[B, T]`` (padded with 0), one-hot rows ``[B, T, V]`` and the mask of each text."""
    rows = [setups.content_ids(t) for t in texts]
    width = max(1, max(len(r) for r in rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = True
    return ids, torch.nn.functional.one_hot(ids, vocab).float(), mask


def trl_kwargs(**columns: Any) -> dict[str, Any]:
    """The extra keyword arguments GRPOTrainer passes beside the dataset columns."""
    return dict(completion_ids=None, trainer_state=None, **columns)


# --- score, score_groups, score_stream ------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(list(SETTINGS)), groups=GROUPS, chunk=st.integers(1, 4))
@example(name="idf-refs", groups=[(["the cat "], ["the "]), (["the ", "the "], ["cat "])], chunk=1)  # IDF rule
def test_score_groups_score_and_stream_agree(setups, name, groups, chunk):
    """``score_groups`` (reduce=True) = the reduction of its ``reduce=False`` blocks = ``score`` of the
    flattened pairs (with IDF and no fixed table, README's rule: the table counts the references as given
    to the call) = ``score_stream`` of them (IDF over each call: refused) = ``score`` of every single
    (candidate, reference) pair for a fixed table; empty texts score 0 (rescaled) with a warning."""
    scorer = setups.scorer(name)
    cands, refs, flat_c, flat_r = flatten(groups)
    with recorded() as messages:
        table = scorer.score_groups(cands, refs)
        blocks = scorer.score_groups(cands, refs, reduce=False)
        scores = scorer.score(flat_c, flat_r, return_ref_index=True)
    sizes = [len(g) for g in cands]
    width = max(sizes)
    assert tuple(table.f1.shape) == (len(cands), width)
    for b, n in enumerate(sizes):
        assert torch.isnan(table.f1[b, n:]).all() and not torch.isnan(table.f1[b, :n]).any()
        assert (table.ref_index[b, n:] == -1).all()
        assert tuple(blocks[b].shape) == (3, n, len(refs[b]))

    # the reduce=False blocks, reduced as the scorer reduces several references
    flat_blocks = torch.cat([blk.reshape(3, -1) for blk in blocks], dim=1)
    per_cand = [blk.shape[2] for blk in blocks for _ in range(blk.shape[1])]
    reduced = reduce_references(flat_blocks[0], flat_blocks[1], flat_blocks[2], per_cand, scorer.config.multi_ref)
    real = ~torch.isnan(table.f1)
    for k, m in enumerate(("precision", "recall", "f1")):
        close(reduced[k], table[k][real], f"{name}: score_groups reduce=True vs its reduce=False blocks ({m})")

    # score() of the flattened pairs = score_groups with one candidate per group, always
    singles = [[c] for c in flat_c]
    with recorded():
        one_each = scorer.score_groups(singles, flat_r)
        pair_blocks = scorer.score_groups(singles, flat_r, reduce=False)
    for k, m in enumerate(("precision", "recall", "f1")):
        close(scores[k], one_each[k][:, 0], f"[{name}] score() vs score_groups with one candidate per group ({m})")
    if name != "idf-refs":
        for k, m in enumerate(("precision", "recall", "f1")):
            close(scores[k], table[k][real], f"IDF [{name}]: score() of the flattened pairs vs score_groups ({m})")
    else:  # README's IDF rule: the table counts the references as given to the call
        given = BERTScorer(encoder=scorer.encoder, idf=True, idf_corpus=[r for rs in refs for r in rs])
        flat = BERTScorer(encoder=scorer.encoder, idf=True, idf_corpus=[r for rs in flat_r for r in rs])
        with recorded():
            by_group = given.score_groups(cands, refs)
            by_pair = flat.score(flat_c, flat_r)
        for k, m in enumerate(("precision", "recall", "f1")):
            close(table[k], by_group[k], f"IDF [{name}]: score_groups vs IDF over each group's references once ({m})")
            close(scores[k], by_pair[k], f"IDF [{name}]: score() vs IDF over each candidate's references ({m})")
    # the reference index names a reference whose F is the best one
    flat_pairs = torch.cat([blk.reshape(3, -1) for blk in pair_blocks], dim=1)
    sizes_r = [len(rs) for rs in flat_r]
    starts = [sum(sizes_r[:i]) for i in range(len(sizes_r))]
    best = torch.stack([flat_pairs[2][a + int(j)] for a, j in zip(starts, scores.ref_index)])
    top = torch.stack([flat_pairs[2][a : a + n].max() for a, n in zip(starts, sizes_r)])
    close(best, top, f"[{name}] F of the reference that score()'s ref_index names vs the best F")

    # empty texts: 0 (rescaled) with a warning; BERTScorer.empty_texts is the same rule
    zero = setups.zero(name)
    empty_c = [setups.is_empty(c) for c in flat_c]
    every = flat_c + [r for rs in flat_r for r in rs]
    assert scorer.empty_texts(every) == [setups.is_empty(t) for t in every], f"[{name}] BERTScorer.empty_texts"
    empty_r = [all(setups.is_empty(r) for r in rs) for rs in flat_r]
    for i, (ec, er) in enumerate(zip(empty_c, empty_r)):
        if ec or er:
            close([s[i] for s in scores[:3]], zero, f"{name}: pair {i} with an empty side must score 0 (rescaled)")
    if any(empty_c) or any(setups.is_empty(r) for rs in flat_r for r in rs):
        assert any("empty" in m for m in messages), f"{name}: no warning for empty texts: {messages}"

    # score_stream: the same values chunk by chunk; IDF over each chunk's references is refused
    pairs = list(zip(flat_c, flat_r))
    if name == "idf-refs":
        with pytest.raises(ValueError, match="idf"):
            list(scorer.score_stream(pairs, chunk_size=chunk))
    else:
        with recorded():
            chunks = list(scorer.score_stream(iter(pairs), chunk_size=chunk))
        assert [len(c.f1) for c in chunks] == [min(chunk, len(pairs) - i) for i in range(0, len(pairs), chunk)]
        for k, m in enumerate(("precision", "recall", "f1")):
            close(torch.cat([c[k] for c in chunks]), scores[k], f"{name}: score_stream vs score ({m})")
        # every block entry is the score of that one pair
        all_c = [c for g, rs in zip(cands, refs) for c in g for _ in rs]
        all_r = [r for g, rs in zip(cands, refs) for _ in g for r in rs]
        with recorded():
            single = scorer.score(all_c, all_r)
        for k, m in enumerate(("precision", "recall", "f1")):
            close(flat_blocks[k], single[k], f"{name}: score_groups reduce=False blocks vs score() per pair ({m})")


# --- the one-hot loss ------------------------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(FIXED), pairs=PAIRS)
@example(name="window", pairs=[(LONG, "the cat sat on the mat")])  # a long candidate, windowed
@example(name="rescale", pairs=[("the cat sat", "a cat sat on the mat")])  # the loss is not rescaled
def test_one_hot_loss_hard_equals_score(setups, name, pairs):
    """``BERTScoreLoss(max_mode="hard")`` on one-hot rows (and on ids) of each candidate's own uncut
    tokenisation gives ``score()``'s P, R, F (README: "one-hot candidates with max_mode="hard" reproduce
    BERTScorer.score to 1e-5"), long candidates included (windowed like the scorer's under
    ``long_inputs="window"``), with the scorer's rescaling."""
    scorer, loss = setups.scorer(name), setups.loss(name)
    cands = [c for c, _ in pairs]
    refs = [r for _, r in pairs]
    ids, onehot, mask = one_hot_candidates(setups, cands, scorer.encoder.vocab_size)
    with recorded(), torch.no_grad():
        p, r, f = scorer.score(cands, refs)
        by_ids = loss(ids, refs, mask)
        by_onehot = loss(onehot, refs, mask)
    for out, kind in ((by_onehot, "one-hot"), (by_ids, "ids")):
        for a, b, m in ((out.precision, p, "P"), (out.recall, r, "R"), (out.f1, f, "F")):
            close(
                a,
                b,
                f"[{name}] loss({kind}, max_mode='hard') vs score() ({m}) for candidate token counts "
                f"{mask.sum(1).tolist()} (model maximum {scorer.encoder.max_length}; a long candidate "
                "differs under long_inputs='window'; a rescaling scorer's loss must rescale too)",
            )
    close(by_onehot.loss, 1 - by_onehot.f1, f"[{name}] loss = 1 - F")


@PROFILE
@given(name=st.sampled_from(FIXED), pairs=PAIRS)
@example(name="plain", pairs=[("a cat", "the cat sat on the mat"), ("the dog", "a dog")])  # padded reference ids
def test_loss_references_as_ids_equal_references_as_text(setups, name, pairs):
    """The loss's references as texts, as framed id lists, or as a ``[B, L]`` tensor padded with the pad id
    (refused without ``reference_mask``, never scored as real ``[PAD]`` tokens; with the mask: the same
    values)."""
    scorer, loss = setups.scorer(name), setups.loss(name)
    cands = [c for c, _ in pairs]
    refs = [r for _, r in pairs]
    ids, _, mask = one_hot_candidates(setups, cands, scorer.encoder.vocab_size)
    framed = scorer.encoder.tokenize(refs).ids
    width = max(len(row) for row in framed)
    pad = scorer.encoder.tokenizer.pad_token_id
    padded = torch.full((len(framed), width), pad, dtype=torch.long)
    real = torch.zeros(len(framed), width, dtype=torch.bool)
    for i, row in enumerate(framed):
        padded[i, : len(row)] = torch.tensor(row)
        real[i, : len(row)] = True
    with recorded(), torch.no_grad():
        by_text = loss(ids, refs, mask)
        by_rows = loss(ids, framed, mask)
    close(by_rows.f1, by_text.f1, f"[{name}] loss with references as framed id lists vs as texts")
    if bool(real.all()):
        return  # nothing padded
    try:
        with recorded(), torch.no_grad():
            by_tensor = loss(ids, padded, mask)
    except ValueError:
        pass  # refused: padding would be scored as tokens
    else:
        close(
            by_tensor.f1,
            by_text.f1,
            f"padded ids [{name}]: loss with references as a [B, L] id tensor padded with {pad} vs as texts (padding "
            "must not be scored as a real [PAD] token: refuse padded tensors or take a mask)",
        )
    with recorded(), torch.no_grad():
        by_mask = loss(ids, padded, mask, reference_mask=real)
    close(by_mask.f1, by_text.f1, f"[{name}] loss with a padded id tensor and reference_mask vs as texts")


def test_loss_refuses_idf_over_each_batch(setups):
    with pytest.raises(ValueError, match="idf"):
        BERTScoreLoss(scorer=setups.scorer("idf-refs"), max_mode="hard")


# --- the reranker --------------------------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(list(SETTINGS)), groups=GROUPS, measure=MEASURES)
def test_reranker_agrees_with_score_groups(setups, name, groups, measure):
    """Reference-based reranking: the utility matrices are ``score_groups(reduce=False)``'s blocks, the
    BERTScore of each candidate (input order) is ``score_groups``' reduced value, the order is by it
    (ties: lowest index). MBR without references: each candidate's expected utility is the mean of
    ``U[i, j]`` over ``j != i`` (``U[0, 0]`` for a single candidate), ``U`` = blocks of the list against itself."""
    from rerank import NBestReranker

    scorer = setups.scorer(name)
    cands, refs, _, _ = flatten(groups)
    k = _K[measure]
    reranker = NBestReranker(scorer=scorer, measure=measure)
    with recorded():
        table = scorer.score_groups(cands, refs)
        blocks = scorer.score_groups(cands, refs, reduce=False)
        ranked = reranker.rerank(cands, refs, return_utility=True)
        self_blocks = scorer.score_groups(cands, cands, reduce=False)
        mbr = reranker.rerank(cands)
    for s, (res, c) in enumerate(zip(ranked, cands)):
        assert res.utility is not None
        close(res.utility, blocks[s][k], f"[{name}] reranker utility of source {s} vs score_groups blocks")
        in_order = [0.0] * len(c)
        for pos, i in enumerate(res.indices):
            in_order[i] = res.bertscore[pos]
        close(in_order, table[k][s, : len(c)], f"[{name}] reranker {measure} of source {s} vs score_groups")
        assert res.indices == sorted(range(len(c)), key=lambda i: (-in_order[i], i))
        assert res.best_index == res.indices[0] and res.best == c[res.best_index]
    for s, (res, c) in enumerate(zip(mbr, cands)):
        u = self_blocks[s][k].double()
        n = len(c)
        expected = u.diagonal() if n == 1 else (u.sum(1) - u.diagonal()) / (n - 1)
        in_order = [0.0] * n
        for pos, i in enumerate(res.indices):
            in_order[i] = res.bertscore[pos]
        close(in_order, expected, f"[{name}] MBR expected {measure} of source {s} vs the mean over j != i")


# --- the Lightning metric ---------------------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(FIXED), pairs=MULTI_PAIRS, split=st.integers(0, 5))
def test_lightning_metric_equals_score(setups, name, pairs, split):
    """``BERTScoreMetric(scorer=...)``: per-sample values over two updates = ``score()``, in input order; the
    running means = the means of ``score()``."""
    from bertscore_loss.lightning import BERTScoreMetric

    scorer = setups.scorer(name)
    cands = [c for c, _ in pairs]
    refs = [list(r) for _, r in pairs]
    cut = min(split, len(cands))
    with recorded():
        expected = scorer.score(cands, refs)
        per_sample = BERTScoreMetric(scorer=scorer, per_sample=True)
        means = BERTScoreMetric(scorer=scorer)
        for metric in (per_sample, means):
            for lo, hi in ((0, cut), (cut, len(cands))):
                if hi > lo:
                    metric.update(cands[lo:hi], refs[lo:hi])
        got = per_sample.compute()
        got_means = means.compute()
    for k, m in enumerate(("precision", "recall", "f1")):
        close(got[m], expected[k], f"[{name}] Lightning per-sample {m} vs score()")
        close(got_means[m], expected[k].double().mean(), f"[{name}] Lightning mean {m} vs the mean of score()")


# --- Hugging Face compute_metrics -------------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(FIXED), pairs=PAIRS)
def test_hf_compute_metrics_equals_score_of_the_decoded_texts(setups, name, pairs):
    """``bertscore_compute_metrics``: the means over the decoded predictions and labels = the means of
    ``score()`` on them; one row per call gives each row's value in order; ``batch_eval_metrics`` (one row a
    batch) gives the one-call means; where decoding gives back the same ids, the row's value is the original
    pair's ``score()``."""
    from bertscore_loss.integrations.hf import bertscore_compute_metrics

    scorer, tok = setups.scorer(name), setups.tokenizer
    cands = [c for c, _ in pairs]
    refs = [r for _, r in pairs]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "sequence longer than the model's maximum" from the tokenizer
        c_ids = [tok(c)["input_ids"] for c in cands]
        r_ids = [tok(r)["input_ids"] for r in refs]
    n = len(pairs)
    lp, ll = max(map(len, c_ids)), max(map(len, r_ids))
    preds = torch.full((n, lp), tok.pad_token_id, dtype=torch.long)
    labels = torch.full((n, ll), -100, dtype=torch.long)
    for i, (a, b) in enumerate(zip(c_ids, r_ids)):
        preds[i, : len(a)] = torch.tensor(a)
        labels[i, : len(b)] = torch.tensor(b)
    dec_c = [t.strip() for t in tok.batch_decode(c_ids, skip_special_tokens=True)]
    dec_r = [t.strip() for t in tok.batch_decode(r_ids, skip_special_tokens=True)]
    metrics = bertscore_compute_metrics(tok, scorer=scorer, distributed="replicate")
    names = [f"bertscore_{m}" for m in ("precision", "recall", "f1")]
    with recorded():
        expected = scorer.score(dec_c, dec_r)
        original = scorer.score(cands, refs)
        whole = metrics((preds.numpy(), labels.numpy()))
        rows = [metrics((preds[i : i + 1].numpy(), labels[i : i + 1].numpy())) for i in range(n)]
        metrics.reset()  # a batched evaluation outside a Trainer starts here
        batched = [metrics((preds[i : i + 1].numpy(), labels[i : i + 1].numpy()), i == n - 1) for i in range(n)]
    for k, key in enumerate(names):
        close(whole[key], expected[k].double().mean(), f"[{name}] compute_metrics {key} vs the mean of score()")
        close([r[key] for r in rows], expected[k], f"[{name}] compute_metrics of one row at a time ({key})")
        assert all(b == {} for b in batched[:-1])
        close(batched[-1][key], whole[key], f"[{name}] batch_eval_metrics vs one call ({key})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = [
            tok(dc)["input_ids"] == a and tok(dr)["input_ids"] == b for dc, dr, a, b in zip(dec_c, dec_r, c_ids, r_ids)
        ]
    for i in (i for i, s in enumerate(same) if s):
        close(
            [rows[i][key] for key in names],
            [original[k][i] for k in range(3)],
            f"[{name}] row {i}: decoding round-trips, so compute_metrics must equal score() of the original pair",
        )


# --- TRL rewards ------------------------------------------------------------------------------------------
@PROFILE
@given(name=st.sampled_from(FIXED), pairs=MULTI_PAIRS, measure=MEASURES, chat=st.booleans())
@example(name="rescale", pairs=[("\u200b", ["the cat"]), ("a cat", ["the cat"])], measure="f1", chat=False)  # empty
def test_trl_reference_reward_equals_score(setups, name, pairs, measure, chat):
    """``BERTScoreReward``: each completion's ``measure`` against its references as ``score()`` gives it, in
    order; a completion without a content token (empty, whitespace- or zero-width-only) gets
    ``empty_value`` (whitespace-like text is empty everywhere)."""
    from bertscore_loss.integrations import BERTScoreReward

    scorer = setups.scorer(name)
    cands = [c for c, _ in pairs]
    refs = [list(r) for _, r in pairs]
    reward = BERTScoreReward("reference", scorer, measure=measure, empty_value=EMPTY_VALUE)
    completions: list[Any] = [[{"role": "assistant", "content": c}] for c in cands] if chat else cands
    with recorded():
        got = reward(prompts=["p"] * len(cands), completions=completions, **trl_kwargs(reference=refs))
        expected = scorer.score(cands, refs)[_K[measure]].tolist()
    want = [EMPTY_VALUE if setups.is_empty(c) else v for c, v in zip(cands, expected)]
    close(
        got,
        want,
        f"[{name}] BERTScoreReward ({measure}) vs score(), empty_value for the completions without a content "
        f"token {[i for i, c in enumerate(cands) if setups.is_empty(c)]} (zero-width-only completions are empty)",
    )


@PROFILE
@given(
    name=st.sampled_from(FIXED),
    size=st.integers(2, 4),
    texts=st.lists(TEXTS, min_size=8, max_size=8),
    groups=st.integers(1, 2),
    measure=MEASURES,
)
@example(name="plain", size=2, texts=["the cat", "\ufeff", *["a dog"] * 6], groups=1, measure="f1")  # empty
def test_trl_mbr_reward_equals_mean_score_over_non_empty_partners(setups, name, size, texts, groups, measure):
    """``MBRConsensusReward(num_generations=G)``: completion ``i`` gets the mean ``measure`` of
    ``score(c_i, c_j)`` over the other completions ``j`` of its group that have a content token;
    ``empty_value`` for an empty completion or one without such a partner."""
    from bertscore_loss.integrations import MBRConsensusReward

    scorer = setups.scorer(name)
    completions = texts[: size * groups]
    reward = MBRConsensusReward(scorer, num_generations=size, measure=measure, empty_value=EMPTY_VALUE)
    with recorded():
        got = reward(prompts=["p"] * len(completions), completions=completions, **trl_kwargs())
    empty = [setups.is_empty(c) for c in completions]
    pairs = [
        (i, j)
        for i in range(len(completions))
        for j in range(len(completions))
        if i != j and i // size == j // size and not empty[i] and not empty[j]
    ]
    values: list[float] = []
    if pairs:
        with recorded():
            values = scorer.score([completions[i] for i, _ in pairs], [completions[j] for _, j in pairs])[
                _K[measure]
            ].tolist()
    want = []
    for i in range(len(completions)):
        mine = [v for (a, _), v in zip(pairs, values) if a == i]
        want.append(sum(mine) / len(mine) if mine else EMPTY_VALUE)
    close(
        got,
        want,
        f"[{name}] MBRConsensusReward ({measure}) vs the mean score over non-empty partners; completions without "
        f"a content token {[i for i, e in enumerate(empty) if e]} must get empty_value and be no one's partner",
    )


# --- one rule for IDF without a fixed table ----------------------------------------------------------------
def test_idf_without_a_fixed_table_is_one_rule_everywhere(setups):
    """One IDF rule: the Lightning metric refuses ``idf=True`` without ``idf_corpus`` (IDF would change with the
    batching); ``score_stream`` and the loss refuse it too; so must the HF metric and the TRL rewards."""
    from bertscore_loss.integrations import BERTScoreReward, MBRConsensusReward
    from bertscore_loss.integrations.hf import bertscore_compute_metrics
    from bertscore_loss.lightning import BERTScoreMetric

    scorer = setups.scorer("idf-refs")
    front_ends: dict[str, Callable[[], object]] = {
        "BERTScoreMetric(idf=True)": lambda: BERTScoreMetric(model=setups.model_dir, layer=2, idf=True),
        "BERTScoreMetric(scorer=...)": lambda: BERTScoreMetric(scorer=scorer),
        "score_stream": lambda: list(scorer.score_stream([("a", "b")])),
        "BERTScoreLoss": lambda: BERTScoreLoss(scorer=scorer),
        "bertscore_compute_metrics": lambda: bertscore_compute_metrics(setups.tokenizer, scorer=scorer),
        "BERTScoreReward": lambda: BERTScoreReward("reference", scorer),
        "MBRConsensusReward": lambda: MBRConsensusReward(scorer, num_generations=2),
    }
    accepted = []
    for what, build in front_ends.items():
        try:
            build()
        except ValueError:
            continue
        accepted.append(what)
    assert not accepted, (
        f"{accepted} accept idf=True without a fixed IDF table (recomputed per batch / per rank) while the "
        "Lightning metric refuses it: one rule everywhere"
    )


# --- a sample against bert-score on the real MiniLM ---------------------------------------------------------
#: bert-score 0.3.13 cannot encode a text that strips to "" under transformers 5 (its ``sent_encode`` calls
#: the removed ``build_inputs_with_special_tokens``): the sample keeps non-empty texts (zero-width-only ones
#: included); the empty-text rule is asserted on the tiny model above.
_ORACLE_TEXTS = TEXTS.filter(lambda t: bool(t.strip()))
ORACLE_PAIRS = st.lists(
    st.tuples(_ORACLE_TEXTS, st.lists(_ORACLE_TEXTS, min_size=1, max_size=3)), min_size=1, max_size=5
)


@pytest.fixture(scope="module")
def minilm_oracles():
    """``bert_score.BERTScorer`` on the bundled MiniLM folder at layer 4 (without and with IDF)."""
    from bert_score import BERTScorer as Oracle

    from .conftest import bundled_path

    return {
        # nthreads=0: IDF counted in this process (bert-score's worker pool fails to unpickle this tokenizer)
        idf: Oracle(
            model_type=bundled_path(), num_layers=4, idf=idf, idf_sents=["x"] if idf else None, device="cpu", nthreads=0
        )
        for idf in (False, True)
    }


@pytest.mark.slow
@settings(PROFILE, max_examples=8)
@given(pairs=ORACLE_PAIRS, idf=st.booleans())
@example(pairs=[(" ".join([LONG] * 8), ["the cat sat on the mat"]), ("\u200b", ["a\u00a0cat"])], idf=False)
@example(pairs=[("the " * 40 + "cat", ["the "]), ("the ", ["the "])], idf=True)  # weightless sides
def test_sample_against_bert_score(minilm_encoders, minilm_oracles, pairs, idf):
    """``score()`` on the real MiniLM (layer 4) = ``bert-score`` 0.3.13 to 1e-5, except where README documents
    a divergence: a token whose best real similarity is negative (bert-score may match padding, so it scores
    higher there), and a pair with a side whose weights are all 0 (IDF 0 for all its tokens, or no content
    token): there P = R = F = 0, where bert-score gives NaN (as 0 for F) on that side."""
    from bert_score.utils import sent_encode

    from .test_parity import negative_best_match

    cands = [c for c, _ in pairs]
    refs = [list(r) for _, r in pairs]
    scorer = BERTScorer(encoder=minilm_encoders(4), idf=idf)
    oracle = minilm_oracles[idf]
    if idf:
        oracle.compute_idf([r for rs in refs for r in rs])
    special = {oracle._tokenizer.cls_token_id, oracle._tokenizer.sep_token_id}

    def weightless(text: str) -> bool:
        ids = [t for t in sent_encode(oracle._tokenizer, text) if t not in special]
        return not ids or (idf and sum(oracle._idf_dict[t] for t in ids) == 0)

    zero_side = torch.tensor([weightless(c) or any(weightless(r) for r in rs) for c, rs in pairs])
    all_zero = [weightless(c) or all(weightless(r) for r in rs) for c, rs in pairs]
    with recorded():
        ours = scorer.score(cands, refs)
        skip = negative_best_match(scorer, cands, refs) | zero_side
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = oracle.score(cands, refs)
    keep = ~skip
    for k, m in enumerate("PRF"):
        close(ours[k][keep], theirs[k][keep], f"score() vs bert-score ({m}, idf={idf})")
        higher = theirs[k][skip & ~zero_side]
        assert (ours[k][skip & ~zero_side] - higher <= TOL).all()  # where padding was matched, bert-score is higher
    for i in (i for i, z in enumerate(all_zero) if z):
        close([s[i] for s in ours], [0.0, 0.0, 0.0], f"pair {i} with a weightless side scores 0 (idf={idf})")
    assert not math.isnan(float(ours.f1.sum()))
