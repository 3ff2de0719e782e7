"""Minimum-Bayes-risk decoding over many sources with one call: :func:`mbr`, its methods and their agreement.

Methods (typed configs, also by name):

* :class:`Exact` (``"exact"``): every (hypothesis, pseudo-reference) utility; sources are grouped up to
  ``max_pairs`` pairs per utility call, so memory is bounded.
* :class:`Aggregate` (``"aggregate"``): reference aggregation (Vamvas & Sennrich 2024): each hypothesis
  is scored once against the weighted aggregate of the pseudo-references (the utility defines it:
  BERTScore pools token embeddings, chrF and BLEU average n-gram counts).
* :class:`AggregateExact` (``"aggregate-exact"``): aggregation ranks the hypotheses, exact MBR picks
  among the ``top_k`` best.
* :class:`Prune` (``"prune"``): confidence-based pruning (Cheng & Vlachos 2023): utilities against a
  growing, randomly ordered subset of pseudo-references (``schedule``); after each step hypotheses
  whose bootstrap win rate against the current best is at most ``1 - alpha`` are dropped.

Every method works on the distinct texts of each list: a repeated hypothesis or pseudo-reference is
scored once (a repeated pseudo-reference counts with its multiplicity, or its summed weight).

Shapes: ``n`` hypotheses and ``m`` pseudo-references of one source (input order).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor
from tqdm.auto import tqdm

from bertscore_loss.validation import check_lists

from .registry import UtilityLike, get_utility
from .utility import Session

__all__ = [
    "METHODS",
    "Aggregate",
    "AggregateExact",
    "Agreement",
    "Exact",
    "MBRResult",
    "Method",
    "Prune",
    "agreement",
    "gain_share",
    "get_method",
    "mbr",
]

logger = logging.getLogger(__name__)


def _positive_int(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Exact:
    """Exact MBR. Sources are grouped so that one utility call holds at most ``max_pairs`` distinct
    (hypothesis, pseudo-reference) pairs and ``max_texts`` distinct texts (bounds memory)."""

    max_pairs: int = 1 << 22
    max_texts: int = 8192
    name: ClassVar[str] = "exact"

    def __post_init__(self) -> None:
        _positive_int(self.max_pairs, "Exact.max_pairs")
        _positive_int(self.max_texts, "Exact.max_texts")


@dataclass(frozen=True)
class Aggregate:
    """Reference aggregation. ``max_texts``: distinct texts per chunk of sources (bounds memory)."""

    max_texts: int = 8192
    name: ClassVar[str] = "aggregate"

    def __post_init__(self) -> None:
        _positive_int(self.max_texts, "Aggregate.max_texts")


@dataclass(frozen=True)
class AggregateExact:
    """Aggregation ranks; exact MBR among the ``top_k`` best distinct hypotheses."""

    top_k: int = 20
    max_texts: int = 8192
    name: ClassVar[str] = "aggregate-exact"

    def __post_init__(self) -> None:
        _positive_int(self.top_k, "AggregateExact.top_k")
        _positive_int(self.max_texts, "AggregateExact.max_texts")


@dataclass(frozen=True)
class Prune:
    """Confidence-based pruning (Cheng & Vlachos 2023).

    ``schedule``: numbers of pseudo-references after each step (None: 8, 16, 32, ... doubling); the last
    step always uses all of them. ``alpha``: a hypothesis stays while its bootstrap win rate against the
    current best exceeds ``1 - alpha``. ``bootstraps``: resamples per step; ``seed``: of the column order
    and the resampling.
    """

    alpha: float = 0.99
    schedule: tuple[int, ...] | None = None
    bootstraps: int = 500
    seed: int = 0
    max_texts: int = 8192
    name: ClassVar[str] = "prune"

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"Prune.alpha must lie in (0, 1], got {self.alpha!r}")
        _positive_int(self.bootstraps, "Prune.bootstraps")
        _positive_int(self.max_texts, "Prune.max_texts")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"Prune.seed must be an int, got {self.seed!r}")
        if self.schedule is not None:
            if not self.schedule:
                raise ValueError("Prune.schedule must hold at least one size (or be None)")
            for r in self.schedule:
                _positive_int(r, "each Prune.schedule size")
            if list(self.schedule) != sorted(set(self.schedule)):
                raise ValueError(f"Prune.schedule must be strictly increasing, got {list(self.schedule)}")

    def sizes(self, m: int) -> list[int]:
        """The numbers of pseudo-references after each step for ``m`` of them (the last is ``m``)."""
        if self.schedule is None:
            sizes, r = [], 8
            while r < m:
                sizes.append(r)
                r *= 2
        else:
            sizes = [r for r in self.schedule if r < m]
        return [*sizes, m]


Method = Exact | Aggregate | AggregateExact | Prune
METHODS: dict[str, type] = {"exact": Exact, "aggregate": Aggregate, "aggregate-exact": AggregateExact, "prune": Prune}


def get_method(spec: Method | str = "exact", **options: Any) -> Method:
    """A method config from a name (``"exact"``, ``"aggregate"``, ``"aggregate-exact"``, ``"prune"``) and
    its options, or a config as is."""
    if isinstance(spec, (Exact, Aggregate, AggregateExact, Prune)):
        if options:
            raise ValueError(f"options {sorted(options)} only apply to a method given by name")
        return spec
    if isinstance(spec, str) and spec.strip().lower() in METHODS:
        return METHODS[spec.strip().lower()](**options)
    raise ValueError(f"unknown MBR method {spec!r}: choose one of {sorted(METHODS)} or pass a method config")


@dataclass
class MBRResult:
    """MBR over one source's hypotheses.

    ``order``: hypothesis indices best-first (the chosen one first; ties: lowest index first);
    ``expected`` ``[n]`` (float64, input order): the method's estimate of each hypothesis' expected
    utility (exact: the expectation; aggregate: against the aggregate; aggregate-exact: exact for the
    top-k, the aggregate estimate for the rest; prune: over the pseudo-references seen before it was
    pruned); ``evaluations``: utility evaluations spent (distinct pairs, plus one per distinct hypothesis
    scored against an aggregate); ``utility`` ``[n, m]`` (exact with ``return_utility``).
    """

    best_index: int
    best: str
    order: list[int]
    expected: Tensor
    evaluations: int
    utility: Tensor | None = None


@dataclass
class _Source:
    """The distinct texts of one source: hypothesis / pseudo-reference texts, each input's distinct index, weights."""

    hyps: list[str]
    h_inv: Tensor  # [n] → distinct hypothesis
    refs: list[str]
    r_inv: Tensor  # [m] → distinct pseudo-reference
    w: Tensor  # [m] float64, summing to 1
    w_u: Tensor  # [m_u] summed weights of the distinct pseudo-references
    counts: Tensor  # [m_u] occurrences
    self_col: Tensor | None  # [n] the distinct column of hypothesis i itself (when it must be left out)
    evaluations: int = 0
    extra: dict = field(default_factory=dict)


