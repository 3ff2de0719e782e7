"""BERTScoreMetric: values equal the evaluation mode, IDF fixed, rescaling, multi-reference, cache, reset,
shared encoder outside every state_dict, device following, and 2-process DDP on CPU (gloo)."""

from __future__ import annotations

import importlib.util
import pickle
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader

from bertscore_loss import BERTScorer
from bertscore_loss.baseline import write_baseline
from bertscore_loss.cache import EmbeddingCache
from bertscore_loss.config import batch_tokens_for
from bertscore_loss.lightning import BERTScoreMetric
from bertscore_loss.lightning.distributed import ShardSampler, shard_indices
from bertscore_loss.lightning.registry import get_encoder, loaded_encoders
from bertscore_loss.registry import private_copy

ROOT = Path(__file__).resolve().parents[1]

CANDS = [
    "The cat sat on the mat.",
    "A dog barked at the mailman all morning.",
    "hello",
    "It is raining in Paris today.",
    "The committee approved the new budget.",
    "The cat sat on the mat.",
    "We will meet again next week at noon.",
]
REFS = [
    ["A cat was sitting on the mat.", "The cat is on the mat."],
    ["The dog was barking at the postman."],
    ["hello world", "hi", "greetings"],
    ["Today it rains in Paris."],
    ["The new budget was approved by the committee.", "The board passed the budget."],
    ["The cat is on the mat."],
    ["See you next week at twelve."],
]


def run_epoch(metric: BERTScoreMetric, cands, refs, batch: int, with_index: bool = False) -> dict:
    for start in range(0, len(cands), batch):
        idx = list(range(start, min(start + batch, len(cands))))
        metric.update(cands[start : start + batch], refs[start : start + batch], index=idx if with_index else None)
    return metric.compute()


def assert_scores(out: dict, expected: tuple, atol: float = 1e-6) -> None:
    for name, exp in zip(("precision", "recall", "f1"), expected):
        torch.testing.assert_close(out[name], exp, atol=atol, rtol=0)


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """Tiny models gain nothing from a second thread, and OpenMP barriers stall on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", autouse=True)
def keep_encoder(tiny_bert_dir):
    """Hold the registry's tiny encoder for the whole module, so that each test does not reload it."""
    return get_encoder(tiny_bert_dir, 2, "float32", "cpu")


@pytest.fixture(scope="module")
def expected(tiny_scorer):
    return tiny_scorer.score(CANDS, REFS)


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_values_equal_evaluation_mode_multi_reference_across_updates(tiny_bert_dir, expected, batch):
    per_sample = BERTScoreMetric(tiny_bert_dir, 2, per_sample=True)
    assert_scores(run_epoch(per_sample, CANDS, REFS, batch), expected)
    means = BERTScoreMetric(tiny_bert_dir, 2)
    out = run_epoch(means, CANDS, REFS, batch)
    assert_scores(out, tuple(x.mean() for x in expected))
    assert out["f1"].shape == () and out["f1"].dtype == torch.float32


def test_best_f_multi_reference(tiny_bert_dir):
    metric = BERTScoreMetric(tiny_bert_dir, 2, multi_ref="best_f", per_sample=True)
    exp = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", multi_ref="best_f").score(CANDS, REFS)
    assert_scores(run_epoch(metric, CANDS, REFS, 2), exp)
    # best_f keeps one reference's triple: its precision is not always the max over references
    maxed = run_epoch(BERTScoreMetric(tiny_bert_dir, 2, per_sample=True), CANDS, REFS, 2)
    assert (maxed["precision"] >= exp[0] - 1e-7).all()


