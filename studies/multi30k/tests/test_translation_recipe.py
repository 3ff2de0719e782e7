"""The Multi30k recipe (studies/multi30k) on a committed sample with tiny models.

Fast: bad input ends in one clear line (config files, --set keys and values, missing model folders,
corrupt checkpoints), settings stored with a run refuse a changed rerun, the stage-2 batches are a function
of the update, equal-time lengths, and blind outputs stay out of docs/. Slow: stage 1 resumes; every
stage-2 arm's loss decreases; stage 2 pauses and resumes exactly and keeps the best val weights; the
`recipe.py smoke` command runs every stage; stage 3's reranked outputs are members of their lists.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "tests" / "data" / "multi30k"
RECIPE = ROOT / "studies" / "multi30k"


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


@pytest.fixture(scope="module")
def tiny_model(recipe, tmp_path_factory):
    """An untrained tiny generator folder (HF Marian + spm.model from the sample), with dropout."""
    nmt = recipe.nmt
    folder = tmp_path_factory.mktemp("tiny") / "model"
    nmt.train_sentencepiece(SAMPLE, folder, 250)
    torch.manual_seed(0)
    nmt.build_model(nmt.ModelConfig(d_model=32, layers=1, heads=2, ffn=64, dropout=0.1), 250).save_pretrained(folder)
    return folder


def _stage2_cfg(recipe, init: Path, out: Path, **kw):
    nmt = recipe.nmt
    base = recipe.Stage2Config(
        data=str(SAMPLE),
        init=str(init),
        out=str(out),
        arm="ce",
        updates=8,
        batch_tokens=200,
        precision="32-true",
        val_every=0.05,  # 0.05 of an epoch of the sample: 3 updates at 200 tokens a batch
        val_limit=6,
        eval_sets=["val"],
        eval_limit=6,
        blind=False,
        beams=2,
        train=nmt.TrainConfig(lr=3e-3, warmup=2),
    )
    return recipe.dataclasses.replace(base, **kw)


# ------------------------------------------------------------------------------------- bad input: one line each
def _exits(recipe, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as info:
        recipe.main(argv)
    message = str(info.value.code)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_config_errors_are_one_line(recipe, tmp_path):
    missing = tmp_path / "nope.yaml"
    assert _exits(recipe, ["stage2", "--config", str(missing)]) == f"--config {missing}: no such file"
    listing = tmp_path / "list.yaml"
    listing.write_text("- updates: 5\n- arm: ce\n")
    msg = _exits(recipe, ["stage2", "--config", str(listing)])
    assert msg == f"--config {listing}: expected a mapping of option: value, got a YAML list"
    broken = tmp_path / "broken.yaml"
    broken.write_text("updates: [5\n")
    assert f"--config {broken}: not valid YAML" in _exits(recipe, ["stage1", "--config", str(broken)])
    msg = _exits(recipe, ["stage2", "--set", "updaets=5"])
    assert msg.startswith("--set: unknown option 'updaets' (did you mean 'updates'? known: data, init, out,")
    msg = _exits(recipe, ["stage2", "--set", "train.lrr=0.1"])
    assert msg.startswith("--set train: unknown option 'lrr' (did you mean 'lr'?")
    assert "--set: unknown option 'model'" in _exits(recipe, ["stage2", "--set", "model.layers=2"])  # stage 1 only
    typo = tmp_path / "typo.yaml"
    typo.write_text("updates: 5\ntrain:\n  warmpu: 3\n")
    assert _exits(recipe, ["stage2", "--config", str(typo)]).startswith(
        f"{typo} train: unknown option 'warmpu' (did you mean 'warmup'?"
    )
    assert _exits(recipe, ["stage2", "--set", "updates=many"]) == "option 'updates': 'many' is not an integer or null"
    assert "option 'eval_sets': 3 is not a list of a string" in _exits(recipe, ["stage2", "--set", "eval_sets=3"])
    assert _exits(recipe, ["stage2", "--set", "blind"]) == "--set 'blind': expected key=value"
    assert "--set 'top_k=[1': the value is not valid YAML" in _exits(recipe, ["stage2", "--set", "top_k=[1"])
    # a good file and good --set items still load, nested ones merged into the file's mapping
    good = tmp_path / "good.yaml"
    good.write_text("updates: 5\ntrain:\n  lr: 0.001\n  warmup: 3\n")
    cfg = recipe.load_config(recipe.Stage2Config, str(good), {"arm": "mrt"}, ["train.lr=2e-4", "weight=3"])
    assert (cfg.updates, cfg.arm, cfg.weight, cfg.train.lr, cfg.train.warmup) == (5, "mrt", 3, 2e-4, 3)


def test_a_missing_model_folder_names_the_command_that_makes_it(recipe, tmp_path):
    stage1 = tmp_path / "stage1"
    data = ["--set", f"data={SAMPLE}"]  # the committed sample: this test never needs ../shared
    stage2 = ["stage2", *data, "--set", f"init={stage1}/model", "--set", "updates=2", "--out", str(tmp_path)]
    msg = _exits(recipe, stage2)
    assert msg.startswith(f"init {stage1}/model: the model folder does not exist;")
    assert f"recipe.py stage1 --config studies/multi30k/configs/stage1.yaml --out {stage1}" in msg
    folder = tmp_path / "runs" / "stage2" / "mrt-seed1" / "model"
    msg = _exits(recipe, ["stage3", *data, "--model", str(folder), "--out", str(tmp_path / "s3")])
    assert f"recipe.py stage2 --arm mrt --seed 1 --out {folder.parent.parent}" in msg
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    evaluate = ["evaluate", "--data", str(SAMPLE), "--model", str(folder)]
    assert "the model folder has no spm.model;" in _exits(recipe, evaluate)
    hint = recipe.model_hint("models/multi30k-de-en")
    assert "committed converged base" in hint and "studies/multi30k/configs/converged.yaml" in hint
    assert not (tmp_path / "s3").exists() and not (tmp_path / "mrt-seed0").exists()  # nothing written


def test_settings_are_stored_and_a_changed_rerun_is_refused(recipe, tmp_path):
    cfg = recipe.Stage2Config(arm="bertscore", updates=6, weight=1.0)
    recipe.check_settings(tmp_path, cfg, resumable=recipe.STAGE2_RESUMABLE)
    stored = json.loads((tmp_path / "settings.json").read_text())
    assert stored["weight"] == 1.0 and stored["train"]["lr"] == 1e-4
    recipe.check_settings(tmp_path, cfg, resumable=recipe.STAGE2_RESUMABLE)  # same settings: fine
    # how long one invocation runs and where blind outputs go may change
    recipe.check_settings(
        tmp_path, recipe.dataclasses.replace(cfg, stop_at=3, outputs="x"), resumable=recipe.STAGE2_RESUMABLE
    )
    changed = recipe.dataclasses.replace(cfg, weight=5.0, train=recipe.nmt.TrainConfig(lr=2e-4, warmup=50))
    with pytest.raises(SystemExit) as info:
        recipe.check_settings(tmp_path, changed, resumable=recipe.STAGE2_RESUMABLE)
    assert "(train.lr: 0.0001 -> 0.0002; weight: 1.0 -> 5.0)" in str(info.value) and "--fresh" in str(info.value)
    # an option the stored run did not know yet counts as its default value
    del stored["patience"]
    (tmp_path / "settings.json").write_text(json.dumps(stored))
    recipe.check_settings(tmp_path, cfg, resumable=recipe.STAGE2_RESUMABLE)
    with pytest.raises(SystemExit, match=r"patience: None -> 2"):
        recipe.check_settings(tmp_path, recipe.dataclasses.replace(cfg, patience=2), resumable=recipe.STAGE2_RESUMABLE)
    # a run made before settings.json existed is compared with its result.json's config
    (tmp_path / "settings.json").unlink()
    with pytest.raises(SystemExit, match=r"weight: 1.0 -> 5.0"):
        recipe.check_settings(tmp_path, changed, before=stored, resumable=recipe.STAGE2_RESUMABLE)
    (tmp_path / "old.txt").write_text("x")
    recipe.check_settings(tmp_path, changed, fresh=True, before=stored, resumable=recipe.STAGE2_RESUMABLE)
    assert not (tmp_path / "old.txt").exists()  # --fresh emptied the run folder
    assert json.loads((tmp_path / "settings.json").read_text())["weight"] == 5.0


def test_a_corrupt_checkpoint_is_one_line(recipe, tiny_model, tmp_path):
    run = tmp_path / "ce-seed0"
    (run / "checkpoints").mkdir(parents=True)
    full = tmp_path / "full.pt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "global_step": 3}, full)
    (run / "checkpoints" / "last.ckpt").write_bytes(full.read_bytes()[:700])  # truncated
    argv = ["stage2", "--set", f"init={tiny_model}", "--set", f"data={SAMPLE}", "--set", "updates=2"]
    argv += ["--out", str(tmp_path)]
    msg = _exits(recipe, argv)
    assert msg.startswith(f"{run}/checkpoints/last.ckpt: truncated or corrupt checkpoint (") and "--fresh" in msg
    torch.save({"weights": 1}, run / "checkpoints" / "last.ckpt")
    assert "(not a Lightning checkpoint)" in _exits(recipe, argv)
    epoch = tmp_path / "epoch-003.pt"
    epoch.write_bytes(b"")
    with pytest.raises(SystemExit, match="epoch-003.pt: truncated or corrupt weights"):
        recipe.average_weights([epoch])


def documented_commands() -> list[list[str]]:
    """Every ``recipe.py`` command of the Multi30k record's bash blocks and of the configs' comments, the
    block's assignments and loop variables (their first value) filled."""
    import shlex

    texts = re.findall(
        r"```bash\n(.*?)```", (ROOT / "docs/results/finetuning-multi30k/record.md").read_text("utf-8"), re.S
    )
    texts += [p.read_text(encoding="utf-8") for p in sorted((RECIPE / "configs").glob("*.yaml"))]
    commands = []
    for text in texts:
        text = re.sub(r"\\\n#?\s*", " ", text)  # continuation lines (in configs: commented)
        variables: dict[str, str] = {}  # shell assignments of the block (C=configs/...), used below them
        for line in text.splitlines():
            for part in line.split(";"):  # assignments (C=...; R=...) and loops (for w in 2 20; do): first value
                if m := re.fullmatch(r"\s*([A-Za-z_]\w*)=(\S+)\s*", part) or re.fullmatch(
                    r"\s*for (\w+) in (\S+).*", part
                ):
                    variables[m[1]] = m[2]
            if "studies/multi30k/recipe.py" not in line:
                continue
            for name, value in variables.items():
                line = re.sub(rf"\$\{{?{name}\b\}}?", value, line)
            line = line.split("recipe.py", 1)[1].split("#")[0].split("`")[0]
            line = line.replace("$seed", "0").replace("$arm", "bertscore").replace("<arm>", "mrt")
            commands.append(shlex.split(line))
    return commands


