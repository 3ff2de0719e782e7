"""MBR-ranked training data: distillation targets and preference pairs from a generator's own samples.

For every source of a corpus, :func:`build_mbr_data` decodes the beam output and ``num_samples`` epsilon
samples (:func:`rerank.sample_ids`) of an encoder-decoder model, ranks beam output + samples by exact MBR
with any registered utility (the samples are the pseudo-references; each sample leaves its own draw out, the
beam output, drawn independently of them, is scored against all of them), and writes one JSON line per
source:

* ``prompt``, ``chosen``, ``rejected``: the source text, the MBR-best candidate and, by ``pairing``, the
  candidate it is preferred to (TRL's preference format: ``datasets.load_dataset("json", ...)`` reads it,
  and TRL's ``DPOTrainer`` trains a causal LM on it unchanged);
* ``target``: the MBR-best candidate again, the distillation target; ``beam``: the beam output;
* ``chosen_score``, ``rejected_score``, ``beam_score``: expected utilities; ``chosen_logp``,
  ``rejected_logp``: the generating model's sequence log-probabilities of chosen and rejected (sum over the
  label ids of the text as the codec tokenises a target, EOS included; float32, eval mode), i.e. the
  reference model's of a preference loss, so that no second model is held in memory while training;
* ``index`` (the source's position in the corpus), ``n``, ``pairing``, ``utility`` (the utility's signature);
  with ``store_lists``, ``candidates`` (samples then the beam output) and ``expected`` for re-pairing.

Output is sharded (``shard-00000.jsonl`` …, ``shard_size`` sources each, in input order), each shard written
atomically when complete and seeded by its own index, so a stopped run resumes losing at most one shard, and
``rank``/``world_size`` (one process per rank, shards ``rank, rank + world_size, …``) give the same files as
one process. ``manifest.json`` records the settings (``precision`` as ``"auto"`` resolved on the machine that
started the folder, since bf16 and float32 decoding sample different texts); resuming with other settings, or
on a machine where ``"auto"`` resolves otherwise, is refused; ``timing.jsonl``
logs the seconds of beam search, sampling, MBR and log-probabilities of each shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from tqdm.auto import tqdm

from bertscore_loss.machine import budget_groups
from bertscore_loss.outputs import append_line, write_text
from bertscore_loss.risk import target_log_probs

from .mbr import mbr
from .registry import UtilityLike, get_utility
from .sampling import SamplingConfig, default_new_tokens, model_positions, native_bf16, sample_ids

__all__ = [
    "Codec",
    "MBRDataConfig",
    "MBRDataResult",
    "build_mbr_data",
    "build_mbr_data_distributed",
    "build_seconds",
    "check_builder",
    "codec_from",
    "load_model_and_tokenizer",
    "pair_rows",
    "read_mbr_data",
    "sampling_precision",
]

logger = logging.getLogger(__name__)

Pairing = Literal["beam-or-worst", "best-worst", "best-beam", "best-second", "best-2sigma"]
PAIRINGS: tuple[str, ...] = ("beam-or-worst", "best-worst", "best-beam", "best-second", "best-2sigma")
_FORMAT = 1


class Codec(Protocol):
    """Text ↔ token ids of a generator: ``encode`` gives the source ids the model reads (EOS included where
    the model expects it), ``decode`` the text of generated ids (special tokens dropped). An optional
    ``encode_target`` gives a target text's label ids (EOS included), as training will tokenise it (default:
    ``encode``)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def _target_ids(codec: Codec, text: str) -> list[int]:
    fn = getattr(codec, "encode_target", None)
    return list(fn(text) if callable(fn) else codec.encode(text))


@dataclass(frozen=True)
class _HFCodec:
    tokenizer: Any

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def encode_target(self, text: str) -> list[int]:
        return list(self.tokenizer(text_target=text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True)).strip()


