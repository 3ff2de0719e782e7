"""Files the tools write: one rule for the CLI, the scripts, the benchmarks and the translation recipe.

Every file is written **atomically** (a temporary file in the same folder, then ``os.replace``: an
interruption leaves the old file or none, never half of one), **never onto an input** of the same
call, **never over a file tracked by git** unless the caller passes ``overwrite=True`` (the user's
``--overwrite``), and **never under the repository's** ``docs/`` **folder** unless ``allow_docs=True``
(set by a caller only when the user named the path explicitly, e.g. ``--out docs``: committed results
under ``docs/`` are evidence). Each refusal is an :class:`OutputRefusedError`, one line naming the file
and the option that allows it.

``check_output`` applies the rules without writing (a command checks its outputs before computing;
``check_outputs_or_exit`` does it for a script's argparse parser, a refusal ending it in one line);
``add_overwrite_argument`` adds the ``--overwrite`` switch with the rule in its help;
``write_text`` / ``write_bytes`` / ``write_json`` / ``save_figure`` write one file; ``open_output``
yields a handle to stream into and commits on success; ``atomic_path`` yields a temporary path for
writers that take a path (``torch.save``, a CSV writer, ``savefig``); ``append_line`` adds one whole line
to a log (or nothing). A write that fails for a full disk (or any other ``OSError``) is an ``OSError`` that
names the file and says that it is as it was.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

__all__ = [
    "OVERWRITE_HELP",
    "OutputRefusedError",
    "add_overwrite_argument",
    "append_line",
    "atomic_path",
    "check_output",
    "check_outputs_or_exit",
    "is_tracked",
    "open_output",
    "save_figure",
    "write_bytes",
    "write_json",
    "write_text",
]

PathLike = str | os.PathLike
_PROJECT = Path(__file__).resolve().parents[1]  # the source checkout (its docs/ folder), when installed editable
OVERWRITE_HELP = (
    "replace an output file that git tracks (refused without it). Outputs are always written atomically "
    "(the old file or the new one, never half of one), never onto an input of the command, and never under "
    "the repository's docs/ folder unless the path is given explicitly"
)


class OutputRefusedError(ValueError):
    """A write the rules refuse: onto an input, over a git-tracked file, or into ``docs/`` unasked."""


def _existing_folder(path: Path) -> Path | None:
    """The nearest existing folder at or above ``path``'s folder (None when there is none)."""
    for folder in (path.parent, *path.parent.parents):
        if folder.is_dir():
            return folder
    return None


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess | None:
    """``git -C folder args`` (None when git is not installed)."""
    try:
        return subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


def is_tracked(path: PathLike) -> bool:
    """True when ``path`` is an existing file that git tracks (no git, or not in a repository: False)."""
    p = Path(path)
    if not p.is_file():
        return False
    done = _git(p.parent, "ls-files", "--error-unmatch", "--", p.name)
    return done is not None and done.returncode == 0


def _docs_folders(path: Path) -> list[Path]:
    """The ``docs/`` folders ``path`` could be under: its repository's (git top level) and this project's."""
    found = []
    folder = _existing_folder(path)
    if folder is not None:
        done = _git(folder, "rev-parse", "--show-toplevel")
        if done is not None and done.returncode == 0 and done.stdout.strip():
            found.append(Path(done.stdout.strip()).resolve() / "docs")
    if (_PROJECT / "pyproject.toml").is_file():
        found.append(_PROJECT / "docs")
    return found


