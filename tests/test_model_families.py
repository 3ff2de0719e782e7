"""Model families through ``bertscore_loss.compat``: tiny random models built from their configs (no download),
each equal to ``bert-score`` where it runs and, where it crashes, equal to ``bert-score`` on the same model with
the crash's cause fixed (a tokenizer ``model_max_length``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import transformers

from bertscore_loss import compat

from .conftest import bundled_path, fixed_corpus, real_pairs

TOL = 1e-6
LAYER = 2
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]


def small(**kw):
    """The sizes every family shares: 3 layers, hidden 32, 2 heads."""
    return {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 64, **kw}


def copy_wordpiece(d: Path) -> None:
    """The bundled MiniLM's uncased WordPiece tokenizer (a BERT tokenizer, 30,522 tokens)."""
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(bundled_path()) / name, d / name)


def saved_tokenizer(d: Path, tokenizer_class: str, **settings):
    """The tokenizer of the vocabulary files in ``d``, loaded as ``tokenizer_class`` (maximum 512) and saved there."""
    from transformers import AutoTokenizer

    config = {"tokenizer_class": tokenizer_class, "model_max_length": 512, **settings}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    tok = AutoTokenizer.from_pretrained(d)
    tok.save_pretrained(d)
    return tok


def unigram_tokenizer(d: Path, tokenizer_class: str, specials: list[str], cls: str, sep: str, **tokens: str):
    """A sentencepiece-style unigram tokenizer (800 pieces) trained on the committed corpus and saved as
    ``tokenizer_class`` without a ``model_max_length`` (as DeBERTa-v3 ships); returns it reloaded."""
    from tokenizers import SentencePieceUnigramTokenizer, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    spt = SentencePieceUnigramTokenizer()
    spt.train_from_iterator(fixed_corpus(), vocab_size=800, special_tokens=specials, unk_token=tokens["unk_token"])
    backend = spt._tokenizer
    ids = {t: specials.index(t) for t in (cls, sep)}
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}", special_tokens=list(ids.items())
    )
    PreTrainedTokenizerFast(tokenizer_object=backend, cls_token=cls, sep_token=sep, **tokens).save_pretrained(d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("model_max_length", None)
    config["tokenizer_class"] = tokenizer_class
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return AutoTokenizer.from_pretrained(d)


def build_bert(d: Path) -> None:
    from transformers import BertConfig, BertModel

    copy_wordpiece(d)
    BertModel(BertConfig(vocab_size=30522, max_position_embeddings=512, **small())).save_pretrained(d)


def build_distilbert(d: Path) -> None:
    from transformers import DistilBertConfig, DistilBertModel

    copy_wordpiece(d)
    cfg = DistilBertConfig(vocab_size=30522, dim=32, n_layers=3, n_heads=2, hidden_dim=64, max_position_embeddings=512)
    DistilBertModel(cfg).save_pretrained(d)


def build_electra(d: Path) -> None:
    from transformers import ElectraConfig, ElectraModel

    copy_wordpiece(d)
    cfg = ElectraConfig(vocab_size=30522, embedding_size=16, max_position_embeddings=512, **small())
    ElectraModel(cfg).save_pretrained(d)


def build_roberta(d: Path) -> None:
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(fixed_corpus(), vocab_size=600, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(d))
    tok = saved_tokenizer(d, "RobertaTokenizer")
    cfg = RobertaConfig(vocab_size=len(tok), max_position_embeddings=514, pad_token_id=tok.pad_token_id, **small())
    RobertaModel(cfg).save_pretrained(d)


def build_xlm_roberta(d: Path) -> None:
    from transformers import XLMRobertaConfig, XLMRobertaModel

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = unigram_tokenizer(
        d, "XLMRobertaTokenizer", specials, "<s>", "</s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>"
    )
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 512}))
    cfg = XLMRobertaConfig(vocab_size=len(tok), max_position_embeddings=514, pad_token_id=1, **small())
    XLMRobertaModel(cfg).save_pretrained(d)


def build_mpnet(d: Path) -> None:
    from transformers import MPNetConfig, MPNetModel

    words = (Path(bundled_path()) / "vocab.txt").read_text(encoding="utf-8").splitlines()
    specials = ["<s>", "<pad>", "</s>", "[UNK]", "<mask>"]  # MPNet's special tokens
    (d / "vocab.txt").write_text("\n".join(specials + [w for w in words if not w.startswith("[")]) + "\n")
    tok = saved_tokenizer(d, "MPNetTokenizer", do_lower_case=True)
    cfg = MPNetConfig(vocab_size=len(tok), max_position_embeddings=514, pad_token_id=tok.pad_token_id, **small())
    MPNetModel(cfg).save_pretrained(d)


