"""N-best reranking with BERTScore: reference-based and minimum-Bayes-risk (MBR), in batch.

Shapes: ``S`` sources, ``n`` candidates of one source, ``m`` references (or pseudo-references) of one
source, ``L`` tokens of one text, ``d`` hidden size.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bertscore_loss import BERTScorer, BERTScoreWarning, FrozenEncoder, PackedEmbeddings, ScorerConfig
from bertscore_loss import reduce_references as _reduce_references
from bertscore_loss import rescale as _rescale
from bertscore_loss.idf import idf_table
from bertscore_loss.inputs import check_references, check_texts
from bertscore_loss.matching import cosine_matrix, greedy_match, precision_recall_f

logger = logging.getLogger(__name__)

Measure = Literal["f", "p", "r"]
Expectation = Literal["uniform", "model"]
_MEASURES = {"p": 0, "r": 1, "f": 2}


@dataclass
class RerankResult:
    """The reranked candidate list of one source.

    ``indices``: the candidates' input indices best-first (ties: lowest index first); ``candidates``,
    ``scores`` (final score), ``bertscore`` (the BERTScore part: F/P/R against the reference(s), or
    the MBR expected utility) and ``model_scores`` are aligned with ``indices``. ``utility``: the
    ``[n, m]`` matrix of the chosen measure (rescaled if the scorer rescales) with rows and columns in
    input order — against each reference, or U[i, j] against pseudo-reference j in MBR — when asked for.
    """

    best_index: int
    best: str
    indices: list[int]
    candidates: list[str]
    scores: list[float]
    bertscore: list[float]
    model_scores: list[float] | None = None
    utility: Tensor | None = None


class NBestReranker:
    """Rerank candidate lists by BERTScore against references or by MBR, many sources per call.

    Configure it like :class:`bertscore_loss.BERTScorer` (a ``ScorerConfig`` and/or its fields as
    keywords: ``model``, ``layer``, ``idf``, ``rescale``, ``baseline``, ``device``, ``dtype``,
    ``max_elements`` …), or pass an existing ``scorer`` (or ``encoder``) to share its model.

    Defaults of :meth:`rerank`, overridable per call: ``measure`` (``"f"``, ``"p"`` or ``"r"``),
    ``include_self`` (MBR: whether U[i, i] counts), ``expectation`` (MBR: ``"uniform"`` or ``"model"``
    = weighted by ``softmax(model_scores / temperature)``) and ``weight`` (interpolation with the
    model scores).

    >>> reranker = NBestReranker(layer=4)                            # doctest: +SKIP
    >>> [r.best for r in reranker.rerank([["a cat", "a dog"]], ["the cat"])]   # doctest: +SKIP
    ['a cat']
    """

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        scorer: BERTScorer | None = None,
        encoder: FrozenEncoder | None = None,
        idf_corpus: Sequence[str] | None = None,
        measure: Measure = "f",
        include_self: bool = False,
        expectation: Expectation = "uniform",
        temperature: float = 1.0,
        weight: float = 0.0,
        **fields: object,
    ) -> None:
        if scorer is not None:
            if config is not None or fields or encoder is not None or idf_corpus is not None:
                raise ValueError("pass either scorer=... or the scorer's settings (config, fields, encoder), not both")
            self.scorer = scorer
        else:
            self.scorer = BERTScorer(config, idf_corpus=idf_corpus, encoder=encoder, **fields)
        _check_options(measure, expectation, temperature, weight)
        self.measure: Measure = measure
        self.include_self = bool(include_self)
        self.expectation: Expectation = expectation
        self.temperature = float(temperature)
        self.weight = float(weight)

    @property
    def config(self) -> ScorerConfig:
        return self.scorer.config

    def signature(self) -> str:
        """The scorer's signature (everything that determines the BERTScore part)."""
        return self.scorer.signature()

    # --- the public call ----------------------------------------------------------------------
    def rerank(
        self,
        candidates: Sequence[Sequence[str]],
        references: Sequence[str] | Sequence[Sequence[str]] | None = None,
        *,
        pseudo_references: Sequence[Sequence[str]] | None = None,
        model_scores: Sequence[Sequence[float]] | None = None,
        pseudo_scores: Sequence[Sequence[float]] | None = None,
        weight: float | None = None,
        measure: Measure | None = None,
        include_self: bool | None = None,
        expectation: Expectation | None = None,
        temperature: float | None = None,
        return_utility: bool = False,
    ) -> list[RerankResult]:
        """Rerank each source's candidate list; one :class:`RerankResult` per source, in input order.

        ``candidates``: one list per source (ragged; duplicates and empty strings allowed; an empty
        candidate scores 0). ``references``: one str or a list of str per source → reference-based
        reranking (the candidate's ``measure`` against its reference(s), several reduced as the
        scorer's ``multi_ref``). Without references: MBR, with U[i, j] = ``measure``(candidate i,
        pseudo-reference j), the pseudo-references being the candidates themselves or
        ``pseudo_references`` (one list per source, e.g. samples). The expected utility is the mean of
        U[i, j] over j (``expectation="uniform"``) or weighted by ``softmax(scores / temperature)`` of
        the pseudo-references (``"model"``: ``model_scores``, or ``pseudo_scores`` for separate
        pseudo-references); with the candidates as pseudo-references j = i counts only if
        ``include_self`` (a list of one candidate then uses U[0, 0]).

        ``model_scores``: per candidate, e.g. length-normalised log-probabilities; the final score is
        ``(1 - weight) * bertscore + weight * model_score``. Ties go to the lowest index.
        """
        weight = self.weight if weight is None else float(weight)
        measure = self.measure if measure is None else measure
        include_self = self.include_self if include_self is None else bool(include_self)
        expectation = self.expectation if expectation is None else expectation
        temperature = self.temperature if temperature is None else float(temperature)
        _check_options(measure, expectation, temperature, weight)

        cands = _check_lists(candidates, "candidates")
        sizes = [len(c) for c in cands]
        mscores = None if model_scores is None else _check_scores(model_scores, sizes, "model_scores")
        if weight > 0 and mscores is None:
            raise ValueError(f"weight={weight} interpolates with model scores: pass model_scores=")
        mbr = references is None
        if not mbr and pseudo_references is not None:
            raise ValueError("pass references= (reference-based) or pseudo_references= (MBR), not both")
        if mbr:
            if pseudo_references is None:
                groups, gscores, separate = cands, mscores, False
                if pseudo_scores is not None:
                    raise ValueError("pseudo_scores= belongs to pseudo_references=; the candidates use model_scores=")
            else:
                groups = _check_lists(pseudo_references, "pseudo_references")
                if len(groups) != len(cands):
                    raise ValueError(
                        f"got {len(cands)} candidate lists but {len(groups)} pseudo-reference lists: "
                        "the lengths must match"
                    )
                separate = True
                gscores = (
                    None
                    if pseudo_scores is None
                    else _check_scores(pseudo_scores, [len(g) for g in groups], "pseudo_scores")
                )
            if expectation == "model" and gscores is None:
                need = "pseudo_scores" if separate else "model_scores"
                raise ValueError(f'expectation="model" weights the pseudo-references by their scores: pass {need}=')
        else:
            if pseudo_scores is not None:
                raise ValueError("pseudo_scores= is for MBR with pseudo_references=, not reference-based reranking")
            groups = check_references(references, len(cands), "references")
            gscores, separate = None, True

        self._warn_empty(cands, groups if separate else [])
        key: dict[str, int] = {}
        for t in (*(x for c in cands for x in c), *(x for g in groups for x in g)):
            key.setdefault(t.strip(), len(key))
        texts = list(key)
        if not cands:
            return []
        packed, ids = self.scorer.embed(texts)
        rows = [torch.tensor([key[t.strip()] for t in c], dtype=torch.long) for c in cands]
        cols = [torch.tensor([key[t.strip()] for t in g], dtype=torch.long) for g in groups]

        idf = None
        if self.scorer.config.idf:
            idf = self.scorer.idf
            if idf is None:  # over the (pseudo-)references of the call, each occurrence once
                idf = idf_table([ids[int(i)] for c in cols for i in c], self.scorer.encoder.vocab_size)
        weights = self.scorer.weights(packed, idf)
        blocks = score_blocks(
            packed,
            weights,
            rows,
            cols,
            max_elements=self.scorer.config.max_elements or 1 << 24,  # tiles of whole sources: big chunks
            progress=self.scorer._progress(len(texts)),
        )
        k = _MEASURES[measure]
        baseline = self.scorer.baseline
        if mbr:
            utils = [b[k] if baseline is None else _rescale(b[k], baseline[k]) for b in blocks]
            use_weights = expectation == "model"
            bert = [
                expected_utility(
                    u,
                    gscores[s] if use_weights else None,
                    temperature,
                    exclude_diagonal=not separate and not include_self,
                )
                for s, u in enumerate(utils)
            ]
        else:
            utils, bert = self._reference_scores(blocks, k)

        results = []
        for s, (c, b) in enumerate(zip(cands, bert)):
            ms = None if mscores is None else mscores[s]
            final = b if weight == 0 else (1.0 - weight) * b + weight * ms
            order = torch.sort(final, descending=True, stable=True).indices.tolist()
            results.append(
                RerankResult(
                    best_index=order[0],
                    best=c[order[0]],
                    indices=order,
                    candidates=[c[i] for i in order],
                    scores=final[order].tolist(),
                    bertscore=b[order].tolist(),
                    model_scores=None if ms is None else ms[order].tolist(),
                    utility=utils[s].float() if return_utility else None,
                )
            )
        return results

    # --- helpers ------------------------------------------------------------------------------
    def _reference_scores(self, blocks: list[Tensor], k: int) -> tuple[list[Tensor], list[Tensor]]:
        """Per source the ``[n, m]`` matrix of measure ``k`` and each candidate's score ``[n]`` (float64)."""
        sizes = [m for b in blocks for m in [b.shape[2]] * b.shape[1]]
        p, r, f = (torch.cat([b[i].reshape(-1) for b in blocks]) for i in range(3))
        reduced = _reduce_references(p, r, f, sizes, self.scorer.config.multi_ref)
        picked = reduced[k]
        baseline = self.scorer.baseline
        if baseline is not None:
            picked = _rescale(picked, baseline[k])
        utils = [b[k] if baseline is None else _rescale(b[k], baseline[k]) for b in blocks]
        per_source = torch.split(picked.double(), [b.shape[1] for b in blocks])
        return utils, list(per_source)

    @staticmethod
    def _warn_empty(cands: list[list[str]], refs: list[list[str]]) -> None:
        ec = sum(1 for c in cands for t in c if not t.strip())
        er = sum(1 for g in refs for t in g if not t.strip())
        if ec or er:
            warnings.warn(
                f"{ec} empty candidate(s) and {er} empty reference(s): their pairs score P = R = F = 0",
                BERTScoreWarning,
                stacklevel=3,
            )