def test_documented_commands_configure(recipe, monkeypatch):
    monkeypatch.chdir(ROOT)  # the configs' paths are relative to the project root
    commands = documented_commands()
    stages = [c[0] for c in commands]
    assert stages.count("stage2") >= 10 and {"stage1", "stage3", "report", "smoke"} <= set(stages)
    for argv in commands:
        assert not any("$" in a for a in argv), f"unexpanded shell variable in a documented command: {argv}"
        args, cfg = recipe.configure(argv)  # parses, reads the config file, applies --set: no SystemExit
        if "stage2-converged.yaml" in argv:
            assert (cfg.epochs, cfg.batch_tokens, cfg.val_every, cfg.init) == (2, 2048, 0.5, "models/multi30k-de-en")


def test_loaded_models_keep_their_sinusoidal_positions_fixed(recipe, tiny_model):
    # save_pretrained drops the position tables and from_pretrained rebuilds them: trained ones would be lost
    model, _ = recipe.load_model(tiny_model)
    tables = [(n, p) for n, p in model.named_parameters() if "embed_positions" in n]
    assert len(tables) == 2 and not any(p.requires_grad for _, p in tables)
    for module in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
        assert torch.equal(module.weight, module.create_weight())


def test_step_batches_are_a_function_of_the_update(recipe):
    nmt = recipe.nmt
    lengths = [(i * 7) % 23 + 3 for i in range(200)]
    base = nmt.TokenBudgetSampler(lengths, 60, True, seed=4)
    per_epoch = [len(base)]
    base.set_epoch(1)
    per_epoch.append(len(base))
    epochs = []
    for e in range(3):
        base.set_epoch(e)
        epochs += list(base)
    stop = per_epoch[0] + per_epoch[1] + 5  # into the third epoch
    whole = list(nmt.StepBatches(nmt.TokenBudgetSampler(lengths, 60, True, seed=4), stop))
    assert whole == epochs[:stop]
    for start in (0, 7, per_epoch[0], per_epoch[0] + 3, stop):
        tail = nmt.StepBatches(nmt.TokenBudgetSampler(lengths, 60, True, seed=4), stop, start)
        assert list(tail) == whole[start:] and len(tail) == stop
    with pytest.raises(ValueError, match="start <= stop"):
        nmt.StepBatches(base, 3, 4)


def test_equal_time_length_comes_from_the_runs(recipe, tmp_path):
    def result(folder: Path, **r) -> Path:
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(r))
        return folder

    sem = result(
        tmp_path / "s2" / "bertscore-seed1", arm="bertscore", seed=1, updates=40, updates_trained=30, train_seconds=48.0
    )
    cfg = recipe.Stage2Config(equal_time=str(sem), seed=1, epochs=2.0)
    with pytest.raises(SystemExit, match=r"ce-seed1/result.json is missing: run the ce arm of seed 1"):
        recipe.run_length(cfg, 100)
    result(tmp_path / "s2" / "ce-seed1", arm="ce", seed=1, seconds_per_update=0.32)
    updates, basis = recipe.run_length(cfg, 100)  # equal_time wins over epochs
    assert updates == round(48.0 / 0.32) == 150 and basis["ce_seconds_per_update"] == 0.32
    assert basis["arm"] == "bertscore" and basis["arm_updates"] == 30
    updates, basis = recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=2.5), 100)
    assert updates == 75 and basis["ratio"] == 2.5  # 30 updates × 2.5
    bench = tmp_path / "speed.json"
    bench.write_text(json.dumps({"ratio_to_ce": {"ce": 1.0, "bertscore": 1.5}}))
    assert recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=str(bench)), 100)[0] == 45
    arms = {"ce": {"ratio_to_ce": 1.0}, "bertscore": {"ratio_to_ce": 2.0}}
    bench.write_text(json.dumps({"batch_tokens": 768, "arms": arms}))
    updates, basis = recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=str(bench)), 100)
    assert updates == 60 and basis["ratio_batch_tokens"] == 768  # benchmarks/translation_arms.py's JSON
    with pytest.raises(SystemExit, match=r"no ratio_to_ce for 'bertscore' in it \(has \['mrt'\]\)"):
        bench.write_text(json.dumps({"ratio_to_ce": {"mrt": 6.0}}))
        recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=str(bench)), 100)
    # an mrt run on 32 sources an update is timed by the benchmark arm with semantic_rows 32, not full-batch mrt
    arms = {
        "ce": {"arm": "ce", "options": {}, "ratio_to_ce": 1.0},
        "mrt": {"arm": "mrt", "options": {"arm": "mrt", "weight": 10.0}, "ratio_to_ce": 10.0},
        "mrt-rows32": {"arm": "mrt", "options": {"arm": "mrt", "semantic_rows": 32}, "ratio_to_ce": 4.0},
    }
    bench.write_text(json.dumps({"batch_tokens": 100, "arms": arms}))
    mrt = result(
        tmp_path / "s3" / "mrt-seed1", arm="mrt", seed=1, updates=40, train_seconds=9.0, config={"semantic_rows": 32}
    )
    rows32 = recipe.dataclasses.replace(cfg, equal_time=str(mrt), time_ratio=str(bench))
    updates, basis = recipe.run_length(rows32, 100)
    assert updates == 160 and basis["ratio_arm"] == "mrt-rows32"  # 40 updates × 4.0
    # two arms timed with the run's cost settings at different ratios (DPO on other pairs): never the first silently
    arms["mrt-rows32-other-data"] = {"arm": "mrt", "options": {"arm": "mrt", "semantic_rows": 32}, "ratio_to_ce": 5.0}
    bench.write_text(json.dumps({"batch_tokens": 100, "arms": arms}))
    with pytest.raises(SystemExit, match=r"different ratios \(mrt-rows32 4, mrt-rows32-other-data 5\)"):
        recipe.run_length(rows32, 100)
    updates, basis = recipe.run_length(recipe.dataclasses.replace(rows32, time_ratio_arm="mrt-rows32-other-data"), 100)
    assert updates == 200 and basis["ratio_arm"] == "mrt-rows32-other-data"  # 40 × 5.0
    for label, match in (("nope", "no such arm"), ("mrt", "timed with other settings")):
        with pytest.raises(SystemExit, match=match):
            recipe.run_length(recipe.dataclasses.replace(rows32, time_ratio_arm=label), 100)
    del arms["mrt-rows32-other-data"]
    bench.write_text(json.dumps({"batch_tokens": 100, "arms": arms}))
    full = result(tmp_path / "s4" / "mrt-seed1", arm="mrt", seed=1, updates=40, train_seconds=9.0, config={})
    updates, basis = recipe.run_length(recipe.dataclasses.replace(rows32, equal_time=str(full)), 100)
    assert updates == 400 and basis["ratio_arm"] == "mrt"  # 40 × 10.0
    rows16 = result(
        tmp_path / "s5" / "mrt-seed1", arm="mrt", seed=1, updates=40, train_seconds=9.0, config={"semantic_rows": 16}
    )
    with pytest.raises(
        SystemExit, match=r"no arm in it was timed with this run's settings \{'arm': 'mrt', 'semantic_rows': 16\}"
    ):
        recipe.run_length(recipe.dataclasses.replace(rows32, equal_time=str(rows16)), 100)
    arms["mrt-rows32"]["settings"] = recipe.cost_settings("mrt", {"semantic_rows": 16})  # the benchmark's record wins
    bench.write_text(json.dumps({"batch_tokens": 100, "arms": arms}))
    assert recipe.run_length(recipe.dataclasses.replace(rows32, equal_time=str(rows16)), 100)[0] == 160
    with pytest.raises(SystemExit, match="expected a semantic arm's run of seed 0, got bertscore seed 1"):
        recipe.run_length(recipe.dataclasses.replace(cfg, seed=0), 100)
    with pytest.raises(SystemExit, match="only the ce arm"):
        recipe.run_length(recipe.dataclasses.replace(cfg, arm="mrt"), 100)
    assert recipe.run_length(recipe.Stage2Config(epochs=2.0), 251) == (502, None)
    assert recipe.run_length(recipe.Stage2Config(epochs=0.5), 251) == (126, None)
    with pytest.raises(SystemExit, match="set one of them"):
        recipe.run_length(recipe.Stage2Config(epochs=2.0, updates=10), 251)
    with pytest.raises(SystemExit, match="needs a length"):
        recipe.run_length(recipe.Stage2Config(), 251)


