"""Exact BERTScore evaluation mode: :class:`BERTScorer`."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Literal, overload

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ._blocks import match_blocks
from ._loading import packaged_model
from ._packed import PackedEmbeddings
from ._pipeline import PRF, Scores, ScoringPlan, encode, nan_table, reduce_references
from .baseline import load_baseline, packaged_baseline
from .cache import EmbeddingCache
from .config import ScorerConfig
from .encoder import FrozenEncoder
from .idf import idf_table, token_weights
from .matching import cosine_matrix, greedy_match
from .registry import encoder_for, moved, normalize_device
from .signature import Signature
from .validation import check_lists, check_pairs, check_references, check_texts

__all__ = [
    "PRF",
    "BERTScorer",
    "ScorerConfig",
    "Scores",
    "TokenSimilarity",
    "match_blocks",
    "reduce_references",
    "scorer_from",
]

logger = logging.getLogger(__name__)


@dataclass
class TokenSimilarity:
    """Everything the heatmap shows for one pair.

    ``sim`` ``[Lc, Lr]`` cosine similarities of all tokens (special tokens included: they are match
    targets); ``cand_match`` ``[Lc]`` / ``ref_match`` ``[Lr]`` the greedy match of each token;
    ``cand_weight`` / ``ref_weight`` the token weights (IDF or 1; 0 for special tokens);
    ``scores`` (P, R, F) as :meth:`BERTScorer.score` gives them (rescaled when the scorer rescales).
    """

    cand_tokens: list[str]
    ref_tokens: list[str]
    sim: Tensor
    cand_match: Tensor
    ref_match: Tensor
    cand_weight: Tensor
    ref_weight: Tensor
    scores: tuple[float, float, float]
    idf: bool
    layer: int
    model: str


class BERTScorer:
    """BERTScore with an encoder loaded once (shared through :func:`bertscore_loss.registry.encoder_for`).

    >>> scorer = BERTScorer(layer=4)                       # doctest: +SKIP
    >>> P, R, F = scorer.score(["a cat"], ["the cat"])     # doctest: +SKIP
    """

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        idf_corpus: Sequence[str] | None = None,
        encoder: FrozenEncoder | None = None,
        **fields: Any,
    ) -> None:
        unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(ScorerConfig)})
        if unknown:
            raise TypeError(f"unknown scorer setting(s) {', '.join(map(repr, unknown))} (see ScorerConfig)")
        config = dataclasses.replace(config or ScorerConfig(), **fields)
        config.validate()
        if idf_corpus is not None and not config.idf:
            raise ValueError("idf_corpus is given but idf=False: pass idf=True to weight tokens by IDF")
        self.config = config
        self.encoder: FrozenEncoder = encoder or encoder_for(config)
        if config.cache_bytes:
            self.encoder.enable_cache(config.cache_bytes)
        self.baseline: Tensor | None = None
        self._baseline_source: str | None = None
        if config.rescale:
            self.baseline = load_baseline(self.encoder.name, self.encoder.layer, config.baseline)
            self._baseline_source = str(config.baseline or packaged_baseline(self.encoder.name))
        self.idf: Tensor | None = None
        self.idf_description = "refs"
        if idf_corpus is not None:
            self.set_idf_corpus(idf_corpus)

    @property
    def layer(self) -> int:
        """The layer whose output is scored (``config.layer``, or the preset it resolved to)."""
        return self.encoder.layer

    def on(self, device: str | torch.device) -> BERTScorer:
        """This scorer on ``device``: the same settings, IDF table and baseline, with the registry's encoder
        there (``self`` when it is already there). The encoder is never moved under its other users."""
        dev = normalize_device(device)
        if self.encoder is not None and self.encoder.device == dev:
            return self
        other = copy.copy(self)
        other.config = dataclasses.replace(self.config, device=str(dev))
        other.encoder = encoder_for(other.config) if self.encoder is None else moved(self.encoder, dev)
        if other.config.cache_bytes:
            other.encoder.enable_cache(other.config.cache_bytes)
        return other

    # --- IDF -------------------------------------------------------------------------------
    def set_idf_corpus(self, corpus: Sequence[str], *, description: str | None = None) -> Tensor:
        """Fix the IDF table from ``corpus`` (list of sentences); returns it ``[V]``.

        ``description`` names the table in :meth:`signature` (default ``corpus:<size>:<sha1>``; the
        distributed path passes ``"refs"`` for a table over all references, as one :meth:`score` call).
        """
        if not self.config.idf:
            raise ValueError("an IDF corpus needs idf=True: this scorer was built with idf=False")
        corpus = check_texts(corpus, "idf_corpus")
        if not corpus:
            raise ValueError("the IDF corpus is empty: IDF needs at least one sentence")
        self.idf = idf_table(self.encoder.tokenize(corpus).ids, self.encoder.vocab_size)
        digest = hashlib.sha1("\n".join(corpus).encode()).hexdigest()[:8]
        self.idf_description = description or f"corpus:{len(corpus)}:{digest}"
        return self.idf

    # --- encoding ----------------------------------------------------------------------------
    def show_progress(self, n: int) -> bool:
        """Whether a call over ``n`` texts shows a progress bar (``config.progress``; None = 1,000 or more)."""
        return self.config.progress if self.config.progress is not None else n >= 1000

    def embed(
        self,
        texts: Sequence[str],
        *,
        progress: bool | None = None,
        cacheable: Sequence[bool] | None = None,
        cache: EmbeddingCache | None = None,
    ) -> tuple[PackedEmbeddings, list[list[int]]]:
        """Embeddings of ``texts`` (each encoded once, in input order) and their token ids.

        ``cacheable``: which texts may go through the cache (default all); ``cache``: an embedding cache of
        the caller's (default the encoder's, on with ``cache_bytes``).
        """
        progress = self.config.progress if progress is None else progress
        return encode(
            self.encoder,
            texts,
            batch_tokens=self.config.batch_tokens,
            progress=progress,
            cacheable=cacheable,
            cache=cache,
        )

    def weights(self, packed: PackedEmbeddings) -> Tensor:
        """Per-token weights ``[T]`` aligned with ``packed.flat``: the fixed IDF table's (1 without IDF), 0 for
        special tokens. (Without a fixed table, IDF over each call's references is the plan's.)"""
        return token_weights(packed.token_ids, self.encoder.special_ids, self.idf)

    def vocab_weights(self) -> Tensor:
        """The weight of every vocabulary id ``[V]`` (CPU float32): the same rule as :meth:`weights`."""
        ids = torch.arange(self.encoder.vocab_size)
        return token_weights(ids, self.encoder.special_ids, self.idf).float()

    def _plan(self) -> ScoringPlan:
        """A fresh :class:`~bertscore_loss._pipeline.ScoringPlan` of this scorer (encoder, IDF, baseline, budgets)."""
        return ScoringPlan(
            special_ids=self.encoder.special_ids,
            vocab_size=self.encoder.vocab_size,
            use_idf=self.config.idf,
            idf=self.idf,
            baseline=self.baseline,
            multi_ref=self.config.multi_ref,
            max_elements=self.config.max_elements,
            encoder=self.encoder,
            batch_tokens=self.config.batch_tokens,
            progress=self.config.progress,
        )

    # --- scoring -----------------------------------------------------------------------------
    def empty_texts(self, texts: Sequence[str]) -> list[bool]:
        """Which of ``texts`` have no content token (empty, whitespace- or zero-width-only, e.g. a zero-width space):
        the texts whose pairs score 0 (before rescaling). The one rule of emptiness for everything built on
        a scorer (rewards, reranking, metrics)."""
        texts = check_texts(texts, "texts")
        if not texts:
            return []
        special = self.encoder.special_ids
        return [all(t in special for t in row) for row in self.encoder.tokenize(texts).ids]

    @overload
    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str] | Sequence[Sequence[str]],
        *,
        return_ref_index: Literal[False] = False,
    ) -> PRF: ...

    @overload
    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str] | Sequence[Sequence[str]],
        *,
        return_ref_index: Literal[True],
    ) -> Scores: ...

    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str] | Sequence[Sequence[str]],
        *,
        return_ref_index: bool = False,
    ) -> PRF | Scores:
        """P, R, F float32 tensors ``[N]`` (CPU) of each candidate against its reference(s), in input order.

        ``refs``: one str per candidate, or a list of str per candidate (multi-reference, reduced by
        ``config.multi_ref``). Texts without a content token (empty, whitespace or zero-width only) score
        0 (before rescaling) with one warning. Returns a :class:`PRF` ``(precision, recall, f1)``; with
        ``return_ref_index`` a :class:`Scores` 4-tuple that also gives the index of the best reference by F.
        """
        out = self._score(cands, refs, None)
        return out if return_ref_index else PRF(out.precision, out.recall, out.f1)

    @overload
    def score_groups(
        self,
        candidates: Sequence[Sequence[str]],
        references: Sequence[str] | Sequence[Sequence[str]],
        *,
        reduce: Literal[True] = True,
        progress: bool | None = None,
    ) -> Scores: ...

    @overload
    def score_groups(
        self,
        candidates: Sequence[Sequence[str]],
        references: Sequence[str] | Sequence[Sequence[str]],
        *,
        reduce: Literal[False],
        progress: bool | None = None,
    ) -> list[Tensor]: ...

    def score_groups(
        self,
        candidates: Sequence[Sequence[str]],
        references: Sequence[str] | Sequence[Sequence[str]],
        *,
        reduce: bool = True,
        progress: bool | None = None,
    ) -> Scores | list[Tensor]:
        """Every candidate of group ``b`` against every reference of group ``b``, for all groups in one call.

        The engine behind :meth:`score`, the reranker (MBR utility matrices), the risk and the metric.
        ``candidates``: ``B`` lists of str (ragged; an empty list is allowed); ``references``: ``B`` str,
        or ``B`` non-empty lists of str. Every distinct text is encoded once and every distinct
        (candidate, reference) pair matched once, so repeated samples cost nothing.

        * ``reduce=True``: each candidate's references reduced by ``config.multi_ref`` (and rescaled):
          :class:`Scores` ``[B, k]`` (``k`` = the longest group), float32 on CPU with **NaN** after the
          end of a shorter group (``torch.isnan`` is the mask) and ``ref_index`` -1 there. Values equal
          :meth:`score` of the flattened pairs, except under the IDF rule below.
        * ``reduce=False``: the all-pairs blocks, one float32 CPU tensor ``[3, n_b, m_b]`` per group
          (P, R, F of candidate ``i`` against reference ``j``, rescaled if the scorer rescales): MBR
          utility matrices (``candidates`` as hypotheses, ``references`` as pseudo-references).

        IDF rule: with ``idf=True`` and no fixed ``idf_corpus`` the IDF table is over the references as
        given to the call: here each group's references counted once (not once per candidate); in
        :meth:`score` each candidate's reference(s), as ``bert-score`` counts them. So the two agree with
        IDF when every group has one candidate or the table is fixed (``idf_corpus``), and differ otherwise.
        """
        lists = check_lists(candidates, "candidates", allow_empty=True)
        groups = check_references(references, len(lists), "references")
        return self._groups(lists, groups, reduce, progress)

    def _groups(
        self, lists: list[list[str]], groups: list[list[str]], reduce: bool, progress: bool | None
    ) -> Scores | list[Tensor]:
        """:meth:`score_groups` on checked inputs: the one pipeline (rows → embed → warn → match → reduce)."""
        plan = self._plan()
        cand_rows = [plan.rows(row) for row in lists]
        ref_rows = [plan.rows(g) for g in groups]
        empty = torch.zeros(0, dtype=torch.long)
        all_cands = torch.cat(cand_rows) if cand_rows else empty
        all_refs = torch.cat(ref_rows) if ref_rows else empty
        plan.embed(all_refs, progress=progress, cacheable=all_refs if self.config.cache_texts == "references" else None)
        plan.warn_inputs(all_cands, all_refs)
        if not reduce:
            show = self.show_progress(len(plan.texts)) if progress is None else progress
            return [plan.rescale(b) for b in plan.score_blocks(cand_rows, ref_rows, progress=show)]
        sizes = [len(row) for row in lists]
        per_cand = [len(g) for g, k in zip(groups, sizes) for _ in range(k)]  # references of each candidate
        pair_ref = torch.cat([r for r, k in zip(ref_rows, sizes) for _ in range(k)] or [empty])
        pair_cand = torch.repeat_interleave(all_cands, torch.tensor(per_cand, dtype=torch.long))
        flat = plan.reduce(plan.score_pairs(pair_cand, pair_ref), per_cand)
        return Scores(
            nan_table(flat.precision, sizes),
            nan_table(flat.recall, sizes),
            nan_table(flat.f1, sizes),
            nan_table(flat.ref_index, sizes, fill=-1),
        )

    @overload
    def score_stream(
        self,
        pairs: Iterable[tuple[str, str | Sequence[str]]],
        *,
        chunk_size: int = 4096,
        return_ref_index: Literal[False] = False,
    ) -> Iterator[PRF]: ...

    @overload
    def score_stream(
        self,
        pairs: Iterable[tuple[str, str | Sequence[str]]],
        *,
        chunk_size: int = 4096,
        return_ref_index: Literal[True],
    ) -> Iterator[Scores]: ...

    def score_stream(
        self,
        pairs: Iterable[tuple[str, str | Sequence[str]]],
        *,
        chunk_size: int = 4096,
        return_ref_index: bool = False,
    ) -> Iterator[PRF | Scores]:
        """Score ``(candidate, reference(s))`` pairs from any iterable (a generator, a file reader) in
        chunks of ``chunk_size`` pairs, yielding per chunk what :meth:`score` returns for it, in input
        order: a :class:`PRF` ``[chunk]`` (``P, R, F = chunk``), or :class:`Scores` with ``return_ref_index``.

        Peak memory depends on ``chunk_size`` (and ``cache_bytes``), not on the number of pairs. Scores
        equal :meth:`score` on all pairs at once, so IDF needs a fixed table (``idf_corpus``): IDF over
        each chunk's references would change with the chunking.
        """
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        if self.config.idf and self.idf is None:
            raise ValueError(
                "score_stream with idf=True needs a fixed IDF table: pass idf_corpus=... (or call "
                "set_idf_corpus); IDF over each chunk's references would depend on the chunking"
            )
        return self._stream(pairs, chunk_size, return_ref_index)

    def _stream(
        self, pairs: Iterable[tuple[str, str | Sequence[str]]], chunk_size: int, return_ref_index: bool
    ) -> Iterator[PRF | Scores]:
        # progress None: a bar when stderr is a terminal (tqdm's disable=None)
        bar = tqdm(desc="scoring", unit="pair", disable=True if self.config.progress is False else None, leave=False)
        it = iter(pairs)
        start = 0
        while chunk := list(islice(it, chunk_size)):
            for k, item in enumerate(chunk):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise TypeError(f"pair {start + k} must be a (candidate, reference(s)) 2-tuple, got {item!r:.80}")
            try:
                out = self._score([c for c, _ in chunk], [r for _, r in chunk], False)
            except (TypeError, ValueError) as exc:
                if type(exc) not in (TypeError, ValueError):
                    raise
                raise type(exc)(f"in the chunk of pairs {start}..{start + len(chunk) - 1}: {exc}") from exc
            yield out if return_ref_index else PRF(out.precision, out.recall, out.f1)
            start += len(chunk)
            bar.update(len(chunk))
        bar.close()

    def _score(
        self, cands: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], progress: bool | None
    ) -> Scores:
        cands, groups = check_pairs(cands, refs)
        if not cands:
            z = torch.zeros(0)
            return Scores(z, z, z, torch.zeros(0, dtype=torch.long))
        out = self._groups([[c] for c in cands], groups, True, progress)
        assert isinstance(out, Scores)
        return Scores(out.precision[:, 0], out.recall[:, 0], out.f1[:, 0], out.ref_index[:, 0])

    def token_similarity(self, cand: str, ref: str) -> TokenSimilarity:
        """Why a pair scores what it does: token similarities, greedy matches, weights and P/R/F of ``cand``
        against ``ref`` (IDF: the fixed table, else over the one reference, as :meth:`score`)."""
        if not isinstance(cand, str) or not isinstance(ref, str):
            raise TypeError("cand and ref must be str")
        if not cand.strip() or not ref.strip():
            raise ValueError("cand and ref must be non-empty texts")
        enc = self.encoder
        plan = self._plan()
        rows = plan.rows([cand, ref])
        plan.embed(rows[1:])
        plan.warn_inputs(rows[:1], rows[1:])
        assert plan.packed is not None and plan.weight is not None
        ids = [plan.ids[int(i)] for i in rows]
        emb, mask, w = plan.packed.gather(rows.to(plan.packed.flat.device), plan.weight)
        lc, lr = len(ids[0]), len(ids[1])
        sim = cosine_matrix(emb[0:1, :lc], emb[1:2, :lr], normalized=True)  # [1, Lc, Lr], for the picture
        m = greedy_match(sim)
        scores = plan.reduce(plan.score_pairs(rows[:1], rows[1:]), [1])  # the exact pipeline's P, R, F
        return TokenSimilarity(
            cand_tokens=enc.tokenizer.convert_ids_to_tokens(ids[0]),
            ref_tokens=enc.tokenizer.convert_ids_to_tokens(ids[1]),
            sim=sim[0].cpu(),
            cand_match=m.cand_index[0].cpu(),
            ref_match=m.ref_index[0].cpu(),
            cand_weight=w[0, :lc].cpu(),
            ref_weight=w[1, :lr].cpu(),
            scores=(float(scores.precision[0]), float(scores.recall[0]), float(scores.f1[0])),
            idf=self.config.idf,
            layer=enc.layer,
            model=enc.name,
        )

    # --- reproducibility -----------------------------------------------------------------------
    def signature(self) -> Signature:
        """A sacrebleu-style :class:`~bertscore_loss.Signature` naming everything that determines the scores
        (``str()`` prints it, :meth:`Signature.parse` reads it back)."""
        import transformers

        from ._version import __version__

        c = self.config
        idf = f"yes({self.idf_description})" if c.idf else "no"
        if self.baseline is not None:
            src = Path(self._baseline_source or "")
            digest = hashlib.sha1(src.read_bytes()).hexdigest()[:8] if src.is_file() else "?"
            resc = f"yes({src.name}:{digest})"
        else:
            resc = "no"
        enc = self.encoder
        # A packaged encoder (bundled MiniLM, assembled mpnet) is named with its packages' versions.
        packaged = packaged_model(enc.path)
        if packaged is not None:
            model = packaged
        else:
            model = enc.path if enc.is_bundled else enc.name  # the folder actually loaded, or the hub name
        return Signature(
            version=__version__,
            model=model,
            layer=enc.layer,
            idf=idf,
            rescale=resc,
            multi_ref=c.multi_ref,
            long_inputs=f"window(stride={enc.window_stride})" if enc.long_inputs == "window" else None,
            dtype=c.dtype,
            transformers=transformers.__version__,
            torch=torch.__version__,
        )


def scorer_from(
    scorer: BERTScorer | None,
    config: ScorerConfig | None = None,
    *,
    idf_corpus: Sequence[str] | None = None,
    encoder: FrozenEncoder | None = None,
    owner: str = "this object",
    **fields: Any,
) -> BERTScorer:
    """The one constructor rule of everything built on a scorer (loss, risk, reranker, metric, integrations):
    an existing ``scorer``, **or** the scorer's settings (``config``, ``idf_corpus``, ``encoder``, and
    :class:`ScorerConfig` fields as keywords) to build one; giving both is an error naming what was given."""
    if scorer is None:
        return BERTScorer(config, idf_corpus=idf_corpus, encoder=encoder, **fields)
    if not isinstance(scorer, BERTScorer):
        raise TypeError(f"{owner}: scorer must be a BERTScorer, got {type(scorer).__name__}")
    given = [n for n, v in (("config", config), ("idf_corpus", idf_corpus), ("encoder", encoder)) if v is not None]
    given += sorted(fields)
    if given:
        raise ValueError(
            f"{owner}: pass scorer=... or the scorer's settings ({', '.join(given)}), not both: "
            "the settings would be ignored"
        )
    return scorer