def _same_file(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        with suppress(OSError):
            return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_output(
    path: PathLike,
    *,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Path:
    """``path`` as a Path when the rules let this call write it, else :class:`OutputRefusedError` (one line).

    ``inputs``: the files the call reads (``None`` and ``"-"`` = standard input are skipped); ``overwrite``:
    the user allowed replacing a git-tracked file; ``allow_docs``: the user named a path under ``docs/``
    explicitly; ``flag``: the option that names ``path`` (quoted in the ``docs/`` refusal).
    """
    p = Path(path)
    for source in inputs:
        if source is None or str(source) == "-":
            continue
        if _same_file(p, Path(source)):
            raise OutputRefusedError(
                f"refusing to write {p}: it is also an input of this command ({source}); write the output elsewhere"
            )
    if p.is_dir():
        raise IsADirectoryError(f"{flag} {str(p)!r} is a directory: give a file name")
    if not allow_docs:
        target = p.resolve()
        for docs in _docs_folders(p):
            if target.is_relative_to(docs):
                raise OutputRefusedError(
                    f"refusing to write {p}: it is under the repository's docs/ folder (published results), "
                    f"where files go only when asked: name that path explicitly with {flag}"
                )
    if not overwrite and is_tracked(p):
        raise OutputRefusedError(
            f"refusing to overwrite {p}: git tracks it (a committed file); pass --overwrite to replace it, "
            "or write elsewhere"
        )
    return p


def add_overwrite_argument(parser: argparse.ArgumentParser) -> None:
    """``--overwrite`` (``args.overwrite``), the one switch of the write rule, with the rule in its help."""
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


def check_outputs_or_exit(
    parser: argparse.ArgumentParser,
    paths: Iterable[PathLike],
    *,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> None:
    """:func:`check_output` for each of ``paths`` before a long run; a refusal ends the program with one line
    (``<prog>: error: ...``, exit status 2, as argparse's own errors)."""
    inputs = list(inputs)
    for path in paths:
        try:
            check_output(path, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag)
        except (OutputRefusedError, OSError) as err:
            parser.exit(2, f"{parser.prog}: error: {err}\n")


def _mode_for(target: Path) -> int:
    """The permission bits a new file gets: the replaced file's, else 0o666 minus the umask."""
    with suppress(OSError):
        return target.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextmanager
def atomic_path(
    path: PathLike,
    *,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; renamed onto ``path`` when the block ends without error,
    removed when it raises (the old file, if any, stays as it was). The rules of :func:`check_output` first;
    missing parent folders are created."""
    target = check_output(path, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as fh:  # on disk before the rename: a crash leaves the old file or the new one
            os.fsync(fh.fileno())
        os.chmod(tmp, _mode_for(target))
        os.replace(tmp, target)
    except BaseException as exc:
        with suppress(OSError):
            tmp.unlink()
        if isinstance(exc, OSError) and not isinstance(exc, OutputRefusedError) and exc.errno is not None:
            raise write_error(exc, target, "it is as it was: nothing was written") from exc
        raise


def write_error(exc: OSError, path: PathLike, state: str) -> OSError:
    """One line for a failed write of ``path``: the reason (a full disk named as such) and ``state``."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = "the disk is full (no space left on device)" if full else (exc.strerror or str(exc))
    hint = ": free space, or write elsewhere, then run again" if full else ""
    return type(exc)(exc.errno, f"cannot write {str(path)!r}: {reason}; {state}{hint}")


def append_line(path: PathLike, line: str) -> None:
    """Append ``line`` (and a newline) to the log ``path`` in one write: the line is there whole or not at all.
    A failed write (a full disk) cuts the file back to its size before and raises :func:`write_error`'s
    error; a file whose last line lacks its newline (a writer killed mid-line) gets one first."""
    data = (line.rstrip("\n") + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size:
            with open(path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            with suppress(OSError):
                os.ftruncate(fd, size)
            raise write_error(exc, path, "it is as it was") from exc
    finally:
        os.close(fd)


@contextmanager
def open_output(
    path: PathLike,
    mode: str = "w",
    *,
    encoding: str | None = "utf-8",
    newline: str | None = None,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Iterator[IO[Any]]:
    """A file handle to stream ``path``'s content into (``mode`` ``"w"`` or ``"wb"``); committed by a rename
    when the block ends, discarded when it raises."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    with atomic_path(path, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag) as tmp:
        if mode == "wb":
            with open(tmp, "wb") as fh:
                yield fh
        else:
            with open(tmp, "w", encoding=encoding, newline=newline) as fh:
                yield fh


def write_bytes(
    path: PathLike,
    data: bytes,
    *,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Path:
    """Write ``data`` to ``path`` by the rules (atomic; see the module docstring). Returns the path."""
    with open_output(path, "wb", inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag) as fh:
        fh.write(data)
    return Path(path)


def write_text(
    path: PathLike,
    text: str,
    *,
    encoding: str = "utf-8",
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Path:
    """Write ``text`` to ``path`` by the rules (atomic, line endings as given). Returns the path."""
    return write_bytes(
        path, text.encode(encoding), inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag
    )


def write_json(
    path: PathLike,
    obj: Any,
    *,
    indent: int | None = 1,
    ensure_ascii: bool = True,
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
) -> Path:
    """``obj`` as JSON (and a final newline) written to ``path`` by the rules. Returns the path."""
    text = json.dumps(obj, indent=indent, ensure_ascii=ensure_ascii) + "\n"
    return write_text(path, text, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag)


def save_figure(
    fig: Any,
    path: PathLike,
    *,
    format: str = "png",
    inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False,
    allow_docs: bool = False,
    flag: str = "the output option",
    **savefig_kwargs: Any,
) -> Path:
    """``fig.savefig`` (a matplotlib ``Figure``) to ``path`` by the rules: saved to a temporary file, then renamed."""
    with atomic_path(path, inputs=inputs, overwrite=overwrite, allow_docs=allow_docs, flag=flag) as tmp:
        fig.savefig(tmp, format=format, **savefig_kwargs)
    return Path(path)
