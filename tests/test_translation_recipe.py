"""Smoke run of the Multi30k recipe (examples/translation): all three stages on a committed sample, tiny model.

Checks the pipeline end to end: stage 1 writes a checkpoint and resumes from it, every stage-2 arm's loss
is finite and decreases on a repeated batch, stage 2 writes one translation per blind source line, and
stage 3's reranked outputs are members of their candidate lists.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = Path(__file__).resolve().parent / "data" / "multi30k"
RECIPE = ROOT / "examples" / "translation"


def _load(name: str):
    sys.path.insert(0, str(RECIPE))
    spec = importlib.util.spec_from_file_location(name, RECIPE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def recipe():
    return _load("recipe")


@pytest.fixture(scope="module")
def stage1_run(recipe, tmp_path_factory):
    nmt = recipe.nmt
    out = tmp_path_factory.mktemp("stage1")
    cfg = recipe.Stage1Config(
        data=str(SAMPLE),
        out=str(out),
        vocab_size=250,
        max_epochs=1,
        max_minutes=None,
        batch_tokens=600,
        precision="32-true",
        model=nmt.ModelConfig(d_model=32, layers=1, heads=2, ffn=64, dropout=0.0),
        train=nmt.TrainConfig(lr=3e-3, warmup=5, val_limit=6),
    )
    first = recipe.stage1(cfg)
    return recipe, cfg, out, first


@pytest.mark.slow
def test_stage1_writes_a_checkpoint_and_resumes(stage1_run):
    recipe, cfg, out, first = stage1_run
    last = out / "checkpoints" / "last.ckpt"
    assert last.is_file() and (out / "model" / "spm.model").is_file()
    steps = torch.load(last, map_location="cpu", weights_only=False)["global_step"]
    assert steps > 0 and [row["epoch"] for row in first["curve"]] == [0]
    cfg.max_epochs = 2
    second = recipe.stage1(cfg)  # continues from last.ckpt: one more epoch, not two
    assert [row["epoch"] for row in second["curve"]] == [1]
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == 2 * steps
    assert len((out / "curve.jsonl").read_text().splitlines()) == 2
    model, sp = recipe.load_model(out / "model")
    assert model.config.vocab_size == sp.get_piece_size()


def _fine_tuner(recipe, folder: Path, arm: str):
    from bertscore_loss import BERTScoreLoss, BERTScorer, MinimumRiskLoss, VocabBridge

    nmt = recipe.nmt
    model, sp = recipe.load_model(folder)
    train = nmt.PairData(sp, *nmt.read_pairs(SAMPLE, "train", 40), 100)
    val = nmt.PairData(sp, *nmt.read_pairs(SAMPLE, "val", 4), 100)
    semantic = risk = None
    if arm != "ce":
        scorer = BERTScorer()
        if arm == "bertscore":
            bridge = VocabBridge(folder / "spm.model", scorer.encoder, vocab_size=sp.get_piece_size())
            semantic = BERTScoreLoss(scorer=scorer, bridge=bridge, top_k=16)
        else:
            risk = MinimumRiskLoss(scorer=scorer)
    module = nmt.FineTuner(model, sp, nmt.TrainConfig(), val, "32-true", arm, semantic, risk, 1.0, 4)
    module.train_targets = train.tgt_text
    module.log = lambda *a, **k: None  # outside a Trainer
    return module, train.collate(list(range(6)))


@pytest.mark.slow
@pytest.mark.parametrize("arm", ["ce", "bertscore", "mrt"])
def test_every_arm_loss_is_finite_and_decreases_on_a_repeated_batch(stage1_run, arm):
    recipe, _, out, _ = stage1_run
    torch.manual_seed(0)
    module, batch = _fine_tuner(recipe, out / "model", arm)
    module.model.train()
    opt = torch.optim.Adam(module.model.parameters(), lr=3e-3)
    losses = []
    for _ in range(6):
        loss = module.training_step(batch, 0)
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
    if module.semantic is not None:  # the frozen scoring encoder got no gradient
        assert all(p.grad is None for p in module.semantic.encoder.model.parameters())


@pytest.mark.slow
def test_stage2_and_stage3_commands(stage1_run, tmp_path):
    recipe, _, out, _ = stage1_run
    nmt = recipe.nmt
    blind_out = tmp_path / "outputs"
    cfg = recipe.Stage2Config(
        data=str(SAMPLE),
        init=str(out / "model"),
        out=str(tmp_path / "stage2"),
        arm="mrt",
        updates=2,
        batch_tokens=200,
        samples=3,
        precision="32-true",
        eval_limit=6,
        outputs=str(blind_out),
        beams=2,
        eval_sets=["test_2016_flickr"],
        train=nmt.TrainConfig(lr=1e-4, warmup=1),
    )
    first = recipe.stage2(cfg)
    assert first["updates"] == 2 and first["seconds_per_update"] > 0 and set(first["eval"]) == {"test_2016_flickr"}
    # Rerun of a finished run: no training, its figures kept, only the missing set added, with the tuned model.
    cfg = recipe.dataclasses.replace(cfg, eval_sets=["val", "test_2016_flickr"])
    result = recipe.stage2(cfg)
    assert result["seconds_per_update"] == first["seconds_per_update"]
    assert result["eval"]["test_2016_flickr"] == first["eval"]["test_2016_flickr"]
    tuned, sp = recipe.load_model(tmp_path / "stage2" / "mrt-seed0" / "model")
    val_src = nmt.read_pairs(SAMPLE, "val", 6)[0]
    assert nmt.read_lines(tmp_path / "stage2" / "mrt-seed0" / "val.hyp.en") == nmt.translate(
        tuned, sp, val_src, beams=2, precision="32-true"
    )
    for split in ("val", "test_2016_flickr"):
        row = result["eval"][split]
        assert 0 <= row["bleu"] <= 100 and 0 <= row["bertscore_f"] <= 100 and row["length_ratio"] >= 0
        assert len(nmt.read_lines(tmp_path / "stage2" / "mrt-seed0" / f"{split}.hyp.en")) == 6
    for src in sorted((SAMPLE / "blind").glob("*.de")):
        hyps = nmt.read_lines(blind_out / f"mrt-seed0-beam2.{src.stem}.en")
        assert len(hyps) == len(nmt.read_lines(src))
    recipe.stage2(recipe.dataclasses.replace(cfg, arm="ce", blind=False))
    table = recipe.report(str(tmp_path / "stage2")).splitlines()
    assert table[2].startswith("| ce | 0 |") and table[3].startswith("| mrt | 0 |")
    assert "s0: " in table[3]  # paired bootstrap p-values of mrt vs ce on the same seed
    # A val-sweep run through the command line: --set overrides YAML options (nested ones merge).
    config = tmp_path / "stage2.yaml"
    raw = recipe.dataclasses.asdict(recipe.dataclasses.replace(cfg, arm="ce", blind=False))
    config.write_text(recipe.yaml.safe_dump(raw))
    sweep = tmp_path / "sweep" / "ce-lr"
    recipe.main(
        ["stage2", "--config", str(config), "--out", str(sweep), "--set", "train.lr=0.002", "--set", "eval_sets=[val]"]
    )
    swept = json.loads((sweep / "ce-seed0" / "result.json").read_text())
    assert swept["config"]["train"] == json.loads(json.dumps({**raw["train"], "lr": 0.002})) and set(swept["eval"]) == {
        "val"
    }
    rows = recipe.sweep_report(str(tmp_path / "sweep"), str(tmp_path / "stage2")).splitlines()
    assert [r.split(" | ")[:2] for r in rows[2:]] == [["| stage2", "ce"], ["| stage2", "mrt"], ["| ce-lr", "ce"]]
    assert "weight=1.0, alpha=1.0, samples=3" in rows[3]
    with pytest.raises(SystemExit, match="expected key=value"):
        recipe.parse_sets(["lr"])
    with pytest.raises(SystemExit, match="unknown option 'lr'"):
        recipe.load_config(recipe.Stage2Config, None, {}, ["lr=1"])
    folder = tmp_path / "stage2" / "mrt-seed0" / "model"
    s3 = recipe.Stage3Config(
        data=str(SAMPLE),
        model=str(folder),
        name="smoke",
        out=str(tmp_path / "stage3"),
        limit=5,
        nbest_beams=2,
        sample_sizes=[3],
        precision="32-true",
        outputs=str(blind_out),
    )
    rows = recipe.stage3(s3)["rows"]
    assert set(rows) == {
        "beam5-top1",
        "beam2-nbest+mbr-bertscore",
        "beam2-nbest+mbr-chrf",
        "eps3+mbr-bertscore",
        "eps3+mbr-chrf",
    }
    for key in ("beam2-nbest", "eps3"):
        cands = json.loads((tmp_path / "stage3" / f"smoke-{key}.test_2016_flickr.json").read_text())
        assert len(cands) == 5 and all(len(c) >= 1 for c in cands)
        for utility in ("bertscore", "chrf"):
            chosen = nmt.read_lines(blind_out / f"smoke-{key}+mbr-{utility}.test_2016_flickr.en")
            assert len(chosen) == 5 and all(c in cands[i] for i, c in enumerate(chosen))
    # Another method and utility list, and the plain generate sampler: other row names, the same checks.
    other = recipe.stage3(
        recipe.dataclasses.replace(
            s3, name="agg", method="aggregate-exact", utilities=["chrf"], sampler="generate", blind=False
        )
    )["rows"]
    assert set(other) == {"beam5-top1", "beam2-nbest+mbr-chrf-aggregate-exact", "eps3+mbr-chrf-aggregate-exact"}
    # The blind sets alone (scored: false): every decoder's output, one line per source line; scored rows kept.
    blind = recipe.stage3(recipe.dataclasses.replace(s3, name="blindonly", scored=False, blind=True))
    assert blind["rows"] == {} and not (tmp_path / "stage3" / "blindonly-stage3.json").exists()
    for src in sorted((SAMPLE / "blind").glob("*.de")):
        assert set(blind["blind_seconds_per_sentence"][src.stem]) == set(rows)
        for key in rows:
            out = nmt.read_lines(blind_out / f"blindonly-{key}.{src.stem}.en")
            assert len(out) == len(nmt.read_lines(src))


def test_stage3_mbr_chrf_is_the_registry_utility(recipe):
    from rerank import ChrF, mbr

    cands = ["a dog runs on the grass", "a dog runs on grass", "a cat sleeps", "a dog is running on the grass"]
    utility = recipe.mbr_utility("chrf")
    assert isinstance(utility, ChrF)
    assert mbr([cands], utility=utility)[0].best_index in (0, 1)
    assert mbr([["only one"]], utility=utility)[0].best_index == 0


def test_mbr_pools_leave_one_out_is_the_rerankers_mbr_and_picks_come_from_their_pools():
    from bertscore_loss import BERTScorer
    from rerank import NBestReranker

    pools = _load("mbr_pools")
    samples = [
        ["a dog runs on the grass", "a dog runs on grass", "a cat sleeps", "the dog is running"],
        ["two men play music", "two men are playing music", "a man sings"],
    ]
    nbest = [["a dog is running on the grass", "a dog runs"], ["two men are playing instruments"]]
    reranker = NBestReranker(scorer=BERTScorer())
    picks = pools.choose(nbest, samples, reranker)
    assert picks["loo"] == [r.best for r in reranker.rerank(samples)]  # include_self=False: leave-one-out
    for i in range(2):
        assert picks["nbest"][i] in nbest[i]
        assert picks["pool-self"][i] in samples[i] + nbest[i] and picks["pool-loo"][i] in samples[i] + nbest[i]
    # n-best vs samples = the reranker's MBR of the n-best list with the samples as pseudo-references
    assert picks["nbest"] == [r.best for r in reranker.rerank(nbest, pseudo_references=samples)]
