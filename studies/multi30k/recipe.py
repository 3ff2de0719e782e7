"""Multi30k de→en with BERTScore inside training and decoding: one command per stage, each resumable.

    python studies/multi30k/recipe.py stage1 --config studies/multi30k/configs/stage1.yaml
    python studies/multi30k/recipe.py stage2 --config studies/multi30k/configs/stage2.yaml --arm mrt --seed 0
    python studies/multi30k/recipe.py stage3 --config studies/multi30k/configs/stage3.yaml

See docs/multi30k.md (the record: docs/results/finetuning-multi30k/record.md) for the figures each stage
produced and what every option means.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics  # noqa: E402
import nmt  # noqa: E402

from bertscore_loss.outputs import OutputRefusedError, check_output, write_bytes, write_text  # noqa: E402
from bertscore_loss.preference import PREFERENCE_LOSS_TYPES  # noqa: E402
from rerank.sampling import native_bf16  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("translation")


# The write rule (bertscore_loss.outputs) for every file the recipe writes: atomically (the old file or the new
# one, never half of one) and never over a file git tracks (published outputs, committed runs) without
# --overwrite. No default path points under docs/ (tested), so a path there was asked for by the options.
def writable(paths, overwrite: bool = False) -> None:
    """Every one of ``paths`` may be written (checked before the work that makes them), else one line."""
    for path in paths:
        try:
            check_output(path, overwrite=overwrite, allow_docs=True, flag="--set/--out")
        except (OutputRefusedError, OSError) as err:
            raise SystemExit(str(err)) from None


def write(path: Path, data: str | bytes, overwrite: bool = False) -> None:
    """``data`` written to ``path`` by the write rule (missing folders created), or one line saying why not."""
    try:
        if isinstance(data, bytes):
            write_bytes(path, data, overwrite=overwrite, allow_docs=True, flag="--set/--out")
        else:
            write_text(path, data, overwrite=overwrite, allow_docs=True, flag="--set/--out")
    except OutputRefusedError as err:
        raise SystemExit(str(err)) from None


@dataclass
class Stage1Config:
    data: str = "../shared/data/multi30k"
    out: str = "runs/multi30k/stage1"
    vocab_size: int = 8000
    train_limit: int | None = None
    max_len: int = 100
    batch_tokens: int = 4096
    max_epochs: int = 40
    max_minutes: float | None = 85.0
    patience: int | None = None  # stop after this many validated epochs without a better val BLEU
    average: int = 1  # average the generator's weights over the last N epochs (kept if better on val)
    precision: str = "auto"  # auto = bf16-mixed where the CPU has native bf16, else 32-true
    threads: int | None = None
    seed: int = 1
    model: nmt.ModelConfig = field(default_factory=nmt.ModelConfig)
    train: nmt.TrainConfig = field(default_factory=nmt.TrainConfig)


def parse_sets(items: list[str] | None) -> dict:
    """``["key=value", "train.lr=3e-4"]`` -> ``{"key": value, "train": {"lr": 3e-4}}`` (values read as YAML)."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--set {item!r}: expected key=value")
        try:
            parsed = yaml.safe_load(value)
        except yaml.YAMLError as err:
            raise SystemExit(f"--set {item!r}: the value is not valid YAML ({one_line(err)})") from None
        head, _, sub = key.partition(".")
        if sub:
            out.setdefault(head, {})[sub] = parsed
        else:
            out[head] = parsed
    return out


def one_line(err: BaseException) -> str:
    return " ".join(str(err).split())


def read_yaml(path: str) -> dict:
    """A config file: a YAML mapping of option names to values (one clear line when it is not)."""
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"--config {path}: no such file")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise SystemExit(f"--config {path}: not valid YAML ({one_line(err)})") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SystemExit(f"--config {path}: expected a mapping of option: value, got a YAML {type(raw).__name__}")
    return raw


def unknown(what: str, key: object, known: list[str]) -> SystemExit:
    close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return SystemExit(f"{what}: unknown option {key!r} ({hint}known: {', '.join(known)})")


def check_value(name: str, value, hint):
    """``value`` if its type fits the option's annotation (int, float, bool, str, lists, None), else one line.

    A float option also takes a string YAML did not read as a number (YAML 1.1 reads ``3e-4`` as text).
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            try:
                return check_value(name, value, arg)
            except SystemExit:
                pass
        raise SystemExit(f"option {name!r}: {value!r} is not {' or '.join(type_name(a) for a in args)}")
    if hint is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    if hint is type(None):
        ok = value is None
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    elif origin in (list, tuple):
        if isinstance(value, (list, tuple)):
            return type(value)(check_value(name, item, args[0]) for item in value) if args else value
        ok = False
    else:
        ok = True
    if not ok:
        raise SystemExit(f"option {name!r}: {value!r} is not {type_name(hint)}")
    return value


def type_name(hint) -> str:
    names = {int: "an integer", float: "a number", bool: "true/false", str: "a string", type(None): "null"}
    if hint in names:
        return names[hint]
    origin = typing.get_origin(hint)
    return f"a list of {type_name(typing.get_args(hint)[0])}" if origin in (list, tuple) else str(hint)


def build(cls, raw: dict, where: str):
    """``cls(**raw)`` with every key known and every value of the annotated type; nested config dataclasses
    (``model``, ``train``) from mappings."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in raw.items():
        if key not in names:
            raise unknown(where, key, names)
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise SystemExit(f"{where}: option {key!r} must be a mapping of {hint.__name__} options, got {value!r}")
            kwargs[key] = build(hint, value, f"{where} {key}")
        else:
            value = check_value(key, value, hint)
            kwargs[key] = tuple(value) if typing.get_origin(hint) is tuple else value
    return cls(**kwargs)


def load_config(cls, path: str | None, overrides: dict, sets: list[str] | None = None):
    """The YAML file, then the named options, then ``--set key=value`` items (``train.lr=...`` merges).

    A missing file, YAML that is not a mapping, an unknown option (with the closest known name) or a
    value of the wrong type ends the command with one line naming it (``SystemExit``).
    """
    raw = read_yaml(path) if path else {}
    raw = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    items = parse_sets(sets)
    hints, names = typing.get_type_hints(cls), [f.name for f in dataclasses.fields(cls)]
    for key, value in items.items():  # name --set as the source of an unknown key it brings
        if key not in names:
            raise unknown("--set", key, names)
        sub = hints[key]
        if isinstance(value, dict) and isinstance(sub, type) and dataclasses.is_dataclass(sub):
            known = [f.name for f in dataclasses.fields(sub)]
            for name in value:
                if name not in known:
                    raise unknown(f"--set {key}", name, known)
    for key, value in items.items():
        before = raw.get(key, {})
        raw[key] = {**(before if isinstance(before, dict) else {}), **value} if isinstance(value, dict) else value
    return build(cls, raw, path or "options")


def shown(path: Path) -> str:
    """``path`` relative to the project root when it is inside it (messages name what the user typed)."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def precision_of(name: str) -> str:
    if name == "auto":
        return "bf16-mixed" if native_bf16("cpu") else "32-true"
    return name


# Options that may change between invocations of one run (how long or how it runs, not what it computes).
RESUMABLE = {"out", "max_epochs", "max_minutes", "patience", "threads", "eval_sets", "blind", "outputs", "eval_limit"}
# Stage 2: the length, checkpoint rule and evaluation subset shape the result; pauses and extra sets do not.
STAGE2_RESUMABLE = {"out", "max_minutes", "stop_at", "eval_sets", "blind", "outputs"}
# Stage 3 recomputes everything it writes; which sets it decodes and where the outputs go may change.
STAGE3_RESUMABLE = {"out", "name", "blind", "scored", "outputs"}


def flat(d: dict, prefix: str = "") -> dict:
    """``{"train": {"lr": 1}}`` -> ``{"train.lr": 1}``."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def settings_of(cfg) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def changed_settings(before: dict, cfg, resumable: set[str]) -> list[tuple[str, object, object]]:
    """``(option, stored, now)`` for every option that differs from ``before`` but for ``resumable`` ones.

    An option missing from ``before`` (added to the code after that run) counts as its default value;
    one missing from ``cfg`` (removed from the code) is not compared.
    """
    defaults = flat(settings_of(type(cfg)()))
    now, old = flat(settings_of(cfg)), flat(before)
    return [
        (k, old.get(k, defaults.get(k)), now[k])
        for k in sorted(now)
        if k.split(".")[0] not in resumable and old.get(k, defaults.get(k)) != now[k]
    ]


def check_settings(
    run: Path,
    cfg,
    fresh: bool = False,
    resumable: set[str] = RESUMABLE,
    *,
    file: str = "settings.json",
    before: dict | None = None,
    wipe: bool = True,
    overwrite: bool = False,
) -> None:
    """Store ``cfg`` in ``run/<file>``; refuse a rerun whose settings differ (but for ``resumable`` ones).

    ``before``: the settings of a run made before ``settings.json`` existed (e.g. its result.json's
    config), used when the file is missing. With ``fresh`` a differing run folder is emptied (with a
    warning; with ``wipe=False`` only the settings are replaced) and the run starts again.
    """
    path = run / file
    if path.exists():
        try:
            before = json.loads(path.read_text())
        except ValueError as err:
            raise SystemExit(f"{shown(path)}: unreadable ({one_line(err)}); delete it or use --fresh") from None
    diff = changed_settings(before, cfg, resumable) if before is not None else []
    if diff:
        if not fresh:
            changes = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in diff)
            raise SystemExit(
                f"{shown(run)} holds a run with other settings ({changes}). Use another --out, or --fresh to "
                "discard that run and start again."
            )
        logger.warning("%s: settings changed (%s); --fresh: starting again", run, ", ".join(k for k, _, _ in diff))
        if wipe:
            shutil.rmtree(run)
            run.mkdir(parents=True)
    run.mkdir(parents=True, exist_ok=True)
    write(path, json.dumps(settings_of(cfg), indent=1), overwrite)