def _distinct(texts: list[str]) -> tuple[list[str], Tensor]:
    index: dict[str, int] = {}
    inv = [index.setdefault(t, len(index)) for t in texts]
    return list(index), torch.tensor(inv, dtype=torch.long)


def _weights(log_weights: Tensor | None, m: int, temperature: float) -> Tensor:
    """Normalised expectation weights ``[m]``: uniform, or ``softmax(log_weights / temperature)``."""
    if log_weights is None:
        return torch.full((m,), 1.0 / m, dtype=torch.float64)
    lw = log_weights.double() / temperature
    w = torch.exp(lw - lw.max()) if torch.isfinite(lw.max()) else torch.ones(m, dtype=torch.float64)
    return w / w.sum()


def mbr(
    hypotheses: Sequence[Sequence[str]],
    pseudo_references: Sequence[Sequence[str]] | None = None,
    *,
    utility: UtilityLike = "bertscore",
    method: Method | str = "exact",
    log_weights: Sequence[Sequence[float]] | Sequence[Tensor] | None = None,
    temperature: float = 1.0,
    include_self: bool = False,
    return_utility: bool = False,
    progress: bool | None = None,
) -> list[MBRResult]:
    """Choose one hypothesis per source by minimum Bayes risk; one :class:`MBRResult` per source.

    ``hypotheses``: one list of str per source; ``pseudo_references``: one list per source (e.g. samples;
    default: the hypotheses themselves). ``utility``: a name of :data:`rerank.registry.UTILITIES`, a
    :class:`Utility` or a function ``fn(hypotheses, pseudo_references) -> [n, m]``. ``method``: a config
    (:class:`Exact`, :class:`Aggregate`, :class:`AggregateExact`, :class:`Prune`) or its name.
    ``log_weights``: per pseudo-reference (e.g. model log-probabilities): the expectation weights are
    ``softmax(log_weights / temperature)``, else uniform. With the hypotheses as their own
    pseudo-references, hypothesis i leaves its own column out (``include_self=False``; a list of one uses
    U[0, 0]) in the exact computations; reference aggregation always includes it.
    ``progress``: a bar over sources (None: on a terminal, for 10**6 pairs or more).
    """
    hyps = check_lists(hypotheses, "hypotheses")
    separate = pseudo_references is not None
    refs = check_lists(pseudo_references, "pseudo_references") if separate else hyps
    if len(refs) != len(hyps):
        raise ValueError(
            f"got {len(hyps)} hypothesis lists but {len(refs)} pseudo-reference lists: the lengths must match"
        )
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    meth = get_method(method)
    util = get_utility(utility)
    if return_utility and not isinstance(meth, Exact):
        raise ValueError(f"return_utility needs method='exact' (the {meth.name} method does not compute all pairs)")
    if isinstance(meth, (Aggregate, AggregateExact)) and not util.supports_aggregation:
        raise ValueError(f"the {util.name!r} utility has no reference aggregation: use method='exact' or 'prune'")
    lws = _check_log_weights(log_weights, [len(r) for r in refs])
    sources = []
    for s, (h, r) in enumerate(zip(hyps, refs)):
        h_u, h_inv = _distinct(h)
        r_u, r_inv = (h_u, h_inv) if not separate else _distinct(r)
        w = _weights(None if lws is None else lws[s], len(r), temperature)
        w_u = torch.zeros(len(r_u), dtype=torch.float64).index_add_(0, r_inv, w)
        counts = torch.zeros(len(r_u), dtype=torch.long).index_add_(0, r_inv, torch.ones_like(r_inv))
        self_col = None if separate or include_self else r_inv
        sources.append(_Source(h_u, h_inv, r_u, r_inv, w, w_u, counts, self_col))
    if not sources:
        return []
    session = util.session([x.hyps for x in sources], [x.refs for x in sources], [x.counts for x in sources])
    pairs = sum(len(x.hyps) * len(x.refs) for x in sources)
    # progress None: a bar for 10**6 pairs or more, when stderr is a terminal (tqdm's disable=None)
    disable = (not progress) if progress is not None else (None if pairs >= 10**6 else True)
    bar = tqdm(total=len(sources), desc=f"MBR {meth.name} ({util.name})", unit="source", disable=disable, leave=False)
    try:
        if isinstance(meth, Exact):
            out = _exact(session, sources, meth, return_utility, bar)
        elif isinstance(meth, Aggregate):
            out = _aggregate(session, sources, meth, bar)
        elif isinstance(meth, AggregateExact):
            out = _aggregate_exact(session, sources, meth, bar)
        else:
            out = _prune(session, sources, meth, bar)
    finally:
        bar.close()
    results = []
    for h, x, (expected, order, matrix) in zip(hyps, sources, out):
        results.append(MBRResult(order[0], h[order[0]], order, expected, x.evaluations, matrix))
    logger.info(
        "MBR %s with %s: %d sources, %d utility evaluations (%d distinct pairs in all)",
        meth.name,
        util.name,
        len(results),
        sum(x.evaluations for x in sources),
        pairs,
    )
    return results


