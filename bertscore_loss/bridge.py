"""Vocabulary bridge: generator tokens of another tokenizer family in the encoder's input space."""

from __future__ import annotations

import codecs
import logging
import os
import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from .encoder import FrozenEncoder

logger = logging.getLogger(__name__)

BridgeMode = Literal["mean", "retokenize"]

_BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": byte-level BPE word start (GPT-2, RoBERTa, tokenizers' ByteLevel)
_SENTENCEPIECE_SPACE = "\u2581"  # "▁": sentencepiece / Metaspace word start
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # sentencepiece byte-fallback tokens


class SentencePieceVocab:
    """A sentencepiece model seen through the few tokenizer methods the bridge uses.

    ``model``: a ``.model`` file path or a ``sentencepiece.SentencePieceProcessor``. Control pieces
    (pad, bos, eos, ...) and the unknown piece are special; byte pieces keep their ``<0xNN>`` form.
    Use it (or pass the file / processor to :class:`VocabBridge` directly) instead of wrapping the file
    in ``T5Tokenizer(vocab_file=...)``: with transformers 5 such classes silently build a vocabulary
    of a few special tokens from it.
    """

    sp: Any  # a sentencepiece.SentencePieceProcessor (sentencepiece ships no type information)

    def __init__(self, model: str | os.PathLike | object) -> None:
        sp: Any = model
        if isinstance(model, (str, os.PathLike)):
            import sentencepiece as spm

            path = os.fspath(model)
            if not os.path.isfile(path):
                raise FileNotFoundError(f"sentencepiece model {path!r} is not a file")
            try:
                sp = spm.SentencePieceProcessor(model_file=path)
            except (OSError, RuntimeError) as exc:
                raise ValueError(f"{path!r} is not a sentencepiece model: {exc}") from exc
        self.sp = sp
        size = sp.get_piece_size()
        self.all_special_ids = [i for i in range(size) if sp.is_control(i) or sp.is_unknown(i)]

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def convert_tokens_to_string(self, tokens: Sequence[str]) -> str:
        return self.sp.decode_pieces(list(tokens))

    def decode(self, ids: Sequence[int], **_: object) -> str:
        return self.sp.decode([int(i) for i in ids if int(i) not in self.all_special_ids])


def _is_sentencepiece(obj: object) -> bool:
    return isinstance(obj, (str, os.PathLike)) or (hasattr(obj, "id_to_piece") and hasattr(obj, "get_piece_size"))


class Retokenized(NamedTuple):
    """Encoder pieces of decoded generator rows (:meth:`VocabBridge.retokenize`).

    ``piece_ids``/``mask`` ``[B, L]`` (True = a real piece, packed to the front); ``route`` ``[B, L, T]``:
    ``1/|cover(l)|`` for the generator positions ``t`` whose characters piece ``l`` covers, else 0;
    ``texts``: the decoded, stripped texts the pieces come from.
    """

    piece_ids: Tensor
    mask: Tensor
    route: Tensor
    texts: list[str]


