"""Deprecated: ``bertscore_loss.loading`` is private and moved to ``bertscore_loss._loading``.

Importing this shim warns (``DeprecationWarning``) and re-exports the private module's names; the shim is removed
in the next release. Use the public API instead (``bertscore_loss`` and its public submodules).
"""

import warnings

from ._loading import *  # noqa: F403
from ._loading import __all__ as __all__

warnings.warn(
    "bertscore_loss.loading is private and moved to bertscore_loss._loading; the shim is removed in the next release",
    DeprecationWarning,
    stacklevel=2,
)