# --- the methods ------------------------------------------------------------------------------------------
def _chunks(sizes: Sequence[int], budget: int, sizes2: Sequence[int] = (), budget2: int = 0) -> list[list[int]]:
    """Consecutive groups of indices whose sizes sum to at most ``budget`` (and ``sizes2`` to ``budget2``,
    when given); at least one index per group."""
    groups: list[list[int]] = []
    total = total2 = 0
    for i, size in enumerate(sizes):
        size2 = sizes2[i] if sizes2 else 0
        if groups and total + size <= budget and (not sizes2 or total2 + size2 <= budget2):
            groups[-1].append(i)
            total += size
            total2 += size2
        else:
            groups.append([i])
            total, total2 = size, size2
    return groups


def _exact_expectation(x: _Source, u: Tensor, rows: Tensor | None = None) -> Tensor:
    """Exact expected utility ``[n]`` (float64) of the inputs whose distinct hypothesis is in ``rows``
    (``u`` ``[len(rows), m_u]``; default all rows); NaN for the others."""
    num_u = u @ x.w_u
    if rows is None:
        pos = x.h_inv
        have = torch.ones(len(x.h_inv), dtype=torch.bool)
    else:
        where = torch.full((len(x.hyps),), -1, dtype=torch.long)
        where[rows] = torch.arange(len(rows))
        pos = where[x.h_inv]
        have = pos >= 0
        pos = pos.clamp_min(0)
    num = num_u[pos]
    if x.self_col is None:
        value = num
    else:  # the full row minus the hypothesis' own column, renormalised; alone: U[i, i]
        diag = u[pos, x.self_col]
        num = num - x.w * diag
        den = 1.0 - x.w
        alone = den <= 1e-12
        value = torch.where(alone, diag, num / torch.where(alone, torch.ones_like(den), den))
    return torch.where(have, value, torch.full_like(value, math.nan))