def read_checkpoint(path: Path) -> dict:
    """A Lightning checkpoint, or one line saying it is truncated or corrupt (``SystemExit``)."""
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        lightning = isinstance(ckpt, dict) and {"state_dict", "global_step"} <= set(ckpt)
        problem = None if lightning else "not a Lightning checkpoint"
    except Exception as err:  # truncated zip, pickle garbage, empty file: all the same to the user
        problem = f"{type(err).__name__}: {one_line(err)[:200]}"
    if problem:
        raise SystemExit(
            f"{shown(path)}: truncated or corrupt checkpoint ({problem}); delete it to restart that run from its "
            "start, or rerun with --fresh"
        )
    return ckpt


def stage1_command(out: str = "runs/multi30k/stage1") -> str:
    config = "converged.yaml" if "converged" in out else "stage1.yaml"
    return f"python studies/multi30k/recipe.py stage1 --config studies/multi30k/configs/{config}"


def model_hint(path: str) -> str:
    """Which command makes the model folder ``path`` (the stage that writes it)."""
    p = Path(path)
    if p.as_posix().rstrip("/").endswith("models/multi30k-de-en"):
        return (
            "it is the committed converged base (see docs/multi30k.md); to train it yourself run "
            f"`{stage1_command('converged')}` and pass --set init=runs/multi30k/converged/stage1/model"
        )
    match = re.fullmatch(r"(ce|bertscore|mrt)-seed(\d+)", p.parent.name) if p.name == "model" else None
    if match:
        return (
            f"it is written by `python studies/multi30k/recipe.py stage2 --arm {match[1]} --seed {match[2]} "
            f"--out {p.parent.parent.as_posix()}` (with the stage-2 config that made it)"
        )
    if p.name == "model":
        return f"it is written at the end of `{stage1_command(p.parent.as_posix())} --out {p.parent.as_posix()}`"
    return "it must be an HF model folder with config.json, the weights and spm.model (recipe.py stage1 writes one)"


def check_reference_model(model, sp, mbr_data: str, init: str) -> None:
    """Refuse DPO from ``init`` on data whose stored reference log-probabilities another model computed: the
    DPO term compares the policy with them, so training must start from the model that built the data
    (:func:`rerank.training_data.check_builder`: the same log-probabilities of a few stored pairs)."""
    from rerank.training_data import check_builder

    try:
        check_builder(model, sp, resolve(mbr_data))
    except ValueError as e:
        raise SystemExit(
            f"init {init} is not the model that built mbr_data ({e}); DPO's stored reference log-probabilities "
            f"must be those of the model training starts from: set init to that model, or build the data with "
            f"studies/multi30k/mbr_data.py --model {init}"
        ) from None


def require_model(path: str, option: str) -> Path:
    """The model folder ``path`` (HF Marian + spm.model), or one line naming it and the command that makes it."""
    folder = resolve(path)
    missing = [n for n in ("config.json", "spm.model") if not (folder / n).is_file()]
    if missing:
        what = "does not exist" if not folder.exists() else f"has no {' and no '.join(missing)}"
        raise SystemExit(f"{option} {path}: the model folder {what}; {model_hint(path)}")
    return folder


def load_sp(path: Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path))


def stage1(cfg: Stage1Config, fresh: bool = False, overwrite: bool = False) -> dict:
    """Tokenizer + generator from scratch with label-smoothed CE until val BLEU stops improving (``patience``);
    the best epoch or the average of the last ``average`` epochs, whichever is better on val, exported as HF."""
    out, data = resolve(cfg.out), resolve(cfg.data)
    writable([out / "model" / "spm.model", out / "model" / "choice.json"], overwrite)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, cfg, fresh, overwrite=overwrite)
    pl.seed_everything(cfg.seed, verbose=False)
    spm_path = out / "spm.model"
    if not spm_path.exists():
        nmt.train_sentencepiece(data, out, cfg.vocab_size, cfg.train_limit)
    sp = load_sp(spm_path)
    train = nmt.PairData(sp, *nmt.read_pairs(data, "train", cfg.train_limit), cfg.max_len)
    val = nmt.PairData(sp, *nmt.read_pairs(data, "val"), cfg.max_len)
    precision = precision_of(cfg.precision)
    model = nmt.build_model(cfg.model, sp.get_piece_size())
    module = nmt.Translator(model, sp, cfg.train, val, precision)
    module.curve_path = out / "curve.jsonl"  # one row per validated epoch, appended as it goes
    module.epoch_dir, module.keep_epochs = out / "epochs", max(cfg.average, 1) + (cfg.patience or 0)
    callbacks = []
    if cfg.patience:
        callbacks.append(pl.callbacks.EarlyStopping(monitor="val/bleu", mode="max", patience=cfg.patience))
    ckpt = pl.callbacks.ModelCheckpoint(
        dirpath=out / "checkpoints",
        monitor="val/bleu",
        mode="max",
        save_last=True,
        filename="best-{epoch}",
        save_top_k=1,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=cfg.max_epochs,
        max_time={"minutes": cfg.max_minutes} if cfg.max_minutes else None,
        precision=precision,
        gradient_clip_val=cfg.train.clip,
        callbacks=[ckpt, *callbacks],
        logger=pl.loggers.CSVLogger(out, name="logs"),
        limit_val_batches=1,
        num_sanity_val_steps=0,
        enable_progress_bar=sys.stderr.isatty(),
        use_distributed_sampler=False,
        enable_model_summary=False,
    )
    last = out / "checkpoints" / "last.ckpt"
    if last.exists():
        read_checkpoint(last)  # one clear line for a truncated or corrupt checkpoint, before Lightning reads it
    t0 = time.time()
    trainer.fit(
        module,
        train.loader(cfg.batch_tokens, True, cfg.seed),
        val.loader(cfg.batch_tokens, False),
        ckpt_path=str(last) if last.exists() else None,
    )
    logger.info("stage 1 trained in %.0f s; best %s", time.time() - t0, ckpt.best_model_path)
    best = read_checkpoint(Path(ckpt.best_model_path or last))
    model.load_state_dict({k[len("model.") :]: v for k, v in best["state_dict"].items() if k.startswith("model.")})
    choice = choose_average(model, sp, val, out / "epochs", cfg.average, precision)
    model.save_pretrained(out / "model")
    write(out / "model" / "spm.model", spm_path.read_bytes(), overwrite)
    write(out / "model" / "choice.json", json.dumps(choice, indent=1), overwrite)
    return {
        "best": ckpt.best_model_path,
        "choice": choice,
        "cpu": nmt.cpu_label(),
        "precision": precision,
        "curve": module.history,
    }


