"""Seconds per update of the Multi30k stage-2 arms, as ratios to the cross-entropy control, in one run.

Every arm fine-tunes its own copy of the generator (``--model``: an HF folder with ``spm.model``) with the
settings of ``studies/multi30k/configs/stage2.yaml`` (overridable with ``--set key=value``) on the same batches
(the stage-2 batches of seed 0, ``--batch-tokens`` rows × longest side). The arms are **alternated**:
update ``i`` of every arm runs before update ``i + 1`` of any, so a change in the machine's load hits all
arms alike; the first ``--skip`` updates of each arm (first batches, allocator, encoder load) are not
counted. An update is what Lightning runs: ``training_step`` under the run's precision (``bf16-mixed``
autocast where the CPU has native bf16), backward, gradient clipping, Adam step.

    OMP_NUM_THREADS=1 python studies/multi30k/benchmarks/translation_arms.py --threads 1 --model models/multi30k-de-en
    OMP_NUM_THREADS=1 python studies/multi30k/benchmarks/translation_arms.py --threads 1 --profile  # where time goes

``--arms`` names the arms to time, each ``<arm>`` or ``<label>=<arm>:key=value,key=value`` (Stage2Config
options for that arm only; ``module.<attr>=value`` sets an attribute of its ``FineTuner``), e.g. ``--arms ce
bertscore mrt mrt-bf16=mrt:scorer_dtype=bfloat16 mrt-full=mrt:module.shared_encoder=false``.
``--profile`` adds a table per arm of where an update's time goes (sections timed by wrapping the
library's and the generator's functions; backward split where the gradient reaches the CE logits).
``--warm-references`` encodes the timed batches' references into the ``bertscore`` loss's reference cache
before timing (a later epoch: every reference seen once; ``mrt`` keeps no reference cache). Prints the
CPU label, seconds per update and ratios to ``ce``; writes a JSON (``--json``, default
``runs/translation-arms-speed.json``).

Two clocks: wall seconds, and the process's CPU seconds (``time.process_time``; with one thread the same as
wall seconds on an idle machine, and much less disturbed by other jobs on a shared one). The ratios of
both are printed; the profile sections use CPU seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "studies" / "multi30k"))
import nmt  # noqa: E402
import recipe  # noqa: E402

from bertscore_loss.outputs import add_overwrite_argument, check_outputs_or_exit, write_text  # noqa: E402

DEFAULT_ARMS = ["ce", "bertscore", "mrt"]
ARM_DEFAULTS: dict[str, dict[str, Any]] = {"mrt": {"weight": 10.0}}  # the weights of the stage-2 tables


# ----------------------------------------------------------------------------------------------- profile
class Sections:
    """Exclusive wall time per named section (nested sections are subtracted from their parent)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.stack: list[list[Any]] = []  # [name, child seconds, opaque]
        self.enabled = False

    @contextlib.contextmanager
    def section(self, name: str, opaque: bool = False) -> Iterator[None]:
        if not self.enabled or (self.stack and self.stack[-1][2]):
            yield
            return
        t0 = time.process_time()
        self.stack.append([name, 0.0, opaque])
        try:
            yield
        finally:
            _, child, _ = self.stack.pop()
            dt = time.process_time() - t0
            self.seconds[name] += dt - child
            if self.stack:
                self.stack[-1][1] += dt

    def add(self, name: str, seconds: float) -> None:
        if self.enabled:
            self.seconds[name] += seconds

    def wrap(self, owner: Any, attr: str, name: str | Callable[[], str], opaque: bool = False) -> None:
        """Time every call of ``owner.attr`` (a class or an instance) as section ``name``."""
        if not hasattr(owner, attr):
            return
        original = getattr(owner, attr)
        is_class = isinstance(owner, type)

        @functools.wraps(original)  # keeps the signature (generate() inspects the model's forward)
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.section(name() if callable(name) else name, opaque):
                return original(*args, **kwargs)

        if is_class and isinstance(owner.__dict__.get(attr), staticmethod):
            setattr(owner, attr, staticmethod(timed))
        else:
            setattr(owner, attr, timed)


SECTIONS = Sections()
CE_PASS = "generator forward (CE pass, with the CE loss)"


