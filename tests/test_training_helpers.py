"""The helpers the training examples share, each in its library home: ``MBRTrainingConfig.from_yaml`` (every
training YAML under configs/ read by it), ``rerank.generate.beam_translate``,
``rerank.training_data.load_model_and_tokenizer`` and ``rerank.trainer.MBRDataset.from_references``."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainingArguments

from rerank.generate import beam_translate
from rerank.trainer import MBRDataset, MBRTrainingConfig
from rerank.training_data import codec_from, load_model_and_tokenizer

from .conftest import bundled_path, tiny_bart, tiny_causal_lm

ROOT = Path(__file__).resolve().parents[1]
MARIAN = ROOT / "models" / "multi30k-de-en"
CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if p.name != "lightning_validation.yaml")
SOURCES = [
    "Ein Hund läuft durch den Schnee.",
    "Zwei Männer spielen Fußball auf einer grünen Wiese.",
    "Eine Frau liest ein Buch.",
]
BASE = {f.name for f in dataclasses.fields(TrainingArguments)}
OWN = [f.name for f in dataclasses.fields(MBRTrainingConfig) if f.name not in BASE]  # the loss and the pairs


@pytest.fixture(scope="module")
def marian():
    return load_model_and_tokenizer(MARIAN)


def _plain(value):
    return value.value if hasattr(value, "value") else value


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_training_config_is_read_by_from_yaml(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    config = MBRTrainingConfig.from_yaml(path, output_dir=str(tmp_path))
    assert isinstance(config, MBRTrainingConfig) and config.output_dir == str(tmp_path)
    for key, value in raw.items():
        if key != "report_to":
            assert _plain(getattr(config, key)) in (value, [value]), key
    assert config.report_to in ([], ["none"], "none")
    assert config.dpo_weight + config.distill_weight + config.mrt_weight > 0


def test_from_yaml_round_trip_with_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("beta: 0.3\nloss_type: ipo\nmrt_samples: 4\nlearning_rate: 2.0e-5\nmax_steps: 7\n")
    config = MBRTrainingConfig.from_yaml(path, output_dir=str(tmp_path / "out"), max_steps=3, distill_weight=0.5)
    assert (config.beta, config.loss_type, config.mrt_samples, config.learning_rate) == (0.3, "ipo", 4, 2e-5)
    assert (config.max_steps, config.distill_weight) == (3, 0.5)  # the overrides win over the file
    # the config's own fields written back to YAML read as the same config
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump({name: getattr(config, name) for name in OWN} | {"max_steps": 3}))
    back = MBRTrainingConfig.from_yaml(again, output_dir=str(tmp_path / "out"))
    assert {name: getattr(back, name) for name in OWN} == {name: getattr(config, name) for name in OWN}
    assert back.max_steps == 3 and len(OWN) >= 15
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing set\n")
    assert MBRTrainingConfig.from_yaml(empty, output_dir=str(tmp_path)).beta == 0.1  # the defaults


@pytest.mark.parametrize(
    ("text", "overrides", "message"),
    [
        ("- beta\n- 0.1\n", {}, "bad.yaml: expected a mapping of MBRTrainingConfig fields, got a list"),
        ("0.5\n", {}, "bad.yaml: expected a mapping of MBRTrainingConfig fields, got a float"),
        ("beta: 0.1\nbetta: 0.2\nx: 1\n", {}, "bad.yaml: unknown MBRTrainingConfig field(s): betta, x"),
        ("beta: 0.1\n", {"mrt_sample": 4}, "bad.yaml: unknown MBRTrainingConfig field(s): mrt_sample"),
        ("dpo_weight: 0\n", {}, "nothing to train"),  # the config's own checks still apply
        ("mrt_samples: 0\n", {}, "mrt_samples must be a positive int"),
    ],
)
def test_from_yaml_errors_name_the_file_and_the_problem(tmp_path, text, overrides, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        MBRTrainingConfig.from_yaml(path, output_dir=str(tmp_path), **overrides)
    assert message in str(err.value)


def test_the_loader_reads_the_marian_folder_with_its_sentencepiece_model(marian):
    model, tokenizer = marian
    assert type(model).__name__ == "MarianMTModel" and type(tokenizer).__name__ == "SentencePieceProcessor"
    codec = codec_from(tokenizer, model)
    ids = codec.encode(SOURCES[0])
    assert ids[-1] == model.config.eos_token_id and codec.decode(ids) == SOURCES[0]


def test_the_loader_reads_hf_tokenizers_and_causal_lms(tmp_path):
    from transformers import AutoTokenizer

    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(bundled_path()) / name, tmp_path / name)
    tiny_bart(vocab_size=30522).save_pretrained(tmp_path / "seq2seq")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    tiny_causal_lm(tokenizer).save_pretrained(tmp_path / "causal")
    (tmp_path / "seq2seq" / "spm.model").write_bytes(b"")  # tokenizer files present: the HF tokenizer wins
    for kind, want in (("seq2seq", "BartForConditionalGeneration"), ("causal", "GPT2LMHeadModel")):
        tokenizer.save_pretrained(tmp_path / kind)
        model, loaded = load_model_and_tokenizer(tmp_path / kind)
        assert type(model).__name__ == want
        assert loaded("a cat")["input_ids"] == tokenizer("a cat")["input_ids"]
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model_and_tokenizer(tmp_path / "missing")


def test_beam_translate_equals_a_direct_generate_decode(marian):
    model, sp = marian
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    ids = [sp.encode(s) + [eos] for s in SOURCES]
    width = max(map(len, ids))
    src = torch.tensor([r + [pad] * (width - len(r)) for r in ids])
    model.eval()
    with torch.no_grad():
        gen = model.generate(input_ids=src, attention_mask=src.ne(pad), num_beams=5, max_new_tokens=2 * width + 10)
    special = {pad, eos, model.config.decoder_start_token_id}
    direct = [sp.decode([t for t in row[1:].tolist() if t not in special]) for row in gen]
    model.train()
    got = beam_translate(model, sp, SOURCES)
    assert model.training  # its mode restored
    assert got == direct and all(got) and got[0].startswith("A dog")
    assert beam_translate(model, sp, SOURCES, batch_size=2) == direct  # batches of 2 and 1 alike
    assert beam_translate(model, sp, []) == []


def test_beam_translate_refuses_a_causal_lm_and_bad_sizes(marian):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bundled_path())
    with pytest.raises(ValueError, match="encoder-decoder"):
        beam_translate(tiny_causal_lm(tokenizer), tokenizer, ["a"])
    with pytest.raises(ValueError, match="num_beams and batch_size"):
        beam_translate(marian[0], marian[1], SOURCES, num_beams=0)


def test_a_dataset_of_references_needs_no_mbr_data(marian):
    model, sp = marian
    refs = ["A dog runs through the snow.", "Two men play soccer.", "A woman reads a book."]
    data = MBRDataset.from_references(SOURCES, refs, sp, model)
    codec = codec_from(sp, model)
    assert len(data) == 3 and [e.index for e in data.examples] == [0, 1, 2]
    for example, source, ref in zip(data.examples, SOURCES, refs):
        assert example.prompt == source and list(example.prompt_ids) == codec.encode(source)
        assert example.target == example.reference == ref and example.pairs == ()
        assert example.target_ids == example.reference_ids == tuple(codec.encode(ref))
    with pytest.raises(ValueError, match="3 sources but 2 references"):
        MBRDataset.from_references(SOURCES, refs[:2], sp, model)
