"""Readers for dev sets with human judgments and for plain sentence corpora.

A dev set is a :class:`JudgedPairs`: candidate, reference, human score and group (e.g. the language
pair) per item. Readers: the WMT DAseg file layout (:func:`read_wmt_daseg`), the STS-B CSV
(:func:`read_stsb`) and a generic TSV (:func:`read_judged_tsv`). :func:`read_corpus` collects the
deduplicated sentences of text/CSV files for baseline computation.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..textio import read_corpus, read_lines

__all__ = ["JudgedPairs", "read_corpus", "read_judged_tsv", "read_stsb", "read_wmt_daseg"]

_DASEG = re.compile(r"^DAseg\.(?P<testset>.+)\.human\.(?P<lp>[^.]+)$")


@dataclass
class JudgedPairs:
    """Parallel lists of candidates, references, human scores and group names (one per item)."""

    cands: list[str]
    refs: list[str]
    human: list[float]
    groups: list[str]

    def __post_init__(self) -> None:
        n = len(self.cands)
        for name in ("refs", "human", "groups"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"JudgedPairs: {n} candidates but {len(getattr(self, name))} {name}")
        bad = [i for i, h in enumerate(self.human) if not math.isfinite(h)]
        if bad:
            raise ValueError(f"JudgedPairs: human score of item {bad[0]} is not a finite number")

    def __len__(self) -> int:
        return len(self.cands)

    @property
    def group_names(self) -> list[str]:
        """Group names in order of first appearance."""
        return list(dict.fromkeys(self.groups))

    def head(self, n: int | None) -> JudgedPairs:
        """The first ``n`` items of each group (all with None)."""
        if n is None:
            return self
        seen: dict[str, int] = {}
        keep = []
        for i, g in enumerate(self.groups):
            seen[g] = seen.get(g, 0) + 1
            if seen[g] <= n:
                keep.append(i)
        return JudgedPairs(
            [self.cands[i] for i in keep],
            [self.refs[i] for i in keep],
            [self.human[i] for i in keep],
            [self.groups[i] for i in keep],
        )

    @classmethod
    def concat(cls, parts: Iterable[JudgedPairs]) -> JudgedPairs:
        out = cls([], [], [], [])
        for p in parts:
            out.cands += p.cands
            out.refs += p.refs
            out.human += p.human
            out.groups += p.groups
        return out


def _lines(path: Path) -> list[str]:
    return read_lines(path, what="data file")  # lines end at \n / \r\n only


def _floats(lines: Sequence[str], path: Path) -> list[float]:
    out = []
    for i, s in enumerate(lines, start=1):
        try:
            out.append(float(s))
        except ValueError:
            raise ValueError(f"{path}:{i}: expected a human score (a number), got {s!r}") from None
    return out


def read_wmt_daseg(root: str | os.PathLike, lang_pairs: Sequence[str] | None = None) -> JudgedPairs:
    """WMT DAseg pairs from ``root``: files ``DAseg.<testset>.{mt-system,reference,human}.<lp>``.

    Group = the language pair (``<testset>:<lp>`` when ``root`` holds several test sets). ``lang_pairs``
    keeps only those pairs (in that order); default: all, sorted.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"WMT DAseg folder {str(root)!r} does not exist")
    found = sorted((m["testset"], m["lp"]) for p in root.iterdir() if (m := _DASEG.match(p.name)))
    if not found:
        raise ValueError(f"{root} holds no DAseg.<testset>.human.<lp> files (WMT DAseg layout)")
    testsets = {t for t, _ in found}
    if lang_pairs is not None:
        available = {lp for _, lp in found}
        missing = [lp for lp in lang_pairs if lp not in available]
        if missing:
            raise ValueError(f"{root} has no language pair(s) {missing}; available: {sorted(available)}")
        found = [(t, lp) for lp in lang_pairs for t, x in found if x == lp]
    parts = []
    for testset, lp in found:
        base = f"DAseg.{testset}"
        mt = _lines(root / f"{base}.mt-system.{lp}")
        ref = _lines(root / f"{base}.reference.{lp}")
        human_path = root / f"{base}.human.{lp}"
        human = _floats(_lines(human_path), human_path)
        if not len(mt) == len(ref) == len(human):
            raise ValueError(
                f"{root}: {lp} has {len(mt)} mt-system, {len(ref)} reference and {len(human)} human lines; "
                "they must match"
            )
        group = lp if len(testsets) == 1 else f"{testset}:{lp}"
        parts.append(JudgedPairs(mt, ref, human, [group] * len(mt)))
    return JudgedPairs.concat(parts)


def read_stsb(path: str | os.PathLike, group: str = "stsb") -> JudgedPairs:
    """STS-B CSV rows ``sentence1,sentence2,score`` (no header; a header row is skipped) as pairs.

    ``sentence1`` is the candidate and ``sentence2`` the reference.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"STS-B file {str(path)!r} does not exist")
    cands, refs, human = [], [], []
    with open(path, encoding="utf-8", newline="") as fh:
        for i, row in enumerate(csv.reader(fh), start=1):
            if not row:
                continue
            if len(row) < 3:
                raise ValueError(f"{path}:{i}: expected sentence1,sentence2,score, got {len(row)} field(s)")
            try:
                score = float(row[2])
            except ValueError:
                if i == 1:
                    continue  # header
                raise ValueError(f"{path}:{i}: expected a similarity score, got {row[2]!r}") from None
            cands.append(row[0])
            refs.append(row[1])
            human.append(score)
    if not cands:
        raise ValueError(f"{path} holds no sentence pairs")
    return JudgedPairs(cands, refs, human, [group] * len(cands))


def read_judged_tsv(path: str | os.PathLike) -> JudgedPairs:
    """Tab-separated ``candidate<TAB>reference<TAB>human score[<TAB>group]`` lines (group default ``all``)."""
    path = Path(path)
    cands, refs, human, groups = [], [], [], []
    for i, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) not in (3, 4):
            raise ValueError(f"{path}:{i}: expected cand<TAB>ref<TAB>score[<TAB>group], got {len(fields)} field(s)")
        cands.append(fields[0])
        refs.append(fields[1])
        human.extend(_floats([fields[2]], Path(f"{path}:{i}")))
        groups.append(fields[3] if len(fields) == 4 else "all")
    if not cands:
        raise ValueError(f"{path} holds no pairs")
    return JudgedPairs(cands, refs, human, groups)