def _git_repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def _track(*files: Path) -> None:
    for f in files:
        subprocess.run(["git", "-C", str(f.parent), "add", "--", f.name], check=True)


def test_blind_outputs_go_under_the_run_and_never_overwrite_a_committed_file(recipe, tmp_path, monkeypatch):
    cfg = recipe.Stage2Config()
    assert recipe.outputs_dir(cfg, tmp_path / "run") == tmp_path / "run" / "outputs"
    assert recipe.outputs_dir(recipe.dataclasses.replace(cfg, outputs="docs/x"), tmp_path) == recipe.ROOT / "docs/x"
    repo = _git_repo(tmp_path / "repo")
    published = repo / "docs" / "out" / "ce-seed0-beam5.test_2017_flickr.en"
    recipe.write_output(published, ["a dog .", "two men ."])  # a new file under docs/: asked for by outputs=
    _track(published)
    with pytest.raises(SystemExit, match=r"ce-seed0-beam5.test_2017_flickr.en: git tracks it .*pass --overwrite"):
        recipe.write_output(published, ["a cat .", "two men ."])
    assert published.read_text() == "a dog .\ntwo men .\n"
    recipe.write_output(published, ["a cat .", "two men ."], overwrite=True)
    assert published.read_text() == "a cat .\ntwo men .\n"
    elsewhere = tmp_path / "runs" / "x.en"
    recipe.write_output(elsewhere, ["a"])
    recipe.write_output(elsewhere, ["b"])  # run folders may be rewritten
    assert elsewhere.read_text() == "b\n"
    import bertscore_loss.outputs as outputs

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs.os, "replace", interrupted)  # stopped after the text, before the rename
    with pytest.raises(KeyboardInterrupt):
        recipe.write_output(elsewhere, ["c", "d"])
    assert elsewhere.read_text() == "b\n" and [p.name for p in elsewhere.parent.iterdir()] == ["x.en"]


def test_g10_no_default_path_points_into_docs(recipe, tmp_path):
    docs = (recipe.ROOT / "docs").resolve()

    def paths(cfg) -> list[Path]:
        return [recipe.resolve(getattr(cfg, f)) for f in ("out", "outputs", "data") if getattr(cfg, f, None)]

    configs = [recipe.Stage1Config(), recipe.Stage2Config(), recipe.Stage3Config()]
    smoke = recipe.smoke_configs(recipe.resolve("runs/multi30k/smoke"))
    configs += [smoke["stage1"], smoke["equal_time"], smoke["stage3"], *smoke["stage2"].values()]
    for cfg in configs:
        for path in paths(cfg):
            assert not path.resolve().is_relative_to(docs), (type(cfg).__name__, path)
    # a stage-3 run without --config decodes into runs/, not over the published docs/multi30k-outputs
    _, cfg = recipe.configure(["stage3", "--model", "m", "--name", "x"])
    assert recipe.resolve(cfg.outputs) == recipe.ROOT / "runs" / "multi30k" / "stage3" / "outputs"
    args = recipe.build_parser().parse_args(["smoke"])
    assert recipe.resolve(args.out).is_relative_to(recipe.ROOT / "runs")


def _no_decoding(recipe, monkeypatch):
    """Make any decoding or model loading fail the test: the checks must come first."""

    def reached(*a, **k):
        raise AssertionError("decoding started before the config and outputs were checked")

    monkeypatch.setattr(recipe.nmt, "translate", reached)
    monkeypatch.setattr(recipe.nmt, "sample", reached)
    monkeypatch.setattr(recipe, "load_model", reached)


def test_g10_stage3_refuses_committed_outputs_before_decoding(recipe, tiny_model, tmp_path, monkeypatch):
    repo = _git_repo(tmp_path / "repo")
    published = repo / "docs" / "multi30k-outputs"
    published.mkdir(parents=True)
    blind = sorted((SAMPLE / "blind").glob("*.de"))
    committed = published / f"best-beam5-top1.{blind[0].stem}.en"
    committed.write_text("published\n")
    _track(committed)
    _no_decoding(recipe, monkeypatch)
    argv = ["stage3", "--model", str(tiny_model), "--out", str(tmp_path / "s3"), "--set", f"data={SAMPLE}"]
    argv += ["--set", "blind=true", "--set", f"outputs={published}", "--set", "sample_sizes=[2]"]
    msg = _exits(recipe, argv)
    assert msg == (
        f"refusing to overwrite {committed}: git tracks it (a committed file); pass --overwrite to replace it, "
        "or write elsewhere"
    )
    assert committed.read_text() == "published\n" and not (tmp_path / "s3").exists()  # not even the settings