def read_weights(path: Path) -> dict:
    """A saved state dict (``epochs/epoch-NNN.pt``), or one line saying it is truncated or corrupt."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise SystemExit(
            f"{path}: truncated or corrupt weights ({type(err).__name__}: {one_line(err)[:200]}); delete it"
        ) from None


def average_weights(paths: list[Path]) -> dict:
    """The element-wise mean of saved state dicts (floating tensors; others from the last one)."""
    states = [read_weights(p) for p in paths]
    out = {}
    for key, last in states[-1].items():
        out[key] = (
            torch.stack([s[key].double() for s in states]).mean(0).to(last.dtype) if last.is_floating_point() else last
        )
    return out


def choose_average(model, sp, val: nmt.PairData, epochs: Path, k: int, precision: str) -> dict:
    """Beam-5 val BLEU of the loaded (best) weights vs the average of the last ``k`` epochs; keeps the better."""
    import sacrebleu

    paths = sorted(epochs.glob("epoch-*.pt"))[-k:] if k > 1 else []

    def val_bleu() -> float:
        hyps = nmt.translate(model, sp, val.src_text, beams=5, precision=precision)
        return sacrebleu.corpus_bleu(hyps, [val.tgt_text]).score

    best_state = {k_: v.clone() for k_, v in model.state_dict().items()}
    result = {"best_epoch_val_bleu": val_bleu(), "averaged": [p.name for p in paths], "kept": "best epoch"}
    if len(paths) > 1:
        model.load_state_dict(average_weights(paths))
        result["average_val_bleu"] = val_bleu()
        if result["average_val_bleu"] > result["best_epoch_val_bleu"]:
            result["kept"] = f"average of the last {len(paths)} epochs"
        else:
            model.load_state_dict(best_state)
    logger.info("stage 1 export: %s", result)
    return result


@dataclass
class Stage2Config:
    data: str = "../shared/data/multi30k"
    init: str = "runs/multi30k/stage1/model"  # the stage-1 model folder (HF format + spm.model)
    out: str = "runs/multi30k/stage2"
    arm: str = "ce"
    seed: int = 0
    updates: int | None = None  # the run's length: updates, or
    epochs: float | None = None  # epochs of the seed's batches (updates = round(epochs × batches in an epoch))
    batch_tokens: int = 768
    max_len: int = 100
    # the first N training pairs only (None: all): e.g. an mbr-* arm on exactly the sources of its MBR folder
    train_limit: int | None = None
    precision: str = "auto"
    weight: float = 1.0  # lambda of the semantic term (bertscore, mrt)
    samples: int = 8  # mrt: samples per source
    alpha: float = 1.0  # mrt: sharpness of the renormalised distribution
    bridge_mode: str = "retokenize"  # bertscore arm: VocabBridge mode
    max_mode: str = "straight_through"
    temperature: float = 0.05
    top_k: int | None = 64
    gumbel: str | None = None
    val_every: float | None = None  # validate every this many epochs (and at update 0 and at the end); None: never
    val_beams: int = 1  # beams of the periodic validation (1 = greedy)
    val_limit: int | None = None  # first N val pairs for the periodic validation (None = all)
    select: str = "bertscore_f"  # with val_every: keep the weights with the best val score of this name
    patience: int | None = None  # with val_every: stop after this many validations without a better score
    equal_time: str | None = None  # a semantic arm's run (same seed): train this ce run for as long as it trained
    time_ratio: float | str | None = None  # that arm's s/update ÷ ce's: a number or a benchmark JSON (ratio_to_ce)
    # time_ratio as a benchmark JSON: the label of the arm to use where several were timed with the run's cost
    # settings at different ratios (e.g. mbr-dpo on other pairs or data)
    time_ratio_arm: str | None = None
    max_minutes: float | None = None  # pause this invocation after so many minutes (a checkpoint; rerun to go on)
    stop_at: int | None = None  # pause this invocation after this update (a checkpoint; rerun to go on)
    eval_sets: list[str] = field(default_factory=lambda: ["val", "test_2016_flickr"])
    blind: bool = True
    outputs: str | None = None  # where the blind-set translations go (None: <run>/outputs)
    eval_limit: int | None = None  # first N lines of each evaluation set (smoke runs)
    beams: int = 5
    train: nmt.TrainConfig = field(default_factory=lambda: nmt.TrainConfig(lr=1e-4, warmup=50))
    # The frozen scorer of the semantic arms: float32 (exact, as the reported F), bfloat16, or auto (bfloat16
    # where the CPU has native bf16, else float32); "Where the time goes" in
    # docs/results/finetuning-multi30k/record.md says what it changes.
    scorer_dtype: str = "float32"
    # mrt: dropout in the decoder pass over the candidates. False (default): the candidates' log-probabilities in
    # the mode they were drawn in (eval: no dropout), as the literature does; True: as in the CE pass (the
    # published converged runs of docs/results/finetuning-multi30k/converged set it)
    mrt_dropout: bool = False
    # mrt: how the candidates are drawn: "ancestral" (full softmax, temperature 1; the published runs),
    # "epsilon" (epsilon sampling, mrt_epsilon) or "beam" (the beam's n-best list, Edunov et al. 2018)
    mrt_candidates: str = "ancestral"
    mrt_epsilon: float = 0.02
    # bertscore arm: the Gumbel-softmax / softmax temperature on the logits (BERTTune: 0.1; 1.0 = none)
    logit_temperature: float = 1.0
    # the weight of the CE on the references (1: every published arm; BERTTune trains on -F alone: 0)
    ce_weight: float = 1.0
    # mbr-distill / mbr-dpo: a folder of MBR-ranked training data (rerank.build_mbr_data, e.g.
    # studies/multi30k/mbr_data.py); the arms use the sources it holds (a partial build: the shards so far)
    mbr_data: str | None = None
    distill_share: float = 0.5  # mbr-distill: share of those rows whose label is the MBR-best target
    # the evaluation sets also scored by an independent judge (all-mpnet-base-v2, the accurate extra): judge_f
    judge: bool = False
    beta: float = 0.1  # mbr-dpo: DPO's beta
    nll_weight: float = 1.0  # mbr-dpo: weight of the NLL of the chosen side (DPO + NLL)
    # mbr-dpo: the preference loss's form (bertscore_loss.PreferenceConfig.loss_type): "sigmoid" (DPO),
    # "robust" or "ipo" (length-normalised log-ratios)
    preference_loss: str = "sigmoid"
    # mbr-dpo: which of the data's pairs train: "all", "not-shorter" (only pairs whose chosen side has at least
    # as many tokens as the rejected one: the pairs never reward a shorter translation) or "balanced" (those
    # and a random subset of the others, as many as have a longer chosen side: no net length preference)
    dpo_pairs: str = "all"
    # bertscore / mrt: the semantic term on this many sources of each update's batch (a random subset, seeded
    # by the seed and the update), the CE term on all; None: every source. The term is a mean over sources, so
    # the subset's is an unbiased estimate of the full batch's at a fraction of the cost
    # (docs/results/finetuning-multi30k/record.md).
    semantic_rows: int | None = None


def load_model(folder: Path):
    from transformers import MarianMTModel

    model = nmt.freeze_positions(MarianMTModel.from_pretrained(folder))
    return model, load_sp(folder / "spm.model")


def run_length(cfg: Stage2Config, per_epoch: int) -> tuple[int, dict | None]:
    """The run's number of updates (from ``equal_time``, else ``epochs``, else ``updates``) and, for an
    equal-time run, what it was derived from."""
    if cfg.equal_time:
        return equal_time_updates(cfg)
    if cfg.updates is not None and cfg.epochs is not None:
        raise SystemExit(
            f"updates={cfg.updates} and epochs={cfg.epochs}: set one of them (e.g. --set epochs=null --set updates=...)"
        )
    if cfg.epochs is not None:
        if cfg.epochs <= 0:
            raise SystemExit(f"epochs must be > 0, got {cfg.epochs}")
        return max(1, round(cfg.epochs * per_epoch)), None
    if cfg.updates is None or cfg.updates < 1:
        raise SystemExit(f"the run needs a length: set updates (>= 1) or epochs (got updates={cfg.updates})")
    return cfg.updates, None


def data_seconds(sem: dict) -> float:
    """Seconds the MBR data of an ``mbr-*`` run took to build (:func:`rerank.training_data.build_seconds`:
    beam search, sampling, MBR and log-probabilities of its shards, and for data re-ranked by a mix, those of
    the folder it was re-ranked from besides the re-ranking); 0 for other arms."""
    from rerank.training_data import build_seconds

    folder = sem.get("config", {}).get("mbr_data")
    if not str(sem.get("arm", "")).startswith("mbr-") or not folder:
        return 0.0
    try:
        return float(sum(build_seconds(resolve(folder)).values()))
    except (OSError, ValueError) as err:
        raise SystemExit(f"equal_time: {err} (the data's cost is part of the arm's time)") from None


def equal_time_updates(cfg: Stage2Config) -> tuple[int, dict]:
    """Updates of a ``ce`` run that trains as long as the semantic run ``cfg.equal_time`` trained.

    ``time_ratio`` None: that run's ``train_seconds`` ÷ the ``seconds_per_update`` of the ``ce`` run of the
    same seed beside it (``<its folder>/../ce-seed<k>``); a number or a JSON of
    ``studies/multi30k/benchmarks/translation_arms.py`` (the ``ratio_to_ce`` of the arm timed with the run's arm and
    ``COST_SETTINGS``): its updates × that ratio. An ``mbr-*`` arm's one-off data generation
    (:func:`data_seconds`) is added, in ce updates.
    """
    if cfg.arm != "ce":
        raise SystemExit(f"equal_time: only the ce arm (the control) gets another arm's training time, not {cfg.arm!r}")
    src = resolve(str(cfg.equal_time))
    path = src / "result.json" if src.is_dir() else src
    if not path.is_file():
        raise SystemExit(f"equal_time {cfg.equal_time}: no finished stage-2 run there (no result.json); run it first")
    sem = json.loads(path.read_text())
    if sem["arm"] == "ce" or sem["seed"] != cfg.seed:
        raise SystemExit(
            f"equal_time {cfg.equal_time}: expected a semantic arm's run of seed {cfg.seed}, "
            f"got {sem['arm']} seed {sem['seed']}"
        )
    trained = sem.get("updates_trained", sem["updates"])
    basis: dict = {"run": str(path.parent), "arm": sem["arm"], "arm_updates": trained}
    basis["arm_train_seconds"] = sem["train_seconds"]
    ratio = cfg.time_ratio
    if ratio is None:
        control = path.parent.parent / f"ce-seed{cfg.seed}" / "result.json"
        if not control.is_file():
            raise SystemExit(
                f"equal_time: {control} is missing: run the ce arm of seed {cfg.seed} beside it first "
                "(its seconds per update set this run's length), or set time_ratio"
            )
        ce_speed = json.loads(control.read_text())["seconds_per_update"]
        basis.update(ce_run=str(control.parent), ce_seconds_per_update=ce_speed)
        updates = round(sem["train_seconds"] / ce_speed)
        data = data_seconds(sem)
        if data:  # an mbr-* arm: its one-off data generation counts too (charged whole to this arm)
            basis.update(data_seconds=data, data_updates=round(data / ce_speed))
            updates += basis["data_updates"]
    else:
        if isinstance(ratio, str):
            bench = resolve(ratio)
            if not bench.is_file():
                raise SystemExit(f"time_ratio {ratio}: no such file")
            timing = json.loads(bench.read_text())
            label, ratio = benchmark_ratio(timing, sem, str(ratio), cfg.time_ratio_arm)
            basis.update(ratio_from=str(bench), ratio_arm=label, ratio_batch_tokens=timing.get("batch_tokens"))
            if timing.get("batch_tokens") not in (None, cfg.batch_tokens):
                logger.warning(
                    "time_ratio %s was timed at batch_tokens %s, this run uses %s",
                    bench,
                    timing["batch_tokens"],
                    cfg.batch_tokens,
                )
        if ratio <= 0:
            raise SystemExit(f"time_ratio must be > 0, got {ratio}")
        basis["ratio"] = ratio
        updates = round(trained * ratio)
        data = data_seconds(sem)
        if data:  # an mbr-* arm's data generation, in updates of ce at the benchmark's ce speed
            # its CPU seconds where recorded: the data's are one thread's seconds on a core of its own, and the
            # benchmark's wall seconds grow with whatever else ran beside it
            ce = timing.get("arms", {}).get("ce", {}) if isinstance(cfg.time_ratio, str) else {}
            clock = "cpu" if ce.get("cpu_seconds_per_update") else "wall"
            ce_speed = ce.get("cpu_seconds_per_update") or ce.get("seconds_per_update")
            if not ce_speed:
                raise SystemExit("equal_time of an mbr-* arm needs the ce run beside it or a benchmark JSON with ce")
            basis.update(data_seconds=data, ce_seconds_per_update=ce_speed, ce_clock=clock)
            basis["data_updates"] = round(data / ce_speed)
            updates += basis["data_updates"]
    basis["updates"] = max(1, updates)
    logger.info("equal time: %s", basis)
    return basis["updates"], basis


# The settings that change an arm's seconds per update (besides the arm): a benchmark arm times a run only if
# they agree (an `mrt` run with `semantic_rows: 32` is not timed by the full-batch `mrt` arm).
COST_SETTINGS = ("semantic_rows", "samples", "scorer_dtype", "mrt_dropout", "bridge_mode", "mrt_candidates")


# Defaults of cost settings when earlier records (benchmark JSON, run configs) were written without them.
RECORDED_DEFAULTS = {"mrt_dropout": True, "mrt_candidates": "ancestral"}


def cost_settings(arm: str, settings: dict) -> dict:
    """``{"arm": arm, <COST_SETTINGS>: value}``, missing settings at their defaults when records lacked them
    (``RECORDED_DEFAULTS``), else ``Stage2Config``'s."""
    defaults = {f.name: f.default for f in dataclasses.fields(Stage2Config) if f.name in COST_SETTINGS}
    defaults.update(RECORDED_DEFAULTS)  # a record without the key was made when the default was this
    return {"arm": arm, **{k: settings.get(k, defaults[k]) for k in COST_SETTINGS}}


