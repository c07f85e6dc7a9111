"""``CsvColumns`` under the name the guides used before pack became a package.

The CSV reader is :mod:`shardfeed.tools.pack.csvinput`; this module only keeps
``from shardfeed.tools.csvinput import CsvColumns`` working.
"""

from __future__ import annotations

from shardfeed.tools.pack.csvinput import CsvColumns

__all__ = ["CsvColumns"]