@pytest.mark.slow
def test_g10_stage3_overwrites_a_committed_file_with_overwrite(recipe, tiny_model, tmp_path):
    repo = _git_repo(tmp_path / "repo")
    out = repo / "docs" / "outs"
    out.mkdir(parents=True)
    committed = out / "t-beam5-top1.test_2016_flickr.en"
    committed.write_text("published\n")
    _track(committed)
    argv = [
        "stage3",
        "--model",
        str(tiny_model),
        "--name",
        "t",
        "--out",
        str(tmp_path / "s3"),
        "--set",
        f"data={SAMPLE}",
    ]
    argv += ["--set", f"outputs={out}", "--set", "limit=2", "--set", "nbest_beams=1", "--set", "sample_sizes=[]"]
    argv += ["--set", "utilities=[chrf]", "--set", "blind=false", "--set", "precision=32-true", "--overwrite"]
    recipe.main(argv)
    assert len(committed.read_text().splitlines()) == 2
    assert json.loads((tmp_path / "s3" / "t-stage3.json").read_text())["rows"].keys() == {
        "beam5-top1",
        "beam1-nbest+mbr-chrf",
    }


def test_g10_stage2_refuses_committed_blind_outputs_before_training(recipe, tiny_model, tmp_path, monkeypatch):
    repo = _git_repo(tmp_path / "repo")
    dest = repo / "docs" / "converged"
    dest.mkdir(parents=True)
    blind = sorted((SAMPLE / "blind").glob("*.de"))
    committed = dest / f"ce-seed0-beam5.{blind[-1].stem}.en"
    committed.write_text("published\n")
    _track(committed)

    def trainer(*a, **k):
        raise AssertionError("training started before the outputs were checked")

    monkeypatch.setattr(recipe.pl, "Trainer", trainer)
    argv = ["stage2", "--set", f"init={tiny_model}", "--set", f"data={SAMPLE}", "--set", "updates=2"]
    argv += ["--out", str(tmp_path / "s2"), "--set", f"outputs={dest}"]
    assert _exits(recipe, argv).endswith(
        "git tracks it (a committed file); pass --overwrite to replace it, or write elsewhere"
    )
    assert committed.read_text() == "published\n" and not (tmp_path / "s2").exists()


def test_g13_stage3_config_errors_are_one_line_before_any_decoding(recipe, tiny_model, tmp_path, monkeypatch):
    _no_decoding(recipe, monkeypatch)
    base = ["stage3", "--model", str(tiny_model), "--out", str(tmp_path / "s3"), "--set", f"data={SAMPLE}"]
    cases = [
        (["--set", "method=bogus"], "method: unknown MBR method 'bogus': choose one of"),
        (["--set", "utilities=[bertscore, chrff]"], "utilities: unknown MBR utility 'chrff' (did you mean 'chrf'?"),
        (["--set", "utilities=[]"], "utilities: give at least one MBR utility"),
        (["--set", "sample_sizes=[16, 0]"], "sample_sizes must all be >= 1 samples per source, got [16, 0]"),
        (["--set", "nbest_beams=0"], "nbest_beams must be >= 1, got 0"),
        (["--set", "epsilon=1.5"], "epsilon must be in [0, 1), got 1.5"),
        (["--set", "precision=bf61"], "precision must be one of auto, 32-true, bf16-mixed, got 'bf61'"),
        (["--set", "sampler=beam"], "sampler must be 'fast' or 'generate', got 'beam'"),
        (["--set", "scored=false", "--set", "blind=false"], "scored: false and blind: false leave nothing"),
        (["--set", "split=test_2099"], f"data {SAMPLE} has no test_2099.de and no test_2099.en: is split"),
        (["--set", f"data={tmp_path / 'nowhere'}"], f"data {tmp_path / 'nowhere'}: no such folder"),
    ]
    empty = tmp_path / "no-blind"
    empty.mkdir()
    for name in ("test_2016_flickr.de", "test_2016_flickr.en"):
        (empty / name).write_text((SAMPLE / name).read_text())
    cases.append((["--set", f"data={empty}", "--set", "blind=true"], f"blind: true but data {empty} has no blind/*.de"))
    for extra, start in cases:
        msg = _exits(recipe, [*base, *extra])
        assert msg.startswith(start), (extra, msg)
    assert not (tmp_path / "s3").exists()  # nothing written, not even the settings
    # the same settings through configure (no data read): every documented stage-3 command passes it
    with pytest.raises(SystemExit, match="sample_sizes must all be >= 1"):
        recipe.configure(["stage3", "--set", "sample_sizes=[0]"])


@pytest.mark.slow
def test_g13_a_config_error_exits_with_status_2_as_a_script(tmp_path):
    done = subprocess.run(
        [sys.executable, str(RECIPE / "recipe.py"), "stage3", "--set", "method=bogus"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1].startswith("recipe.py: error: method: unknown MBR method 'bogus'")
    assert "Traceback" not in done.stderr


# ---------------------------------------------------------------------------------------- stage-2 protocol
@pytest.mark.slow
def test_stage2_pauses_and_resumes_exactly_and_keeps_the_best_val_weights(recipe, tiny_model, tmp_path):
    nmt, metrics = recipe.nmt, recipe.metrics
    # select chrF: this untrained model's val chrF peaks after a few updates (its garbage at update 0 has the best F)
    whole = recipe.stage2(_stage2_cfg(recipe, tiny_model, tmp_path / "whole", select="chrf"))
    paused = _stage2_cfg(recipe, tiny_model, tmp_path / "paused", stop_at=3, select="chrf")
    first = recipe.stage2(paused)
    assert first["status"] == "paused" and first["updates_done"] == 3
    run = tmp_path / "paused" / "ce-seed0"
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "result.json").exists()
    resumed = recipe.stage2(recipe.dataclasses.replace(paused, stop_at=None))  # stop_at may change between calls
    # The same batches, random states, optimizer and schedule: the resumed run is the uninterrupted one.
    strip = ("seconds",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in resumed["val_curve"]] == [
        {k: v for k, v in r.items() if k not in strip} for r in whole["val_curve"]
    ]
    every = whole["val_every"]
    assert every == round(0.05 * whole["batches_per_epoch"]) and 1 < every < 8
    assert [r["step"] for r in whole["val_curve"]] == [*range(0, 8, every), 8]
    assert resumed["updates_trained"] == whole["updates_trained"] == 8 and len(resumed["step_seconds"]) == 8
    assert resumed["train_seconds"] == pytest.approx(sum(resumed["step_seconds"]))
    a = recipe.load_model(tmp_path / "whole" / "ce-seed0" / "model")[0].state_dict()
    b = recipe.load_model(run / "model")[0].state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The checkpoint rule: the kept weights are those of the best val score, and decode to that score again.
    best = max(whole["val_curve"], key=lambda r: r["chrf"])
    assert whole["chosen_update"] == best["step"] > 0 and whole["chosen_val"] == best
    model, sp = recipe.load_model(tmp_path / "whole" / "ce-seed0" / "model")
    src, refs = nmt.read_pairs(SAMPLE, "val", 6)
    again = metrics.corpus_scores(nmt.translate(model, sp, src, beams=1, precision="32-true"), refs)
    assert again["chrf"] == pytest.approx(best["chrf"]) and again["bertscore_f"] == pytest.approx(best["bertscore_f"])
    curve = json.loads((run / "curve.json").read_text())
    assert curve["best"]["step"] == resumed["chosen_update"] and curve["curve"] == resumed["val_curve"]
    # A rerun with other settings is refused before any work; the same command returns the finished run.
    config = tmp_path / "stage2.yaml"
    settings = recipe.dataclasses.asdict(recipe.dataclasses.replace(paused, stop_at=None))
    config.write_text(recipe.yaml.safe_dump(settings))
    with pytest.raises(SystemExit, match=r"other settings \(updates: 8 -> 6; weight: 1.0 -> 5.0\)\. Use another"):
        recipe.main(["stage2", "--config", str(config), "--weight", "5", "--set", "updates=6"])
    with pytest.raises(SystemExit, match=r"other settings \(select: 'chrf' -> 'bertscore_f'\)"):
        recipe.main(["stage2", "--config", str(config), "--set", "select=bertscore_f"])
    recipe.main(["stage2", "--config", str(config)])  # the same command: the finished run, not trained again
    assert json.loads((run / "result.json").read_text())["train_seconds"] == resumed["train_seconds"]


@pytest.mark.slow
def test_stage2_patience_stops_every_arm_by_the_same_rule(recipe, tiny_model, tmp_path):
    cfg = _stage2_cfg(recipe, tiny_model, tmp_path, updates=40, patience=1, train=recipe.nmt.TrainConfig(lr=0.0))
    r = recipe.stage2(cfg)  # lr 0: val never improves after update 0, so the first validation stops the run
    assert r["stopped_early"] and r["updates_trained"] == r["val_every"] and r["chosen_update"] == 0
    assert [row["step"] for row in r["val_curve"]] == [0, r["val_every"]]


