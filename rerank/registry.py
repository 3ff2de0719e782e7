"""The utility registry: names → utility factories, and :func:`get_utility` for a name, a utility or a callable.

Built in: ``"bertscore"`` (F1; ``"bertscore-precision"``, ``"bertscore-recall"``), ``"chrf"``, ``"chrf++"``
and ``"bleu"`` (sacrebleu, an optional dependency). Add your own with :func:`register_utility`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .bertscore_utility import BERTScoreUtility
from .ngram_utility import BLEU, ChrF
from .utility import CallableUtility, Utility

__all__ = ["UTILITIES", "UtilityLike", "get_utility", "register_utility"]

#: A utility, the name of a registered one, or a function ``fn(hypotheses, pseudo_references) -> [n, m]``.
UtilityLike = Utility | str | Callable[[list[str], list[str]], Any]

UTILITIES: dict[str, Callable[..., Utility]] = {
    "bertscore": BERTScoreUtility,
    "bertscore-precision": lambda **kw: BERTScoreUtility(measure="precision", **kw),
    "bertscore-recall": lambda **kw: BERTScoreUtility(measure="recall", **kw),
    "chrf": ChrF,
    "chrf++": lambda **kw: ChrF(word_order=2, **kw),
    "bleu": BLEU,
}


def register_utility(name: str, factory: Callable[..., Utility], *, overwrite: bool = False) -> None:
    """Register ``factory(**options) -> Utility`` under ``name`` (an error if taken, unless ``overwrite``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a utility name must be a non-empty str, got {name!r}")
    if name in UTILITIES and not overwrite:
        raise ValueError(f"utility {name!r} is already registered: pass overwrite=True to replace it")
    if not callable(factory):
        raise TypeError(f"the factory of utility {name!r} must be callable, got {type(factory).__name__}")
    UTILITIES[name] = factory


def get_utility(spec: UtilityLike = "bertscore", **options: Any) -> Utility:
    """The :class:`Utility` for ``spec``: a registered name (built with ``options``, e.g.
    ``get_utility("bertscore", layer=4)`` or ``get_utility("chrf", word_order=2)``), a utility (as is) or a
    function ``fn(hypotheses, pseudo_references) -> [n, m]`` (wrapped in :class:`CallableUtility`)."""
    if isinstance(spec, Utility):
        if options:
            raise ValueError(f"options {sorted(options)} only apply to a utility given by name")
        return spec
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key not in UTILITIES:
            raise ValueError(f"unknown utility {spec!r}: choose one of {sorted(UTILITIES)} or pass a callable")
        return UTILITIES[key](**options)
    if callable(spec):
        return CallableUtility(spec, **options)
    raise TypeError(f"utility must be a name, a Utility or a callable, got {type(spec).__name__}")
