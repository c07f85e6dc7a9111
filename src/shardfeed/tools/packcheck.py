"""``BadInputsError`` under the name the guides used before pack became a package.

The input checks are :mod:`shardfeed.tools.pack.check`; this module only keeps
``from shardfeed.tools.packcheck import BadInputsError`` working.
"""

from __future__ import annotations

from shardfeed.tools.pack.check import BadInputsError

__all__ = ["BadInputsError"]
