"""Distributed corpus scoring through Lightning DDP on CPU (gloo): sharding without padding, input order,
equality with one process, the ``score --devices N`` command."""

from __future__ import annotations

import pickle

import pytest
import torch

from bertscore_loss import BERTScorer, ScorerConfig
from bertscore_loss.cli import build_parser, main
from bertscore_loss.cli.score import cmd_score_distributed, is_distributed
from bertscore_loss.lightning.distributed import PairScoringModule, ShardSampler, score_distributed, shard_indices
from bertscore_loss.registry import get_encoder

CANDS = [
    "The cat sat on the mat.",
    "A dog barked at the mailman all morning.",
    "hello",
    "It is raining in Paris today.",
    "The committee approved the new budget.",
    "The cat sat on the mat.",
    "We will meet again next week at noon.",
    "",
    "Prices rose sharply in the last quarter of the year.",
]
REFS = [
    ["A cat was sitting on the mat.", "The cat is on the mat."],
    "The dog was barking at the postman.",
    ["hello world", "hi"],
    "Today it rains in Paris.",
    ["The new budget was approved by the committee.", "The board passed the budget."],
    "The cat is on the mat.",
    "See you next week at twelve.",
    "An empty candidate.",
    "In the final quarter prices went up steeply.",
]


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny models gain nothing from a second thread, and OpenMP barriers stall on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def keep_encoder(tiny_bert_dir):
    """The registry's tiny encoder, loaded once: forked ranks inherit it."""
    return get_encoder(tiny_bert_dir, 2, "float32", "cpu")


@pytest.mark.parametrize("n,world", [(23, 2), (5, 3), (1, 2), (0, 2), (8, 4)])
def test_shards_cover_every_index_once_without_padding(n, world):
    order = list(reversed(range(n)))
    shards = [shard_indices(n, rank, world, order) for rank in range(world)]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for shard in shards:
        batches = list(ShardSampler(shard, 2))
        assert len(batches) == len(ShardSampler(shard, 2)) >= 1  # an empty shard still runs one (empty) batch
        assert [i for b in batches for i in b] == shard
    with pytest.raises(ValueError, match="rank must lie"):
        shard_indices(3, 2, 2)


def test_two_processes_equal_one_process_in_order_odd_n_with_idf(tiny_bert_dir):
    cands = CANDS * 2 + ["One more."]  # N = 19: odd, and below one batch of pairs per rank would fit
    refs = REFS * 2 + ["One more time."]
    config = ScorerConfig(model=tiny_bert_dir, layer=2, idf=True)
    with pytest.warns(UserWarning, match="empty candidate"):
        p1, r1, f1 = BERTScorer(config, device="cpu").score(cands, refs)  # IDF over all 19 pairs' references
    p, r, f = score_distributed(cands, refs, config, devices=2, strategy="ddp_fork", batch_pairs=4)
    for got, exp in ((p, p1), (r, r1), (f, f1)):
        assert got.shape == (19,)
        torch.testing.assert_close(got, exp, atol=1e-6, rtol=0)
    assert f[7] == 0 and f[16] == 0  # the empty candidates, in their places


