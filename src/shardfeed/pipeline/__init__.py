"""pipeline layer: the Loader, its samplers (records, windows, patches), batching and workers.

``Windows``, ``Patches`` and ``Mixture`` (with ``Subset``) live in ``pipeline/windows.py``,
``pipeline/patches.py`` and ``pipeline/mixture.py`` and are imported on first use, so this
package imports without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardfeed.pipeline.batch_stage import BatchKeys, BatchStage, BatchStageBase
from shardfeed.pipeline.loader import Loader, LoaderStats, MemoryBudget, TooManyErrorsError
from shardfeed.pipeline.samplers import EpochContext, RecordSampler, SampleKey, Sampler

# The names these had before samplers were called samplers (kept for old imports).
Source = Sampler
RecordSource = RecordSampler

if TYPE_CHECKING:  # the lazy names, seen by type checkers
    from shardfeed.pipeline.mixture import Mixture as Mixture
    from shardfeed.pipeline.mixture import Subset as Subset
    from shardfeed.pipeline.patches import Patches as Patches
    from shardfeed.pipeline.windows import Windows as Windows

_LAZY = {"Windows": "shardfeed.pipeline.windows", "Patches": "shardfeed.pipeline.patches",
         "Mixture": "shardfeed.pipeline.mixture", "Subset": "shardfeed.pipeline.mixture"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'shardfeed.pipeline' has no attribute {name!r}")


__all__ = [
    "BatchKeys",
    "BatchStage",
    "BatchStageBase",
    "EpochContext",
    "Loader",
    "LoaderStats",
    "MemoryBudget",
    "Mixture",
    "Patches",
    "RecordSampler",
    "RecordSource",
    "SampleKey",
    "Sampler",
    "Source",
    "Subset",
    "TooManyErrorsError",
    "Windows",
]
