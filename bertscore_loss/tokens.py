"""Deprecated: ``bertscore_loss.tokens`` is private and moved to ``bertscore_loss._tokens``.

Importing this shim warns (``DeprecationWarning``) and re-exports the private module's names; the shim is removed
in the next release. Use the public API instead (``bertscore_loss`` and its public submodules).
"""

import warnings

from ._tokens import *  # noqa: F403
from ._tokens import __all__ as __all__

warnings.warn(
    "bertscore_loss.tokens is private and moved to bertscore_loss._tokens; the shim is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