def test_fewer_pairs_than_ranks_through_the_score_command(tiny_bert_dir, tiny_scorer, tmp_path, capsys):
    # `bertscore-loss score ... --devices 2` with fewer pairs than ranks (and with none at all)
    (tmp_path / "c.txt").write_text("a cat\n", encoding="utf-8")
    (tmp_path / "r1.txt").write_text("the cat\n", encoding="utf-8")
    (tmp_path / "r2.txt").write_text("a dog\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    common = ["--model", tiny_bert_dir, "--layer", "2", "--devices", "2", "--accelerator", "cpu"]
    common += ["--strategy", "ddp_fork", "--per-line"]
    files = ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r1.txt"), "-r", str(tmp_path / "r2.txt")]
    assert main(["score", *files, *common]) == 0
    p, r, f = torch.tensor([list(map(float, x.split("\t"))) for x in capsys.readouterr().out.splitlines()]).T
    exp = tiny_scorer.score(["a cat"], [["the cat", "a dog"]])
    torch.testing.assert_close(torch.stack((p, r, f)), torch.stack(exp), atol=1e-6, rtol=0)
    empty = ["-c", str(tmp_path / "empty.txt"), "-r", str(tmp_path / "empty.txt")]
    assert main(["score", *empty, *common]) == 0  # no pairs at all
    out = capsys.readouterr()
    p = r = f = torch.tensor([float(x) for x in out.out.split()])
    assert p.shape == r.shape == f.shape == (0,) and out.err.startswith("0 pairs")


def test_module_pickles_without_encoder(tiny_bert_dir):
    module = PairScoringModule(["a"], [["b"]], ScorerConfig(model=tiny_bert_dir, layer=2))
    module._scorer = BERTScorer(module.config, encoder=get_encoder(tiny_bert_dir, 2, "float32", "cpu"))
    assert len(pickle.dumps(module)) < 100_000  # the tiny encoder's weights alone are 3.9 MB


class _ScoreParser:
    """``bertscore-loss score`` options, parsed by the real parser."""

    def parse_args(self, argv: list[str]):
        return build_parser().parse_args(["score", *argv])


def score_parser() -> _ScoreParser:
    return _ScoreParser()


@pytest.mark.slow
def test_score_command_ddp_spawn_per_line(tiny_bert_dir, tiny_scorer, tmp_path, capsys):
    cands = [c for c in CANDS if c] + ["An odd one out."]  # 9 pairs
    refs = [r if isinstance(r, str) else r[0] for c, r in zip(CANDS, REFS) if c] + ["The odd one."]
    (tmp_path / "c.txt").write_text("\n".join(cands) + "\n", encoding="utf-8")
    (tmp_path / "r.txt").write_text("\n".join(refs) + "\n", encoding="utf-8")
    args = score_parser().parse_args(
        ["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r.txt"), "--model", tiny_bert_dir, "--layer", "2"]
        + ["--devices", "2", "--accelerator", "cpu", "--per-line", "--batch-pairs", "3"]
    )
    assert is_distributed(args) and args.strategy == "auto"  # auto = ddp_spawn here (no torchrun/SLURM)
    assert cmd_score_distributed(args) == 0
    rows = [list(map(float, line.split("\t"))) for line in capsys.readouterr().out.splitlines()]
    p, r, f = tiny_scorer.score(cands, refs)
    torch.testing.assert_close(torch.tensor(rows), torch.stack((p, r, f), 1), atol=2e-6, rtol=0)


def test_score_command_errors(tiny_bert_dir, tmp_path):
    (tmp_path / "c.txt").write_text("a\nb\n")
    (tmp_path / "r.txt").write_text("a\n")
    parser = score_parser()
    args = parser.parse_args(["-c", str(tmp_path / "c.txt"), "-r", str(tmp_path / "r.txt"), "--devices", "2"])
    with pytest.raises(ValueError, match="has 2 lines but .* has 1"):
        cmd_score_distributed(args)
    args = parser.parse_args(["-c", "x", "-r", "y", "--devices", "2", "--device", "cpu"])
    with pytest.raises(ValueError, match="--device does not apply"):
        cmd_score_distributed(args)
    with pytest.raises(ValueError, match="devices and num_nodes must be >= 1"):
        score_distributed(["a"], ["a"], {"model": tiny_bert_dir}, devices=0)
    with pytest.raises(ValueError, match="strategy must be"):
        score_distributed(["a"], ["a"], {"model": tiny_bert_dir}, strategy="fsdp")
    with pytest.raises(ValueError, match="got 2 candidates but 1 references"):
        score_distributed(["a", "b"], ["a"], {"model": tiny_bert_dir})
