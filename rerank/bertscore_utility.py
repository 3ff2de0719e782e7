"""BERTScore (P, R or F) as an MBR utility, on the token embeddings of the distinct texts of an MBR call.

* The distinct texts of a chunk of sources are encoded once (:meth:`bertscore_loss.BERTScorer.embed`);
  whole ``[n, m]`` matrices, blocks of them (pruning) and reference aggregation are matched with the
  functions of :mod:`bertscore_loss.matching` (``cosine_matrix``, ``greedy_match``, ``precision_recall_f``)
  in length-sorted tiles. The values equal the engine's, :meth:`BERTScorer.score_groups` with
  ``reduce=False`` (tests; ``engine="score_groups"`` uses it for whole matrices).

**Reference aggregation** (the BERTScore analogue of Vamvas & Sennrich 2024): the pseudo-references of a
source are summarised by one bag of token vectors, one per distinct token id ``τ``: the mean of that
token's contextual embeddings over all its occurrences in the pseudo-references, each occurrence weighted
by its pseudo-reference's expectation weight ``w_j``. Each bag token has a *mass*, the sum over its
occurrences of ``w_j * ŵ_t`` (``ŵ_t``: the token's BERTScore weight, IDF or 1 and 0 for special tokens,
normalised within its pseudo-reference), and a *presence* ``q_τ = sum_j w_j [τ occurs in r_j]``. A
hypothesis is scored once against the bag:

* recall = mass-weighted mean over bag tokens of their best cosine with a hypothesis token
  (``greedy_match``); with context-free embeddings this is the exact expected recall;
* precision = weighted mean over hypothesis tokens ``s`` of their *expected* best cosine in one
  pseudo-reference, under independent presence of the bag tokens: with the bag tokens sorted by
  ``cos(s, ·)`` descending, ``sum_k cos_k q_k prod_{l<k} (1 - q_l)``, normalised by the probability that
  any is present;
* F = their harmonic mean; all three are scaled by the weight of the non-empty pseudo-references (an
  empty one scores 0 in the exact expectation) and rescaled like the exact values.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from bertscore_loss import BERTScorer, BERTScoreWarning
from bertscore_loss.config import MEASURES, Measure, check_measure, max_elements_for
from bertscore_loss.encoder import PackedEmbeddings
from bertscore_loss.matching import cosine_matrix, greedy_match, precision_recall_f, rescale
from bertscore_loss.scorer import match_blocks, scorer_from

from .utility import Session, Utility

__all__ = ["BERTScoreUtility"]

_INDEX = {name: k for k, name in enumerate(MEASURES)}


class BERTScoreUtility(Utility):
    """BERTScore ``measure`` (``"f1"``, ``"precision"`` or ``"recall"``) of hypothesis i against pseudo-reference
    j, in [0, 1] (rescaled if the scorer rescales).

    ``scorer``: a :class:`bertscore_loss.BERTScorer` to share, or its settings as keywords (``layer=4`` …).
    With ``idf=True`` and no fixed IDF table the table is computed once per MBR call over all its
    pseudo-references (each occurrence counted), as :meth:`BERTScorer.score_groups` does.

    ``engine``: how whole matrices are computed. ``"tiles"`` (default): the sources' distinct texts are
    embedded once (:meth:`BERTScorer.embed`) and matched in length-sorted tiles, each padded only to its
    own longest texts, and only the upper triangle when the hypotheses are their own pseudo-references
    (P and R swap under transposition); ``"score_groups"``: one :meth:`BERTScorer.score_groups` call. Both
    give the same values (to float rounding, tests); on sample lists of varied length the tiles are 2-3x
    faster.
    """

    supports_aggregation = True

    def __init__(
        self,
        scorer: BERTScorer | None = None,
        measure: Measure = "f1",
        *,
        engine: Literal["tiles", "score_groups"] = "tiles",
        **fields: Any,
    ) -> None:
        check_measure(measure)
        if engine not in ("tiles", "score_groups"):
            raise ValueError(f"engine must be 'tiles' or 'score_groups', got {engine!r}")
        self.engine = engine
        self.scorer = scorer_from(scorer, owner="BERTScoreUtility", **fields)
        self.measure: Measure = measure
        self.name = "bertscore" if measure == "f1" else f"bertscore-{measure}"

    def session(
        self, hypotheses: list[list[str]], references: list[list[str]], reference_counts: Sequence[Tensor] | None = None
    ) -> Session:
        """``reference_counts[s]`` ``[m_s]``: occurrences of each distinct pseudo-reference in the caller's list
        (for the IDF table; default 1 each)."""
        return _BERTScoreSession(hypotheses, references, self, reference_counts)

    def signature(self) -> str:
        return f"{self.scorer.signature()}|measure:{self.measure}"


class _Embedded:
    """Token embeddings of the distinct (stripped) texts of some sources, their weights and the texts' positions."""

    def __init__(self, scorer: BERTScorer, hyps: list[list[str]], refs: list[list[str]], progress: bool | None) -> None:
        index: dict[str, int] = {}
        self.hyp_pos = [
            torch.tensor([index.setdefault(t.strip(), len(index)) for t in h], dtype=torch.long) for h in hyps
        ]
        self.ref_pos = [
            torch.tensor([index.setdefault(t.strip(), len(index)) for t in r], dtype=torch.long) for r in refs
        ]
        self.packed: PackedEmbeddings
        self.packed, ids = scorer.embed(list(index), progress=progress)
        self.weight = scorer.weights(self.packed)
        special = scorer.encoder.special_ids
        empty = torch.tensor([all(t in special for t in row) for row in ids], dtype=torch.bool)
        eh = sum(int(empty[p].sum()) for p in self.hyp_pos)
        er = sum(int(empty[p].sum()) for p in self.ref_pos)
        if eh or er:
            warnings.warn(
                f"{eh} empty hypothesis text(s) and {er} empty pseudo-reference text(s) (distinct texts): their pairs "
                "score P = R = F = 0 before rescaling",
                BERTScoreWarning,
                stacklevel=6,
            )