class VocabBridge(nn.Module):
    """Generator tokens of another tokenizer family as encoder inputs, in one of two modes.

    ``mode="retokenize"`` (default): the generator ids (the argmax of soft inputs) are decoded to text
    and tokenised by the encoder's tokenizer exactly as evaluation does, so one-hot inputs reproduce
    :meth:`BERTScorer.score` of the decoded text. Soft inputs score their argmax text; their gradient is
    the mean bridge's, straight-through (like ``max_mode="straight_through"``): every encoder piece ``l``
    gets ``E[piece_l] + Σ_t A[l, t] (s_t − sg(s_t))`` with ``s_t`` the mean-bridge row of position ``t``
    and ``A[l, t] = 1/|cover(l)|`` over the generator positions whose characters the piece covers.

    ``mode="mean"``: fully differentiable; every generator token is ONE encoder position holding the
    mean of the encoder input embeddings of its pieces (``Ġ``/``▁`` word-start markers and ``##``
    continuations understood; a continuation is split by greedy WordPiece with ``##`` from its first
    character for WordPiece encoders, without prefix space for byte-level ones). Sequences, hence
    contextual embeddings, differ from exact evaluation where the tokenisations disagree; a token
    without a word-start marker after punctuation is treated as a continuation (``"We`` → ``" ##we``).

    Both modes build the mean tables (the retokenize gradient uses them). Special and empty generator
    tokens get a zero row and weight 0 (mean) or are left out of the text (retokenize). The first token
    of a text always starts a word, so the mean bridge has a table ``first_embeddings`` for it.

    ``generator_tokenizer``: a Hugging Face tokenizer, a sentencepiece ``.model`` file, or a
    ``sentencepiece.SentencePieceProcessor`` (see :class:`SentencePieceVocab`). ``vocab_size``: the
    generator's output size (``logits.shape[-1]``); when given, a tokenizer of another size is refused,
    and :class:`BERTScoreLoss` refuses logits of another size in any case. A tokenizer with text for fewer
    than a tenth of its ids (e.g. ``T5Tokenizer(vocab_file=...)`` around a plain sentencepiece model, which
    transformers 5 turns into a few special tokens) is refused too.

    Buffers (not saved in ``state_dict``): ``embeddings``/``first_embeddings`` ``[Vg, d]``, and the
    pieces behind them ``piece_index[_first]`` ``[Vg, k]``, ``piece_count[_first]`` ``[Vg]``.
    """

    # Declared for type checkers (nn.Module's __getattr__ would type the buffers as Tensor | Module).
    embeddings: Tensor
    first_embeddings: Tensor
    piece_index: Tensor
    piece_index_first: Tensor
    piece_count: Tensor
    piece_count_first: Tensor
    _tokenizer: Any  # the encoder's Hugging Face tokenizer (retokenize mode)
    _call_kwargs: dict[str, Any]
    _token_bytes: list[bytes]

    def __init__(
        self,
        generator_tokenizer: object,
        encoder: FrozenEncoder,
        mode: BridgeMode = "retokenize",
        *,
        max_pieces: int = 16,
        vocab_size: int | None = None,
    ) -> None:
        super().__init__()
        if mode not in ("mean", "retokenize"):
            raise ValueError(f"mode must be 'mean' or 'retokenize', got {mode!r}")
        self.mode = mode
        # A Hugging Face tokenizer or a SentencePieceVocab: used through the few methods they share.
        gen: Any = (
            SentencePieceVocab(generator_tokenizer) if _is_sentencepiece(generator_tokenizer) else generator_tokenizer
        )
        size = len(gen)
        if vocab_size is not None and size != vocab_size:
            raise ValueError(
                f"the generator tokenizer has {size} tokens but the generator outputs {vocab_size}: give the "
                "tokenizer the generator was trained with (a sentencepiece .model file can be passed directly)"
            )
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
        usable = sum(1 for t in texts if t)
        if usable < max(16, size // 10):  # real vocabularies: far more than a tenth have text
            raise ValueError(
                f"the generator tokenizer ({type(gen).__name__}) has {size} tokens, only {usable} of them with "
                "text: it does not hold a usable vocabulary. With transformers 5, T5Tokenizer/LlamaTokenizer/"
                "AlbertTokenizer(vocab_file='sp.model') build one of a few special tokens from a plain "
                "sentencepiece model; pass the .model file or a SentencePieceProcessor to VocabBridge instead"
            )
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
        if mode == "retokenize":
            if not getattr(encoder.tokenizer, "is_fast", False):
                raise ValueError(
                    "mode='retokenize' needs a fast (Rust) encoder tokenizer for character offsets; use mode='mean'"
                )
            self._token_bytes = _token_bytes(tokens, special, marker, gen)
            # The encoder's tokenizer and call arguments, not the encoder (it must not become a submodule).
            self._tokenizer = encoder.tokenizer
            self._call_kwargs = dict(encoder._call_kwargs)
        logger.info(
            "vocabulary bridge (%s): %d generator tokens, %d empty", mode, size, int((self.piece_count == 0).sum())
        )

    @property
    def vocab_size(self) -> int:
        """Size of the generator vocabulary this bridge maps (rows of its tables)."""
        return int(self.embeddings.shape[0])

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, generator_vocab={self.vocab_size}"

    # --- mean tables ---------------------------------------------------------------------------
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

    # --- retokenize ----------------------------------------------------------------------------
    def decode(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
        """Text of generator ids ``[T]`` and each position's character span ``(start, end)`` in it.

        Byte-level tokens are decoded through their bytes (a character split over several tokens belongs
        to all of them; invalid bytes become U+FFFD, as ``generator.decode`` does); special tokens are
        left out (empty span), as with ``skip_special_tokens=True, clean_up_tokenization_spaces=False``.
        """
        if self.mode != "retokenize":
            raise RuntimeError("decode() needs a VocabBridge built with mode='retokenize'")
        table = self._token_bytes
        dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
        parts: list[str] = []
        spans: list[tuple[int, int]] = []
        n = 0
        for v in ids:
            raw = table[v]
            if not raw:
                spans.append((n, n))
                continue
            out = dec.decode(raw)
            start = n  # the pending character this token completes, or its own first one
            n += len(out)
            parts.append(out)
            spans.append((start, n + (1 if dec.getstate()[0] else 0)))
        parts.append(dec.decode(b"", final=True))
        return "".join(parts), spans

    def retokenize(self, ids: Tensor, mask: Tensor, route: bool = True) -> Retokenized:
        """Encoder pieces of the texts of generator ids ``[B, T]`` (long) whose ``mask`` ``[B, T]`` is True.

        Each row is decoded (:meth:`decode`), stripped and tokenised with the encoder's tokenizer as
        ``FrozenEncoder.tokenize`` does (no cut here: ``BERTScoreLoss.frame`` cuts to the model's maximum
        with a warning). A Python loop over the rows decodes and tokenises; the rest is vectorised. With
        ``route=False`` the ``[B, L, T]`` routing matrix is left empty (``[B, L, 0]``).
        """
        if self.mode != "retokenize":
            raise RuntimeError("retokenize() needs a VocabBridge built with mode='retokenize'")
        b, t = ids.shape
        texts, shifts, tok_start, tok_end = [], [], [], []
        for row, keep in zip(ids.tolist(), mask.tolist()):
            text, spans = self.decode([v for v, k in zip(row, keep) if k])
            it = iter(spans)
            spans = [next(it) if k else (0, 0) for k in keep]
            stripped = text.strip()
            texts.append(stripped)
            shifts.append(len(text) - len(text.lstrip()))
            tok_start.append([s for s, _ in spans])
            tok_end.append([e for _, e in spans])
        enc = (
            self._tokenizer(
                texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False, **self._call_kwargs
            )
            if texts
            else {"input_ids": [], "offset_mapping": []}
        )
        width = max([1] + [len(r) for r in enc["input_ids"]])
        piece_ids = torch.zeros(b, width, dtype=torch.long)
        piece_mask = torch.zeros(b, width, dtype=torch.bool)
        offsets = torch.zeros(b, width, 2, dtype=torch.long)
        for r, (row, offs, shift) in enumerate(zip(enc["input_ids"], enc["offset_mapping"], shifts)):
            if row:
                piece_ids[r, : len(row)] = torch.tensor(row, dtype=torch.long)
                piece_mask[r, : len(row)] = True
                offsets[r, : len(row)] = torch.tensor(offs, dtype=torch.long).view(-1, 2) + shift
        device = ids.device
        if route:
            ps, pe = offsets[..., 0], torch.maximum(offsets[..., 1], offsets[..., 0] + 1)  # [B, L]
            ts = torch.tensor(tok_start, dtype=torch.long).view(b, t)
            te = torch.tensor(tok_end, dtype=torch.long).view(b, t)
            cover = (ts.unsqueeze(1) < pe.unsqueeze(2)) & (te.unsqueeze(1) > ps.unsqueeze(2))  # [B, L, T]
            cover &= (te > ts).unsqueeze(1) & piece_mask.unsqueeze(2)
            a = cover.float()
            a = a / a.sum(dim=2, keepdim=True).clamp_min(1.0)
        else:
            a = torch.zeros(b, width, 0)
        return Retokenized(piece_ids.to(device), piece_mask.to(device), a.to(device), texts)


def _token_bytes(tokens: list[str | None], special: set[int], marker: str | None, gen: Any) -> list[bytes]:
    """UTF-8 bytes of every generator token as it appears in decoded text (special/None: ``b""``)."""
    out: list[bytes] = []
    byte_map = _unicode_to_byte() if marker == _BYTE_LEVEL_SPACE else {}
    for i, tok in enumerate(tokens):
        if tok is None or i in special:
            out.append(b"")
        elif byte_map and all(c in byte_map for c in tok):
            out.append(bytes(byte_map[c] for c in tok))
        elif (m := _BYTE_FALLBACK.fullmatch(tok)) is not None:
            out.append(bytes([int(m.group(1), 16)]))
        elif marker == _SENTENCEPIECE_SPACE:
            out.append(tok.replace(_SENTENCEPIECE_SPACE, " ").encode("utf-8"))
        elif marker == "##":
            out.append((tok[2:] if tok.startswith("##") else " " + tok).encode("utf-8"))
        else:
            out.append(gen.convert_tokens_to_string([tok]).encode("utf-8"))
    return out


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte → printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for byte in range(256):
        if byte not in bs:
            bs.append(byte)
            cs.append(256 + n)
            n += 1
    return {chr(c): byte for byte, c in zip(bs, cs)}


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
    best = max(counts, key=lambda m: counts[m])
    return best if counts[best] > 0 else None


class _Continuation:
    """Splits a continuation (text glued to the previous word) as a fast WordPiece tokenizer would.

    The encoder's own normaliser and pre-tokeniser give the words; the first word, if it glues on (it
    does when pre-tokenising ``"a" + text`` keeps it in the first word: not punctuation, no space), is
    split by greedy longest match with the ``##`` prefix from its first character, the others as words.
    """

    def __init__(self, tokenizer: Any) -> None:  # a fast Hugging Face tokenizer with a WordPiece model
        backend = tokenizer.backend_tokenizer
        model = backend.model
        self.normalizer, self.pre_tokenizer = backend.normalizer, backend.pre_tokenizer
        self.prefix = model.continuing_subword_prefix
        self.max_chars = model.max_input_chars_per_word
        self.vocab = tokenizer.get_vocab()
        self.unk = self.vocab[model.unk_token]

    def word(self, word: str, glued: bool) -> list[int]:
        """Greedy longest-match WordPiece of one word (``[UNK]`` when it cannot be split)."""
        if len(word) > self.max_chars:
            return [self.unk]
        out, start = [], 0
        while start < len(word):
            end, piece = len(word), None
            while start < end:
                sub = word[start:end]
                piece = self.vocab.get(self.prefix + sub if start > 0 or glued else sub)
                if piece is not None:
                    break
                end -= 1
            if piece is None:
                return [self.unk]
            out.append(piece)
            start = end
        return out

    def __call__(self, text: str) -> list[int]:
        norm = self.normalizer.normalize_str(text) if self.normalizer is not None else text
        if self.pre_tokenizer is None:
            return self.word(norm, True) if norm else []
        words = self.pre_tokenizer.pre_tokenize_str(norm)
        head = self.pre_tokenizer.pre_tokenize_str("a" + norm)
        glued = bool(head) and bool(words) and words[0][1][0] == 0 and head[0][1][1] > 1
        out: list[int] = []
        for k, (w, _) in enumerate(words):
            out += self.word(w, glued and k == 0)
        return out


def _is_wordpiece(tokenizer: object) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None) if getattr(tokenizer, "is_fast", False) else None
    return backend is not None and type(backend.model).__name__ == "WordPiece"


def _encoder_pieces(encoder: FrozenEncoder, texts: list[str], starts: list[bool]) -> list[list[int]]:
    """Encoder token ids of each text, split as a word start or as a continuation."""
    tok = encoder.tokenizer
    out: list[list[int]] = [[] for _ in texts]
    byte_level = bool(encoder._call_kwargs)
    continuation = _Continuation(tok) if _is_wordpiece(tok) else None
    vocab = tok.get_vocab()
    wordpiece = continuation is not None or any(k.startswith("##") for k in list(vocab)[:5000]) or "##s" in vocab
    for start in (True, False):
        idx = [i for i, (t, s) in enumerate(zip(texts, starts)) if t and s == start]
        if not idx:
            continue
        if not start and continuation is not None:
            for i in idx:
                out[i] = [t for t in continuation(texts[i]) if t not in encoder.special_ids]
            continue
        kwargs = {"add_prefix_space": start} if byte_level else {}
        ids = tok([texts[i] for i in idx], add_special_tokens=False, **kwargs)["input_ids"]
        for i, row in zip(idx, ids):
            row = list(row)
            # A slow WordPiece tokenizer: only the first piece of a glued-on first word gets "##".
            if not start and wordpiece and row and texts[i][0].isalnum():
                piece = tok.convert_ids_to_tokens(row[0])
                cont = vocab.get("##" + piece) if not piece.startswith("##") else None
                if cont is not None:
                    row[0] = cont
            out[i] = [t for t in row if t not in encoder.special_ids]
    return out