def test_idf_fixed_from_corpus_and_rescaling(tiny_bert_dir, tmp_path):
    corpus = [r for g in REFS for r in g] + ["An extra sentence about cats and dogs."]
    (tmp_path / "corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    write_baseline(tmp_path / "base.tsv", {2: (0.5, 0.4, 0.45)})
    kwargs = dict(idf=True, rescale=True, baseline=str(tmp_path / "base.tsv"))
    exp = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf_corpus=corpus, **kwargs).score(CANDS, REFS)
    # The same IDF table whatever the batching: fixed at construction, not recomputed from each batch.
    for batch in (1, 4):
        metric = BERTScoreMetric(tiny_bert_dir, 2, idf_corpus=str(tmp_path / "corpus.txt"), per_sample=True, **kwargs)
        assert_scores(run_epoch(metric, CANDS, REFS, batch), exp)
    # by hand: rescaled F = (F_raw - 0.45) / 0.55
    raw = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu", idf=True, idf_corpus=corpus).score(CANDS, REFS)
    torch.testing.assert_close(exp[2], (raw[2] - 0.45) / 0.55, atol=1e-6, rtol=0)
    assert "idf:yes(corpus:" in str(metric.signature())


def test_reset_between_epochs_and_forward(tiny_bert_dir, expected):
    metric = BERTScoreMetric(tiny_bert_dir, 2)
    first = run_epoch(metric, CANDS, REFS, 3)
    metric.reset()
    assert int(metric.total) == 0 and float(metric.sum_f1) == 0.0
    run_epoch(metric, CANDS[:2], REFS[:2], 3)
    metric.reset()
    second = run_epoch(metric, CANDS, REFS, 3)
    assert_scores(second, tuple(first[k] for k in ("precision", "recall", "f1")), atol=0)
    metric.reset()
    batch_value = metric(CANDS[:3], REFS[:3])  # forward: this batch's means, and accumulated
    torch.testing.assert_close(batch_value["f1"], expected[2][:3].mean(), atol=1e-6, rtol=0)
    metric.update(CANDS[3:], REFS[3:])
    torch.testing.assert_close(metric.compute()["f1"], expected[2].mean(), atol=1e-6, rtol=0)


def test_reference_cache_skips_references_and_keeps_results(tiny_bert_dir, monkeypatch):
    cached = BERTScoreMetric(tiny_bert_dir, 2, per_sample=True, ref_cache_bytes=1 << 24)
    enc = cached.scorer.encoder
    # The registry shares this encoder with earlier tests' scorers and losses: start its cache empty, and
    # give the uncached metric a private copy of the encoder (no cache), so the counts are this test's.
    monkeypatch.setattr(enc, "cache", EmbeddingCache(1 << 24))
    plain = BERTScoreMetric(scorer=BERTScorer(encoder=private_copy(enc)), per_sample=True, ref_cache_bytes=0)
    assert plain.scorer.encoder is not enc and plain.scorer.encoder.cache.max_bytes == 0
    encoded: list[int] = []
    real = enc.embed_ids

    def counting(ids, **kw):
        encoded.append(len(ids))
        return real(ids, **kw)

    monkeypatch.setattr(enc, "embed_ids", counting)
    n_cands = len({c.strip() for c in CANDS})
    n_refs = len({r for g in REFS for r in g})
    for epoch in range(3):
        encoded.clear()
        a = run_epoch(cached, CANDS, REFS, 7)
        first_epoch_count = sum(encoded)
        b = run_epoch(plain, CANDS, REFS, 7)
        for k in a:
            assert torch.equal(a[k], b[k]), k  # bit-identical with and without the cache
        cached.reset()
        plain.reset()
        # epoch 1 encodes candidates and references; later epochs only the candidates
        assert first_epoch_count == (n_cands + n_refs if epoch == 0 else n_cands)
    assert cached.ref_cache.hits == 2 * n_refs and len(cached.ref_cache) == n_refs
    # bounded by bytes: a cache smaller than one embedding keeps nothing and changes nothing
    tiny = BERTScoreMetric(scorer=BERTScorer(encoder=private_copy(enc)), per_sample=True, ref_cache_bytes=64)
    c = run_epoch(tiny, CANDS, REFS, 7)
    assert len(tiny.ref_cache) == 0 and tiny.ref_cache.nbytes <= 64
    assert torch.equal(c["f1"], b["f1"])


class Holder(pl.LightningModule):
    def __init__(self, model_dir: str) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)
        self.val_metric = BERTScoreMetric(model_dir, 2)
        self.test_metric = BERTScoreMetric(model_dir, 2, per_sample=True)


