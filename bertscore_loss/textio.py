"""Reading text inputs: lines end at ``\\n`` (or ``\\r\\n``) only, UTF-8 errors name the file and line.

``str.splitlines()`` also splits at U+2028/U+2029, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85`` and
a lone ``\\r``, which would shift every following line of a file against its partner file; nothing in
this package uses it on user text.
"""

from __future__ import annotations

import csv
import io
import os
import stat
import sys
from collections.abc import Generator, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

BOM = "\ufeff"


def check_input_file(path: str | os.PathLike, what: str = "input") -> Path:
    """``path`` as a Path when it can be read as a stream of lines: a file, a FIFO, a pipe or a character
    device (``/dev/stdin``, ``/dev/fd/N`` of a process substitution, ``/dev/null``). Checked with ``stat``
    only, so a pipe is not consumed. An error naming it (and ``what`` it is) otherwise: FileNotFoundError
    (missing, or a link to nothing), IsADirectoryError, PermissionError (a folder on the way not searchable),
    OSError for the rest."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            target = os.readlink(p)
            raise FileNotFoundError(f"{what} {str(p)!r} is a link to {target!r}, which does not exist") from None
        raise FileNotFoundError(f"{what} {str(p)!r} does not exist") from None
    except PermissionError:
        raise PermissionError(f"{what} {str(p)!r} cannot be reached: a folder of its path is not searchable") from None
    except OSError as exc:
        raise OSError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{what} {str(p)!r} is a directory, not a file")
    if stat.S_ISSOCK(st.st_mode):
        raise OSError(f"{what} {str(p)!r} is a socket: give a file, a pipe or '-' (standard input)")
    return p


def open_input(path: str | os.PathLike, what: str = "input") -> BinaryIO:
    """``path`` (see :func:`check_input_file`) opened for binary reading; an unreadable one is a
    PermissionError / OSError naming it, never a bare traceback."""
    p = check_input_file(path, what)
    try:
        return open(p, "rb")
    except PermissionError:
        raise PermissionError(f"{what} {str(p)!r} cannot be read: permission denied") from None
    except IsADirectoryError:
        raise IsADirectoryError(f"{what} {str(p)!r} is a directory, not a file") from None
    except OSError as exc:
        raise OSError(f"{what} {str(p)!r} cannot be read: {exc.strerror}") from None


def _decode(raw: bytes, where: str, line_no: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where}:{line_no}: not valid UTF-8 (byte {exc.start} of the line)") from None


def iter_lines(source: str | os.PathLike | io.BufferedIOBase, *, what: str = "input") -> Generator[str, None, None]:
    """Lines of a UTF-8 file (``"-"`` = standard input) without their ending, read lazily: a pipe, a FIFO or
    a process substitution (``/dev/fd/N``) streams; ``/dev/null`` gives no line.

    Lines end at ``\\n`` or ``\\r\\n`` only; a UTF-8 BOM at the start is dropped; invalid UTF-8 is a
    ValueError naming the file and line.
    """
    if isinstance(source, (str, os.PathLike)):
        name = str(source)
        if name == "-":
            yield from _iter_binary(sys.stdin.buffer, "<stdin>")
            return
        with open_input(source, what) as fh:
            yield from _iter_binary(fh, name)
    else:
        yield from _iter_binary(source, getattr(source, "name", "<stream>"))


def _iter_binary(fh: Iterable[bytes], where: str) -> Iterator[str]:
    for n, raw in enumerate(fh, start=1):
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        line = _decode(raw, where, n)
        if n == 1 and line.startswith(BOM):
            line = line[1:]
        yield line


def read_lines(path: str | os.PathLike, *, what: str = "input") -> list[str]:
    """All lines of a UTF-8 file (``"-"`` = standard input); see :func:`iter_lines`."""
    return list(iter_lines(path, what=what))


def read_csv_rows(path: str | os.PathLike, *, what: str = "CSV file") -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of a UTF-8 CSV file (a BOM is dropped); errors name the file."""
    try:
        with io.TextIOWrapper(open_input(path, what), encoding="utf-8-sig", newline="") as fh:
            yield from enumerate(csv.reader(fh), start=1)
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _csv_sentences(path: Path, what: str) -> list[str]:
    """Both sentences of each STS-B row ``sentence1,sentence2,score`` (a header row is skipped)."""
    out = []
    for i, row in read_csv_rows(path, what=what):
        if len(row) < 2:
            if row:
                raise ValueError(f"{path}:{i}: expected sentence1,sentence2,score, got {len(row)} field(s)")
            continue
        if i == 1 and len(row) > 2:
            try:
                float(row[2])
            except ValueError:
                continue  # header
        out += row[:2]
    return out


def read_corpus(
    paths: str | os.PathLike | Sequence[str | os.PathLike], *, distinct: bool = True, what: str = "corpus file"
) -> list[str]:
    """Sentences of one or several files: ``*.csv`` files as STS-B rows (both sentences of each row),
    other files one sentence per line (:func:`iter_lines`).

    ``distinct=True`` (baselines): the distinct non-empty stripped sentences in order of first
    appearance. ``distinct=False`` (IDF corpora, where duplicates count): every line as it is.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    if not paths:
        raise ValueError("the corpus is empty: give at least one file")
    texts: list[str] = []
    for p in paths:
        path = Path(p)
        texts += _csv_sentences(path, what) if path.suffix.lower() == ".csv" else read_lines(path, what=what)
    if not distinct:
        return texts
    seen: dict[str, None] = {}
    for t in texts:
        t = t.strip()
        if t:
            seen.setdefault(t, None)
    return list(seen)