def instrument() -> None:
    """Wrap the functions an update goes through (library and generator), once per process."""
    import bertscore_loss._pipeline as pipeline_mod
    import bertscore_loss.bridge as bridge_mod
    import bertscore_loss.loss as loss_mod
    import bertscore_loss.risk as risk_mod
    import bertscore_loss.token_distributions as td_mod
    from bertscore_loss.encoder import FrozenEncoder

    s = SECTIONS
    grad = lambda what: lambda: f"{what} ({'with grad' if torch.is_grad_enabled() else 'no grad'})"  # noqa: E731
    s.wrap(FrozenEncoder, "forward", grad("scorer encoder forward"))
    s.wrap(FrozenEncoder, "_encode", "scorer tokenisation (text → ids)")
    s.wrap(FrozenEncoder, "tokenize", "scorer tokenisation (text → ids)")
    s.wrap(pipeline_mod.ScoringPlan, "score_pairs", "scorer matching (exact)")
    s.wrap(pipeline_mod.ScoringPlan, "embed", "scorer embeddings: bookkeeping, cache")
    s.wrap(risk_mod.MinimumRiskLoss, "utilities", "risk: scoring call bookkeeping")
    s.wrap(risk_mod.MinimumRiskLoss, "forward", "risk: expected risk")
    s.wrap(risk_mod, "label_log_probs", "samples' log-prob pass: output layer + log-softmax (fused)")
    for mod in (loss_mod, td_mod):
        s.wrap(mod, "to_probs", "soft inputs: softmax / Gumbel-softmax")
        s.wrap(mod, "expected_rows", "soft inputs: expected embeddings (top-k)")
        s.wrap(mod, "top_k_probs", "soft inputs: top-k of the (Gumbel-perturbed) logits")
        s.wrap(mod, "expected_top_k", "soft inputs: expected embeddings (top-k)")
    s.wrap(td_mod, "gumbel_noise", "soft inputs: Gumbel noise")
    s.wrap(loss_mod, "bertscore", "loss: cosine + matching (soft / straight-through)")
    s.wrap(loss_mod.BERTScoreLoss, "frame", "loss: framing")
    s.wrap(loss_mod.BERTScoreLoss, "reference_inputs", "loss: references (cache or encode)")
    s.wrap(loss_mod.BERTScoreLoss, "forward", "loss: checks, bookkeeping")
    s.wrap(bridge_mod.VocabBridge, "retokenize", "bridge: retokenise (ids → text → pieces)")
    import bertscore_loss

    for mod in (risk_mod, bertscore_loss):
        s.wrap(mod, "sequence_log_probs", "log-prob pass: log-softmax + gather")
    s.wrap(nmt, "ce_pass", CE_PASS, opaque=True)
    s.wrap(nmt, "candidate_log_probs", "samples' log-prob pass: decoder")
    s.wrap(nmt, "sample_log_probs", "samples' log-prob pass: which samples need one")
    s.wrap(nmt, "sample_sequences", "sampling (decoder loop, no grad)", opaque=True)
    for name in dir(risk_mod):  # helpers the fast paths may add to the risk module
        if name.startswith("shared_") and callable(getattr(risk_mod, name)):
            s.wrap(risk_mod, name, f"risk helper {name}")


def instrument_module(module: nmt.FineTuner) -> None:
    """Per-module wraps: the generator's calls, labelled by where they come from."""
    s = SECTIONS

    s.wrap(module.model, "forward", "generator forward (samples' log-prob pass)")
    s.wrap(module.model, "generate", "sampling (generate, no grad)", opaque=True)
    if not hasattr(nmt, "ce_pass"):  # before the fast paths: the CE pass was Translator.ce
        s.wrap(module, "ce", CE_PASS, opaque=True)
    s.wrap(module, "sample", "sampling: bookkeeping + detokenise")
    s.wrap(module.sp, "decode", "sampling: detokenise (spm)")


# -------------------------------------------------------------------------------------------------- arms
@dataclasses.dataclass
class Arm:
    label: str
    cfg: recipe.Stage2Config
    attrs: dict[str, Any]
    module: nmt.FineTuner
    optimizer: torch.optim.Optimizer
    seconds: list[float] = dataclasses.field(default_factory=list)  # wall
    cpu: list[float] = dataclasses.field(default_factory=list)  # process CPU time
    profile: dict[str, float] = dataclasses.field(default_factory=dict)


