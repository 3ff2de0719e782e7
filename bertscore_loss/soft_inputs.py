"""Former name of :mod:`bertscore_loss.token_distributions` (kept so that old imports work)."""

from .token_distributions import Gumbel, expected_rows, to_probs

__all__ = ["Gumbel", "expected_rows", "to_probs"]
