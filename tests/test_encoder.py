"""Encoder loading, layer truncation, frozen discipline, presets, tokenisation parity."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import AutoModel

from bertscore_loss import BERTScoreWarning, ModelNotFoundError
from bertscore_loss.encoder import FrozenEncoder
from bertscore_loss.presets import BUNDLED_LAYER, default_layer

from .conftest import LANG_PAIRS, bundled_path, needs_data, real_pairs, stsb, wmt16


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_roberta_dir", "tiny_distilbert_dir"])
@pytest.mark.parametrize("layer", [0, 1, 3])
def test_truncated_output_equals_full_models_hidden_state(request, fixture, layer):
    path = request.getfixturevalue(fixture)
    enc = FrozenEncoder(path, layer=layer, device="cpu")
    full = AutoModel.from_pretrained(path).eval()
    batch = enc.tokenizer(["a small test sentence", "another one"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ref = full(**batch, output_hidden_states=True).hidden_states[layer]
        out = enc(batch["input_ids"], batch["attention_mask"])
    m = batch["attention_mask"].bool()
    assert torch.allclose(out[m], ref[m], atol=1e-5)
    stack = getattr(enc.model, "encoder", None) or enc.model.transformer
    assert len(stack.layer) == layer  # layers above L are removed from the module


def test_frozen_and_eval_locked(tiny_bert_dir):
    enc = FrozenEncoder(tiny_bert_dir, layer=2, device="cpu")
    assert all(not p.requires_grad for p in enc.parameters())
    parent = torch.nn.Sequential(torch.nn.Linear(2, 2), enc)
    parent.train()
    assert not enc.training and not enc.model.training
    assert all(not m.training for m in enc.model.modules())
    ids = enc.tokenizer(["dropout would change this"], return_tensors="pt")
    a, b = enc(ids["input_ids"], ids["attention_mask"]), enc(ids["input_ids"], ids["attention_mask"])
    assert torch.equal(a, b)


def test_layer_out_of_range_names_valid_range(tiny_bert_dir):
    with pytest.raises(ValueError, match=r"0\.\.3"):
        FrozenEncoder(tiny_bert_dir, layer=4, device="cpu")
    with pytest.raises(ValueError, match=r"0\.\.3"):
        FrozenEncoder(tiny_bert_dir, layer=-1, device="cpu")


def test_unknown_model_without_layer_uses_last_and_warns(tiny_bert_dir):
    with pytest.warns(BERTScoreWarning, match="last layer"):
        enc = FrozenEncoder(tiny_bert_dir, device="cpu")
    assert enc.layer == 3


def test_unknown_model_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match="not found locally.*local folder"):
        FrozenEncoder("no-such-org/no-such-model-xyz", layer=1, device="cpu")


def test_presets():
    assert default_layer("roberta-large") == 17
    assert default_layer("bert-base-uncased") == 9
    assert default_layer("distilbert-base-uncased") == 5
    assert default_layer("FacebookAI/roberta-large") == 17
    assert default_layer("/models/roberta-large/") == 17  # a local folder named like a known model
    assert default_layer("my-own-model") is None


def test_bundled_default_layer_and_dtype(monkeypatch):
    monkeypatch.setattr("bertscore_loss.encoder.cpu_has_native_bf16", lambda: True)
    enc = FrozenEncoder(device="cpu", dtype="bfloat16")
    assert enc.layer == BUNDLED_LAYER and enc.num_layers == 6
    assert enc.hidden_size == 384 and enc.model.dtype == torch.bfloat16
    assert enc.special_ids == {101, 102}
    with pytest.raises(ValueError, match="dtype"):
        FrozenEncoder(device="cpu", dtype="float8")


@pytest.mark.parametrize("fixture", ["tiny_bert_dir", "tiny_roberta_dir"])
def test_token_ids_equal_bert_score_sent_encode(request, fixture):
    from bert_score.utils import get_tokenizer, sent_encode

    path = request.getfixturevalue(fixture)
    cands, refs = real_pairs(per_lp=20, n_sts=50)
    texts = cands + refs + ["  padded with spaces  ", "x " * 600]  # the last one is truncated
    enc = FrozenEncoder(path, layer=1, device="cpu")
    ours = enc.tokenize(texts)
    tok = get_tokenizer(path)
    theirs = [sent_encode(tok, t) for t in texts]
    assert ours.ids == theirs
    assert ours.truncated == 1


def test_bf16_on_a_cpu_without_native_bf16_warns(tiny_bert_dir, monkeypatch):
    monkeypatch.setattr("bertscore_loss.encoder.cpu_has_native_bf16", lambda: False)
    with pytest.warns(BERTScoreWarning, match="without native bf16"):
        FrozenEncoder(tiny_bert_dir, layer=1, device="cpu", dtype="bfloat16")
    monkeypatch.setattr("bertscore_loss.encoder.cpu_has_native_bf16", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FrozenEncoder(tiny_bert_dir, layer=1, device="cpu", dtype="bfloat16")
        FrozenEncoder(tiny_bert_dir, layer=1, device="cpu", dtype="float32")


@pytest.mark.slow
@needs_data
def test_fast_tokenizer_ids_equal_the_python_wordpiece_on_shared_data():
    """The Rust (fast) tokenizer that batches our tokenisation gives the ids of the pure-Python WordPiece
    (transformers' ``BertTokenizerLegacy``) on every WMT16 sentence and STS-B dev sentence."""
    from transformers.models.bert import BertTokenizerLegacy

    texts = []
    for lp in LANG_PAIRS:
        mt, ref, _ = wmt16(lp)
        texts += mt + ref
    a, b, _ = stsb("dev")
    texts += a + b
    assert len(texts) > 9000
    enc = FrozenEncoder(layer=0, device="cpu")
    slow = BertTokenizerLegacy.from_pretrained(bundled_path())
    want = [slow.encode(t.strip(), add_special_tokens=True) for t in texts]
    want = [w if len(w) <= 512 else [*w[:511], w[-1]] for w in want]
    assert enc.tokenize(texts).ids == want