def parse_arm(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``ce`` or ``label=arm:key=value,key=value`` → (label, arm, overrides: Stage2Config options and
    ``module.<attr>`` FineTuner attributes)."""
    import yaml

    label, sep, rest = spec.partition("=")
    if not sep:
        return spec, spec, {}
    arm, _, options = rest.partition(":")
    extra: dict[str, Any] = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SystemExit(f"--arms {spec!r}: expected key=value after ':'")
        extra[key] = yaml.safe_load(value)
    return label, arm, extra


def build_arm(
    label: str, cfg: recipe.Stage2Config, attrs: dict[str, Any], model_dir: Path, train: nmt.PairData, val: nmt.PairData
) -> Arm:
    """One arm's generator copy, losses (as ``recipe.stage2`` builds them), module and optimizer."""
    model, sp = recipe.load_model(model_dir)
    if hasattr(recipe, "fine_tuner"):  # the recipe's own construction (the teacher arms and later)
        module = recipe.fine_tuner(cfg, model, sp, model_dir, train, val, recipe.precision_of(cfg.precision))
    else:  # a recipe of an earlier commit
        semantic, risk = _losses(cfg, model_dir, sp)
        module = nmt.FineTuner(
            model,
            sp,
            cfg.train,
            val,
            recipe.precision_of(cfg.precision),
            cfg.arm,
            semantic,
            risk,
            cfg.weight,
            cfg.samples,
        )
        module.train_targets = train.tgt_text
    if not hasattr(recipe, "fine_tuner") and hasattr(module, "log_prob_dropout"):
        module.log_prob_dropout = getattr(cfg, "mrt_dropout", True)  # as recipe.stage2 sets it
        module.semantic_rows, module.row_seed = getattr(cfg, "semantic_rows", None), cfg.seed
    for key, value in attrs.items():
        if not hasattr(module, key):
            raise SystemExit(f"--arms {label}: FineTuner has no attribute {key!r}")
        setattr(module, key, value)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=cfg.train.lr, betas=tuple(cfg.train.betas))
    return Arm(label, cfg, attrs, module, opt)


def _losses(cfg: recipe.Stage2Config, init: Path, sp: Any) -> tuple[Any, Any]:
    """The arm's semantic loss or risk, built as ``recipe.stage2`` of an earlier commit (without ``fine_tuner``)."""
    from bertscore_loss import BERTScoreLoss, BERTScorer, MinimumRiskLoss, VocabBridge

    if cfg.arm not in ("bertscore", "mrt"):
        return None, None
    dtype = getattr(cfg, "scorer_dtype", "float32")
    scorer = BERTScorer(dtype=nmt.scorer_dtype(dtype) if hasattr(nmt, "scorer_dtype") else dtype)
    if cfg.arm == "bertscore":
        bridge = VocabBridge(init / "spm.model", scorer.encoder, cfg.bridge_mode, vocab_size=sp.get_piece_size())
        loss = BERTScoreLoss(
            scorer=scorer,
            bridge=bridge,
            max_mode=cfg.max_mode,
            temperature=cfg.temperature,
            top_k=cfg.top_k,
            gumbel=cfg.gumbel,
        )
        return loss, None
    return None, MinimumRiskLoss(scorer=scorer, alpha=cfg.alpha)


