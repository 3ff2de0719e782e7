"""Re-rank built MBR data with a mix of utilities: the stored ranking blended with a second utility's.

:func:`build_mbr_data` ranks each source's candidates by one utility. A ranking by MBR-BERTScore alone picks
candidates that word references differently (it costs BLEU when a generator is trained towards them);
:func:`remix_mbr_data` reads a built folder (``store_lists``: every candidate and its expected utility),
computes a second utility's exact MBR expectation over the same candidates and pseudo-references (the
samples; the beam output is a hypothesis only, as when the folder was built), and ranks by

    mixed_i = (1 - weight) · z(primary)_i + weight · z(second)_i,

``z`` standardising each source's expected utilities over its candidates (mean 0, standard deviation 1; a
source whose candidates all score the same gets 0), so that ``weight`` is each ranking's share whatever the
utilities' scales (BERTScore F spreads over hundredths, chrF over tens). The rows are paired again
(:func:`rerank.training_data.pair_rows`) and the reference log-probabilities of new chosen or rejected
texts computed by the generating model (stored ones are reused for texts that did not change).

The output folder has the input's layout (``read_mbr_data`` and the training code read it unchanged):
the same shards (resumable, a stop loses at most one), rows in corpus order with ``expected`` = the mixed
scores, ``expected_primary``/``expected_second`` = the two parts, ``utility`` = the mix's signature, and a
manifest that records the input folder's manifest, where that folder is (``from_folder``: the samples' cost is
counted from there by :func:`rerank.training_data.build_seconds`) and the mix.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from bertscore_loss.outputs import append_line, write_text

from .mbr import mbr
from .registry import UtilityLike, get_utility
from .training_data import (
    PAIRINGS,
    MBRDataResult,
    _claim_folder,
    _log_probs,
    _manifest_digest,
    _target_ids,
    check_builder,
    codec_from,
    pair_rows,
)

__all__ = ["MixConfig", "mixed_scores", "remix_mbr_data"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MixConfig:
    """Settings of :func:`remix_mbr_data`: ``utility``, the second utility (a registered name);
    ``weight`` in [0, 1], its share of the standardised mix; ``pairing``: as in
    :class:`rerank.MBRDataConfig` (None: the input folder's); ``token_budget``: padded tokens a batch of
    the log-probability pass."""

    utility: str = "chrf"
    weight: float = 0.5
    pairing: str | None = None
    token_budget: int = 16384

    def __post_init__(self) -> None:
        if not isinstance(self.utility, str) or not self.utility:
            raise ValueError(f"MixConfig.utility must be a registered utility name, got {self.utility!r}")
        w = self.weight
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not (0.0 <= float(w) <= 1.0):
            raise ValueError(f"MixConfig.weight must lie in [0, 1], got {w!r}")
        if self.pairing is not None and self.pairing not in PAIRINGS:
            raise ValueError(f"MixConfig.pairing must be None or one of {PAIRINGS}, got {self.pairing!r}")
        if isinstance(self.token_budget, bool) or not isinstance(self.token_budget, int) or self.token_budget < 1:
            raise ValueError(f"MixConfig.token_budget must be a positive int, got {self.token_budget!r}")


def _standardised(values: torch.Tensor) -> torch.Tensor:
    """``[n]`` → ``[n]`` with mean 0 and (population) standard deviation 1; all zeros when constant."""
    centred = values - values.mean()
    std = centred.pow(2).mean().sqrt()
    return centred / std if float(std) > 1e-12 else torch.zeros_like(values)


def mixed_scores(primary: list[float], second: list[float], weight: float) -> list[float]:
    """``(1 - weight) · z(primary) + weight · z(second)`` over one source's candidates (float64)."""
    if len(primary) != len(second):
        raise ValueError(f"got {len(primary)} primary but {len(second)} second expected utilities")
    a = torch.tensor(primary, dtype=torch.float64)
    b = torch.tensor(second, dtype=torch.float64)
    return ((1.0 - weight) * _standardised(a) + weight * _standardised(b)).tolist()


def _mix_manifest(source: dict, config: MixConfig, pairing: str, util: Any, folder: Path) -> dict:
    out = {k: v for k, v in source.items() if k != "utility"}
    w = float(config.weight)
    out["utility"] = f"mix:z|{1.0 - w:g}*[{source['utility']}]+{w:g}*[{util.signature()}]"
    out["mix"] = {**asdict(config), "pairing": pairing, "second": util.signature()}
    out["from_manifest_sha256"] = _manifest_digest(source)
    out["from_folder"] = str(folder.resolve())  # where the samples are (their cost: rerank.training_data.build_seconds)
    return out


def _remix_shard(
    model: Any, codec: Any, rows: list[dict], util: Any, weight: float, pairing: str, signature: str, budget: int
) -> tuple[list[dict], dict[str, float]]:
    t0 = time.perf_counter()
    for r in rows:
        if "candidates" not in r or "expected" not in r:
            raise ValueError(f"row {r.get('index')} has no candidate list: build the input with store_lists=True")
    beams = [r["beam"] is not None and len(r["candidates"]) == r["n"] + 1 for r in rows]
    weights = [[0.0] * r["n"] + ([-math.inf] if b else []) for r, b in zip(rows, beams)]
    results = mbr([r["candidates"] for r in rows], utility=util, method="exact", log_weights=weights, progress=False)
    t1 = time.perf_counter()
    out: list[dict] = []
    need: list[tuple[int, str, str]] = []  # (row, field, text) whose log-probability is new
    for i, (r, res, b) in enumerate(zip(rows, results, beams)):
        texts = r["candidates"]
        second = [float(v) for v in res.expected.tolist()]
        mixed = mixed_scores([float(v) for v in r["expected"]], second, weight)
        best, worse = pair_rows(texts, mixed, len(texts) - 1 if b else None, pairing)
        row = dict(r)
        row.update(
            chosen=texts[best],
            target=texts[best],
            rejected=None if worse is None else texts[worse],
            chosen_score=mixed[best],
            rejected_score=None if worse is None else mixed[worse],
            beam_score=mixed[-1] if b else None,
            pairing=pairing,
            utility=signature,
            expected=mixed,
            expected_primary=r["expected"],
            expected_second=second,
        )
        if "chosen_logp" in r:
            known = {r["chosen"]: r.get("chosen_logp")}
            if r.get("rejected") is not None:
                known[r["rejected"]] = r.get("rejected_logp")
            for field, text in (("chosen_logp", row["chosen"]), ("rejected_logp", row["rejected"])):
                if text is None:
                    row[field] = None
                elif known.get(text) is not None:
                    row[field] = known[text]
                else:
                    need.append((i, field, text))
        out.append(row)
    t2 = time.perf_counter()
    if need:
        values = _log_probs(
            model,
            [list(codec.encode(out[i]["prompt"])) for i, _, _ in need],
            [_target_ids(codec, text) for _, _, text in need],
            budget,
        )
        for (i, field, _), v in zip(need, values):
            out[i][field] = v
    return out, {"mbr": t1 - t0, "log_probs": time.perf_counter() - t2}


@torch.no_grad()
def remix_mbr_data(
    model: Any,
    tokenizer: Any,
    in_dir: str | Path,
    out_dir: str | Path,
    config: MixConfig | None = None,
    *,
    utility: UtilityLike | None = None,
    missing: str = "error",
    progress: bool | None = None,
) -> MBRDataResult:
    """Re-rank the folder ``in_dir`` (built by :func:`rerank.build_mbr_data` with ``store_lists``) by the
    standardised mix of its utility and ``config.utility`` into ``out_dir``; see the module docstring.

    ``model``/``tokenizer``: the generator the folder was built with (its log-probabilities of the new
    chosen and rejected texts; eval mode is used, the mode restored after; another model is refused by
    :func:`rerank.training_data.check_builder`); ``utility``: a utility object for the second utility
    (default: ``config.utility``). Shards already in ``out_dir`` are kept (resuming
    with other settings or another input is refused). ``missing``: what a shard absent from ``in_dir`` does,
    ``"error"`` (default) or ``"skip"`` (re-rank the shards built so far, e.g. while the build goes on; a
    later call re-ranks the ones added since). Returns the shard files and the seconds spent.
    """
    if missing not in ("error", "skip"):
        raise ValueError(f"missing={missing!r}: expected 'error' or 'skip'")
    config = config or MixConfig()
    src = Path(in_dir)
    mpath_in = src / "manifest.json"
    if not mpath_in.exists():
        raise FileNotFoundError(f"{mpath_in} is missing: {src} is not a folder built by build_mbr_data")
    source = json.loads(mpath_in.read_text())
    if not source.get("config", {}).get("store_lists", False):
        raise ValueError(f"{src} was built without store_lists: there are no candidate lists to re-rank")
    pairing = config.pairing or source["config"]["pairing"]
    util = get_utility(utility if utility is not None else config.utility)
    manifest = _mix_manifest(source, config, pairing, util, src)
    out = Path(out_dir)
    if out.resolve() == src.resolve():
        raise ValueError("out_dir must differ from in_dir: the input folder is kept as it is")
    check_builder(model, tokenizer, src, token_budget=config.token_budget)
    out.mkdir(parents=True, exist_ok=True)
    _claim_folder(out, manifest, "re-ranked")
    shards = math.ceil(source["sources"] / source["config"]["shard_size"])
    codec = codec_from(tokenizer, model)
    was_training = model.training
    model.eval()
    seconds: dict[str, float] = {}
    built = reused = 0
    disable = (not progress) if progress is not None else None
    try:
        for k in tqdm(range(shards), desc="re-rank", unit="shard", disable=disable):
            name = out / f"shard-{k:05d}.jsonl"
            path_in = src / f"shard-{k:05d}.jsonl"
            if name.exists():
                reused += 1
                continue
            if not path_in.exists():
                if missing == "skip":
                    logger.info("shard %d/%d is not built in %s yet: skipped", k + 1, shards, src)
                    continue
                raise FileNotFoundError(f"{path_in} is missing: build {src} completely first (or missing='skip')")
            rows = [json.loads(line) for line in path_in.read_text(encoding="utf-8").splitlines() if line]
            new, spent = _remix_shard(
                model, codec, rows, util, float(config.weight), pairing, manifest["utility"], config.token_budget
            )
            append_line(out / "timing.jsonl", json.dumps({"shard": k, "sources": len(new), "seconds": spent}))
            write_text(name, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in new), allow_docs=True)
            for key, dt in spent.items():
                seconds[key] = seconds.get(key, 0.0) + dt
            built += 1
            logger.info("re-ranked shard %d/%d: %d sources -> %s", k + 1, shards, len(new), name)
    finally:
        model.train(was_training)
    files = [p for p in (out / f"shard-{k:05d}.jsonl" for k in range(shards)) if p.exists()]
    return MBRDataResult(files, built, reused, seconds, 0)
