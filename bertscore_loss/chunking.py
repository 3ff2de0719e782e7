"""Deprecated: ``bertscore_loss.chunking`` is private and moved to ``bertscore_loss._chunking``.

Importing this shim warns (``DeprecationWarning``) and re-exports the private module's names; the shim is removed
in the next release. Use the public API instead (``bertscore_loss`` and its public submodules).
"""

import warnings

from ._chunking import *  # noqa: F403
from ._chunking import __all__ as __all__

warnings.warn(
    "bertscore_loss.chunking is private and moved to bertscore_loss._chunking; the shim is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
