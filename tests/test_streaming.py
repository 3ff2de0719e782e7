"""Scoring pairs from an iterator in chunks (bounded memory) against scoring them all at once."""

from __future__ import annotations

import itertools

import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.cli import main

from .conftest import real_pairs


def test_stream_equals_score_in_input_order(minilm_encoders):
    cands, refs = real_pairs(per_lp=8, n_sts=20)
    cands[5] = ""  # an empty candidate scores 0 in its place
    scorer = BERTScorer(encoder=minilm_encoders(4))
    want = scorer.score(cands, refs)
    chunks = list(scorer.score_stream(((c, r) for c, r in zip(cands, refs)), chunk_size=7))
    assert [len(c.f1) for c in chunks] == [7] * 9 + [5]
    for k in range(3):
        torch.testing.assert_close(torch.cat([c[k] for c in chunks]), want[k], rtol=0, atol=1e-6)
    assert torch.cat([c.f1 for c in chunks])[5].item() == 0.0


def test_stream_is_lazy(tiny_scorer):
    endless = (("a cat sat", f"the cat sat {i}") for i in itertools.count())
    first = list(itertools.islice(tiny_scorer.score_stream(endless, chunk_size=4), 2))
    assert [len(c.f1) for c in first] == [4, 4]


def test_stream_idf_needs_a_fixed_table(tiny_bert_dir):
    pairs = [("a cat sat", "the cat sat"), ("a dog", "the dog ran")]
    scorer = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf=True)
    with pytest.raises(ValueError, match="fixed IDF table"):
        next(scorer.score_stream(pairs))
    scorer.set_idf_corpus(["the cat sat", "the dog ran", "a bird"])
    got = next(scorer.score_stream(pairs, chunk_size=5)).f1
    torch.testing.assert_close(got, scorer.score(*zip(*pairs))[2], rtol=0, atol=1e-6)


def test_stream_bad_items_name_the_pair(tiny_scorer):
    with pytest.raises(TypeError, match="pair 2 must be a"):
        next(tiny_scorer.score_stream([("a", "b"), ("c", "d"), "oops"], chunk_size=8))
    with pytest.raises(TypeError, match=r"chunk of pairs 2\.\.3: cands\[1\] must be str"):
        list(tiny_scorer.score_stream([("a", "b"), ("c", "d"), ("e", "f"), (None, "g")], chunk_size=2))
    with pytest.raises(ValueError, match="chunk_size"):
        next(tiny_scorer.score_stream([("a", "b")], chunk_size=0))


def test_cli_stream_equals_per_line(tiny_bert_dir, tmp_path, capsys):
    cands = ["a cat sat on the mat", "the dog barked", "", "hello"]
    refs = ["the cat sat", "a dog was barking", "nothing", "hello world"]
    (tmp_path / "c.txt").write_text("\n".join(cands) + "\n")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n")
    (tmp_path / "p.tsv").write_text("".join(f"{c}\t{r}\n" for c, r in zip(cands, refs)))
    common = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu"]
    files = ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r.txt")]
    assert main(["score", *files, "--per-line", *common]) == 0
    per_line = capsys.readouterr().out
    assert main(["score", "--stream", "--pairs", str(tmp_path / "p.tsv"), "--chunk-size", "3", *common]) == 0
    out = capsys.readouterr()
    assert out.out == per_line and len(out.out.splitlines()) == 4
    assert out.err.splitlines()[-2].startswith("4 pairs  P: ")
    assert main(["score", "--stream", *files, "--chunk-size", "2", *common]) == 0
    assert capsys.readouterr().out == per_line


def test_cli_stream_errors(tiny_bert_dir, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a\nb\nc\n")
    (tmp_path / "r.txt").write_text("a\nb\n")
    (tmp_path / "p.tsv").write_text("a\tb\nno tab here\n")
    common = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu"]
    rc = main(["score", "--stream", "-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r.txt"), *common])
    assert rc == 2 and "r.txt ended at line 2" in capsys.readouterr().err
    assert main(["score", "--stream", "--pairs", str(tmp_path / "p.tsv"), *common]) == 2
    assert "p.tsv:2: no TAB" in capsys.readouterr().err
    assert main(["score", "--stream", "--pairs", str(tmp_path / "p.tsv"), "--idf", *common]) == 2
    assert "--stream does not take --idf" in capsys.readouterr().err
