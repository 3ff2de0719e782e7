"""Every layer of an encoder from one pass: embeddings of all layers and the scores of each layer.

One forward pass of the untruncated model with ``output_hidden_states=True`` gives the hidden states of
all layers ``0..L`` (0 = embedding output); each layer is unit-normalised and packed, and pairs are
scored by the same pipeline as :class:`~bertscore_loss.BERTScorer`, so the scores of layer ``k`` equal
``BERTScorer(layer=k).score(...)``. The layer-tuning and baseline tools (:mod:`bertscore_loss.quality`)
are built on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ._loading import ModelNotFoundError, config_layers, resolve_model_path, warn
from ._packed import PackedEmbeddings
from ._pipeline import ScoringPlan
from ._tokens import length_order
from .config import max_elements_for
from .encoder import FrozenEncoder
from .matching import normalize

logger = logging.getLogger(__name__)


def load_full_encoder(
    model: str | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = "float32",
    allow_download: bool = False,
) -> FrozenEncoder:
    """``FrozenEncoder`` of ``model`` (None = bundled MiniLM) keeping all its layers."""
    from transformers import AutoConfig

    path = resolve_model_path(model)  # None: the bundled MiniLM; "mpnet": the assembled accurate encoder
    kwargs = {} if model is None or os.path.isdir(path) or allow_download else {"local_files_only": True}
    try:
        config = AutoConfig.from_pretrained(path, **kwargs)
    except OSError as exc:
        raise ModelNotFoundError(
            f"model {path!r} was not found locally (no model hub is used): pass a local folder holding "
            "config.json, the weights and the tokenizer files, or a hub name in the local Hugging Face cache"
        ) from exc
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "num_layers", None) is not None:
        layers = int(config.num_layers)
    else:
        layers = config_layers(config, type(config).__name__)
    return FrozenEncoder(model, layer=layers, device=device, dtype=dtype, allow_download=allow_download)


@dataclass
class LayerEmbeddings:
    """Unit-normalised token embeddings of a set of texts at every layer ``0..L``.

    ``layers[k]`` packs layer ``k`` (``flat`` ``[T, d]`` float32); all share offsets, lengths and
    ``token_ids`` ``[T]``. ``index`` maps a stripped text to its row; ``ids`` are the token ids per row.
    """

    layers: list[PackedEmbeddings]
    ids: list[list[int]]
    index: dict[str, int]
    special_ids: frozenset[int]
    vocab_size: int

    @property
    def num_layers(self) -> int:
        """Highest layer ``L`` (``len(layers) - 1``)."""
        return len(self.layers) - 1

    def rows(self, texts: Sequence[str]) -> Tensor:
        """Row index ``[N]`` of each text; KeyError naming a text that was not embedded."""
        try:
            return torch.tensor([self.index[t.strip()] for t in texts], dtype=torch.long)
        except KeyError as exc:
            raise KeyError(f"text {exc.args[0]!r} was not embedded") from None

    def score(
        self,
        cands: Sequence[str],
        refs: Sequence[str],
        *,
        idf: bool = False,
        groups: Sequence[str] | None = None,
        max_elements: int | None = None,
        progress: bool | None = None,
    ) -> Tensor:
        """P, R, F of every layer ``[L + 1, 3, N]`` (CPU float32) of the pairs ``(cands[i], refs[i])``.

        With ``idf`` the IDF table is computed over the references of each group (all references when
        ``groups`` is None), as one ``BERTScorer(idf=True).score`` call per group would. ``progress``:
        None = a bar for 10,000 or more pairs.
        """
        if len(cands) != len(refs):
            raise ValueError(f"got {len(cands)} candidates but {len(refs)} references: the lengths must match")
        if groups is not None and len(groups) != len(cands):
            raise ValueError(f"got {len(cands)} pairs but {len(groups)} group names")
        n = len(cands)
        cand_rows, ref_rows = self.rows(cands), self.rows(refs)
        members: dict[str, list[int]] = {}
        for i, g in enumerate(groups if groups is not None else ["all"] * n):
            members.setdefault(g, []).append(i)
        out = torch.zeros((len(self.layers), 3, n), dtype=torch.float32)
        budget = max_elements_for(self.layers[0].flat.device, max_elements, blocks=True)  # many pairs: big chunks
        plan = ScoringPlan(special_ids=self.special_ids, vocab_size=self.vocab_size, use_idf=idf, max_elements=budget)
        plan.index = dict(self.index)
        show = progress if progress is not None else n >= 10_000
        bar = tqdm(total=n * len(self.layers), desc="scoring (all layers)", unit="pair", disable=not show, leave=False)
        for items in members.values():
            sel = torch.tensor(items, dtype=torch.long)
            c, r = cand_rows[sel], ref_rows[sel]
            plan.use_embeddings(self.layers[0], self.ids, r)  # IDF (when on) over this group's references
            for k, packed in enumerate(self.layers):
                out[k, :, sel] = plan.score_pairs(c, r, packed).cpu()
                bar.update(len(items))
        bar.close()
        return out


@torch.inference_mode()
def embed_all_layers(
    enc: FrozenEncoder, texts: Sequence[str], *, batch_tokens: int | None = None, progress: bool | None = None
) -> LayerEmbeddings:
    """Encode the distinct stripped ``texts`` once and keep every layer ``0..enc.layer``.

    Texts are tokenised as :meth:`FrozenEncoder.tokenize` does (truncation and empty texts warn as in
    :class:`~bertscore_loss.BERTScorer`) and encoded in length-sorted batches of at most
    ``batch_tokens`` padded tokens. Memory: ``(L + 1) × tokens × d × 4`` bytes.
    """
    index: dict[str, int] = {}
    for t in texts:
        index.setdefault(t.strip(), len(index))
    unique = list(index)
    empty = sum(1 for t in unique if not t)
    if empty:
        warn("an empty text is among the inputs: its pairs score P = R = F = 0")
    tok = enc.tokenize(unique)
    if tok.truncated:
        warn(
            f"{tok.truncated} input text(s) are longer than the model's maximum of {enc.max_length} tokens "
            "and were truncated"
        )
    ids = tok.ids
    n = len(ids)
    device = enc.device
    order, offsets, lengths = length_order(ids)
    chunks: list[list[Tensor]] = [[] for _ in range(enc.layer + 1)]
    total = int(lengths.sum())
    logger.info(
        "encoding %d texts (%d tokens) at %d layers: %.2f GB of embeddings",
        n,
        total,
        enc.layer + 1,
        (enc.layer + 1) * total * enc.hidden_size * 4 / 1e9,
    )
    show = progress if progress is not None else n >= 1000
    bar = tqdm(total=n, desc="encoding (all layers)", unit="sent", disable=not show, leave=False)
    for members, batch, mask in enc.padded_batches(ids, order, batch_tokens):
        hidden = enc.model(
            input_ids=batch.to(device), attention_mask=mask.to(device), output_hidden_states=True
        ).hidden_states
        if len(hidden) != enc.layer + 1:
            raise ValueError(f"the model returned {len(hidden)} hidden states, expected {enc.layer + 1}")
        keep = mask.to(device).bool()
        for k, h in enumerate(hidden):
            chunks[k].append(normalize(h[keep].float()))
        bar.update(len(members))
    bar.close()
    token_ids = torch.tensor([t for i in order for t in ids[i]], dtype=torch.long, device=device)
    offsets, lengths = offsets.to(device), lengths.to(device)
    layers = []
    for k in range(enc.layer + 1):
        flat = torch.cat(chunks[k]) if chunks[k] else torch.zeros((0, enc.hidden_size), device=device)
        chunks[k] = []
        layers.append(PackedEmbeddings(flat, offsets, lengths, token_ids))
    return LayerEmbeddings(layers, ids, index, enc.special_ids, enc.vocab_size)


def score_all_layers(
    enc: FrozenEncoder,
    cands: Sequence[str],
    refs: Sequence[str],
    *,
    idf: bool = False,
    groups: Sequence[str] | None = None,
    batch_tokens: int | None = None,
    max_elements: int | None = None,
    progress: bool | None = None,
) -> Tensor:
    """P, R, F ``[L + 1, 3, N]`` of every layer of ``enc`` from one encoder pass (see :class:`LayerEmbeddings`)."""
    if len(cands) != len(refs):
        raise ValueError(f"got {len(cands)} candidates but {len(refs)} references: the lengths must match")
    emb = embed_all_layers(enc, [*cands, *refs], batch_tokens=batch_tokens, progress=progress)
    return emb.score(cands, refs, idf=idf, groups=groups, max_elements=max_elements)