class _BERTScoreSession(Session):
    supports_aggregation = True

    def __init__(
        self,
        hypotheses: list[list[str]],
        references: list[list[str]],
        utility: BERTScoreUtility,
        reference_counts: Sequence[Tensor] | None,
    ) -> None:
        super().__init__(hypotheses, references)
        base = utility.scorer
        self.k = _INDEX[utility.measure]
        self.scorer = base
        if base.config.idf and base.idf is None and any(references):
            # one table for the whole call (every chunk of sources, every block): over all pseudo-references
            counts = reference_counts or [torch.ones(len(r), dtype=torch.long) for r in references]
            corpus = [t for r, c in zip(references, counts) for t, k in zip(r, c.tolist()) for _ in range(int(k))]
            self.scorer = BERTScorer(base.config, encoder=base.encoder, idf_corpus=corpus)
        self.max_elements = base.config.max_elements  # None: the engine's block default
        self.engine = utility.engine
        self._key: tuple[int, ...] | None = None
        self._emb: _Embedded | None = None

    # --- exact blocks ---------------------------------------------------------------------------------
    def full(self, sources: Sequence[int]) -> list[Tensor]:
        """Every pair of each source: length-sorted tiles on the embeddings (``engine="tiles"``; only the upper
        triangle when a source's hypotheses are its pseudo-references) or one
        :meth:`BERTScorer.score_groups` call (``engine="score_groups"``)."""
        if self.engine == "score_groups":
            hyps = [self.hypotheses[s] for s in sources]
            refs = [self.references[s] for s in sources]
            keep = [i for i, r in enumerate(refs) if r]
            out = [torch.zeros((len(h), len(r)), dtype=torch.float64) for h, r in zip(hyps, refs)]
            if keep:
                blocks = self.scorer.score_groups(
                    [hyps[i] for i in keep], [refs[i] for i in keep], reduce=False, progress=False
                )
                for i, b in zip(keep, blocks):
                    out[i] = b[self.k].double()
            return out
        emb = self.embedded(sources)
        result = []
        for k, s in enumerate(sources):
            same = self.hypotheses[s] is self.references[s]
            prf = match_blocks(emb.packed, emb.weight, emb.hyp_pos[k], emb.ref_pos[k], self.max_elements, same)
            result.append(self._rescaled(prf)[self.k].double())
        return result

    def embedded(self, sources: Sequence[int]) -> _Embedded:
        """The sources' embeddings, encoded on the first request for this set of sources (the last set is kept)."""
        key = tuple(sources)
        if self._emb is None or self._key != key:
            self._emb = None  # free the previous chunk first
            hyps = [self.hypotheses[s] for s in sources]
            refs = [self.references[s] for s in sources]
            self._emb, self._key = _Embedded(self.scorer, hyps, refs, False), key
        return self._emb

    def blocks(self, sources: Sequence[int], rows: Sequence[Tensor], cols: Sequence[Tensor]) -> list[Tensor]:
        emb = self.embedded(sources)
        out = []
        for k, (r, c) in enumerate(zip(rows, cols)):
            prf = match_blocks(emb.packed, emb.weight, emb.hyp_pos[k][r], emb.ref_pos[k][c], self.max_elements)
            out.append(self._rescaled(prf)[self.k].double())
        return out

    # --- reference aggregation -------------------------------------------------------------------------
    def aggregate(self, sources: Sequence[int], rows: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
        emb = self.embedded(sources)
        out = []
        for k, (r, w) in enumerate(zip(rows, weights)):
            prf = aggregate_prf(emb.packed, emb.weight, emb.hyp_pos[k][r], emb.ref_pos[k], w, self.max_elements)
            out.append(self._rescaled(prf)[self.k].double())
        return out

    def _rescaled(self, prf: Tensor) -> Tensor:
        base = self.scorer.baseline
        if base is None:
            return prf
        return torch.stack([rescale(prf[i], base[i]) for i in range(3)])


def aggregate_prf(
    packed: PackedEmbeddings,
    weight: Tensor,
    rows: Tensor,
    cols: Tensor,
    ref_weights: Tensor,
    max_elements: int | None = None,
) -> Tensor:
    """P, R, F ``[3, n]`` (float32, CPU) of texts ``rows`` against the bag of texts ``cols`` weighted by
    ``ref_weights`` ``[m]`` (summing to 1): see the module docstring."""
    max_elements = max_elements_for(packed.flat.device, max_elements, blocks=True)
    n = len(rows)
    out = torch.zeros((3, n))
    if not n or not len(cols):
        return out
    device = packed.flat.device
    w = ref_weights.to(device=device, dtype=torch.float32)
    re, rm, rw = packed.gather(cols.to(device), weight)  # [m, L, d], [m, L], [m, L]
    m, length, d = re.shape
    steps = torch.arange(length, device=device)
    positions = (packed.offsets[cols.to(device)].unsqueeze(1) + steps).masked_fill(~rm, 0)
    token_ids = packed.token_ids[positions]  # [m, L]
    totals = rw.sum(1, keepdim=True)  # [m, 1]
    share = torch.where(totals > 0, rw / torch.where(totals > 0, totals, torch.ones_like(totals)), 0.0)
    mass = (w.unsqueeze(1) * share)[rm]  # [N] over all real tokens
    occurrence = w.unsqueeze(1).expand_as(rw)[rm]
    owner = torch.arange(m, device=device).unsqueeze(1).expand_as(rw)[rm]
    types, inverse = torch.unique(token_ids[rm], return_inverse=True)
    k = len(types)
    bag = torch.zeros((k, d), device=device).index_add_(0, inverse, re[rm].float() * occurrence.unsqueeze(1))
    bag_mass = torch.zeros(k, device=device).index_add_(0, inverse, mass)
    pairs = torch.unique(owner * k + inverse)  # (pseudo-reference, bag token) present
    presence = torch.zeros(k, device=device).index_add_(0, pairs % k, w[pairs // k])
    keep = presence > 0
    bag, bag_mass, presence = bag[keep], bag_mass[keep], presence[keep]
    nonempty = float(w[totals.squeeze(1) > 0].sum())
    k = len(bag)
    if not k:
        return out
    lengths = packed.lengths.cpu()
    order = torch.argsort(lengths[rows], descending=True, stable=True)
    i0 = 0
    while i0 < n:
        lc = int(lengths[rows[order[i0]]])
        a = max(1, min(n - i0, max_elements // max(1, lc * k)))
        idx = order[i0 : i0 + a]
        ce, cm, cw = packed.gather(rows[idx].to(device), weight, lc)
        a = ce.shape[0]
        sim = cosine_matrix(ce.reshape(1, a * lc, d).float(), bag.unsqueeze(0), cm.reshape(1, -1), None).view(a, lc, k)
        matches = greedy_match(sim, cm, None)  # ref_sim [a, K]: each bag token's best hypothesis token
        ranked, by = torch.sort(sim, dim=-1, descending=True)  # [a, lc, K]
        q = presence[by]
        before = torch.cumprod(torch.cat([torch.ones_like(q[..., :1]), 1 - q[..., :-1]], dim=-1), dim=-1)
        best = q * before  # P(bag token k is the best one present in a pseudo-reference)
        expected = (torch.nan_to_num(ranked, neginf=0.0) * best).sum(-1) / best.sum(-1).clamp_min(1e-12)
        expected = expected.masked_fill(~cm, 0.0)
        p, r, f = precision_recall_f(expected, matches.ref_sim, cw, bag_mass.expand(a, k))
        out[:, idx] = torch.stack((p, r, f)).float().cpu() * nonempty
        i0 += a
    return out
