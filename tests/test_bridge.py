"""The vocabulary bridge: token mapping by hand, and agreement with exact evaluation on real pairs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertscore_loss import BERTScorer
from bertscore_loss.bridge import VocabBridge
from bertscore_loss.loss import BERTScoreLoss

from .conftest import LANG_PAIRS, needs_data, stsb, wmt16


def _generator(kind: str, corpus: list[str], vocab: int = 8000):
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer
    from transformers import PreTrainedTokenizerFast

    trainer = ByteLevelBPETokenizer() if kind == "byte-level" else SentencePieceBPETokenizer()
    trainer.train_from_iterator(corpus, vocab_size=vocab, special_tokens=["<pad>", "</s>", "<unk>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=trainer._tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def corpus():
    a, b, _ = stsb("train")
    return a + b


def pieces(bridge, encoder, token_id, first=False):
    index = bridge.piece_index_first if first else bridge.piece_index
    count = bridge.piece_count_first if first else bridge.piece_count
    return encoder.tokenizer.convert_ids_to_tokens(index[token_id, : count[token_id]].tolist())


@needs_data
@pytest.mark.parametrize("kind", ["byte-level", "sentencepiece"])
def test_token_mapping_by_hand(minilm_encoders, corpus, kind):
    enc = minilm_encoders(4)
    gen = _generator(kind, corpus)
    bridge = VocabBridge(gen, enc)
    marker = "\u0120" if kind == "byte-level" else "\u2581"
    vocab = gen.get_vocab()
    assert pieces(bridge, enc, vocab[marker + "guitar"]) == ["guitar"]
    assert pieces(bridge, enc, vocab[marker + "Man"]) == ["man"]  # the encoder is uncased
    assert pieces(bridge, enc, vocab["ing"]) == ["##ing"]  # a continuation is a word piece
    assert pieces(bridge, enc, vocab["ing"], first=True) == ["ing"]  # ... except as a text's first token
    assert pieces(bridge, enc, vocab["."]) == ["."]  # punctuation always starts a word in WordPiece
    for special in ("<pad>", "</s>", "<unk>"):
        assert bridge.piece_count[vocab[special]] == 0
    weights = bridge.weights(torch.ones(enc.vocab_size))
    assert weights[vocab["</s>"]] == 0 and weights[vocab[marker + "guitar"]] == 1
    e = enc.input_embeddings
    guitar = e[enc.tokenizer.convert_tokens_to_ids("guitar")]
    assert torch.allclose(bridge.embeddings[vocab[marker + "guitar"]], guitar)
    assert bridge.state_dict() == {}


@needs_data
def test_bridged_one_hot_scoring_tracks_exact_evaluation(minilm_encoders, corpus):
    """Agreement on 120 WMT16 pairs with a small (8k) generator vocabulary; the full measurement with a
    32k vocabulary is benchmarks/bridge_agreement.py (figures in docs/loss.md)."""
    scorer = BERTScorer(encoder=minilm_encoders(4))
    gen = _generator("byte-level", corpus)
    loss = BERTScoreLoss(scorer=scorer, bridge=VocabBridge(gen, scorer.encoder), max_mode="hard", reduction="none")
    cands, refs = [], []
    for lp in LANG_PAIRS:
        c, r, _ = wmt16(lp, 20)
        cands += c
        refs += r
    exact = scorer.score(cands, refs)[2]
    ids = gen(cands, add_special_tokens=False)["input_ids"]
    width = max(len(r) for r in ids)
    x = torch.zeros(len(ids), width, dtype=torch.long)
    mask = torch.zeros(len(ids), width, dtype=torch.bool)
    for i, row in enumerate(ids):
        x[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    with torch.no_grad():
        bridged = loss(x, refs, mask).f1
    pearson = np.corrcoef(exact.numpy(), bridged.numpy())[0, 1]
    assert pearson > 0.6
    assert (exact - bridged).abs().mean() < 0.2
    # soft inputs go through the same bridge: a peaked distribution scores like its argmax
    logits = torch.full((2, width, len(gen)), -30.0).scatter(2, x[:2].unsqueeze(-1), 30.0)
    with torch.no_grad():
        soft = BERTScoreLoss(scorer=scorer, bridge=loss.bridge, max_mode="hard", reduction="none")(
            logits, refs[:2], mask[:2]
        )
    assert torch.allclose(soft.f1, bridged[:2], atol=1e-5)