@pytest.mark.slow
def test_smoke_command_runs_every_stage_and_writes_nothing_into_docs(recipe, tmp_path):
    def tree(folder: Path) -> dict:
        return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}

    docs = tree(ROOT / "docs")
    recipe.main(["smoke", "--out", str(tmp_path)])
    assert tree(ROOT / "docs") == docs
    nmt = recipe.nmt
    assert (tmp_path / "stage1" / "model" / "spm.model").is_file()
    for arm in nmt.ARMS:
        run = tmp_path / "stage2" / f"{arm}-seed0"
        r = json.loads((run / "result.json").read_text())
        steps = [row["step"] for row in r["val_curve"]]
        assert r["val_every"] == round(0.1 * r["batches_per_epoch"])
        assert steps[0] == 0 and steps[-1] == r["updates_trained"] and steps[1] == r["val_every"]
        assert r["chosen_val"] == max(r["val_curve"], key=lambda row: row["bertscore_f"])
        assert json.loads((run / "settings.json").read_text())["arm"] == arm
        for src in sorted((SAMPLE / "blind").glob("*.de")):  # blind outputs under the run folder by default
            out = nmt.read_lines(run / "outputs" / f"{arm}-seed0-beam2.{src.stem}.en")
            assert len(out) == len(nmt.read_lines(src))
    equal = json.loads((tmp_path / "equal-time" / "bertscore" / "ce-seed0" / "result.json").read_text())
    sem = json.loads((tmp_path / "stage2" / "bertscore-seed0" / "result.json").read_text())
    ce = json.loads((tmp_path / "stage2" / "ce-seed0" / "result.json").read_text())
    assert equal["updates"] == round(sem["train_seconds"] / ce["seconds_per_update"])
    assert equal["equal_time"]["arm_train_seconds"] == sem["train_seconds"]
    report = (tmp_path / "report.md").read_text()
    for heading in ("**test_2016_flickr**", "**val**", "**training**", "**equal time, test_2016_flickr**"):
        assert heading in report
    assert "| bertscore | 0 |" in report and "| ce-seed0 |" in report
    rows = json.loads((tmp_path / "stage3" / "bertscore-seed0-stage3.json").read_text())["rows"]
    assert "beam5-top1" in rows and (tmp_path / "stage3" / "bertscore-seed0.settings.json").is_file()
    assert {p.name for p in (tmp_path / "stage3" / "outputs").glob("*.test_2017_flickr.en")}


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
    assert first["val_curve"] == [] and first["chosen_update"] == 2  # no val_every: the last weights
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
    table = recipe.report(str(tmp_path / "stage2"), "test_2016_flickr", training=False).splitlines()
    assert table[0] == "**test_2016_flickr**"
    assert table[4].startswith("| ce | 0 |") and table[5].startswith("| mrt | 0 |")
    assert "s0: " in table[5]  # paired bootstrap p-values of mrt vs ce on the same seed
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
    rows = recipe.run_stage3(s3)["rows"]
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
    with pytest.raises(SystemExit, match=r"\(limit: 5 -> 4\)"):  # stage 3 stores its settings per --name too
        recipe.run_stage3(recipe.dataclasses.replace(s3, limit=4))
    # Another method and utility list, and the plain generate sampler: other row names, the same checks.
    other = recipe.stage3(
        recipe.dataclasses.replace(
            s3, name="agg", method="aggregate-exact", utilities=["chrf"], sampler="generate", blind=False
        )
    )["rows"]
    assert set(other) == {"beam5-top1", "beam2-nbest+mbr-chrf-aggregate-exact", "eps3+mbr-chrf-aggregate-exact"}
    # The blind sets alone (scored: false): every decoder's output, one line per source line; scored rows kept.
    blind = recipe.run_stage3(recipe.dataclasses.replace(s3, name="blindonly", scored=False, blind=True))
    assert blind["rows"] == {} and not (tmp_path / "stage3" / "blindonly-stage3.json").exists()
    for src in sorted((SAMPLE / "blind").glob("*.de")):
        assert set(blind["blind_seconds_per_sentence"][src.stem]) == set(rows)
        for key in rows:
            out = nmt.read_lines(blind_out / f"blindonly-{key}.{src.stem}.en")
            assert len(out) == len(nmt.read_lines(src))


def test_stage3_mbr_chrf_is_the_registry_utility(recipe):
    from rerank import mbr
    from rerank.ngram_utility import ChrF

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


def test_report_of_published_results_without_translations(recipe, tmp_path: Path) -> None:
    """Seeds whose translations were not kept still enter the mean ± std; their p says so, the others get one."""
    nmt = recipe.nmt
    refs = nmt.read_pairs(SAMPLE, "val")[1]
    hyps = {"ce": refs[:-1] + ["a dog ."], "bertscore": refs}
    for arm, seed, bleu in [("ce", 0, 40.0), ("ce", 1, 42.0), ("bertscore", 0, 41.0), ("bertscore", 1, 44.0)]:
        run = tmp_path / f"{arm}-seed{seed}"
        run.mkdir()
        scores = {"bleu": bleu, "chrf": 60.0, "bertscore_f": 88.0, "length_ratio": 1.0}
        result = {"arm": arm, "seed": seed, "eval": {"val": scores}, "seconds_per_update": 2.0 if arm == "ce" else 3.0}
        result["config"] = {"data": str(SAMPLE), "eval_limit": None}
        (run / "result.json").write_text(json.dumps(result))
        if seed == 1:
            (run / "val.hyp.en").write_text("".join(line + "\n" for line in hyps[arm]))
    rows = recipe.report(str(tmp_path), "val", training=False).splitlines()
    assert rows[4].startswith("| ce | 0,1 | 41.00 ± 1.41 |")  # mean 41, sample std sqrt(2)
    assert rows[5].startswith("| bertscore | 0,1 | 42.50 ± 2.12 |")
    assert "s0: no translations (ce-seed0, bertscore-seed0)" in rows[5]
    assert re.search(r"s1: \d\.\d{3} / \d\.\d{3} / \d\.\d{3}", rows[5])
    assert rows[5].endswith("| 3.00 (1.5×) |")


@pytest.mark.slow
def test_report_adds_the_judge_when_every_run_was_judged(recipe, tmp_path: Path) -> None:
    """Runs scored by the independent judge get its F (mean ± std) and its paired-bootstrap p as a fourth p."""
    nmt = recipe.nmt
    refs = nmt.read_pairs(SAMPLE, "val")[1]
    hyps = {"ce": refs[:-2] + ["a dog .", "a cat ."], "mbr-dpo": refs[:-1] + ["a dog ."]}
    for arm, judge in [("ce", 90.0), ("mbr-dpo", 91.5)]:
        run = tmp_path / f"{arm}-seed0"
        run.mkdir()
        scores = {"bleu": 40.0, "chrf": 60.0, "bertscore_f": 88.0, "length_ratio": 1.0, "judge_f": judge}
        result = {"arm": arm, "seed": 0, "eval": {"val": scores}, "seconds_per_update": 2.0}
        result["config"] = {"data": str(SAMPLE), "eval_limit": None}
        (run / "result.json").write_text(json.dumps(result))
        (run / "val.hyp.en").write_text("".join(line + "\n" for line in hyps[arm]))
    rows = recipe.report(str(tmp_path), "val", training=False).splitlines()
    assert "| judge F (mpnet) | p (BLEU / chrF / BERTScore / judge) vs ce per seed |" in rows[2]
    assert rows[3].count("---") == 9
    assert rows[5].startswith(
        "| mbr-dpo | 0 | 40.00 ± 0.00 | 60.00 ± 0.00 | 88.00 ± 0.00 | 1.000 ± 0.000 | 91.50 ± 0.00 |"
    )
    p = recipe.metrics.paired_bootstrap(hyps["ce"], hyps["mbr-dpo"], refs, with_judge=True)
    assert f"s0: {p['bleu_p']:.3f} / {p['chrf_p']:.3f} / {p['bertscore_p']:.3f} / {p['judge_p']:.3f}" in rows[5]


