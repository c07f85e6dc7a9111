"""shardfeed: feed training jobs with images from datasets far larger than memory.

    ds = shardfeed.Dataset("out/")
    loader = shardfeed.Loader(ds, batch_size=256, shuffle=True, seed=0,
                              transform=shardfeed.presets.train(size=224))

Names are imported lazily, so ``import shardfeed`` stays cheap and never imports torch or jax:
``shardfeed.torch`` and ``shardfeed.jax`` are the adapters (``shardfeed.torch.adapt(loader)``),
``shardfeed.tf.dataset(loader)`` gives a ``tf.data.Dataset`` and ``shardfeed.keras.adapt(loader)``
Keras 3 input (each imports its framework on first use).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardfeed.errors import (
    CorruptRecordError,
    DecodeError,
    FormatError,
    PackError,
    SchemaError,
    ShardChangedError,
    ShardfeedError,
    StateError,
    StorageError,
    TooManyErrorsError,
    UnsafePathError,
)

__version__ = "0.1.0"

# public name -> (module, attribute or None for the module itself)
_LAZY: dict[str, tuple[str, str | None]] = {
    "Dataset": ("shardfeed.dataset", "Dataset"),
    "DataSource": ("shardfeed.dataset", "DataSource"),
    "DataSourceBase": ("shardfeed.dataset", "DataSourceBase"),
    "ReadsAhead": ("shardfeed.dataset", "ReadsAhead"),
    "ReadsColumns": ("shardfeed.dataset", "ReadsColumns"),
    "Loader": ("shardfeed.pipeline", "Loader"),
    "BatchKeys": ("shardfeed.pipeline", "BatchKeys"),
    "BatchStage": ("shardfeed.pipeline", "BatchStage"),
    "BatchStageBase": ("shardfeed.pipeline", "BatchStageBase"),
    "Windows": ("shardfeed.pipeline", "Windows"),
    "Patches": ("shardfeed.pipeline", "Patches"),
    "Mixture": ("shardfeed.pipeline", "Mixture"),
    "Subset": ("shardfeed.pipeline", "Subset"),
    "presets": ("shardfeed.transforms.presets", None),
    "transforms": ("shardfeed.transforms", None),
    "pack": ("shardfeed.tools.pack", "pack"),
    "records_at": ("shardfeed.tools.which", "records_of_run"),
    "RowFields": ("shardfeed.tools.pack.rows", "RowFields"),
    "torch": ("shardfeed.loaders.torch", None),
    "jax": ("shardfeed.loaders.jax", None),
    "tf": ("shardfeed.loaders.tensorflow", None),
    "keras": ("shardfeed.loaders.keras", None),
}

if TYPE_CHECKING:  # the same names, seen by type checkers without importing at run time
    from shardfeed import transforms as transforms
    from shardfeed.dataset import Dataset as Dataset
    from shardfeed.dataset import DataSource as DataSource
    from shardfeed.dataset import DataSourceBase as DataSourceBase
    from shardfeed.dataset import ReadsAhead as ReadsAhead
    from shardfeed.dataset import ReadsColumns as ReadsColumns
    from shardfeed.loaders import jax as jax
    from shardfeed.loaders import keras as keras
    from shardfeed.loaders import tensorflow as tf
    from shardfeed.loaders import torch as torch
    from shardfeed.pipeline import BatchKeys as BatchKeys
    from shardfeed.pipeline import BatchStage as BatchStage
    from shardfeed.pipeline import BatchStageBase as BatchStageBase
    from shardfeed.pipeline import Loader as Loader
    from shardfeed.pipeline.mixture import Mixture as Mixture
    from shardfeed.pipeline.mixture import Subset as Subset
    from shardfeed.pipeline.patches import Patches as Patches
    from shardfeed.pipeline.windows import Windows as Windows
    from shardfeed.tools.pack import pack as pack
    from shardfeed.tools.pack.rows import RowFields as RowFields
    from shardfeed.tools.which import records_of_run as records_at
    from shardfeed.transforms import presets as presets


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'shardfeed' has no attribute {name!r}") from None
    module = importlib.import_module(module_name)
    value = module if attribute is None else getattr(module, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatchKeys",
    "BatchStage",
    "BatchStageBase",
    "CorruptRecordError",
    "DataSource",
    "DataSourceBase",
    "Dataset",
    "DecodeError",
    "FormatError",
    "Loader",
    "Mixture",
    "PackError",
    "Patches",
    "ReadsAhead",
    "ReadsColumns",
    "RowFields",
    "SchemaError",
    "ShardChangedError",
    "ShardfeedError",
    "StateError",
    "StorageError",
    "Subset",
    "TooManyErrorsError",
    "UnsafePathError",
    "Windows",
    "__version__",
    "jax",
    "keras",
    "pack",
    "presets",
    "records_at",
    "tf",
    "torch",
    "transforms",
]