def test_encoder_shared_and_outside_state_dict_and_optimizer(tiny_bert_dir, tmp_path):
    module = Holder(tiny_bert_dir)
    enc = module.val_metric.scorer.encoder
    assert module.test_metric.scorer.encoder is enc  # loaded once for both
    assert sum(1 for e in loaded_encoders() if e is enc) == 1
    assert set(module.state_dict()) == {"net.weight", "net.bias"}
    assert {id(p) for p in module.parameters()} == {id(module.net.weight), id(module.net.bias)}
    enc_params = {id(p) for p in enc.parameters()}
    assert enc_params and not enc_params & {id(p) for p in module.parameters()}
    assert "encoder" not in dict(module.named_modules()).get("val_metric")._modules
    # pickling (ddp_spawn, deepcopy) leaves the encoder out: far smaller than its 3.9 MB of weights
    blob = pickle.dumps(module.val_metric)
    assert len(blob) < 500_000
    clone = pickle.loads(blob)
    assert clone.scorer.encoder is enc  # taken back from the registry, not reloaded
    torch.save(module.state_dict(), tmp_path / "ckpt.pt")
    assert set(torch.load(tmp_path / "ckpt.pt")) == {"net.weight", "net.bias"}


def test_encoder_follows_metric_device_without_moving_other_sharers(tiny_bert_dir):
    a = BERTScoreMetric(tiny_bert_dir, 2)
    b = BERTScoreMetric(tiny_bert_dir, 2)
    cpu_enc = a.scorer.encoder
    assert batch_tokens_for(a.device, a.scorer.config.batch_tokens) == 2048  # the one CPU default
    a.to("meta")  # any second device: the registry gives `a` its own copy there
    assert a.device.type == "meta" and a.encoder_device.type == "meta"
    assert a.scorer.encoder is get_encoder(tiny_bert_dir, 2, "float32", "meta")
    assert a.scorer.encoder is not cpu_enc
    assert batch_tokens_for(a.device, a.scorer.config.batch_tokens) == 8192  # the budget on accelerators
    assert BERTScoreMetric(tiny_bert_dir, 2, batch_tokens=300).to("meta").scorer.config.batch_tokens == 300
    assert b.scorer.encoder is cpu_enc and cpu_enc.device.type == "cpu"  # the sharer did not move
    c = BERTScoreMetric(tiny_bert_dir, 2).to("meta")
    assert c.scorer.encoder is a.scorer.encoder  # one copy per device


def test_index_orders_and_drops_duplicates(tiny_bert_dir, expected):
    metric = BERTScoreMetric(tiny_bert_dir, 2, per_sample=True)
    order = [4, 0, 6, 2]
    metric.update([CANDS[i] for i in order], [REFS[i] for i in order], index=order)
    rest = [1, 3, 5, 0, 4]  # 0 and 4 again, as a padding DistributedSampler repeats samples
    metric.update([CANDS[i] for i in rest], [REFS[i] for i in rest], index=torch.tensor(rest))
    assert_scores(metric.compute(), expected)
    metric.reset()
    metric.update(CANDS[:2], REFS[:2], index=[0, 1])
    metric.update(CANDS[2:3], REFS[2:3])
    with pytest.raises(ValueError, match="pass index to every update"):
        metric.compute()


