"""JAX arrays from a Loader: ``shardfeed.jax.adapt(loader)``.

Every NumPy array of a batch is placed with ``jax.device_put``: on the default device, on a
given ``jax.sharding.Sharding``, or with ``sharding="batch"`` split along the batch axis over
the local devices (the batch size must divide by their number). No copy is made first: on CPU
devices XLA may use the batch's memory itself, and then holds the NumPy array, which keeps
the loader from writing into that memory while the JAX array lives (a kept JAX array never
changes). Lists (file names, bytes) stay lists. JAX's default dtype rules apply (int64 becomes int32 unless
``jax_enable_x64`` is set).

A loader whose pipeline decodes on the GPU (``presets.train(..., decode_on="cuda")``) gets
the same device stage as ``shardfeed.torch.adapt`` (:mod:`shardfeed.loaders.torch_decode`,
which needs torch): its batches are made ahead on the device, and each array reaches JAX
through DLPack, without a copy, on the device JAX uses (a GPU where JAX has one, else the CPU);
``sharding`` then places them.

Determinism, state and memory: the loader's; ``state()`` / ``restore()`` are the loader's own.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from shardfeed.loaders.numpy import AdaptedLoader, Batch
from shardfeed.transforms.base import Compose
from shardfeed.transforms.decode.device_plan import DevicePlan


class _ToJax:
    """The batch conversion."""

    def __init__(self, sharding: Sharding | None) -> None:
        self.sharding = sharding

    def _sharding_for(self, value: np.ndarray) -> Any:
        if self.sharding is None or value.ndim > 0:
            return self.sharding
        return None

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = {}
        for name, value in batch.items():
            if not isinstance(value, np.ndarray):
                out[name] = value
                continue
            out[name] = jax.device_put(value, self._sharding_for(value))
        return out


def batch_sharding(devices: list[Any] | None = None) -> NamedSharding:
    """A sharding that splits axis 0 (the batch) over ``devices`` (default: local devices)."""
    devices = devices if devices is not None else jax.local_devices()
    mesh = Mesh(np.array(devices), ("batch",))
    return NamedSharding(mesh, PartitionSpec("batch"))  # type: ignore[no-untyped-call]


def _plan_of(transform: Any) -> DevicePlan | None:
    """The loader's device plan (itself, or a Compose's only op), else None."""
    if isinstance(transform, Compose) and len(transform) == 1:
        transform = next(iter(transform))
    return transform if isinstance(transform, DevicePlan) else None


class _FromDevice:
    """The device stage's torch tensors as JAX arrays (DLPack), then placed."""

    def __init__(self, sharding: Sharding | None) -> None:
        self.place = _ToJax(sharding)

    def __call__(self, batch: Batch) -> Batch:
        out: Batch = {}
        for name, value in batch.items():
            array = jax.dlpack.from_dlpack(value) if hasattr(value, "__dlpack__") else value
            sharding = self.place.sharding if getattr(array, "ndim", 0) > 0 else None
            out[name] = (jax.device_put(array, sharding)
                         if sharding is not None and isinstance(array, jax.Array) else array)
        return out


def _device_adapted(loader: Any, plan: DevicePlan, sharding: Sharding | None,
                    region_decode: bool) -> AdaptedLoader:
    try:
        from shardfeed.loaders import torch_decode  # the device stage is made with torch
    except ImportError as exc:
        raise ValueError(
            "this loader's pipeline decodes on the GPU (decode_on='cuda'), which needs torch "
            "(pip install 'shardfeed[torch]'), or build the pipeline with decode_on='cpu'"
        ) from exc
    target = "cuda" if jax.default_backend() == "gpu" else "cpu"
    stage = torch_decode.device_stage(loader, plan, target, region_decode=region_decode)
    adapted = torch_decode.DeviceAdapted(loader, stage)
    adapted._convert = _FromDevice(sharding)
    return adapted


def adapt(loader: Any, *, sharding: Sharding | str | None = None,
          region_decode: bool = True) -> AdaptedLoader:
    """Wrap ``loader`` so that it yields ``jax.Array`` batches (see the module docstring).

    ``region_decode``: for a loader that decodes on the GPU, as in ``shardfeed.torch.adapt``.
    """
    if isinstance(sharding, str):
        if sharding != "batch":
            raise ValueError(
                f"sharding must be a jax.sharding.Sharding, 'batch' or None, got {sharding!r}"
            )
        sharding = batch_sharding()
    if sharding is not None and not isinstance(sharding, Sharding):
        raise TypeError(
            f"sharding must be a jax.sharding.Sharding, 'batch' or None, got {sharding!r}"
        )
    plan = _plan_of(getattr(loader, "transform", None))
    if plan is not None:
        return _device_adapted(loader, plan, sharding, region_decode)
    return AdaptedLoader(loader, _ToJax(sharding))


__all__ = ["adapt", "batch_sharding"]
