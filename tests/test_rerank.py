"""The n-best reranker against the evaluation mode (``BERTScorer.score``) and hand calculations."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from bertscore_loss import BERTScorer, BERTScoreWarning
from bertscore_loss.baseline import write_baseline
from bertscore_loss.cli import build_parser
from bertscore_loss.cli.rerank import read_tsv
from rerank import NBestReranker, generate_and_rerank
from rerank.generate import sequence_scores
from rerank.reranker import expected_utility

from .conftest import DATA, bundled_path, needs_data

SYSTEMS = DATA / "wmt17-de-en-systems"
TOL = 1e-5


def wmt17(first: int, count: int) -> tuple[list[list[str]], list[str]]:
    """Candidate lists (the 11 systems' outputs) and references of ``count`` WMT17 de-en sources."""
    files = sorted(SYSTEMS.glob("newstest2017.*.de-en"))
    assert len(files) == 11
    lines = [f.read_text(encoding="utf-8").splitlines()[first : first + count] for f in files]
    refs = (SYSTEMS / "newstest2017-deen-ref.en").read_text(encoding="utf-8").splitlines()[first : first + count]
    return [list(c) for c in zip(*lines)], refs


def oracle_reference(scorer: BERTScorer, cands: list[list[str]], refs: list, measure: int = 2) -> list[torch.Tensor]:
    """Each source's candidate scores from ``scorer.score`` over all (candidate, reference) pairs."""
    flat_c = [c for cl in cands for c in cl]
    flat_r = [refs[s] for s, cl in enumerate(cands) for _ in cl]
    scores = scorer.score(flat_c, flat_r)[measure].double()
    return list(torch.split(scores, [len(c) for c in cands]))


def oracle_mbr(scorer: BERTScorer, cands: list[list[str]], include_self: bool = False) -> list[torch.Tensor]:
    """Each source's uniform MBR expected F from ``scorer.score`` over all (i, j) pairs (j != i unless include_self)."""
    hyp, ref, size = [], [], []
    for cl in cands:
        n = len(cl)
        for i in range(n):
            js = [j for j in range(n) if include_self or j != i or n == 1]
            hyp += [cl[i]] * len(js)
            ref += [cl[j] for j in js]
            size.append(len(js))
    f = scorer.score(hyp, ref)[2].double()
    means = torch.stack([x.mean() for x in torch.split(f, size)])
    return list(torch.split(means, [len(c) for c in cands]))


def assert_choice(result, oracle: torch.Tensor, texts: list[str]) -> None:
    """``result`` picks the oracle's argmax (up to float noise between different texts), a text's lowest index."""
    best = int(result.best_index)
    top = float(oracle.max())
    assert float(oracle[best]) >= top - 1e-6
    rivals = [i for i in range(len(texts)) if texts[i].strip() != texts[best].strip() and float(oracle[i]) > top - TOL]
    if not rivals:  # a clear winner: exactly the oracle's (lowest-index) argmax
        assert best == int(torch.nonzero(oracle >= top - 1e-6)[0])
    assert best == min(i for i in range(len(texts)) if texts[i].strip() == texts[best].strip())


def ranked_order(scores: list[float]) -> list[int]:
    """Indices best-first, ties lowest index first (the documented order)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


# --- real model, real data --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def minilm() -> BERTScorer:
    return BERTScorer(layer=4, device="cpu")


@needs_data
@pytest.mark.slow
def test_reference_choices_are_the_eval_mode_argmax(minilm):
    cands, refs = wmt17(0, 40)
    results = NBestReranker(scorer=minilm).rerank(cands, refs, return_utility=True)
    oracle = oracle_reference(minilm, cands, refs)
    for res, orc, cl in zip(results, oracle, cands):
        assert_choice(res, orc, cl)
        mine = torch.tensor(res.bertscore, dtype=torch.float64)
        assert torch.allclose(mine, orc[res.indices], atol=TOL)
        assert torch.allclose(res.utility[:, 0].double(), orc, atol=TOL)
        assert (orc[res.indices].diff() <= 1e-6).all()  # best-first
    # not all sources pick the same system: the test has teeth
    assert len({r.best_index for r in results}) >= 4


@needs_data
@pytest.mark.slow
def test_mbr_choices_are_the_eval_mode_argmax(minilm):
    cands, _ = wmt17(100, 30)
    reranker = NBestReranker(scorer=minilm)
    for include_self in (False, True):
        results = reranker.rerank(cands, include_self=include_self)
        oracle = oracle_mbr(minilm, cands, include_self)
        for res, orc, cl in zip(results, oracle, cands):
            assert_choice(res, orc, cl)
            assert torch.allclose(torch.tensor(res.bertscore, dtype=torch.float64), orc[res.indices], atol=TOL)
        assert len({r.best_index for r in results}) >= 4


@needs_data
@pytest.mark.slow
def test_idf_and_rescale_follow_the_eval_mode(minilm, tmp_path):
    cands, refs = wmt17(200, 12)
    write_baseline(tmp_path / "base.tsv", {4: (0.80, 0.78, 0.79)})
    kw = dict(
        layer=4, device="cpu", idf=True, rescale=True, baseline=str(tmp_path / "base.tsv"), encoder=minilm.encoder
    )
    # IDF over the references of the call (each source's once) == a scorer whose IDF corpus is those references
    got = NBestReranker(**kw).rerank(cands, refs, return_utility=True)
    oracle = oracle_reference(BERTScorer(idf_corpus=refs, **kw), cands, refs)
    for res, orc, cl in zip(got, oracle, cands):
        assert_choice(res, orc, cl)
        assert torch.allclose(res.utility[:, 0].double(), orc, atol=TOL)
    assert min(min(r.bertscore) for r in got) < 0.5  # rescaled values, not raw F (all > 0.8 here)
    # MBR with IDF over the pseudo-references of the call (all candidates, duplicates counted)
    flat = [c for cl in cands for c in cl]
    got = NBestReranker(layer=4, device="cpu", idf=True, encoder=minilm.encoder).rerank(cands, return_utility=True)
    oracle = oracle_mbr(BERTScorer(layer=4, idf=True, idf_corpus=flat, encoder=minilm.encoder), cands)
    for res, orc, cl in zip(got, oracle, cands):
        assert_choice(res, orc, cl)


@pytest.mark.slow
def test_mbr_picks_the_consensus_candidate(minilm):
    # samples of a translation: the majority reading twice, a close variant, two unrelated outliers
    cands = [
        "stock markets fell sharply on monday",
        "the cat sat on the mat",
        "it will rain in paris tomorrow",
        "a cat was sitting on the mat",
        "the cat sat on the mat",
    ]
    res = NBestReranker(scorer=minilm).rerank([cands, cands[::-1]])
    assert res[0].best_index == 1 and res[1].best_index == 0
    assert set(res[0].indices[-2:]) == {0, 2}  # the outliers come last
    assert res[0].indices[:3] == [1, 4, 3]
    # without the duplicate, the close variant and the majority reading support each other
    res = NBestReranker(scorer=minilm).rerank([cands[:4]])[0]
    assert set(res.indices[:2]) == {1, 3} and set(res.indices[2:]) == {0, 2}


# --- tiny random model: exact properties -------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tiny_scorer) -> NBestReranker:
    return NBestReranker(scorer=tiny_scorer)


def test_exact_copy_of_the_reference_wins(tiny):
    cands = [["the dog sat", "a cat sat on a mat", "the cat sat on the mat", "cats sit"]]
    res = tiny.rerank(cands, ["the cat sat on the mat"])[0]
    assert res.best_index == 2 and res.best == "the cat sat on the mat"
    assert res.bertscore[0] == pytest.approx(1.0, abs=1e-6)
    assert all(s < 1.0 - 1e-4 for s in res.bertscore[1:])
    for measure in ("precision", "recall"):
        assert tiny.rerank(cands, ["the cat sat on the mat"], measure=measure)[0].best_index == 2


def test_ragged_lists_equal_each_source_alone_and_the_eval_mode(tiny, tiny_scorer):
    cands = [
        ["a cat sat", "the cat sat on the mat", "dogs bark"],
        ["hello"],
        ["one two three", "one two", "three", "two three one", "one"],
        ["red green", "green blue"],
    ]
    refs = ["the cat sat", "hello world", "one two three", ["blue green", "red"]]
    together = tiny.rerank(cands, refs)
    oracle = oracle_reference(tiny_scorer, cands[:3], refs[:3])
    p, r, f = tiny_scorer.score(cands[3], [refs[3]] * 2)
    oracle.append(f.double())
    for s, res in enumerate(together):
        alone = tiny.rerank([cands[s]], [refs[s]])[0]
        assert alone.indices == res.indices
        assert alone.bertscore == pytest.approx(res.bertscore, abs=1e-6)
        assert_choice(res, oracle[s], cands[s])
        assert res.bertscore == pytest.approx(oracle[s][res.indices].tolist(), abs=TOL)
    mbr = tiny.rerank(cands)
    for s, (res, orc) in enumerate(zip(mbr, oracle_mbr(tiny_scorer, cands))):
        assert res.bertscore == pytest.approx(orc[res.indices].tolist(), abs=TOL)
        assert_choice(res, orc, cands[s])


def test_single_candidate(tiny, tiny_scorer):
    res = tiny.rerank([["just one"]], ["one just"])[0]
    assert res.best_index == 0 and res.indices == [0] and res.best == "just one"
    assert res.bertscore[0] == pytest.approx(tiny_scorer.score(["just one"], ["one just"])[2].item(), abs=TOL)
    mbr = tiny.rerank([["just one"], ["a", "b"]])
    assert mbr[0].best_index == 0 and mbr[0].bertscore[0] == pytest.approx(1.0, abs=1e-6)  # U[0, 0]


def test_ties_go_to_the_lowest_index(tiny):
    cands = [["zebra crossing", "a cat sat", "nothing here", "a cat sat", " a cat sat "]]
    res = tiny.rerank(cands, ["a cat sat"])[0]
    assert res.indices[:3] == [1, 3, 4] and res.best_index == 1
    assert res.bertscore[0] == res.bertscore[1] == res.bertscore[2]
    mbr = tiny.rerank([["the cat", "a dog", "a dog", "the bird", "a dog"]])[0]
    assert mbr.best_index == 1 and mbr.indices[:3] == [1, 2, 4]
    assert mbr.bertscore[0] == mbr.bertscore[1] == mbr.bertscore[2]  # bitwise identical expected utilities
    # two candidates: U is symmetric, so MBR always ties and keeps the first
    assert tiny.rerank([["b c d", "a"], ["a", "b c d"]], include_self=False)[0].best_index == 0
    assert tiny.rerank([["a", "b c d"]])[0].best_index == 0
    # equal model scores and weight 1: the input order
    assert tiny.rerank([["x", "y", "z"]], ["y"], model_scores=[[0.5, 0.5, 0.5]], weight=1.0)[0].indices == [0, 1, 2]


def test_empty_candidates_score_zero(tiny):
    with pytest.warns(BERTScoreWarning, match="2 empty candidate"):
        res = tiny.rerank([["", "a cat", "   "]], ["a cat sat"], return_utility=True)[0]
    assert res.best_index == 1
    by_index = dict(zip(res.indices, res.bertscore))
    assert by_index[0] == 0.0 and by_index[2] == 0.0
    with pytest.warns(BERTScoreWarning):
        mbr = tiny.rerank([["", "a cat", "a cat sat"]], return_utility=True)[0]
    assert mbr.utility[0].tolist() == [0.0, 0.0, 0.0] and mbr.utility[:, 0].tolist() == [0.0, 0.0, 0.0]
    assert dict(zip(mbr.indices, mbr.bertscore))[0] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tiny.rerank([["a cat"]], ["a cat"])


def test_mbr_expectations_by_hand(tiny, tiny_scorer):
    cands = ["one two three", "one two", "two three four", "five"]
    lp = [-0.5, -1.0, -2.0, -0.1]
    u = torch.tensor(
        [[tiny_scorer.score([a], [b])[2].item() for b in cands] for a in cands], dtype=torch.float64
    )  # U[i, j] by the evaluation mode
    res = tiny.rerank([cands], model_scores=[lp], return_utility=True)[0]
    assert torch.allclose(res.utility.double(), u, atol=TOL)
    uniform = (u.sum(1) - u.diagonal()) / 3
    assert res.bertscore == pytest.approx(uniform[res.indices].tolist(), abs=TOL)
    for temp in (1.0, 0.5):
        w = torch.softmax(torch.tensor(lp, dtype=torch.float64) / temp, 0)
        off = 1 - torch.eye(4, dtype=torch.float64)
        want = (u * w * off).sum(1) / (w * off).sum(1)
        got = tiny.rerank([cands], model_scores=[lp], expectation="model", temperature=temp)[0]
        assert got.bertscore == pytest.approx(want[got.indices].tolist(), abs=TOL)
        got_self = tiny.rerank([cands], model_scores=[lp], expectation="model", temperature=temp, include_self=True)[0]
        assert got_self.bertscore == pytest.approx((u @ w)[got_self.indices].tolist(), abs=TOL)
    # separate pseudo-references (e.g. samples), weighted by their own scores
    pseudo = ["one two", "three four", "one two three four"]
    ps = [-1.0, -3.0, -0.2]
    up = torch.tensor([[tiny_scorer.score([a], [b])[2].item() for b in pseudo] for a in cands], dtype=torch.float64)
    w = torch.softmax(torch.tensor(ps, dtype=torch.float64), 0)
    got = tiny.rerank([cands], pseudo_references=[pseudo], pseudo_scores=[ps], expectation="model")[0]
    assert got.bertscore == pytest.approx((up @ w)[got.indices].tolist(), abs=TOL)
    got = tiny.rerank([cands], pseudo_references=[pseudo], return_utility=True)[0]
    assert torch.allclose(got.utility.double(), up, atol=TOL)
    assert got.bertscore == pytest.approx(up.mean(1)[got.indices].tolist(), abs=TOL)


def test_interpolation_with_model_scores(tiny, tiny_scorer):
    cands = ["a cat sat on the mat", "the cat sat", "dogs"]
    lp = [-3.0, -0.2, -0.1]
    f = tiny_scorer.score(cands, ["the cat sat on the mat"] * 3)[2].double()
    for w in (0.0, 0.3, 1.0):
        res = tiny.rerank([cands], ["the cat sat on the mat"], model_scores=[lp], weight=w)[0]
        want = (1 - w) * f + w * torch.tensor(lp, dtype=torch.float64)
        assert res.scores == pytest.approx(want[res.indices].tolist(), abs=TOL)
        assert res.indices == ranked_order(want.tolist())
        assert res.model_scores == [lp[i] for i in res.indices]
    assert tiny.rerank([cands], ["x"], model_scores=[lp], weight=1.0)[0].best_index == 2


@pytest.mark.slow
def test_tiles_and_chunks_give_the_same_scores(tiny_scorer):
    cands = [["a b c d e f", "a b", "c d e", "f"] * 3, ["x y", "y z", "z"], ["the cat sat on the mat"] * 2]
    base = NBestReranker(scorer=tiny_scorer).rerank(cands, return_utility=True)
    for budget in (1, 50, 700):
        small = BERTScorer(model=tiny_scorer.config.model, layer=2, device="cpu", max_elements=budget)
        small.encoder = tiny_scorer.encoder
        got = NBestReranker(scorer=small).rerank(cands, return_utility=True)
        for a, b in zip(base, got):
            assert torch.allclose(a.utility, b.utility, atol=1e-6)
            assert a.indices == b.indices


def test_each_unique_sentence_is_encoded_once(tiny, monkeypatch):
    calls = []
    real = tiny.scorer.encoder.embed_texts

    def spy(texts, **kw):
        calls.append(list(texts))
        return real(texts, **kw)

    monkeypatch.setattr(tiny.scorer.encoder, "embed_texts", spy)
    tiny.rerank([["a cat", "a dog ", "a cat"], ["a dog", "a bird"]], ["a cat", ["a bird", "a cat"]])
    assert calls == [["a cat", "a dog", "a bird"]]


def test_bad_input_is_a_clear_error(tiny):
    with pytest.raises(ValueError, match=r"candidates\[1\] is an empty list"):
        tiny.rerank([["a"], []])
    with pytest.raises(TypeError, match=r"candidates\[0\] must be a list of str, got a str"):
        tiny.rerank(["a", "b"])
    with pytest.raises(TypeError, match=r"candidates\[0\]\[1\] must be str"):
        tiny.rerank([["a", 3]])
    with pytest.raises(ValueError, match="2 candidates but 1 references"):
        tiny.rerank([["a"], ["b"]], ["a"])
    with pytest.raises(ValueError, match=r"model_scores\[0\] has 1 scores but source 0 has 2"):
        tiny.rerank([["a", "b"]], ["a"], model_scores=[[0.1]])
    with pytest.raises(ValueError, match="pass model_scores"):
        tiny.rerank([["a", "b"]], ["a"], weight=0.5)
    with pytest.raises(ValueError, match="weight must lie in"):
        tiny.rerank([["a", "b"]], ["a"], model_scores=[[0.0, 0.0]], weight=1.5)
    with pytest.raises(ValueError, match=r"model_scores\[0\] holds NaN"):
        tiny.rerank([["a", "b"]], ["a"], model_scores=[[0.0, math.nan]])
    with pytest.raises(ValueError, match="not both"):
        tiny.rerank([["a", "b"]], ["a"], pseudo_references=[["c"]])
    with pytest.raises(ValueError, match='expectation="model".*pass model_scores'):
        tiny.rerank([["a", "b"]], expectation="model")
    with pytest.raises(ValueError, match="measure must be"):
        tiny.rerank([["a", "b"]], measure="g")
    with pytest.raises(ValueError, match="not both"):
        NBestReranker(scorer=tiny.scorer, layer=2)
    assert tiny.rerank([]) == []


def test_expected_utility_alone_row_uses_the_diagonal():
    u = torch.tensor([[0.7]])
    assert expected_utility(u, None, exclude_diagonal=True).tolist() == pytest.approx([0.7])
    u = torch.tensor([[1.0, 0.2], [0.2, 1.0]])
    got = expected_utility(u, torch.tensor([0.0, -math.inf]), exclude_diagonal=True)
    assert got.tolist() == pytest.approx([1.0, 0.2])  # row 0's only other column has weight 0: U[0, 0]


# --- CLI --------------------------------------------------------------------------------------------------
def run_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(["rerank", *argv])  # the real parser; errors raise (main() prints them)
    return args.func(args)


def test_cli_systems_prints_the_chosen_lines_in_order(tiny_bert_dir, tiny, tmp_path, capsys):
    systems = [
        ["the cat sat on the mat", "hello", "a b c"],
        ["a cat sat", "hello world", ""],
        ["cats", "hello there world", "a b c d"],
    ]
    refs = ["the cat sat on the mat", "hello world", "a b c d"]
    files = []
    for k, lines in enumerate(systems):
        files.append(tmp_path / f"sys{k}.txt")
        files[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    common = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu", "--systems", *map(str, files)]
    cands = [list(c) for c in zip(*systems)]
    with pytest.warns(BERTScoreWarning):
        assert run_cli([*common, "-r", str(tmp_path / "ref.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == ["the cat sat on the mat", "hello world", "a b c d"]
    with pytest.warns(BERTScoreWarning):
        assert run_cli([*common, "-r", str(tmp_path / "ref.txt"), "--print", "index"]) == 0
    assert capsys.readouterr().out.splitlines() == ["0", "1", "2"]
    with pytest.warns(BERTScoreWarning):
        want = [r.best_index for r in tiny.rerank(cands)]
        assert run_cli([*common, "--mbr", "--print", "index"]) == 0
    assert capsys.readouterr().out.splitlines() == [str(i) for i in want]


def test_cli_tsv_input(tiny_bert_dir, tiny, tmp_path, capsys):
    rows = [
        ("s2", "hello world"),
        ("s1", "a cat"),
        ("s2", "hello"),
        ("s1", "the cat sat on the mat"),
        ("s1", "dogs"),
        ("s3", "only one"),
    ]
    tsv = tmp_path / "nbest.tsv"
    tsv.write_text("".join(f"{a}\t{b}\n" for a, b in rows), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("hello world\nthe cat sat on the mat\nonly\n", encoding="utf-8")
    ids, cands, scores = read_tsv(str(tsv))
    assert ids == ["s2", "s1", "s3"] and cands[1] == ["a cat", "the cat sat on the mat", "dogs"] and scores is None
    common = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu", "--tsv", str(tsv)]
    assert run_cli([*common, "-r", str(tmp_path / "ref.txt")]) == 0
    assert capsys.readouterr().out.splitlines() == ["hello world", "the cat sat on the mat", "only one"]
    want = tiny.rerank(cands)
    assert run_cli([*common, "--mbr", "--print", "index", "--with-score"]) == 0
    out = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [int(o[0]) for o in out] == [r.best_index for r in want]
    assert [float(o[1]) for o in out] == pytest.approx([r.scores[0] for r in want], abs=1e-6)


def test_cli_tsv_model_scores_and_weight(tiny_bert_dir, tmp_path, capsys):
    tsv = tmp_path / "nbest.tsv"
    tsv.write_text("a\tthe cat\t-0.1\na\tthe cat sat\t-5\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text("the cat sat\n", encoding="utf-8")
    common = [
        "--model",
        tiny_bert_dir,
        "--layer",
        "2",
        "--device",
        "cpu",
        "--tsv",
        str(tsv),
        "-r",
        str(tmp_path / "ref.txt"),
    ]
    assert run_cli(common) == 0
    assert capsys.readouterr().out == "the cat sat\n"
    assert run_cli([*common, "--weight", "1"]) == 0
    assert capsys.readouterr().out == "the cat\n"


def test_cli_errors(tiny_bert_dir, tmp_path):
    (tmp_path / "a.txt").write_text("x\ny\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("x\n", encoding="utf-8")
    (tmp_path / "bad.tsv").write_text("s1\tok\nno tab here\n", encoding="utf-8")
    base = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu"]
    with pytest.raises(ValueError, match="has 2 lines but .*b.txt has 1"):
        run_cli([*base, "--systems", str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), "--mbr"])
    with pytest.raises(ValueError, match=r"bad.tsv:2: expected source_id<TAB>candidate"):
        run_cli([*base, "--tsv", str(tmp_path / "bad.tsv"), "--mbr"])
    with pytest.raises(ValueError, match="-r REFS .* or --mbr"):
        run_cli([*base, "--systems", str(tmp_path / "a.txt")])
    with pytest.raises(ValueError, match="2 sources but .*b.txt has 1"):
        run_cli([*base, "--systems", str(tmp_path / "a.txt"), "-r", str(tmp_path / "b.txt")])
    with pytest.raises(ValueError, match="--weight needs model scores"):
        run_cli([*base, "--systems", str(tmp_path / "a.txt"), "--mbr", "--weight", "0.5"])


# --- Hugging Face generate ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bert_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bundled_path())


@pytest.fixture(scope="module")
def tiny_bart():
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    cfg = BartConfig(
        vocab_size=30522,
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
        pad_token_id=0,
        bos_token_id=101,
        eos_token_id=102,
        decoder_start_token_id=101,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(cfg).eval()


@pytest.fixture(scope="module")
def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=30522, n_embd=16, n_layer=1, n_head=2, n_positions=64, bos_token_id=101, eos_token_id=102
    )
    return GPT2LMHeadModel(cfg).eval()


def encode(tokenizer, prompts: list[str]) -> dict:
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def teacher_forced(model, batch: dict, gen: torch.Tensor, n: int, eos: int) -> torch.Tensor:
    """Mean log-probability of each sequence ``gen`` ``[B·n, T]`` (up to and including EOS), by a forward pass."""
    rep = {k: v.repeat_interleave(n, 0) for k, v in batch.items()}
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            dec = torch.cat([torch.full((gen.shape[0], 1), model.config.decoder_start_token_id), gen], 1)
            logits = model(**rep, decoder_input_ids=dec[:, :-1]).logits
        else:
            ids = torch.cat([rep["input_ids"], gen], 1)
            logits = model(input_ids=ids[:, :-1]).logits[:, rep["input_ids"].shape[1] - 1 :]
    logp = torch.log_softmax(logits.float(), -1).gather(2, gen.unsqueeze(2)).squeeze(2)
    is_eos = gen == eos
    valid = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
    return (logp * valid).sum(1) / valid.sum(1)


@pytest.mark.parametrize("kind", ["bart", "gpt2"])
def test_generate_sampling_scores_decoding_and_choice(kind, tiny_bart, tiny_gpt2, bert_tokenizer, tiny):
    model = tiny_bart if kind == "bart" else tiny_gpt2
    prompts = ["the cat sat on the mat", "a dog ran in the park"]  # same token count: no padding for GPT-2
    n = 5
    kwargs = dict(do_sample=True, max_new_tokens=6, top_k=0)
    torch.manual_seed(1)
    out = generate_and_rerank(model, bert_tokenizer, prompts, tiny, num_return_sequences=n, **kwargs)
    # the same samples again, by hand
    batch = encode(bert_tokenizer, prompts)
    torch.manual_seed(1)
    raw = model.generate(
        **batch, num_return_sequences=n, return_dict_in_generate=True, output_scores=True, pad_token_id=0, **kwargs
    )
    gen = raw.sequences[:, -len(raw.scores) :]
    texts = [t.strip() for t in bert_tokenizer.batch_decode(gen, skip_special_tokens=True)]
    assert [c for cl in out.candidates for c in cl] == texts
    assert all("the cat sat on the mat" not in c for c in texts) or kind == "bart"
    want = teacher_forced(model, batch, gen, n, eos=102)
    got = torch.tensor([s for sl in out.model_scores for s in sl])
    assert torch.allclose(got, want, atol=1e-4)
    expect = tiny.rerank(out.candidates, model_scores=out.model_scores)
    assert out.texts == [r.best for r in expect]
    assert [r.indices for r in out.results] == [r.indices for r in expect]


def test_generate_beam_search_and_references(tiny_bart, bert_tokenizer, tiny):
    prompts = ["the cat sat on the mat", "hello"]
    n = 4
    out = generate_and_rerank(
        tiny_bart,
        bert_tokenizer,
        prompts,
        tiny,
        num_return_sequences=n,
        references=["a cat", "hello world"],
        weight=0.5,
        num_beams=n,
        max_new_tokens=5,
    )
    batch = encode(bert_tokenizer, prompts)
    raw = tiny_bart.generate(
        **batch, num_beams=n, num_return_sequences=n, max_new_tokens=5, return_dict_in_generate=True, output_scores=True
    )
    gen = raw.sequences[:, 1:]
    # beam scores are the mean log-probability per generated token (length_penalty 1), by a forward pass
    assert torch.allclose(
        sequence_scores(tiny_bart, raw, [102]), teacher_forced(tiny_bart, batch, gen, n, 102), atol=1e-4
    )
    assert torch.allclose(torch.tensor(out.model_scores).view(-1), raw.sequences_scores, atol=1e-6)
    expect = tiny.rerank(out.candidates, ["a cat", "hello world"], model_scores=out.model_scores, weight=0.5)
    assert out.texts == [r.best for r in expect]
    with pytest.raises(ValueError, match="mbr=True"):
        generate_and_rerank(tiny_bart, bert_tokenizer, prompts, tiny, references=["a", "b"], mbr=True)
    with pytest.raises(ValueError, match="2 inputs but 1 references"):
        generate_and_rerank(tiny_bart, bert_tokenizer, prompts, tiny, references=["a"], max_new_tokens=2)


def test_generate_causal_lm_with_left_padding(tiny_gpt2, bert_tokenizer, tiny):
    prompts = ["a much longer prompt with many words in it", "short"]
    kwargs = dict(do_sample=True, max_new_tokens=4)
    torch.manual_seed(2)
    out = generate_and_rerank(tiny_gpt2, bert_tokenizer, prompts, tiny, num_return_sequences=3, **kwargs)
    assert bert_tokenizer.padding_side == "right"  # restored
    bert_tokenizer.padding_side = "left"
    try:
        batch = encode(bert_tokenizer, prompts)
    finally:
        bert_tokenizer.padding_side = "right"
    torch.manual_seed(2)
    raw = tiny_gpt2.generate(
        **batch, num_return_sequences=3, return_dict_in_generate=True, output_scores=True, pad_token_id=0, **kwargs
    )
    gen = raw.sequences[:, batch["input_ids"].shape[1] :]
    texts = [t.strip() for t in bert_tokenizer.batch_decode(gen, skip_special_tokens=True)]
    assert [c for cl in out.candidates for c in cl] == texts
    assert not any("longer prompt" in t for t in texts)
    # scored under the left-padded prompt: positions and attention as generate saw them
    rep = {k: v.repeat_interleave(3, 0) for k, v in batch.items()}
    ids = torch.cat([rep["input_ids"], gen], 1)
    mask = torch.cat([rep["attention_mask"], torch.ones_like(gen)], 1)
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    with torch.no_grad():
        logits = tiny_gpt2(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    logits = logits[:, rep["input_ids"].shape[1] - 1 : -1]
    logp = torch.log_softmax(logits.float(), -1).gather(2, gen.unsqueeze(2)).squeeze(2)
    is_eos = gen == 102
    valid = (torch.cumsum(is_eos.long(), 1) - is_eos.long()) == 0
    want = (logp * valid).sum(1) / valid.sum(1)
    assert torch.allclose(torch.tensor(out.model_scores).view(-1), want, atol=1e-4)
