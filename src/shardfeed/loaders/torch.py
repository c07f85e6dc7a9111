"""torch tensors from a Loader: ``shardfeed.torch.adapt(loader, pin_memory=True)``.

Every NumPy array of a batch becomes a tensor with ``torch.from_numpy`` (no copy: it shares
the loader's batch buffer, valid until the next batch is requested); ``pin_memory`` copies it
into page-locked memory and ``device`` moves it with a non-blocking copy, after which the
tensor is the caller's. Lists (file names, bytes) stay lists. ``channels_first`` turns the
``"image"`` and ``"mask"`` arrays of shape ``(..., H, W, C)`` into ``(..., C, H, W)`` views.

Determinism, state and memory: the loader's; ``state()`` / ``restore()`` are the loader's own.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from shardfeed.loaders.numpy import AdaptedLoader, Batch

IMAGE_KEYS = ("image", "mask")


class _ToTorch:
    """The batch conversion (a class, so that adapted loaders pickle)."""

    def __init__(self, *, pin_memory: bool, channels_first: bool,
                 device: torch.device | None) -> None:
        self.pin_memory = pin_memory
        self.channels_first = channels_first
        self.device = device

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = {}
        for name, value in batch.items():
            if not isinstance(value, np.ndarray):
                out[name] = value
                continue
            tensor = torch.from_numpy(value)
            if self.channels_first and name in IMAGE_KEYS and tensor.ndim >= 4:
                tensor = tensor.movedim(-1, -3)
            if self.pin_memory:
                tensor = tensor.pin_memory()
            if self.device is not None:
                tensor = tensor.to(self.device, non_blocking=True)
            out[name] = tensor
        return out


def adapt(loader: Any, *, pin_memory: bool = False, channels_first: bool = False,
          device: str | torch.device | None = None) -> AdaptedLoader:
    """Wrap ``loader`` so that it yields torch tensors (see the module docstring).

    ``pin_memory=True`` without CUDA is a no-op with a warning. ``device`` may be any torch
    device (``"cuda"``, ``"cuda:1"``, ``"cpu"``).
    """
    if not isinstance(pin_memory, bool) or not isinstance(channels_first, bool):
        raise TypeError(
            f"pin_memory and channels_first must be True or False, got {pin_memory!r}, "
            f"{channels_first!r}"
        )
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True has no effect: CUDA is not available here, so batches stay in "
            "ordinary memory",
            stacklevel=2,
        )
        pin_memory = False
    target = torch.device(device) if device is not None else None
    return AdaptedLoader(
        loader, _ToTorch(pin_memory=pin_memory, channels_first=channels_first, device=target)
    )


__all__ = ["adapt"]
