"""The one scoring pipeline every front end calls.

"Deduplicate the stripped texts → embed each once → IDF (fixed or over this call's references) →
token weights → match (pairs or blocks) → reduce several references → rescale" lives here only:
:class:`ScoringPlan` holds one call's state; :class:`~bertscore_loss.BERTScorer`, the Lightning
metric, the reranker, the heatmap and the layer tools drive it. The math is :mod:`bertscore_loss.matching`'s.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, ParamSpec, TypeVar

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ._blocks import match_blocks
from ._loading import warn
from ._packed import PackedEmbeddings
from ._pairs import score_pairs
from .cache import EmbeddingCache
from .encoder import FrozenEncoder
from .idf import idf_table, token_weights
from .matching import rescale

__all__ = ["encode", "exact", "nan_table", "PRF", "reduce_references", "score_blocks", "Scores", "ScoringPlan"]

_P = ParamSpec("_P")
_T = TypeVar("_T")


def encode(
    encoder: FrozenEncoder,
    texts: Sequence[str],
    *,
    batch_tokens: int | None = None,
    progress: bool | None = None,
    cacheable: Sequence[bool] | None = None,
    cache: EmbeddingCache | None = None,
) -> tuple[PackedEmbeddings, list[list[int]]]:
    """Embeddings of ``texts`` (in input order) and their token ids, with one warning for truncated texts.

    ``progress``: None = a bar for 1,000 texts or more; ``cacheable``: the texts that may go through the
    embedding cache (default all); ``cache``: which one (default the encoder's, when it is on).
    """
    packed, ids, truncated = encoder.embed_texts(
        texts,
        batch_tokens=batch_tokens,
        progress=len(texts) >= 1000 if progress is None else progress,
        cacheable=cacheable,
        cache=cache,
    )
    if truncated:
        warn(
            f"{truncated} input text(s) are longer than the model's maximum of {encoder.max_length} tokens "
            "and were truncated"
        )
    return packed, ids


class PRF(NamedTuple):
    """Per-pair ``precision``, ``recall``, ``f1`` (float32 tensors, input order): what :meth:`BERTScorer.score`
    returns (``P, R, F = scorer.score(...)``)."""

    precision: Tensor
    recall: Tensor
    f1: Tensor


class Scores(NamedTuple):
    """Per-pair scores in input order: ``precision``, ``recall``, ``f1`` (float32) and ``ref_index``
    (long: index of the best reference by F). ``P, R, F, idx = scores`` unpacks all four; ``scores[:3]``
    is the ``(P, R, F)`` triple that :meth:`BERTScorer.score` returns."""

    precision: Tensor
    recall: Tensor
    f1: Tensor
    ref_index: Tensor


def reduce_references(p: Tensor, r: Tensor, f: Tensor, group_sizes: Sequence[int], mode: str = "max") -> Scores:
    """Reduce per-pair scores ``[sum(group_sizes)]`` to one triple per candidate ``[N]``.

    ``mode="max"``: max of each measure over the references (``bert-score``); ``"best_f"``: the
    triple of the reference with the highest F. ``ref_index`` is that reference (first on ties).
    """
    n = len(group_sizes)
    sizes = torch.tensor(list(group_sizes), dtype=torch.long)
    if n == 0:
        z = torch.zeros(0)
        return Scores(z, z, z, torch.zeros(0, dtype=torch.long))
    width = int(sizes.max())
    group = torch.repeat_interleave(torch.arange(n), sizes)
    start = torch.cumsum(sizes, 0) - sizes
    slot = torch.arange(group.numel()) - start[group]
    table = torch.full((3, n, width), float("-inf"), dtype=p.dtype)
    table[:, group, slot] = torch.stack((p, r, f))
    best = table[2].argmax(dim=1)
    if mode == "best_f":
        picked = table.gather(2, best.view(1, n, 1).expand(3, n, 1)).squeeze(2)
    else:
        picked = table.max(dim=2).values
    return Scores(picked[0], picked[1], picked[2], best)


def exact(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """Evaluation-mode work runs in the encoder's own dtype, never under a caller's ``torch.autocast``
    (e.g. a risk or a metric computed inside a ``bf16-mixed`` training step stays exact)."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            return method(*args, **kwargs)

    return run


class ScoringPlan:
    """One scoring call over a set of texts.

    1. :meth:`rows` maps texts (stripped) to indices of the distinct texts of the call;
    2. :meth:`embed` encodes each distinct text once (through the encoder's cache when it is on), fixes
       the IDF table (the scorer's fixed one, else over the given reference rows, each occurrence
       counted) and the token weights;
    3. :meth:`score_pairs` scores index pairs, :meth:`score_blocks` every (row, column) pair of index
       blocks (the reranker's candidates × (pseudo-)references);
    4. :meth:`reduce` / :meth:`reduce_blocks` reduce several references and rescale.

    Build one with :meth:`BERTScorer.plan`.
    """

    def __init__(
        self,
        *,
        special_ids: frozenset[int],
        vocab_size: int,
        use_idf: bool = False,
        idf: Tensor | None = None,
        baseline: Tensor | None = None,
        multi_ref: str = "max",
        max_elements: int | None = None,
        encoder: FrozenEncoder | None = None,
        batch_tokens: int | None = None,
        progress: bool | None = None,
    ) -> None:
        self.special_ids = special_ids
        self.vocab_size = vocab_size
        self.use_idf = use_idf
        self.idf = idf
        self.baseline = baseline
        self.multi_ref = multi_ref
        self.max_elements = max_elements
        self.encoder, self.batch_tokens, self.progress = encoder, batch_tokens, progress
        self.index: dict[str, int] = {}
        self.packed: PackedEmbeddings | None = None
        self.ids: list[list[int]] = []
        self.weight: Tensor | None = None

    # --- 1. texts -------------------------------------------------------------------------------
    @property
    def texts(self) -> list[str]:
        """The distinct stripped texts, in order of first appearance."""
        return list(self.index)

    def rows(self, texts: Sequence[str]) -> Tensor:
        """Index ``[N]`` (long, CPU) of each text among the distinct stripped texts; new ones are added."""
        if self.packed is not None:
            missing = [t for t in texts if t.strip() not in self.index]
            if missing:
                raise KeyError(f"text {missing[0]!r} was not embedded")
        key = self.index
        return torch.tensor([key.setdefault(t.strip(), len(key)) for t in texts], dtype=torch.long)

    # --- 2. embeddings and weights ----------------------------------------------------------------
    @exact
    def embed(
        self,
        idf_rows: Tensor | None = None,
        *,
        cacheable: Tensor | None = None,
        progress: bool | None = None,
    ) -> ScoringPlan:
        """Encode the distinct texts once and fix the weights.

        ``idf_rows``: the reference rows whose token ids make the IDF table when IDF is on and no table
        is fixed (each occurrence counts, as ``bert-score``). ``cacheable``: the rows whose texts may go
        through the encoder's embedding cache (None = all, when the cache is on).
        """
        if self.encoder is None:
            raise ValueError("this plan was given its embeddings; it cannot encode texts")
        mask = None
        if cacheable is not None:
            mask = [False] * len(self.index)
            for i in cacheable.tolist():
                mask[i] = True
        progress = self.progress if progress is None else progress
        packed, ids = encode(
            self.encoder, self.texts, batch_tokens=self.batch_tokens, progress=progress, cacheable=mask
        )
        return self.use_embeddings(packed, ids, idf_rows)

    def use_embeddings(
        self, packed: PackedEmbeddings, ids: list[list[int]], idf_rows: Tensor | None = None
    ) -> ScoringPlan:
        """Take embeddings of :attr:`texts` computed elsewhere (e.g. one layer of an all-layers pass)."""
        self.packed, self.ids = packed, ids
        self.set_idf(idf_rows)
        return self

    def set_idf(self, idf_rows: Tensor | None) -> Tensor | None:
        """IDF table of the plan (fixed, or over ``idf_rows``' token ids) and the token weights; returns the table."""
        if self.packed is None:
            raise ValueError("embed the texts first")
        table = None
        if self.use_idf:
            table = self.idf
            if table is None:
                rows = [] if idf_rows is None else idf_rows.tolist()
                table = idf_table([self.ids[i] for i in rows], self.vocab_size) if rows else None
        self.weight = token_weights(self.packed.token_ids, self.special_ids, table)
        return table

    def _per_text(self, values: Tensor) -> Tensor:
        """Sum of a per-token tensor ``[T]`` over each text's rows ``[U]`` (CPU, float64)."""
        assert self.packed is not None
        lengths, offsets = self.packed.lengths.cpu(), self.packed.offsets.cpu()
        order = torch.argsort(offsets, stable=True)  # each text's rows are contiguous and cover [0, T)
        owner = torch.repeat_interleave(order, lengths[order])
        return torch.zeros(len(lengths), dtype=torch.float64).index_add_(0, owner, values.detach().cpu().double())

    def empty_texts(self) -> Tensor:
        """Bool ``[U]``: texts without a content token (empty, whitespace- or zero-width-only)."""
        assert self.packed is not None
        special = torch.tensor(sorted(self.special_ids), dtype=self.packed.token_ids.dtype)
        content = ~torch.isin(self.packed.token_ids.cpu(), special)
        return self._per_text(content) == 0

    def warn_inputs(self, cand_rows: Tensor, ref_rows: Tensor) -> None:
        """One warning for empty candidates/references (with the value their pairs get) and one for texts
        whose tokens all have IDF 0 (e.g. every reference identical)."""
        empty = self.empty_texts()
        ec, er = int(empty[cand_rows].sum()), int(empty[ref_rows].sum())
        if ec or er:
            if self.baseline is None:
                value = "P = R = F = 0"
            else:
                p, r, f = (float(rescale(torch.zeros(()), b)) for b in self.baseline)
                value = f"0 before rescaling, i.e. P = {p:.6f}, R = {r:.6f}, F = {f:.6f} after it"
            warn(f"{ec} empty candidate(s) and {er} empty reference(s): their pairs score {value}")
        if self.use_idf and self.weight is not None:
            zero = (self._per_text(self.weight) == 0) & ~empty
            zc, zr = int(zero[cand_rows].sum()), int(zero[ref_rows].sum())
            if zc or zr:
                warn(
                    f"IDF gives every token of {zc} candidate(s) and {zr} reference(s) weight 0 (a token in every "
                    "reference has IDF 0, e.g. when all references are identical): their pairs score 0; fix the "
                    "IDF table with an idf_corpus"
                )

    # --- 3. matching -------------------------------------------------------------------------------
    @exact
    def score_pairs(self, cand_rows: Tensor, ref_rows: Tensor, packed: PackedEmbeddings | None = None) -> Tensor:
        """P, R, F ``[3, n]`` (float32, on the embeddings' device) of the pairs ``(cand_rows[k], ref_rows[k])``.

        ``packed``: other embeddings of the same texts (another layer); default the plan's.
        """
        packed = packed or self.packed
        if packed is None or self.weight is None:
            raise ValueError("embed the texts first")
        p, r, f = score_pairs(
            packed, self.weight, cand_rows, packed, self.weight, ref_rows, max_elements=self.max_elements
        )
        return torch.stack((p, r, f))

    @exact
    def score_blocks(self, rows: Sequence[Tensor], cols: Sequence[Tensor], *, progress: bool = False) -> list[Tensor]:
        """P, R, F ``[3, n_s, m_s]`` (float32, CPU) of every (``rows[s][i]``, ``cols[s][j]``) pair, per block ``s``."""
        if self.packed is None or self.weight is None:
            raise ValueError("embed the texts first")
        return score_blocks(
            self.packed,
            self.weight,
            rows,
            cols,
            max_elements=self.max_elements,
            progress=progress,
        )

    # --- 4. references and rescaling ---------------------------------------------------------------
    def rescale(self, x: Tensor, measure: int | None = None) -> Tensor:
        """``x`` rescaled with the baseline (of measure 0/1/2 = P/R/F, or ``[3, ...]`` for all); as is without one."""
        if self.baseline is None:
            return x
        if measure is None:
            return torch.stack([rescale(x[k], self.baseline[k]) for k in range(3)])
        return rescale(x, self.baseline[measure])

    def reduce(self, prf: Tensor, group_sizes: Sequence[int]) -> Scores:
        """Per-candidate :class:`Scores` ``[N]`` (CPU) of per-pair ``prf`` ``[3, sum(group_sizes)]``, rescaled."""
        prf = prf.cpu()
        out = reduce_references(prf[0], prf[1], prf[2], group_sizes, self.multi_ref)
        if self.baseline is None:
            return out
        base = self.baseline
        return Scores(
            rescale(out.precision, base[0]), rescale(out.recall, base[1]), rescale(out.f1, base[2]), out.ref_index
        )

    def reduce_blocks(self, blocks: Sequence[Tensor]) -> Scores:
        """Per-row :class:`Scores` ``[sum n_s]`` of blocks ``[3, n_s, m_s]``
        (each row's ``m_s`` columns are its references)."""
        if not blocks:
            return self.reduce(torch.zeros((3, 0)), [])
        sizes = [b.shape[2] for b in blocks for _ in range(b.shape[1])]
        return self.reduce(torch.cat([b.reshape(3, -1) for b in blocks], dim=1), sizes)


def score_blocks(
    packed: PackedEmbeddings,
    weight: Tensor,
    rows: Sequence[Tensor],
    cols: Sequence[Tensor],
    *,
    max_elements: int | None = None,
    progress: bool = False,
) -> list[Tensor]:
    """P, R, F ``[3, n_s, m_s]`` (float32, CPU) of every (row text, column text) pair of each source ``s``.

    ``rows[s]`` ``[n_s]`` and ``cols[s]`` ``[m_s]`` index texts of ``packed``; ``weight`` ``[T]`` are the
    token weights aligned with ``packed.flat``. Each source is matched by :func:`~bertscore_loss._blocks.match_blocks`
    (length-sorted tiles of at most ``max_elements`` cosine entries; only the upper triangle when a
    source's rows are its columns).
    """
    if len(rows) != len(cols):
        raise ValueError(f"got {len(rows)} row lists but {len(cols)} column lists")
    bar = tqdm(total=len(rows), desc="matching", unit="source", disable=not progress, leave=False)
    out = []
    for r, c in zip(rows, cols):
        out.append(match_blocks(packed, weight, r, c, max_elements))
        bar.update(1)
    bar.close()
    return out


def nan_table(values: Tensor, sizes: Sequence[int], fill: float = math.nan) -> Tensor:
    """Ragged ``values`` ``[sum(sizes)]`` laid out as ``[len(sizes), max(sizes)]`` rows,
    ``fill`` after each row's end."""
    width = max(sizes, default=0)
    out = torch.full((len(sizes), width), fill, dtype=values.dtype)
    lengths = torch.tensor(list(sizes), dtype=torch.long)
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    out[mask] = values
    return out