def expected_utility(
    utility: Tensor, log_weights: Tensor | None, temperature: float = 1.0, *, exclude_diagonal: bool = False
) -> Tensor:
    """Expected utility ``[n]`` (float64) of each row of ``utility`` ``[n, m]`` over its columns.

    Column weights are uniform (``log_weights=None``) or ``softmax(log_weights / temperature)`` ``[m]``.
    With ``exclude_diagonal`` (square ``utility``: the candidates are their own pseudo-references)
    column j = i is left out and the weights renormalised; a row with no other column of positive
    weight (e.g. n = 1) uses U[i, i]. Computed as the full row minus the diagonal term, so identical
    candidates with identical weights get bitwise identical values.
    """
    u = utility.double().cpu()
    n, m = u.shape
    if log_weights is None:
        w = torch.ones(m, dtype=torch.float64)
    else:
        lw = log_weights.double().cpu() / temperature
        w = torch.exp(lw - lw.max()) if torch.isfinite(lw.max()) else torch.ones(m, dtype=torch.float64)
    num = u @ w
    den = w.sum().expand(n).clone()
    if exclude_diagonal:
        if n != m:
            raise ValueError(f"exclude_diagonal needs a square utility matrix, got {n}x{m}")
        diag = u.diagonal()
        num = num - w * diag
        den = den - w
        alone = den <= den.new_tensor(1e-12) * w.sum()
        return torch.where(alone, diag, num / torch.where(alone, torch.ones_like(den), den))
    return num / den


