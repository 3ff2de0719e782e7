"""MBR-ranked training data (``rerank.build_mbr_data``): ranking, pairing, log-probabilities, resumption,
ranks equal to one process, clear errors, and TRL's ``DPOTrainer`` reading the files unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rerank import mbr
from rerank.training_data import MBRDataConfig, build_mbr_data, pair_rows, read_mbr_data

from .conftest import tiny_bart, tiny_causal_lm

PAD, START, EOS = 0, 1, 2
WORDS = ["a", "cat", "dog", "sat", "on", "the", "mat", "runs", "red", "big", "small", "house", "tree", "bird", "sings"]


class WordCodec:
    """Token ids <-> words: id k + 3 is WORDS[k]; sources end with EOS."""

    def encode(self, text: str) -> list[int]:
        return [WORDS.index(w) + 3 for w in text.split()] + [EOS]

    def decode(self, ids) -> str:
        return " ".join(WORDS[i - 3] for i in ids if i >= 3)


SOURCES = ["a cat sat", "the dog runs", "a big red house", "the bird sings", "small tree", "a mat"]


def tiny_bart_model():
    m = tiny_bart(len(WORDS) + 3, 24, seed=1)
    with torch.no_grad():
        m.lm_head.weight.mul_(4.0)
        m.final_logits_bias[0, EOS] = 2.0
    return m


def load_tiny():
    """The distributed test's loader: the same tiny model and codec in every process."""
    return tiny_bart_model(), WordCodec()


@pytest.fixture(scope="module")
def model():
    return tiny_bart_model()


def overlap(hyps: list[str], refs: list[str]) -> torch.Tensor:
    """Unigram F1 of word sets (a quick, exact utility)."""
    u = torch.zeros(len(hyps), len(refs), dtype=torch.float64)
    for i, h in enumerate(hyps):
        for j, r in enumerate(refs):
            a, b = set(h.split()), set(r.split())
            u[i, j] = 2 * len(a & b) / (len(a) + len(b)) if a or b else 1.0
    return u


CONFIG = MBRDataConfig(num_samples=6, beams=2, shard_size=4, seed=3, utility="chrf", precision="32")


def build(model, out, config=CONFIG, **kw):
    return build_mbr_data(model, WordCodec(), SOURCES, out, config, utility=kw.pop("utility", overlap), **kw)


def test_rows_are_mbr_ranked_in_input_order(model, tmp_path):
    result = build(model, tmp_path / "d")
    assert [p.name for p in result.files] == ["shard-00000.jsonl", "shard-00001.jsonl"]
    rows = read_mbr_data(tmp_path / "d")
    assert [r["index"] for r in rows] == list(range(len(SOURCES)))
    assert [r["prompt"] for r in rows] == SOURCES
    for r in rows:
        cands = r["candidates"]
        assert len(cands) == 7 and cands[-1] == r["beam"]  # 6 samples, then the beam output
        # expected utility by hand: samples leave their own draw out; the beam output is scored on all samples
        u = overlap(cands, cands[:6])
        want = [float((u[i].sum() - u[i, i]) / 5) for i in range(6)] + [float(u[6].mean())]
        assert r["expected"] == pytest.approx(want, abs=1e-12)
        best = max(range(7), key=lambda i: (want[i], -i))
        assert r["chosen"] == r["target"] == cands[best] and r["chosen_score"] == pytest.approx(want[best])
        if r["beam"] != r["chosen"]:
            assert r["rejected"] == r["beam"] and r["rejected_score"] == pytest.approx(want[6])
        elif r["rejected"] is not None:  # else the MBR-worst text that is not the chosen one
            worst = min((i for i in range(7) if cands[i] != r["chosen"]), key=lambda i: (want[i], -i))
            assert r["rejected"] == cands[worst]
        assert r["n"] == 6 and r["pairing"] == "beam-or-worst" and r["utility"] == "overlap"
    # the same ranking as rerank.mbr on the stored lists
    res = mbr([r["candidates"] for r in rows], utility=overlap, log_weights=[[0.0] * 6 + [-math.inf]] * len(rows))
    assert [x.best for x in res] == [r["chosen"] for r in rows]


def assert_teacher_forced_log_probs(model, rows: list[dict]) -> None:
    """Every row's ``chosen_logp``/``rejected_logp`` is ``model``'s teacher-forced sum over that side's ids."""
    codec = WordCodec()
    for r in rows:
        for side in ("chosen", "rejected"):
            if r[side] is None:
                assert r[f"{side}_logp"] is None
                continue
            src = torch.tensor([codec.encode(r["prompt"])])
            labels = torch.tensor([codec.encode(r[side])])  # the target's ids, EOS appended
            with torch.no_grad():
                logits = model(input_ids=src, labels=labels).logits
            want = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).sum()
            assert r[f"{side}_logp"] == pytest.approx(float(want), abs=1e-4)


