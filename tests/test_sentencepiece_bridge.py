"""VocabBridge from a sentencepiece model (file or processor), and the refusal of mismatched tokenizers."""

from __future__ import annotations

import pytest
import torch

from bertscore_loss import BERTScoreLoss, BERTScorer, VocabBridge
from bertscore_loss.bridge import SentencePieceVocab

TEXTS = ["A man in a red shirt is riding a bike.", "Two dogs play in the snow, jumping!"]
REFS = ["A man in a red shirt rides a bicycle.", "Two dogs are playing in snow."]


@pytest.fixture(scope="module")
def scorer(tiny_bert_dir):
    return BERTScorer(model=tiny_bert_dir, layer=2)


def _ids(sp, texts):
    rows = [sp.encode(t) + [3] for t in texts]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return ids, mask


@pytest.mark.parametrize("given", ["path", "processor"])
def test_bridge_from_sentencepiece_matches_evaluation(spm_model, scorer, given):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=spm_model)
    bridge = VocabBridge(spm_model if given == "path" else sp, scorer.encoder, vocab_size=sp.get_piece_size())
    assert bridge.vocab_size == sp.get_piece_size()
    ids, mask = _ids(sp, TEXTS)
    for row, keep, text in zip(ids.tolist(), mask.tolist(), TEXTS):
        assert bridge.decode([v for v, k in zip(row, keep) if k])[0].strip() == text
    loss = BERTScoreLoss(scorer=scorer, bridge=bridge, max_mode="hard", reduction="none")
    torch.testing.assert_close(loss(ids, REFS, mask).f1, scorer.score(TEXTS, REFS)[2], atol=1e-5, rtol=0)


def test_sentencepiece_vocab_specials(spm_model):
    vocab = SentencePieceVocab(spm_model)
    assert len(vocab) == 800 and set(vocab.all_special_ids) == {0, 1, 2, 3}
    assert vocab.decode([2, *vocab.sp.encode("a dog"), 3]) == "a dog"


def test_wrong_size_and_textless_tokenizers_are_refused(spm_model, scorer):
    from transformers import AlbertTokenizer, LlamaTokenizer, T5Tokenizer

    with pytest.raises(ValueError, match="has 800 tokens but the generator outputs 8000"):
        VocabBridge(spm_model, scorer.encoder, vocab_size=8000)
    for cls in (T5Tokenizer, LlamaTokenizer, AlbertTokenizer):  # transformers 5: a few special tokens only
        with pytest.raises(ValueError, match="does not hold a usable vocabulary"):
            VocabBridge(cls(vocab_file=spm_model), scorer.encoder)
    with pytest.raises(FileNotFoundError, match="is not a file"):
        VocabBridge("missing.model", scorer.encoder)


def test_loss_refuses_logits_of_another_size(spm_model, scorer):
    bridge = VocabBridge(spm_model, scorer.encoder)
    loss = BERTScoreLoss(scorer=scorer, bridge=bridge)
    with pytest.raises(ValueError, match="generator outputs 900 entries per token but the VocabBridge maps"):
        loss(torch.randn(2, 5, 900), REFS, torch.ones(2, 5, dtype=torch.bool))