def score_blocks(
    packed: PackedEmbeddings,
    weight: Tensor,
    rows: Sequence[Tensor],
    cols: Sequence[Tensor],
    *,
    max_elements: int = 1 << 24,
    progress: bool = False,
) -> list[Tensor]:
    """P, R, F ``[3, n_s, m_s]`` (float32, CPU) of every (row text, column text) pair of each source ``s``.

    ``rows[s]`` ``[n_s]`` and ``cols[s]`` ``[m_s]`` index texts of ``packed``; ``weight`` ``[T]`` are the
    token weights aligned with ``packed.flat``. Each source is one block: its row texts' tokens
    ``[n, L, d]`` are matched against its column texts' tokens ``[m, L, d]`` with one cosine matrix
    ``[n·Lc, m·Lr]``, viewed as ``[n, m, Lc, Lr]``; blocks of similar token lengths are batched
    (``[sources, n, m, Lc, Lr]``) up to ``max_elements`` cosine entries (and gathered embedding
    floats) per chunk, and a source larger than that is split into tiles. The math is
    :mod:`bertscore_loss.matching`'s.
    """
    if len(rows) != len(cols):
        raise ValueError(f"got {len(rows)} row lists but {len(cols)} column lists")
    lengths = packed.lengths.cpu()
    d = int(packed.flat.shape[1]) if packed.flat.dim() == 2 else 1
    tok_cap = max(max_elements // (2 * d), 1)  # gathered tokens per side of a tile
    out = [torch.zeros((3, len(r), len(c))) for r, c in zip(rows, cols)]
    tiles = []
    for s, (r, c) in enumerate(zip(rows, cols)):
        if len(r) == 0 or len(c) == 0:
            continue
        lc, lr = int(lengths[r].max()), int(lengths[c].max())
        cap = max(max_elements // (lc * lr), 1)  # pairs per tile
        mb = min(len(c), cap, max(tok_cap // lr, 1))
        nb = max(min(len(r), cap // mb, max(tok_cap // lc, 1)), 1)
        for i0 in range(0, len(r), nb):
            for j0 in range(0, len(c), mb):
                tiles.append((lc * lr, lc, lr, s, i0, j0, r[i0 : i0 + nb], c[j0 : j0 + mb]))
    tiles.sort(key=lambda t: t[:3])
    chunks: list[list[tuple]] = []
    size = (0, 0, 0, 0)
    for t in tiles:
        new = (max(size[0], len(t[6])), max(size[1], len(t[7])), max(size[2], t[1]), max(size[3], t[2]))
        per_tile = max(math.prod(new), (new[0] * new[2] + new[1] * new[3]) * d)  # cosines, gathered floats
        if chunks and (len(chunks[-1]) + 1) * per_tile <= max_elements:
            chunks[-1].append(t)
            size = new
        else:
            chunks.append([t])
            size = (len(t[6]), len(t[7]), t[1], t[2])
    for chunk in tqdm(chunks, desc="matching", unit="chunk", disable=not progress, leave=False):
        prf = _score_chunk(packed, weight, chunk)
        for b, (_, _, _, s, i0, j0, r, c) in enumerate(chunk):
            out[s][:, i0 : i0 + len(r), j0 : j0 + len(c)] = prf[:, b, : len(r), : len(c)]
    return out


def _score_chunk(packed: PackedEmbeddings, weight: Tensor, chunk: list[tuple]) -> Tensor:
    """P, R, F ``[3, B, N, M]`` of the tiles of one chunk (padded to the chunk's largest tile)."""
    device = packed.flat.device
    b = len(chunk)
    n = max(len(t[6]) for t in chunk)
    m = max(len(t[7]) for t in chunk)
    lc = max(t[1] for t in chunk)
    lr = max(t[2] for t in chunk)
    ridx = torch.full((b, n), -1, dtype=torch.long)
    cidx = torch.full((b, m), -1, dtype=torch.long)
    for k, t in enumerate(chunk):
        ridx[k, : len(t[6])] = t[6]
        cidx[k, : len(t[7])] = t[7]
    ce, cm, cw = _gather(packed, weight, ridx.to(device), lc)
    re, rm, rw = _gather(packed, weight, cidx.to(device), lr)
    d = ce.shape[-1]
    sim = cosine_matrix(ce.view(b, n * lc, d), re.view(b, m * lr, d), cm.view(b, -1), rm.view(b, -1), normalized=True)
    sim = sim.view(b, n, lc, m, lr).transpose(2, 3).reshape(b * n * m, lc, lr)
    cm2 = cm.unsqueeze(2).expand(b, n, m, lc).reshape(-1, lc)
    rm2 = rm.unsqueeze(1).expand(b, n, m, lr).reshape(-1, lr)
    matches = greedy_match(sim, cm2, rm2)
    cw2 = cw.unsqueeze(2).expand(b, n, m, lc).reshape(-1, lc)
    rw2 = rw.unsqueeze(1).expand(b, n, m, lr).reshape(-1, lr)
    p, r, f = precision_recall_f(matches.cand_sim, matches.ref_sim, cw2, rw2)
    return torch.stack((p, r, f)).view(3, b, n, m).float().cpu()


def _gather(packed: PackedEmbeddings, weight: Tensor, index: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Padded embeddings ``[B, N, L, d]``, mask ``[B, N, L]`` and weights ``[B, N, L]`` of texts ``index`` ``[B, N]``.

    ``index`` -1 marks a missing text (all padding).
    """
    valid = index >= 0
    safe = index.clamp_min(0)
    lengths = torch.where(valid, packed.lengths[safe], 0)
    steps = torch.arange(width, device=index.device)
    mask = steps < lengths.unsqueeze(-1)
    rows = (packed.offsets[safe].unsqueeze(-1) + steps).masked_fill(~mask, 0)
    return packed.flat[rows], mask, weight[rows].masked_fill(~mask, 0.0)


# --- validation -----------------------------------------------------------------------------------
def _check_options(measure: str, expectation: str, temperature: float, weight: float) -> None:
    if measure not in _MEASURES:
        raise ValueError(f"measure must be 'f', 'p' or 'r', got {measure!r}")
    if expectation not in ("uniform", "model"):
        raise ValueError(f"expectation must be 'uniform' or 'model', got {expectation!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must lie in [0, 1], got {weight}")


def _check_lists(lists: object, what: str) -> list[list[str]]:
    """A list of non-empty lists of str; errors name the offending index."""
    if isinstance(lists, str) or not isinstance(lists, Sequence):
        raise TypeError(f"{what} must be a list of lists of str (one list per source), got {type(lists).__name__}")
    out = []
    for s, group in enumerate(lists):
        if isinstance(group, str):
            raise TypeError(f"{what}[{s}] must be a list of str, got a str (wrap one candidate as [text])")
        texts = check_texts(group, f"{what}[{s}]")
        if not texts:
            raise ValueError(f"{what}[{s}] is an empty list: each source needs at least one text")
        out.append(texts)
    return out


def _check_scores(scores: object, sizes: list[int], what: str) -> list[Tensor]:
    """Per-source float64 score tensors ``[n_s]`` matching ``sizes``; NaN or +inf is an error."""
    if isinstance(scores, Tensor):
        if scores.dim() != 2 or len(set(sizes)) > 1:
            raise ValueError(f"{what} as a tensor must be [sources, n] with the same n for every source")
        scores = list(scores)
    if isinstance(scores, str) or not isinstance(scores, Sequence):
        raise TypeError(f"{what} must be a list of lists of float (one per candidate), got {type(scores).__name__}")
    if len(scores) != len(sizes):
        raise ValueError(f"got {len(sizes)} sources but {len(scores)} {what} lists: the lengths must match")
    out = []
    for s, (row, n) in enumerate(zip(scores, sizes)):
        try:
            t = torch.as_tensor(row if isinstance(row, Tensor) else list(row), dtype=torch.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}[{s}] must be a list of float") from exc
        if t.numel() != n:
            raise ValueError(f"{what}[{s}] has {t.numel()} scores but source {s} has {n} texts")
        if torch.isnan(t).any() or (t == math.inf).any():
            raise ValueError(f"{what}[{s}] holds NaN or +inf")
        out.append(t.cpu())
    return out