def _ranked(primary: Tensor, secondary: Tensor | None = None) -> list[int]:
    """Indices best-first by ``primary`` (NaN last), then by ``secondary`` where ``primary`` is NaN;
    ties: lowest index."""
    n = len(primary)
    key1 = torch.nan_to_num(primary, nan=-math.inf)
    has = ~torch.isnan(primary)
    key2 = torch.zeros(n, dtype=torch.float64) if secondary is None else torch.nan_to_num(secondary, nan=-math.inf)
    return sorted(range(n), key=lambda i: (not bool(has[i]), -float(key1[i]) if has[i] else -float(key2[i]), i))


def _exact(session: Session, sources: list[_Source], meth: Exact, keep: bool, bar: tqdm) -> list[tuple]:
    out: list[tuple] = [()] * len(sources)
    pairs = [len(x.hyps) * len(x.refs) for x in sources]
    for chunk in _chunks(pairs, meth.max_pairs, [len(x.hyps) + len(x.refs) for x in sources], meth.max_texts):
        for s, u in zip(chunk, session.full(chunk)):
            x = sources[s]
            x.evaluations += u.numel()
            e = _exact_expectation(x, u)
            matrix = u[x.h_inv][:, x.r_inv].float() if keep else None
            out[s] = (e, _ranked(e), matrix)
        bar.update(len(chunk))
    return out


def _aggregate_all(session: Session, chunk: list[int], sources: list[_Source]) -> list[Tensor]:
    rows = [torch.arange(len(sources[s].hyps)) for s in chunk]
    values = session.aggregate(chunk, rows, [sources[s].w_u for s in chunk])
    for s in chunk:
        sources[s].evaluations += len(sources[s].hyps)
    return values


def _aggregate(session: Session, sources: list[_Source], meth: Aggregate, bar: tqdm) -> list[tuple]:
    out: list[tuple] = [()] * len(sources)
    for chunk in _chunks([len(x.hyps) + len(x.refs) for x in sources], meth.max_texts):
        for s, v in zip(chunk, _aggregate_all(session, chunk, sources)):
            e = v[sources[s].h_inv]
            out[s] = (e, _ranked(e), None)
        bar.update(len(chunk))
    return out


def _aggregate_exact(session: Session, sources: list[_Source], meth: AggregateExact, bar: tqdm) -> list[tuple]:
    out: list[tuple] = [()] * len(sources)
    for chunk in _chunks([len(x.hyps) + len(x.refs) for x in sources], meth.max_texts):
        agg = _aggregate_all(session, chunk, sources)
        tops = []
        for v in agg:
            k = min(meth.top_k, len(v))
            tops.append(torch.tensor(_ranked(v)[:k], dtype=torch.long))
        cols = [torch.arange(len(sources[s].refs)) for s in chunk]
        for s, v, top, u in zip(chunk, agg, tops, session.blocks(chunk, tops, cols)):
            x = sources[s]
            x.evaluations += u.numel()
            e = _exact_expectation(x, u, top)
            approx = v[x.h_inv]
            out[s] = (torch.where(torch.isnan(e), approx, e), _ranked(e, approx), None)
        bar.update(len(chunk))
    return out