@pytest.mark.slow
def test_equal_time_report_counts_the_data_and_adds_the_judge(recipe, tmp_path: Path) -> None:
    """The equal-time table shows the arm's data seconds beside its training's, and the judge's F and p."""
    nmt = recipe.nmt
    refs = nmt.read_pairs(SAMPLE, "val")[1]
    hyps = {"ce": refs[:-2] + ["a dog .", "a cat ."], "mbr-dpo": refs[:-1] + ["a dog ."]}
    for folder, arm, judge in [("stage2", "mbr-dpo", 91.5), ("equal-time", "ce", 90.0)]:
        run = tmp_path / folder / f"{arm}-seed0"
        run.mkdir(parents=True)
        scores = {"bleu": 40.0, "chrf": 60.0, "bertscore_f": 88.0, "length_ratio": 1.0, "judge_f": judge}
        result = {"arm": arm, "seed": 0, "eval": {"val": scores}, "train_seconds": 300.0, "updates_trained": 100}
        result["config"] = {"data": str(SAMPLE), "eval_limit": None}
        if arm == "ce":
            result["equal_time"] = {"arm": "mbr-dpo", "arm_updates": 20, "data_seconds": 1234.0}
        (run / "result.json").write_text(json.dumps(result))
        (run / "val.hyp.en").write_text("".join(line + "\n" for line in hyps[arm]))
    rows = recipe.equal_time_table(recipe.load_runs(str(tmp_path / "stage2")), str(tmp_path / "equal-time"), "val")
    assert "| arm's data s |" in rows[0] and "`ce` judge F (mpnet) |" in rows[0] and "arm judge F (mpnet) |" in rows[0]
    assert rows[1].count("---") == 14
    assert rows[2].startswith("| mbr-dpo | 0 | 300 ± 0 | 1234 ± 0 | 100 (20) | 40.00 ± 0.00 |")
    assert "| 90.00 ± 0.00 | 40.00 ± 0.00 |" in rows[2] and "| 91.50 ± 0.00 |" in rows[2]
    p = recipe.metrics.paired_bootstrap(hyps["ce"], hyps["mbr-dpo"], refs, with_judge=True)
    assert rows[2].endswith(
        f"s0: {p['bleu_p']:.3f} / {p['chrf_p']:.3f} / {p['bertscore_p']:.3f} / {p['judge_p']:.3f} |"
    )
    # a split the control decoded and the arm did not: no row (not a KeyError)
    runs = recipe.load_runs(str(tmp_path / "stage2"))
    control = tmp_path / "equal-time" / "ce-seed0" / "result.json"
    result = json.loads(control.read_text())
    result["eval"]["test_2016_flickr"] = result["eval"]["val"]
    control.write_text(json.dumps(result))
    assert len(recipe.equal_time_table(runs, str(tmp_path / "equal-time"), "test_2016_flickr")) == 2


@pytest.mark.slow
def test_arms_benchmark_records_what_times_a_run(recipe, tiny_model, tmp_path):
    """The study's benchmarks/translation_arms.py writes each arm's cost settings; an equal-time control reads
    the ratio of the arm timed with its semantic run's settings."""
    spec = importlib.util.spec_from_file_location("translation_arms", RECIPE / "benchmarks" / "translation_arms.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["translation_arms"] = bench  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    out = tmp_path / "speed.json"
    argv = [
        "--model",
        str(tiny_model),
        "--set",
        f"data={SAMPLE}",
        "--set",
        "precision=32-true",
        "--batch-tokens",
        "200",
    ]
    bench.main(
        [*argv, "--updates", "2", "--skip", "1", "--arms", "ce", "mrt", "rows2=mrt:semantic_rows=2", "--json", str(out)]
    )
    arms = json.loads(out.read_text())["arms"]
    assert arms["rows2"]["settings"] == recipe.cost_settings("mrt", {"semantic_rows": 2})
    assert arms["mrt"]["settings"]["semantic_rows"] is None and arms["ce"]["ratio_to_ce"] == 1.0
    run = tmp_path / "stage2" / "mrt-seed0"
    run.mkdir(parents=True)
    (run / "result.json").write_text(
        json.dumps({"arm": "mrt", "seed": 0, "updates": 10, "train_seconds": 1.0, "config": {"semantic_rows": 2}})
    )
    cfg = recipe.Stage2Config(equal_time=str(run), time_ratio=str(out), batch_tokens=200)
    updates, basis = recipe.run_length(cfg, 100)
    assert basis["ratio_arm"] == "rows2" and updates == round(10 * arms["rows2"]["ratio_to_ce"])


# --- the teacher arms: MBR-ranked data into the generator ---------------------------------------------------
@pytest.fixture(scope="module")
def mbr_module(recipe, tiny_model, tmp_path_factory):
    """MBR data of the first 12 sample sources from the tiny model, and a FineTuner reading it."""
    from rerank.training_data import MBRDataConfig, build_mbr_data

    nmt = recipe.nmt
    folder = tmp_path_factory.mktemp("mbr") / "data"
    model, sp = recipe.load_model(tiny_model)
    src, _ = nmt.read_pairs(SAMPLE, "train", 12)
    config = MBRDataConfig(num_samples=4, beams=2, shard_size=6, precision="32", utility="chrf")
    build_mbr_data(model, sp, src, folder, config, progress=False)
    train = nmt.PairData(sp, *nmt.read_pairs(SAMPLE, "train", 40), 100)
    return folder, train, sp


def _mbr_tuner(recipe, tiny_model, mbr_module, arm: str, **attrs):
    from bertscore_loss import PreferenceLoss

    folder, train, sp = mbr_module
    nmt = recipe.nmt
    model, _ = recipe.load_model(tiny_model)
    val = nmt.PairData(sp, *nmt.read_pairs(SAMPLE, "val", 4), 100)
    module = nmt.FineTuner(model, sp, nmt.TrainConfig(), val, "32-true", arm, None, None, 1.0, 4)
    module.train_targets = train.tgt_text
    module.mbr = nmt.MBRTargets.read(folder, sp, 100, train.src_text)
    module.preference = PreferenceLoss(beta=0.5, nll_weight=0.0)
    module.log = lambda *a, **k: None  # outside a Trainer
    for k, v in attrs.items():
        setattr(module, k, v)
    return module, train


def test_mbr_targets_are_the_built_rows(recipe, tiny_model, mbr_module):
    from rerank.training_data import read_mbr_data

    folder, train, sp = mbr_module
    targets = recipe.nmt.MBRTargets.read(folder, sp, 100, train.src_text)
    rows = read_mbr_data(folder)
    assert sorted(targets.target) == list(range(12))
    for r in rows:
        assert targets.target[r["index"]] == sp.encode(r["chosen"]) + [recipe.nmt.EOS]
        if r["rejected"] is not None:
            assert targets.rejected[r["index"]] == sp.encode(r["rejected"]) + [recipe.nmt.EOS]
            assert targets.ref_chosen[r["index"]] == r["chosen_logp"]
    with pytest.raises(ValueError, match="is not the training source at that index"):
        recipe.nmt.MBRTargets.read(folder, sp, 100, ["another corpus"] * 40)


def test_mbr_data_summary_counts_what_the_folder_holds(recipe, mbr_module, tmp_path):
    """``mbr_data.py --summary``: sources, pairs, the MBR-best ≠ beam share and mean utilities from the rows,
    each shard's SHA-256, and the cost of the shards present only (a copy of some shards counts those)."""
    import shutil

    from rerank.training_data import read_mbr_data

    folder = mbr_module[0]
    part = tmp_path / "part"
    part.mkdir()
    for name in ("manifest.json", "timing.jsonl", "shard-00001.jsonl"):
        shutil.copy(folder / name, part / name)
    mbr_data = _load("mbr_data")
    mbr_data.main(["--out", str(part), "--summary", str(tmp_path / "s.json")])
    got = json.loads((tmp_path / "s.json").read_text())
    rows = [r for r in read_mbr_data(folder) if r["index"] >= 6]
    timing = [json.loads(t) for t in (folder / "timing.jsonl").read_text().splitlines() if t]
    cost = [t for t in timing if t["shard"] == 1][-1]["seconds"]
    assert got["sources"] == 6 and got["pairs"] == sum(r["rejected"] is not None for r in rows)
    assert got["mbr_best_is_not_beam"] == pytest.approx(sum(r["chosen"] != r["beam"] for r in rows) / 6)
    assert got["mean_utility"]["chosen"] == pytest.approx(sum(r["chosen_score"] for r in rows) / 6)
    assert got["words"]["beam"] == sum(len(r["beam"].split()) for r in rows)
    assert got["shards"] == {
        "shard-00001.jsonl": hashlib.sha256((folder / "shard-00001.jsonl").read_bytes()).hexdigest()
    }
    assert got["seconds"] == pytest.approx(cost) and got["cpu_hours"] == pytest.approx(sum(cost.values()) / 3600)
    assert got["samples"]["distinct_mean"] == pytest.approx(sum(len(set(r["candidates"][:4])) for r in rows) / 6)
    want = sum(sum(r["expected"][:4]) / 4 for r in rows) / 6
    assert got["samples"]["expected_utility_mean"] == pytest.approx(want)
    mbr_data.main(["--out", str(folder), "--summary", str(tmp_path / "first.json"), "--summary-shards", "1"])
    first = json.loads((tmp_path / "first.json").read_text())
    assert first["sources"] == 6 and list(first["shards"]) == ["shard-00000.jsonl"]
    assert first["words"]["beam"] == sum(len(r["beam"].split()) for r in read_mbr_data(folder) if r["index"] < 6)


def test_mbr_distill_labels_are_mbr_targets_for_the_drawn_rows(recipe, tiny_model, mbr_module):
    module, train = _mbr_tuner(recipe, tiny_model, mbr_module, "mbr-distill", distill_share=1.0)
    batch = train.collate(list(range(8, 16)))  # sources 8-11 have MBR data, 12-15 do not
    out = module.distill_labels(batch)
    for r, i in enumerate(range(8, 16)):
        row = [t for t in out["labels"][r].tolist() if t != -100]
        want = module.mbr.target[i] if i < 12 else train.tgt[i]
        assert row == want
    half = _mbr_tuner(recipe, tiny_model, mbr_module, "mbr-distill", distill_share=0.0)[0].distill_labels(batch)
    assert torch.equal(half["labels"], batch["labels"])  # share 0: the references


def test_mbr_dpo_starts_at_log_2_with_stored_reference_log_probs(recipe, tiny_model, mbr_module):
    """Policy = the model that made the data, no dropout: every implicit reward 0, the DPO term log 2 (so the
    stored reference log-probabilities are the training pass's, same tokenisation, same mode)."""
    module, train = _mbr_tuner(recipe, tiny_model, mbr_module, "mbr-dpo")
    module.model.train()  # training mode: the preference pass must switch dropout off itself
    batch = train.collate(list(range(12)))
    out = module.preference_term(batch)
    assert out is not None and len(out.margins) == len(module.mbr.rejected)
    assert float(out.dpo.detach()) == pytest.approx(math.log(2), abs=1e-4)
    assert float(out.chosen_rewards.abs().max()) < 1e-4 and float(out.rejected_rewards.abs().max()) < 1e-4
    loss = module.training_step(batch, 0)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in module.model.parameters() if p.grad is not None)
    assert module.preference_term(train.collate(list(range(20, 24)))) is None  # no MBR data there


