"""BERTScore as an ``evaluate`` metric, the same dict as ``evaluate.load("bertscore")``, offline.

Load it with ``evaluate.load(bertscore_loss.compat.evaluate_module_path())`` (extra ``evaluate``);
``compute(predictions=..., references=..., lang=..., model_type=..., idf=...)`` returns ``precision``,
``recall``, ``f1`` (lists, one value per prediction) and ``hashcode``, scored by
:class:`bertscore_loss.compat.BERTScorer`. References are one str or a list of str per prediction (the best of
each measure); ``idf=True`` weighs tokens by IDF over all references of the call.
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate

from bertscore_loss.compat import BERTScorer, resolve_model

_CITATION = """\
@inproceedings{bert-score,
  title={BERTScore: Evaluating Text Generation with BERT},
  author={Tianyi Zhang* and Varsha Kishore* and Felix Wu* and Kilian Q. Weinberger and Yoav Artzi},
  booktitle={International Conference on Learning Representations},
  year={2020},
  url={https://openreview.net/forum?id=SkeHuCVFDr}
}
"""

_DESCRIPTION = """\
BERTScore (Zhang et al., 2020) matches the tokens of a prediction and a reference by the cosine similarity of
their contextual embeddings. This module gives the numbers of bert-score 0.3.13 from the engine of
bertscore-loss, offline: the model is a local folder, a hub name in the local Hugging Face cache, or a
packaged encoder.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): the candidate texts.
    references (list of str, or list of list of str): one reference or a list of references per prediction.
    lang (str): language of the texts; gives bert-score's default model when model_type is not given.
    model_type (str): a local model folder, a hub name in the local Hugging Face cache, or a packaged encoder.
    num_layers (int): the layer to score; default: the tuned layer of a known model.
    verbose (bool): progress bar and timing in the log.
    idf (bool): weigh tokens by IDF over all references of the call.
    device (str): where the model runs (default: cuda when present).
    batch_size (int), nthreads (int): accepted; they do not change a score.
    all_layers (bool): scores of every layer.
    rescale_with_baseline (bool), baseline_path (str): rescale with a baseline file (LAYER,P,R,F).
    use_fast_tokenizer (bool): recorded in the hashcode.

Returns:
    precision, recall, f1: lists of floats, one per prediction; hashcode: the setting's hash string.

Examples:
    >>> import evaluate
    >>> from bertscore_loss.compat import evaluate_module_path
    >>> metric = evaluate.load(evaluate_module_path())
    >>> out = metric.compute(predictions=["a cat"], references=["a cat"],
    ...                      model_type="sentence-transformers/all-MiniLM-L6-v2")
    >>> round(out["f1"][0], 4)
    1.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class BertscoreLossMetric(evaluate.Metric):
    """``evaluate.load("bertscore")``'s inputs and outputs on :class:`bertscore_loss.compat.BERTScorer`."""

    def _info(self) -> evaluate.MetricInfo:
        text = datasets.Value("string", id="sequence")
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            homepage="https://pypi.org/project/bertscore-loss/",
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features({"predictions": text, "references": datasets.Sequence(text, id="references")}),
                datasets.Features({"predictions": text, "references": text}),
            ],
            codebase_urls=["https://pypi.org/project/bertscore-loss/"],
            reference_urls=["https://arxiv.org/abs/1904.09675"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[Any],
        lang: str | None = None,
        model_type: str | None = None,
        num_layers: int | None = None,
        verbose: bool = False,
        idf: bool = False,
        device: str | None = None,
        batch_size: int = 64,
        nthreads: int = 4,
        all_layers: bool = False,
        rescale_with_baseline: bool = False,
        baseline_path: str | None = None,
        use_fast_tokenizer: bool = False,
    ) -> dict[str, Any]:
        groups = [[r] if isinstance(r, str) else list(r) for r in references]
        name, _ = resolve_model(model_type, lang)
        # a new scorer per call (IDF over this call's references); the previous one keeps the model loaded
        scorer = BERTScorer(
            model_type=name,
            num_layers=num_layers,
            batch_size=batch_size,
            nthreads=nthreads,
            all_layers=all_layers,
            idf=idf,
            idf_sents=[r for g in groups for r in g] if idf else None,
            device=device,
            lang=lang,
            rescale_with_baseline=rescale_with_baseline,
            baseline_path=baseline_path,
            use_fast_tokenizer=use_fast_tokenizer,
        )
        self.cached_scorer = scorer
        out = scorer.score(predictions, groups, verbose=verbose, batch_size=batch_size)
        p, r, f = out  # type: ignore[misc]
        return {"precision": p.tolist(), "recall": r.tolist(), "f1": f.tolist(), "hashcode": scorer.hash}