def update(arm: Arm, batch: dict, index: int, precision: str) -> tuple[float, float]:
    """One optimizer update of ``arm`` on ``batch`` (as Lightning runs it); returns its wall and CPU seconds."""
    module, s = arm.module, SECTIONS
    marks: list[float] = []
    owner, attr = (nmt, "ce_pass") if hasattr(nmt, "ce_pass") else (module, "ce")
    ce = getattr(owner, attr)

    def ce_with_mark(*args: Any) -> Any:
        out = ce(*args)
        if out[1].requires_grad:  # the CE logits: the backward is split where their gradient is complete
            out[1].register_hook(lambda g: marks.append(time.process_time()) or g)
        return out

    before = owner.__dict__.get(attr)
    setattr(owner, attr, ce_with_mark)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
    w0, t0 = time.perf_counter(), time.process_time()
    with autocast:
        loss = module.training_step(batch, index)
    t1 = time.process_time()
    loss.backward()
    t2 = time.process_time()
    with s.section("optimizer (clip + Adam)"):
        torch.nn.utils.clip_grad_norm_(module.model.parameters(), module.cfg.clip)
        arm.optimizer.step()
        arm.optimizer.zero_grad(set_to_none=True)
    t3, w3 = time.process_time(), time.perf_counter()
    if before is None:
        delattr(owner, attr)
    else:
        setattr(owner, attr, before)
    if s.enabled:
        mark = marks[0] if marks else t1
        s.add("backward: the arm's extra graph (until the CE logits' gradient)", mark - t1)
        s.add("backward: generator (from the CE logits on)", t2 - mark)
    return w3 - w0, t3 - t0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "studies" / "multi30k" / "configs" / "stage2.yaml"))
    parser.add_argument("--model", help="generator folder (HF + spm.model); default: the config's init")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="Stage2Config option for every arm")
    parser.add_argument("--arms", nargs="+", default=DEFAULT_ARMS, help="arms to time (see above); ce comes first")
    parser.add_argument("--batch-tokens", type=int, default=2048, help="rows × longest side per update")
    parser.add_argument("--updates", type=int, default=12, help="updates per arm, --skip of them not timed")
    parser.add_argument("--skip", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="also print where the time of an update goes")
    parser.add_argument("--warm-references", action="store_true", help="references encoded before timing")
    parser.add_argument("--json", default=None, help="JSON file (default: runs/translation-arms-speed.json)")
    add_overwrite_argument(parser)
    args = parser.parse_args(argv)
    rules = {"overwrite": args.overwrite, "allow_docs": args.json is not None, "flag": "--json"}
    args.json = args.json or str(ROOT / "runs" / "translation-arms-speed.json")
    check_outputs_or_exit(parser, [args.json], **rules)  # a committed result (docs/...) needs --overwrite
    if args.skip >= args.updates:
        raise SystemExit(f"--skip {args.skip} leaves no update of --updates {args.updates} to time")
    out = Path(args.json)
    torch.set_num_threads(args.threads)
    base = recipe.load_config(recipe.Stage2Config, args.config, {"batch_tokens": args.batch_tokens}, args.set)
    model_dir = Path(args.model) if args.model else recipe.resolve(base.init)
    if not (model_dir / "spm.model").is_file():
        raise SystemExit(f"no generator at {model_dir} (an HF folder with spm.model): pass --model FOLDER")
    specs = [parse_arm(a) for a in args.arms]
    if not specs or specs[0][1] != "ce" or specs[0][2]:
        specs.insert(0, ("ce", "ce", {}))
    data = recipe.resolve(base.data)
    _, sp = recipe.load_model(model_dir)
    train = nmt.PairData(sp, *nmt.read_pairs(data, "train"), base.max_len)
    val = nmt.PairData(sp, *nmt.read_pairs(data, "val", 8), base.max_len)
    batches = []
    for batch in train.loader(base.batch_tokens, True, 1000 + base.seed):
        batches.append(batch)
        if len(batches) == args.updates:
            break
    precision = recipe.precision_of(base.precision)
    if args.profile:
        instrument()
    arms = []
    for label, arm, extra in specs:
        attrs = {k.removeprefix("module."): v for k, v in extra.items() if k.startswith("module.")}
        options = {k: v for k, v in extra.items() if not k.startswith("module.")}
        cfg = dataclasses.replace(base, arm=arm, **{**ARM_DEFAULTS.get(arm, {}), **options})
        arms.append(build_arm(label, cfg, attrs, model_dir, train, val))
        if args.profile:
            instrument_module(arms[-1].module)
    if args.warm_references:  # a later epoch: every reference of the timed batches encoded once already
        autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.startswith("bf16"))
        for a in arms:
            loss = a.module.semantic
            if loss is not None and hasattr(loss, "reference_cache"):  # the loss's own cache (autocast-keyed)
                for b in batches:
                    with torch.no_grad(), autocast:
                        loss.reference_inputs([train.tgt_text[i] for i in b["index"].tolist()])
            elif loss is not None:  # before the loss had its own cache: the encoder's
                with torch.no_grad():
                    loss.scorer.embed([train.tgt_text[i] for b in batches for i in b["index"].tolist()])
    torch.manual_seed(0)
    for i, batch in enumerate(batches):
        for a in arms:
            timed = i >= args.skip
            SECTIONS.enabled = args.profile and timed
            SECTIONS.seconds = defaultdict(float)
            wall, cpu = update(a, batch, i, precision)
            if timed:
                a.seconds.append(wall)
                a.cpu.append(cpu)
                for name, v in SECTIONS.seconds.items():
                    a.profile[name] = a.profile.get(name, 0.0) + v
        print(
            f"update {i}: " + ", ".join(f"{a.label} {a.cpu[-1] if a.cpu else float('nan'):.2f}s cpu" for a in arms),
            file=sys.stderr,
            flush=True,
        )
    ce, ce_cpu = statistics.mean(arms[0].seconds), statistics.mean(arms[0].cpu)
    pairs = sum(len(b["index"]) for b in batches[args.skip :]) / (args.updates - args.skip)
    base_settings = json.loads(json.dumps(dataclasses.asdict(base)))
    result = {
        "cpu": nmt.cpu_label(),
        "threads": args.threads,
        "precision": precision,
        "model": str(model_dir.relative_to(ROOT) if model_dir.is_relative_to(ROOT) else model_dir),  # no machine path
        "batch_tokens": base.batch_tokens,
        "mean_pairs_per_update": pairs,
        "updates_timed": args.updates - args.skip,
        "warm_references": args.warm_references,
        "arms": {
            a.label: {
                "arm": a.cfg.arm,
                "options": {
                    k: v
                    for k, v in json.loads(json.dumps(dataclasses.asdict(a.cfg))).items()
                    if v != base_settings.get(k)
                },
                "settings": recipe.cost_settings(a.cfg.arm, dataclasses.asdict(a.cfg)),
                "module": a.attrs,
                "cpu_seconds_per_update": statistics.mean(a.cpu),
                "cpu_ratio_to_ce": statistics.mean(a.cpu) / ce_cpu,
                "cpu_ratio_per_update": [x / c for x, c in zip(a.cpu, arms[0].cpu)],
                "cpu_seconds": a.cpu,
                "seconds_per_update": statistics.mean(a.seconds),
                "ratio_to_ce": statistics.mean(a.seconds) / ce,
                "ratio_per_update": [x / c for x, c in zip(a.seconds, arms[0].seconds)],
                "seconds": a.seconds,
                "profile_cpu_seconds": {k: v / len(a.cpu) for k, v in sorted(a.profile.items(), key=lambda kv: -kv[1])},
            }
            for a in arms
        },
    }
    write_text(out, json.dumps(result, indent=1) + "\n", **rules)
    print(
        f"{result['cpu']}, {args.threads} thread(s), {precision}, batch_tokens {base.batch_tokens} "
        f"(~{pairs:.0f} pairs), {result['updates_timed']} updates timed per arm (alternated)"
    )
    print("| arm | CPU s / update | × ce (CPU) | per update (min–max) | wall s / update | × ce (wall) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, r in result["arms"].items():
        lo, hi = min(r["cpu_ratio_per_update"]), max(r["cpu_ratio_per_update"])
        print(
            f"| {label} | {r['cpu_seconds_per_update']:.2f} | {r['cpu_ratio_to_ce']:.2f}× | {lo:.2f}–{hi:.2f} "
            f"| {r['seconds_per_update']:.2f} | {r['ratio_to_ce']:.2f}× |"
        )
    if args.profile:
        for label, r in result["arms"].items():
            total = r["cpu_seconds_per_update"]
            print(
                f"\n**{label}** ({total:.2f} CPU s / update)\n\n| section | s / update | share |\n| --- | --- | --- |"
            )
            rest = total
            for name, v in r["profile_cpu_seconds"].items():
                if v >= 0.0005:
                    print(f"| {name} | {v:.3f} | {100 * v / total:.0f} % |")
                rest -= v
            print(f"| other (training_step glue, autocast casts) | {rest:.3f} | {100 * rest / total:.0f} % |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