@dataclass(frozen=True)
class _SentencePieceCodec:
    processor: Any
    eos: int
    special: frozenset[int]

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.processor.encode(text)] + [self.eos]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.processor.decode([int(t) for t in ids if int(t) not in self.special]))

    def encode_target(self, text: str) -> list[int]:
        return self.encode(text)


def codec_from(tokenizer: Any, model: Any = None) -> Codec:
    """A :class:`Codec` from a Hugging Face tokenizer, a ``sentencepiece.SentencePieceProcessor`` (EOS of
    ``model`` appended to sources; the model's pad, EOS and decoder-start ids dropped when decoding), or an
    object that already has ``encode``/``decode``."""
    if hasattr(tokenizer, "batch_decode") and callable(tokenizer):
        return _HFCodec(tokenizer)
    if type(tokenizer).__name__ == "SentencePieceProcessor":
        if model is None:
            raise ValueError("a sentencepiece processor needs the model (its EOS, pad and decoder-start ids)")
        cfg = model.config
        ids = {getattr(cfg, k, None) for k in ("eos_token_id", "pad_token_id", "decoder_start_token_id")}
        return _SentencePieceCodec(tokenizer, int(cfg.eos_token_id), frozenset(int(i) for i in ids if i is not None))
    if callable(getattr(tokenizer, "encode", None)) and callable(getattr(tokenizer, "decode", None)):
        return tokenizer
    raise TypeError(
        f"cannot encode and decode with a {type(tokenizer).__name__}: give an HF tokenizer, a "
        "sentencepiece processor or an object with encode(text) and decode(ids)"
    )


_TOKENIZER_FILES: tuple[str, ...] = ("tokenizer_config.json", "tokenizer.json")


