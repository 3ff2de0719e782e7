"""Multi30k de→en with BERTScore inside training and decoding: one command per stage, each resumable.

    python examples/translation/recipe.py stage1 --config configs/translation/stage1.yaml
    python examples/translation/recipe.py stage2 --config configs/translation/stage2.yaml --arm mrt --seed 0
    python examples/translation/recipe.py stage3 --config configs/translation/stage3.yaml

See docs/translation.md for the figures each stage produced and what every option means.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytorch_lightning as pl
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import metrics  # noqa: E402
import nmt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
logger = logging.getLogger("translation")


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
        head, _, sub = key.partition(".")
        if sub:
            out.setdefault(head, {})[sub] = yaml.safe_load(value)
        else:
            out[head] = yaml.safe_load(value)
    return out


def load_config(cls, path: str | None, overrides: dict, sets: list[str] | None = None):
    """The YAML file, then the named options, then ``--set key=value`` items (``train.lr=...`` merges)."""
    raw = yaml.safe_load(Path(path).read_text()) if path else {}
    raw = {**(raw or {}), **{k: v for k, v in overrides.items() if v is not None}}
    for key, value in parse_sets(sets).items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    kwargs = {}
    names = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in raw.items():
        if key not in names:
            raise SystemExit(f"{path}: unknown option {key!r} (known: {', '.join(names)})")
        sub = {"model": nmt.ModelConfig, "train": nmt.TrainConfig}.get(key)
        kwargs[key] = sub(**value) if sub and isinstance(value, dict) else value
    return cls(**kwargs)


def resolve(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() else ROOT / p


def precision_of(name: str) -> str:
    if name == "auto":
        return "bf16-mixed" if nmt.cpu_has_native_bf16() else "32-true"
    return name


# Options that may change between invocations of one run (how long or how it runs, not what it computes).
RESUMABLE = {"out", "max_epochs", "max_minutes", "patience", "threads", "eval_sets", "blind", "outputs", "eval_limit"}


def check_settings(run: Path, cfg, fresh: bool = False) -> None:
    """Store ``cfg`` in ``run/settings.json``; refuse a rerun whose settings differ (but for ``RESUMABLE`` ones).

    With ``fresh`` a differing run folder is emptied (with a warning) and the run starts again.
    """
    path = run / "settings.json"
    now = json.loads(json.dumps(dataclasses.asdict(cfg)))
    if path.exists():
        before = json.loads(path.read_text())
        diff = sorted(k for k in set(now) | set(before) if k not in RESUMABLE and now.get(k) != before.get(k))
        if diff:
            if not fresh:
                changes = "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in diff)
                raise SystemExit(
                    f"{run} holds a run with other settings ({changes}). Use another --out, or --fresh to "
                    "discard that run and start again."
                )
            logger.warning("%s: settings changed (%s); --fresh: starting again", run, ", ".join(diff))
            import shutil

            shutil.rmtree(run)
            run.mkdir(parents=True)
    path.write_text(json.dumps(now, indent=1))


def load_sp(path: Path):
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path))


def stage1(cfg: Stage1Config, fresh: bool = False) -> dict:
    """Tokenizer + generator from scratch with label-smoothed CE until val BLEU stops improving (``patience``);
    the best epoch or the average of the last ``average`` epochs, whichever is better on val, exported as HF."""
    out, data = resolve(cfg.out), resolve(cfg.data)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, cfg, fresh)
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
    t0 = time.time()
    trainer.fit(
        module,
        train.loader(cfg.batch_tokens, True, cfg.seed),
        val.loader(cfg.batch_tokens, False),
        ckpt_path=str(last) if last.exists() else None,
    )
    logger.info("stage 1 trained in %.0f s; best %s", time.time() - t0, ckpt.best_model_path)
    best = torch.load(ckpt.best_model_path or last, map_location="cpu", weights_only=False)
    model.load_state_dict({k[len("model.") :]: v for k, v in best["state_dict"].items() if k.startswith("model.")})
    choice = choose_average(model, sp, val, out / "epochs", cfg.average, precision)
    model.save_pretrained(out / "model")
    (out / "model" / "spm.model").write_bytes(spm_path.read_bytes())
    (out / "model" / "choice.json").write_text(json.dumps(choice, indent=1))
    return {
        "best": ckpt.best_model_path,
        "choice": choice,
        "cpu": nmt.cpu_label(),
        "precision": precision,
        "curve": module.history,
    }


def average_weights(paths: list[Path]) -> dict:
    """The element-wise mean of saved state dicts (floating tensors; others from the last one)."""
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
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
    updates: int = 300
    batch_tokens: int = 768
    max_len: int = 100
    precision: str = "auto"
    weight: float = 1.0  # lambda of the semantic term (bertscore, mrt)
    samples: int = 8  # mrt: samples per source
    alpha: float = 1.0  # mrt: sharpness of the renormalised distribution
    bridge_mode: str = "retokenize"  # bertscore arm: VocabBridge mode
    max_mode: str = "straight_through"
    temperature: float = 0.05
    top_k: int | None = 64
    gumbel: str | None = None
    val_limit: int | None = None
    eval_sets: list[str] = field(default_factory=lambda: ["val", "test_2016_flickr"])
    blind: bool = True
    outputs: str = "docs/multi30k-outputs"  # where the blind-set translations go
    eval_limit: int | None = None  # first N lines of each evaluation set (smoke runs)
    beams: int = 5
    train: nmt.TrainConfig = field(default_factory=lambda: nmt.TrainConfig(lr=1e-4, warmup=50))


def load_model(folder: Path):
    from transformers import MarianMTModel

    model = MarianMTModel.from_pretrained(folder)
    return model, load_sp(folder / "spm.model")


def stage2(cfg: Stage2Config) -> dict:
    """Fine-tune the stage-1 model for ``updates`` updates with one arm; then translate val, test and blind."""
    from bertscore_loss import BERTScoreLoss, BERTScorer, MinimumRiskLoss, VocabBridge

    data, init = resolve(cfg.data), resolve(cfg.init)
    run = resolve(cfg.out) / f"{cfg.arm}-seed{cfg.seed}"
    run.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(cfg.seed, verbose=False)
    model, sp = load_model(init)
    precision = precision_of(cfg.precision)
    done = run / "result.json"
    if (run / "model").exists() and done.exists():
        # A finished run: keep its training figures, add only the evaluation sets it has not scored yet.
        result = json.loads(done.read_text())
        model, _ = load_model(run / "model")
        todo = [s for s in cfg.eval_sets if s not in result["eval"]]
        blind = cfg.blind and not all(
            (resolve(cfg.outputs) / f"{cfg.arm}-seed{cfg.seed}-beam{cfg.beams}.{p.stem}.en").exists()
            for p in (data / "blind").glob("*.de")
        )
        more = dataclasses.replace(cfg, eval_sets=todo, blind=blind)
        result["eval"].update(
            translate_sets(model, sp, data, run, more, precision, f"{cfg.arm}-seed{cfg.seed}-beam{cfg.beams}")
        )
        done.write_text(json.dumps(result, indent=1))
        return result
    train = nmt.PairData(sp, *nmt.read_pairs(data, "train"), cfg.max_len)
    val = nmt.PairData(sp, *nmt.read_pairs(data, "val"), cfg.max_len)
    semantic = risk = None
    if cfg.arm in ("bertscore", "mrt"):
        scorer = BERTScorer()  # bundled MiniLM, its default layer, fp32: the same settings as the reported F
        if cfg.arm == "bertscore":
            bridge = VocabBridge(init / "spm.model", scorer.encoder, cfg.bridge_mode, vocab_size=sp.get_piece_size())
            semantic = BERTScoreLoss(
                scorer=scorer,
                bridge=bridge,
                max_mode=cfg.max_mode,
                temperature=cfg.temperature,
                top_k=cfg.top_k,
                gumbel=cfg.gumbel,
            )
        else:
            risk = MinimumRiskLoss(scorer=scorer, alpha=cfg.alpha)
    module = nmt.FineTuner(model, sp, cfg.train, val, precision, cfg.arm, semantic, risk, cfg.weight, cfg.samples)
    module.train_targets = train.tgt_text
    model.train()  # from_pretrained() returns eval mode (no dropout); FineTuner.on_train_start says so too
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=cfg.updates,
        precision=precision,
        gradient_clip_val=cfg.train.clip,
        logger=pl.loggers.CSVLogger(run, name="logs"),
        callbacks=[pl.callbacks.ModelCheckpoint(dirpath=run / "checkpoints", save_last=True, save_top_k=0)],
        limit_val_batches=0,
        num_sanity_val_steps=0,
        enable_progress_bar=sys.stderr.isatty(),
        use_distributed_sampler=False,
        enable_model_summary=False,
        log_every_n_steps=10,
    )
    last = run / "checkpoints" / "last.ckpt"
    t0 = time.time()
    trainer.fit(
        module,
        train.loader(cfg.batch_tokens, True, 1000 + cfg.seed),
        ckpt_path=str(last) if last.exists() else None,
    )
    model.save_pretrained(run / "model")
    (run / "model" / "spm.model").write_bytes((init / "spm.model").read_bytes())
    seconds = time.time() - t0
    steps = module.step_seconds
    result = {
        "arm": cfg.arm,
        "seed": cfg.seed,
        "updates": cfg.updates,
        "cpu": nmt.cpu_label(),
        "precision": precision,
        "train_seconds": seconds,
        "seconds_per_update": sum(steps) / len(steps) if steps else None,
        "step_seconds": steps,
        "config": dataclasses.asdict(cfg),
    }
    result["eval"] = translate_sets(model, sp, data, run, cfg, precision, f"{cfg.arm}-seed{cfg.seed}-beam{cfg.beams}")
    done.write_text(json.dumps(result, indent=1))
    return result


def translate_sets(model, sp, data: Path, run: Path, cfg: Stage2Config, precision: str, name: str) -> dict:
    """Beam translations of the evaluation sets (scored) and of the blind sets (written to docs/multi30k-outputs)."""
    out = {}
    for split in cfg.eval_sets:
        src, refs = nmt.read_pairs(data, split, cfg.eval_limit)
        t0 = time.time()
        hyps = nmt.translate(model, sp, src, beams=cfg.beams, precision=precision)
        seconds = time.time() - t0
        (run / f"{split}.hyp.en").write_text("\n".join(hyps) + "\n", encoding="utf-8")
        out[split] = {**metrics.corpus_scores(hyps, refs), "decode_seconds": seconds}
        logger.info("%s %s: %s", name, split, out[split])
    if cfg.blind:
        dest = resolve(cfg.outputs)
        dest.mkdir(parents=True, exist_ok=True)
        for path in sorted((data / "blind").glob("*.de")):
            hyps = nmt.translate(model, sp, nmt.read_lines(path), beams=cfg.beams, precision=precision)
            (dest / f"{name}.{path.stem}.en").write_text("\n".join(hyps) + "\n", encoding="utf-8")
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
    outputs: str = "docs/multi30k-outputs"
    utilities: list[str] = field(default_factory=lambda: ["bertscore", "chrf"])  # MBR utilities (rerank registry)
    method: str = "exact"  # MBR method: exact, aggregate, aggregate-exact, prune (rerank.METHODS)
    sampler: str = "fast"  # fast: rerank.sample_ids; generate: model.generate(num_return_sequences=n)
    token_budget: int = 65536  # sampler rows x (source + new tokens) per batch


def mbr_utility(name: str):
    """The MBR utility ``name`` of the rerank registry; BERTScore with the reporting scorer (bundled MiniLM)."""
    from rerank import get_utility

    return get_utility(name, scorer=metrics.scorer()) if name.startswith("bertscore") else get_utility(name)


def stage3(cfg: Stage3Config) -> dict:
    """Beam-5 top-1 against MBR over beam n-best lists and over samples, with the registry's utilities."""
    from rerank import get_method, mbr

    if cfg.sampler not in ("fast", "generate"):
        raise SystemExit(f"sampler must be 'fast' or 'generate', got {cfg.sampler!r}")
    data, folder, out = resolve(cfg.data), resolve(cfg.model), resolve(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, sp = load_model(folder)
    precision = precision_of(cfg.precision)
    method = get_method(cfg.method)
    utilities = {u: mbr_utility(u) for u in cfg.utilities}
    src, refs = nmt.read_pairs(data, cfg.split, cfg.limit)
    sets = {cfg.split: src} if cfg.scored else {}
    if cfg.blind:
        sets.update({p.stem: nmt.read_lines(p) for p in sorted((data / "blind").glob("*.de"))})
    rows: dict[str, dict] = {}
    blind_speed: dict[str, dict[str, float]] = {}
    dest = resolve(cfg.outputs)
    dest.mkdir(parents=True, exist_ok=True)
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
                (out / f"{cfg.name}-{key}.{name}.json").write_text(json.dumps(cands, ensure_ascii=False))
            for uname, utility in utilities.items():
                t0 = time.time()
                best = [r.best for r in mbr(cands, utility=utility, method=method)]
                outputs[f"{key}+mbr-{uname}{suffix}"] = (best, gen_seconds + time.time() - t0)
        for key, (hyps, seconds) in outputs.items():
            (dest / f"{cfg.name}-{key}.{name}.en").write_text("\n".join(hyps) + "\n", encoding="utf-8")
            if name == cfg.split:
                row = {**metrics.corpus_scores(hyps, refs), "seconds_per_sentence": seconds / len(hyps)}
                rows[key] = row
                logger.info("stage 3 %s: %s", key, row)
            else:
                blind_speed.setdefault(name, {})[key] = seconds / len(hyps)
    result = {"model": str(folder), "split": cfg.split, "cpu": nmt.cpu_label(), "precision": precision, "rows": rows}
    result["blind_seconds_per_sentence"] = blind_speed
    (out / f"{cfg.name}-stage3{'' if cfg.scored else '-blind'}.json").write_text(json.dumps(result, indent=1))
    return result


def evaluate(model_dir: str, data: str, split: str, beams: int, precision: str, limit: int | None = None) -> dict:
    """Beam translations of one split by a saved model folder, with the reported scores."""
    model, sp = load_model(resolve(model_dir))
    src, refs = nmt.read_pairs(resolve(data), split, limit)
    t0 = time.time()
    hyps = nmt.translate(model, sp, src, beams=beams, precision=precision_of(precision))
    seconds = time.time() - t0
    return {
        "model": model_dir,
        "split": split,
        "beams": beams,
        **metrics.corpus_scores(hyps, refs),
        "seconds_per_sentence": seconds / len(src),
        "cpu": nmt.cpu_label(),
        "precision": precision_of(precision),
    }


def report(stage2_dir: str, split: str = "test_2016_flickr") -> str:
    """Markdown table of the stage-2 runs: mean ± std over seeds, paired bootstrap p vs the ce run of each seed."""
    import statistics

    runs = {}
    for path in sorted(resolve(stage2_dir).glob("*-seed*/result.json")):
        r = json.loads(path.read_text())
        runs[(r["arm"], r["seed"])] = (r, path.parent)
    first = runs[next(iter(runs))][0]["config"] if runs else {}
    refs = nmt.read_pairs(resolve(first["data"]), split, first["eval_limit"])[1] if runs else []
    base_speed = statistics.mean([r["seconds_per_update"] for (a, _), (r, _) in runs.items() if a == "ce"] or [0])
    lines = [
        "| arm | seeds | BLEU | chrF | BERTScore F | length ratio | p (BLEU / chrF / BERTScore) vs ce per seed "
        "| s/update (× ce) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm in nmt.ARMS:
        seeds = sorted(s for a, s in runs if a == arm)
        if not seeds:
            continue
        cols = {}
        for key in ("bleu", "chrf", "bertscore_f", "length_ratio"):
            vals = [runs[(arm, s)][0]["eval"][split][key] for s in seeds]
            sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
            cols[key] = (
                f"{statistics.mean(vals):.3f} ± {sd:.3f}"
                if key == "length_ratio"
                else (f"{statistics.mean(vals):.2f} ± {sd:.2f}")
            )
        pvals = []
        for s in seeds:
            if arm == "ce" or ("ce", s) not in runs:
                continue
            hyp = nmt.read_lines(runs[(arm, s)][1] / f"{split}.hyp.en")
            base = nmt.read_lines(runs[("ce", s)][1] / f"{split}.hyp.en")
            p = metrics.paired_bootstrap(base, hyp, refs)
            pvals.append(f"s{s}: {p['bleu_p']:.3f} / {p['chrf_p']:.3f} / {p['bertscore_p']:.3f}")
        speed = statistics.mean([runs[(arm, s)][0]["seconds_per_update"] for s in seeds])
        ratio = f"{speed:.2f} ({speed / base_speed:.1f}×)" if base_speed else f"{speed:.2f}"
        lines.append(
            f"| {arm} | {','.join(map(str, seeds))} | {cols['bleu']} | {cols['chrf']} | {cols['bertscore_f']} "
            f"| {cols['length_ratio']} | {'; '.join(pvals) or '—'} | {ratio} |"
        )
    return "\n".join(lines)


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="stage", required=True)
    p1 = sub.add_parser("stage1", help="tokenizer + generator from scratch (cross-entropy)")
    p1.add_argument("--config")
    p1.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p1.add_argument("--out")
    p1.add_argument("--fresh", action="store_true", help="discard a run in --out made with other settings")
    p2 = sub.add_parser("stage2", help="fine-tune one arm from the stage-1 model (ce, bertscore, mrt)")
    p2.add_argument("--config")
    p2.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p2.add_argument("--arm", choices=nmt.ARMS)
    p2.add_argument("--seed", type=int)
    p2.add_argument("--weight", type=float, help="lambda of the semantic term (overrides the config)")
    p2.add_argument("--out")
    p3 = sub.add_parser("stage3", help="decode with beam search vs MBR reranking (BERTScore, chrF)")
    p3.add_argument("--config")
    p3.add_argument("--set", action="append", metavar="KEY=VALUE", help="override one config option (repeatable)")
    p3.add_argument("--model")
    p3.add_argument("--name")
    p3.add_argument("--out")
    p4 = sub.add_parser("report", help="stage-2 table: mean ± std over seeds, paired bootstrap vs the ce arm")
    p4.add_argument("--stage2", default="runs/multi30k/stage2")
    p4.add_argument("--split", default="test_2016_flickr")
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    threads = os.environ.get("THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    if args.stage == "stage1":
        cfg = load_config(Stage1Config, args.config, {"out": args.out}, args.set)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        print(json.dumps(stage1(cfg, args.fresh), indent=1))
    elif args.stage == "stage2":
        overrides = {"out": args.out, "arm": args.arm, "seed": args.seed, "weight": args.weight}
        cfg = load_config(Stage2Config, args.config, overrides, args.set)
        print(json.dumps(stage2(cfg), indent=1))
    elif args.stage == "stage3":
        cfg = load_config(
            Stage3Config, args.config, {"model": args.model, "name": args.name, "out": args.out}, args.set
        )
        print(json.dumps(stage3(cfg), indent=1))
    elif args.stage == "evaluate":
        print(json.dumps(evaluate(args.model, args.data, args.split, args.beams, args.precision, args.limit), indent=1))
    elif args.stage == "report":
        print(report(args.stage2, args.split))
    elif args.stage == "sweep-report":
        print(sweep_report(args.sweep, args.stage2, args.split, args.seed))


if __name__ == "__main__":
    main()
