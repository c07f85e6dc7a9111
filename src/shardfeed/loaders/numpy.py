"""NumPy batches (the core): the Loader's own output, and the base every adapter builds on.

An adapter wraps a Loader and converts each batch; everything else — ``set_epoch``,
``state()`` / ``restore()``, ``len``, ``close()``, the context manager — is the loader's own,
so a checkpoint taken through an adapter restores the identical stream.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

Batch = dict[str, Any]


class AdaptedLoader:
    """A Loader whose batches pass through ``convert``; state and epochs are the loader's.

    Determinism, state and memory: the wrapped loader's, plus what ``convert`` allocates.
    """

    def __init__(self, loader: Any, convert: Callable[[Batch], Batch], /) -> None:
        for name in ("state", "restore", "set_epoch", "close"):
            if not callable(getattr(loader, name, None)):
                raise TypeError(
                    f"adapt() needs a shardfeed.Loader, got {type(loader).__name__} without "
                    f"{name}()"
                )
        self.loader = loader
        self._convert = convert

    def __iter__(self) -> Iterator[Batch]:
        for batch in self.loader:
            yield self._convert(batch)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def epoch(self) -> int:
        return int(self.loader.epoch)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state(self) -> dict[str, Any]:
        state: dict[str, Any] = self.loader.state()
        return state

    def restore(self, state: Mapping[str, Any]) -> None:
        self.loader.restore(state)

    def close(self) -> None:
        self.loader.close()

    def __enter__(self) -> AdaptedLoader:  # noqa: PYI034
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # stats, memory_budget, options, ...: whatever the loader offers
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def _identity(batch: Batch) -> Batch:
    return batch


def adapt(loader: Any, *, copy: bool = False) -> AdaptedLoader:
    """NumPy batches from ``loader``: the loader's own, which the caller may keep.

    ``copy`` is deprecated and has no effect: the loader never writes into a batch that is
    still referenced (see :class:`shardfeed.pipeline.Loader`).
    """
    if copy is True:
        warnings.warn(
            "copy=True is no longer needed and has no effect: batches you keep are never "
            "overwritten; drop the argument",
            DeprecationWarning, stacklevel=2,
        )
    return AdaptedLoader(loader, _identity)


def move_channels_first(array: np.ndarray) -> np.ndarray:
    """``(..., H, W, C)`` → ``(..., C, H, W)`` as a view (images of a batch or of windows)."""
    return np.moveaxis(array, -1, -3)


__all__ = ["AdaptedLoader", "adapt", "move_channels_first"]
