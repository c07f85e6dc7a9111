"""JAX arrays from a Loader: ``shardfeed.jax.adapt(loader)``.

Every NumPy array of a batch is placed with ``jax.device_put``: on the default device, on a
given ``jax.sharding.Sharding``, or with ``sharding="batch"`` split along the batch axis over
the local devices (the batch size must divide by their number). No copy is made first: on CPU
devices XLA may use the batch's memory itself, and then holds the NumPy array, which keeps
the loader from writing into that memory while the JAX array lives (a kept JAX array never
changes). Lists (file names, bytes) stay lists. JAX's default dtype rules apply (int64 becomes int32 unless
``jax_enable_x64`` is set).

Determinism, state and memory: the loader's; ``state()`` / ``restore()`` are the loader's own.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from shardfeed.loaders.numpy import AdaptedLoader, Batch


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


def adapt(loader: Any, *, sharding: Sharding | str | None = None) -> AdaptedLoader:
    """Wrap ``loader`` so that it yields ``jax.Array`` batches (see the module docstring)."""
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
    return AdaptedLoader(loader, _ToJax(sharding))


__all__ = ["adapt", "batch_sharding"]