def test_pairs_over_max_len_leave_the_preference_term(recipe, mbr_module, caplog):
    """The stored log-probabilities are of whole texts: a pair whose side or source training would cut is
    left out of DPO (its target stays, cut); the others keep their whole token ids."""
    from rerank.training_data import read_mbr_data

    folder, train, sp = mbr_module
    nmt = recipe.nmt
    whole = nmt.MBRTargets.read(folder, sp, 100, train.src_text)
    rows = {r["index"]: r for r in read_mbr_data(folder) if r["rejected"] is not None}
    size = {i: max(len(sp.encode(r[k])) + 1 for k in ("chosen", "rejected", "prompt")) for i, r in rows.items()}
    assert all(n <= 100 for n in size.values()) and set(whole.rejected) == set(rows)
    limit = min(size.values())  # the shortest pairs fit, the others are cut (asserted below)
    with caplog.at_level("WARNING"):
        cut = nmt.MBRTargets.read(folder, sp, limit, train.src_text)
    kept = {i for i, n in size.items() if n <= limit}
    assert set(cut.rejected) == set(cut.ref_chosen) == set(cut.ref_rejected) == kept and 0 < len(kept) < len(rows)
    assert f"{len(rows) - len(kept)} preference pairs left out" in caplog.text
    for i in kept:
        assert cut.rejected[i] == whole.rejected[i] and cut.target[i] == whole.target[i]
    assert set(cut.target) == set(whole.target) and all(len(t) <= limit for t in cut.target.values())


