"""MBR utilities: the interface every utility implements, and user callables as utilities.

A :class:`Utility` scores hypotheses against pseudo-references. An MBR call opens one
:class:`Session` over all its sources (distinct texts only); the MBR methods (:mod:`rerank.mbr`) ask
it for utility blocks ``U [n, m]`` (hypothesis i against pseudo-reference j, higher is better) and,
where the utility supports it, for expected utilities against an aggregate of the pseudo-references.

Shapes: ``S`` sources, ``n`` hypotheses and ``m`` pseudo-references of one source (distinct texts).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["CallableUtility", "Session", "Utility", "UtilityFn"]

#: A user utility: ``fn(hypotheses, pseudo_references) -> [n, m]`` (tensor, array or nested lists).
UtilityFn = Callable[[list[str], list[str]], Any]


class Session(ABC):
    """One MBR call's texts: ``hypotheses[s]`` and ``references[s]`` (distinct texts of source ``s``).

    Index tensors (``rows``, ``cols``: long ``[k]``) point into those lists. Utilities keep what they
    compute once per text (embeddings, n-gram counts) inside the session.
    """

    def __init__(self, hypotheses: list[list[str]], references: list[list[str]]) -> None:
        self.hypotheses = hypotheses
        self.references = references

    @abstractmethod
    def blocks(self, sources: Sequence[int], rows: Sequence[Tensor], cols: Sequence[Tensor]) -> list[Tensor]:
        """``U [len(rows[k]), len(cols[k])]`` (float64, CPU) of source ``sources[k]``'s hypotheses ``rows[k]``
        against its pseudo-references ``cols[k]``."""

    def full(self, sources: Sequence[int]) -> list[Tensor]:
        """``U [n_s, m_s]`` of every hypothesis against every pseudo-reference of each source in ``sources``."""
        rows = [torch.arange(len(self.hypotheses[s])) for s in sources]
        cols = [torch.arange(len(self.references[s])) for s in sources]
        return self.blocks(sources, rows, cols)

    def aggregate(self, sources: Sequence[int], rows: Sequence[Tensor], weights: Sequence[Tensor]) -> list[Tensor]:
        """Estimated expected utility ``[len(rows[k])]`` (float64) of hypotheses ``rows[k]`` against one aggregate
        of source ``sources[k]``'s pseudo-references, weighted by ``weights[k]`` ``[m_s]`` (summing to 1)."""
        raise NotImplementedError(f"{type(self).__name__} has no reference aggregation")


class Utility(ABC):
    """A utility ``U(hypothesis, pseudo-reference)``, higher is better, for many sources at once.

    Call it on one source's lists for the ``[n, m]`` matrix: ``utility(hypotheses, pseudo_references)``.
    """

    name: str = "utility"
    #: whether its sessions implement :meth:`Session.aggregate` (reference aggregation)
    supports_aggregation: bool = False

    @abstractmethod
    def session(
        self, hypotheses: list[list[str]], references: list[list[str]], reference_counts: Sequence[Tensor] | None = None
    ) -> Session:
        """A :class:`Session` over the distinct texts of one MBR call (one list of each per source).

        ``reference_counts[s]`` ``[m_s]``: how often each distinct pseudo-reference occurs in the caller's
        lists (a utility whose values depend on the whole set of references, e.g. BERTScore's IDF, uses it).
        """

    def signature(self) -> str:
        """A string naming everything that determines the utility values."""
        return self.name

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> Tensor:
        """``U [n, m]`` (float64) of every hypothesis against every pseudo-reference of one source."""
        hyps, refs = _text_list(hypotheses, "hypotheses"), _text_list(references, "references")
        if not hyps or not refs:
            return torch.zeros((len(hyps), len(refs)), dtype=torch.float64)
        return self.session([hyps], [refs]).full([0])[0]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.signature()!r})"


class CallableUtility(Utility):
    """Any function ``fn(hypotheses, pseudo_references) -> [n, m]`` as a utility (called once per source and block).

    The result may be a tensor, a numpy array or nested lists; its shape is checked, and NaN is an error.
    """

    def __init__(self, fn: UtilityFn, name: str | None = None) -> None:
        if not callable(fn):
            raise TypeError(f"a utility must be callable as fn(hypotheses, pseudo_references), got {type(fn).__name__}")
        self.fn = fn
        self.name = name or str(getattr(fn, "__name__", None) or "callable")

    def session(
        self, hypotheses: list[list[str]], references: list[list[str]], reference_counts: Sequence[Tensor] | None = None
    ) -> Session:
        return _CallableSession(hypotheses, references, self.fn, self.name)


class _CallableSession(Session):
    def __init__(self, hypotheses: list[list[str]], references: list[list[str]], fn: UtilityFn, name: str) -> None:
        super().__init__(hypotheses, references)
        self.fn, self.name = fn, name

    def blocks(self, sources: Sequence[int], rows: Sequence[Tensor], cols: Sequence[Tensor]) -> list[Tensor]:
        out = []
        for s, r, c in zip(sources, rows, cols):
            hyps = [self.hypotheses[s][i] for i in r.tolist()]
            refs = [self.references[s][j] for j in c.tolist()]
            if not hyps or not refs:
                out.append(torch.zeros((len(hyps), len(refs)), dtype=torch.float64))
                continue
            out.append(_as_matrix(self.fn(hyps, refs), len(hyps), len(refs), self.name))
        return out


def _as_matrix(value: Any, n: int, m: int, name: str) -> Tensor:
    try:
        u = torch.as_tensor(value, dtype=torch.float64).detach().cpu()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise TypeError(
            f"utility {name!r} must return an [n, m] matrix of numbers, got {type(value).__name__}"
        ) from exc
    if u.shape != (n, m):
        raise ValueError(f"utility {name!r} returned shape {tuple(u.shape)} for {n} hypotheses x {m} pseudo-references")
    if not torch.isfinite(u).all():
        bad = "NaN" if torch.isnan(u).any() else "an infinite value"
        raise ValueError(f"utility {name!r} returned {bad}: a utility must be finite (NaN or infinite ranks wrongly)")
    return u


def _text_list(texts: object, what: str) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{what} must be a list of str, got {type(texts).__name__}")
    out = list(texts)
    for i, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}] must be str, got {type(t).__name__}")
    return out