def load_model_and_tokenizer(folder: str | Path, **model_kwargs: Any) -> tuple[Any, Any]:
    """The generator of a Hugging Face model folder and its tokenizer, as :func:`codec_from` takes it.

    The model: ``AutoModelForSeq2SeqLM`` when its config is an encoder-decoder, else ``AutoModelForCausalLM``
    (``model_kwargs`` passed on). The tokenizer: ``AutoTokenizer`` when the folder has tokenizer files
    (``tokenizer_config.json`` or ``tokenizer.json``), else the folder's ``spm.model`` as a
    ``sentencepiece.SentencePieceProcessor`` (models trained with a bare sentencepiece model).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    path = Path(folder)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no config.json: not a Hugging Face model folder")
    seq2seq = bool(getattr(AutoConfig.from_pretrained(path), "is_encoder_decoder", False))
    model = (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_pretrained(path, **model_kwargs)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES) and (path / "spm.model").is_file():
        import sentencepiece as spm

        return model, spm.SentencePieceProcessor(model_file=str(path / "spm.model"))
    return model, AutoTokenizer.from_pretrained(path)


@dataclass(frozen=True)
class MBRDataConfig:
    """Settings of :func:`build_mbr_data`.

    ``num_samples`` epsilon samples (``epsilon``; Freitag et al. 2023) per source and a beam of ``beams``
    (0 = no beam output: ranks the samples only); ``utility``: a registered name (``"bertscore"``,
    ``"chrf"``, ``"bleu"``); ``pairing``: ``"beam-or-worst"`` (rejected = the beam output where it differs
    from the MBR-best, else the MBR-worst), ``"best-worst"``, ``"best-beam"`` (rows where beam = best have
    no pair: ``rejected`` is None), ``"best-second"`` or ``"best-2sigma"`` (rejected = the candidate whose
    expected utility is nearest μ − 2σ of the source's candidates; Xiao et al. 2025); ``shard_size`` sources per
    file; ``seed`` of shard ``k`` is ``seed + k``; ``too_long``: sources over the model's positions are
    ``"error"`` (one line naming the source) or ``"truncate"`` (cut, EOS kept, counted in the manifest);
    ``log_probs``: store the model's sequence log-probabilities of chosen and rejected; ``store_lists``: store
    every candidate and its expected utility; ``precision``, ``token_budget``: of beam search and sampling
    (:class:`rerank.SamplingConfig`; ``"auto"``: bf16 where the device computes it natively, see
    :func:`sampling_precision`).
    """

    num_samples: int = 64
    epsilon: float = 0.02
    beams: int = 5
    utility: str = "bertscore"
    pairing: Pairing = "beam-or-worst"
    shard_size: int = 500
    seed: int = 0
    too_long: Literal["error", "truncate"] = "error"
    log_probs: bool = True
    store_lists: bool = True
    precision: Literal["auto", "32", "bf16"] = "auto"
    token_budget: int = 65536
    beam_budget: int = 8192

    def __post_init__(self) -> None:
        for name in ("num_samples", "shard_size", "token_budget", "beam_budget"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"MBRDataConfig.{name} must be a positive int, got {v!r}")
        if isinstance(self.beams, bool) or not isinstance(self.beams, int) or self.beams < 0:
            raise ValueError(f"MBRDataConfig.beams must be an int >= 0, got {self.beams!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"MBRDataConfig.seed must be an int, got {self.seed!r}")
        if not (isinstance(self.epsilon, (int, float)) and 0.0 <= self.epsilon < 1.0):
            raise ValueError(f"MBRDataConfig.epsilon must lie in [0, 1), got {self.epsilon!r}")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"MBRDataConfig.pairing must be one of {PAIRINGS}, got {self.pairing!r}")
        if self.too_long not in ("error", "truncate"):
            raise ValueError(f"MBRDataConfig.too_long must be 'error' or 'truncate', got {self.too_long!r}")
        if self.precision not in ("auto", "32", "bf16"):
            raise ValueError(f"MBRDataConfig.precision must be 'auto', '32' or 'bf16', got {self.precision!r}")
        if self.num_samples < 2 and self.beams == 0:
            raise ValueError("MBRDataConfig: ranking needs at least 2 candidates (num_samples >= 2 or beams >= 1)")


@dataclass
class MBRDataResult:
    """What :func:`build_mbr_data` did: the shard files (in corpus order), how many were built now and
    how many were already there, seconds of sampling / beam search / MBR / log-probabilities spent now."""

    files: list[Path]
    built: int
    reused: int
    seconds: dict[str, float]
    truncated: int


def pair_rows(
    candidates: Sequence[str], expected: Sequence[float], beam: int | None, pairing: str
) -> tuple[int, int | None]:
    """Indices ``(chosen, rejected)`` of one source's candidates from their expected utilities (best first;
    ties: lowest index), by ``pairing`` (see :class:`MBRDataConfig`); ``beam``: the beam output's index.
    ``rejected`` is never a candidate with the chosen text, and None when there is none."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    order = sorted(range(len(candidates)), key=lambda i: (-float(expected[i]), i))
    best = order[0]
    others = [i for i in order if candidates[i] != candidates[best]]
    beam_ok = beam if beam is not None and candidates[beam] != candidates[best] else None
    if pairing == "best-worst":
        return best, (others[-1] if others else None)
    if pairing == "best-second":
        return best, (others[0] if others else None)
    if pairing == "best-beam":
        return best, beam_ok
    if pairing == "best-2sigma":
        values = [float(e) for e in expected]
        low = statistics.fmean(values) - 2 * statistics.pstdev(values)  # ties: the higher-ranked
        return best, (min(others, key=lambda i: abs(values[i] - low)) if others else None)
    return best, (beam_ok if beam_ok is not None else (others[-1] if others else None))