def test_dpo_refuses_reference_log_probs_of_another_model(recipe, tiny_model, mbr_module, tmp_path):
    folder, _, sp = mbr_module
    model, _ = recipe.load_model(tiny_model)
    recipe.check_reference_model(model, sp, str(folder), "builder")  # the builder itself
    other = tmp_path / "other"
    shutil.copytree(tiny_model, other)
    changed, _ = recipe.load_model(other)
    noise = torch.randn(changed.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        changed.lm_head.weight.add_(0.05 * noise)
    changed.save_pretrained(other)
    changed.train()
    with pytest.raises(SystemExit, match=r"init x is not the model that built mbr_data \(.*stored -\d+\.\d+, this"):
        recipe.check_reference_model(changed, sp, str(folder), "x")
    assert changed.training  # the check's eval mode is undone
    cfg = _stage2_cfg(recipe, other, tmp_path / "s2", arm="mbr-dpo", mbr_data=str(folder))
    with pytest.raises(SystemExit, match="DPO's stored reference log-probabilities must be those"):
        recipe.stage2(cfg)  # before any training
    assert not (tmp_path / "s2" / "mbr-dpo-seed0" / "checkpoints").exists()


@pytest.mark.slow
def test_evaluate_passes_the_length_penalty_to_the_beam_and_writes_what_it_scored(recipe, tiny_model, tmp_path):
    nmt = recipe.nmt
    model, sp = recipe.load_model(tiny_model)
    src, refs = nmt.read_pairs(SAMPLE, "val", 6)
    seen = []
    for lp in (0.0, 3.0):
        out = tmp_path / f"lp{lp}.en"
        got = recipe.evaluate(str(tiny_model), str(SAMPLE), "val", 3, "32-true", 6, lp, hyps_out=str(out))
        want = nmt.translate(model, sp, src, beams=3, length_penalty=lp)
        assert out.read_text().splitlines() == want and got["length_penalty"] == lp
        assert got["bleu"] == pytest.approx(recipe.metrics.corpus_scores(want, refs)["bleu"])
        seen.append(want)
    assert seen[0] != seen[1]  # the penalty changes this model's beam outputs: a dropped one would show
    with pytest.raises(SystemExit, match="--length-penalty must be a finite number >= 0, got -1.0"):
        recipe.evaluate(str(tiny_model), str(SAMPLE), "val", 3, "32-true", 6, -1.0)


def test_mbr_dpo_pair_selection_by_length_and_ipo_on_token_counts(recipe, tiny_model, mbr_module):
    """``dpo_pairs``: ``not-shorter`` keeps exactly the pairs whose chosen side has at least as many tokens as
    the rejected one; ``balanced`` adds as many shorter-chosen pairs as there are longer-chosen ones;
    ``preference_loss: ipo`` gets both sides' token counts: at the start (policy = reference) every pair's
    IPO loss is (1 / (2 beta))^2."""
    from bertscore_loss import PreferenceLoss

    module, train = _mbr_tuner(recipe, tiny_model, mbr_module, "mbr-dpo")
    mbr = module.mbr
    diff = {i: len(mbr.target[i]) - len(r) for i, r in mbr.rejected.items()}
    kept = mbr.select_pairs("not-shorter")
    want = {i for i, d in diff.items() if d >= 0}
    assert set(kept.rejected) == set(kept.ref_chosen) == set(kept.ref_rejected) == want
    assert kept.target == mbr.target and mbr.select_pairs("all") == mbr  # the distillation targets stay
    assert 0 < len(want) < len(diff), diff  # the tiny data has both kinds
    balanced = mbr.select_pairs("balanced")
    shorter = [i for i in balanced.rejected if diff[i] < 0]
    longer = sum(d > 0 for d in diff.values())
    assert want <= set(balanced.rejected) and len(shorter) == min(longer, len(diff) - len(want))
    assert balanced == mbr.select_pairs("balanced")  # a fixed subset
    nmt = recipe.nmt
    for n_short, n_long in ((6, 2), (2, 6)):  # either direction may be the rarer one
        lens = [3] * n_short + [7] * n_long + [5, 5]  # chosen sides; every rejected side has 5 tokens
        synthetic = nmt.MBRTargets(
            {i: [1] * n for i, n in enumerate(lens)},
            {i: [1] * 5 for i in range(len(lens))},
            {i: 0.0 for i in range(len(lens))},
            {i: 0.0 for i in range(len(lens))},
        ).select_pairs("balanced")
        kept_lens = [lens[i] for i in synthetic.rejected]
        assert sorted(kept_lens) == [3, 3, 5, 5, 7, 7], (n_short, n_long)  # no net preference for a length
        assert set(synthetic.rejected) == set(synthetic.ref_chosen) == set(synthetic.ref_rejected)
    with pytest.raises(ValueError, match="pair selection must be one of all, balanced, not-shorter, got 'x'"):
        mbr.select_pairs("x")
    module.preference = PreferenceLoss(beta=0.5, nll_weight=0.0, loss_type="ipo")
    out = module.preference_term(train.collate(list(range(12))))
    assert float(out.dpo.detach()) == pytest.approx((1 / (2 * 0.5)) ** 2, abs=1e-3)
    bad_settings = (({"preference_loss": "hinge"}, "preference_loss 'hinge'"), ({"dpo_pairs": "x"}, "dpo_pairs 'x'"))
    for bad, match in bad_settings:
        with pytest.raises(SystemExit, match=match):
            recipe.stage2(recipe.Stage2Config(arm="ce", epochs=1.0, **bad))


@pytest.mark.parametrize("kind", ["epsilon", "beam"])
def test_mrt_candidates_from_epsilon_sampling_or_the_beam(recipe, tiny_model, mbr_module, kind):
    module, train = _mbr_tuner(recipe, tiny_model, mbr_module, "mrt", mrt_candidates=kind)
    batch = train.collate(list(range(3)))
    labels, texts, src = module.sample(batch)
    assert labels.shape[0] == 3 * 4 and len(texts) == 3 and all(len(t) == 4 for t in texts)
    assert torch.equal(src, batch["input_ids"].repeat_interleave(4, 0))
    nmt = recipe.nmt
    for row, text in zip(labels.tolist(), [t for ts in texts for t in ts]):
        ids = [t for t in row if t != -100]
        assert ids[-1] == nmt.EOS or len(ids) == labels.shape[1]
        assert module.sp.decode([t for t in ids if t > nmt.EOS]) == text
    if kind == "beam":  # the n-best list is ordered and distinct
        assert all(len(set(map(tuple, labels[i * 4 : (i + 1) * 4].tolist()))) == 4 for i in range(3))


def test_equal_time_of_an_mbr_arm_counts_its_data_generation(recipe, tmp_path):
    data = tmp_path / "mbr-data"
    data.mkdir()
    timing = [
        {"shard": 0, "sources": 4, "seconds": {"beam": 1.0, "sampling": 4.0, "mbr": 2.0, "log_probs": 1.0}},
        {"shard": 1, "sources": 4, "seconds": {"beam": 9.0, "sampling": 9.0, "mbr": 9.0, "log_probs": 9.0}},
        {"shard": 1, "sources": 4, "seconds": {"beam": 1.0, "sampling": 3.0, "mbr": 3.0, "log_probs": 1.0}},  # rebuilt
    ]
    (data / "timing.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timing))
    (data / "manifest.json").write_text(json.dumps({"format": 1, "sources": 8, "config": {"shard_size": 4}}))
    for shard in (0, 1):  # only shards that exist count (a killed build's timing row without its shard does not)
        (data / f"shard-{shard:05d}.jsonl").write_text("")
    for name, r in {
        "mbr-dpo-seed0": {
            "arm": "mbr-dpo",
            "seed": 0,
            "updates": 10,
            "train_seconds": 32.0,
            "config": {"mbr_data": str(data)},
        },
        "ce-seed0": {"arm": "ce", "seed": 0, "seconds_per_update": 2.0},
    }.items():
        (tmp_path / "s2" / name).mkdir(parents=True)
        (tmp_path / "s2" / name / "result.json").write_text(json.dumps(r))
    cfg = recipe.Stage2Config(equal_time=str(tmp_path / "s2" / "mbr-dpo-seed0"), seed=0, epochs=2.0)
    updates, basis = recipe.run_length(cfg, 100)
    assert basis["data_seconds"] == 16.0  # shard 0 (8 s) + shard 1's last build (8 s)
    assert updates == 16 + 8 and basis["data_updates"] == 8  # (32 s training + 16 s data) / 2 s per ce update
    # data re-ranked by a mix: the samples it was re-ranked from count too, not the re-ranking alone
    mixed = tmp_path / "mbr-data-mix"
    mixed.mkdir()
    remix_timing = {"shard": 0, "sources": 8, "seconds": {"mbr": 2.0, "log_probs": 2.0}}
    (mixed / "timing.jsonl").write_text(json.dumps(remix_timing))
    (mixed / "shard-00000.jsonl").write_text("")
    digest = hashlib.sha256(json.dumps(json.loads((data / "manifest.json").read_text()), sort_keys=True).encode())
    mix_manifest = {"format": 1, "sources": 8, "mix": {"weight": 0.5}, "from_manifest_sha256": digest.hexdigest()[:16]}
    (mixed / "manifest.json").write_text(json.dumps({**mix_manifest, "from_folder": str(data)}))
    result = json.loads((tmp_path / "s2" / "mbr-dpo-seed0" / "result.json").read_text())
    result["config"]["mbr_data"] = str(mixed)
    (tmp_path / "s2" / "mbr-dpo-seed0" / "result.json").write_text(json.dumps(result))
    updates, basis = recipe.run_length(cfg, 100)
    assert basis["data_seconds"] == 20.0 and updates == 16 + 10  # 16 s of samples + 4 s of re-ranking
    # from a benchmark JSON: the arm's updates × its ratio, the data at the benchmark ce's CPU seconds an update
    # (its wall seconds grow with the other jobs beside it; the data's are a core's own)
    bench = tmp_path / "speed.json"
    ce = {"arm": "ce", "settings": {}, "ratio_to_ce": 1.0, "seconds_per_update": 4.0, "cpu_seconds_per_update": 1.0}
    arms = {"ce": ce, "mbr-dpo": {"arm": "mbr-dpo", "settings": {}, "ratio_to_ce": 2.5}}
    bench.write_text(json.dumps({"batch_tokens": 2048, "arms": arms}))
    updates, basis = recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=str(bench)), 100)
    assert updates == 25 + 20 and basis["ce_clock"] == "cpu"  # 10 updates × 2.5 + 20 s / 1 s
    del arms["ce"]["cpu_seconds_per_update"]
    bench.write_text(json.dumps({"batch_tokens": 2048, "arms": arms}))
    updates, basis = recipe.run_length(recipe.dataclasses.replace(cfg, time_ratio=str(bench)), 100)
    assert updates == 25 + 5 and basis["ce_clock"] == "wall"  # an older JSON: its wall seconds
    (mixed / "manifest.json").write_text(json.dumps(mix_manifest))
    with pytest.raises(SystemExit, match="does not name"):
        recipe.run_length(cfg, 100)
    (data / "timing.jsonl").unlink()
    (mixed / "manifest.json").write_text(json.dumps({**mix_manifest, "from_folder": str(data)}))
    with pytest.raises(SystemExit, match="timing.jsonl is missing"):
        recipe.run_length(cfg, 100)
