"""The utility registry and the MBR methods against brute-force loops, sacrebleu and the evaluation mode."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
import sacrebleu
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.cli import build_parser
from rerank import NBestReranker, get_utility, mbr, register_utility
from rerank.bertscore_utility import BERTScoreUtility
from rerank.mbr import Aggregate, AggregateExact, Exact, Prune, agreement, gain_share, get_method
from rerank.ngram_utility import BLEU, ChrF
from rerank.registry import UTILITIES
from rerank.utility import CallableUtility

TOL = 1e-5
WORDS = "a man in a red shirt is riding a bike down the street . two dogs play in the snow ( ) , The Man".split()


def random_texts(count: int, seed: int, empty: bool = True) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        k = rng.choice([0, 1, 2, 3, 5, 8, 12] if empty else [2, 3, 5, 8, 12])
        out.append(" ".join(rng.choice(WORDS) for _ in range(k)) + rng.choice(["", " ", "."]))
    return out


def sacre_matrix(hyps: list[str], refs: list[str], metric) -> torch.Tensor:
    return torch.tensor([[metric.sentence_score(h, [r]).score for r in refs] for h in hyps], dtype=torch.float64)


def brute_expectation(u: torch.Tensor, w: torch.Tensor, exclude_self: bool) -> torch.Tensor:
    """E[i] = sum_j w_j U[i, j] / sum_j w_j over j (!= i when ``exclude_self``; U[i, i] when i is alone)."""
    n, m = u.shape
    out = []
    for i in range(n):
        js = [j for j in range(m) if not (exclude_self and j == i)]
        den = sum(float(w[j]) for j in js)
        out.append(sum(float(w[j] * u[i, j]) for j in js) / den if den > 1e-12 else float(u[i, i]))
    return torch.tensor(out, dtype=torch.float64)


# --- utilities ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options", [{}, {"word_order": 2}, {"beta": 1, "lowercase": True}, {"eps_smoothing": True}, {"whitespace": True}]
)
def test_chrf_equals_sacrebleu_sentence_chrf(options):
    hyps, refs = random_texts(15, 0), random_texts(12, 1)
    got = ChrF(**options)(hyps, refs)
    assert torch.allclose(got, sacre_matrix(hyps, refs, sacrebleu.CHRF(**options)), atol=1e-9)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"smooth_method": "floor"},
        {"smooth_method": "add-k"},
        {"smooth_method": "none"},
        {"lowercase": True},
        {"smooth_method": "floor", "smooth_value": 0.3},
    ],
)
def test_bleu_equals_sacrebleu_sentence_bleu(options):
    hyps, refs = random_texts(15, 2), random_texts(12, 3)
    want = torch.tensor(
        [[sacrebleu.sentence_bleu(h, [r], **options).score for r in refs] for h in hyps], dtype=torch.float64
    )
    assert torch.allclose(BLEU(**options)(hyps, refs), want, atol=1e-9)


def test_bleu_without_effective_order():
    hyps, refs = random_texts(10, 4), random_texts(8, 5)
    metric = sacrebleu.BLEU(effective_order=False)
    assert torch.allclose(BLEU(effective_order=False)(hyps, refs), sacre_matrix(hyps, refs, metric), atol=1e-9)


def fractional_stats(hyp: list[Counter], refs: list[list[Counter]], w: list[float]) -> list[tuple[float, float, float]]:
    """Per order (hypothesis total, mean reference total, sum_g min(count_h, mean count_r)) by plain loops."""
    out = []
    for o in range(len(hyp)):
        mean: Counter = Counter()
        for r, wj in zip(refs, w):
            for g, c in r[o].items():
                mean[g] += wj * c
        ref_total = sum(wj * sum(r[o].values()) for r, wj in zip(refs, w))
        match = sum(min(c, mean[g]) for g, c in hyp[o].items())
        out.append((float(sum(hyp[o].values())), ref_total, match))
    return out


def test_chrf_aggregation_averages_ngram_counts():
    hyps, refs = random_texts(9, 6), random_texts(7, 7, empty=False)
    w = torch.softmax(torch.randn(7, generator=torch.Generator().manual_seed(0), dtype=torch.float64), 0)
    util = ChrF()
    got = util.session([hyps], [refs]).aggregate([0], [torch.arange(9)], [w])[0]
    metric = sacrebleu.CHRF()
    for i, h in enumerate(hyps):
        stats = fractional_stats(util.features(h), [util.features(r) for r in refs], w.tolist())
        flat = []
        for hyp_total, ref_total, match in stats:  # sacrebleu's [hyp (0 without reference n-grams), ref, match]
            flat += [hyp_total if ref_total > 0 else 0, ref_total, match]
        assert float(got[i]) == pytest.approx(metric._compute_f_score(flat), abs=1e-9)


def test_bleu_aggregation_uses_expected_counts_and_length():
    hyps, refs = random_texts(9, 8, empty=False), random_texts(6, 9, empty=False)
    w = torch.full((6,), 1 / 6, dtype=torch.float64)
    util = BLEU()
    got = util.session([hyps], [refs]).aggregate([0], [torch.arange(9)], [w])[0]
    for i, h in enumerate(hyps):
        stats = fractional_stats(util.features(h), [util.features(r) for r in refs], w.tolist())
        sys_len, ref_len = stats[0][0], stats[0][1]  # unigram totals are lengths
        # sacrebleu's compute_bleu (exp smoothing, effective order), in plain Python on fractional counts
        bp = 1.0 if sys_len >= ref_len else math.exp(1 - ref_len / sys_len)
        logs, smooth = [], 1.0
        for total, _, correct in stats:
            if total == 0:
                break
            if correct == 0:
                smooth *= 2
                logs.append(math.log(100.0 / (smooth * total)))
            else:
                logs.append(math.log(100.0 * correct / total))
        want = bp * math.exp(sum(logs) / len(logs)) if any(s[2] for s in stats) else 0.0
        assert float(got[i]) == pytest.approx(want, abs=1e-9)


def test_callable_utility_and_registry():
    def overlap(hyps, refs):
        return [[len(set(h.split()) & set(r.split())) for r in refs] for h in hyps]

    util = get_utility(overlap)
    assert isinstance(util, CallableUtility) and util.name == "overlap"
    assert util(["a b", "c"], ["a", "b c", "d"]).tolist() == [[1, 1, 0], [0, 1, 0]]
    assert isinstance(get_utility("chrf++"), ChrF) and get_utility("chrf++").config.word_order == 2
    assert get_utility("bleu").name == "bleu"
    with pytest.raises(ValueError, match="unknown utility 'comet'"):
        get_utility("comet")
    with pytest.raises(ValueError, match="already registered"):
        register_utility("chrf", ChrF)
    register_utility("overlap-test", lambda: CallableUtility(overlap, name="overlap-test"))
    try:
        assert get_utility("overlap-test")(["a"], ["a"]).tolist() == [[1.0]]
    finally:
        del UTILITIES["overlap-test"]
    with pytest.raises(ValueError, match=r"returned shape \(1, 2\) for 2 hypotheses x 1"):
        get_utility(lambda h, r: [[0.0, 1.0]])(["a", "b"], ["c"])
    with pytest.raises(ValueError, match="returned NaN"):
        get_utility(lambda h, r: [[math.nan]])(["a"], ["b"])
    with pytest.raises(TypeError, match="must be callable"):
        CallableUtility(3)  # type: ignore[arg-type]


@pytest.mark.filterwarnings("ignore::bertscore_loss.BERTScoreWarning")  # the empty texts are on purpose
@pytest.mark.parametrize("options", [{}, {"idf": True}, {"rescale": True}, {"max_elements": 300}])
def test_bertscore_blocks_equal_the_engine(tiny_scorer, tmp_path, options):
    from bertscore_loss.baseline import write_baseline

    if options.get("rescale"):
        path = tmp_path / "base.tsv"
        write_baseline(path, {2: (0.3, 0.2, 0.25)})
        options = {**options, "baseline": str(path)}
    scorer = BERTScorer(tiny_scorer.config, encoder=tiny_scorer.encoder, **options)
    hyps = [random_texts(9, 10) + ["a man is riding a bike"], random_texts(4, 11)]
    refs = [random_texts(7, 12), random_texts(5, 13) + ["a man is riding a bike"]]
    for (measure, k), engine in zip(
        (("f1", 2), ("precision", 0), ("recall", 1), ("precision", 0)), ("tiles", "tiles", "tiles", "score_groups")
    ):
        session = BERTScoreUtility(scorer, measure, engine=engine).session(hyps, refs)
        full = session.full([0, 1])
        # the engine on every pair (IDF over all pseudo-references of the call, as score_groups)
        ref_scorer = (
            scorer
            if not options.get("idf")
            else BERTScorer(scorer.config, encoder=scorer.encoder, idf_corpus=[t for r in refs for t in r])
        )
        flat_h = [h for s in range(2) for h in hyps[s] for _ in refs[s]]
        flat_r = [r for s in range(2) for _ in hyps[s] for r in refs[s]]
        want = ref_scorer.score(flat_h, flat_r)[k].double()
        got = torch.cat([u.reshape(-1) for u in full])
        assert torch.allclose(got, want, atol=TOL)
        rows, cols = [torch.tensor([3, 0, 9]), torch.tensor([2])], [torch.tensor([6, 1]), torch.tensor([0, 5, 3])]
        for u, s, r, c in zip(session.blocks([0, 1], rows, cols), (0, 1), rows, cols):
            assert torch.allclose(u, full[s][r][:, c], atol=TOL)
        # hypotheses as their own pseudo-references: the upper triangle and its transpose (P and R swapped)
        same = BERTScoreUtility(scorer, measure, engine=engine).session(hyps, hyps).full([0, 1])
        own = (
            scorer
            if not options.get("idf")
            else BERTScorer(scorer.config, encoder=scorer.encoder, idf_corpus=[t for h in hyps for t in h])
        )
        for s, h in enumerate(hyps):
            want = own.score([a for a in h for _ in h], [b for _ in h for b in h])[k].double().view(len(h), len(h))
            assert torch.allclose(same[s], want, atol=TOL)


def test_bertscore_aggregation_by_hand(tiny_scorer):
    """The pooled bag of pseudo-reference token vectors and the expected best match, recomputed with plain loops."""
    hyps = ["a man rides a bike", "two dogs", "", "the man in a red shirt"]
    refs = ["a man is riding a bike", "a man rides a red bike", "", "two men ride bikes"]
    w = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    got = {
        m: BERTScoreUtility(tiny_scorer, m).session([hyps], [refs]).aggregate([0], [torch.arange(4)], [w])[0]
        for m in ("precision", "recall", "f1")
    }
    packed, _ = tiny_scorer.embed(hyps + refs)
    weight = tiny_scorer.weights(packed)

    def text(i: int):
        a, b = int(packed.offsets[i]), int(packed.offsets[i] + packed.lengths[i])
        return packed.row(i), packed.token_ids[a:b].tolist(), weight[a:b]

    vec: dict[int, torch.Tensor] = {}
    mass: dict[int, float] = {}
    presence: dict[int, float] = {}
    for j in range(len(refs)):
        e, tid, tw = text(len(hyps) + j)
        total = float(tw.sum())
        for t, key in enumerate(tid):
            vec[key] = vec.get(key, torch.zeros(e.shape[1])) + float(w[j]) * e[t]
            mass[key] = mass.get(key, 0.0) + (float(w[j]) * float(tw[t]) / total if total > 0 else 0.0)
        for key in set(tid):
            presence[key] = presence.get(key, 0.0) + float(w[j])
    keys = sorted(vec)
    bag = torch.stack([vec[k] / vec[k].norm() for k in keys])
    nonempty = float(w[[0, 1, 3]].sum())
    for i in range(len(hyps)):
        e, _, tw = text(i)
        if float(tw.sum()) == 0:
            assert [float(got[m][i]) for m in ("precision", "recall", "f1")] == [0.0, 0.0, 0.0]
            continue
        sim = (e / e.norm(dim=1, keepdim=True)) @ bag.t()  # [Lc, K]
        expected = []
        for row in sim.tolist():  # each hypothesis token: its expected best match in one pseudo-reference
            ranked = sorted(zip(row, keys), reverse=True)
            none_yet, num, den = 1.0, 0.0, 0.0
            for c, key in ranked:
                num += c * presence[key] * none_yet
                den += presence[key] * none_yet
                none_yet *= 1 - presence[key]
            expected.append(num / den)
        p = sum(x * float(v) for x, v in zip(expected, tw)) / float(tw.sum()) * nonempty
        best_hyp = sim.max(0).values.tolist()
        r = sum(b * mass[k] for b, k in zip(best_hyp, keys)) / sum(mass.values()) * nonempty
        assert float(got["precision"][i]) == pytest.approx(p, abs=TOL)
        assert float(got["recall"][i]) == pytest.approx(r, abs=TOL)
        assert float(got["f1"][i]) == pytest.approx(2 * p * r / (p + r), abs=TOL)


# --- methods ------------------------------------------------------------------------------------------------
def lists_with_duplicates(seed: int, sources: int = 3) -> list[list[str]]:
    rng = random.Random(seed)
    out = []
    for s in range(sources):
        base = random_texts(6 + 3 * s, seed * 10 + s, empty=False)
        out.append([rng.choice(base) for _ in range(10 + 4 * s)])
    return out


@pytest.mark.parametrize("name", ["chrf", "bleu", "callable", "bertscore"])
def test_exact_equals_brute_force(name, tiny_scorer):
    def overlap(hyps, refs):
        return [[len(set(h.split()) & set(r.split())) / (1 + len(r.split())) for r in refs] for h in hyps]

    util = {
        "chrf": ChrF(),
        "bleu": BLEU(),
        "callable": CallableUtility(overlap),
        "bertscore": BERTScoreUtility(tiny_scorer),
    }[name]

    def oracle(h: list[str], r: list[str]) -> torch.Tensor:
        """U[i, j] pair by pair: sacrebleu, the function itself, or the evaluation mode's BERTScore F."""
        if name == "bertscore":
            f = tiny_scorer.score([a for a in h for _ in r], [b for _ in h for b in r])[2]
            return f.double().view(len(h), len(r))
        if name == "callable":
            return torch.tensor([[overlap([a], [b])[0][0] for b in r] for a in h], dtype=torch.float64)
        return sacre_matrix(h, r, sacrebleu.CHRF() if name == "chrf" else sacrebleu.BLEU(effective_order=True))

    hyps = lists_with_duplicates(1)
    pseudo = [random_texts(5 + s, 40 + s, empty=False) + [hyps[s][0]] for s in range(3)]
    own = [oracle(h, h) for h in hyps]
    other = [oracle(h, p) for h, p in zip(hyps, pseudo)]
    lw = [
        torch.randn(len(h), generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s, h in enumerate(hyps)
    ]
    plw = [
        torch.randn(len(p), generator=torch.Generator().manual_seed(9 + s), dtype=torch.float64)
        for s, p in enumerate(pseudo)
    ]
    cases = [
        (None, None, False, 1.0),
        (None, None, True, 1.0),
        (None, lw, False, 0.5),
        (pseudo, None, False, 1.0),
        (pseudo, plw, False, 2.0),
    ]
    for refs, weights, include_self, temp in cases:
        got = mbr(
            hyps,
            refs,
            utility=util,
            log_weights=weights,
            temperature=temp,
            include_self=include_self,
            return_utility=True,
        )
        for s, h in enumerate(hyps):
            r = h if refs is None else refs[s]
            u = own[s] if refs is None else other[s]
            w = torch.ones(len(r), dtype=torch.float64) if weights is None else torch.softmax(weights[s] / temp, 0)
            want = brute_expectation(u, w, refs is None and not include_self)
            assert torch.allclose(got[s].expected, want, atol=TOL)
            assert torch.allclose(got[s].utility.double(), u, atol=TOL)
            top = float(want.max())
            assert float(want[got[s].best_index]) >= top - 1e-9
            assert got[s].best == h[got[s].best_index]
            assert got[s].order == sorted(range(len(h)), key=lambda i: (-float(got[s].expected[i]), i))
            distinct_h, distinct_r = len(set(h)), len(set(r))
            assert got[s].evaluations == distinct_h * distinct_r


def test_exact_chunking_and_single_hypothesis():
    hyps = lists_with_duplicates(2, sources=4)
    base = mbr(hyps, utility="chrf")
    for method in (Exact(max_pairs=1), Exact(max_texts=1)):
        for result, chunked in zip(base, mbr(hyps, utility="chrf", method=method)):
            assert torch.equal(result.expected, chunked.expected) and result.order == chunked.order
    alone = mbr([["a man rides"]], utility="chrf")[0]
    assert alone.best_index == 0 and float(alone.expected[0]) == pytest.approx(100.0)


@pytest.mark.parametrize(
    "method", [Aggregate(), AggregateExact(top_k=3), Prune(), Prune(schedule=(2, 4), bootstraps=50)]
)
@pytest.mark.parametrize("name", ["chrf", "bertscore"])
def test_approximations_return_a_member_and_report_agreement(method, name, tiny_scorer):
    util = ChrF() if name == "chrf" else BERTScoreUtility(tiny_scorer)
    hyps = lists_with_duplicates(3, sources=4)
    exact = mbr(hyps, utility=util)
    got = mbr(hyps, utility=util, method=method)
    for h, r in zip(hyps, got):
        assert 0 <= r.best_index < len(h) and r.best == h[r.best_index]
        assert sorted(r.order) == list(range(len(h))) and r.order[0] == r.best_index
        assert r.expected.shape == (len(h),) and not torch.isnan(r.expected).any()
    report = agreement(exact, got)
    assert report.sources == 4 and 0.0 <= report.same_choice <= 1.0
    assert report.kept_utility <= 1.0 + 1e-9 and report.regret >= -1e-9
    assert report.evaluations <= 1.0 + 1e-9 or isinstance(method, AggregateExact)
    # the same figures by hand
    same = [e.best.strip() == a.best.strip() for e, a in zip(exact, got)]
    assert report.same_choice == pytest.approx(sum(same) / 4)
    regret = [float(e.expected[e.best_index] - e.expected[a.best_index]) for e, a in zip(exact, got)]
    assert report.regret == pytest.approx(sum(regret) / 4)


def test_aggregate_exact_with_every_hypothesis_is_exact():
    hyps = lists_with_duplicates(4)
    exact = mbr(hyps, utility="chrf")
    full = mbr(hyps, utility="chrf", method=AggregateExact(top_k=100))
    for e, a in zip(exact, full):
        assert torch.allclose(e.expected, a.expected, atol=1e-12) and e.order == a.order


def test_prune_with_one_step_is_exact_and_prunes_a_clear_consensus():
    hyps = lists_with_duplicates(5)
    exact = mbr(hyps, utility="chrf")
    one_step = mbr(hyps, utility="chrf", method=Prune(schedule=(1000,)))
    for e, p in zip(exact, one_step):
        assert e.best_index == p.best_index and torch.allclose(e.expected, p.expected, atol=1e-12)
    # 60 samples around one sentence and 4 outliers: pruning keeps the consensus with fewer evaluations
    rng = random.Random(0)
    center = "a man in a red shirt is riding a bike down the street".split()
    samples = [" ".join(w for w in center if rng.random() > 0.15) for _ in range(60)]
    samples += ["two dogs play in the snow", "the snow", "dogs", "( )"]
    rng.shuffle(samples)
    e = mbr([samples], utility="chrf")[0]
    p = mbr([samples], utility="chrf", method=Prune(seed=1))[0]
    assert p.best.strip() == e.best.strip()
    assert p.evaluations < 0.6 * e.evaluations
    assert mbr([samples], utility="chrf", method=Prune(seed=1))[0].order == p.order  # seeded


def test_method_and_input_errors(tiny_scorer):
    with pytest.raises(ValueError, match="unknown MBR method 'centroid'"):
        get_method("centroid")
    assert get_method("prune", alpha=0.9) == Prune(alpha=0.9)
    with pytest.raises(ValueError, match="Prune.alpha must lie in"):
        Prune(alpha=0.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        Prune(schedule=(8, 4))
    with pytest.raises(ValueError, match="AggregateExact.top_k must be a positive int"):
        AggregateExact(top_k=0)
    with pytest.raises(ValueError, match="return_utility needs method='exact'"):
        mbr([["a", "b"]], utility="chrf", method="prune", return_utility=True)
    with pytest.raises(ValueError, match="no reference aggregation"):
        mbr([["a", "b"]], utility=lambda h, r: [[0.0] * len(r)] * len(h), method="aggregate")
    with pytest.raises(ValueError, match=r"log_weights\[0\] has 1 values but source 0 has 2"):
        mbr([["a", "b"]], utility="chrf", log_weights=[[0.0]])
    with pytest.raises(ValueError, match="2 hypothesis lists but 1 pseudo-reference"):
        mbr([["a"], ["b"]], [["c"]], utility="chrf")
    with pytest.raises(ValueError, match=r"hypotheses\[0\] is an empty list"):
        mbr([[]], utility="chrf")
    assert mbr([], utility="chrf") == []


def test_gain_share():
    assert gain_share(80.0, 81.0, 80.9) == pytest.approx(0.9)
    assert math.isnan(gain_share(80.0, 80.0, 80.5))


# --- the reranker and the CLI with other utilities -----------------------------------------------------------
def test_reranker_with_chrf_loads_no_scorer_and_uses_the_method():
    reranker = NBestReranker(utility="chrf", method="aggregate")
    assert reranker.scorer is None and reranker.signature().startswith("chrf|sacrebleu:")
    hyps = lists_with_duplicates(6)
    got = reranker.rerank(hyps)
    want = mbr(hyps, utility="chrf", method="aggregate")
    assert [r.indices for r in got] == [w.order for w in want]
    assert [r.evaluations for r in got] == [w.evaluations for w in want]
    exact = reranker.rerank(hyps, method="exact", return_utility=True)
    assert [r.best_index for r in exact] == [w.best_index for w in mbr(hyps, utility="chrf")]
    refs = ["a man in a red shirt", ["two dogs", "the snow"], "a bike"]
    ref_mode = reranker.rerank(hyps, refs)
    for s, r in enumerate(ref_mode):
        rs = [refs[s]] if isinstance(refs[s], str) else refs[s]
        best = sacre_matrix(hyps[s], rs, sacrebleu.CHRF()).max(1).values
        assert r.bertscore == pytest.approx(best[r.indices].tolist(), abs=1e-9)
    with pytest.raises(ValueError, match="weight > 0 interpolates"):
        reranker.rerank(hyps, model_scores=[[0.0] * len(h) for h in hyps], weight=0.5, method="prune")
    with pytest.raises(AttributeError, match="has no BERTScore scorer"):
        _ = reranker.config


def run_cli(argv: list[str]) -> int:
    args = build_parser().parse_args(["rerank", *argv])
    return args.func(args)


def test_cli_utility_and_method(tmp_path, capsys, tiny_bert_dir, tiny_scorer):
    hyps = lists_with_duplicates(7)
    width = max(len(h) for h in hyps)
    lines = [f"s{s}\t{h[k]}" for s, h in enumerate(hyps) for k in range(len(h)) if k < width]
    (tmp_path / "nbest.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tsv = ["--tsv", str(tmp_path / "nbest.tsv"), "--mbr", "--print", "index"]
    for method in ("exact", "aggregate", "aggregate-exact", "prune"):
        assert run_cli([*tsv, "--utility", "chrf", "--method", method]) == 0
        want = [r.best_index for r in mbr(hyps, utility="chrf", method=method)]
        assert capsys.readouterr().out.splitlines() == [str(i) for i in want]
    assert run_cli([*tsv, "--utility", "chrf", "--method", "aggregate-exact", "--top-k", "2"]) == 0
    want = [r.best_index for r in mbr(hyps, utility="chrf", method=AggregateExact(top_k=2))]
    assert capsys.readouterr().out.splitlines() == [str(i) for i in want]
    common = ["--model", tiny_bert_dir, "--layer", "2", "--device", "cpu"]
    assert run_cli([*tsv, *common, "--method", "aggregate"]) == 0
    want = [r.best_index for r in mbr(hyps, utility=BERTScoreUtility(tiny_scorer), method="aggregate")]
    assert capsys.readouterr().out.splitlines() == [str(i) for i in want]
    from bertscore_loss.cli.common import UsageError

    with pytest.raises(UsageError, match="--top-k applies to --method aggregate-exact only"):
        run_cli([*tsv, "--utility", "chrf", "--top-k", "3"])
    with pytest.raises(UsageError, match="--measure chooses the BERTScore measure"):
        run_cli([*tsv, "--utility", "bleu", "--measure", "precision"])
    with pytest.raises(UsageError, match="--method apply to --mbr only"):
        run_cli(["--tsv", str(tmp_path / "nbest.tsv"), "-r", str(tmp_path / "nbest.tsv"), "--method", "prune"])


@pytest.mark.slow
def test_rerank_doc_snippet_runs_as_written(tmp_path):
    """docs/rerank.md's marked block, as a script in a fresh interpreter; its printed chrF matrix is sacrebleu's."""
    from .test_docs import marked_blocks, run_script

    (code,) = [c for name, _, c in marked_blocks() if name == "rerank.md"]
    done = run_script(code, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    printed = [float(x) for x in lines[0].split("[[")[1].split("]]")[0].split(",")]
    want = [sacrebleu.sentence_chrf("a man rides a bike", [r]).score for r in ("a man is riding a bike", "two dogs")]
    assert printed == pytest.approx(want, abs=1e-4)
    assert lines[1].startswith("bertscore [") and lines[2].startswith("chrf [") and lines[3].startswith("bleu [")
    assert lines[-1] == "a man rides a bike"