def build_deberta_v3(d: Path) -> None:
    from transformers import DebertaV2Config, DebertaV2Model

    tok = unigram_tokenizer(
        d, "DebertaV2Tokenizer", SPECIALS, "[CLS]", "[SEP]", unk_token="[UNK]", pad_token="[PAD]", mask_token="[MASK]"
    )
    cfg = DebertaV2Config(
        vocab_size=len(tok),
        max_position_embeddings=512,
        relative_attention=True,
        position_buckets=64,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        pad_token_id=0,
        **small(),
    )
    DebertaV2Model(cfg).save_pretrained(d)


def build_modernbert(d: Path) -> None:
    from transformers import ModernBertConfig, ModernBertModel

    copy_wordpiece(d)
    cfg = ModernBertConfig(
        vocab_size=30522,
        max_position_embeddings=512,
        pad_token_id=0,
        cls_token_id=101,
        sep_token_id=102,
        bos_token_id=101,
        eos_token_id=102,
        global_attn_every_n_layers=2,
        local_attention=16,
        **small(),
    )
    ModernBertModel(cfg).save_pretrained(d)


def has_modernbert() -> bool:
    import transformers

    return hasattr(transformers, "ModernBertModel")


FAMILIES = {
    "bert": build_bert,
    "roberta": build_roberta,
    "xlm-roberta": build_xlm_roberta,
    "distilbert": build_distilbert,
    "mpnet": build_mpnet,
    "electra": build_electra,
    "deberta-v3": build_deberta_v3,
}
if has_modernbert():  # transformers >= 4.48
    FAMILIES["modernbert"] = build_modernbert


@pytest.fixture(scope="module")
def pairs():
    return real_pairs(per_lp=4, n_sts=16)  # 40 real pairs


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made: dict[str, str] = {}

    def get(family: str) -> str:
        if family not in made:
            d = tmp_path_factory.mktemp(family)
            torch.manual_seed(0)
            FAMILIES[family](d)
            made[family] = str(d)
        return made[family]

    return get


def with_max_length(folder: str, tmp_path: Path) -> str:
    """A copy of ``folder`` whose tokenizer declares ``model_max_length`` 512 (what a patched bert-score needs)."""
    d = tmp_path / "fixed"
    shutil.copytree(folder, d)
    config = json.loads((d / "tokenizer_config.json").read_text())
    (d / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 512}))
    return str(d)


def oracle(cands, refs, folder: str, **kw):
    import bert_score

    return bert_score.score(
        cands, refs, model_type=folder, num_layers=LAYER, device="cpu", use_fast_tokenizer=True, **kw
    )


def assert_equal(ours, theirs) -> None:
    for name, a, b in zip("PRF", ours, theirs):
        assert a.shape == b.shape
        diff = (a - b).abs().max().item()
        assert diff <= TOL, f"max |Δ{name}| = {diff:.2e}"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_scores_equal_bert_score(family, folders, pairs, tmp_path):
    cands, refs = pairs
    folder = folders(family)
    ours = compat.score(cands, refs, model_type=folder, num_layers=LAYER, use_fast_tokenizer=True)
    assert all(torch.isfinite(x).all() for x in ours) and (ours[2] > 0).all()
    assert compat.score(cands[:3], cands[:3], model_type=folder, num_layers=LAYER)[2].sub(1).abs().max() <= TOL
    try:
        theirs = oracle(cands, refs, folder)
    except OverflowError:  # no model_max_length: bert-score passes max_length=1e30 to the tokenizer
        assert family == "deberta-v3"
        folder = with_max_length(folder, tmp_path)  # the same model, the crash's cause fixed
        theirs = oracle(cands, refs, folder)
    else:
        assert family != "deberta-v3" or int(transformers.__version__.split(".")[0]) < 5, "bert-score ran"
    assert_equal(ours, theirs)
    idf = compat.score(cands, refs, model_type=folder, num_layers=LAYER, idf=True)
    assert_equal(idf, oracle(cands, refs, folder, idf=True))


@pytest.mark.parametrize("family", ["roberta", "deberta-v3"])
def test_the_baseline_tool_makes_a_rescale_file_offline(family, folders, pairs, tmp_path):
    """`bertscore-loss baseline` writes a LAYER,P,R,F file for any family; compat.score rescales with it."""
    from bertscore_loss.baseline import read_baseline
    from bertscore_loss.quality import compute_baseline_file

    folder = folders(family)
    path = tmp_path / "baseline.tsv"
    compute_baseline_file(path, sorted(set(fixed_corpus()[:300])), model=folder, pairs=200, seed=0, device="cpu")
    rows = read_baseline(path)
    assert sorted(rows) == [0, 1, 2, 3]
    cands, refs = pairs
    raw = compat.score(cands, refs, model_type=folder, num_layers=LAYER)
    out = compat.score(
        cands, refs, model_type=folder, num_layers=LAYER, rescale_with_baseline=True, lang="en", baseline_path=str(path)
    )
    b = rows[LAYER]
    for k in range(3):
        assert torch.allclose(out[k], (raw[k] - b[k]) / (1 - b[k]), atol=TOL)
