"""Former name of :mod:`bertscore_loss.validation` (kept so that old imports work)."""

from .validation import check_pairs, check_references, check_texts

__all__ = ["check_pairs", "check_references", "check_texts"]