def _digest(texts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def _source_ids(
    codec: Codec, sources: Sequence[str], limit: int | None, too_long: str, offset: int
) -> tuple[list[list[int]], int]:
    """Token ids of each source (checked against the model's ``limit`` positions) and how many were cut."""
    out, cut = [], 0
    for i, text in enumerate(sources):
        if not isinstance(text, str):
            raise TypeError(f"sources[{offset + i}] is a {type(text).__name__}, not a str")
        ids = list(codec.encode(text))
        if not ids:
            raise ValueError(f"sources[{offset + i}] encodes to no token")
        if limit is not None and len(ids) > limit:
            if too_long == "error":
                raise ValueError(
                    f"sources[{offset + i}] has {len(ids)} tokens, over the model's {limit} positions: "
                    "shorten it or pass too_long='truncate'"
                )
            ids = ids[: limit - 1] + ids[-1:]
            cut += 1
        out.append(ids)
    return out, cut


def _pad(rows: Sequence[Sequence[int]], value: int, device: torch.device) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


@torch.no_grad()
def _beam_ids(model: Any, ids: list[list[int]], beams: int, budget: int, bf16: bool) -> list[list[int]]:
    """Beam-search top-1 ids (generated tokens only, without special tokens) per source, in input order."""
    device = next(model.parameters()).device
    pad, eos = int(model.config.pad_token_id), int(model.config.eos_token_id)
    special = {pad, eos}
    out: list[list[int]] = [[] for _ in ids]
    for batch in budget_groups([len(s) for s in ids], budget, per_row=beams):
        src = _pad([ids[i] for i in batch], pad, device)
        mask = torch.zeros_like(src, dtype=torch.bool)
        for r, i in enumerate(batch):
            mask[r, : len(ids[i])] = True
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            gen = model.generate(
                input_ids=src,
                attention_mask=mask,
                num_beams=beams,
                do_sample=False,
                max_new_tokens=default_new_tokens(src.shape[1], model_positions(model)),
            )
        for r, i in enumerate(batch):
            row = [int(t) for t in gen[r, 1:].tolist()]  # after the decoder start token
            row = row[: row.index(eos)] if eos in row else row
            out[i] = [t for t in row if t not in special]
    return out


def _log_probs(
    model: Any, sources: list[list[int]], targets: list[list[int] | None], budget: int
) -> list[float | None]:
    """Sum of log-probabilities (float32, in the model's mode: eval here) of each target's label ids (EOS
    included) given its source, by the trainer's routine (:func:`bertscore_loss.risk.target_log_probs`)."""
    rows = [i for i, t in enumerate(targets) if t is not None]
    out: list[float | None] = [None] * len(targets)
    if rows:
        got = target_log_probs(
            model, [sources[i] for i in rows], [targets[i] or [] for i in rows], token_budget=budget, grad=False
        )
        for i, v in zip(rows, got.tolist()):
            out[i] = float(v)
    return out


def _shard_rows(
    model: Any,
    codec: Codec,
    sources: list[str],
    offset: int,
    config: MBRDataConfig,
    shard: int,
    utility: Any,
    seconds: dict[str, float],
    bf16: bool,
) -> tuple[list[dict], int]:
    ids, cut = _source_ids(codec, sources, model_positions(model), config.too_long, offset)
    t0 = time.perf_counter()
    beam_ids = _beam_ids(model, ids, config.beams, config.beam_budget, bf16) if config.beams else None
    t1 = time.perf_counter()
    samples = sample_ids(
        model,
        ids,
        SamplingConfig(
            num_samples=config.num_samples,
            epsilon=config.epsilon,
            precision="bf16" if bf16 else "32",
            token_budget=config.token_budget,
            seed=config.seed + shard,
        ),
    )
    t2 = time.perf_counter()
    cand_ids = [
        list(seqs) + ([beam_ids[i]] if beam_ids is not None else []) for i, seqs in enumerate(samples.sequences)
    ]
    cands = [[codec.decode(c) for c in cs] for cs in cand_ids]
    n = config.num_samples
    weights = [[0.0] * n + ([-math.inf] if beam_ids is not None else []) for _ in cands]
    results = mbr(cands, utility=utility, method="exact", log_weights=weights, progress=False)
    t3 = time.perf_counter()
    rows: list[dict] = []
    chosen_ids: list[list[int] | None] = []
    rejected_ids: list[list[int] | None] = []
    for i, (texts, res) in enumerate(zip(cands, results)):
        expected = [float(v) for v in res.expected.tolist()]
        beam = len(texts) - 1 if beam_ids is not None else None
        best, worse = pair_rows(texts, expected, beam, config.pairing)
        chosen_ids.append(_target_ids(codec, texts[best]))  # as training tokenises the text
        rejected_ids.append(None if worse is None else _target_ids(codec, texts[worse]))
        row: dict[str, Any] = {
            "index": offset + i,
            "prompt": sources[i],
            "chosen": texts[best],
            "rejected": None if worse is None else texts[worse],
            "target": texts[best],
            "beam": None if beam is None else texts[beam],
            "chosen_score": expected[best],
            "rejected_score": None if worse is None else expected[worse],
            "beam_score": None if beam is None else expected[beam],
            "n": n,
            "pairing": config.pairing,
            "utility": utility.signature(),
        }
        if config.store_lists:
            row["candidates"] = texts
            row["expected"] = expected
        rows.append(row)
    if config.log_probs:
        both = _log_probs(model, ids + ids, chosen_ids + rejected_ids, config.token_budget // 4)
        for k, row in enumerate(rows):
            row["chosen_logp"], row["rejected_logp"] = both[k], both[len(rows) + k]
    t4 = time.perf_counter()
    for key, dt in (("beam", t1 - t0), ("sampling", t2 - t1), ("mbr", t3 - t2), ("log_probs", t4 - t3)):
        seconds[key] = seconds.get(key, 0.0) + dt
    return rows, cut


def sampling_precision(precision: str, device: torch.device | str = "cpu") -> Literal["32", "bf16"]:
    """What ``precision`` (``"auto"``, ``"32"`` or ``"bf16"``) decodes in on ``device``: ``"bf16"`` or ``"32"``;
    ``"auto"`` is bf16 only where the device computes it natively (:func:`rerank.sampling.native_bf16`), so
    two kinds of machine sample different texts from the same ``"auto"`` settings."""
    return "bf16" if precision == "bf16" or (precision == "auto" and native_bf16(device)) else "32"


def _manifest(model: Any, sources: Sequence[str], config: MBRDataConfig, utility: Any) -> dict:
    name = getattr(model.config, "_name_or_path", "") or type(model).__name__
    return {
        "format": _FORMAT,
        "sources": len(sources),
        "sources_sha256": _digest(sources),
        "config": asdict(config),
        "model": str(name),
        "utility": utility.signature(),
    }


# Manifest keys that say where an input was, not what it held (a moved folder resumes): never compared.
_LOCATION_KEYS = ("from_folder",)


def _claim_folder(out: Path, manifest: dict, verb: str, *, write: bool = True) -> None:
    """Refuse ``out`` when its ``manifest.json`` records other settings; else write ``manifest`` there (``write``)."""
    mpath = out / "manifest.json"
    if mpath.exists():
        old = json.loads(mpath.read_text())
        diff = sorted(k for k in manifest if k not in _LOCATION_KEYS and old.get(k) != manifest[k])
        if diff:
            hint = ""
            was, now = dict(old.get("config") or {}), dict(manifest.get("config") or {})
            if was.pop("precision", None) != now.pop("precision", None) and was == now:
                hint = (
                    f" (its shards were decoded in precision {old['config']['precision']!r}, this process would "
                    f"decode in {manifest['config']['precision']!r}; 'auto' is bf16 only on a device with native "
                    f"bf16: set precision={old['config']['precision']!r} to continue it as built)"
                )
            raise ValueError(
                f"{out} holds data {verb} with other settings ({', '.join(diff)} differ){hint}: "
                "use another folder or remove it"
            )
    elif write:
        write_text(mpath, json.dumps(manifest, indent=1) + "\n", allow_docs=True)


def _recorded_precision(out: Path) -> str | None:
    """The precision that ``out/manifest.json`` records (None: no manifest yet)."""
    mpath = out / "manifest.json"
    return json.loads(mpath.read_text())["config"].get("precision") if mpath.exists() else None


def build_mbr_data(
    model: Any,
    tokenizer: Any,
    sources: Sequence[str],
    out_dir: str | Path,
    config: MBRDataConfig | None = None,
    *,
    utility: UtilityLike | None = None,
    rank: int = 0,
    world_size: int = 1,
    progress: bool | None = None,
    on_shard: Callable[[int, Path], None] | None = None,
) -> MBRDataResult:
    """Build (or resume) the MBR-ranked data of ``sources`` in ``out_dir``; see the module docstring.

    ``model``: a Hugging Face encoder-decoder (eval mode is used, the mode is restored after);
    ``tokenizer``: see :func:`codec_from`; ``utility``: a utility object or name (default:
    ``config.utility``). ``rank``/``world_size``: this process builds shards ``rank, rank + world_size, …``.
    ``progress``: a bar over shards (None: on a terminal). Returns the files of the shards that exist.
    """
    config = config or MBRDataConfig()
    if not getattr(model.config, "is_encoder_decoder", False):
        raise ValueError("build_mbr_data needs an encoder-decoder model (config.is_encoder_decoder)")
    if not (0 <= rank < world_size):
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank}, world_size={world_size}")
    sources = list(sources)
    if not sources:
        raise ValueError("sources is empty")
    codec = codec_from(tokenizer, model)
    util = get_utility(utility if utility is not None else config.utility)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    resolved = sampling_precision(config.precision, next(model.parameters()).device)
    bf16 = resolved == "bf16"
    # the manifest records what "auto" resolved to here, so that a machine of another kind resuming the folder is
    # refused instead of adding shards sampled in another precision; a folder from before this kept "auto"
    stored = replace(config, precision=resolved)
    if config.precision == "auto" and _recorded_precision(out) == "auto":
        logger.warning(
            "%s records precision 'auto' (made before the precision was resolved): this process decodes in %s; "
            "shards built on another kind of machine may have been decoded otherwise",
            out,
            resolved,
        )
        stored = config
    manifest = _manifest(model, sources, stored, util)
    _claim_folder(out, manifest, "built", write=rank == 0)
    shards = math.ceil(len(sources) / config.shard_size)
    names = [out / f"shard-{k:05d}.jsonl" for k in range(shards)]
    mine = [k for k in range(shards) if k % world_size == rank]
    todo = [k for k in mine if not names[k].exists()]
    seconds: dict[str, float] = {}
    truncated = 0
    was_training = model.training
    model.eval()
    disable = (not progress) if progress is not None else None
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc="MBR data", unit="shard", disable=disable)
    try:
        for k in todo:
            if names[k].exists():  # built meanwhile by another process
                bar.update(1)
                continue
            lo = k * config.shard_size
            spent: dict[str, float] = {}
            rows, cut = _shard_rows(
                model, codec, sources[lo : lo + config.shard_size], lo, config, k, util, spent, bf16
            )
            truncated += cut
            # the cost first, then the shard (atomic): a shard on disk always has its cost logged; a logged
            # shard that is not on disk (killed, disk full) is built again and its last build counts
            append_line(
                out / "timing.jsonl", json.dumps({"shard": k, "sources": len(rows), "truncated": cut, "seconds": spent})
            )
            write_text(names[k], "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), allow_docs=True)
            for key, dt in spent.items():
                seconds[key] = seconds.get(key, 0.0) + dt
            logger.info("shard %d/%d: %d sources -> %s", k + 1, shards, len(rows), names[k])
            if on_shard is not None:
                on_shard(k, names[k])
            bar.update(1)
    finally:
        bar.close()
        model.train(was_training)
    return MBRDataResult([p for p in names if p.exists()], len(todo), len(mine) - len(todo), seconds, truncated)


def read_mbr_data(out_dir: str | Path, *, complete: bool = True) -> list[dict]:
    """The rows of a built folder in corpus order; ``complete``: refuse a folder with missing shards."""
    out = Path(out_dir)
    manifest = json.loads((out / "manifest.json").read_text())
    shards = math.ceil(manifest["sources"] / manifest["config"]["shard_size"])
    rows: list[dict] = []
    for k in range(shards):
        path = out / f"shard-{k:05d}.jsonl"
        if not path.exists():
            if complete:
                raise FileNotFoundError(f"{path} is missing: the data in {out} is not complete (build again to resume)")
            continue
        rows.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line)
    return rows


