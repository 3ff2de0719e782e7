"""chrF and BLEU as MBR utilities: sacrebleu's sentence scores, computed for all pairs at once.

Each distinct text's n-grams are extracted once with sacrebleu's own functions. The clipped match
count of a pair, ``sum_g min(count_h(g), count_r(g))``, is a product of sparse 0/1 matrices over
"rank keys" ``(g, t)`` (a text holds key ``(g, t)`` when it has at least ``t`` copies of ``g``), one per
n-gram order; the scores follow sacrebleu's formulas, vectorised over the pairs. Tests check them
against ``sacrebleu.sentence_chrf`` / ``sentence_bleu``.

Reference aggregation (Vamvas & Sennrich 2024; DeNero et al. 2009 for BLEU): the pseudo-references'
n-gram counts are averaged with the expectation weights, ``c̄(g) = sum_j w_j count_j(g)``, and each
hypothesis is scored once against these fractional counts (matches ``sum_g min(count_h(g), c̄(g))``,
reference totals and BLEU's reference length averaged the same way).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from .utility import Session, Utility

__all__ = ["BLEU", "ChrF", "ChrFConfig", "BLEUConfig"]

_SACREBLEU_HINT = "the chrF and BLEU utilities need sacrebleu: pip install 'bertscore-loss[quality]' (or sacrebleu)"


def _sacrebleu() -> Any:
    try:
        import sacrebleu
    except ImportError as exc:  # pragma: no cover - the test extra has it
        raise ImportError(_SACREBLEU_HINT) from exc
    return sacrebleu


@dataclass(frozen=True)
class ChrFConfig:
    """sacrebleu ``CHRF`` settings: chrF is the default, ``word_order=2`` is chrF++."""

    char_order: int = 6
    word_order: int = 0
    beta: int = 2
    lowercase: bool = False
    whitespace: bool = False
    eps_smoothing: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> ChrFConfig:
        for name in ("char_order", "word_order", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "char_order" else 0):
                raise ValueError(f"chrF {name} must be an int >= {1 if name == 'char_order' else 0}, got {v!r}")
        return self


@dataclass(frozen=True)
class BLEUConfig:
    """sacrebleu sentence-BLEU settings (the defaults of ``sacrebleu.sentence_bleu``)."""

    tokenize: str = "13a"
    lowercase: bool = False
    smooth_method: Literal["exp", "floor", "add-k", "none"] = "exp"
    smooth_value: float | None = None
    effective_order: bool = True
    max_ngram_order: int = 4

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> BLEUConfig:
        if self.smooth_method not in ("exp", "floor", "add-k", "none"):
            raise ValueError(
                f"BLEU smooth_method must be 'exp', 'floor', 'add-k' or 'none', got {self.smooth_method!r}"
            )
        n = self.max_ngram_order
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"BLEU max_ngram_order must be a positive int, got {n!r}")
        v = self.smooth_value
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0):
            raise ValueError(f"BLEU smooth_value must be a finite number >= 0 or None, got {v!r}")
        return self


# --- sparse n-gram counts -----------------------------------------------------------------------------
class NGramCounts:
    """N-gram counts of a list of texts: per order a sparse 0/1 matrix ``[T, K]`` over rank keys.

    ``features[i][o]``: the ``Counter`` of text ``i``'s n-grams of order ``o``; ``totals`` ``[O, T]``
    (float64): the number of n-grams of each order per text.
    """

    def __init__(self, features: Sequence[Sequence[Counter]], orders: int) -> None:
        self.size = len(features)
        self.matrices: list[Tensor] = []
        self.key_gram: list[Tensor] = []
        self.key_rank: list[Tensor] = []
        self.grams: list[int] = []
        totals = torch.zeros((orders, self.size), dtype=torch.float64)
        for o in range(orders):
            gram_id: dict[Any, int] = {}
            key_id: dict[tuple[int, int], int] = {}
            rows: list[int] = []
            cols: list[int] = []
            for i, feats in enumerate(features):
                counter = feats[o]
                total = 0
                for g, c in counter.items():
                    gid = gram_id.setdefault(g, len(gram_id))
                    total += c
                    for t in range(c):
                        rows.append(i)
                        cols.append(key_id.setdefault((gid, t), len(key_id)))
                totals[o, i] = total
            keys = torch.tensor(list(key_id), dtype=torch.long).view(-1, 2)
            self.key_gram.append(keys[:, 0])
            self.key_rank.append(keys[:, 1].double())
            self.grams.append(len(gram_id))
            index = torch.tensor([rows, cols], dtype=torch.long).view(2, -1)
            values = torch.ones(index.shape[1], dtype=torch.float32)
            self.matrices.append(
                torch.sparse_coo_tensor(index, values, (self.size, len(key_id)), check_invariants=False).coalesce()
            )
        self.totals = totals

    def matches(self, rows: Tensor, cols: Tensor) -> Tensor:
        """Clipped matches ``[O, len(rows), len(cols)]`` (float64) of texts ``rows`` against texts ``cols``."""
        out = torch.zeros((len(self.matrices), len(rows), len(cols)), dtype=torch.float64)
        if not len(rows) or not len(cols):
            return out
        for o, mat in enumerate(self.matrices):
            if mat.shape[1] == 0:
                continue
            h = torch.index_select(mat, 0, rows)
            r = torch.index_select(mat, 0, cols).to_dense()  # [m, K]: counts stay exact in float32 (< 2**24)
            out[o] = torch.sparse.mm(h, r.t().contiguous()).double()
        return out

    def aggregate_matches(self, rows: Tensor, cols: Tensor, weights: Tensor) -> Tensor:
        """``[O, len(rows)]``: ``sum_g min(count_h(g), c̄(g))`` with ``c̄(g) = sum_j weights[j] count_{cols[j]}(g)``.

        For an integer ``a`` and a real ``x >= 0``, ``min(a, x) = sum_{t=1..a} clamp(x - (t - 1), 0, 1)``: one
        value per rank key, a sparse matrix-vector product per order.
        """
        out = torch.zeros((len(self.matrices), len(rows)), dtype=torch.float64)
        w = weights.double().view(-1, 1)
        for o, mat in enumerate(self.matrices):
            if mat.shape[1] == 0 or not len(rows):
                continue
            r = torch.index_select(mat, 0, cols).double()  # [m, K]
            per_key = torch.sparse.mm(r.t(), w).squeeze(1)  # [K]: sum_j w_j [count_j(g) >= t]
            mean_count = torch.zeros(self.grams[o], dtype=torch.float64).index_add_(0, self.key_gram[o], per_key)
            value = (mean_count[self.key_gram[o]] - self.key_rank[o]).clamp(0.0, 1.0)  # [K]
            h = torch.index_select(mat, 0, rows).double()
            out[o] = torch.sparse.mm(h, value.view(-1, 1)).squeeze(1)
        return out


# --- scores from statistics (sacrebleu's formulas, vectorised) -----------------------------------------
def chrf_from_stats(match: Tensor, hyp_total: Tensor, ref_total: Tensor, config: ChrFConfig) -> Tensor:
    """chrF ``[...]`` (0-100, float64) from per-order statistics ``[O, ...]`` (broadcast), as sacrebleu's
    ``CHRF._compute_f_score``: per-order precision and recall averaged over the effective orders."""
    eps = 1e-16
    factor = float(config.beta**2)
    match, hyp_total, ref_total = torch.broadcast_tensors(match, hyp_total, ref_total)
    n_hyp = torch.where(ref_total > 0, hyp_total, torch.zeros_like(hyp_total))  # no hits without reference n-grams
    prec = torch.where(n_hyp > 0, match / n_hyp.clamp_min(1e-300), eps)
    rec = torch.where(ref_total > 0, match / ref_total.clamp_min(1e-300), eps)
    orders = match.shape[0]
    if config.eps_smoothing:
        denom = factor * prec + rec
        f = torch.where(denom > 0, (1 + factor) * prec * rec / torch.where(denom > 0, denom, 1.0), eps)
        return 100 * f.sum(0) / orders
    valid = (n_hyp > 0) & (ref_total > 0)
    count = valid.sum(0)
    avg_p = torch.where(valid, prec, 0.0).sum(0) / count.clamp_min(1)
    avg_r = torch.where(valid, rec, 0.0).sum(0) / count.clamp_min(1)
    ok = (avg_p + avg_r) > 0
    denom = torch.where(ok, factor * avg_p + avg_r, 1.0)
    return torch.where(ok, 100 * ((1 + factor) * avg_p * avg_r) / denom, 0.0)


def bleu_from_stats(
    correct: Tensor, total: Tensor, sys_len: Tensor, ref_len: Tensor, config: BLEUConfig, defaults: dict
) -> Tensor:
    """Sentence BLEU ``[...]`` (0-100, float64) from statistics ``[N, ...]`` (broadcast), as sacrebleu's
    ``BLEU.compute_bleu`` (smoothing ``exp``/``floor``/``add-k``/``none``, effective order)."""
    correct, total = torch.broadcast_tensors(correct.double(), total.double())
    sys_len, ref_len = torch.broadcast_tensors(sys_len.double(), ref_len.double())
    orders = correct.shape[0]
    value = defaults[config.smooth_method] if config.smooth_value is None else config.smooth_value
    bp = torch.where(
        sys_len < ref_len,
        torch.where(sys_len > 0, torch.exp(1 - ref_len / sys_len.clamp_min(1e-300)), 0.0),
        1.0,
    )
    any_correct = (correct > 0).any(0)
    if config.smooth_method == "add-k":
        correct, total = correct.clone(), total.clone()
        correct[1:] += value
        total[1:] += value
    valid = torch.cumprod((total > 0).long(), dim=0).bool()  # sacrebleu stops at the first order without n-grams
    zero = (correct == 0) & valid
    safe_total = total.clamp_min(1e-300)
    if config.smooth_method == "exp":
        smoothed = 100.0 / (torch.pow(2.0, torch.cumsum(zero.double(), 0)) * safe_total)
    elif config.smooth_method == "floor":
        smoothed = 100.0 * value / safe_total
    else:
        smoothed = torch.zeros_like(total)
    prec = torch.where(valid, torch.where(correct > 0, 100.0 * correct / safe_total, smoothed), 0.0)
    logp = torch.where(prec > 0, torch.log(prec.clamp_min(1e-300)), -9999999999.0)
    if config.effective_order:
        eff = valid.sum(0).clamp_min(1)
    else:
        eff = torch.full_like(valid[0], orders, dtype=torch.long)
    in_eff = torch.arange(orders).view(-1, *([1] * (correct.dim() - 1))) < eff
    score = bp * torch.exp(torch.where(in_eff, logp, 0.0).sum(0) / eff)
    return torch.where(any_correct, score, 0.0)


# --- sessions -------------------------------------------------------------------------------------------
class _NGramSession(Session):
    """Per source: the n-gram counts of the union of its hypotheses and pseudo-references (built on first use)."""

    supports_aggregation = True

    def __init__(
        self,
        hypotheses: list[list[str]],
        references: list[list[str]],
        features: Callable[[str], list[Counter]],
        orders: int,
    ) -> None:
        super().__init__(hypotheses, references)
        self.features, self.orders = features, orders
        self._cache: dict[int, tuple[NGramCounts, Tensor, Tensor]] = {}

    def counts(self, s: int) -> tuple[NGramCounts, Tensor, Tensor]:
        """The source's counts and the positions ``[n_s]``, ``[m_s]`` of its hypotheses and references in them."""
        if s not in self._cache:
            index: dict[str, int] = {}
            hyp = [index.setdefault(t, len(index)) for t in self.hypotheses[s]]
            ref = [index.setdefault(t, len(index)) for t in self.references[s]]
            counts = NGramCounts([self.features(t) for t in index], self.orders)
            self._cache[s] = (counts, torch.tensor(hyp, dtype=torch.long), torch.tensor(ref, dtype=torch.long))
        return self._cache[s]


