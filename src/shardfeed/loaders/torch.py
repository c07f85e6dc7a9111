"""torch tensors from a Loader: ``shardfeed.torch.adapt(loader, pin_memory=True)``.

Every NumPy array of a batch becomes a tensor with ``torch.from_numpy`` (no copy: it shares
the loader's batch memory, which the loader never writes into while the tensor, or any view
of it, is alive, so kept tensors never change). ``channels_first`` turns the ``"image"`` and
``"mask"`` arrays of shape ``(..., H, W, C)`` into contiguous ``(..., C, H, W)`` tensors, the
transpose being done in the one copy each path makes anyway where there is one::

    no pin, no device    from_numpy -> transposed copy (CPU)
    pin_memory           from_numpy -> transposed copy into page-locked memory -> device
    device, no pin       from_numpy -> device (the batch's own layout) -> transposed there

``pin_memory`` copies each tensor into page-locked memory and ``device`` moves it with a
non-blocking copy. Lists (file names, bytes) stay lists.

Determinism, state and memory: the loader's; ``state()`` / ``restore()`` are the loader's own.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import numpy as np
import torch

from shardfeed.loaders.numpy import AdaptedLoader, Batch
from shardfeed.loaders.torch_decode import DeviceAdapted, device_stage, plan_of
from shardfeed.pipeline.stage_stats import scalars

IMAGE_KEYS = ("image", "mask")


class _ToTorch:
    """The batch conversion (a class, so that adapted loaders pickle)."""

    def __init__(self, *, pin_memory: bool, channels_first: bool,
                 device: torch.device | None) -> None:
        self.pin_memory = pin_memory
        self.channels_first = channels_first
        # a CPU device needs no move: the tensors are on the CPU already
        self.device = device if device is not None and device.type != "cpu" else None

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = {}
        for name, value in batch.items():
            if not isinstance(value, np.ndarray):
                out[name] = value
                continue
            out[name] = self._convert(
                torch.from_numpy(value),
                transpose=self.channels_first and name in IMAGE_KEYS and value.ndim >= 4,
            )
        return out

    def _convert(self, tensor: torch.Tensor, *, transpose: bool) -> torch.Tensor:
        source = tensor.movedim(-1, -3) if transpose else tensor
        if self.pin_memory:
            pinned = torch.empty(source.shape, dtype=source.dtype, pin_memory=True)
            pinned.copy_(source)
            if self.device is None:
                return pinned
            return pinned.to(self.device, non_blocking=True)
        if self.device is not None:
            moved = tensor.to(self.device, non_blocking=True)
            return moved.movedim(-1, -3).contiguous() if transpose else moved
        return source.contiguous()  # no copy unless transposed


def _check_device(device: str | torch.device | None) -> torch.device | None:
    """``device`` as a torch device that exists here; ValueError naming it and the fix."""
    if device is None:
        return None
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(
            f"device={device!r} is not a torch device: pass e.g. 'cuda', 'cuda:1' or 'cpu', "
            "or leave device=None for CPU tensors"
        ) from exc
    if target.type != "cuda":
        return target
    if not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r}, but CUDA is not available here (torch {torch.__version__}, "
            "no usable GPU or a build without CUDA): leave device=None (CPU tensors) or pass "
            "device='cpu'"
        )
    count = torch.cuda.device_count()
    if target.index is not None and target.index >= count:
        raise ValueError(
            f"device={device!r}, but this machine has {count} CUDA device(s) (cuda:0 to "
            f"cuda:{count - 1}): pass one of them, or leave device=None for CPU tensors"
        )
    return target


def adapt(loader: Any, *, pin_memory: bool = False, channels_first: bool = False,
          device: str | torch.device | None = None,
          region_decode: bool = True) -> AdaptedLoader:
    """Wrap ``loader`` so that it yields torch tensors (see the module docstring).

    ``device`` may be any torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``); a CUDA device
    this machine does not have is a ValueError here, not an error at the first batch.
    ``pin_memory=True`` without CUDA does nothing and warns (as torch's own DataLoader does).

    A loader whose pipeline decodes on the GPU (``presets.train(..., decode_on="cuda")``)
    needs ``device``: its batches are decoded, resized, flipped and normalised there, ahead of
    the loop, by a batch stage the loader runs on a thread and CUDA stream of its own (see
    :mod:`shardfeed.loaders.torch_decode`), and ``memory_budget()`` counts the device's
    bytes (``device_bytes``). ``region_decode=False`` decodes whole images and cuts the boxes
    on the device (a switch for a decoder whose region decode fails).
    """
    if not isinstance(pin_memory, bool) or not isinstance(channels_first, bool):
        raise TypeError(
            f"pin_memory and channels_first must be True or False, got {pin_memory!r}, "
            f"{channels_first!r}"
        )
    target = _check_device(device)
    if pin_memory and not torch.cuda.is_available():
        warnings.warn(
            "pin_memory=True has no effect: CUDA is not available here, so batches stay in "
            "ordinary memory",
            stacklevel=2,
        )
        pin_memory = False
    plan = plan_of(getattr(loader, "transform", None))
    if plan is not None:
        if target is None:
            raise ValueError(
                "this loader's pipeline decodes on the GPU (decode_on='cuda'): pass "
                "device='cuda' (or 'cuda:N'), or build the pipeline with decode_on='cpu'"
            )
        return DeviceAdapted(loader, device_stage(loader, plan, target,
                                                  channels_first=channels_first,
                                                  region_decode=region_decode))
    return AdaptedLoader(
        loader, _ToTorch(pin_memory=pin_memory, channels_first=channels_first, device=target)
    )


_WINDOWS: weakref.WeakKeyDictionary[Any, dict[int, tuple[Any, Any]]] = (
    weakref.WeakKeyDictionary())
"""log_stats' window of each writer (by its id), a loader (held weakly: a window holds its
loader weakly too)."""


def log_stats(writer: Any, loader: Any, step: int, *, prefix: str = "input/") -> Any:
    """Write :meth:`Loader.stats` of the time since the last call as scalars of a
    TensorBoard ``SummaryWriter`` (``torch.utils.tensorboard``; anything with
    ``add_scalar(tag, value, step)``) at ``step``: ``input/wait_share`` (the share of the
    step's time spent waiting for data), ``input/samples_per_s``, ``input/threads_busy`` and
    ``input/<stage>_share``. ``loader``: the Loader or its adapter. Each writer has a window
    of its own (the time since its previous call). Returns the stats (their ``verdict``
    says what to try)."""
    windows = _WINDOWS.setdefault(loader.loader if isinstance(loader, AdaptedLoader) else loader,
                                  {})
    key = id(writer)  # any writer (hashable or not, weakly referenced or not)
    entry = windows.get(key)
    if entry is None or entry[0]() is not writer:  # (an id a dead writer had: a new one)
        try:
            ref: Any = weakref.ref(writer)
        except TypeError:
            ref = lambda: writer
        entry = windows[key] = (ref, loader.stats_window(since_start=True))
    window = entry[1]
    mark = window.mark
    stats = loader.stats(window)
    if not (stats.window is not None and stats.window.batches and stats.window.step > 0):
        window.mark = mark  # nothing to write yet (a pass's first batch): the next call has it
        return stats
    for tag, value in scalars(stats.window, prefix=prefix).items():
        writer.add_scalar(tag, value, step)
    return stats


__all__ = ["adapt", "log_stats"]
