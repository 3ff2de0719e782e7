"""Deprecated: ``bertscore_loss.blocks`` is private and moved to ``bertscore_loss._blocks``.

Importing this shim warns (``DeprecationWarning``) and re-exports the private module's names; the shim is removed
in the next release. Use the public API instead (``bertscore_loss`` and its public submodules).
"""

import warnings

from ._blocks import *  # noqa: F403
from ._blocks import __all__ as __all__

warnings.warn(
    "bertscore_loss.blocks is private and moved to bertscore_loss._blocks; the shim is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