class _ChrFSession(_NGramSession):
    def __init__(self, hypotheses: list[list[str]], references: list[list[str]], utility: ChrF) -> None:
        super().__init__(
            hypotheses, references, utility.features, utility.config.char_order + utility.config.word_order
        )
        self.config = utility.config

    def blocks(self, sources: Sequence[int], rows: Sequence[Tensor], cols: Sequence[Tensor]) -> list[Tensor]:
        out = []
        for s, r, c in zip(sources, rows, cols):
            counts, hyp, ref = self.counts(s)
            h, g = hyp[r], ref[c]
            match = counts.matches(h, g)
            out.append(chrf_from_stats(match, counts.totals[:, h, None], counts.totals[:, None, g], self.config))
        return out

    def aggregate(self, sources: Sequence[int], rows: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
        out = []
        for s, r, w in zip(sources, rows, weights):
            counts, hyp, ref = self.counts(s)
            h = hyp[r]
            match = counts.aggregate_matches(h, ref, w)  # [O, n]
            ref_total = (counts.totals[:, ref] * w.double()).sum(1, keepdim=True)  # [O, 1]
            out.append(chrf_from_stats(match, counts.totals[:, h], ref_total, self.config))
        return out


class _BLEUSession(_NGramSession):
    def __init__(self, hypotheses: list[list[str]], references: list[list[str]], utility: BLEU) -> None:
        super().__init__(hypotheses, references, utility.features, utility.config.max_ngram_order)
        self.config, self.defaults = utility.config, utility.defaults

    # a text's length in tokens is its number of unigrams, totals[0]
    def blocks(self, sources: Sequence[int], rows: Sequence[Tensor], cols: Sequence[Tensor]) -> list[Tensor]:
        out = []
        for s, r, c in zip(sources, rows, cols):
            counts, hyp, ref = self.counts(s)
            h, g = hyp[r], ref[c]
            match = counts.matches(h, g)
            tot = counts.totals
            out.append(
                bleu_from_stats(match, tot[:, h, None], tot[0, h, None], tot[0, None, g], self.config, self.defaults)
            )
        return out

    def aggregate(self, sources: Sequence[int], rows: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
        out = []
        for s, r, w in zip(sources, rows, weights):
            counts, hyp, ref = self.counts(s)
            h = hyp[r]
            match = counts.aggregate_matches(h, ref, w)
            tot = counts.totals
            ref_len = (tot[0, ref] * w.double()).sum()
            out.append(bleu_from_stats(match, tot[:, h], tot[0, h], ref_len, self.config, self.defaults))
        return out


# --- utilities --------------------------------------------------------------------------------------------
class ChrF(Utility):
    """sacrebleu's sentence chrF (chrF++ with ``word_order=2``), 0-100; supports reference aggregation.

    >>> ChrF()(["a cat sat"], ["the cat sat", "a dog"])        # doctest: +SKIP
    tensor([[56.4..., 20.8...]], dtype=torch.float64)
    """

    supports_aggregation = True

    def __init__(self, config: ChrFConfig | None = None, **fields: Any) -> None:
        sb = _sacrebleu()
        self.config = ChrFConfig(**{**asdict(config or ChrFConfig()), **fields}).validate()
        c = self.config
        self._chrf = sb.CHRF(
            char_order=c.char_order,
            word_order=c.word_order,
            beta=c.beta,
            lowercase=c.lowercase,
            whitespace=c.whitespace,
            eps_smoothing=c.eps_smoothing,
        )
        from sacrebleu.metrics.helpers import extract_all_char_ngrams, extract_word_ngrams

        self._char, self._word = extract_all_char_ngrams, extract_word_ngrams
        self.name = "chrf" if c.word_order == 0 else f"chrf{'+' * c.word_order}"

    def features(self, text: str) -> list[Counter]:
        """The text's n-gram counters, as sacrebleu extracts them (character orders, then word orders)."""
        c = self.config
        text = text.lower() if c.lowercase else text
        feats = self._char(text, c.char_order, c.whitespace)
        if c.word_order:
            words = self._chrf._remove_punctuation(text)
            feats += [self._word(words, k) for k in range(1, c.word_order + 1)]
        return feats

    def session(
        self, hypotheses: list[list[str]], references: list[list[str]], reference_counts: Sequence[Tensor] | None = None
    ) -> Session:
        return _ChrFSession(hypotheses, references, self)

    def signature(self) -> str:
        c = self.config
        return (
            f"{self.name}|sacrebleu:{_sacrebleu().__version__}|nc:{c.char_order}|nw:{c.word_order}|beta:{c.beta}"
            f"|case:{'lc' if c.lowercase else 'mixed'}|space:{'yes' if c.whitespace else 'no'}"
            f"|eps:{'yes' if c.eps_smoothing else 'no'}"
        )


class BLEU(Utility):
    """sacrebleu's sentence BLEU (``sentence_bleu`` defaults: 13a, exp smoothing, effective order), 0-100;
    supports reference aggregation (expected n-gram counts and reference length, DeNero et al. 2009)."""

    supports_aggregation = True
    name = "bleu"

    def __init__(self, config: BLEUConfig | None = None, **fields: Any) -> None:
        sb = _sacrebleu()
        self.config = BLEUConfig(**{**asdict(config or BLEUConfig()), **fields}).validate()
        c = self.config
        self._bleu = sb.BLEU(tokenize=c.tokenize, lowercase=c.lowercase, max_ngram_order=c.max_ngram_order)
        self.defaults = dict(sb.BLEU.SMOOTH_DEFAULTS)
        from sacrebleu.metrics.helpers import extract_all_word_ngrams

        self._ngrams = extract_all_word_ngrams

    def features(self, text: str) -> list[Counter]:
        """Word n-gram counters of orders 1..N after sacrebleu's tokenisation (the unigrams count the length)."""
        c = self.config
        line = self._bleu.tokenizer((text.lower() if c.lowercase else text).rstrip())
        grams, _ = self._ngrams(line, 1, c.max_ngram_order)
        feats: list[Counter] = [Counter() for _ in range(c.max_ngram_order)]
        for g, k in grams.items():
            feats[len(g) - 1][g] = k
        return feats

    def session(
        self, hypotheses: list[list[str]], references: list[list[str]], reference_counts: Sequence[Tensor] | None = None
    ) -> Session:
        return _BLEUSession(hypotheses, references, self)

    def signature(self) -> str:
        c = self.config
        smooth = c.smooth_method if c.smooth_value is None else f"{c.smooth_method}({c.smooth_value})"
        return (
            f"bleu|sacrebleu:{_sacrebleu().__version__}|tok:{c.tokenize}|case:{'lc' if c.lowercase else 'mixed'}"
            f"|smooth:{smooth}|eff:{'yes' if c.effective_order else 'no'}|order:{c.max_ngram_order}"
        )