def test_log_probs_are_the_models_teacher_forced_sums(model, tmp_path):
    build(model, tmp_path / "d")
    assert_teacher_forced_log_probs(model, read_mbr_data(tmp_path / "d"))


@pytest.mark.parametrize(
    ("pairing", "want"),
    [
        ("best-worst", (1, 2)),
        ("best-second", (1, 0)),
        ("best-beam", (1, None)),
        ("beam-or-worst", (1, 2)),
        ("best-2sigma", (1, 2)),  # mu 0.6, sigma 0.332: mu - 2 sigma = -0.063, nearest "c" (0.1)
    ],
)
def test_pairings(pairing, want):
    cands = ["b", "a", "c", "a"]  # index 3 (the beam) repeats the best text
    assert pair_rows(cands, [0.5, 0.9, 0.1, 0.9], 3, pairing) == want
    if pairing == "beam-or-worst":
        assert pair_rows(["b", "a", "c", "d"], [0.5, 0.9, 0.1, 0.2], 3, pairing) == (1, 3)  # beam differs
        assert pair_rows(["a", "a"], [0.5, 0.5], 1, pairing) == (0, None)  # nothing different to reject


def test_best_2sigma_rejects_the_candidate_nearest_mu_minus_two_sigma_not_the_worst():
    # 20 copies of the best text count in mu and sigma but are never rejected: mu = 18.95 / 23 = 0.8239,
    # sigma = sqrt(1.0383 / 23) = 0.2125, mu - 2 sigma = 0.399: "c" (0.45) is nearest, not the worst "d" (0.0)
    cands, expected = ["a"] * 20 + ["b", "c", "d"], [0.9] * 20 + [0.5, 0.45, 0.0]
    assert pair_rows(cands, expected, None, "best-2sigma") == (0, 21)
    assert pair_rows(cands, expected, None, "best-worst") == (0, 22)
    assert pair_rows(["a", "a"], [0.5, 0.5], None, "best-2sigma") == (0, None)  # nothing different to reject


