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
        check_unicode(t, f"{what}[{i}]")
    return list(texts)


def check_unicode(text: str, what: str) -> None:
    """ValueError naming ``what`` when ``text`` holds a lone surrogate (not encodable text, e.g. bytes decoded
    with ``errors="surrogateescape"``)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        raise ValueError(
            f"{what} is not valid Unicode: it holds the lone surrogate {bad!r} at character {exc.start} "
            "(decode the bytes with errors='replace', or fix the text)"
        ) from None


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


def check_lists(lists: object, what: str, *, allow_empty: bool = False) -> list[list[str]]:
    """A list of lists of str (one list per source or row); errors name the offending index.

    ``allow_empty``: an empty inner list is kept (else it is a ValueError).
    """
    if isinstance(lists, str) or not isinstance(lists, Sequence):
        raise TypeError(f"{what} must be a list of lists of str (one list per row), got {type(lists).__name__}")
    out = []
    for s, group in enumerate(lists):
        if isinstance(group, str):
            raise TypeError(f"{what}[{s}] must be a list of str, got a str (wrap one text as [text])")
        texts = check_texts(group, f"{what}[{s}]")
        if not texts and not allow_empty:
            raise ValueError(f"{what}[{s}] is an empty list: each row needs at least one text")
        out.append(texts)
    return out


def references_are_text(references: object) -> bool:
    """True for a list of strings (and for an empty list), False for framed token-id sequences.

    A single str, a non-sequence, a mix of kinds, or a list of lists of str (several references per
    row: the loss scores one reference per row) is an error naming what was given.
    """
    if hasattr(references, "dim") and hasattr(references, "tolist"):  # a tensor of ids [B, L]
        if references.dim() != 2:
            raise ValueError("references given as a tensor must be token ids [batch, length]")
        return False
    if isinstance(references, str) or not isinstance(references, Sequence):
        raise TypeError(
            "references must be a list of str (one per row) or of framed token-id lists, "
            f"got {type(references).__name__}"
        )
    kinds = set()
    for i, r in enumerate(references):
        if isinstance(r, str):
            kinds.add("str")
        elif isinstance(r, Sequence) or hasattr(r, "tolist"):
            items = r.tolist() if hasattr(r, "tolist") else list(r[:1])
            if items and isinstance(items[0], str):
                raise TypeError(
                    f"references[{i}] is a list of str: the loss takes one reference per row (score several with "
                    "BERTScorer.score or one row per reference)"
                )
            kinds.add("ids")
        else:
            raise TypeError(f"references[{i}] must be str or a list of token ids, got {type(r).__name__}")
    if len(kinds) > 1:
        raise ValueError("references must be all strings or all framed token-id sequences, not a mix")
    return kinds != {"ids"}
