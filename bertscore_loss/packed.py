"""Deprecated: ``bertscore_loss.packed`` is private and moved to ``bertscore_loss._packed``.

Importing this shim warns (``DeprecationWarning``) and re-exports the private module's names; the shim is removed
in the next release. Use the public API instead (``bertscore_loss`` and its public submodules).
"""

import warnings

from ._packed import *  # noqa: F403
from ._packed import __all__ as __all__

warnings.warn(
    "bertscore_loss.packed is private and moved to bertscore_loss._packed; the shim is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
