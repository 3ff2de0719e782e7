"""Vocabulary bridge: generator tokens of another tokenizer family in the encoder's input space."""

from __future__ import annotations

import logging

import torch
from torch import Tensor, nn

from .encoder import FrozenEncoder

logger = logging.getLogger(__name__)

_BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": byte-level BPE word start (GPT-2, RoBERTa, tokenizers' ByteLevel)
_SENTENCEPIECE_SPACE = "\u2581"  # "▁": sentencepiece / Metaspace word start


class VocabBridge(nn.Module):
    """Maps every generator token to the mean of the encoder input embeddings of its pieces.

    A generator token's text (from ``generator_tokenizer``; byte-level ``Ġ`` and sentencepiece ``▁``
    word-start markers and WordPiece ``##`` continuations understood) is split by the encoder's
    tokenizer; a token that starts a word is split as a word, a continuation as a word piece (``##x``
    for WordPiece encoders, no prefix space for byte-level ones). Special and empty tokens get a zero
    row and weight 0. The approximation: a generator token that the encoder splits into several pieces
    becomes ONE position holding their mean embedding, so sequences, and contextual embeddings, differ
    from exact evaluation of the decoded text when tokenisations disagree.

    The first token of a text always starts a word (byte-level generators write it without ``Ġ``), so
    it has its own table ``first_embeddings``.

    Buffers (not saved in ``state_dict``): ``embeddings``/``first_embeddings`` ``[Vg, d]``, and the
    pieces behind them ``piece_index[_first]`` ``[Vg, k]``, ``piece_count[_first]`` ``[Vg]``.
    """

    def __init__(self, generator_tokenizer: object, encoder: FrozenEncoder, max_pieces: int = 16) -> None:
        super().__init__()
        gen = generator_tokenizer
        size = len(gen)
        tokens = gen.convert_ids_to_tokens(list(range(size)))
        special = set(getattr(gen, "all_special_ids", []) or [])
        marker = _word_start_marker(tokens)
        texts, starts = [], []
        for i, tok in enumerate(tokens):
            if tok is None or i in special:
                texts.append("")
                starts.append(True)
                continue
            text = gen.convert_tokens_to_string([tok])
            if marker == "##":
                start = not tok.startswith("##")
            elif marker is not None:
                start = tok.startswith(marker)
            else:
                start = True
            text = text.strip()
            texts.append("" if set(text) <= {"\ufffd"} else text)
            starts.append(start)
        device = encoder.device
        # As placed in a text, and as the first token of a text (which always starts a word).
        for suffix, flags in (("", starts), ("_first", [True] * size)):
            index, count = _piece_table(_encoder_pieces(encoder, texts, flags), max_pieces)
            self.register_buffer("piece_index" + suffix, index.to(device), persistent=False)
            self.register_buffer("piece_count" + suffix, count.to(device), persistent=False)
        with torch.no_grad():
            table = encoder.input_embeddings.float()
            self.register_buffer("embeddings", self._mean(table).to(encoder.dtype), persistent=False)
            self.register_buffer("first_embeddings", self._mean(table, True).to(encoder.dtype), persistent=False)
        logger.info("vocabulary bridge: %d generator tokens, %d empty", size, int((self.piece_count == 0).sum()))

    def _mean(self, table: Tensor, first: bool = False) -> Tensor:
        """Mean of ``table`` rows ``[V_enc, *feat]`` over each generator token's pieces → ``[Vg, *feat]``."""
        index = self.piece_index_first if first else self.piece_index
        count = self.piece_count_first if first else self.piece_count
        rows = table[index]  # [Vg, k, *feat]
        mask = torch.arange(index.shape[1], device=rows.device) < count.unsqueeze(1)
        mask = mask.view(*mask.shape, *([1] * (rows.dim() - 2))).to(rows.dtype)
        total = (rows * mask).sum(dim=1)
        denom = count.clamp_min(1).view(-1, *([1] * (rows.dim() - 2))).to(rows.dtype)
        return total / denom

    def weights(self, vocab_weight: Tensor, first: bool = False) -> Tensor:
        """Generator token weights ``[Vg]``: the mean encoder weight (IDF or 1, special 0) of its pieces."""
        return self._mean(vocab_weight.to(self.embeddings.device), first)


def _piece_table(pieces: list[list[int]], max_pieces: int) -> tuple[Tensor, Tensor]:
    index = torch.zeros((len(pieces), max_pieces), dtype=torch.long)
    count = torch.zeros(len(pieces), dtype=torch.long)
    for i, p in enumerate(pieces):
        p = p[:max_pieces]
        index[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        count[i] = len(p)
    return index, count


def _word_start_marker(tokens: list[str | None]) -> str | None:
    sample = [t for t in tokens[:5000] if t]
    counts = {m: sum(t.startswith(m) for t in sample) for m in (_BYTE_LEVEL_SPACE, _SENTENCEPIECE_SPACE, "##")}
    best = max(counts, key=counts.get)
    return best if counts[best] > 0 else None


def _encoder_pieces(encoder: FrozenEncoder, texts: list[str], starts: list[bool]) -> list[list[int]]:
    """Encoder token ids of each text, split as a word start or as a continuation."""
    tok = encoder.tokenizer
    out: list[list[int]] = [[] for _ in texts]
    byte_level = bool(encoder._call_kwargs)
    vocab = tok.get_vocab()
    wordpiece = any(k.startswith("##") for k in list(vocab)[:5000]) or "##s" in vocab
    for start in (True, False):
        idx = [i for i, (t, s) in enumerate(zip(texts, starts)) if t and s == start]
        if not idx:
            continue
        kwargs = {"add_prefix_space": start} if byte_level else {}
        ids = tok([texts[i] for i in idx], add_special_tokens=False, **kwargs)["input_ids"]
        for i, row in zip(idx, ids):
            row = list(row)
            # WordPiece splits punctuation off as words of their own: only letters/digits continue a word.
            if not start and wordpiece and row and texts[i][0].isalnum():
                piece = tok.convert_ids_to_tokens(row[0])
                cont = vocab.get("##" + piece) if not piece.startswith("##") else None
                if cont is not None:
                    row[0] = cont
            out[i] = [t for t in row if t not in encoder.special_ids]
    return out
