"""N-best reranking with BERTScore (or any utility of the registry): reference-based and minimum-Bayes-risk
(MBR), in batch.

Shapes: ``S`` sources, ``n`` candidates of one source, ``m`` references (or pseudo-references) of one
source, ``L`` tokens of one text, ``d`` hidden size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from bertscore_loss import BERTScorer, ScorerConfig, Signature
from bertscore_loss.config import MEASURES, Measure, check_measure
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.scorer import reduce_references, scorer_from
from bertscore_loss.validation import check_lists, check_references

from .bertscore_utility import BERTScoreUtility
from .mbr import Aggregate, Exact, Method, get_method, mbr
from .registry import UtilityLike, get_utility
from .utility import Utility

__all__ = ["Expectation", "Measure", "NBestReranker", "RerankResult", "expected_utility"]

logger = logging.getLogger(__name__)

Expectation = Literal["uniform", "model"]
_MEASURES = {name: k for k, name in enumerate(MEASURES)}


@dataclass
class RerankResult:
    """The reranked candidate list of one source.

    ``indices``: the candidates' input indices best-first (ties: lowest index first); ``candidates``,
    ``scores`` (final score), ``bertscore`` (the utility part: BERTScore F/P/R — or the reranker's
    utility — against the reference(s), or the MBR method's expected utility) and ``model_scores`` are
    aligned with ``indices``. ``utility``: the ``[n, m]`` utility matrix (for BERTScore the chosen
    measure, rescaled if the scorer rescales) with rows and columns in input order — against each
    reference, or U[i, j] against pseudo-reference j in exact MBR — when asked for. ``evaluations``:
    utility evaluations spent on this source in MBR.
    """

    best_index: int
    best: str
    indices: list[int]
    candidates: list[str]
    scores: list[float]
    bertscore: list[float]
    model_scores: list[float] | None = None
    utility: Tensor | None = None
    evaluations: int | None = None


class NBestReranker:
    """Rerank candidate lists by BERTScore (or another utility) against references or by MBR, many sources
    per call.

    Configure it like :class:`bertscore_loss.BERTScorer` (a ``ScorerConfig`` and/or its fields as
    keywords: ``model``, ``layer``, ``idf``, ``rescale``, ``baseline``, ``device``, ``dtype``,
    ``max_elements`` …), or pass an existing ``scorer`` (or ``encoder``) to share its model.
    ``utility``: None = BERTScore with that scorer; or a name of :data:`rerank.UTILITIES` (``"chrf"``,
    ``"bleu"`` …; ``"bertscore"`` uses the reranker's scorer), a :class:`rerank.Utility` or a function
    ``fn(hypotheses, references) -> [n, m]``. A reranker with another utility and no scorer settings
    loads no BERTScore model. ``method``: the MBR method (:func:`rerank.mbr`), ``"exact"`` by default.

    Defaults of :meth:`rerank`, overridable per call: ``measure`` (``"f1"``, ``"precision"`` or ``"recall"``),
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
        measure: Measure = "f1",
        include_self: bool = False,
        expectation: Expectation = "uniform",
        temperature: float = 1.0,
        weight: float = 0.0,
        utility: UtilityLike | None = None,
        method: Method | str = "exact",
        **fields: Any,
    ) -> None:
        settings = config is not None or bool(fields) or encoder is not None or idf_corpus is not None
        bertscore = utility is None or (isinstance(utility, str) and utility.strip().lower() == "bertscore")
        self.scorer: BERTScorer | None = None
        if scorer is not None or bertscore or settings:  # scorer= or its settings, both an error (scorer_from)
            self.scorer = scorer_from(
                scorer, config, idf_corpus=idf_corpus, encoder=encoder, owner="NBestReranker", **fields
            )
        self._utility: Utility | None = None if bertscore else get_utility(utility)  # type: ignore[arg-type]
        if isinstance(self._utility, BERTScoreUtility) and (settings or scorer is not None):
            raise ValueError("NBestReranker: a BERTScoreUtility brings its own scorer: pass no scorer or settings")
        self.method: Method = get_method(method)
        _check_options(measure, expectation, temperature, weight)
        self.measure: Measure = measure
        self.include_self = bool(include_self)
        self.expectation: Expectation = expectation
        self.temperature = float(temperature)
        self.weight = float(weight)

    @property
    def config(self) -> ScorerConfig:
        if self.scorer is None:
            raise AttributeError(f"this reranker uses the {self.utility().name!r} utility and has no BERTScore scorer")
        return self.scorer.config

    def utility(self, measure: Measure | None = None) -> Utility:
        """The utility of this reranker (BERTScore: of ``measure``, default the reranker's)."""
        if self._utility is not None:
            return self._utility
        assert self.scorer is not None
        return BERTScoreUtility(self.scorer, measure or self.measure)

    def signature(self) -> Signature | str:
        """Everything that determines the utility part: the scorer's signature, or the utility's."""
        if self._utility is None:
            assert self.scorer is not None
            return self.scorer.signature()
        return self._utility.signature()

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
        method: Method | str | None = None,
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

        ``method``: the MBR method for this call (default the reranker's; see :func:`rerank.mbr`); the
        approximate ones rank by their own estimates (``weight`` > 0 needs ``"exact"`` or ``"aggregate"``,
        ``return_utility`` needs ``"exact"``). ``measure`` applies to BERTScore only.
        """
        weight = self.weight if weight is None else float(weight)
        measure = self.measure if measure is None else measure
        include_self = self.include_self if include_self is None else bool(include_self)
        expectation = self.expectation if expectation is None else expectation
        temperature = self.temperature if temperature is None else float(temperature)
        _check_options(measure, expectation, temperature, weight)
        meth = self.method if method is None else get_method(method)

        cands = _check_lists(candidates, "candidates")
        sizes = [len(c) for c in cands]
        mscores = None if model_scores is None else _check_scores(model_scores, sizes, "model_scores")
        if weight > 0 and mscores is None:
            raise ValueError(f"weight={weight} interpolates with model scores: pass model_scores=")
        mbr_mode = references is None
        if not mbr_mode and pseudo_references is not None:
            raise ValueError("pass references= (reference-based) or pseudo_references= (MBR), not both")
        if mbr_mode:
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

        if not cands:
            return []
        utility = self.utility(measure)
        evaluations: list[int | None] = [None] * len(cands)
        if mbr_mode:
            if weight > 0 and mscores is not None and not isinstance(meth, (Exact, Aggregate)):
                raise ValueError(
                    f"weight > 0 interpolates every candidate's expected utility: use method='exact' or 'aggregate', "
                    f"not {meth.name!r}"
                )
            use_weights = expectation == "model"
            found = mbr(
                cands,
                groups if separate else None,
                utility=utility,
                method=meth,
                log_weights=gscores if use_weights else None,
                temperature=temperature,
                include_self=include_self,
                return_utility=return_utility,
            )
            bert = [r.expected for r in found]
            utils = [r.utility for r in found]
            orders: list[list[int] | None] = [r.order for r in found]
            evaluations = [r.evaluations for r in found]
        elif self._utility is None:
            # IDF (when on and not fixed) over the references of the call, each group's once
            assert self.scorer is not None
            blocks = self.scorer.score_groups(cands, groups, reduce=False)
            k = _MEASURES[measure]
            utils = [b[k] for b in blocks]
            sizes_ref = [b.shape[2] for b in blocks for _ in range(b.shape[1])]
            flat = torch.cat([b.reshape(3, -1) for b in blocks], dim=1)
            picked = reduce_references(flat[0], flat[1], flat[2], sizes_ref, self.config.multi_ref)[k]
            bert = list(torch.split(picked.double(), sizes))
            orders = [None] * len(cands)
        else:  # another utility against the references: the best reference per candidate
            mats = utility.session(cands, groups).full(list(range(len(cands))))
            utils = [u.float() for u in mats]
            bert = [u.max(1).values for u in mats]
            orders = [None] * len(cands)

        results = []
        for s, (c, b) in enumerate(zip(cands, bert)):
            ms = None if mscores is None else mscores[s]
            interpolate = ms is not None and weight > 0
            final = (1.0 - weight) * b + weight * ms if interpolate else b  # type: ignore[operator]
            given = orders[s]
            if given is not None and not interpolate:
                order = given
            else:
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
                    utility=_as_float(utils[s]) if return_utility else None,
                    evaluations=evaluations[s],
                )
            )
        return results


def _as_float(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.float()


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


# --- validation -----------------------------------------------------------------------------------
def _check_options(measure: str, expectation: str, temperature: float, weight: float) -> None:
    check_measure(measure)
    if expectation not in ("uniform", "model"):
        raise ValueError(f"expectation must be 'uniform' or 'model', got {expectation!r}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"weight must lie in [0, 1], got {weight}")


def _check_lists(lists: object, what: str) -> list[list[str]]:
    """A list of non-empty lists of str; errors name the offending index."""
    return check_lists(lists, what)


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