def benchmark_ratio(timing: dict, sem: dict, source: str, label: str | None = None) -> tuple[str, float]:
    """(label, ratio_to_ce) of the arm in a ``studies/multi30k/benchmarks/translation_arms.py`` JSON timed with
    the semantic run's arm and cost settings (``COST_SETTINGS``); the older ``{"ratio_to_ce": {arm: r}}`` is by
    arm name. ``label``: the benchmark arm to use (it must match those settings); needed where several match
    at different ratios."""
    if "arms" not in timing:
        ratios = timing.get("ratio_to_ce", {})
        if sem["arm"] not in ratios:
            raise SystemExit(f"time_ratio {source}: no ratio_to_ce for {sem['arm']!r} in it (has {sorted(ratios)})")
        return sem["arm"], ratios[sem["arm"]]
    run = cost_settings(sem["arm"], sem.get("config", {}))
    timed = {
        label: cost_settings(a.get("arm", label), a.get("settings", a.get("options", {})))
        for label, a in timing["arms"].items()
    }
    matches = [name for name, s in timed.items() if s == run]
    if label is not None:
        if label not in timed:
            raise SystemExit(f"time_ratio_arm {label!r}: no such arm in {source} (has {sorted(timed)})")
        if label not in matches:
            raise SystemExit(
                f"time_ratio_arm {label!r} in {source} was timed with other settings than this run's: "
                f"{timed[label]} against {run}"
            )
        return label, timing["arms"][label]["ratio_to_ce"]
    if len({timing["arms"][name]["ratio_to_ce"] for name in matches}) > 1:
        ratios = ", ".join(f"{name} {timing['arms'][name]['ratio_to_ce']:.3g}" for name in matches)
        raise SystemExit(
            f"time_ratio {source}: several arms were timed with this run's settings at different ratios "
            f"({ratios}): set time_ratio_arm to the one timed as this run trained"
        )
    if not matches:
        changed = {k: v for k, v in run.items() if k == "arm" or v != cost_settings("", {})[k]}
        raise SystemExit(
            f"time_ratio {source}: no arm in it was timed with this run's settings {changed} "
            f"(has {sorted(timed)}); time it with studies/multi30k/benchmarks/translation_arms.py or give time_ratio "
            "as a number"
        )
    return matches[0], timing["arms"][matches[0]]["ratio_to_ce"]


def arm_losses(cfg: Stage2Config, init: Path, sp) -> tuple:
    """The arm's semantic loss (``bertscore``), risk (``mrt``) or preference loss (``mbr-dpo``); Nones else."""
    from bertscore_loss import BERTScoreLoss, BERTScorer, MinimumRiskLoss, PreferenceLoss, VocabBridge

    semantic = risk = None
    if cfg.arm == "mbr-dpo":
        return None, PreferenceLoss(beta=cfg.beta, nll_weight=cfg.nll_weight, loss_type=cfg.preference_loss)
    if cfg.arm in ("bertscore", "mrt"):
        # bundled MiniLM, its default layer, fp32 by default: the same settings as the reported F
        scorer = BERTScorer(dtype=nmt.scorer_dtype(cfg.scorer_dtype))
        if cfg.arm == "bertscore":
            bridge = VocabBridge(init / "spm.model", scorer.encoder, cfg.bridge_mode, vocab_size=sp.get_piece_size())
            semantic = BERTScoreLoss(
                scorer=scorer,
                bridge=bridge,
                max_mode=cfg.max_mode,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                gumbel=cfg.gumbel,
                logit_temperature=cfg.logit_temperature,
            )
        else:
            risk = MinimumRiskLoss(scorer=scorer, alpha=cfg.alpha)
    return semantic, risk


def fine_tuner(
    cfg: Stage2Config, model, sp, init: Path, train: nmt.PairData, val: nmt.PairData, precision: str
) -> nmt.FineTuner:
    """The arm's :class:`nmt.FineTuner` with its losses and settings (``stage2`` and the arms benchmark)."""
    semantic, risk = arm_losses(cfg, init, sp)
    preference = risk if cfg.arm == "mbr-dpo" else None
    risk = None if cfg.arm == "mbr-dpo" else risk
    module = nmt.FineTuner(model, sp, cfg.train, val, precision, cfg.arm, semantic, risk, cfg.weight, cfg.samples)
    module.preference = preference
    if cfg.arm.startswith("mbr-"):
        module.mbr = nmt.MBRTargets.read(resolve(cfg.mbr_data), sp, cfg.max_len, train.src_text)
        logger.info("%s: MBR data for %d of %d training sources", cfg.mbr_data, len(module.mbr.target), len(train))
        if cfg.arm == "mbr-dpo" and cfg.dpo_pairs != "all":
            pairs = len(module.mbr.rejected)
            module.mbr = module.mbr.select_pairs(cfg.dpo_pairs)
            logger.info("dpo_pairs %s: %d of %d pairs kept", cfg.dpo_pairs, len(module.mbr.rejected), pairs)
    module.mrt_candidates, module.mrt_epsilon = cfg.mrt_candidates, cfg.mrt_epsilon
    module.ce_weight, module.distill_share = cfg.ce_weight, cfg.distill_share
    module.log_prob_dropout = cfg.mrt_dropout
    module.semantic_rows, module.row_seed = cfg.semantic_rows, cfg.seed
    module.train_targets = train.tgt_text
    return module