def _prune(session: Session, sources: list[_Source], meth: Prune, bar: tqdm) -> list[tuple]:
    out: list[tuple] = [()] * len(sources)
    gen = torch.Generator().manual_seed(meth.seed)
    for chunk in _chunks([len(x.hyps) + len(x.refs) for x in sources], meth.max_texts):
        states = [_PruneState(sources[s], meth, gen) for s in chunk]
        while True:
            active = [k for k, st in enumerate(states) if not st.done]
            if not active:
                break
            rows = [states[k].alive for k in active]
            cols = [states[k].next_columns() for k in active]
            blocks = session.blocks([chunk[k] for k in active], rows, cols)
            for k, u in zip(active, blocks):
                states[k].step(u, gen)
        for s, st in zip(chunk, states):
            out[s] = st.result()
        bar.update(len(chunk))
    return out


class _PruneState:
    """Pruning of one source: computed utilities of the alive distinct hypotheses against the columns seen so far."""

    def __init__(self, x: _Source, meth: Prune, gen: torch.Generator) -> None:
        self.x, self.meth = x, meth
        n_u, m_u = len(x.hyps), len(x.refs)
        self.perm = torch.randperm(m_u, generator=gen)
        self.sizes = meth.sizes(m_u)
        self.step_no = 0
        self.alive = torch.arange(n_u)
        self.u = torch.zeros((n_u, 0), dtype=torch.float64)  # rows: alive, columns: perm[:seen]
        self.seen = 0
        self.estimate = torch.full((n_u,), math.nan, dtype=torch.float64)
        self.pruned_at = torch.full((n_u,), -1, dtype=torch.long)
        # each distinct hypothesis' weight per distinct column: the column's weight minus its own occurrence
        w_self = torch.zeros(n_u, dtype=torch.float64)
        self.own = torch.full((n_u,), -1, dtype=torch.long)
        if x.self_col is not None:
            first = torch.full((n_u,), len(x.h_inv), dtype=torch.long).scatter_reduce(
                0, x.h_inv, torch.arange(len(x.h_inv)), reduce="amin"
            )
            w_self = x.w[first]
            self.own = x.self_col[first]
        self.w_self = w_self
        self.done = False
        if n_u == 1:  # nothing to choose: one step over all pseudo-references gives its exact estimate
            self.sizes = [m_u]

    def next_columns(self) -> Tensor:
        r = self.sizes[self.step_no]
        return self.perm[self.seen : r]

    def _weights(self) -> Tensor:
        """``[alive, seen]``: the weight of each computed column for each alive hypothesis."""
        cols = self.perm[: self.seen]
        w = self.x.w_u[cols].unsqueeze(0).expand(len(self.alive), -1).clone()
        own = (cols.unsqueeze(0) == self.own[self.alive].unsqueeze(1)) & (self.own[self.alive] >= 0).unsqueeze(1)
        return w - own.double() * self.w_self[self.alive].unsqueeze(1)

    def _means(self, u: Tensor, w: Tensor, counts: Tensor | None = None) -> Tensor:
        """Weighted means ``[alive]`` (or ``[alive, B]`` with bootstrap ``counts`` ``[B, seen]``)."""
        if counts is None:
            num, den = (u * w).sum(1), w.sum(1)
        else:
            num, den = (u * w) @ counts.t(), w @ counts.t()
        plain = u.mean(1) if counts is None else (u @ counts.t()) / counts.sum(1)
        return torch.where(den > 1e-12, num / torch.where(den > 1e-12, den, torch.ones_like(den)), plain)

    def step(self, block: Tensor, gen: torch.Generator) -> None:
        self.x.evaluations += block.numel()
        self.u = torch.cat([self.u, block], dim=1)
        self.seen = self.sizes[self.step_no]
        self.step_no += 1
        w = self._weights()
        means = self._means(self.u, w)
        self.estimate[self.alive] = means
        if self.step_no >= len(self.sizes):
            self.done = True
            return
        best = int(torch.nonzero(means == means.max())[0])
        idx = torch.randint(self.seen, (self.meth.bootstraps, self.seen), generator=gen)
        counts = torch.zeros((self.meth.bootstraps, self.seen), dtype=torch.float64)
        counts.scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float64))
        boot = self._means(self.u, w, counts)  # [alive, B]
        win = (boot >= boot[best]).double().mean(1)
        keep = win > 1.0 - self.meth.alpha
        keep[best] = True
        self.pruned_at[self.alive[~keep]] = self.step_no
        self.alive, self.u = self.alive[keep], self.u[keep]
        if len(self.alive) == 1:
            self.done = True

    def result(self) -> tuple[Tensor, list[int], None]:
        x = self.x
        alive = torch.zeros(len(x.hyps), dtype=torch.bool)
        alive[self.alive] = True
        # best-first: survivors by their estimate, then the later-pruned before the earlier-pruned
        key = [(0 if alive[k] else 1, -int(self.pruned_at[k]), -float(self.estimate[k])) for k in range(len(x.hyps))]
        rank_u = torch.empty(len(x.hyps), dtype=torch.long)
        rank_u[torch.tensor(sorted(range(len(x.hyps)), key=lambda k: key[k]), dtype=torch.long)] = torch.arange(
            len(x.hyps)
        )
        e = self.estimate[x.h_inv]
        order = sorted(range(len(x.h_inv)), key=lambda i: (int(rank_u[x.h_inv[i]]), i))
        return e, order, None