def _shard_seconds(folder: Path) -> dict[str, float]:
    """Seconds by stage of the shards of ``folder`` that exist (``timing.jsonl``; a shard built twice counts its
    last build; a line cut by a killed writer is not counted)."""
    log = folder / "timing.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"{log} is missing: {folder} holds no record of what its shards cost")
    rows = []
    for line in log.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # blank, or the torn end of a line from a process killed mid-write
    seconds: dict[str, float] = {}
    built = {r["shard"]: r for r in rows if (folder / f"shard-{r['shard']:05d}.jsonl").is_file()}
    for row in built.values():
        for stage, value in row["seconds"].items():
            seconds[stage] = seconds.get(stage, 0.0) + float(value)
    return seconds


def build_seconds(folder: str | Path) -> dict[str, float]:
    """What the data in ``folder`` cost to build: seconds by stage summed over its shards (a shard built
    twice counts its last build; per process, so with one thread a process these are core-seconds).

    A folder of :func:`build_mbr_data` gives ``beam``, ``sampling``, ``mbr``, ``log_probs``. A folder
    re-ranked from another (:func:`rerank.mixed_ranking.remix_mbr_data`) holds no samples of its own: it gives
    the input folder's stages (followed through its manifest's ``from_folder``, checked against the input's
    manifest digest) plus its own as ``remix_mbr`` and ``remix_log_probs``, so that ``sum(...)`` is the cost
    of the data as a whole, not of the last step.
    """
    out = Path(folder)
    mpath = out / "manifest.json"
    if not mpath.is_file():
        raise FileNotFoundError(f"{mpath} is missing: {out} is not a folder of MBR data")
    manifest = json.loads(mpath.read_text())
    own = _shard_seconds(out)
    if "mix" not in manifest:
        return own
    src = manifest.get("from_folder")
    if not src:
        raise ValueError(
            f"{out} was re-ranked from another folder that its manifest does not name (made before re-ranked "
            'folders recorded it): add "from_folder": "<the folder it was re-ranked from>" to its manifest.json; '
            "the samples' cost is part of the data's"
        )
    source = Path(src)
    source_manifest = source / "manifest.json"
    if not source_manifest.is_file():
        raise FileNotFoundError(
            f"{out} was re-ranked from {source}, which is gone: the samples' cost is part of the data's "
            f'(set "from_folder" in {mpath} to where that folder is now)'
        )
    if _manifest_digest(json.loads(source_manifest.read_text())) != manifest.get("from_manifest_sha256"):
        raise ValueError(f"{source} holds other data than {out} was re-ranked from (its manifest differs)")
    seconds = build_seconds(source)  # a re-ranking of a re-ranked folder adds to its remix_* stages
    for stage, value in own.items():
        seconds[f"remix_{stage}"] = seconds.get(f"remix_{stage}", 0.0) + value
    return seconds