def test_bad_inputs(tiny_bert_dir):
    with pytest.raises(ValueError, match="idf=True needs idf_corpus"):
        BERTScoreMetric(tiny_bert_dir, 2, idf=True)
    with pytest.raises(ValueError, match="idf_corpus is given but idf=False"):
        BERTScoreMetric(tiny_bert_dir, 2, idf_corpus=["a b"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BERTScoreMetric(tiny_bert_dir, 2, idf=True, idf_corpus="/nonexistent/corpus.txt")
    metric = BERTScoreMetric(tiny_bert_dir, 2)
    with pytest.raises(ValueError, match="got 2 candidates but 1 references"):
        metric.update(["a", "b"], ["a"])
    with pytest.raises(TypeError, match=r"cands\[1\] must be str"):
        metric.update(["a", 3], ["a", "b"])
    with pytest.raises(ValueError, match="only kept with per_sample=True"):
        metric.update(["a"], ["a"], index=[0])
    with pytest.raises(ValueError, match="1 predictions but 2 indices"):
        BERTScoreMetric(tiny_bert_dir, 2, per_sample=True).update(["a"], ["a"], index=[0, 1])
    metric.update("a cat", "the cat")  # a single pair as plain strings
    assert int(metric.total) == 1


# --- 2-process DDP on CPU (gloo) ----------------------------------------------------------------------
class DDPValidation(pl.LightningModule):
    """Validation under DDP with both metric modes; each rank saves what compute() returned."""

    def __init__(self, model_dir: str, cands, refs, out_path: str) -> None:
        super().__init__()
        self.cands, self.refs, self.out_path = cands, refs, out_path
        self.means = BERTScoreMetric(model_dir, 2)
        self.samples = BERTScoreMetric(model_dir, 2, per_sample=True)

    def setup(self, stage: str) -> None:
        torch.set_num_threads(1)  # forked CPU ranks: OpenMP threads after fork would hang

    def val_dataloader(self) -> DataLoader:
        mine = shard_indices(len(self.cands), self.global_rank, self.trainer.world_size)
        return DataLoader(range(len(self.cands)), batch_sampler=ShardSampler(mine, 3), collate_fn=list)

    def validation_step(self, idx: list[int], batch_idx: int) -> None:
        cands, refs = [self.cands[i] for i in idx], [self.refs[i] for i in idx]
        self.means.update(cands, refs)
        self.samples.update(cands, refs, index=idx)

    def on_validation_epoch_end(self) -> None:
        means, samples = self.means.compute(), self.samples.compute()
        out = {"means": means, "samples": samples, "world": self.trainer.world_size}
        torch.save(out, f"{self.out_path}.{self.global_rank}")
        self.means.reset()
        self.samples.reset()


def test_ddp_two_processes_equal_single_process(tiny_bert_dir, tiny_scorer, tmp_path):
    cands = CANDS * 3 + ["One more odd pair."] * 2  # N = 23: odd, shards of 12 and 11
    refs = REFS * 3 + [["Another odd pair."], ["A last one.", "and another"]]
    module = DDPValidation(tiny_bert_dir, cands, refs, str(tmp_path / "out.pt"))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp_fork",
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.validate(module)
    p, r, f = tiny_scorer.score(cands, refs)
    for rank in (0, 1):  # compute() syncs: both ranks hold the result over all 23 pairs
        got = torch.load(tmp_path / f"out.pt.{rank}")
        assert got["world"] == 2
        assert_scores(got["samples"], (p, r, f))  # every pair once, in dataset order
        assert_scores(got["means"], (p.mean(), r.mean(), f.mean()))


def test_example_lightning_cli_logs_bertscore_each_epoch(tiny_bert_dir, tmp_path):
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures]")
    spec = importlib.util.spec_from_file_location("lightning_validation", ROOT / "examples" / "lightning_validation.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    args = ["fit", "--config", str(ROOT / "configs" / "lightning_validation.yaml")]
    args += ["--model.bertscore_model", tiny_bert_dir, "--model.bertscore_layer", "2", "--trainer.max_epochs", "2"]
    args += ["--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.enable_progress_bar", "false"]
    args += ["--data.train_size", "16", "--trainer.enable_model_summary", "false"]
    cli = example.main(args)
    cands = (ROOT / "examples" / "data" / "cands.txt").read_text(encoding="utf-8").splitlines()
    refs = (ROOT / "examples" / "data" / "refs.txt").read_text(encoding="utf-8").splitlines()
    _, _, f = BERTScorer(model=tiny_bert_dir, layer=2, device="cpu").score(cands, refs)
    torch.testing.assert_close(cli.trainer.callback_metrics["val/bertscore_f1"], f.mean(), atol=1e-6, rtol=0)
    rows = (Path(cli.trainer.logger.log_dir) / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    logged = [r.split(",")[header.index("val/bertscore_f1")] for r in rows[1:]]
    assert len([v for v in logged if v]) == 2  # once per validation epoch
    assert set(cli.model.state_dict()) == {"net.weight", "net.bias"}