def _check_log_weights(values: object, sizes: list[int]) -> list[Tensor] | None:
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise TypeError(f"log_weights must be one list of float per source, got {type(values).__name__}")
    if len(values) != len(sizes):
        raise ValueError(f"got {len(sizes)} sources but {len(values)} log_weights lists: the lengths must match")
    out = []
    for s, (row, m) in enumerate(zip(values, sizes)):
        try:
            t = torch.as_tensor(row if isinstance(row, Tensor) else list(row), dtype=torch.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"log_weights[{s}] must be a list of float") from exc
        if t.numel() != m:
            raise ValueError(f"log_weights[{s}] has {t.numel()} values but source {s} has {m} pseudo-references")
        if torch.isnan(t).any() or (t == math.inf).any():
            raise ValueError(f"log_weights[{s}] holds NaN or +inf")
        out.append(t.cpu())
    return out


# --- agreement with exact MBR -------------------------------------------------------------------------------
@dataclass
class Agreement:
    """How an approximate method's choices compare with exact MBR's on the same lists.

    ``same_choice``: share of sources where both choose the same text; ``kept_utility``: the exact
    expected utility of the approximate choice relative to the exact choice's, averaged over sources
    (1.0 = always as good); ``regret``: the mean drop in exact expected utility; ``evaluations``: the
    approximate method's utility evaluations as a share of exact MBR's.
    """

    same_choice: float
    kept_utility: float
    regret: float
    evaluations: float
    sources: int


def agreement(exact: Sequence[MBRResult], approx: Sequence[MBRResult]) -> Agreement:
    """Compare ``approx``'s choices with ``exact``'s (the results of :func:`mbr` with ``method="exact"``)."""
    if len(exact) != len(approx):
        raise ValueError(f"got {len(exact)} exact results but {len(approx)} approximate ones")
    if not exact:
        return Agreement(math.nan, math.nan, math.nan, math.nan, 0)
    same, kept, regret = [], [], []
    for e, a in zip(exact, approx):
        if len(e.expected) != len(a.expected):
            raise ValueError("the exact and approximate results are over different lists")
        top, got = float(e.expected[e.best_index]), float(e.expected[a.best_index])
        same.append(float(e.best.strip() == a.best.strip()))
        regret.append(top - got)
        kept.append(got / top if top else 1.0)
    evals = sum(a.evaluations for a in approx) / max(1, sum(e.evaluations for e in exact))
    n = len(exact)
    return Agreement(sum(same) / n, sum(kept) / n, sum(regret) / n, evals, n)


def gain_share(baseline: float, exact: float, approx: float) -> float:
    """Share of exact MBR's gain over ``baseline`` that an approximation keeps:
    ``(approx - baseline) / (exact - baseline)`` (NaN when exact MBR gains nothing)."""
    gain = exact - baseline
    return (approx - baseline) / gain if gain else math.nan