def _manifest_digest(manifest: dict) -> str:
    """16 hex digits of SHA-256 over ``manifest`` (keys sorted): how a re-ranked folder names its input's."""
    return hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()[:16]


def check_builder(model: Any, tokenizer: Any, folder: str | Path, rows: int = 4, *, token_budget: int = 16384) -> None:
    """Raise ``ValueError`` unless ``model`` is the generator that built ``folder``: its log-probabilities
    (float32, eval mode) of the chosen texts of the first ``rows`` pairs must equal the stored ones (within
    1e-3 + 1e-4·|value|: padding and batching only). DPO compares the policy with these stored reference
    values, and a re-ranking reuses them, so another model's values would mislead both silently. A folder
    without stored log-probabilities passes (nothing to compare)."""
    out = Path(folder)
    manifest = json.loads((out / "manifest.json").read_text())
    first = next(iter(sorted(out.glob("shard-*.jsonl"))), None)
    lines = first.read_text(encoding="utf-8").splitlines() if first is not None else []
    codec = codec_from(tokenizer, model)
    limit = getattr(model.config, "max_position_embeddings", None) or math.inf
    picked = [  # sources the builder may have cut (too_long="truncate") are not compared
        r
        for r in map(json.loads, filter(None, lines))
        if r.get("chosen_logp") is not None and len(codec.encode(r["prompt"])) <= limit
    ][:rows]
    if not picked:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            got = _log_probs(
                model,
                [list(codec.encode(r["prompt"])) for r in picked],
                [_target_ids(codec, r["chosen"]) for r in picked],
                token_budget,
            )
    finally:
        model.train(was_training)
    for r, value in zip(picked, got):
        want = float(r["chosen_logp"])
        if value is None or abs(value - want) > 1e-3 + 1e-4 * abs(want):
            shown = "none" if value is None else f"{value:.4f}"
            raise ValueError(
                f"{out} holds log-probabilities of another model (row {r['index']}: stored {want:.4f}, this model "
                f"{shown}): use the model that built it ({manifest.get('model')})"
            )