def test_resume_rebuilds_only_missing_shards_and_refuses_other_settings(model, tmp_path):
    out = tmp_path / "d"
    build(model, out)
    first = (out / "shard-00001.jsonl").read_text()
    (out / "shard-00001.jsonl").unlink()
    again = build(model, out)
    assert (again.built, again.reused) == (1, 1)
    assert (out / "shard-00001.jsonl").read_text() == first  # seeded by its shard: the same samples
    timing = [json.loads(line) for line in (out / "timing.jsonl").read_text().splitlines()]
    assert [t["shard"] for t in timing] == [0, 1, 1] and set(timing[0]["seconds"]) >= {"sampling", "mbr", "beam"}
    other = MBRDataConfig(num_samples=5, beams=2, shard_size=4, seed=3, precision="32")
    with pytest.raises(ValueError, match=r"other settings \(config differ\)"):
        build(model, out, other)
    (out / "shard-00000.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="not complete"):
        read_mbr_data(out)
    assert [r["index"] for r in read_mbr_data(out, complete=False)] == [4, 5]


def test_auto_precision_is_recorded_as_resolved_and_another_kind_of_machine_is_refused(
    model, tmp_path, monkeypatch, caplog
):
    """bf16 and float32 decoding sample different texts: a folder started where "auto" meant float32 must not
    take shards from a machine where it means bf16 (and the other way round)."""
    import dataclasses

    import rerank.training_data as td

    auto = dataclasses.replace(CONFIG, shard_size=4, precision="auto")
    monkeypatch.setattr(td, "native_bf16", lambda device="cpu": False)  # a CPU without native bf16
    out = tmp_path / "d"
    build(model, out, auto, rank=0, world_size=2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["precision"] == "32"
    first = (out / "shard-00000.jsonl").read_text()
    build(model, tmp_path / "explicit", CONFIG, rank=0, world_size=2)  # "32" given: the same shard, same manifest
    assert (tmp_path / "explicit" / "shard-00000.jsonl").read_text() == first
    assert (tmp_path / "explicit" / "manifest.json").read_text() == (out / "manifest.json").read_text()
    monkeypatch.setattr(td, "native_bf16", lambda device="cpu": True)  # the same command on a bf16 machine
    with pytest.raises(
        ValueError,
        match=r"config differ\) \(its shards were decoded in precision '32', this "
        r"process would decode in 'bf16'.*set precision='32' to continue it as built\)",
    ):
        build(model, out, auto, rank=1, world_size=2)
    assert not (out / "shard-00001.jsonl").exists()
    build(model, out, dataclasses.replace(auto, precision="32"), rank=1, world_size=2)  # continued as built
    assert [r["index"] for r in read_mbr_data(out)] == list(range(len(SOURCES)))
    # a folder from before the precision was resolved records "auto": resumed, with a warning
    manifest["config"]["precision"] = "auto"
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "shard-00001.jsonl").unlink()
    with caplog.at_level("WARNING", logger="rerank.training_data"):
        build(model, out, auto, rank=1, world_size=2)
    assert "records precision 'auto'" in caplog.text and (out / "shard-00001.jsonl").exists()
    assert td.sampling_precision("auto") == "bf16" and td.sampling_precision("32") == "32"


def test_ranks_give_the_files_of_one_process(model, tmp_path):
    build(model, tmp_path / "one")
    assert build(model, tmp_path / "two", rank=1, world_size=2).files[0].name == "shard-00001.jsonl"
    build(model, tmp_path / "two", rank=0, world_size=2)
    for name in ("shard-00000.jsonl", "shard-00001.jsonl", "manifest.json"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()
    with pytest.raises(ValueError, match="rank must lie in"):
        build(model, tmp_path / "x", rank=2, world_size=2)


@pytest.mark.slow
def test_lightning_processes_give_the_files_of_one_process(model, tmp_path):
    from rerank.training_data import build_mbr_data_distributed

    build(model, tmp_path / "one")
    files = build_mbr_data_distributed(load_tiny, SOURCES, tmp_path / "ddp", CONFIG, utility=overlap, devices=2)
    assert [p.name for p in files] == ["shard-00000.jsonl", "shard-00001.jsonl"]
    for name in ("shard-00000.jsonl", "shard-00001.jsonl", "manifest.json"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "ddp" / name).read_text()


def test_long_sources_and_bad_settings_are_clear_errors(model, tmp_path):
    long = " ".join(["a"] * 30)
    with pytest.raises(ValueError, match=r"sources\[1\] has 31 tokens, over the model's 24 positions"):
        build_mbr_data(model, WordCodec(), ["a cat", long], tmp_path / "e", CONFIG, utility=overlap)
    cut = MBRDataConfig(num_samples=3, beams=1, shard_size=4, too_long="truncate", precision="32")
    result = build_mbr_data(model, WordCodec(), ["a cat", long], tmp_path / "t", cut, utility=overlap)
    assert result.truncated == 1 and len(read_mbr_data(tmp_path / "t")) == 2
    for field, value in (("num_samples", 0), ("epsilon", 1.0), ("pairing", "best"), ("shard_size", 0), ("beams", -1)):
        with pytest.raises(ValueError, match=f"MBRDataConfig.{field}"):
            MBRDataConfig(**{field: value})
    with pytest.raises(ValueError, match="sources is empty"):
        build_mbr_data(model, WordCodec(), [], tmp_path / "z", CONFIG)


@pytest.mark.slow
def test_trl_dpo_trainer_reads_the_files_unchanged(model, tmp_path, tiny_roberta_dir):
    """Two DPOTrainer steps on a tiny causal LM over the built JSONL (datasets.load_dataset("json"))."""
    datasets = pytest.importorskip("datasets")
    trl = pytest.importorskip("trl")
    from transformers import AutoTokenizer

    build(model, tmp_path / "d")
    files = sorted(str(p) for p in (tmp_path / "d").glob("shard-*.jsonl"))
    data = datasets.load_dataset("json", data_files=files, split="train")
    data = data.filter(lambda r: r["rejected"] is not None).select_columns(["prompt", "chosen", "rejected"])
    assert len(data) >= 2
    tok = AutoTokenizer.from_pretrained(tiny_roberta_dir)  # a tokenizer with EOS, as TRL needs
    lm = tiny_causal_lm(tok, 64)
    args = trl.DPOConfig(
        output_dir=str(tmp_path / "dpo"),
        per_device_train_batch_size=2,
        max_steps=2,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        max_length=48,
        precompute_ref_log_probs=True,  # no reference model to load
        bf16=False,
    )
    trainer = trl.DPOTrainer(model=lm, args=args, train_dataset=data, processing_class=tok)
    before = [p.detach().clone() for p in lm.parameters()]
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, lm.parameters()))
