"""Validation of user inputs: clear errors, never a silently misaligned result."""

from __future__ import annotations

from collections.abc import Sequence


def check_texts(texts: object, what: str) -> list[str]:
    """``texts`` as a list of str; TypeError naming the first non-str item's index."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{what} must be a list of str, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}] must be str, got {type(t).__name__}")
    return list(texts)


def check_references(refs: object, n: int, what: str = "refs") -> list[list[str]]:
    """References as one list per candidate: ``list[str]`` (one each) or ``list[list[str]]`` (several).

    Raises ValueError on a length mismatch (naming both lengths) or an empty reference list, and
    TypeError naming the index of a non-str item.
    """
    if isinstance(refs, str) or not isinstance(refs, Sequence):
        raise TypeError(f"{what} must be a list of str or a list of lists of str, got {type(refs).__name__}")
    if len(refs) != n:
        raise ValueError(f"got {n} candidates but {len(refs)} references: the lengths must match")
    groups: list[list[str]] = []
    for i, r in enumerate(refs):
        if isinstance(r, str):
            groups.append([r])
        elif isinstance(r, Sequence):
            if len(r) == 0:
                raise ValueError(f"{what}[{i}] is an empty list: each candidate needs at least one reference")
            for j, t in enumerate(r):
                if not isinstance(t, str):
                    raise TypeError(f"{what}[{i}][{j}] must be str, got {type(t).__name__}")
            groups.append(list(r))
        else:
            raise TypeError(f"{what}[{i}] must be str or a list of str, got {type(r).__name__}")
    return groups


def check_pairs(cands: object, refs: object) -> tuple[list[str], list[list[str]]]:
    """Validated candidates and per-candidate reference lists."""
    c = check_texts(cands, "cands")
    return c, check_references(refs, len(c))