def _distributed_worker(
    fabric: Any,
    loader: Callable[[], tuple[Any, Any]],
    sources: list[str],
    out_dir: str,
    config: dict,
    utility: UtilityLike | None,
) -> None:
    model, tokenizer = loader()
    model.to(fabric.device)
    build_mbr_data(
        model,
        tokenizer,
        sources,
        out_dir,
        MBRDataConfig(**config),
        utility=utility,
        rank=fabric.global_rank,
        world_size=fabric.world_size,
        progress=False,
    )
    fabric.barrier()


def build_mbr_data_distributed(
    loader: Callable[[], tuple[Any, Any]],
    sources: Sequence[str],
    out_dir: str | Path,
    config: MBRDataConfig | None = None,
    *,
    utility: UtilityLike | None = None,
    devices: int = 2,
    num_nodes: int = 1,
    accelerator: str = "cpu",
    strategy: str = "auto",
) -> list[Path]:
    """:func:`build_mbr_data` on Lightning's distributed engine: ``devices`` processes (CPU) or GPUs per node
    on ``num_nodes`` nodes, each building its shards (``rank, rank + world_size, …``); the files equal one
    process's. ``loader()`` gives ``(model, tokenizer)`` in each process (a picklable, module-level function:
    processes are spawned, or launched by torchrun / SLURM with ``strategy="ddp"``). ``utility``: a
    registered name or a picklable utility. Returns the shard files (all ranks done).
    """
    from lightning_fabric import Fabric
    from lightning_fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    if devices < 1 or num_nodes < 1:
        raise ValueError(f"devices and num_nodes must be >= 1, got devices={devices}, num_nodes={num_nodes}")
    if strategy == "auto":
        launched = TorchElasticEnvironment.detect() or SLURMEnvironment.detect()
        strategy = "ddp" if launched else "ddp_spawn"
    if strategy not in ("ddp", "ddp_spawn"):
        raise ValueError(f"strategy must be 'auto', 'ddp' or 'ddp_spawn', got {strategy!r}")
    config = config or MBRDataConfig()
    sources = list(sources)
    out = Path(out_dir)
    if devices * num_nodes == 1:
        model, tokenizer = loader()
        return build_mbr_data(model, tokenizer, sources, out, config, utility=utility).files
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy=strategy)
    # the config as a dict: Lightning refuses frozen dataclasses among the arguments it moves to devices
    fabric.launch(
        partial(
            _distributed_worker,
            loader=loader,
            sources=sources,
            out_dir=str(out),
            config=asdict(config),
            utility=utility,
        )
    )
    shards = math.ceil(len(sources) / config.shard_size)
    return [p for p in (out / f"shard-{k:05d}.jsonl" for k in range(shards)) if p.exists()]
