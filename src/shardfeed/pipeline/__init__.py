"""pipeline layer: the Loader, its sources (records, windows, patches), batching and workers.

``Windows`` and ``Patches`` live in ``pipeline/windows.py`` and ``pipeline/patches.py`` and are
imported on first use, so this package imports without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardfeed.pipeline.loader import Loader, LoaderStats, MemoryBudget, TooManyErrorsError
from shardfeed.pipeline.source import EpochContext, RecordSource, SampleKey, Source

if TYPE_CHECKING:  # the lazy names, seen by type checkers
    from shardfeed.pipeline.patches import Patches as Patches
    from shardfeed.pipeline.windows import Windows as Windows

_LAZY = {"Windows": "shardfeed.pipeline.windows", "Patches": "shardfeed.pipeline.patches"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardfeed.pipeline' has no attribute {name!r}")


__all__ = [
    "EpochContext",
    "Loader",
    "LoaderStats",
    "MemoryBudget",
    "Patches",
    "RecordSource",
    "SampleKey",
    "Source",
    "TooManyErrorsError",
    "Windows",
]