def stage2(cfg: Stage2Config, fresh: bool = False, overwrite: bool = False) -> dict:
    """Fine-tune the initial model with one arm; keep the weights the checkpoint rule chooses; decode the sets.

    Every arm of a seed gets the same batches (seeded by the seed only), optimizer, schedule and length.
    With ``val_every`` the run validates periodically and keeps the weights with the best val ``select``
    score (else its last weights). Resumes from ``<run>/checkpoints/last.ckpt`` with its val history and
    kept weights; refuses a rerun with other settings (``fresh``: start that run again). Every file it will
    write is checked before training (``overwrite``: replace files git tracks).
    """
    if cfg.arm not in nmt.ARMS:
        raise SystemExit(f"arm {cfg.arm!r}: expected one of {', '.join(nmt.ARMS)}")
    if cfg.select not in nmt.SELECT:
        raise SystemExit(f"select {cfg.select!r}: expected one of {', '.join(nmt.SELECT)}")
    if cfg.val_every is not None and cfg.val_every <= 0:
        raise SystemExit(f"val_every must be > 0 epochs, got {cfg.val_every}")
    if cfg.patience is not None and not cfg.val_every:
        raise SystemExit("patience needs val_every (it counts validations)")
    if cfg.semantic_rows is not None and cfg.semantic_rows < 1:
        raise SystemExit(f"semantic_rows must be >= 1 sources (or null for all), got {cfg.semantic_rows}")
    if cfg.mrt_candidates not in nmt.MRT_CANDIDATES:
        raise SystemExit(f"mrt_candidates {cfg.mrt_candidates!r}: expected one of {', '.join(nmt.MRT_CANDIDATES)}")
    if cfg.arm.startswith("mbr-") and not cfg.mbr_data:
        raise SystemExit(f"arm {cfg.arm} needs mbr_data: a folder built by studies/multi30k/mbr_data.py")
    if cfg.arm.startswith("mbr-") and not (resolve(cfg.mbr_data) / "manifest.json").exists():
        raise SystemExit(f"mbr_data {cfg.mbr_data}: no MBR data there (build it with studies/multi30k/mbr_data.py)")
    for name, top in (("distill_share", 1.0), ("ce_weight", math.inf), ("nll_weight", math.inf)):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and 0 <= value <= top):
            raise SystemExit(f"{name} must be a finite number in [0, {top:g}], got {value}")
    if cfg.preference_loss not in PREFERENCE_LOSS_TYPES:
        raise SystemExit(f"preference_loss {cfg.preference_loss!r}: expected one of {', '.join(PREFERENCE_LOSS_TYPES)}")
    if cfg.dpo_pairs not in nmt.DPO_PAIRS:
        raise SystemExit(f"dpo_pairs {cfg.dpo_pairs!r}: expected one of {', '.join(nmt.DPO_PAIRS)}")
    for name in ("beta", "logit_temperature", "mrt_epsilon"):
        value = getattr(cfg, name)
        if not (math.isfinite(value) and value > 0):
            raise SystemExit(f"{name} must be a finite number > 0, got {value}")
    data, init = resolve(cfg.data), require_model(cfg.init, "init")
    run = resolve(cfg.out) / f"{cfg.arm}-seed{cfg.seed}"
    sp = load_sp(init / "spm.model")
    train = nmt.PairData(sp, *nmt.read_pairs(data, "train", cfg.train_limit), cfg.max_len)
    batch_seed = 1000 + cfg.seed
    per_epoch = train.batches_per_epoch(cfg.batch_tokens, batch_seed)
    updates, equal_time = run_length(cfg, per_epoch)
    cfg = dataclasses.replace(cfg, updates=updates)  # stored resolved: a changed source of the length is refused
    val_every = max(1, round(cfg.val_every * per_epoch)) if cfg.val_every else None
    done = run / "result.json"
    before = json.loads(done.read_text())["config"] if done.exists() else None  # runs made before settings.json
    name = f"{cfg.arm}-seed{cfg.seed}-beam{cfg.beams}"
    finished = (run / "model").exists() and done.exists()
    dest = outputs_dir(cfg, run)
    todo = [s for s in cfg.eval_sets if s not in json.loads(done.read_text())["eval"]] if finished else cfg.eval_sets
    # a finished run adds the blind outputs it does not have yet; a new one writes them all
    blind = [p for p in blind_sources(data, cfg.blind) if not (finished and blind_file(dest, name, p).exists())]
    writable([done, *(run / f"{s}.hyp.en" for s in todo), *(blind_file(dest, name, p) for p in blind)], overwrite)
    check_settings(run, cfg, fresh, STAGE2_RESUMABLE, before=before, overwrite=overwrite)
    pl.seed_everything(cfg.seed, verbose=False)
    precision = precision_of(cfg.precision)
    if finished:
        # A finished run: keep its training figures, add only the evaluation sets it has not scored yet.
        result = json.loads(done.read_text())
        model, _ = load_model(run / "model")
        more = dataclasses.replace(cfg, eval_sets=todo)
        result["eval"].update(translate_sets(model, sp, data, run, more, precision, name, blind, overwrite))
        write(done, json.dumps(result, indent=1), overwrite)
        return result
    last = run / "checkpoints" / "last.ckpt"
    ckpt = read_checkpoint(last) if last.exists() else None
    start = ckpt["global_step"] if ckpt else 0
    model, _ = load_model(init)
    if cfg.arm == "mbr-dpo":
        check_reference_model(model, sp, cfg.mbr_data, cfg.init)
    val = nmt.PairData(sp, *nmt.read_pairs(data, "val"), cfg.max_len)
    module = fine_tuner(cfg, model, sp, init, train, val, precision)
    module.val_score = metrics.corpus_scores  # the reporting scorer: BLEU, chrF, BERTScore F, length ratio
    module.plan = nmt.RunPlan(
        updates=updates,
        val_every=val_every,
        val_beams=cfg.val_beams,
        val_limit=cfg.val_limit,
        select=cfg.select,
        patience=cfg.patience,
        checkpoint=last,
        curve=run / "curve.json" if val_every else None,
        stop_at=cfg.stop_at,
        deadline=time.time() + 60 * cfg.max_minutes if cfg.max_minutes else None,
    )
    model.train()  # from_pretrained() returns eval mode (no dropout); FineTuner.on_train_start says so too
    if ckpt is not None and (start >= updates or ckpt.get("stage2_run", {}).get("stopped_early")):
        # Trained to its end before an interruption: the checkpoint holds everything the result needs.
        module.load_run_state(ckpt["stage2_run"])
        model.load_state_dict({k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")})
        trained = start
    else:
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=updates,
            precision=precision,
            gradient_clip_val=cfg.train.clip,
            logger=pl.loggers.CSVLogger(run, name="logs"),
            enable_checkpointing=False,  # the module writes last.ckpt after every validation and when it pauses
            limit_val_batches=0,
            num_sanity_val_steps=0,
            enable_progress_bar=sys.stderr.isatty(),
            use_distributed_sampler=False,
            enable_model_summary=False,
            log_every_n_steps=10,
        )
        with warnings.catch_warnings():  # StepBatches starts at the checkpoint's update: the resume is exact
            warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before the epoch")
            trainer.fit(
                module,
                train.step_loader(cfg.batch_tokens, batch_seed, updates, start),
                ckpt_path=str(last) if ckpt else None,
            )
        del ckpt
        trained = trainer.global_step
        if module.paused:
            logger.warning("%s paused after update %d of %d: rerun the same command to continue", run, trained, updates)
            return {"arm": cfg.arm, "seed": cfg.seed, "status": "paused", "updates_done": trained, "updates": updates}
    if module.best_state is not None:
        model.load_state_dict(module.best_state)
    model.save_pretrained(run / "model")
    write(run / "model" / "spm.model", (init / "spm.model").read_bytes(), overwrite)
    steps = module.step_seconds
    result = {
        "arm": cfg.arm,
        "seed": cfg.seed,
        "updates": updates,
        "updates_trained": trained,
        "stopped_early": module.stopped_early,
        "batches_per_epoch": per_epoch,
        "pairs_per_update": len(train) / per_epoch,
        "chosen_update": module.best["step"] if module.best else trained,
        "chosen_val": module.best,
        "val_every": val_every,
        "val_curve": module.history,
        "cpu": nmt.cpu_label(),
        "precision": precision,
        "train_seconds": sum(steps),  # the updates only: validation and decoding not counted
        "seconds_per_update": sum(steps) / len(steps) if steps else None,
        "validation_seconds": module.val_seconds,
        "step_seconds": steps,
        "equal_time": equal_time,
        "config": settings_of(cfg),
    }
    result["eval"] = translate_sets(model, sp, data, run, cfg, precision, name, blind, overwrite)
    write(done, json.dumps(result, indent=1), overwrite)
    return result


def outputs_dir(cfg, run: Path) -> Path:
    """Where the blind-set translations go: ``outputs`` when given, else ``<run>/outputs``."""
    return resolve(cfg.outputs) if cfg.outputs else run / "outputs"


def blind_sources(data: Path, blind: bool = True) -> list[Path]:
    """The blind sets' sources ``<data>/blind/*.de`` (none when ``blind`` is false)."""
    return sorted((data / "blind").glob("*.de")) if blind else []


def blind_file(dest: Path, name: str, source: Path) -> Path:
    """Where the translations of the blind set ``source`` by the decoder ``name`` go: ``<dest>/<name>.<set>.en``."""
    return dest / f"{name}.{source.stem}.en"


def write_output(path: Path, lines: list[str], overwrite: bool = False) -> None:
    """One translation per line, by the write rule: a file git tracks (published outputs) only with ``overwrite``."""
    write(path, "\n".join(lines) + "\n", overwrite)


def translate_sets(
    model,
    sp,
    data: Path,
    run: Path,
    cfg: Stage2Config,
    precision: str,
    name: str,
    blind: list[Path] | None = None,
    overwrite: bool = False,
) -> dict:
    """Beam translations of the evaluation sets (scored, ``<run>/<set>.hyp.en``) and of the blind sets
    ``blind`` (default: all of them when ``cfg.blind``) into ``<outputs>/<name>.<set>.en``, ``outputs``
    defaulting to ``<run>/outputs``."""
    out = {}
    for split in cfg.eval_sets:
        src, refs = nmt.read_pairs(data, split, cfg.eval_limit)
        t0 = time.time()
        hyps = nmt.translate(model, sp, src, beams=cfg.beams, precision=precision)
        seconds = time.time() - t0
        write(run / f"{split}.hyp.en", "\n".join(hyps) + "\n", overwrite)
        out[split] = {**metrics.corpus_scores(hyps, refs, with_judge=cfg.judge), "decode_seconds": seconds}
        logger.info("%s %s: %s", name, split, out[split])
    dest = outputs_dir(cfg, run)
    for path in blind_sources(data, cfg.blind) if blind is None else blind:
        hyps = nmt.translate(model, sp, nmt.read_lines(path), beams=cfg.beams, precision=precision)
        write_output(blind_file(dest, name, path), hyps, overwrite)
    return out


@dataclass
class Stage3Config:
    data: str = "../shared/data/multi30k"
    model: str = "runs/multi30k/stage2/best/model"  # the model to decode with (stage 2's best arm)
    name: str = "best"  # names the blind output files
    out: str = "runs/multi30k/stage3"
    split: str = "test_2016_flickr"
    limit: int | None = None
    nbest_beams: int = 8
    sample_sizes: list[int] = field(default_factory=lambda: [16, 32])
    epsilon: float = 0.02  # epsilon sampling (Hewitt et al. 2022; Freitag et al. 2023 for MBR)
    seed: int = 0
    precision: str = "auto"
    blind: bool = True
    scored: bool = True  # decode and score `split`; False with blind: true decodes the blind sets only
    outputs: str = "runs/multi30k/stage3/outputs"  # every decoder's translations (docs/... publishes: a new folder)
    utilities: list[str] = field(default_factory=lambda: ["bertscore", "chrf"])  # MBR utilities (rerank registry)
    method: str = "exact"  # MBR method: exact, aggregate, aggregate-exact, prune (rerank.METHODS)
    sampler: str = "fast"  # fast: rerank.sample_ids; generate: model.generate(num_return_sequences=n)
    token_budget: int = 65536  # sampler rows x (source + new tokens) per batch


def mbr_utility(name: str):
    """The MBR utility ``name`` of the rerank registry; BERTScore with the reporting scorer (bundled MiniLM)."""
    from rerank import get_utility

    return get_utility(name, scorer=metrics.scorer()) if name.startswith("bertscore") else get_utility(name)


STAGE3_PRECISIONS = ("auto", "32-true", "bf16-mixed")


def check_stage3(cfg: Stage3Config, data: bool = True) -> None:
    """Every stage-3 setting and (``data``) the data folder it reads, before any decoding: one line naming the
    first bad one."""
    from rerank.mbr import get_method
    from rerank.registry import UTILITIES

    try:
        get_method(cfg.method)
    except ValueError as err:
        raise SystemExit(f"method: {one_line(err)}") from None
    if not cfg.utilities:
        raise SystemExit(f"utilities: give at least one MBR utility (known: {', '.join(sorted(UTILITIES))})")
    for u in cfg.utilities:
        if u.strip().lower() not in UTILITIES:
            close = difflib.get_close_matches(u.strip().lower(), sorted(UTILITIES), n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SystemExit(f"utilities: unknown MBR utility {u!r} ({hint}known: {', '.join(sorted(UTILITIES))})")
    if cfg.sampler not in ("fast", "generate"):
        raise SystemExit(f"sampler must be 'fast' or 'generate', got {cfg.sampler!r}")
    if cfg.precision not in STAGE3_PRECISIONS:
        raise SystemExit(f"precision must be one of {', '.join(STAGE3_PRECISIONS)}, got {cfg.precision!r}")
    for option, value in (("nbest_beams", cfg.nbest_beams), ("token_budget", cfg.token_budget), ("limit", cfg.limit)):
        if value is not None and value < 1:
            raise SystemExit(f"{option} must be >= 1, got {value}")
    bad = [n for n in cfg.sample_sizes if n < 1]
    if bad:
        raise SystemExit(f"sample_sizes must all be >= 1 samples per source, got {cfg.sample_sizes}")
    if len(set(cfg.sample_sizes)) != len(cfg.sample_sizes):
        raise SystemExit(f"sample_sizes has a size twice: {cfg.sample_sizes}")
    if not 0 <= cfg.epsilon < 1:
        raise SystemExit(f"epsilon must be in [0, 1), got {cfg.epsilon}")
    if not cfg.scored and not cfg.blind:
        raise SystemExit("scored: false and blind: false leave nothing to decode: set one of them to true")
    if not data:
        return
    folder = resolve(cfg.data)
    if not folder.is_dir():
        raise SystemExit(f"data {cfg.data}: no such folder")
    if cfg.scored:
        missing = [f"{cfg.split}.{lang}" for lang in ("de", "en") if not (folder / f"{cfg.split}.{lang}").is_file()]
        if missing:
            raise SystemExit(f"data {cfg.data} has no {' and no '.join(missing)}: is split {cfg.split!r} right?")
    if cfg.blind and not blind_sources(folder):
        raise SystemExit(f"blind: true but data {cfg.data} has no blind/*.de (set blind: false)")


def stage3_keys(cfg: Stage3Config) -> tuple[list[str], list[str]]:
    """The candidate lists stage 3 makes (``beam<k>-nbest``, ``eps<n>``) and every decoder's row name."""
    from rerank.mbr import get_method

    method = get_method(cfg.method)
    suffix = "" if method.name == "exact" else f"-{method.name}"
    lists = [f"beam{cfg.nbest_beams}-nbest", *(f"eps{n}" for n in cfg.sample_sizes)]
    rows = ["beam5-top1", *(f"{key}+mbr-{u}{suffix}" for key in lists for u in cfg.utilities)]
    return lists, rows


def stage3_files(cfg: Stage3Config) -> list[Path]:
    """Every file stage 3 writes: the scored split's candidate lists, each decoder's translations of each set,
    and the result."""
    out, dest, data = resolve(cfg.out), resolve(cfg.outputs), resolve(cfg.data)
    lists, rows = stage3_keys(cfg)
    sets = ([cfg.split] if cfg.scored else []) + [p.stem for p in blind_sources(data, cfg.blind)]
    files = [out / f"{cfg.name}-{key}.{cfg.split}.json" for key in lists] if cfg.scored else []
    files += [dest / f"{cfg.name}-{key}.{name}.en" for name in sets for key in rows]
    return [*files, out / f"{cfg.name}-stage3{'' if cfg.scored else '-blind'}.json"]


def stage3(cfg: Stage3Config, overwrite: bool = False) -> dict:
    """Beam-5 top-1 against MBR over beam n-best lists and over samples, with the registry's utilities.

    The settings and data are checked first (``check_stage3``) and every file it will write
    (``stage3_files``) before any decoding (``overwrite``: replace files git tracks)."""
    from rerank import mbr
    from rerank.mbr import get_method

    check_stage3(cfg)
    writable(stage3_files(cfg), overwrite)
    data, folder, out = resolve(cfg.data), resolve(cfg.model), resolve(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, sp = load_model(folder)
    precision = precision_of(cfg.precision)
    method = get_method(cfg.method)
    utilities = {u: mbr_utility(u) for u in cfg.utilities}
    src, refs = nmt.read_pairs(data, cfg.split, cfg.limit) if cfg.scored else ([], [])
    sets = {cfg.split: src} if cfg.scored else {}
    sets.update({p.stem: nmt.read_lines(p) for p in blind_sources(data, cfg.blind)})
    rows: dict[str, dict] = {}
    blind_speed: dict[str, dict[str, float]] = {}
    dest = resolve(cfg.outputs)
    suffix = "" if method.name == "exact" else f"-{method.name}"
    for name, sources in sets.items():
        torch.manual_seed(cfg.seed)
        lists: dict[str, tuple[list[list[str]] | list[str], float]] = {}
        t0 = time.time()
        lists["beam5"] = (nmt.translate(model, sp, sources, beams=5, precision=precision), time.time() - t0)
        t0 = time.time()
        nbest = nmt.translate(
            model, sp, sources, beams=cfg.nbest_beams, precision=precision, num_return_sequences=cfg.nbest_beams
        )
        lists[f"beam{cfg.nbest_beams}-nbest"] = (nbest, time.time() - t0)
        for n in cfg.sample_sizes:
            t0 = time.time()
            if cfg.sampler == "fast":
                samples, _ = nmt.sample(
                    model,
                    sp,
                    sources,
                    n,
                    epsilon=cfg.epsilon,
                    precision=precision,
                    token_budget=cfg.token_budget,
                    seed=cfg.seed + n,
                )
            else:
                samples = nmt.translate(
                    model,
                    sp,
                    sources,
                    beams=1,
                    precision=precision,
                    do_sample=True,
                    top_k=0,
                    epsilon_cutoff=cfg.epsilon,
                    num_return_sequences=n,
                )
            lists[f"eps{n}"] = (samples, time.time() - t0)
        outputs: dict[str, tuple[list[str], float]] = {"beam5-top1": lists["beam5"]}
        for key, (cands, gen_seconds) in lists.items():
            if key == "beam5":
                continue
            cands = [c if isinstance(c, list) else [c] for c in cands]
            if name == cfg.split:
                write(out / f"{cfg.name}-{key}.{name}.json", json.dumps(cands, ensure_ascii=False), overwrite)
            for uname, utility in utilities.items():
                t0 = time.time()
                best = [r.best for r in mbr(cands, utility=utility, method=method)]
                outputs[f"{key}+mbr-{uname}{suffix}"] = (best, gen_seconds + time.time() - t0)
        for key, (hyps, seconds) in outputs.items():
            write(dest / f"{cfg.name}-{key}.{name}.en", "\n".join(hyps) + "\n", overwrite)
            if name == cfg.split:
                row = {**metrics.corpus_scores(hyps, refs), "seconds_per_sentence": seconds / len(hyps)}
                rows[key] = row
                logger.info("stage 3 %s: %s", key, row)
            else:
                blind_speed.setdefault(name, {})[key] = seconds / len(hyps)
    result = {"model": str(folder), "split": cfg.split, "cpu": nmt.cpu_label(), "precision": precision, "rows": rows}
    result["blind_seconds_per_sentence"] = blind_speed
    write(out / f"{cfg.name}-stage3{'' if cfg.scored else '-blind'}.json", json.dumps(result, indent=1), overwrite)
    return result


def evaluate(
    model_dir: str,
    data: str,
    split: str,
    beams: int,
    precision: str,
    limit: int | None = None,
    length_penalty: float = 1.0,
    judge: bool = False,
    hyps_out: str | None = None,
) -> dict:
    """Beam translations of one split by a saved model folder, with the reported scores; ``length_penalty``:
    the beam's exponent on the length (Hugging Face ``generate``; 1.0 as every stage decodes, larger favours
    longer outputs); ``judge``: also the independent judge's F; ``hyps_out``: a file for the translations."""
    if not (math.isfinite(length_penalty) and length_penalty >= 0):
        raise SystemExit(f"--length-penalty must be a finite number >= 0, got {length_penalty}")
    model, sp = load_model(resolve(model_dir))
    src, refs = nmt.read_pairs(resolve(data), split, limit)
    t0 = time.time()
    hyps = nmt.translate(model, sp, src, beams=beams, precision=precision_of(precision), length_penalty=length_penalty)
    seconds = time.time() - t0
    if hyps_out:
        write(resolve(hyps_out), "\n".join(hyps) + "\n")
    return {
        "model": model_dir,
        "split": split,
        "beams": beams,
        "length_penalty": length_penalty,
        **metrics.corpus_scores(hyps, refs, with_judge=judge),
        "seconds_per_sentence": seconds / len(src),
        "cpu": nmt.cpu_label(),
        "precision": precision_of(precision),
    }


def load_runs(folder: str) -> dict[tuple[str, int], tuple[dict, Path]]:
    """``(arm, seed) -> (result.json, run folder)`` of the finished stage-2 runs under ``folder``."""
    runs = {}
    for path in sorted(resolve(folder).glob("*-seed*/result.json")):
        r = json.loads(path.read_text())
        runs[(r["arm"], r["seed"])] = (r, path.parent)
    return runs


def mean_sd(vals: list[float], digits: int = 2) -> str:
    import statistics

    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return f"{statistics.mean(vals):.{digits}f} ± {sd:.{digits}f}"


def p_values(base: Path, system: Path, split: str, refs: list[str], judge: bool = False) -> str:
    """Paired bootstrap p of ``system``'s ``split`` translations against ``base``'s (BLEU / chrF / BERTScore F,
    and with ``judge`` the independent judge's F).

    A run folder published without its translations (only ``result.json``) gets ``no translations (<run>)``."""
    missing = [run.name for run in (base, system) if not (run / f"{split}.hyp.en").is_file()]
    if missing:
        return f"no translations ({', '.join(missing)})"
    a, b = nmt.read_lines(base / f"{split}.hyp.en"), nmt.read_lines(system / f"{split}.hyp.en")
    if a == b:
        return "same translations"  # the bootstrap's smoothed p (1/1001) would read as significant
    p = metrics.paired_bootstrap(a, b, refs, with_judge=judge)
    return " / ".join(f"{p[k]:.3f}" for k in ("bleu_p", "chrf_p", "bertscore_p", "judge_p") if k in p)


def references(runs: dict, split: str) -> list[str]:
    config = next(iter(runs.values()))[0]["config"]
    return nmt.read_pairs(resolve(config["data"]), split, config["eval_limit"])[1]


def scores_table(runs: dict, split: str) -> list[str]:
    """Mean ± std over seeds per arm, paired bootstrap p vs the ce run of each seed, s/update (× ce). When every
    run scored ``split`` with the independent judge (``judge_f``), its F and p are columns too."""
    import statistics

    refs = references(runs, split)
    base_speed = statistics.mean([r["seconds_per_update"] for (a, _), (r, _) in runs.items() if a == "ce"] or [0])
    judge = all("judge_f" in r["eval"][split] for r, _ in runs.values() if split in r["eval"])
    keys = ("bleu", "chrf", "bertscore_f", "length_ratio") + (("judge_f",) if judge else ())
    lines = [
        "| arm | seeds | BLEU | chrF | BERTScore F | length ratio | "
        + ("judge F (mpnet) | p (BLEU / chrF / BERTScore / judge)" if judge else "p (BLEU / chrF / BERTScore)")
        + " vs ce per seed | s/update (× ce) |",
        "| --- " * (9 if judge else 8) + "|",
    ]
    for arm in nmt.ARMS:
        seeds = sorted(s for a, s in runs if a == arm and split in runs[(a, s)][0]["eval"])
        if not seeds:
            continue
        cols = {
            key: mean_sd([runs[(arm, s)][0]["eval"][split][key] for s in seeds], 3 if key == "length_ratio" else 2)
            for key in keys
        }
        pvals = [
            f"s{s}: {p_values(runs[('ce', s)][1], runs[(arm, s)][1], split, refs, judge)}"
            for s in seeds
            if arm != "ce" and ("ce", s) in runs and split in runs[("ce", s)][0]["eval"]
        ]
        speed = statistics.mean([runs[(arm, s)][0]["seconds_per_update"] for s in seeds])
        ratio = f"{speed:.2f} ({speed / base_speed:.1f}×)" if base_speed else f"{speed:.2f}"
        lines.append(
            f"| {arm} | {','.join(map(str, seeds))} | "
            + " | ".join(cols[k] for k in keys)
            + f" | {'; '.join(pvals) or '—'} | {ratio} |"
        )
    return lines


def training_table(runs: dict) -> list[str]:
    """Per run: updates, the update the checkpoint rule chose (and its val score), train and validation time."""
    lines = [
        "| run | updates | chosen update | val at chosen (BLEU / BERTScore F) | val curve (update: F) | train s "
        "| s/update | validation s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (arm, seed), (r, _) in sorted(runs.items(), key=lambda kv: (nmt.ARMS.index(kv[0][0]), kv[0][1])):
        chosen = r.get("chosen_val")
        at = f"{chosen['bleu']:.2f} / {chosen['bertscore_f']:.2f}" if chosen else "— (last weights)"
        curve = ", ".join(f"{row['step']}: {row['bertscore_f']:.2f}" for row in r.get("val_curve") or []) or "—"
        trained = r.get("updates_trained", r["updates"])
        stopped = " (stopped early)" if r.get("stopped_early") else ""
        lines.append(
            f"| {arm}-seed{seed} | {trained}{stopped} | {r.get('chosen_update', trained)} | {at} | {curve} "
            f"| {r['train_seconds']:.0f} | {r['seconds_per_update']:.3f} | {r.get('validation_seconds', 0):.0f} |"
        )
    return lines


def equal_time_table(runs: dict, folder: str, split: str) -> list[str]:
    """Each semantic arm against a ``ce`` run trained for as long as that arm trained (same seed, same rule):
    the arm's training seconds and, for an ``mbr-*`` arm, its data's (both counted in the ``ce`` run's length).
    When every run scored ``split`` with the independent judge (``judge_f``), its F and p are columns too."""
    control: dict[tuple[str, int], tuple[dict, Path]] = {}
    for path in sorted(resolve(folder).glob("**/ce-seed*/result.json")):
        r = json.loads(path.read_text())
        if r.get("equal_time"):
            control[(r["equal_time"]["arm"], r["seed"])] = (r, path.parent)
    pairs = [(c, runs[key][0]) for key, (c, _) in control.items() if key in runs]
    judge = bool(pairs) and all("judge_f" in r["eval"][split] for pair in pairs for r in pair if split in r["eval"])
    keys = ("bleu", "chrf", "bertscore_f") + (("judge_f",) if judge else ())
    names = ["BLEU", "chrF", "BERTScore F"] + (["judge F (mpnet)"] if judge else [])
    lines = [
        "| arm | seeds | arm's train s | arm's data s | `ce` updates in that time (arm's) | "
        + " | ".join(f"`ce` {n}" for n in names)
        + " | "
        + " | ".join(f"arm {n}" for n in names)
        + f" | p ({' / '.join(n.split(' (')[0] for n in names)}) arm vs `ce` per seed |",
        "| --- " * (6 + 2 * len(keys)) + "|",
    ]
    if not control:
        return lines
    refs = references(control, split)
    for arm in nmt.ARMS[1:]:
        seeds = sorted(
            s
            for a, s in control
            if a == arm and (a, s) in runs and split in control[(a, s)][0]["eval"] and split in runs[(a, s)][0]["eval"]
        )
        if not seeds:
            continue
        ce = [control[(arm, s)][0] for s in seeds]
        sem = [runs[(arm, s)][0] for s in seeds]
        pvals = "; ".join(
            f"s{s}: {p_values(control[(arm, s)][1], runs[(arm, s)][1], split, refs, judge)}" for s in seeds
        )
        updates = ", ".join(f"{c['updates_trained']} ({c['equal_time']['arm_updates']})" for c in ce)
        data = mean_sd([c["equal_time"].get("data_seconds", 0.0) for c in ce], 0)
        lines.append(
            f"| {arm} | {','.join(map(str, seeds))} | {mean_sd([r['train_seconds'] for r in sem], 0)} | {data} | "
            f"{updates} | "
            + " | ".join(mean_sd([r["eval"][split][k] for r in ce]) for k in keys)
            + " | "
            + " | ".join(mean_sd([r["eval"][split][k] for r in sem]) for k in keys)
            + f" | {pvals} |"
        )
    return lines


def report(
    stage2_dir: str, split: str | list[str] | None = None, equal_time: str | None = None, training: bool = True
) -> str:
    """Markdown tables of the stage-2 runs under ``stage2_dir``: per split (default test_2016_flickr and val)
    mean ± std over seeds with the paired bootstrap p vs the ce run of each seed; the training of every run
    (updates, chosen update, val curve, times); with ``equal_time`` (a folder of equal-time ce runs) each
    semantic arm against the ce run that trained as long."""
    runs = load_runs(stage2_dir)
    if not runs:
        raise SystemExit(f"{stage2_dir}: no finished stage-2 runs (*-seed*/result.json)")
    splits = [split] if isinstance(split, str) else list(split or ["test_2016_flickr", "val"])
    out: list[str] = []
    for s in splits:
        if any(s in r["eval"] for r, _ in runs.values()):
            out += [f"**{s}**", "", *scores_table(runs, s), ""]
    if training:
        out += ["**training**", "", *training_table(runs), ""]
    if equal_time:
        for s in splits:
            out += [f"**equal time, {s}**", "", *equal_time_table(runs, equal_time, s), ""]
    return "\n".join(out).rstrip("\n")


BERTSCORE_SETTINGS = ("weight", "temperature", "max_mode", "gumbel", "bridge_mode", "top_k")


def sweep_report(sweep_dir: str, stage2_dir: str = "runs/multi30k/stage2", split: str = "val", seed: int = 0) -> str:
    """Markdown table of the val sweep: every run under ``sweep_dir`` beside the stage-2 runs of ``seed``."""
    found = [("stage2", p) for p in sorted(resolve(stage2_dir).glob(f"*-seed{seed}/result.json"))]
    found += [(p.parent.parent.name, p) for p in sorted(resolve(sweep_dir).glob(f"*/*-seed{seed}/result.json"))]
    lines = [
        f"| run | arm | settings | {split} BLEU | chrF | BERTScore F | length ratio | s/update |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, path in found:
        r = json.loads(path.read_text())
        if split not in r["eval"]:
            continue
        e, c = r["eval"][split], r["config"]
        keys = {"ce": (), "mrt": ("weight", "alpha", "samples")}.get(r["arm"], BERTSCORE_SETTINGS)
        settings = ", ".join(f"{k}={c[k]}" for k in keys if k in c) or "—"
        speed = r.get("seconds_per_update")
        lines.append(
            f"| {name} | {r['arm']} | {settings} | {e['bleu']:.2f} | {e['chrf']:.2f} | {e['bertscore_f']:.2f} "
            f"| {e['length_ratio']:.3f} | {f'{speed:.2f}' if speed else '—'} |"
        )
    return "\n".join(lines)


def run_stage3(cfg: Stage3Config, fresh: bool = False, overwrite: bool = False) -> dict:
    """Stage 3 with its whole config, data, model folder and output files checked first and its settings
    stored (``<out>/<name>.settings.json``)."""
    check_stage3(cfg)
    require_model(cfg.model, "--model")
    writable(stage3_files(cfg), overwrite)
    settings = f"{cfg.name}.settings.json"
    check_settings(resolve(cfg.out), cfg, fresh, STAGE3_RESUMABLE, file=settings, wipe=False, overwrite=overwrite)
    return stage3(cfg, overwrite)


SAMPLE = ROOT / "tests" / "data" / "multi30k"  # 300 train pairs, 24 val and test pairs, 8 + 8 blind sources


def smoke_configs(out: Path, data: Path = SAMPLE) -> dict:
    """The settings of ``recipe.py smoke``: every stage on the committed sample with a tiny model."""
    tiny = nmt.ModelConfig(d_model=64, layers=1, heads=2, ffn=128, dropout=0.1)
    base = Stage2Config(
        data=str(data),
        init=str(out / "stage1" / "model"),
        out=str(out / "stage2"),
        epochs=0.2,  # 0.2 of the 300 pairs at 200 tokens a batch: about 10 updates
        batch_tokens=200,
        precision="32-true",
        samples=3,
        val_every=0.1,
        patience=3,
        beams=2,
        train=nmt.TrainConfig(lr=1e-3, warmup=2),  # the 7-epoch base still learns: the rule keeps a later update
    )
    return {
        "stage1": Stage1Config(
            data=str(data),
            out=str(out / "stage1"),
            vocab_size=250,
            max_epochs=7,
            max_minutes=None,
            patience=3,
            average=2,
            batch_tokens=600,
            precision="32-true",
            model=tiny,
            train=nmt.TrainConfig(lr=5e-3, warmup=10, val_limit=8),
        ),
        "stage2": {
            arm: dataclasses.replace(base, arm=arm, mbr_data=str(out / "mbr-data") if arm.startswith("mbr-") else None)
            for arm in nmt.ARMS
        },
        "mbr_data": (str(out / "mbr-data"), 40),  # the first 40 training sources, 4 samples and the beam-2 output
        "equal_time": dataclasses.replace(
            base,
            out=str(out / "equal-time" / "bertscore"),
            equal_time=str(out / "stage2" / "bertscore-seed0"),
            blind=False,
        ),
        "stage3": Stage3Config(
            data=str(data),
            model=str(out / "stage2" / "bertscore-seed0" / "model"),
            name="bertscore-seed0",
            out=str(out / "stage3"),
            limit=6,
            nbest_beams=2,
            sample_sizes=[3],
            precision="32-true",
            blind=True,
            outputs=str(out / "stage3" / "outputs"),
        ),
    }


def smoke_mbr_data(cfg: Stage2Config, folder: str, limit: int) -> None:
    """MBR-ranked data of the first ``limit`` training sources from the smoke's stage-1 model (4 samples)."""
    from rerank.training_data import MBRDataConfig, build_mbr_data

    init = resolve(cfg.init)
    model, _ = load_model(init)
    sources, _ = nmt.read_pairs(resolve(cfg.data), "train", limit=limit)
    config = MBRDataConfig(num_samples=4, beams=2, shard_size=20, precision="32", seed=cfg.seed)
    build_mbr_data(model, load_sp(init / "spm.model"), sources, resolve(folder), config, progress=False)


def smoke(out: str = "runs/multi30k/smoke", fresh: bool = False, overwrite: bool = False) -> dict:
    """All stages on the committed sample with a tiny model (about a minute on one thread): stage 1 with early
    stopping and averaging, stage 2 for every arm with periodic validation and the best-F rule, an equal-time
    ce run for the bertscore arm, the report, and stage 3. Writes only under ``out``."""
    root = resolve(out)
    if fresh and root.exists():
        shutil.rmtree(root)
    cfgs = smoke_configs(root)
    writable([root / "report.md"], overwrite)
    t0 = time.time()
    stage1(cfgs["stage1"], overwrite=overwrite)
    smoke_mbr_data(cfgs["stage2"]["mbr-dpo"], *cfgs["mbr_data"])
    runs = {arm: stage2(cfg, overwrite=overwrite) for arm, cfg in cfgs["stage2"].items()}
    equal = stage2(cfgs["equal_time"], overwrite=overwrite)
    table = report(str(root / "stage2"), equal_time=str(root / "equal-time"))
    s3 = run_stage3(cfgs["stage3"], overwrite=overwrite)
    write(root / "report.md", table + "\n", overwrite)
    return {
        "out": str(root),
        "seconds": time.time() - t0,
        "stage2": {arm: {k: r[k] for k in ("updates_trained", "chosen_update")} for arm, r in runs.items()},
        "equal_time_updates": equal["updates_trained"],
        "stage3_rows": sorted(s3["rows"]),
        "report": str(root / "report.md"),
    }


OVERWRITE_HELP = (
    "replace files git tracks (published outputs, committed runs); without it they are refused before any work. "
    "Every file is written atomically; paths under docs/ only when given (--set outputs=docs/..., --out)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="stage", required=True)
    p1 = sub.add_parser("stage1", help="tokenizer + generator from scratch (cross-entropy)")
    p1.add_argument("--config")
    p1.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p1.add_argument("--out")
    p1.add_argument("--fresh", action="store_true", help="discard a run in --out made with other settings")
    p1.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p2 = sub.add_parser("stage2", help="fine-tune one arm from the stage-1 model (ce, bertscore, mrt)")
    p2.add_argument("--config")
    p2.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p2.add_argument("--arm", choices=nmt.ARMS)
    p2.add_argument("--seed", type=int)
    p2.add_argument("--weight", type=float, help="lambda of the semantic term (overrides the config)")
    p2.add_argument("--out")
    p2.add_argument("--fresh", action="store_true", help="discard a run of this arm and seed made with other settings")
    p2.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p3 = sub.add_parser("stage3", help="decode with beam search vs MBR reranking (BERTScore, chrF)")
    p3.add_argument("--config")
    p3.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p3.add_argument("--model")
    p3.add_argument("--name")
    p3.add_argument("--out")
    p3.add_argument("--fresh", action="store_true", help="replace the stored settings of --name in --out")
    p3.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p4 = sub.add_parser("report", help="stage-2 tables: scores over seeds with paired bootstrap, training, equal time")
    p4.add_argument("--stage2", default="runs/multi30k/stage2")
    p4.add_argument("--split", action="append", help="split to tabulate (repeatable; default test_2016_flickr and val)")
    p4.add_argument("--equal-time", help="folder of equal-time ce runs (stage2 --set equal_time=...)")
    p6 = sub.add_parser("sweep-report", help="val sweep table: every sweep run beside the stage-2 runs of one seed")
    p6.add_argument("--sweep", default="runs/multi30k/sweep")
    p6.add_argument("--stage2", default="runs/multi30k/stage2")
    p6.add_argument("--split", default="val")
    p6.add_argument("--seed", type=int, default=0)
    p5 = sub.add_parser("evaluate", help="beam-translate one split with a saved model and score it")
    p5.add_argument("--model", default="runs/multi30k/stage1/model")
    p5.add_argument("--data", default="../shared/data/multi30k")
    p5.add_argument("--split", default="test_2016_flickr")
    p5.add_argument("--beams", type=int, default=5)
    p5.add_argument("--precision", default="auto")
    p5.add_argument("--limit", type=int)
    p5.add_argument("--length-penalty", type=float, default=1.0, help="the beam's length exponent (1.0: as stages)")
    p5.add_argument("--judge", action="store_true", help="also the independent judge's F (the accurate extra)")
    p5.add_argument("--hyps", help="write the translations to this file")
    p7 = sub.add_parser("smoke", help="every stage on the committed sample with a tiny model (about a minute)")
    p7.add_argument("--out", default="runs/multi30k/smoke")
    p7.add_argument("--fresh", action="store_true", help="delete --out first")
    p7.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    return parser


def configure(argv: list[str] | None = None) -> tuple[argparse.Namespace, object | None]:
    """The parsed command line and, for stage1/2/3, the config it builds (files, options, ``--set``), without
    running anything: bad input ends here in one line."""
    args = build_parser().parse_args(argv)
    cfg: object | None = None
    if args.stage == "stage1":
        cfg = load_config(Stage1Config, args.config, {"out": args.out}, args.set)
    elif args.stage == "stage2":
        overrides = {"out": args.out, "arm": args.arm, "seed": args.seed, "weight": args.weight}
        cfg = load_config(Stage2Config, args.config, overrides, args.set)
    elif args.stage == "stage3":
        overrides = {"model": args.model, "name": args.name, "out": args.out}
        cfg = load_config(Stage3Config, args.config, overrides, args.set)
        check_stage3(cfg, data=False)  # every setting now; the data folder when the stage runs
    return args, cfg


def main(argv: list[str] | None = None) -> None:
    args, cfg = configure(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    threads = os.environ.get("THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if isinstance(cfg, Stage1Config):
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        print(json.dumps(stage1(cfg, args.fresh, args.overwrite), indent=1))
    elif isinstance(cfg, Stage2Config):
        print(json.dumps(stage2(cfg, args.fresh, args.overwrite), indent=1))
    elif isinstance(cfg, Stage3Config):
        print(json.dumps(run_stage3(cfg, args.fresh, args.overwrite), indent=1))
    elif args.stage == "evaluate":
        require_model(args.model, "--model")
        result = evaluate(
            args.model,
            args.data,
            args.split,
            args.beams,
            args.precision,
            args.limit,
            args.length_penalty,
            args.judge,
            args.hyps,
        )
        print(json.dumps(result, indent=1))
    elif args.stage == "report":
        print(report(args.stage2, args.split, args.equal_time))
    elif args.stage == "sweep-report":
        print(sweep_report(args.sweep, args.stage2, args.split, args.seed))
    elif args.stage == "smoke":
        summary = smoke(args.out, args.fresh, args.overwrite)
        print(Path(summary["report"]).read_text(encoding="utf-8"))
        print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exc:  # a one-line error (bad config, refused write): exit status 2, as argparse's
        if isinstance(exc.code, str):
            print(f"recipe.py: error: {exc.code}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
